"""In-process adapter of the paged and session mutants: ``--impl=adapters/manager_mutants/NAME``.

Without a variant it is the unmutated reference models (the sanity run of
``kvspec mutants --impl=adapters/manager_mutants``); with one, the broken
model of ``bugs.py`` under the variant's profile and the reference under
the other.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.adapters.manager_mutants.bugs import PAGED_BUGS, SESSION_BUGS
from kvspec.adapters.reference.managers import ModelManager
from kvspec.api import ManagerImplementation, Manifest
from kvspec.spec.errors import ConfigError
from kvspec.spec.manager_wire import ManagerConfigKind, PagedConfig


def open_manager_mutant(
    config: ManagerConfigKind, manifest: Manifest, adapter_dir: Path, variant: str | None = None
) -> ManagerImplementation:
    if variant is not None and variant not in PAGED_BUGS and variant not in SESSION_BUGS:
        raise ConfigError(f"manager_mutants: no model for variant {variant!r}")
    impl = ModelManager(config)
    if isinstance(config, PagedConfig):
        if variant in PAGED_BUGS:
            impl.model = PAGED_BUGS[variant](config)
    elif variant in SESSION_BUGS:
        impl.model = SESSION_BUGS[variant](config)
    return impl
