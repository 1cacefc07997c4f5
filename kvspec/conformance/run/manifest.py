"""Finding and loading adapter manifests.

Each folder under ``adapters/`` holds a ``manifest.toml`` (the format is
``kvspec.spec.manifest``, documented in spec/ADAPTERS.md). The suite reads it
to start the implementation, to skip what the implementation cannot do
(naming the missing capability), and to turn failures inside the scope of a
declared deviation into expected failures (``kvspec.spec.deviations``). A
deviation without a scope is refused here, with a message saying how to
scope it. ``--impl=DIR/NAME`` selects the variant NAME that DIR's manifest
declares in ``[[variants]]``; the loader passes it on explicitly
(``Manifest.with_variant``), never through the environment.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from kvspec.spec.errors import ConfigError
from kvspec.spec.manifest import Capabilities, Deviation, Kind, Manifest, Start, Variant

__all__ = [
    "Capabilities",
    "Deviation",
    "Kind",
    "Manifest",
    "Start",
    "Variant",
    "builtin_adapters_dir",
    "load_impl",
    "load_manifest",
    "resolve_adapter_dir",
    "resolve_impl",
]


def builtin_adapters_dir() -> Path:
    """The folder of the adapters bundled with kvspec (``adapters/`` in a checkout)."""
    return Path(str(resources.files("kvspec.adapters")))


_builtin_adapters_dir = builtin_adapters_dir


def resolve_impl(impl: str) -> tuple[Path, str | None]:
    """``--impl`` value to (adapter folder, selected variant or None): a path
    (absolute or relative to the working directory), else a bundled adapter
    by name or by ``adapters/NAME``; ``DIR/NAME`` where DIR is an adapter
    whose manifest declares a ``[[variants]]`` entry NAME selects that
    variant (``adapters/mutants/capacity_one_early``)."""
    p = Path(impl).expanduser()
    if (p / "manifest.toml").is_file():
        return p.resolve(), None
    name = p.name if p.parent.name == "adapters" or len(p.parts) == 1 else None
    if name is not None:
        bundled = _builtin_adapters_dir() / name
        if (bundled / "manifest.toml").is_file():
            return bundled.resolve(), None
    if len(p.parts) > 1:
        bases = [p.parent]
        if p.parent.parent.name == "adapters" or len(p.parts) == 2:
            bases.append(_builtin_adapters_dir() / p.parent.name)
        for base in bases:
            if not (base / "manifest.toml").is_file():
                continue
            manifest = load_manifest(base)
            if manifest.find_variant(p.name) is not None:
                return base.resolve(), p.name
            known = ", ".join(v.name for v in manifest.variants)
            raise ConfigError(
                f"--impl={impl}: adapter {manifest.name} ({base}) declares no variant {p.name!r}"
                + (f" (known: {known})" if known else " (its manifest has no [[variants]])")
            )
    raise ConfigError(f"--impl={impl}: no manifest.toml in {p} and no bundled adapter of that name")


def resolve_adapter_dir(impl: str) -> Path:
    """The adapter folder ``--impl`` names; refuses ``DIR/VARIANT`` (which
    needs ``load_impl`` so that the variant is not lost)."""
    adapter_dir, variant = resolve_impl(impl)
    if variant is not None:
        raise ConfigError(f"--impl={impl} selects variant {variant!r}: open it with load_impl, not resolve_adapter_dir")
    return adapter_dir


def load_impl(impl: str) -> tuple[Path, Manifest]:
    """``--impl`` value to (adapter folder, manifest with the variant it
    names selected)."""
    adapter_dir, variant = resolve_impl(impl)
    return adapter_dir, load_manifest(adapter_dir, variant)


def load_manifest(adapter_dir: Path, variant: str | None = None) -> Manifest:
    """The folder's manifest, with ``variant`` selected (``Manifest.with_variant``)."""
    path = adapter_dir / "manifest.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: cannot read manifest: {e}") from e
    if "variant" in data:
        raise ConfigError(f"{path}: 'variant' is chosen with --impl=DIR/NAME, not written in the manifest")
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: invalid manifest:\n{e}") from e
    return manifest.with_variant(variant)
