"""The two-worker lockstep: two kvbm workers sharing G3/G4, driven against the reference process.

Hypothesis draws a configuration with the lower tiers on (G3 and/or G4, each
only if the adapter declares its tier; every semantics option among the
values the adapter declares, the shared link, which the lower tiers need)
and a run of operations, each on worker 0 or 1:

- ``use``: a request places the path from a root to a node of a small fixed
  block tree (the same hashes and lineage for both workers, so the workers
  offload the same blocks and the shared tiers' deduplication is exercised);
  it then holds the blocks the Use placed;
- ``release``: a request releases its blocks, leaves first;
- ``tick``: a worker's clock moves to its earliest pending deadline (the
  model's) or a little later: the shared links advance, and the worker takes
  its completed lower-tier transfers (TIER-OWNER);
- ``swap_in``: a path is swapped back in from the root (no parent), so hits
  in G3/G4 are staged through G2 (TIER-ONBOARD).

Every step goes through ``ProcessChecker`` (results, every worker's events,
counters, deadline, one router view per worker and tier). The traffic keeps
the caller contracts (``reference/caller_contracts.py``): it names no parent
at all, so ASSUME-PARENT-REGISTERED and ASSUME-SWAPIN-PARENT-HELD hold by
construction, and each step asserts it on the model (a break is the
traffic's bug, reported as such, never as the implementation's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.workers.check import ProcessChecker
from kvspec.reference.caller_contracts import broken_contracts
from kvspec.spec.config import SEMANTICS, ManagerConfig, OffloadConfig
from kvspec.spec.manifest import Capabilities
from kvspec.spec.profiles import KVBM
from kvspec.spec.profiles import profile as get_profile
from kvspec.spec.wire import Deref, FullBlock, Operation, Plh, SwapIn, SwapInBlock, Tick, Use

#: the block tree both workers draw paths from: node -> parent (None: a root)
TREE: dict[int, int | None] = {1: None, 2: None, 3: None, 4: 1, 5: 1, 6: 2, 7: 4, 8: 4, 9: 6, 10: 3, 11: 10, 12: 7}
WORKERS = 2
#: what draws the traffic's choices (``st.data().draw``, or a composite's draw)
Draw = Callable[..., Any]
LATER_MS = (0.0, 0.5, 1.0, 3.0)
#: the actions, weighted: enough releases and ticks that G1 evicts into G2, G2
#: into G3 and G3 its own leaves, and swap-ins that find blocks only G3/G4 hold
KINDS = ("use", "use", "release", "release", "tick", "tick", "tick", "swap_in", "swap_in")


def path_to(node: int) -> list[int]:
    out = [node]
    while (p := TREE[out[-1]]) is not None:
        out.append(p)
    return out[::-1]


def plh_of(path: list[int], i: int) -> Plh:
    return Plh(hash=path[i], parent=path[i - 1] if i else None, position=i)


def use_of(path: list[int]) -> Use:
    return Use(
        blocks=[FullBlock(full=h) for h in path],
        local_hashes=[h * 1000 + 7 for h in path],
        plhs=[plh_of(path, i) for i in range(len(path))],
    )


def swap_in_of(path: list[int]) -> SwapIn:
    return SwapIn(blocks=[SwapInBlock(seq_hash=h, plh=plh_of(path, i)) for i, h in enumerate(path)])


@st.composite
def tier_configs(draw: st.DrawFn, caps: Capabilities) -> ManagerConfig:
    """A kvbm configuration with G3 and/or G4 on, within what ``caps`` declares."""
    policies = [p for p in get_profile(KVBM.name).policies if p in caps.policies]
    g3_ok, g4_ok = "disk" in caps.tiers, "external" in caps.tiers
    g3 = draw(st.sampled_from([1, 2, 4, None])) if g3_ok else None
    g4 = draw(st.booleans()) if g4_ok else False
    if g3 is None and not g4:
        g3, g4 = (2, False) if g3_ok else (None, True)
    options = {
        name: draw(st.sampled_from(caps.supported(name)))
        for name, opt in SEMANTICS.items()
        if opt.scope == "offload" and name != "link"
    }
    offload = OffloadConfig(
        num_g2_blocks=draw(st.sampled_from([1, 2, 3])),
        block_size_bytes=draw(st.sampled_from([None, 1_000_000])),
        batch_size=draw(st.sampled_from([32, 2])),
        link="shared",
        num_g3_blocks=g3,
        g4=g4,
        **options,  # type: ignore[arg-type]
    )
    return ManagerConfig(
        capacity=draw(st.sampled_from([2, 3])),
        block_size=4,
        eviction=draw(st.sampled_from(policies)),
        offload=offload,
    )


@dataclass
class WorkersRun:
    """The traffic's state: what each worker's requests hold, each worker's clock."""

    checker: ProcessChecker
    held: list[list[list[int]]] = field(default_factory=lambda: [[] for _ in range(WORKERS)])
    clock: list[float] = field(default_factory=lambda: [0.0] * WORKERS)
    steps: int = 0

    def send(self, worker: int, op: Operation) -> None:
        model = self.checker.model.workers[worker]
        breaks = broken_contracts(model, op)
        if breaks:  # the traffic's bug: never blamed on the implementation
            raise AssertionError(f"two-worker traffic broke a caller contract: {breaks[0]} ({op!r})")
        self.steps += 1
        got, _ = self.checker.step(worker, op, f"two-worker lockstep, step {self.steps}")
        if isinstance(op, Use) and got.outcome.result is not None:
            placed = got.outcome.result.value
            n = placed if isinstance(placed, int) and not isinstance(placed, bool) else 0
            path = [b.full for b in op.blocks if isinstance(b, FullBlock)][:n]
            if path:
                self.held[worker].append(path)
        if isinstance(op, Tick):
            self.clock[worker] = max(self.clock[worker], op.now_ms)

    def step(self, draw: Draw) -> None:
        worker = draw(st.integers(0, WORKERS - 1))
        kind = draw(st.sampled_from(KINDS))
        if kind == "release" and self.held[worker]:
            path = self.held[worker].pop(draw(st.integers(0, len(self.held[worker]) - 1)))
            self.send(worker, Deref(blocks=[FullBlock(full=h) for h in reversed(path)]))
        elif kind == "tick" or (kind == "release" and not self.held[worker]):
            due = self.checker.model.workers[worker].earliest_deadline()
            base = due if due is not None and due >= self.clock[worker] else self.clock[worker]
            self.send(worker, Tick(now_ms=base + draw(st.sampled_from(LATER_MS))))
        elif kind == "swap_in":
            # a path whose root G1 lacks and G2, G3 or G4 holds (else any path)
            me, process = self.checker.model.workers[worker], self.checker.model
            below = set(me.g2) | process.contents("g3") | process.contents("g4")
            away = [n for n in sorted(TREE) if path_to(n)[0] in below - me.registered()]
            node = draw(st.sampled_from(away or sorted(TREE)))
            self.send(worker, swap_in_of(path_to(node)) if away else use_of(path_to(node)))
        else:
            self.send(worker, use_of(path_to(draw(st.sampled_from(sorted(TREE))))))

    def held_counts(self, worker: int) -> Counter[int]:
        return Counter(h for path in self.held[worker] for h in path)


def run_two_workers(
    impl: Implementation,
    config: ManagerConfig,
    draw: Draw,
    max_steps: int = 60,
    record: Callable[[str, int], None] | None = None,
) -> WorkersRun:
    """Drive ``impl`` (opened with two workers on ``config``) for up to ``max_steps``
    drawn steps; ``record(rule, n)`` counts the rules each step exercised."""
    run = WorkersRun(ProcessChecker(impl, config, WORKERS, record=record))
    for _ in range(draw(st.integers(max_steps // 2, max_steps))):
        run.step(draw)
    return run
