"""The map from each rule of spec/SPEC.md to its place in the model and to
the tests that check it, kept complete; and attribution as a lookup.

Why: a checker names the rule an implementation broke by looking it up in the
model's labels of the step (``reference.labels``). That only works if every
rule is labelled where the model applies it, under the same name the z3
encoding uses for its guard, and if the checkers really use the labels
rather than the shape of the difference. A rule without a place, or without
a test, is a rule nobody can be told they broke.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, get_args

import pytest

from kvspec.conformance.block import diff
from kvspec.conformance.block.diff import counters_divergence, event_divergence, result_divergence
from kvspec.conformance.requests import check as request_check
from kvspec.reference import G1Model, LegacyModel, make_model
from kvspec.reference.labels import StepLabels
from kvspec.reference.lower_tiers import LowerTiers
from kvspec.reference.paged import PagedModel
from kvspec.reference.radix import RadixModel
from kvspec.reference.session import SessionModel
from kvspec.reference.transitions import NoTransition, Transition, TransitionModel
from kvspec.reference.vllm_pool import VllmPoolModel
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.manager_wire import PagedWrite, SessionAdmit
from kvspec.spec.radix_wire import RadixRequest
from kvspec.spec.rules import Concern, RuleId, RuleName, rules_of
from kvspec.spec.scenario import all_scenarios
from kvspec.spec.wire import (
    Counters,
    Deref,
    FullBlock,
    OpResult,
    PartialBlock,
    Plh,
    Promote,
    Tick,
    Use,
    make_removed,
    make_stored,
)

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "kvspec" / "reference"
#: where a rule is checked: the project's tests, the suite's own tests, the
#: golden scenarios, the mutant catalogues (each mutant must be killed under
#: its rule) and the z3 mutants (each must be refuted under its invariant)
TEST_PLACES = [
    *(ROOT / "tests").glob("test_*.py"),
    *(ROOT / "kvspec" / "conformance").glob("test_*.py"),
    *(ROOT / "kvspec" / "spec" / "scenarios").rglob("*.json"),
    ROOT / "kvspec" / "adapters" / "mutants" / "catalogue.py",
    ROOT / "kvspec" / "adapters" / "mutants" / "request_bugs.py",
    REFERENCE / "smt" / "offload" / "mutants.py",
]


def labelled_places() -> dict[str, list[str]]:
    """Rule id -> ``file:line`` of every place in kvspec/reference whose code
    (not a comment or docstring) names it as text."""
    ids = {r.value for r in RuleId}
    places: dict[str, list[str]] = {}
    for path in sorted(REFERENCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in ids:
                places.setdefault(node.value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return places


def test_rule_names_are_the_catalogue() -> None:
    """``RuleName`` (the text labels are written in, checked by mypy) lists
    exactly the rule ids, in the catalogue's order."""
    assert list(get_args(RuleName)) == [r.value for r in RuleId]


def test_every_rule_has_a_labelled_place_in_the_model() -> None:
    places = labelled_places()
    missing = [r.value for r in RuleId if r.value not in places]
    assert not missing, f"rules with no labelled place in kvspec/reference: {missing}"

    # and grep finds it: the line of each place holds the rule id as written
    for rid_, where in places.items():
        path, line = where[0].rsplit(":", 1)
        assert rid_ in (ROOT / path).read_text().splitlines()[int(line) - 1], (rid_, where[0])


def test_every_rule_is_checked_by_a_test() -> None:
    texts = {p: p.read_text() for p in TEST_PLACES}
    unchecked = []
    for r in RuleId:
        pattern = re.compile(rf"{re.escape(r.value)}\b|\b(RuleId|R)\.{r.name}\b")
        if not any(pattern.search(t) for t in texts.values()):
            unchecked.append(r.value)
    assert not unchecked, f"rules no test, scenario or mutant names: {unchecked}"


@pytest.mark.parametrize(
    ("concern", "model"), [(Concern.PAGED, PagedModel), (Concern.SESSION, SessionModel), (Concern.RADIX, RadixModel)]
)
def test_the_tables_of_the_untraced_models_are_their_concerns_rules(
    concern: Concern, model: type[TransitionModel[Any]]
) -> None:
    """The paged, session and radix models do not trace their steps: each is a
    transition table (``reference.transitions``) whose rules are exactly its
    concern's, so every rule of the concern is the rule of some transition and
    no other concern's rule is."""
    assert set(model.rules()) == set(rules_of(concern)), sorted(set(model.rules()) ^ set(rules_of(concern)))


