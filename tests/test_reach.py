"""Generated traffic reaches the behaviour the goldens pin (issue 17, item 3).

The lockstep machine is only as good as the situations its traffic gets
into. This drives the machine of adapters/reference (kvbm, every rule group
mixed in) with a seeded random stream, without Hypothesis (as
benchmarks/stateful_steps.py does), and counts, per situation, the steps that
reached it, reading the model's state before and after each step:

- ``suffix_on_inactive`` / ``suffix_on_held``: a Use anchored with ``parent``
  on a cached block the request does not hold, kept inactive by the pool or
  held by another request;
- ``release_part``: a Deref of part of what a request holds, the rest kept;
- ``stop_before_no_slot``: a Use stopped (capacity or offload) before blocks
  that were already registered, i.e. that needed no slot;
- ``partial_under_offload``: with an offload tier, a Use stopped by an
  offload at a partial block;
- ``g2_evict``: a host-pinned Removed (G2 evicted a block);
- ``ghost_decides``: under the lineage policy, an eviction while a ghost
  (a block taken out of the pool with inactive children below it) keeps its
  inactive parent from being a leaf: the ghost-node rule decides the victim.

Each must be reached, and often enough that a default run (a few dozen
examples) meets it; the counts are printed (``-s``) for the record.
"""

from __future__ import annotations

import random
import types
from collections import Counter
from typing import Any, cast

from kvspec.conformance.block import machine as mm
from kvspec.conformance.block.traffic import Planned, config_from
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.reference.policies import LineagePolicy
from kvspec.spec.wire import FullBlock, PartialBlock, StepOutcome, Use

EXAMPLES = 150
ACTIONS = 60
SITUATIONS = (
    "suffix_on_inactive",
    "suffix_on_held",
    "release_part",
    "stop_before_no_slot",
    "partial_under_offload",
    "g2_evict",
    "ghost_decides",
)


def _load_bearing_ghost(policy: Any) -> bool:
    """A ghost with inactive children whose parent is a real inactive block."""
    if not isinstance(policy, LineagePolicy):
        return False
    nodes = policy._nodes
    for n in nodes.values():
        if n.seq is None and n.children > 0 and n.parent is not None:
            p = nodes.get(n.parent)
            if p is not None and p.seq is not None:
                return True
    return False


class Reach:
    """Counts situations; mixed into the machine class under test."""

    counts: Counter[str]

    def run(self, planned: Planned | None) -> StepOutcome | None:
        check = self.check  # type: ignore[attr-defined]
        if planned is None or check is None:
            return super().run(planned)  # type: ignore[misc]
        model = check.model
        registered = set(model.registered())
        owners = dict(model.owners())
        ghost = _load_bearing_ghost(getattr(model, "policy", None))
        out: StepOutcome | None = super().run(planned)  # type: ignore[misc]
        if out is None or out.error is not None or out.result is None:
            return out
        op: Any = planned.op  # any operation kind: the counters below look at Use fields
        c = self.counts
        if planned.kind == "suffix" and isinstance(op.parent, FullBlock) and op.parent.full in registered:
            c["suffix_on_held" if owners.get(op.parent.full) else "suffix_on_inactive"] += 1
        if planned.kind == "release_part":
            c["release_part"] += 1
        if isinstance(op, Use) and out.result.status in ("capacity", "blocked_on_offload"):
            placed: int = out.result.value or 0
            rest = op.blocks[placed + 1 :]
            if any(isinstance(b, FullBlock) and b.full in registered for b in rest):
                c["stop_before_no_slot"] += 1
            stop = op.blocks[placed] if placed < len(op.blocks) else None
            if out.result.status == "blocked_on_offload" and isinstance(stop, PartialBlock):
                c["partial_under_offload"] += 1
        if any(e.kind == "removed" and e.storage_tier == "host_pinned" for e in out.events):
            c["g2_evict"] += 1
        if ghost and any(e.kind == "removed" and e.storage_tier == "device" for e in out.events):
            c["ghost_decides"] += 1
        return out


def measure(seed: int = 1, examples: int = EXAMPLES) -> Counter[str]:
    d = resolve_adapter_dir("adapters/reference")
    base = mm.machine_class(mm.MachineSetup(load_manifest(d), d, "kvbm"))
    # register=False: a machine class is not a rule group for later machines
    cls: Any = types.new_class(
        "ReachMachine", (Reach, base), {"register": False}, lambda ns: ns.update(counts=Counter())
    )
    rng = random.Random(seed)
    kinds = cls.optional_kinds()
    offload_group = next(g for g in cls.__mro__ if g.__name__ == "OffloadGroup")
    for _ in range(examples):
        config = config_from(rng.getrandbits(16), "kvbm", cls.policies())
        if rng.random() < 0.5:  # the offload group's configure draws from Hypothesis; do it here
            from kvspec.spec.config import OffloadConfig

            g2 = rng.choice((1, 2, 4))
            config = config.model_copy(update={"offload": OffloadConfig(num_g2_blocks=g2)})
        m = cls()
        m.start(config, frozenset(k for k in kinds if rng.random() < 0.5))
        try:
            for _ in range(ACTIONS):
                m.step(rng.getrandbits(40))
        finally:
            m.teardown()
    assert offload_group is not None
    return cast(Counter[str], cls.counts)


def test_generated_traffic_reaches_each_situation() -> None:
    counts = measure()
    print("reach over", EXAMPLES, "examples:", dict(counts))
    missing = [s for s in SITUATIONS if counts[s] == 0]
    assert not missing, f"generated traffic never reached {missing} (counts {dict(counts)})"
    # often enough: each at least once per 15 examples on average
    rare = [s for s in SITUATIONS if counts[s] < EXAMPLES // 15]
    assert not rare, f"reached too rarely: {rare} (counts {dict(counts)})"
