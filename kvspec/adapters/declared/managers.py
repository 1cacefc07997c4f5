"""The allocator-level ports of ``adapters/declared``: the paged and session
reference models with one declared departure per variant.

- ``paged_write_in_place``: a paged port whose write to a shared block goes
  into that block, as the ferrum seed's ``PagedKvCacheManager::write_kv``
  does (sizzlecar/ferrum-infer-rs crates/ferrum-kv/src/managers/paged.rs),
  declared once (PAGED-COW, condition ``write_in_place``). It changes state:
  no copy is taken, so later free counts, capacity and pressure differ from
  the spec's run, and the lockstep follows it (``conformance/managers/follow.py``).

- ``session_free_slot_handle``, ``session_another_sessions_handle``,
  ``session_no_slot_handle``: session ports with one of the llama.cpp-based
  runtime's handle checks each (``KvCacheManager::sequence_generation_matches``
  compares the generation only; ``finalize_slot`` / ``release_slot_for_reset``
  trust the handle), the departures ``adapters/session_rust`` declares,
  each declared once by its condition (``reference/session.py``, ``FOLLOW``).

``bug``: a mutant of ``adapters/manager_mutants`` (``bugs.py``) under the
departure, to show that the declaration hides no bug outside its cause.
A block-level variant of the folder leaves these profiles as the reference.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.adapters.manager_mutants.bugs import PAGED_BUGS, SESSION_BUGS
from kvspec.adapters.reference.managers import ModelManager
from kvspec.api import ManagerImplementation
from kvspec.spec.errors import ConfigError
from kvspec.spec.manager_wire import ManagerConfigKind, PagedConfig
from kvspec.spec.manifest import Manifest
from kvspec.spec.registry import PAGED, SESSION

#: each manager variant's departure: (the profile it lives in, the model's switch)
MANAGER_DEPARTURES: dict[str, tuple[str, str]] = {
    "paged_write_in_place": (PAGED, "write_in_place"),
    "session_free_slot_handle": (SESSION, "fence_generation_only"),
    "session_another_sessions_handle": (SESSION, "trust_handle_session"),
    "session_no_slot_handle": (SESSION, "unchecked_slots"),
}


def declared_manager(variant: str | None, config: ManagerConfigKind, bug: str | None = None) -> ModelManager:
    """The reference model of ``config``'s profile (with mutant ``bug`` if
    given) with ``variant``'s departure switched on under its profile."""
    impl = ModelManager(config)
    if bug is not None:
        bugs = PAGED_BUGS if isinstance(config, PagedConfig) else SESSION_BUGS
        if bug not in bugs:
            raise ConfigError(f"no {config.kind} mutant {bug!r} in adapters/manager_mutants")
        impl.model = bugs[bug](config)  # type: ignore[arg-type]
    if variant in MANAGER_DEPARTURES:
        profile, switch = MANAGER_DEPARTURES[variant]
        if config.kind == profile:
            setattr(impl.model, switch, True)
    return impl


def open_declared_manager(
    config: ManagerConfigKind, manifest: Manifest, adapter_dir: Path, variant: str | None = None
) -> ManagerImplementation:
    """The manager port of ``variant`` (None, or a block-level variant: the reference)."""
    return declared_manager(variant, config)


__all__ = ["MANAGER_DEPARTURES", "declared_manager", "open_declared_manager"]