@pytest.mark.parametrize(
    ("model", "op", "first"),
    [
        (SessionModel, SessionAdmit, ("SESSION-LEASE", "SESSION-CANDIDATE", "SESSION-LRU")),
        (PagedModel, PagedWrite, ("PAGED-VALIDATE", "PAGED-COW", "PAGED-NO-REUSE")),
        (RadixModel, RadixRequest, ("RADIX-CAPACITY", "RADIX-MATCH", "RADIX-SPLIT-SILENT", "RADIX-PREFIX-HIT")),
    ],
)
def test_the_transition_tables_name_catalogue_rules_and_their_methods(
    model: type[TransitionModel[Any]], op: type, first: tuple[str, ...]
) -> None:
    """A bundled model written as a transition table names only catalogue rules, every
    guard or effect it names by a string is a method of the model, and an operation's
    rules come in the order its transitions are tried."""
    model.check_table()
    assert set(model.rules()) <= {r.value for r in RuleId}
    assert model.rules_of(op)[: len(first)] == first


def test_a_table_naming_a_missing_method_is_refused() -> None:
    class Typo(SessionModel):
        TRANSITIONS: ClassVar[Sequence[Transition[Any, Any]]] = (
            *SessionModel.TRANSITIONS,
            Transition("SESSION-LRU", SessionAdmit, "own_idel", "resume"),
        )

    with pytest.raises(NoTransition, match="own_idel"):
        Typo.check_table()


def _smt_guard_rules() -> set[RuleId]:
    """The rule ids the z3 encoding names its guards after (``step.rules = {R.X: ...}``)."""
    tree = ast.parse((REFERENCE / "smt" / "offload" / "transitions.py").read_text())
    out: set[RuleId] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Dict)
            and any(isinstance(t, ast.Attribute) and t.attr == "rules" for t in node.targets)
        ):
            for key in node.value.keys:
                assert isinstance(key, ast.Attribute), ast.dump(node)
                out.add(RuleId[key.attr])
    return out


def test_the_z3_guards_and_the_model_use_the_same_names() -> None:
    """Every rule the z3 encoding of the kvbm profile guards a transition
    with is a rule the G1 model labels, in the same file as the behaviour."""
    guards = _smt_guard_rules()
    assert len(guards) >= 15, guards  # the parse found the guards
    places = labelled_places()
    g1 = {r for r, where in places.items() if any(w.startswith("kvspec/reference/g1.py") for w in where)}
    assert {g.value for g in guards} - g1 == set()
    # and the model's tables name each of them (a transition's rule, its events' label, an operation's)
    assert {g.value for g in guards} - G1Model.named_rules() == set()


def test_the_g1_tables_name_catalogue_rules_and_their_methods() -> None:
    """The G1 model is a block model (``reference.transitions.BlockModel``): its tables name only
    catalogue rules and methods it has, and a Use's blocks are tried hit before placement."""
    G1Model.check_tables()
    assert set(G1Model.rules()) <= {r.value for r in RuleId}
    assert G1Model.rules()[:6] == (
        "USE-HIT-INACTIVE",
        "USE-HIT-ACTIVE",
        "USE-NEW",
        "USE-PARTIAL",
        "OFFLOAD-BLOCKS-USE",
        "USE-CAPACITY",
    )


def test_the_legacy_tables_name_catalogue_rules_and_their_methods() -> None:
    """The legacy model is a block model too: a Use's block is a hit, a capacity stop or a placement,
    tried in that order (an eviction for it comes first, from its own table)."""
    LegacyModel.check_tables()
    assert set(LegacyModel.rules()) <= {r.value for r in RuleId}
    assert LegacyModel.rules()[:5] == ("USE-HIT-ACTIVE", "USE-HIT-INACTIVE", "USE-CAPACITY", "USE-PARTIAL", "USE-NEW")


def test_the_vllm_tables_name_catalogue_rules_and_their_methods() -> None:
    """The vllm pool is a block model: a reused slot and a newly cached block are each decided by a
    copy transition when they are one copy among several (their events name them as copies)."""
    VllmPoolModel.check_tables()
    assert set(VllmPoolModel.rules()) <= {r.value for r in RuleId}
    copies = {t.rule for table in VllmPoolModel.TABLES for t in table if t.copy}
    assert copies == {"VLLM-LAZY-REMOVE", "USE-NEW", "PROMOTE-NEW"}


def test_the_lower_tier_tables_name_their_rules_and_methods() -> None:
    """The lower tiers (G3/G4) are tables too: every transition names a TIER-* rule and a method the
    tiers have, and together they name every TIER-* rule of the catalogue."""
    names = {r for table in LowerTiers.TABLES for t in table for r in t.rules}
    assert names == {r.value for r in RuleId if r.value.startswith("TIER-")}
    for table in LowerTiers.TABLES:
        for t in table:
            for f in (t.guard, t.effect):
                assert not isinstance(f, str) or hasattr(LowerTiers, f), f


