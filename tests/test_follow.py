"""A declared deviation is contained to its cause: the lockstep resynchronises
the model to the implementation (``conformance/block/follow.py``), so that
one root cause needs one declaration, every rule is checked afterwards, and
a bug outside the declared cause is still caught.

The ports are ``adapters/declared``: the reference with one state-changing
departure each (a legacy Use the spec refuses and Dynamo mocker 1.0.2
accepts; an offload job larger than G2's room that fails whole and keeps
its source slots quarantined)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import Phase, settings

import kvspec.conformance as conformance_pkg
from kvspec.adapters.declared.adapter import DeclaredImplementation, declared_model
from kvspec.conformance.block.lockstep import Lockstep
from kvspec.conformance.block.machine import MachineSetup, machine_class, run_machine
from kvspec.conformance.block.scenario_runner import run_scenario
from kvspec.conformance.run.manifest import load_impl
from kvspec.conformance.run.settings import effort
from kvspec.conformance.verdicts.failures import ConformanceFailure, DeviationNotFollowed
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.deviations import Deviation, Scope, Site
from kvspec.spec.rules import RuleId
from kvspec.spec.scenario import all_scenarios
from kvspec.spec.wire import Deref, FullBlock, Operation, Plh, StepOutcome, Tick, Use

LEGACY = ManagerConfig(profile="legacy", capacity=4, eviction="lru")
ON_USE = Deviation(rule=RuleId.USE_VALIDATE, reason="1.0.2 validation", scope=Scope(operations=["use"]))
FAILS_WHOLE = Deviation(
    rule=RuleId.QUARANTINE_RELEASE, reason="older executor", scope=Scope(conditions=["offload_job_fails_whole"])
)


def use(*seqs: int, extra_local: bool = False) -> Use:
    plhs, prev = [], None
    for i, s in enumerate(seqs):
        plhs.append(Plh(hash=s, parent=prev, position=i))
        prev = s
    local = [s * 10 for s in seqs] + ([seqs[-1] * 10] if extra_local else [])
    return Use(blocks=[FullBlock(full=s) for s in seqs], local_hashes=local, plhs=plhs)


def deref(*seqs: int) -> Deref:
    return Deref(blocks=[FullBlock(full=s) for s in seqs])


def run(
    variant: str,
    config: ManagerConfig,
    ops: Sequence[Operation],
    deviations: Sequence[Deviation],
    bug: str | None = None,
) -> tuple[Lockstep, list[Site]]:
    seen: list[Site] = []
    impl = DeclaredImplementation(declared_model(variant, config, bug=bug))
    ls = Lockstep(impl, config, adapter="declared", deviations=deviations, on_deviation=lambda i, s: seen.append(s))
    for op in ops:
        ls.step(op)
    return ls, seen


# ------------------------------------------------------------ legacy Use

#: the issue's case: a Use the port accepts and the model refuses, then a
#: Deref that only agrees if the model took the port's owner counts
LEGACY_OPS: list[Operation] = [use(1, 2), use(1, 2, extra_local=True), deref(1, 2), deref(1, 2), use(3, 4, 5)]


def test_a_legacy_use_the_spec_refuses_is_followed_and_the_owner_counts_agree() -> None:
    ls, seen = run("legacy_source_strict_traffic", LEGACY, LEGACY_OPS, [ON_USE])
    assert ls.followed == [(1, "legacy_source_validation")]
    assert [(s.rule, s.operation) for s in seen] == [(RuleId.USE_VALIDATE, "use")]  # one cause, one observation
    # the model took the port's second owner of 1 and 2: the first Deref leaves them active
    assert [ls.expected[k].counters.inactive_blocks for k in (2, 3)] == [0, 2]


def test_the_same_port_undeclared_fails_with_the_condition_to_declare() -> None:
    with pytest.raises(ConformanceFailure) as ei:
        run("legacy_source_strict_traffic", LEGACY, LEGACY_OPS, [])
    assert ei.value.rule == RuleId.USE_VALIDATE
    with pytest.raises(ConformanceFailure) as ei2:
        run("legacy_source_strict_traffic", LEGACY, LEGACY_OPS, [_elsewhere()])
    assert 'scope = { conditions = ["legacy_source_validation"] }' in ei2.value.report


def _elsewhere() -> Deviation:
    return Deviation(rule=RuleId.EVENT_ID, reason="r", scope=Scope(operations=["tick"]))


def test_a_bug_in_the_followed_step_is_not_hidden_by_the_declaration() -> None:
    """The port accepts the Use and also drops the Stored's parent (mutant
    legacy_parent_always_none): no follow mode gives that outcome, so the
    declaration does not cover it."""
    ops = [use(1, 2), use(1, 2, 3, extra_local=True)]
    with pytest.raises(ConformanceFailure) as ei:
        run("legacy_source_strict_traffic", LEGACY, ops, [ON_USE], bug="parent_always_none")
    assert ei.value.rule == RuleId.PARENT_ANCHOR  # judged against the departure's own run: named by the bug's rule
    assert "followed after declared deviations: step 1 USE-VALIDATE" in ei.value.report


class KvbmAcceptsExtraLocalHash(DeclaredImplementation):
    """A kvbm port that accepts a Use with one local hash too many (it drops
    the extra one): the kvbm model has no follow mode for that."""

    def step(self, op: Operation) -> StepOutcome:
        if isinstance(op, Use) and len(op.local_hashes) > len(op.plhs):
            op = op.model_copy(update={"local_hashes": op.local_hashes[: len(op.plhs)]})
        return super().step(op)


def test_a_covered_difference_nothing_follows_fails_the_run() -> None:
    """The declaration covers the step, but the port's state differs from
    the model's and no follow mode reproduces it: the run fails
    (DeviationNotFollowed) instead of checking on from a wrong model."""
    cfg = ManagerConfig(profile="kvbm", capacity=4, eviction="lru")
    impl = KvbmAcceptsExtraLocalHash(declared_model(None, cfg))
    ls = Lockstep(impl, cfg, adapter="declared", deviations=[ON_USE])
    ls.step(use(1, 2))
    with pytest.raises(DeviationNotFollowed) as ei:
        ls.step(use(1, 2, extra_local=True))
    assert ei.value.rule == RuleId.USE_VALIDATE
    assert "no follow mode of the model reproduces its outcome" in ei.value.report


# ----------------------------------------------------------- offload tier


def offload_cfg() -> ManagerConfig:
    off = OffloadConfig(num_g2_blocks=3)  # Dynamo's defaults: shared link, at_start, instant transfers
    return ManagerConfig(profile="kvbm", capacity=4, eviction="lru", offload=off)


#: a job of one eviction (4) that fits, then a job of three (3, 2, 1) while
#: G2 has room for one more: the spec admits 3 and drops 2 and 1, the port
#: fails the job whole. Nothing shows at once (the same events, counters and
#: earliest deadline), then at the tick the port stores only 4 and keeps the
#: second job's three slots quarantined for good.
OFFLOAD_OPS: list[Operation] = [
    use(1, 2, 3, 4),
    deref(4, 3, 2, 1),
    use(5),
    use(6, 7, 8),
    Tick(now_ms=0.0),
    use(5),
    Tick(now_ms=1.0),
    use(9),
]


def test_an_offload_job_that_fails_whole_is_followed_from_the_start_of_the_run() -> None:
    ls, seen = run("offload_job_fails_whole", offload_cfg(), OFFLOAD_OPS, [FAILS_WHOLE])
    assert ls.followed == [(4, "offload_job_fails_whole")]  # seen at the tick, caused at step 3
    assert {(s.rule, s.operation) for s in seen} == {(RuleId.QUARANTINE_RELEASE, "tick")}
    assert ls.expected[4].events[0].hashes() == [4] and len(ls.expected[4].events) == 1  # the port's outcome
    assert ls.model.counters().quarantined_blocks == 3  # the model holds the port's leaked slots


def test_the_offload_port_undeclared_fails_and_names_the_condition() -> None:
    with pytest.raises(ConformanceFailure) as ei:
        run("offload_job_fails_whole", offload_cfg(), OFFLOAD_OPS, [_elsewhere()])
    assert ei.value.site.operation == "tick"
    assert ei.value.rule != RuleId.QUARANTINE_RELEASE  # the first difference, named by its own rule
    assert 'scope = { conditions = ["offload_job_fails_whole"] }' in ei.value.report


def test_the_spec_port_is_not_taken_for_the_departure() -> None:
    """The reference itself under the declaration: nothing differs, nothing
    is followed (a declared deviation never observed)."""
    ls, seen = run("legacy_source", offload_cfg(), OFFLOAD_OPS, [FAILS_WHOLE])  # legacy_source: no kvbm switch
    assert not ls.followed and not seen


# ------------------------------------------------- the lockstep machine


def _machine_run(impl: str, profile: str, examples: int = 30) -> list[Site]:
    adapter_dir, manifest = load_impl(impl)
    seen: list[Site] = []
    setup = MachineSetup(manifest, adapter_dir, profile, record_deviation=lambda i, s: seen.append(s))
    run_machine(
        machine_class(setup),
        settings=settings(effort("ci"), max_examples=examples, phases=[Phase.generate, Phase.shrink]),
    )
    return seen


@pytest.mark.parametrize(
    ("variant", "profile", "rule"),
    [
        ("legacy_source_strict_traffic", "legacy", RuleId.USE_VALIDATE),
        ("offload_job_fails_whole", "kvbm", RuleId.QUARANTINE_RELEASE),
    ],
)
def test_each_declared_variant_passes_the_ci_lockstep_with_its_one_declaration(
    variant: str, profile: str, rule: RuleId
) -> None:
    seen = _machine_run(f"adapters/declared/{variant}", profile, examples=60)
    assert seen, "the departure was never observed: the test shows nothing"
    assert {s.rule for s in seen} == {rule}


def test_a_mutant_on_top_of_a_declared_variant_is_still_caught() -> None:
    """capacity_one_early (a Use that runs out of slots one block early) on
    top of the offload departure, with its declaration: still caught, under
    a rule of its own, not excused by the declaration."""
    adapter_dir, manifest = load_impl("adapters/declared/offload_job_fails_whole")
    start = manifest.start.model_copy(update={"python": "kvspec.adapters.declared.adapter:open_with_bug"})
    buggy = manifest.model_copy(
        update={"start": start, "description": "offload_job_fails_whole", "variant": "capacity_one_early"}
    )
    cls = machine_class(MachineSetup(buggy, adapter_dir, "kvbm"))
    with pytest.raises(ConformanceFailure) as ei:
        run_machine(cls, settings=settings(effort("ci"), max_examples=60, phases=[Phase.generate]))
    assert not isinstance(ei.value, DeviationNotFollowed)
    assert ei.value.rule != RuleId.QUARANTINE_RELEASE


# ----------------------------------------------------------------- goldens


def test_a_golden_the_departure_fails_carries_its_condition() -> None:
    """offload/at_start_admits_what_g2_has_room_for admits part of a job; the
    port fails it whole: the failure is named by the follow mode that
    reproduces the port's run, so the one declaration covers it."""
    scenario = next(s for _, s in all_scenarios() if s.name == "at_start_admits_what_g2_has_room_for")
    impl = DeclaredImplementation(declared_model("offload_job_fails_whole", scenario.config))
    with pytest.raises(ConformanceFailure) as ei:
        run_scenario(scenario, impl)
    assert ei.value.rule == RuleId.QUARANTINE_RELEASE
    assert "offload_job_fails_whole" in ei.value.site.conditions
    assert FAILS_WHOLE.covers(ei.value.site)
    other = next(s for p, s in all_scenarios() if s.name == "g2_lru_and_reoffload_of_a_held_block")
    with pytest.raises(ConformanceFailure) as ei2:
        run_scenario(
            other, DeclaredImplementation(declared_model(None, other.config, bug="quarantine_kept_when_in_g2"))
        )
    assert ei2.value.rule == RuleId.QUARANTINE_RELEASE
    assert not FAILS_WHOLE.covers(ei2.value.site)  # same rule, no condition: a bug, not the departure


