"""What one block-level model step returns, and the protocol every block-level model
implements (the protocol of every profile's model is ``spec.model.ProfileModel``)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvspec.reference.labels import StepLabels
from kvspec.spec.config import ManagerConfig
from kvspec.spec.wire import Counters, KvEvent, Operation, OpResult


@dataclass(slots=True)
class Step:
    """The result of one operation and the events it published, in order,
    with the rules behind them (``labels``; set by the model's ``apply``)."""

    result: OpResult
    events: list[KvEvent] = field(default_factory=list)
    labels: StepLabels | None = None


class Model(Protocol):
    """A reference model of one profile: pure, deterministic, no I/O.

    ``apply`` either returns a Step or raises ``InvalidOperation`` having left
    the state exactly as it was. ``prefer`` names blocks the caller would like
    evicted when the policy allows several victims (the checker passes the
    implementation's Removed list so that the model follows its choice).
    """

    config: ManagerConfig

    def apply(self, op: Operation, *, prefer: Collection[int] = ()) -> Step: ...

    def step(self, op: Operation) -> Step:
        """``apply`` with no preference (``spec.model.ProfileModel``, the protocol of every profile's model)."""
        ...

    def counters(self) -> Counters: ...

    def registered(self, tier: str = "device") -> set[int]:
        """Blocks registered in a tier (active or inactive; G2 for host_pinned)."""
        ...

    def announced(self, tier: str = "device") -> set[int]:
        """Registered blocks whose Stored a router has seen and no Removed since."""
        ...

    def fingerprint(self) -> Any:
        """A value equal for equal states (used to prove a rejected op changed nothing)."""
        ...

    def earliest_deadline(self) -> float | None: ...
