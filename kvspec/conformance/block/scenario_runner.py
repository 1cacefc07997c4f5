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
"""

from __future__ import annotations

import copy

from kvspec.conformance.block.diff import Divergence, counters_divergence, event_divergence, op_rule, result_divergence
from kvspec.conformance.block.follow import Past, candidates, model_run
from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.run.deviation_scope import site_of
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference import Model, make_model
from kvspec.reference.labels import StepLabels
from kvspec.spec.display import format_ops
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.rules import RuleId
from kvspec.spec.scenario import Scenario
from kvspec.spec.wire import Counters, Operation, OpResult, StepOutcome


def model_labels(model: Model, op: Operation, outcome: StepOutcome) -> StepLabels | None:
    """The model's labels of ``op`` (None when it rejects it)."""
    removed = {h for e in outcome.events if e.kind == "removed" and e.storage_tier == "device" for h in e.hashes()}
    try:
        return model.apply(op, prefer=removed).labels
    except InvalidOperation:
        return None


def check_step(
    scenario: Scenario, index: int, outcome: StepOutcome, before: Counters | None, labels: StepLabels | None = None
) -> Divergence | None:
    """The first difference of step ``index`` from the scenario's expectation
    (``labels``: the model's labels of the step)."""
    step = scenario.steps[index]
    exp = step.expect
    op = step.op
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
        return Divergence(
            RuleId.TIME_MONOTONIC, "earliest pending deadline", exp.earliest_deadline_ms, outcome.earliest_deadline_ms
        )
    return None


def run_scenario(scenario: Scenario, impl: Implementation) -> list[StepOutcome]:
    """Run every step; raise ConformanceFailure at the first divergence.
    Its site carries the follow mode (``follow``) that reproduces the
    implementation's run up to there, if one does, so that a declared
    departure's golden is matched by the condition that declares it."""
    outcomes: list[StepOutcome] = []
    before: Counters | None = None
    model = make_model(scenario.config)
    initial = copy.deepcopy(model)
    past: list[Past] = []
    for i, step in enumerate(scenario.steps):
        outcome = impl.step(step.op)
        saved = copy.deepcopy(model)
        prefer = _removed_device(outcome)
        d = check_step(scenario, i, outcome, before, model_labels(model, step.op, outcome))
        if d is not None:
            ops = [s.op for s in scenario.steps[: i + 1]]
            rule, conditions, note = d.rule, set[str](), ""
            own, _ = model_run(copy.deepcopy(saved), step.op, prefer)
            now = Past(step.op, prefer, 0, own)
            for alt in candidates(saved, now, outcome, model_run, initial=initial, past=past):
                if alt.condition is not None:
                    rule, conditions = alt.rule, {alt.condition}
                    note = f"\nthe implementation's run so far is the model's under condition {alt.condition}"
                    break
            raise ConformanceFailure(
                rule,
                f"scenario {scenario.name!r} diverged at step {i}"
                + (f" ({step.note})" if step.note else "")
                + f"\n{format_ops(ops)}\nfirst divergence: {d.describe()}{note}",
                site=site_of(rule, config=scenario.config, op=step.op, conditions=conditions),
            )
        past.append(Past(step.op, prefer, 0, outcome))
        outcomes.append(outcome)
        before = outcome.counters
    return outcomes


def _removed_device(outcome: StepOutcome) -> set[int]:
    return {h for e in outcome.events if e.kind == "removed" and e.storage_tier == "device" for h in e.hashes()}
