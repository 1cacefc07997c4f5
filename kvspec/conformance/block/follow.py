"""Following a declared deviation: the model resynchronised to the implementation.

A declared deviation is contained to its cause (spec/SPEC.md, "Declared
deviations are followed"): at the step where the lockstep observes one in
scope, the model takes the implementation's outcome *and state*, so that
every rule is checked again from the next step on and a consequence of the
departure never shows up under another rule.

When the manifest declares deviations, the lockstep keeps the model's
initial state, a copy from before each step and what each step was
(``Past``), and asks ``candidates`` for the ways the differing step can be
run so that it gives the implementation's outcome exactly (result, error,
events, counters, earliest deadline):

- the implementation refused an operation the model accepted: the model
  takes the operation back (the copy before the step), provided the
  refusal published nothing and changed no counter (its rule is the one
  the operation's result is governed by, ``diff.op_rule``);
- each *follow mode* the model names (``FOLLOW``: a named condition of
  ``kvspec.spec.deviations.CONDITIONS``, the rule its departure breaks and
  the model's switch that runs it): first the step alone again from the
  copy with the switch on; then, because a departure can lie silent for a
  while (an offload job that failed whole may show only when the transfer
  would have completed), the whole run again from the initial state with
  that switch and those of the modes followed before it on, every earlier
  step giving the outcome the lockstep accepted for it. The legacy model
  runs Dynamo mocker 1.0.2's own Use validation
  (``legacy_source_validation``); the G1 model lets an offload job larger
  than G2's room fail whole with its source slots kept quarantined
  (``offload_job_fails_whole``).

A mode is taken only when it reproduces the implementation exactly: its
condition is then established, never inferred. The goldens
(``scenario_runner``) ask the same question at a failing step, with the
implementation's earlier outcomes as the history, so that a golden the
declared departure makes fail is an expected deviation under its
condition. Nothing here decides
whether a deviation covers the step: the lockstep matches the ``Site``
against the manifest.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

from kvspec.conformance.block.diff import op_rule
from kvspec.reference import Model
from kvspec.reference.labels import StepLabels
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import ErrorInfo, Operation, StepOutcome


@dataclass(slots=True)
class Past:
    """One step of the run as a replay needs it: the operation, the blocks
    the implementation evicted (the victims the model follows), the event-id
    offset then adopted, the outcome the lockstep accepted for the model,
    and whether the model took the operation back (a followed refusal)."""

    op: Operation
    prefer: set[int]
    offset: int
    expected: StepOutcome
    refused: bool = False


#: the lockstep's own model step: (model, op, prefer, event-id offset) -> outcome, labels
Run = Callable[[Model, Operation, set[int], int], tuple[StepOutcome, StepLabels | None]]


@dataclass(slots=True)
class BlockFollowed:
    """One way to run a step that gives the implementation's outcome: the
    model after it, its outcome, and what the departure is (``rule``;
    ``condition``: the named condition established, None for a refusal
    taken back; ``switch``: the model's switch of that mode)."""

    model: Model
    outcome: StepOutcome
    labels: StepLabels | None
    rule: RuleId
    condition: str | None
    switch: str | None = None


def model_run(model: Model, op: Operation, prefer: set[int], offset: int = 0) -> tuple[StepOutcome, StepLabels | None]:
    """``model``'s outcome of ``op`` as an implementation reports it (event
    ids shifted by ``offset``), and the labels of its step (None: refused).
    The goldens' ``Run``; the lockstep has its own (token ids per manifest)."""
    try:
        step = model.apply(op, prefer=prefer)
    except InvalidOperation as err:
        refused = StepOutcome.model_construct(
            result=None,
            error=ErrorInfo(rule=str(err.rule), message=err.message),
            counters=model.counters(),
            events=[],
            earliest_deadline_ms=model.earliest_deadline(),
        )
        return refused, None
    events = step.events
    if offset:
        events = [e.model_copy(update={"event_id": e.event_id + offset}) for e in events]
    out = StepOutcome.model_construct(
        result=step.result,
        error=None,
        counters=model.counters(),
        events=events,
        earliest_deadline_ms=model.earliest_deadline(),
    )
    return out, step.labels


def follow_modes(model: Model) -> dict[str, tuple[RuleId, str]]:
    """The model's follow modes: condition -> (rule, switch attribute)."""
    modes: dict[str, tuple[RuleId, str]] = getattr(model, "FOLLOW", {})
    return modes


def same_outcome(a: StepOutcome, b: StepOutcome) -> bool:
    """Is ``a`` exactly ``b`` (the error compared by rule only)?"""
    if (a.error is None) != (b.error is None):
        return False
    if a.error is not None and b.error is not None and a.error.rule != b.error.rule:
        return False
    return (
        a.result == b.result
        and a.events == b.events
        and a.counters == b.counters
        and a.earliest_deadline_ms == b.earliest_deadline_ms
    )


def _with(model: Model, switches: set[str], on: bool) -> None:
    for s in switches:
        setattr(model, s, on)


def replay(
    initial: Model, past: Sequence[Past], switches: set[str], now: Past, actual: StepOutcome, run: Run
) -> tuple[Model, StepOutcome, StepLabels | None] | None:
    """The run again from ``initial`` with ``switches`` on: None unless every
    earlier step gives the outcome accepted for it and step ``now`` gives
    ``actual``; else the model after it, its outcome and labels."""
    m = copy.deepcopy(initial)
    _with(m, switches, True)
    try:
        for p in past:
            if p.refused:
                continue
            out, _ = run(m, p.op, p.prefer, p.offset)
            if not same_outcome(out, p.expected):
                return None
        out, labels = run(m, now.op, now.prefer, now.offset)
    finally:
        _with(m, switches, False)
    return (m, out, labels) if same_outcome(out, actual) else None


def candidates(
    before: Model,
    now: Past,
    actual: StepOutcome,
    run: Run,
    *,
    initial: Model | None = None,
    past: Sequence[Past] = (),
    followed: Collection[str] = (),
) -> Iterator[BlockFollowed]:
    """The ways to run step ``now`` (``now.expected``: the model's own
    outcome of it) that give ``actual`` exactly, from ``before`` (the model's
    copy before it) or, for a follow mode, from ``initial`` through ``past``
    with the switches ``followed`` so far on too (see the module doc)."""
    op, expected = now.op, now.expected
    if (
        expected.error is None
        and actual.error is not None
        and not actual.events
        and actual.counters == before.counters()
        and actual.earliest_deadline_ms == before.earliest_deadline()
    ):
        yield BlockFollowed(copy.deepcopy(before), actual, None, op_rule(op), None)
    for condition, (rule, switch) in follow_modes(before).items():
        alt = copy.deepcopy(before)
        setattr(alt, switch, True)
        try:
            out, labels = run(alt, op, now.prefer, now.offset)
        finally:
            setattr(alt, switch, False)
        if same_outcome(out, actual):
            yield BlockFollowed(alt, out, labels, rule, condition, switch)
            continue
        if initial is None:
            continue
        again = replay(initial, past, {*followed, switch}, now, actual, run)
        if again is not None:
            yield BlockFollowed(again[0], again[1], again[2], rule, condition, switch)


def nearest(before: Model, now: Past, actual: StepOutcome, run: Run) -> BlockFollowed | None:
    """A follow mode whose run of step ``now`` alone accepts or refuses as
    the implementation did, where no mode gives its outcome exactly: the
    departure explains that much, and the rest of the step is judged
    against the mode's outcome (so that a bug beside a declared departure
    is named by its own rule)."""
    if (now.expected.error is None) == (actual.error is None):
        return None
    for condition, (rule, switch) in follow_modes(before).items():
        alt = copy.deepcopy(before)
        setattr(alt, switch, True)
        try:
            out, labels = run(alt, now.op, now.prefer, now.offset)
        finally:
            setattr(alt, switch, False)
        if (out.error is None) == (actual.error is None):
            return BlockFollowed(alt, out, labels, rule, condition, switch)
    return None


__all__ = [
    "BlockFollowed",
    "Past",
    "Run",
    "candidates",
    "follow_modes",
    "model_run",
    "nearest",
    "replay",
    "same_outcome",
]
