"""Rule coverage: which rules one checked step exercised.

Judged from the model's side (the expected outcome and the model's state
before the step), so that the count says what the traffic asked of the
implementation, whatever it did. The lockstep adds each step to its
``coverage`` counter; the plugin's summary (``kvspec: rules exercised``)
and the generator reach tests read it.

Invariants (``INV-*``) are proven of the model (INVARIANTS.md); a lockstep
step exercises one on the implementation where it asks for what the
invariant constrains and compares what shows it (``STEP_INVARIANTS``):

- INV-CONSERVE: every step (the counters, which sum to the capacity, are compared);
- INV-OWNERS: a step that takes a block's last owner (Deref, Destroy) or
  gives an inactive block one (a hit, a Promote onto it): active exactly
  while owned, shown by the active and inactive counters and, later, by a
  Deref of it being refused;
- INV-NO-DUP: a step that names a registered block again (a hit, a Promote
  of an existing block): it must take no second slot (free_blocks) nor be
  Stored again;
- INV-PARTIAL-UUID: a step that places or drops a partial block (its slot
  count is compared);
- INV-QUARANTINE: a step that ends with slots quarantined (offload);
- INV-KVBM-ANNOUNCED / INV-LEGACY-ANNOUNCED: every INV-ROUTER-MATCH check
  under that profile (the router view against the model's announced blocks);
- INV-ATOMIC-NO-HALF: every accepted atomic Use (its count is compared);
  INV-ATOMIC-ANCHOR: every atomic device Stored (its parent is checked
  against the router's view, with no known break to excuse it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvspec.reference import Model
from kvspec.spec.profiles import PROFILES
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


#: the invariants a lockstep step exercises (module doc), by profile (None: every profile); a profile's
#: own invariants are its declaration's (``Profile.own_invariants``, spec/profiles.py)
STEP_INVARIANTS: dict[RuleId, tuple[str, ...] | None] = {
    RuleId.INV_CONSERVE: None,
    RuleId.INV_OWNERS: None,
    RuleId.INV_NO_DUP: None,
    RuleId.INV_PARTIAL_UUID: None,
    **{
        rule: tuple(p.name for p in PROFILES.values() if rule in p.own_invariants)
        for rule in sorted({r for p in PROFILES.values() for r in p.own_invariants}, key=list(RuleId).index)
    },
}


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
        """The snapshot before ``op`` (only Use, Promote, Deref and Destroy read the blocks)."""
        if not isinstance(op, Use | Promote | Deref | Destroy):
            return cls(counters)
        owners: dict[int, int] = getattr(model, "owners", dict)()
        return cls(counters, frozenset(model.registered()), owners)


def cover_step(
    c: Counter[str], op: Operation, exp: StepOutcome, before: Before, *, offload: bool, profile: str = ""
) -> None:
    """Add the rules step ``op`` exercised (outcome ``exp``) to ``c``.
    ``offload``: the manager has a G2 tier; ``profile``: the profile checked
    (for the profile's own invariants, module doc)."""
    c[RuleId.COUNTERS] += 1
    c[RuleId.INV_CONSERVE] += 1
    c[RuleId.INV_ROUTER_MATCH] += 1
    own = PROFILES.get(profile)
    if own is not None and own.announced is not None:
        c[own.announced] += 1
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
        if own is not None and RuleId.INV_ATOMIC_NO_HALF in own.own_invariants:
            c[RuleId.INV_ATOMIC_NO_HALF] += 1
        for b in op.blocks[:placed]:
            if isinstance(b, PartialBlock):
                c[RuleId.USE_PARTIAL] += 1
                c[RuleId.INV_PARTIAL_UUID] += 1
            elif b.full in before.registered:
                owned = before.owners.get(b.full, 0)
                c[RuleId.USE_HIT_ACTIVE if owned else RuleId.USE_HIT_INACTIVE] += 1
                c[RuleId.INV_NO_DUP] += 1
                if not owned:
                    c[RuleId.INV_OWNERS] += 1
            else:
                c[RuleId.USE_NEW] += 1
    elif isinstance(op, Deref):
        for b in op.blocks:
            if isinstance(b, PartialBlock):
                c[RuleId.DEREF_PARTIAL] += 1
                c[RuleId.INV_PARTIAL_UUID] += 1
            else:
                c[RuleId.DEREF_OWNER] += 1
                if before.owners.get(b.full, 0) == 1:
                    c[RuleId.INV_OWNERS] += 1
    elif isinstance(op, Promote):
        if op.seq_hash in before.registered:
            c[RuleId.PROMOTE_EXISTING] += 1
            c[RuleId.INV_NO_DUP] += 1
            if not before.owners.get(op.seq_hash, 0):
                c[RuleId.INV_OWNERS] += 1
        else:
            c[RuleId.PROMOTE_NEW] += 1
    elif isinstance(op, Destroy):
        c[RuleId.DESTROY_ACTIVE] += 1
        c[RuleId.INV_OWNERS] += sum(1 for b in op.blocks if not isinstance(b, PartialBlock))
    elif isinstance(op, Tick):
        c[RuleId.TIME_MONOTONIC] += 1
        if exp.counters.quarantined_blocks < prev.quarantined_blocks:
            c[RuleId.QUARANTINE_RELEASE] += 1
    elif isinstance(op, SwapIn):
        c[RuleId.SWAPIN_RESERVE] += 1
    if exp.counters.quarantined_blocks:
        c[RuleId.QUARANTINE_HOLD] += 1
        c[RuleId.INV_QUARANTINE] += 1
    for e in exp.events:
        c[RuleId.EVENT_ID] += 1
        c[RuleId.EVENT_SOURCE] += 1
        if e.storage_tier == "host_pinned":
            c[RuleId.G2_STORE_ON_COMPLETE if e.kind == "stored" else RuleId.G2_EVICT] += 1
        elif e.kind == "stored":
            c[RuleId.STORE_NEW_ONLY] += 1
            c[RuleId.PARENT_ANCHOR] += 1
            c[RuleId.STORE_NO_DUP] += 1
            if own is not None and RuleId.INV_ATOMIC_ANCHOR in own.own_invariants:
                c[RuleId.INV_ATOMIC_ANCHOR] += 1
            if e.block_token_ids is not None:
                c[RuleId.STORE_TOKENS_HASH] += 1
        elif e.kind == "removed":
            c[RuleId.REMOVE_EXACT] += 1
            c[RuleId.EVICT_POLICY] += 1
            c[RuleId.REMOVE_NO_ORPHAN] += 1
            if isinstance(op, Use | SwapIn):
                c[RuleId.DEVICE_REMOVE_IMMEDIATE if offload else RuleId.EVENT_ORDER] += 1