def test_a_block_table_naming_a_missing_method_is_refused() -> None:
    class Typo(G1Model):
        TABLES: ClassVar[Sequence[Sequence[Transition[Any, Any]]]] = (
            *G1Model.TABLES,
            (Transition("USE-NEW", Use, "_slot_for_ful", "_place_new"),),
        )

    with pytest.raises(NoTransition, match="_slot_for_ful"):
        Typo.check_tables()


# ------------------------------------------------------- the labels themselves

BS = 4
OFF = OffloadConfig(num_g2_blocks=2, block_size_bytes=0)


def use(*seqs: int, partial: str | None = None) -> Use:
    blocks: list[FullBlock | PartialBlock] = [FullBlock(full=s) for s in seqs]
    if partial is not None:
        blocks.append(PartialBlock(partial=partial))
    plhs, prev = [], None
    for i, s in enumerate(seqs):
        plhs.append(Plh(hash=s, parent=prev, position=i))
        prev = s
    return Use(blocks=blocks, local_hashes=[s * 10 for s in seqs], plhs=plhs)


def test_every_step_of_every_golden_scenario_is_labelled() -> None:
    """Each accepted step has one label per event, and each label's rule
    for the event's presence fits its tier and kind."""
    fits = {
        ("device", "stored"): {RuleId.STORE_NEW_ONLY, RuleId.SWAPIN_SKIP_PRESENT, RuleId.STORE_COPY},
        ("device", "removed"): {
            RuleId.REMOVE_EXACT,
            RuleId.DEVICE_REMOVE_IMMEDIATE,
            RuleId.DESTROY_ACTIVE,
            RuleId.VLLM_LAZY_REMOVE,
            RuleId.REMOVE_COPY,
        },
        ("host_pinned", "stored"): {RuleId.G2_STORE_ON_COMPLETE},
        # TIER-ONBOARD: G2 makes room for a block staged back from G3/G4
        ("host_pinned", "removed"): {RuleId.G2_EVICT, RuleId.TIER_ONBOARD},
        ("disk", "stored"): {RuleId.TIER_EVENTS},
        ("disk", "removed"): {RuleId.TIER_EVENTS},
        ("external", "stored"): {RuleId.TIER_EVENTS},
    }
    steps = 0
    for _, scenario in all_scenarios():
        model = make_model(scenario.config)
        for s in scenario.steps:
            try:
                step = model.apply(s.op)
            except InvalidOperation:
                continue
            steps += 1
            assert step.labels is not None, scenario.name
            assert len(step.labels.events) == len(step.events), scenario.name
            for ev, lab in zip(step.events, step.labels.events, strict=True):
                assert lab.published in fits[(ev.storage_tier, ev.kind)], (scenario.name, ev.brief(), lab)
            if step.events or s.op.op in ("use", "deref", "promote"):
                assert step.labels.rules, (scenario.name, s.op)
    assert steps > 100


def test_a_quarantine_difference_is_attributed_by_the_operations_labels() -> None:
    """QUARANTINE-HOLD where the model quarantined, QUARANTINE-RELEASE where
    it released, COUNTERS where the operation moved no quarantine (the old
    classifier called every quarantined_blocks difference QUARANTINE-*)."""
    m = G1Model(ManagerConfig(capacity=2, block_size=BS, offload=OFF))

    def off_by_one(labels: StepLabels | None) -> RuleId:
        c = m.counters()
        wrong = c.model_copy(update={"quarantined_blocks": c.quarantined_blocks + 1})
        d = counters_divergence(c, wrong, labels)
        assert d is not None
        return d.rule

    m.apply(use(1, 2))
    deref = m.apply(Deref(blocks=[FullBlock(full=2)]))
    assert off_by_one(deref.labels) == RuleId.COUNTERS
    c = m.counters()
    d = counters_divergence(c, c.model_copy(update={"inactive_blocks": 0}), deref.labels)
    assert d is not None and d.rule == RuleId.DEREF_OWNER  # what the Deref did move
    evicting = m.apply(use(3))  # evicts 2: its slot is quarantined, the Use blocks
    assert evicting.result.status == "blocked_on_offload"
    assert off_by_one(evicting.labels) == RuleId.QUARANTINE_HOLD
    assert off_by_one(m.apply(Tick(now_ms=1.0)).labels) == RuleId.QUARANTINE_RELEASE
    assert off_by_one(None) == RuleId.COUNTERS  # no labels: nothing to look up