AT_START = "offload/at_start_admits_what_g2_has_room_for"


def _golden(scenario_id: str, bug: str | None) -> tuple[list[Site], ConformanceFailure | None]:
    """Run golden ``scenario_id`` against the offload departure (with mutant
    ``bug`` on top) with its one declaration: the sites followed, and the
    failure if it failed."""
    scenario = next(s for p, s in all_scenarios() if f"{p.parent.name}/{p.stem}" == scenario_id)
    impl = DeclaredImplementation(declared_model("offload_job_fails_whole", scenario.config, bug=bug))
    seen: list[Site] = []
    try:
        run_scenario(
            scenario,
            impl,
            deviations=[FAILS_WHOLE],
            on_deviation=lambda i, s: seen.append(s),
            scenario_id=scenario_id,
        )
    except ConformanceFailure as e:
        return seen, e
    return seen, None


def test_a_golden_follows_the_declared_departure_and_checks_the_steps_after_it() -> None:
    seen, failure = _golden(AT_START, None)
    assert failure is None, failure
    assert [(s.rule, "offload_job_fails_whole" in s.conditions) for s in seen] == [(RuleId.QUARANTINE_RELEASE, True)]


def test_a_bug_after_the_departure_in_a_golden_fails_that_golden() -> None:
    """deref_unknown_ignored (a Deref of an unknown block accepted) shows in
    this golden only at step 5, after the departure followed at step 2:
    before the golden followed departures, the whole golden was an expected
    deviation and the bug survived it."""
    seen, failure = _golden(AT_START, "deref_unknown_ignored")
    assert failure is not None, "the bug after the departure was not caught"
    assert not isinstance(failure, DeviationNotFollowed)
    assert failure.rule == RuleId.DEREF_UNKNOWN
    assert "diverged at step 5" in str(failure)
    assert "followed a declared departure at step 2" in str(failure)
    assert len(seen) == 1
    assert not FAILS_WHOLE.covers(replace(failure.site, scenario=AT_START))


