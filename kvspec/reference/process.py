"""Several kvbm workers of one process, sharing G3 and G4.

Dynamo's mocker runs one ``KvManager`` (G1 and its own G2) per worker and
one G3 pool and G4 store per process (ai-dynamo/dynamo
``lib/mocker/src/kvbm_offload/shared_g3.rs``, ``shared_g4.rs``). A
``Process`` is that: ``workers`` ``G1Model`` instances built from one
config, sharing one ``LowerTiers``. An operation names the worker it goes
to; each worker keeps its own event stream (event ids count per worker),
and a step can publish on another worker's stream too (under
``lower_tier_events = "owner"``, the disk Removed of a G3 victim comes from
the worker that put it there, whoever's copy evicted it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvspec.reference.g1 import G1Model
from kvspec.reference.lower_tiers import LowerTiers
from kvspec.reference.outcome import Step
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.wire import KvEvent, Operation


@dataclass(slots=True)
class ProcessStep:
    """One operation on one worker: that worker's step, and what every other
    worker published during it."""

    worker: int
    step: Step
    others: dict[int, list[KvEvent]] = field(default_factory=dict)

    def events_of(self, worker: int) -> list[KvEvent]:
        return self.step.events if worker == self.worker else self.others.get(worker, [])


class Process:
    """``workers`` kvbm workers sharing the lower tiers of ``config.offload``."""

    def __init__(self, config: ManagerConfig, workers: int) -> None:
        if workers < 1:
            raise ConfigError(f"a process has at least one worker, not {workers}")
        off = config.offload
        tiers = LowerTiers(off) if off is not None and off.lower_tiers() else None
        self.tiers = tiers
        self.workers = [G1Model(config, worker=i, tiers=tiers) for i in range(workers)]

    def apply(self, worker: int, op: Operation) -> ProcessStep:
        if not 0 <= worker < len(self.workers):
            raise ConfigError(f"worker {worker} is not one of the process's {len(self.workers)} workers")
        step = self.workers[worker].apply(op)
        others = {i: w.drain_outbox() for i, w in enumerate(self.workers) if i != worker and w.outbox}
        return ProcessStep(worker, step, others)

    def contents(self, tier: str) -> set[int]:
        """The blocks G3 (``"g3"``) or G4 (``"g4"``) holds."""
        return self.tiers.contents(tier) if self.tiers is not None else set()
