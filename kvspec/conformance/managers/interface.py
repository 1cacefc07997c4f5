"""The adapter-facing interface of the allocator-level profiles (``paged``, ``session``).

A ``ManagerImplementation`` is one running paged allocator or session-slot
manager under test: the suite sends it one operation of ``spec.manager_wire``
at a time and gets back the outcome with the manager's state. In-process
adapters implement it directly (``start.managers`` in the manifest); a child
process reaches it through protocol version 3 (``transport/manager.py``).
Like ``conformance/block/interface.py`` it depends on the spec alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

from kvspec.spec.manager_wire import ManagerConfigKind, ManagerOp, ManagerOutcome


class ManagerImplementation(ABC):
    """One running allocator-level manager. Close it (or use ``with``)."""

    config: ManagerConfigKind

    @abstractmethod
    def step(self, op: ManagerOp) -> ManagerOutcome:
        """Apply one operation; raise AdapterError if the transport fails."""

    def close(self) -> None:  # noqa: B027 - optional for in-process adapters
        """Release what the implementation holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
