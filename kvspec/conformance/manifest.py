"""Finding and loading adapter manifests.

Each folder under ``adapters/`` holds a ``manifest.toml`` (the format is
``kvspec.spec.manifest``, documented in spec/ADAPTERS.md). The suite reads it
to start the implementation, to skip what the implementation cannot do
(naming the missing capability), and to turn failures of declared deviations
into expected failures, keyed by rule id.
"""

from __future__ import annotations

import os
import tomllib
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from kvspec.spec.errors import ConfigError
from kvspec.spec.manifest import Capabilities, Deviation, Kind, Manifest, Start

__all__ = [
    "VARIANT_ENV",
    "Capabilities",
    "Deviation",
    "Kind",
    "Manifest",
    "Start",
    "load_manifest",
    "resolve_adapter_dir",
]


def _builtin_adapters_dir() -> Path:
    return Path(str(resources.files("kvspec.adapters")))


#: the environment variable that names the variant of a ``variants = true``
#: adapter (set by ``resolve_adapter_dir`` for ``--impl=DIR/VARIANT``)
VARIANT_ENV = "KVSPEC_ADAPTER_VARIANT"


def resolve_adapter_dir(impl: str) -> Path:
    """``--impl`` value to an adapter folder: a path (absolute or relative to
    the working directory), else a bundled adapter by name or by
    ``adapters/NAME``."""
    p = Path(impl).expanduser()
    if (p / "manifest.toml").is_file():
        return p.resolve()
    name = p.name if p.parent.name == "adapters" or len(p.parts) == 1 else None
    if name is not None:
        bundled = _builtin_adapters_dir() / name
        if (bundled / "manifest.toml").is_file():
            return bundled.resolve()
    # DIR/VARIANT, DIR an adapter whose manifest says ``variants = true`` (as
    # adapters/mutants/NAME): the adapter is DIR and the variant name reaches
    # its factory through the environment variable VARIANT_ENV.
    if len(p.parts) > 1:
        bases = [p.parent]
        if p.parent.parent.name == "adapters" or len(p.parts) == 2:
            bases.append(_builtin_adapters_dir() / p.parent.name)
        for base in bases:
            if (base / "manifest.toml").is_file() and load_manifest(base).variants:
                os.environ[VARIANT_ENV] = p.name
                return base.resolve()
    raise ConfigError(f"--impl={impl}: no manifest.toml in {p} and no bundled adapter of that name")


def load_manifest(adapter_dir: Path) -> Manifest:
    path = adapter_dir / "manifest.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: cannot read manifest: {e}") from e
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: invalid manifest:\n{e}") from e
