"""Scoped deviations: the manifest refuses an unscoped one (saying how to scope
it), a scope covers exactly the failures it names, and the lockstep records a
declared deviation, adopts the implementation's outcome and keeps checking
every rule, so that a second, undeclared bug of the same run still fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.conformance.block.lockstep import Lockstep
from kvspec.conformance.run.deviation_scope import step_conditions
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.spec.config import ManagerConfig
from kvspec.spec.deviations import CONDITIONS, Deviation, Scope, Site
from kvspec.spec.errors import ConfigError
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Deref, FullBlock, Operation, Plh, StepOutcome, Use

ADAPTERS = Path(__file__).resolve().parent.parent / "adapters"
MANIFEST = load_manifest(resolve_adapter_dir("adapters/reference"))


# ------------------------------------------------------------------ format


def test_an_unscoped_deviation_is_refused_with_how_to_scope_it() -> None:
    with pytest.raises(ValidationError) as ei:
        Deviation.model_validate({"rule": "EVENT-ID", "reason": "ids from 1"})
    text = str(ei.value)
    assert "deviation EVENT-ID has no scope" in text
    assert "event_ids_from_1" in text  # the conditions that can scope this rule are listed
    assert 'scope = "all"' in text


def test_the_loader_names_the_file_and_the_problem(tmp_path: Path) -> None:
    (tmp_path / "manifest.toml").write_text(
        'name = "x"\nkind = "python"\nprofile = "kvbm"\n[[deviations]]\nrule = "REMOVE-EXACT"\nreason = "r"\n'
    )
    with pytest.raises(ConfigError, match=r"manifest.toml: invalid manifest:[\s\S]*REMOVE-EXACT has no scope"):
        load_manifest(tmp_path)


def test_scope_all_is_accepted_only_with_a_reason() -> None:
    d = Deviation.model_validate({"rule": "EVENT-ID", "reason": "numbering is rule-wide", "scope": "all"})
    assert d.covers(Site(RuleId.EVENT_ID)) and not d.covers(Site(RuleId.REMOVE_EXACT))
    with pytest.raises(ValidationError):
        Deviation.model_validate({"rule": "EVENT-ID", "reason": "", "scope": "all"})


@pytest.mark.parametrize(
    ("scope", "message"),
    [
        ({}, "empty scope"),
        ({"conditions": ["no_such_condition"]}, "unknown condition no_such_condition"),
        ({"conditions": ["copy_store_unannounced"]}, "cannot scope EVENT-ID"),
        ({"operations": ["fly"]}, "operations"),
    ],
)
def test_bad_scopes_are_refused(scope: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Deviation.model_validate({"rule": "EVENT-ID", "reason": "r", "scope": scope})


def test_a_scope_covers_only_what_it_names() -> None:
    d = Deviation(
        rule=RuleId.REMOVE_EXACT,
        reason="r",
        scope=Scope(scenarios=["kvbm/a"], operations=["use"], conditions=["host_tier"]),
    )
    inside = Site(RuleId.REMOVE_EXACT, scenario="kvbm/a", operation="use", conditions=frozenset({"host_tier"}))
    assert d.covers(inside)
    for outside in (
        Site(RuleId.REMOVE_EXACT, scenario="kvbm/b", operation="use", conditions=frozenset({"host_tier"})),
        Site(RuleId.REMOVE_EXACT, scenario="kvbm/a", operation="deref", conditions=frozenset({"host_tier"})),
        Site(RuleId.REMOVE_EXACT, scenario="kvbm/a", operation="use"),
        Site(RuleId.REMOVE_EXACT, operation="use", conditions=frozenset({"host_tier"})),  # not from a golden
        Site(RuleId.EVENT_ID, scenario="kvbm/a", operation="use", conditions=frozenset({"host_tier"})),
    ):
        assert not d.covers(outside), outside


def test_every_bundled_manifest_scopes_its_deviations() -> None:
    """No manifest in adapters/ declares a rule-wide deviation (issue 17):
    neither an adapter nor any of its variants (a backend variant declares
    its own deviations, which replace the adapter's)."""
    checked = 0
    for path in sorted(ADAPTERS.glob("*/manifest.toml")):
        m = load_manifest(path.parent)
        for name in [None, *(v.name for v in m.variants)]:
            selected = m.with_variant(name)
            for d in selected.deviations:
                where = f"{path}" + (f" variant {name}" if name else "")
                assert isinstance(d.scope, Scope), f"{where}: {d.rule} is rule-wide"
                checked += 1
    assert checked > 10, "the bundled manifests declare scoped deviations: the walk must have found them"


def test_every_condition_is_documented() -> None:
    for c in CONDITIONS.values():
        assert len(c.doc) > 40, c.name


def test_event_ids_from_1_is_established_from_the_events() -> None:
    ref = ReferenceImplementation(cfg(), MANIFEST)
    out = ref.step(use(1, 2))
    shifted = [e.model_copy(update={"event_id": e.event_id + 1}) for e in out.events]
    assert "event_ids_from_1" in step_conditions(RuleId.EVENT_ID, out.events, shifted, first_events=True)
    assert "event_ids_from_1" not in step_conditions(RuleId.EVENT_ID, out.events, shifted, first_events=False)
    twice = [e.model_copy(update={"event_id": e.event_id + 2}) for e in out.events]
    assert "event_ids_from_1" not in step_conditions(RuleId.EVENT_ID, out.events, twice, first_events=True)


# ---------------------------------------------------------------- lockstep


def use(*seqs: int, parent: int | None = None) -> Use:
    plhs, prev = [], parent
    for i, s in enumerate(seqs):
        plhs.append(Plh(hash=s, parent=prev, position=i))
        prev = s
    return Use(
        blocks=[FullBlock(full=s) for s in seqs],
        local_hashes=[s * 10 for s in seqs],
        plhs=plhs,
        parent=FullBlock(full=parent) if parent is not None else None,
    )


def deref(*seqs: int) -> Deref:
    return Deref(blocks=[FullBlock(full=s) for s in seqs])


def cfg() -> ManagerConfig:
    return ManagerConfig(profile="kvbm", capacity=4, eviction="lru")


class FromOne(ReferenceImplementation):
    """Numbers its events from 1; optionally drops every Removed from step ``drop_at`` on."""

    def __init__(self, config: ManagerConfig, drop_at: int | None = None) -> None:
        super().__init__(config, MANIFEST)
        self.drop_at = drop_at
        self.n = 0

    def step(self, op: Any) -> StepOutcome:
        out = super().step(op)
        events = [e.model_copy(update={"event_id": e.event_id + 1}) for e in out.events]
        if self.drop_at is not None and self.n >= self.drop_at:
            events = [e for e in events if e.kind != "removed"]
        self.n += 1
        return out.model_copy(update={"events": events})


TRAFFIC: list[Operation] = [use(1, 2, 3), use(1, 2, 4), deref(3, 2, 1), use(5), deref(5), use(6, 7), deref(6, 7)]
FROM_1 = Deviation(rule=RuleId.EVENT_ID, reason="from 1", scope=Scope(conditions=["event_ids_from_1"]))


def run(impl: Any, deviations: list[Deviation], seen: list[tuple[int, Site]] | None = None) -> Lockstep:
    ls = Lockstep(
        impl,
        cfg(),
        adapter="probe",
        deviations=deviations,
        on_deviation=(lambda i, s: seen.append((i, s))) if seen is not None else None,
    )
    for op in TRAFFIC:
        ls.step(op)
    return ls


def test_undeclared_the_first_event_id_fails() -> None:
    with pytest.raises(ConformanceFailure) as ei:
        run(FromOne(cfg()), [])
    assert ei.value.rule == RuleId.EVENT_ID


def test_a_declared_deviation_is_recorded_adopted_and_the_run_goes_on() -> None:
    seen: list[tuple[int, Site]] = []
    ls = run(FromOne(cfg()), [FROM_1], seen)
    assert len(ls.ops) == len(TRAFFIC)  # not ended by the deviation
    assert seen and all(i == 0 for i, _ in seen)
    assert {s.rule for _, s in seen} == {RuleId.EVENT_ID}
    assert all(step == 0 for step, _, _ in ls.adopted)  # only the first step departs: ids adopted after it
    assert ls.id_offset == 1


def test_after_an_adopted_deviation_a_different_bug_still_fails() -> None:
    with pytest.raises(ConformanceFailure) as ei:
        run(FromOne(cfg(), drop_at=3), [FROM_1])
    f = ei.value
    assert f.rule == RuleId.REMOVE_EXACT
    assert "followed after declared deviations: step 0 EVENT-ID" in f.report
    assert "not a declared deviation: REMOVE-EXACT" in f.report


def test_a_deviation_scoped_elsewhere_does_not_cover_the_failure() -> None:
    elsewhere = Deviation(rule=RuleId.EVENT_ID, reason="r", scope=Scope(operations=["deref"]))
    with pytest.raises(ConformanceFailure) as ei:
        run(FromOne(cfg()), [elsewhere])
    assert ei.value.rule == RuleId.EVENT_ID
    assert ei.value.site.operation == "use"


class DropsRemovedOnUse(ReferenceImplementation):
    """Publishes no Removed for a Use's evictions; ``contiguous``: renumbers
    its events so that the dropped ones leave no gap."""

    def __init__(self, config: ManagerConfig, *, contiguous: bool) -> None:
        super().__init__(config, MANIFEST)
        self.contiguous = contiguous
        self.next_id = 0

    def step(self, op: Any) -> StepOutcome:
        out = super().step(op)
        events = [e for e in out.events if not (isinstance(op, Use) and e.kind == "removed")]
        if self.contiguous:
            events = [e.model_copy(update={"event_id": self.next_id + k}) for k, e in enumerate(events)]
            self.next_id += len(events)
        return out.model_copy(update={"events": events})


ONLY_USE = Deviation(rule=RuleId.REMOVE_EXACT, reason="r", scope=Scope(operations=["use"]))


def test_an_adopted_missing_removed_is_followed_to_the_end() -> None:
    """Declared on Use: each Use that evicts is recorded; the router view
    keeps what the implementation never removed, INV-ROUTER-MATCH and the
    event ids follow that, and the run completes."""
    seen: list[tuple[int, Site]] = []
    ls = run(DropsRemovedOnUse(cfg(), contiguous=True), [ONLY_USE], seen)
    assert len(ls.ops) == len(TRAFFIC)
    steps = sorted({step for step, _, _ in ls.adopted})
    assert steps == [3, 5]  # Use [5] evicts 3, Use [6, 7] evicts 5
    assert {s.rule for _, s in seen} == {RuleId.REMOVE_EXACT}
    assert all(s.operation == "use" for _, s in seen)


def test_a_consequence_outside_the_scope_still_fails() -> None:
    """Dropping the Removed without renumbering leaves a gap in the ids:
    that is EVENT-ID, which the REMOVE-EXACT deviation does not cover."""
    with pytest.raises(ConformanceFailure) as ei:
        run(DropsRemovedOnUse(cfg(), contiguous=False), [ONLY_USE])
    assert ei.value.rule == RuleId.EVENT_ID
    assert "followed after declared deviations: step 3 REMOVE-EXACT" in ei.value.report
