"""Compare what an implementation reported with what the spec expects.

``first_divergence`` finds the first difference between an expected and an
actual step outcome and names the rule it breaks, so that a golden scenario
and the lockstep machine report the same rule for the same mistake:

- an error where none was expected, or none where one was: the rule of the
  expected error, or the rule the operation exercises;
- a different result: the operation's rule (USE-CAPACITY for a Use, ...);
- the first differing event: EVENT-ID for its id, EVENT-SOURCE for tier or
  dp_rank, EVENT-ORDER when a Removed comes where a Stored was due,
  STORE-NEW-ONLY / PARENT-ANCHOR / STORE-TOKENS-HASH for a Stored,
  EVICT-POLICY / REMOVE-EXACT for a Removed, and the G2 rules on the
  host-pinned tier;
- different counters: COUNTERS (QUARANTINE-HOLD when only the quarantine
  differs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec.spec.rules import RuleId
from kvspec.spec.wire import (
    Counters,
    Deref,
    Destroy,
    FullBlock,
    KvEvent,
    Operation,
    OpResult,
    Promote,
    Removed,
    Reset,
    Stored,
    SwapIn,
    Tick,
    Use,
    event_to_json,
)


@dataclass(frozen=True, slots=True)
class Divergence:
    rule: RuleId
    what: str
    expected: Any
    actual: Any

    def describe(self) -> str:
        return f"{self.what}\n  expected: {self.expected}\n  actual:   {self.actual}"


def op_rule(op: Operation | None) -> RuleId:
    """The rule an operation's result is governed by."""
    if isinstance(op, Use):
        return RuleId.USE_CAPACITY
    if isinstance(op, Deref):
        return RuleId.DEREF_OWNER
    if isinstance(op, Promote):
        return RuleId.PROMOTE_NEW
    if isinstance(op, Destroy):
        return RuleId.DESTROY_ACTIVE
    if isinstance(op, Tick):
        return RuleId.TIME_MONOTONIC
    if isinstance(op, SwapIn):
        return RuleId.SWAPIN_RESERVE
    if isinstance(op, Reset):
        return RuleId.CLEAR_ALL
    return RuleId.USE_VALIDATE


def _ev(e: KvEvent | None) -> str:
    return "(none)" if e is None else e.brief()


def event_divergence(
    expected: list[KvEvent], actual: list[KvEvent], op: Operation | None = None, *, offload: bool = False
) -> Divergence | None:
    """The first differing event, with the rule the difference breaks.

    ``offload``: the manager has a G2 tier, so a device Removed missing from
    the operation that evicted is DEVICE-REMOVE-IMMEDIATE."""
    for i in range(max(len(expected), len(actual))):
        exp = expected[i] if i < len(expected) else None
        act = actual[i] if i < len(actual) else None
        if exp is not None and act is not None and event_to_json(exp) == event_to_json(act):
            continue
        rule = _event_rule(exp, act, expected, actual, op)
        if isinstance(op, Destroy):
            rule = RuleId.DESTROY_ACTIVE
        elif (
            offload
            and exp is not None
            and exp.kind == "removed"
            and exp.storage_tier == "device"
            and (act is None or act.kind != "removed")
        ):
            rule = RuleId.DEVICE_REMOVE_IMMEDIATE
        return Divergence(rule, f"event {i} of the operation", _ev(exp), _ev(act))
    return None


