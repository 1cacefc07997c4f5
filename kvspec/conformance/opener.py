"""One opener for every family: start the implementation a manifest describes, for one configuration.

``open_adapter(manifest, adapter_dir, config)`` is the only place that turns a manifest into a running
implementation. The configuration says what is opened: its profile (``ManagerConfig.profile``, or the
``kind`` of a ``PagedConfig``, ``SessionConfig``, ``RadixConfig``) is looked up in the profile registry
(``spec/registry.py``), whose entry names the family (block, manager, radix; ``generic`` for a profile
declared outside kvspec, whose own config type the caller names with ``profile=``); a ``PoolSetup``
opens the request level. The family then picks how the suite reaches the implementation:

- an in-process factory named in ``[start]`` (``Start.factory_for``), called as
  ``factory(config, manifest, adapter_dir)`` plus ``variant=NAME`` when ``--impl=DIR/NAME`` selects a
  variant and, for several block-level workers, ``workers=N``;
- otherwise the transport of the manifest's ``kind`` for that family: a JSON-lines child
  (``transport/jsonl.py`` and its manager, radix and engine sessions) or a C ABI library
  (``transport/cabi.py``).

The per-family openers (``open_implementation``, ``open_manager``, ``open_radix``,
``open_request_implementation``) delegate here and keep their names for the code written against them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, overload

from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.implementation import StepwiseImplementation
from kvspec.conformance.managers.interface import ManagerImplementation
from kvspec.conformance.radix.interface import RadixImplementation
from kvspec.conformance.requests.interface import RequestImplementation
from kvspec.reference.requests import PoolSetup
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.manager_wire import PagedConfig, SessionConfig
from kvspec.spec.manifest import AdapterFamily, Manifest
from kvspec.spec.radix_wire import RadixConfig
from kvspec.spec.registry import PROFILES, RADIX_FAMILY, profile_of_config

__all__ = ["AnyImplementation", "OpenConfig", "family_of", "open_adapter"]

#: what ``open_adapter`` takes: one family's configuration
OpenConfig = ManagerConfig | PagedConfig | SessionConfig | RadixConfig | PoolSetup
#: what it returns: the implementation of that family
AnyImplementation = (
    Implementation
    | ManagerImplementation
    | RadixImplementation
    | RequestImplementation
    | StepwiseImplementation[Any, Any, Any]
)


def family_of(config: OpenConfig | Any, profile: str | None = None) -> AdapterFamily:
    """The family ``config`` opens: ``request`` for a ``PoolSetup``, else the registry's family of
    ``profile`` or, without one, of the profile the configuration names."""
    if isinstance(config, PoolSetup):
        return "request"
    if profile is not None:
        if profile not in PROFILES:
            raise ConfigError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
        return PROFILES[profile].family
    try:
        return profile_of_config(config).family
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _call_factory(target: str, manifest: Manifest, adapter_dir: Path, config: OpenConfig, **extra: object) -> Any:
    mod_name, _, attr = target.partition(":")
    if not mod_name or not attr:
        raise ConfigError(f"{manifest.name}: a [start] factory is 'module:factory', not {target!r}")
    factory = getattr(importlib.import_module(mod_name), attr)
    if manifest.variant is not None:  # a selected variant (--impl=DIR/NAME) is an explicit argument
        extra["variant"] = manifest.variant
    return factory(config, manifest, adapter_dir, **extra)


def _open_block(manifest: Manifest, adapter_dir: Path, config: ManagerConfig, workers: int) -> Implementation:
    if not 1 <= workers <= manifest.capabilities.workers:
        raise ConfigError(
            f"{manifest.name}: {workers} workers asked, the manifest declares workers = {manifest.capabilities.workers}"
        )
    target = manifest.start.factory_for("block", manifest.kind)
    if manifest.kind == "python":
        if not target or ":" not in target:
            raise ConfigError(f"{manifest.name}: kind 'python' needs start.python = 'module:factory'")
        # a factory written before workers existed is never asked for more than one
        extra: dict[str, object] = {"workers": workers} if workers > 1 else {}
        impl: Implementation = _call_factory(target, manifest, adapter_dir, config, **extra)
        return impl
    if manifest.kind == "subprocess":
        from kvspec.conformance.transport.jsonl import JsonlImplementation

        return JsonlImplementation(manifest, adapter_dir, config, workers=workers)
    if manifest.kind == "c_abi":
        from kvspec.conformance.transport.cabi import CAbiImplementation

        return CAbiImplementation(manifest, adapter_dir, config)
    raise ConfigError(f"{manifest.name}: kind {manifest.kind!r} takes requests, not block operations")


def _open_manager(manifest: Manifest, adapter_dir: Path, config: PagedConfig | SessionConfig) -> ManagerImplementation:
    target = manifest.start.factory_for("manager", manifest.kind)
    if target:
        impl: ManagerImplementation = _call_factory(target, manifest, adapter_dir, config)
        return impl
    if manifest.kind == "subprocess":
        from kvspec.conformance.transport.manager import JsonlManager

        return JsonlManager(manifest, adapter_dir, config)
    raise ConfigError(
        f"{manifest.name}: no in-process factory of paged/session (start.python of a kind 'python' adapter, "
        f"or its alias start.managers) and kind {manifest.kind!r} has no manager session (protocol version 3)"
    )


def _open_radix(manifest: Manifest, adapter_dir: Path, config: RadixConfig) -> RadixImplementation:
    target = manifest.start.factory_for(RADIX_FAMILY, manifest.kind)
    if not target and manifest.kind == "subprocess":
        from kvspec.conformance.transport.radix import JsonlRadix

        return JsonlRadix(manifest, adapter_dir, config)
    if not target or ":" not in target:
        raise ConfigError(
            f"{manifest.name}: a radix adapter names its factory in start.python = 'module:factory' "
            "(kind 'python'; or its alias start.radix) or is kind 'subprocess' (protocol version 4)"
        )
    impl: RadixImplementation = _call_factory(target, manifest, adapter_dir, config)
    return impl


def _open_request(manifest: Manifest, adapter_dir: Path, setup: PoolSetup) -> RequestImplementation:
    if not manifest.capabilities.request_level:
        raise ConfigError(f"{manifest.name}: the manifest does not declare request_level")
    target = manifest.start.factory_for("request", manifest.kind)
    if target is None and manifest.kind in ("subprocess", "c_abi"):
        from kvspec.conformance.transport.engine import open_engine_implementation

        return open_engine_implementation(manifest, adapter_dir, setup)
    if not target or ":" not in target:
        raise ConfigError(
            f"{manifest.name}: a request-level adapter needs start.python = 'module:factory' (kinds "
            "'request' and 'python'; for kind 'python' the alias start.requests); kinds 'subprocess' and "
            "'c_abi' speak protocol version 2 without one"
        )
    impl: RequestImplementation = _call_factory(target, manifest, adapter_dir, setup)
    return impl


def _open_generic(manifest: Manifest, adapter_dir: Path, config: Any) -> StepwiseImplementation[Any, Any, Any]:
    target = manifest.start.factory_for("generic", manifest.kind)
    if not target:
        raise ConfigError(
            f"{manifest.name}: a profile declared outside kvspec (family 'generic') has no wire protocol: "
            "its adapter is kind 'python' with start.python = 'module:factory'"
        )
    impl: StepwiseImplementation[Any, Any, Any] = _call_factory(target, manifest, adapter_dir, config)
    return impl


#: each family's way in: (manifest, adapter folder, config, workers) -> implementation
_OPENERS: dict[AdapterFamily, Callable[[Manifest, Path, Any, int], AnyImplementation]] = {
    "block": _open_block,
    "manager": lambda m, d, c, _w: _open_manager(m, d, c),
    RADIX_FAMILY: lambda m, d, c, _w: _open_radix(m, d, c),
    "generic": lambda m, d, c, _w: _open_generic(m, d, c),
    "request": lambda m, d, c, _w: _open_request(m, d, c),
}


@overload
def open_adapter(
    manifest: Manifest, adapter_dir: Path, config: ManagerConfig, *, workers: int = 1
) -> Implementation: ...
@overload
def open_adapter(
    manifest: Manifest, adapter_dir: Path, config: PagedConfig | SessionConfig, *, workers: int = 1
) -> ManagerImplementation: ...
@overload
def open_adapter(
    manifest: Manifest, adapter_dir: Path, config: RadixConfig, *, workers: int = 1
) -> RadixImplementation: ...
@overload
def open_adapter(
    manifest: Manifest, adapter_dir: Path, config: PoolSetup, *, workers: int = 1
) -> RequestImplementation: ...
@overload
def open_adapter(
    manifest: Manifest, adapter_dir: Path, config: Any, *, workers: int = 1, profile: str
) -> StepwiseImplementation[Any, Any, Any]: ...
def open_adapter(
    manifest: Manifest, adapter_dir: Path, config: Any, *, workers: int = 1, profile: str | None = None
) -> AnyImplementation:
    """Start the implementation ``manifest`` describes (its folder ``adapter_dir``), configured with
    ``config``, for the family the configuration's profile belongs to (``family_of``). ``workers``:
    block-level workers of one process sharing G3/G4 (at most the manifest's ``workers`` capability);
    the other families serve one. ``profile`` names the registry entry when the configuration does not
    (a profile declared outside kvspec, family ``generic``, brings its own config type: its adapter
    is an in-process factory returning a ``StepwiseImplementation`` of its types). Close what it
    returns (or use ``with``)."""
    family = family_of(config, profile)
    if workers != 1 and family != "block":
        raise ConfigError(f"{manifest.name}: {workers} workers asked of a {family} session, which has one")
    return _OPENERS[family](manifest, Path(adapter_dir), config, workers)
