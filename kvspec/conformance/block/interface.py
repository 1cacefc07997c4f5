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
opens the right one for a manifest. It imports nothing from the suite but the
generic protocol it specialises (``conformance/implementation.py``), so an
adapter written outside this repository depends on these two modules and the
wire models only.
"""

from __future__ import annotations

from kvspec.conformance.implementation import StepwiseImplementation
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.manifest import Manifest
from kvspec.spec.wire import (
    Counters,
    ErrorInfo,
    KvEvent,
    Operation,
    OpResult,
    ProcessOutcome,
    StepOutcome,
    WorkerEvents,
)


class Implementation(StepwiseImplementation[ManagerConfig, Operation, StepOutcome]):
    """One running manager under test, driven by block operations (the one implementation protocol,
    ``conformance/implementation.py``, for the block family). Close it (or use ``with``)."""

    manifest: Manifest
    config: ManagerConfig
    #: the workers of one process this session drives (they share G3/G4); an
    #: adapter declaring ``workers = N`` is opened with ``workers=...`` up to N
    workers: int = 1

    def step_on(self, worker: int, op: Operation) -> ProcessOutcome:
        """Apply one operation to ``worker`` of the process (SPEC.md "Lower tiers").

        A one-worker implementation serves worker 0 only, through ``step``;
        one that declares several workers overrides this."""
        if worker != 0 or self.workers != 1:
            raise ConfigError(
                f"{self.manifest.name}: opened with {self.workers} worker(s) but steps only worker 0 "
                f"(asked for worker {worker}): override step_on to serve several workers"
            )
        return ProcessOutcome(outcome=self.step(op))


__all__ = [
    "Counters",
    "ErrorInfo",
    "Implementation",
    "KvEvent",
    "OpResult",
    "Operation",
    "ProcessOutcome",
    "StepOutcome",
    "WorkerEvents",
]