def test_a_covered_golden_difference_nothing_follows_fails_the_golden() -> None:
    """capacity_one_early (a Use refused one block early) declared as a
    USE-CAPACITY departure on Uses: no follow mode reproduces it and the
    port's state differs, so the golden fails instead of being an expected
    deviation as a whole."""
    broad = Deviation(rule=RuleId.USE_CAPACITY, reason="too broad", scope=Scope(operations=["use"]))
    scenario = next(s for p, s in all_scenarios() if f"{p.parent.name}/{p.stem}" == AT_START)
    impl = DeclaredImplementation(declared_model(None, scenario.config, bug="capacity_one_early"))
    with pytest.raises(DeviationNotFollowed) as ei:
        run_scenario(scenario, impl, deviations=[broad], scenario_id=AT_START)
    assert ei.value.rule == RuleId.USE_CAPACITY
    with pytest.raises(ConformanceFailure) as undeclared:
        run_scenario(scenario, DeclaredImplementation(declared_model(None, scenario.config, bug="capacity_one_early")))
    assert not isinstance(undeclared.value, DeviationNotFollowed)


@pytest.mark.parametrize(
    ("variant", "declared"),
    [("legacy_source_strict_traffic", "USE-VALIDATE"), ("offload_job_fails_whole", "QUARANTINE-RELEASE")],
)
def test_each_declared_variant_passes_the_whole_suite_at_ci(
    variant: str, declared: str, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    suite = str(Path(conformance_pkg.__file__).parent)
    code, out = child_pytest(
        suite, f"--impl=adapters/declared/{variant}", "--hypothesis-profile=ci", "-q", "-p", "no:xdist"
    )
    assert code == 0, out[-3000:]
    assert " failed" not in out, out[-3000:]
    assert re.search(rf"{declared}\s+observed \d+x", out), out[-3000:]
