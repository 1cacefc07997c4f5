"""Comparing one lockstep step: the implementation's outcome against the model's.

``StepCheck.divergences`` yields every difference of one step, each named by
the rule it breaks, in this order:

1. the error: an operation the model rejects must come back as a typed error
   with the same rule id, publish nothing and leave the counters unchanged;
   one the model accepts must not be rejected (nothing else is compared
   after a difference here: the two sides did different things);
2. the result (value and status);
3. the event stream as a router sees it (``stream_check.StreamCheck``);
4. the events themselves, exactly (``diff.event_divergence``);
   each difference is named by a lookup in the model's labels of the step
   (``reference.labels``);
5. the counters, and the earliest pending transfer deadline;
6. INV-ROUTER-MATCH: the router view of the implementation's stream against
   what the model announced.

``protocol_only`` keeps only the checks a router cares about (3 and 6, plus
rejections): for implementations whose events may differ in detail from the
model's but must still keep a router's view right.

It is a generator so that the caller decides what a divergence means: the
lockstep stops at the first one it cannot excuse. The stream check runs
once per step whatever the caller does with what came before it.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvspec.conformance.block.diff import (
    Divergence,
    counters_divergence,
    deadline_divergence,
    event_divergence,
    op_rule,
    result_divergence,
)
from kvspec.conformance.block.stream_check import StreamCheck
from kvspec.reference import Model
from kvspec.reference.labels import StepLabels
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Counters, Operation, StepOutcome


def brief_outcome(o: StepOutcome) -> str:
    """One line: the result or the error's rule, then the events."""
    if o.error is not None:
        res = f"error [{o.error.rule}]"
    else:
        assert o.result is not None
        res = f"{o.result.value} {o.result.status}"
    return f"{res} | {'; '.join(e.brief() for e in o.events) or '-'}"


def rejection_divergences(exp: StepOutcome, act: StepOutcome, before: Counters) -> Iterator[Divergence]:
    """The model rejected the operation: so must the implementation, under
    the same rule, publishing nothing and changing no counter."""
    assert exp.error is not None
    rid = RuleId(exp.error.rule)
    if act.error is None:
        yield Divergence(rid, "the operation must be rejected", f"error [{rid}]", brief_outcome(act))
        return
    if act.error.rule != exp.error.rule:
        got = f"[{act.error.rule}] {act.error.message}"
        yield Divergence(rid, "rejected under the wrong rule", f"[{rid}]", got)
    if act.events:
        yield Divergence(rid, "a rejected operation published events", "-", [e.brief() for e in act.events])
    d = counters_divergence(before, act.counters)
    if d is not None:
        yield Divergence(rid, "a rejected operation changed the counters", d.expected, d.actual)


class StepCheck:
    """Everything compared at one step of a lockstep run (see module doc)."""

    def __init__(self, stream: StreamCheck, *, protocol_only: bool) -> None:
        self.stream = stream
        self.protocol_only = protocol_only
        self.offload = stream.config.offload is not None

    def divergences(
        self,
        op: Operation,
        exp: StepOutcome,
        act: StepOutcome,
        before: Counters,
        model: Model,
        labels: StepLabels | None = None,
    ) -> Iterator[Divergence]:
        """Every difference of one step, in the order of the module doc;
        ``labels`` (the model's labels of its step) name each difference's rule."""
        if exp.error is not None:
            yield from rejection_divergences(exp, act, before)
            return
        if act.error is not None:
            got = f"error [{act.error.rule}] {act.error.message}"
            yield Divergence(op_rule(op), "the operation was rejected", brief_outcome(exp), got)
            return
        assert exp.result is not None and act.result is not None
        full = not self.protocol_only
        if full:
            d = result_divergence(exp.result, act.result, op, labels)
            if d is not None:
                yield d
        same_events = act.events == exp.events
        d = self.stream.check(op, exp, act, same_events, labels)
        if d is not None:
            yield d
        if full:
            if not same_events:
                d = event_divergence(exp.events, act.events, labels)
                if d is not None:
                    yield d
            if act.counters != exp.counters:
                d = counters_divergence(exp.counters, act.counters, labels)
                if d is not None:
                    yield d
            if act.earliest_deadline_ms != exp.earliest_deadline_ms:
                yield deadline_divergence(exp.earliest_deadline_ms, act.earliest_deadline_ms, labels)
        d = self.stream.router_match(model)
        if d is not None:
            yield d
