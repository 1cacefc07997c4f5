"""The reference model behind one factory: the ``[start]`` of one key (spec/ADAPTERS.md, "[start]").

``open_reference_any`` opens whichever family the configuration it is handed belongs to: the block
level (``ManagerConfig``), the allocator-level profiles (``PagedConfig``, ``SessionConfig``), the
radix cache (``RadixConfig``) or the request level (``PoolSetup``). A manifest naming it as
``start.python`` alone runs everything ``adapters/reference``'s per-family keys run; the bundled
reference manifest keeps those keys (copies of it in the wild name their own block factory in
``python``), and tests/test_opener.py checks that both forms open the same implementations.
"""

from __future__ import annotations

from pathlib import Path
from typing import overload

from kvspec.adapters.reference.adapter import ReferenceImplementation, open_reference
from kvspec.adapters.reference.managers import open_reference_manager
from kvspec.adapters.reference.radix import open_reference_radix
from kvspec.adapters.reference_requests.adapter import ReferenceRequests, open_reference_requests
from kvspec.api import ManagerImplementation, PoolSetup, RadixImplementation
from kvspec.spec.config import ManagerConfig
from kvspec.spec.manager_wire import PagedConfig, SessionConfig
from kvspec.spec.manifest import Manifest
from kvspec.spec.radix_wire import RadixConfig


@overload
def open_reference_any(
    config: ManagerConfig, manifest: Manifest, adapter_dir: Path, *, workers: int = 1
) -> ReferenceImplementation: ...
@overload
def open_reference_any(
    config: PagedConfig | SessionConfig, manifest: Manifest, adapter_dir: Path, *, workers: int = 1
) -> ManagerImplementation: ...
@overload
def open_reference_any(
    config: RadixConfig, manifest: Manifest, adapter_dir: Path, *, workers: int = 1
) -> RadixImplementation: ...
@overload
def open_reference_any(
    config: PoolSetup, manifest: Manifest, adapter_dir: Path, *, workers: int = 1
) -> ReferenceRequests: ...
def open_reference_any(
    config: ManagerConfig | PagedConfig | SessionConfig | RadixConfig | PoolSetup,
    manifest: Manifest,
    adapter_dir: Path,
    *,
    workers: int = 1,
) -> ReferenceImplementation | ManagerImplementation | RadixImplementation | ReferenceRequests:
    """The implementation of the family ``config`` opens (the suite passes ``workers`` only to a
    block-level session of several workers)."""
    if isinstance(config, PoolSetup):
        return open_reference_requests(config, manifest, adapter_dir)
    if isinstance(config, RadixConfig):
        return open_reference_radix(config, manifest, adapter_dir)
    if isinstance(config, PagedConfig | SessionConfig):
        return open_reference_manager(config, manifest, adapter_dir)
    return open_reference(config, manifest, adapter_dir, workers)
