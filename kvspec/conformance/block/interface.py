"""The adapter-facing interface: what the suite sends an implementation and what comes back.

An ``Implementation`` is one running manager under test. The suite sends it
typed operations (``Operation``: Use, Deref, Destroy, Promote, Tick, SwapIn,
Reset; ``spec/wire.py``) one at a time and gets back a ``StepOutcome`` (a
result or a typed error, the counters, the events published, the earliest
pending deadline). How an operation gets there is the adapter's business:
in-process Python, a child process speaking JSON lines (spec/PROTOCOL.md), or
a C ABI through ctypes (spec/kvspec_abi.h).

This module sits below everything that talks to an implementation: the
transports (``conformance/transport/``) implement it, the checkers
(``lockstep``, ``scenario_runner``) drive it, and ``implementation.py``
opens the right one for a manifest. It imports nothing from the suite, so
an adapter written outside this repository depends on this module and the
wire models only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

from kvspec.spec.config import ManagerConfig
from kvspec.spec.manifest import Manifest
from kvspec.spec.wire import Counters, ErrorInfo, KvEvent, Operation, OpResult, StepOutcome


class Implementation(ABC):
    """One running manager under test. Close it (or use ``with``)."""

    manifest: Manifest
    config: ManagerConfig

    @abstractmethod
    def step(self, op: Operation) -> StepOutcome:
        """Apply one operation; raise AdapterError if the transport fails."""

    def close(self) -> None:  # noqa: B027 - optional for in-process adapters
        """Release everything the implementation holds (processes, libraries)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


__all__ = ["Counters", "ErrorInfo", "Implementation", "KvEvent", "OpResult", "Operation", "StepOutcome"]
