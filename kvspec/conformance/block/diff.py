"""Compare what an implementation reported with what the spec expects.

``event_divergence``, ``result_divergence`` and ``counters_divergence`` each
find the first difference in one part of a step's outcome and name the rule
it breaks by looking it up in the model's labels of that step
(``reference.labels.StepLabels``: the model names the rule behind every
effect and event it produced), so that a golden scenario, the lockstep
machine and the request-level check report the same rule for the same
mistake:

- a different result: the rule the model says decided it (USE-CAPACITY,
  OFFLOAD-BLOCKS-USE, PROMOTE-EXISTING, ...), else the operation's own rule
  (``op_rule``);
- the first differing event: EVENT-ID for its id, EVENT-SOURCE for its tier
  or dp_rank, EVENT-ORDER when the same events come in another order; an
  expected event that is missing, by the rule that published it; an extra
  event, by the rule under which the operation publishes no such event;
  a Stored that differs in its blocks, parent or tokens hashes, and a Removed
  that names other blocks or other victims, by the rule behind that aspect
  of the expected event;
- different counters: the first rule the model applied that moves a
  differing counter (COUNTERS when none does).

``Divergence`` is the one difference type of every checker (block level and
request level).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec.reference.labels import StepLabels, default_label
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import (
    Counters,
    Deref,
    Destroy,
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
    """One difference from the spec, named by the rule it breaks.

    ``what`` says which part differs, ``expected`` / ``actual`` show it;
    ``request`` names the request of a request-level run and ``detail``
    carries a longer context (the two event streams side by side)."""

    rule: RuleId
    what: str
    expected: Any
    actual: Any
    request: int | None = None
    detail: str = ""

    def describe(self) -> str:
        where = f" (request {self.request})" if self.request is not None else ""
        text = f"{self.what}{where}\n  expected: {self.expected}\n  actual:   {self.actual}"
        return f"{text}\n{self.detail}" if self.detail else text


def op_rule(op: Operation | None) -> RuleId:
    """The rule an operation's result is governed by, when the model names none."""
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


#: the lower-tier rules, most specific first: a deadline that differs in a step
#: where the model applied one of them differs because of that decision (a copy
#: the tier should have filtered, admitted, evicted for or staged takes the
#: tiers' links, and the deadline is when a link next completes)
_TIER_DEADLINE = ("TIER-DEDUP", "TIER-ADMIT", "TIER-EVICT", "TIER-ONBOARD", "TIER-OWNER", "TIER-CASCADE")


def deadline_divergence(expected: float | None, actual: float | None, labels: StepLabels | None) -> Divergence:
    """A different earliest pending deadline: TIME-MONOTONIC, or the lower-tier
    rule the model applied in the step (``_TIER_DEADLINE``)."""
    applied = {str(r) for r in labels.rules} if labels is not None else set()
    rule = next((RuleId(r) for r in _TIER_DEADLINE if r in applied), RuleId.TIME_MONOTONIC)
    return Divergence(rule, "earliest pending deadline", expected, actual)


def unlabelled(events: list[KvEvent]) -> StepLabels:
    """Labels for expected events that no model step produced (each event's default)."""
    return StepLabels(events=[default_label(e.storage_tier, e.kind) for e in events])


def _ev(e: KvEvent | None) -> str:
    return "(none)" if e is None else e.brief()


def event_divergence(
    expected: list[KvEvent], actual: list[KvEvent], labels: StepLabels | None = None
) -> Divergence | None:
    """The first differing event, with the rule the difference breaks
    (``labels``: the model's labels of the step that published ``expected``)."""
    for i in range(max(len(expected), len(actual))):
        exp = expected[i] if i < len(expected) else None
        act = actual[i] if i < len(actual) else None
        if exp is not None and act is not None and event_to_json(exp) == event_to_json(act):
            continue
        if labels is None or len(labels.events) != len(expected):
            labels = unlabelled(expected)
        return Divergence(event_rule(expected, actual, i, labels), f"event {i} of the operation", _ev(exp), _ev(act))
    return None