def _event_rule(
    exp: KvEvent | None, act: KvEvent | None, expected: list[KvEvent], actual: list[KvEvent], op: Operation | None
) -> RuleId:
    host = (exp or act).storage_tier == "host_pinned" if (exp or act) is not None else False  # type: ignore[union-attr]
    if exp is None or act is None:
        one = exp or act
        assert one is not None
        if one.storage_tier == "host_pinned":
            if one.kind == "stored":
                return RuleId.G2_STORE_ON_COMPLETE
            return RuleId.G2_EVICT
        if isinstance(op, Tick) and one.kind == "removed":
            return RuleId.DEVICE_REMOVE_IMMEDIATE
        if isinstance(op, Tick) and one.kind == "stored":  # a device Stored in a Tick registers a swap-in
            return RuleId.SWAPIN_SKIP_PRESENT
        if one.kind == "stored":
            return RuleId.STORE_NEW_ONLY
        if one.kind == "removed":
            return RuleId.REMOVE_EXACT
        return RuleId.CLEAR_ALL
    if exp.kind != act.kind:
        if exp.storage_tier != act.storage_tier:
            return RuleId.EVENT_SOURCE
        i = expected.index(exp)
        if _is_subsequence(_shape(actual[i:]), _shape(expected[i:])):  # expected events are missing
            if exp.storage_tier == "host_pinned":
                return RuleId.G2_STORE_ON_COMPLETE if exp.kind == "stored" else RuleId.G2_EVICT
            return RuleId.REMOVE_EXACT if exp.kind == "removed" else RuleId.STORE_NEW_ONLY
        if _is_subsequence(_shape(expected[i:]), _shape(actual[i:])):  # extra events were published
            return RuleId.REMOVE_EXACT if act.kind == "removed" else RuleId.STORE_NEW_ONLY
        if exp.kind == "stored" and act.kind == "removed":
            return RuleId.EVENT_ORDER
        if exp.kind == "removed" and act.kind == "stored":
            return RuleId.EVENT_ORDER if any(e.kind == "stored" for e in expected) else RuleId.STORE_NEW_ONLY
        return RuleId.CLEAR_ALL
    if exp.event_id != act.event_id:
        return RuleId.EVENT_ID
    if exp.storage_tier != act.storage_tier or exp.dp_rank != act.dp_rank:
        return RuleId.EVENT_SOURCE
    if isinstance(exp.data, Stored) and isinstance(act.data, Stored):
        e, a = exp.data.stored, act.data.stored
        onboard = isinstance(op, Tick) and not host  # the Stored of swapped-in blocks
        if [b.block_hash for b in e.blocks] != [b.block_hash for b in a.blocks]:
            if onboard:
                return RuleId.SWAPIN_SKIP_PRESENT
            return RuleId.G2_STORE_ON_COMPLETE if host else RuleId.STORE_NEW_ONLY
        if e.parent_hash != a.parent_hash:
            if onboard:
                return RuleId.SWAPIN_ANCHOR
            return RuleId.G2_STORE_ON_COMPLETE if host else RuleId.PARENT_ANCHOR
        if [b.tokens_hash for b in e.blocks] != [b.tokens_hash for b in a.blocks]:
            return RuleId.G2_STORE_ON_COMPLETE if host else RuleId.STORE_TOKENS_HASH
        return RuleId.G2_STORE_ON_COMPLETE if host else RuleId.STORE_NEW_ONLY  # token ids differ
    if isinstance(exp.data, Removed) and isinstance(act.data, Removed):
        e_h, a_h = exp.data.removed.block_hashes, act.data.removed.block_hashes
        if host:
            return RuleId.G2_EVICT
        if len(e_h) == len(a_h) and set(e_h) != set(a_h):
            return RuleId.EVICT_POLICY
        return RuleId.REMOVE_EXACT
    return RuleId.EVENT_SOURCE


def _shape(events: list[KvEvent]) -> list[tuple[str, str, tuple[int, ...]]]:
    """Events without their ids: enough to tell a missing or extra event from
    a reordering."""
    return [(e.kind, e.storage_tier, tuple(e.hashes())) for e in events]


def _is_subsequence(short: list[Any], long: list[Any]) -> bool:
    it = iter(long)
    return all(any(x == y for y in it) for x in short)


def counters_divergence(
    expected: Counters | dict[str, int], actual: Counters, op: Operation | None = None, *, stored: bool | None = None
) -> Divergence | None:
    """Differing counters, under the rule of the operation that moved them:
    quarantine counts under QUARANTINE-HOLD (QUARANTINE-RELEASE when a Tick's
    completion kept a slot),
    a Deref under DEREF-OWNER (DEREF-PARTIAL when it names a partial block and
    the free slots differ), a
    Promote under PROMOTE-NEW or PROMOTE-EXISTING (``stored``: whether the
    spec's outcome published a Stored), anything else under COUNTERS."""
    exp = expected.model_dump() if isinstance(expected, Counters) else dict(expected)
    act = actual.model_dump()
    diff = {k: (v, act.get(k)) for k, v in exp.items() if act.get(k) != v}
    if not diff:
        return None
    if "quarantined_blocks" in diff:
        want, got = diff["quarantined_blocks"]
        # a completion that keeps its slot breaks RELEASE; a slot let go early breaks HOLD
        late = isinstance(op, Tick) and got is not None and got > want
        rule = RuleId.QUARANTINE_RELEASE if late else RuleId.QUARANTINE_HOLD
    elif isinstance(op, Deref):
        partial = any(not isinstance(b, FullBlock) for b in op.blocks)
        rule = RuleId.DEREF_PARTIAL if partial and "free_blocks" in diff else RuleId.DEREF_OWNER
    elif isinstance(op, Promote):
        rule = RuleId.PROMOTE_NEW if stored else RuleId.PROMOTE_EXISTING
    elif isinstance(op, Destroy):
        rule = RuleId.DESTROY_ACTIVE
    else:
        rule = RuleId.COUNTERS
    return Divergence(
        rule,
        "counters " + ", ".join(sorted(diff)),
        {k: v[0] for k, v in diff.items()},
        {k: v[1] for k, v in diff.items()},
    )


def result_divergence(expected: OpResult, actual: OpResult, op: Operation) -> Divergence | None:
    if (
        expected.value == actual.value
        and type(expected.value) is type(actual.value)
        and expected.status == actual.status
    ):
        return None
    rule = op_rule(op)
    if (
        isinstance(op, Use)
        and actual.status != expected.status
        and "blocked_on_offload"
        in (
            actual.status,
            expected.status,
        )
    ):
        rule = RuleId.OFFLOAD_BLOCKS_USE
    return Divergence(rule, "result", expected.model_dump(), actual.model_dump())
