"""Rule coverage: which rules one checked step exercised.

Judged from the model's side (the expected outcome and the model's state
before the step), so that the count says what the traffic asked of the
implementation, whatever it did. The lockstep adds each step to its
``coverage`` counter; the plugin's summary (``kvspec: rules exercised``)
and the generator reach tests read it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvspec.reference import Model
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import (
    Counters,
    Deref,
    Destroy,
    Operation,
    OpResult,
    PartialBlock,
    Promote,
    StepOutcome,
    SwapIn,
    Tick,
    Use,
)


def use_placed(op: Use, result: OpResult, refs_delta: int) -> int:
    """How many blocks of ``op`` (a prefix) a Use placed. A count result says
    so; a boolean (legacy) true means all, false means as many as the active
    references grew by (each placed block adds exactly one, and a legacy Use
    never names a partial block it already holds)."""
    v = result.value
    if isinstance(v, bool):
        return len(op.blocks) if v else max(0, refs_delta)
    return int(v or 0)


@dataclass(frozen=True, slots=True)
class Before:
    """What coverage (and rule attribution) needs to know about the model's
    state before a step: its counters, and for Use and Promote the blocks
    registered and their owner counts."""

    counters: Counters
    registered: frozenset[int] = frozenset()
    owners: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, model: Model, op: Operation, counters: Counters) -> Before:
        """The snapshot before ``op`` (only Use and Promote read the blocks)."""
        if not isinstance(op, Use | Promote):
            return cls(counters)
        owners: dict[int, int] = getattr(model, "owners", dict)()
        return cls(counters, frozenset(model.registered()), owners)


def cover_step(c: Counter[str], op: Operation, exp: StepOutcome, before: Before, *, offload: bool) -> None:
    """Add the rules step ``op`` exercised (outcome ``exp``) to ``c``.
    ``offload``: the manager has a G2 tier."""
    c[RuleId.COUNTERS] += 1
    c[RuleId.INV_ROUTER_MATCH] += 1
    if exp.error is not None:
        c[exp.error.rule] += 1
        return
    res = exp.result
    assert res is not None
    prev = before.counters
    if isinstance(op, Use):
        placed = use_placed(op, res, exp.counters.active_refs - prev.active_refs)
        if res.status != "ok":
            c[RuleId.USE_CAPACITY] += 1
        if res.status == "blocked_on_offload":
            c[RuleId.OFFLOAD_BLOCKS_USE] += 1
        for b in op.blocks[:placed]:
            if isinstance(b, PartialBlock):
                c[RuleId.USE_PARTIAL] += 1
            elif b.full in before.registered:
                c[RuleId.USE_HIT_ACTIVE if before.owners.get(b.full, 0) else RuleId.USE_HIT_INACTIVE] += 1
            else:
                c[RuleId.USE_NEW] += 1
    elif isinstance(op, Deref):
        for b in op.blocks:
            c[RuleId.DEREF_PARTIAL if isinstance(b, PartialBlock) else RuleId.DEREF_OWNER] += 1
    elif isinstance(op, Promote):
        c[RuleId.PROMOTE_EXISTING if op.seq_hash in before.registered else RuleId.PROMOTE_NEW] += 1
    elif isinstance(op, Destroy):
        c[RuleId.DESTROY_ACTIVE] += 1
    elif isinstance(op, Tick):
        c[RuleId.TIME_MONOTONIC] += 1
        if exp.counters.quarantined_blocks < prev.quarantined_blocks:
            c[RuleId.QUARANTINE_RELEASE] += 1
    elif isinstance(op, SwapIn):
        c[RuleId.SWAPIN_RESERVE] += 1
    if exp.counters.quarantined_blocks:
        c[RuleId.QUARANTINE_HOLD] += 1
    for e in exp.events:
        c[RuleId.EVENT_ID] += 1
        c[RuleId.EVENT_SOURCE] += 1
        if e.storage_tier == "host_pinned":
            c[RuleId.G2_STORE_ON_COMPLETE if e.kind == "stored" else RuleId.G2_EVICT] += 1
        elif e.kind == "stored":
            c[RuleId.STORE_NEW_ONLY] += 1
            c[RuleId.PARENT_ANCHOR] += 1
            c[RuleId.STORE_NO_DUP] += 1
            if e.block_token_ids is not None:
                c[RuleId.STORE_TOKENS_HASH] += 1
        elif e.kind == "removed":
            c[RuleId.REMOVE_EXACT] += 1
            c[RuleId.EVICT_POLICY] += 1
            c[RuleId.REMOVE_NO_ORPHAN] += 1
            if isinstance(op, Use | SwapIn):
                c[RuleId.DEVICE_REMOVE_IMMEDIATE if offload else RuleId.EVENT_ORDER] += 1
