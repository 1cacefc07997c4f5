"""Mutants of the allocator-level profiles (``paged``, ``session``).

Each is the reference model of its profile with one realistic bug, served by
the mutants adapter's ``start.managers`` factory. Under any other variant name
(the G1 and request-level mutants, ``none``) the factory serves the
unmutated reference models, so the whole suite applies to every variant.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.adapters.reference.managers import ModelManager
from kvspec.conformance.manager_interface import ManagerImplementation
from kvspec.conformance.manifest import Manifest
from kvspec.reference.paged import PagedModel
from kvspec.reference.session import SessionModel
from kvspec.spec.manager_wire import ManagerConfigKind, PagedConfig

#: mutant id -> the broken model class of its profile
PAGED_BUGS: dict[str, type[PagedModel]] = {}
SESSION_BUGS: dict[str, type[SessionModel]] = {}


def open_manager_mutant(
    config: ManagerConfigKind, manifest: Manifest, adapter_dir: Path, variant: str | None = None
) -> ManagerImplementation:
    name = variant or ""
    impl = ModelManager(config)
    if isinstance(config, PagedConfig) and name in PAGED_BUGS:
        impl.model = PAGED_BUGS[name](config)
    elif not isinstance(config, PagedConfig) and name in SESSION_BUGS:
        impl.model = SESSION_BUGS[name](config)
    return impl
