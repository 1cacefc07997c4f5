"""The one implementation protocol: what every family's interface has in common, said once.

Whatever the family, an implementation under test is opened for one configuration
(``kvspec.conformance.opener.open_adapter``), driven, and closed. Three families take one operation
at a time and answer each with an outcome; they differ only in the types, so one generic class
names the shape and each family's interface is that class with its wire models filled in:

- ``Implementation`` (block level): ``StepwiseImplementation[ManagerConfig, Operation, StepOutcome]``
- ``ManagerImplementation`` (paged, session):
  ``StepwiseImplementation[PagedConfig | SessionConfig, ManagerOp, ManagerOutcome]``
- ``RadixImplementation``: ``StepwiseImplementation[RadixConfig, RadixOp, RadixOutcome]``

The request level is driven by whole workloads instead (``RequestImplementation``: run a list of
requests one after another or all at once), so it shares the root, ``ImplementationBase`` (close,
``with``), but not ``step``. Code that handles any opened implementation (the plugin closing what a
test opened, the start-up probe) types it as ``ImplementationBase``; code of one family uses the
family's interface, whose names adapters written against earlier docs subclass unchanged.

Like the family interfaces, this module depends on nothing in kvspec: an adapter written outside
this repository needs it and the wire models only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Generic, Self, TypeVar

__all__ = ["ImplementationBase", "StepwiseImplementation"]

ConfigT = TypeVar("ConfigT")
OpT = TypeVar("OpT")
OutcomeT = TypeVar("OutcomeT")


class ImplementationBase(ABC):  # noqa: B024 - a root with no abstract method: close is optional
    """Any opened implementation, of any family. Close it (or use ``with``)."""

    def close(self) -> None:  # noqa: B027 - optional for in-process adapters
        """Release everything the implementation holds (processes, libraries, sockets)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class StepwiseImplementation(ImplementationBase, Generic[ConfigT, OpT, OutcomeT]):
    """One running implementation of a family driven one operation at a time: built for ``config``,
    it applies each operation and answers with its outcome."""

    config: ConfigT

    @abstractmethod
    def step(self, op: OpT) -> OutcomeT:
        """Apply one operation; raise AdapterError if the transport or the implementation fails."""