def test_result_and_event_differences_are_looked_up() -> None:
    m = G1Model(ManagerConfig(capacity=2, block_size=BS, offload=OFF))
    m.apply(use(1, 2))
    m.apply(Deref(blocks=[FullBlock(full=1), FullBlock(full=2)]))
    step = m.apply(use(3))
    assert step.labels is not None and step.result.status == "blocked_on_offload"
    d = result_divergence(step.result, OpResult(value=0, status="capacity"), use(3), step.labels)
    assert d is not None and d.rule == RuleId.OFFLOAD_BLOCKS_USE
    # the device Removed at eviction is missing: DEVICE-REMOVE-IMMEDIATE (offload), not REMOVE-EXACT
    assert [e.kind for e in step.events] == ["removed"]
    d = event_divergence(step.events, [], step.labels)
    assert d is not None and d.rule == RuleId.DEVICE_REMOVE_IMMEDIATE
    # a victim other than the one the policy allowed: EVICT-POLICY
    other = [make_removed(step.events[0].event_id, [9])]
    d = event_divergence(step.events, other, step.labels)
    assert d is not None and d.rule == RuleId.EVICT_POLICY
    # an extra device Removed in a Tick: DEVICE-REMOVE-IMMEDIATE (silent rule of a Tick)
    tick = m.apply(Tick(now_ms=1.0))
    assert tick.labels is not None
    extra = [*tick.events, make_removed(99, [7])]
    d = event_divergence(tick.events, extra, tick.labels)
    assert d is not None and d.rule == RuleId.DEVICE_REMOVE_IMMEDIATE


def test_the_same_difference_under_another_operation_names_another_rule() -> None:
    """A Stored with the wrong parent: PARENT-ANCHOR after a Use, SWAPIN-ANCHOR
    after a swap-in's registration; the labels, not the event, decide."""
    legacy = LegacyModel(ManagerConfig(profile="legacy", capacity=4, block_size=BS, eviction="lru"))
    step = legacy.apply(use(1, 2))
    assert step.labels is not None
    wrong = [make_stored(0, [1, 2], [10, 20], 5)]
    d = event_divergence(step.events, wrong, step.labels)
    assert d is not None and d.rule == RuleId.PARENT_ANCHOR
    from kvspec.reference.labels import label

    onboard = StepLabels(events=[label("SWAPIN-SKIP-PRESENT", parent="SWAPIN-ANCHOR")])
    d = event_divergence(step.events, wrong, onboard)
    assert d is not None and d.rule == RuleId.SWAPIN_ANCHOR


def test_promote_of_an_existing_block_is_labelled_promote_existing() -> None:
    m = G1Model(ManagerConfig(capacity=4, block_size=BS))
    m.apply(use(1))
    m.apply(Use(blocks=[PartialBlock(partial="p")]))
    step = m.apply(Promote(uuid="p", seq_hash=1, parent_hash=None, local_hash=10, plh=Plh(hash=1)))
    assert step.labels is not None and step.labels.result == RuleId.PROMOTE_EXISTING
    before = m.counters()
    d = counters_divergence(before, before.model_copy(update={"free_blocks": before.free_blocks - 1}), step.labels)
    assert d is not None and d.rule == RuleId.PROMOTE_EXISTING


def test_vllm_pool_labels_copies() -> None:
    """A second physical copy's Stored is labelled STORE-COPY and names the copy."""
    m = VllmPoolModel(ManagerConfig(profile="vllm", capacity=4, block_size=BS, eviction="lru"))
    m.apply(use(1, 2))
    m.apply(Deref(blocks=[FullBlock(full=2), FullBlock(full=1)]))
    m.apply(use(1, partial="c"))
    step = m.apply(Promote(uuid="c", seq_hash=2, parent_hash=1, local_hash=20, plh=Plh(hash=2, parent=1, position=1)))
    assert step.labels is not None
    (lab,) = step.labels.events
    assert lab.published == RuleId.STORE_COPY and lab.copies == frozenset({2})
    assert m.event_labels[step.events[0].event_id] == lab


def test_one_divergence_type_serves_both_levels() -> None:
    assert "Divergence" not in vars(request_check) or request_check.Divergence is diff.Divergence
    assert diff.Divergence.__dataclass_fields__.keys() >= {"rule", "what", "expected", "actual", "request", "detail"}


@pytest.mark.parametrize("profile", ["kvbm", "atomic", "legacy"])
def test_counters_difference_with_no_moving_rule_is_counters(profile: str) -> None:
    """A Tick moves no counter in a model without an offload tier: a counter
    difference after it is the conservation rule's."""
    m = make_model(
        ManagerConfig.model_validate({"profile": profile, "capacity": 4, "block_size": BS, "eviction": "lru"})
    )
    step = m.apply(Tick(now_ms=1.0))
    c = m.counters()
    d = counters_divergence(c, Counters(**{**c.model_dump(), "free_blocks": c.free_blocks + 1}), step.labels)
    assert d is not None and d.rule == RuleId.COUNTERS