def event_rule(expected: list[KvEvent], actual: list[KvEvent], i: int, labels: StepLabels) -> RuleId:
    """The rule broken where ``expected`` and ``actual`` first differ, at ``i``."""
    exp = expected[i] if i < len(expected) else None
    act = actual[i] if i < len(actual) else None
    if exp is None:
        assert act is not None
        return labels.unexpected(act)
    lab = labels.events[i]
    if act is None:
        return lab.published
    if exp.kind != act.kind:
        if exp.storage_tier != act.storage_tier and exp.hashes() == act.hashes():
            return RuleId.EVENT_SOURCE
        if _is_subsequence(_shape(actual[i:]), _shape(expected[i:])):  # expected events are missing
            return lab.published
        if _is_subsequence(_shape(expected[i:]), _shape(actual[i:])):  # extra events were published
            return labels.unexpected(act)
        if "cleared" in (exp.kind, act.kind):
            return labels.unexpected(act)
        if exp.storage_tier != act.storage_tier:  # another event altogether: the expected one is missing
            return lab.published
        if not any(e.kind == act.kind for e in expected):
            return labels.unexpected(act)
        return RuleId.EVENT_ORDER
    if exp.event_id != act.event_id:
        return RuleId.EVENT_ID
    if exp.storage_tier != act.storage_tier or exp.dp_rank != act.dp_rank:
        return RuleId.EVENT_SOURCE
    if isinstance(exp.data, Stored) and isinstance(act.data, Stored):
        e, a = exp.data.stored, act.data.stored
        if [b.block_hash for b in e.blocks] != [b.block_hash for b in a.blocks]:
            return lab.blocks
        if e.parent_hash != a.parent_hash:
            return lab.parent or lab.blocks
        if [b.tokens_hash for b in e.blocks] != [b.tokens_hash for b in a.blocks]:
            return lab.tokens or lab.blocks
        return lab.blocks  # token ids or start position differ
    if isinstance(exp.data, Removed) and isinstance(act.data, Removed):
        e_h, a_h = exp.data.removed.block_hashes, act.data.removed.block_hashes
        if len(e_h) == len(a_h) and set(e_h) != set(a_h):
            return lab.choice or lab.blocks
        return lab.blocks
    return RuleId.EVENT_SOURCE


def _shape(events: list[KvEvent]) -> list[tuple[str, str, tuple[int, ...]]]:
    """Events without their ids: enough to tell a missing or extra event from
    a reordering."""
    return [(e.kind, e.storage_tier, tuple(e.hashes())) for e in events]


def _is_subsequence(short: list[Any], long: list[Any]) -> bool:
    it = iter(long)
    return all(any(x == y for y in it) for x in short)


#: the order differing counters are looked at: the quarantine first
_COUNTER_ORDER = ("quarantined_blocks", "free_blocks", "active_blocks", "inactive_blocks", "active_refs")


def counters_divergence(
    expected: Counters | dict[str, int], actual: Counters, labels: StepLabels | None = None
) -> Divergence | None:
    """Differing counters, under the first rule the model applied that moves
    one of them (``labels``; COUNTERS when none does or there are no labels)."""
    exp = expected.model_dump() if isinstance(expected, Counters) else dict(expected)
    act = actual.model_dump()
    diff = {k: (v, act.get(k)) for k, v in exp.items() if act.get(k) != v}
    if not diff:
        return None
    order = [k for k in _COUNTER_ORDER if k in diff] + sorted(k for k in diff if k not in _COUNTER_ORDER)
    rule = labels.counters_rule(order) if labels is not None else RuleId.COUNTERS
    return Divergence(
        rule,
        "counters " + ", ".join(sorted(diff)),
        {k: v[0] for k, v in diff.items()},
        {k: v[1] for k, v in diff.items()},
    )


def result_divergence(
    expected: OpResult, actual: OpResult, op: Operation, labels: StepLabels | None = None
) -> Divergence | None:
    """A different result, under the rule the model says decided it (else
    the operation's rule); a Use that reports blocked_on_offload where the
    model did not claims OFFLOAD-BLOCKS-USE."""
    if (
        expected.value == actual.value
        and type(expected.value) is type(actual.value)
        and expected.status == actual.status
    ):
        return None
    rule = (labels.result if labels is not None else None) or op_rule(op)
    if isinstance(op, Use) and actual.status == "blocked_on_offload" != expected.status:
        rule = RuleId.OFFLOAD_BLOCKS_USE
    return Divergence(rule, "result", expected.model_dump(), actual.model_dump())
