"""Run a golden scenario against an implementation, step by step.

The first step whose outcome differs from the scenario's expectation raises a
``ConformanceFailure`` naming the rule, the step, the operations so far and
the first divergence. A step expected to be rejected must come back as a
typed error with that rule id, publish nothing and leave the counters as
they were.

The reference model runs the same steps beside the implementation: its
labels of each step (``reference.labels``) name the rule a difference
breaks. It follows the implementation's victims where the policy allows a
choice, as in the lockstep.

A declared deviation is contained here as in the lockstep (``follow``;
spec/SPEC.md, "Declared deviations are followed"): at the step where a
covered departure is observed, the model takes the implementation's
outcome and state, and every later step is checked against the followed
model's whole outcome (result, events, counters, deadline), no longer
against the file, whose expectations describe the spec's run. A bug after
the departure is still caught, named by its own rule. A covered difference
the model cannot follow while the implementation's state differs raises
``DeviationNotFollowed``; one of the stream only (the same state) is
raised as an ordinary failure, which the plugin reports as the expected
deviation of the whole golden.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from kvspec.conformance.block.diff import (
    Divergence,
    counters_divergence,
    deadline_divergence,
    event_divergence,
    op_rule,
    result_divergence,
)
from kvspec.conformance.block.follow import BlockFollowed, Past, candidates, model_run, nearest
from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.run.deviation_scope import site_of
from kvspec.conformance.verdicts.failures import ConformanceFailure, DeviationNotFollowed
from kvspec.reference import Model, make_model
from kvspec.reference.labels import StepLabels
from kvspec.spec.deviations import Deviation, Site, covering
from kvspec.spec.display import format_ops
from kvspec.spec.rules import RuleId
from kvspec.spec.scenario import Expect, Scenario
from kvspec.spec.wire import Counters, Operation, OpResult, StepOutcome


def check_step(
    scenario: Scenario, index: int, outcome: StepOutcome, before: Counters | None, labels: StepLabels | None = None
) -> Divergence | None:
    """The first difference of step ``index`` from the scenario's expectation
    (``labels``: the model's labels of the step)."""
    step = scenario.steps[index]
    return check_expect(step.expect, step.op, outcome, before, labels)


def check_expect(
    exp: Expect, op: Operation, outcome: StepOutcome, before: Counters | None, labels: StepLabels | None = None
) -> Divergence | None:
    """The first difference of ``op``'s ``outcome`` from ``exp``."""
    if exp.error is not None:
        if outcome.error is None:
            return Divergence(exp.error, "the operation must be rejected", f"error {exp.error}", outcome.result)
        if outcome.error.rule != exp.error:
            return Divergence(exp.error, "rejected under the wrong rule", exp.error, outcome.error.rule)
        if outcome.events:
            return Divergence(
                exp.error, "a rejected operation published events", [], [e.brief() for e in outcome.events]
            )
        if before is not None:
            d = counters_divergence(before, outcome.counters)
            if d is not None:
                return Divergence(exp.error, "a rejected operation changed the counters", d.expected, d.actual)
        return None
    if outcome.error is not None:
        return Divergence(
            op_rule(op),
            "the operation was rejected",
            "a result",
            f"error [{outcome.error.rule}] {outcome.error.message}",
        )
    assert outcome.result is not None
    # an explicit "result": null is checked (an operation that returns nothing,
    # e.g. a Tick under tick_result = "none"); a missing one is not
    has_result = "result" in exp.model_fields_set
    if has_result or exp.status is not None:
        want = OpResult(
            value=exp.result if has_result else outcome.result.value,
            status=exp.status if exp.status is not None else outcome.result.status,
        )
        d = result_divergence(want, outcome.result, op, labels)
        if d is not None:
            return d
    if exp.events is not None:
        d = event_divergence(exp.events, outcome.events, labels)
        if d is not None:
            return d
    if exp.counters is not None:
        d = counters_divergence(exp.counters, outcome.counters, labels)
        if d is not None:
            return d
    # as for the result, an explicit null is checked (nothing pending), a missing one is not
    if "earliest_deadline_ms" in exp.model_fields_set and outcome.earliest_deadline_ms != exp.earliest_deadline_ms:
        return deadline_divergence(exp.earliest_deadline_ms, outcome.earliest_deadline_ms, labels)
    return None


def expect_of(outcome: StepOutcome) -> Expect:
    """The whole of ``outcome`` as a golden's expectation: what a step after a
    followed departure is checked against (the followed model's outcome,
    not the file's, which describes the spec's run)."""
    if outcome.error is not None:
        return Expect(error=RuleId(outcome.error.rule))
    assert outcome.result is not None
    return Expect(
        result=outcome.result.value,
        status=outcome.result.status,
        events=list(outcome.events),
        counters=outcome.counters.model_dump(),
        earliest_deadline_ms=outcome.earliest_deadline_ms,
    )


class _Golden:
    """One golden's run: the model beside the implementation, and what
    following a declared departure needs (``follow``)."""

    def __init__(
        self,
        scenario: Scenario,
        scenario_id: str | None,
        deviations: Sequence[Deviation],
        on_deviation: Callable[[int, Site], None] | None,
    ) -> None:
        self.scenario = scenario
        self.scenario_id = scenario_id
        self.deviations = list(deviations)
        self.on_deviation = on_deviation
        self.model: Model = make_model(scenario.config)
        self.initial = copy.deepcopy(self.model)
        self.past: list[Past] = []
        self.switches: set[str] = set()
        #: steps at which the model took the implementation's outcome: (step, condition)
        self.followed: list[tuple[int, str | None]] = []

    def site(self, rule: RuleId, op: Operation, conditions: set[str] | None = None) -> Site:
        conditions = conditions or set()
        return site_of(rule, config=self.scenario.config, op=op, scenario=self.scenario_id, conditions=conditions)

    def follow(self, saved: Model, now: Past, actual: StepOutcome) -> BlockFollowed | None:
        """A way of running step ``now`` a declared deviation covers that gives
        the implementation's outcome (``follow.candidates``), or that accepts
        or refuses as it did (``follow.nearest``; the rest of the step is then
        judged against it); None: nothing declared follows it."""
        found = candidates(saved, now, actual, model_run, initial=self.initial, past=self.past, followed=self.switches)
        for alt in found:
            i = covering(self.deviations, self.site(alt.rule, now.op, _conds(alt.condition)))
            if i is not None:
                return self._take(alt, i, now)
        near = nearest(saved, now, actual, model_run)
        if near is not None:
            i = covering(self.deviations, self.site(near.rule, now.op, _conds(near.condition)))
            if i is not None:
                return self._take(near, i, now)
        return None

    def _take(self, alt: BlockFollowed, i: int, now: Past) -> BlockFollowed:
        step = len(self.past)
        self.followed.append((step, alt.condition))
        now.refused = alt.condition is None
        if alt.switch is not None:
            self.switches.add(alt.switch)
        self.model = alt.model
        if self.on_deviation is not None:
            self.on_deviation(i, self.site(alt.rule, now.op, _conds(alt.condition)))
        return alt


def run_scenario(
    scenario: Scenario,
    impl: Implementation,
    *,
    deviations: Sequence[Deviation] = (),
    on_deviation: Callable[[int, Site], None] | None = None,
    scenario_id: str | None = None,
) -> list[StepOutcome]:
    """Run every step; raise ConformanceFailure at the first divergence.

    ``deviations`` (the manifest's): at a step that differs, a way of running
    it that a declared deviation covers and that gives the implementation's
    outcome (``follow``) resynchronises the model (``on_deviation`` is told);
    every later step is then checked against the followed model's whole
    outcome instead of the file's expectation, which describes the spec's
    run, so that a bug after the departure is still caught. A difference
    nothing declared follows raises as before: its site carries the follow
    mode (``follow``) that reproduces the implementation's run up to there,
    if one does, so that an undeclared departure's report names the
    condition to declare (``scenario_id``: the golden's id for the site,
    ``FOLDER/NAME``)."""
    run = _Golden(scenario, scenario_id, deviations, on_deviation)
    outcomes: list[StepOutcome] = []
    before: Counters | None = None
    for i, step in enumerate(scenario.steps):
        outcome = impl.step(step.op)
        saved = copy.deepcopy(run.model)
        prefer = _removed_device(outcome)
        own, labels = model_run(run.model, step.op, prefer)
        exp = expect_of(own) if run.followed else step.expect
        d = check_expect(exp, step.op, outcome, before, labels)
        now = Past(step.op, prefer, 0, own)
        if d is not None and run.deviations:
            alt = run.follow(saved, now, outcome)
            if alt is not None:
                d = check_expect(expect_of(alt.outcome), step.op, outcome, before, alt.labels)
                if d is not None:
                    raise _failure(scenario, i, d, run, run.site(d.rule, step.op), "")
        if d is not None:
            rule, conditions, note = d.rule, set[str](), ""
            for alt in candidates(saved, now, outcome, model_run, initial=run.initial, past=run.past):
                if alt.condition is not None:
                    rule, conditions = alt.rule, {alt.condition}
                    note = f"\nthe implementation's run so far is the model's under condition {alt.condition}"
                    break
            site = run.site(rule, step.op, conditions)
            if covering(run.deviations, site) is not None and _state_differs(own, outcome):
                note += (
                    "\na declared deviation covers this step, but the implementation's state after it differs from "
                    "the model's and no follow mode of the model reproduces its outcome: the rest of the golden "
                    "cannot be checked against it (spec/ADAPTERS.md, 'Declared deviations')"
                )
                failure = _failure(scenario, i, d, run, site, note)
                raise DeviationNotFollowed(failure.rule, failure.report, site=site)
            raise _failure(scenario, i, d, run, site, note)
        now.expected = outcome
        run.past.append(now)
        outcomes.append(outcome)
        before = outcome.counters
    return outcomes


def _failure(scenario: Scenario, i: int, d: Divergence, run: _Golden, site: Site, note: str) -> ConformanceFailure:
    step = scenario.steps[i]
    ops = [s.op for s in scenario.steps[: i + 1]]
    if run.followed:
        k, cond = run.followed[0]
        note += (
            f"\nfollowed a declared departure at step {k} ({cond or 'a refusal taken back'}): the expectation of "
            "every later step is the followed model's outcome, not the file's"
        )
    return ConformanceFailure(
        site.rule,
        f"scenario {scenario.name!r} diverged at step {i}"
        + (f" ({step.note})" if step.note else "")
        + f"\n{format_ops(ops)}\nfirst divergence: {d.describe()}{note}",
        site=site,
    )


def _state_differs(expected: StepOutcome, actual: StepOutcome) -> bool:
    """A refusal on one side only, or different counters or deadline."""
    return (
        (expected.error is None) != (actual.error is None)
        or expected.counters != actual.counters
        or expected.earliest_deadline_ms != actual.earliest_deadline_ms
    )


def _conds(condition: str | None) -> set[str]:
    return set() if condition is None else {condition}


def _removed_device(outcome: StepOutcome) -> set[int]:
    return {h for e in outcome.events if e.kind == "removed" and e.storage_tier == "device" for h in e.hashes()}
