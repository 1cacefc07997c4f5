"""In-process adapter of the allocator-level profiles over the reference models.

``open_reference_manager`` is the manifest's ``start.managers`` factory: a
``ManagerImplementation`` answering from ``reference.paged`` or
``reference.session``. The mutants of those profiles (``adapters/manager_mutants``) reuse it.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.api import ManagerImplementation, PagedModel, SessionModel
from kvspec.spec.errors import ConfigError
from kvspec.spec.manager_wire import (
    ManagerConfigKind,
    ManagerOp,
    ManagerOutcome,
    PagedConfig,
    PagedOp,
    SessionOp,
    is_paged_op,
    is_session_op,
)
from kvspec.spec.manifest import Manifest


class ModelManager(ManagerImplementation):
    """A reference model behind the manager interface."""

    def __init__(self, config: ManagerConfigKind) -> None:
        self.config = config
        self.model: PagedModel | SessionModel = (
            PagedModel(config) if isinstance(config, PagedConfig) else SessionModel(config)
        )

    def step(self, op: ManagerOp) -> ManagerOutcome:
        if isinstance(self.model, PagedModel) and is_paged_op(op):
            return self.model.step(op)
        if isinstance(self.model, SessionModel) and is_session_op(op):
            return self.model.step(op)
        raise ConfigError(f"a {op.op!r} operation does not belong to the {self.config.kind} profile")


def open_reference_manager(
    config: ManagerConfigKind, manifest: Manifest, adapter_dir: Path, variant: str | None = None
) -> ManagerImplementation:
    """The reference model; a variant of another adapter (a G1 mutant) leaves these profiles alone."""
    return ModelManager(config)


__all__ = ["ModelManager", "PagedOp", "SessionOp", "open_reference_manager"]
