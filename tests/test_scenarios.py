"""The golden scenarios (spec/scenarios/, every folder) against the reference model.

Three things are checked here, each able to fail on its own:

1. every scenario runs through ``conformance.block.scenario_runner`` on the
   in-process reference adapter, and the expectations the runner cannot see
   (``active``, ``inactive``, ``g2``: the model's owner table, inactive pool and
   host-pinned registry; counters of rejected steps) hold after each step;
2. each scenario file is really checked: changing one expected event, result
   or error (or an internal expectation) makes the run fail at that step;
3. the expected event streams, replayed through the router view, break no
   protocol rule except the breaks spec/profiles.py documents for the
   scenario's profile, and the scenarios written to show a known break do
   show it (so the data cannot silently drift from the profile table).

Expected values in the files are written by hand from the seeds' tests and
SPEC.md, never computed by the model they check.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.conformance.block.opener import Implementation
from kvspec.conformance.block.scenario_runner import run_scenario
from kvspec.conformance.run.manifest import Capabilities, load_manifest, resolve_adapter_dir
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference import RouterView
from kvspec.spec.config import ManagerConfig
from kvspec.spec.hashing import local_block_hash, sequence_hash
from kvspec.spec.profiles import profile
from kvspec.spec.rules import RuleId
from kvspec.spec.scenario import SCENARIO_DIR, Scenario, all_scenarios
from kvspec.spec.wire import FullBlock, KvEvent, Operation, Promote, StepOutcome, SwapIn, Use

SCENARIOS = all_scenarios()
IDS = [f"{p.parent.name}/{p.stem}" for p, _ in SCENARIOS]
MANIFEST = load_manifest(resolve_adapter_dir("reference"))
#: the folders whose files follow this module's naming conventions
PROFILE_FOLDERS = ("kvbm", "legacy", "atomic")


# --------------------------------------------------------------------------
# running with the model's internals checked
# --------------------------------------------------------------------------


def _internal_mismatches(model: Any, expect: Any, outcome: StepOutcome) -> list[str]:
    """What the step's ``active`` / ``inactive`` / ``g2`` (and, for a rejected
    step, ``counters``) expectations say that the model's state contradicts."""
    out: list[str] = []
    if expect.active is not None:
        owners = {str(k): v for k, v in model.owners().items()}
        if owners != expect.active:
            out.append(f"active owners {owners} != expected {expect.active}")
    if expect.inactive is not None:
        pool = model.inactive_blocks() if hasattr(model, "inactive_blocks") else model.inactive()
        if sorted(pool) != sorted(expect.inactive):
            out.append(f"inactive {sorted(pool)} != expected {sorted(expect.inactive)}")
    if expect.g2 is not None:
        g2 = sorted(model.registered("host_pinned"))
        if g2 != sorted(expect.g2):
            out.append(f"g2 {g2} != expected {sorted(expect.g2)}")
    if expect.error is not None and expect.counters is not None:
        got = outcome.counters.model_dump()
        bad = {k: (v, got.get(k)) for k, v in expect.counters.items() if got.get(k) != v}
        if bad:
            out.append(f"counters after the rejected step (expected, actual): {bad}")
    return out


class _InternalsChecked(Implementation):
    """The reference adapter, checking the scenario's internal expectations
    after each step (the runner checks everything the wire carries)."""

    def __init__(self, scenario: Scenario, config: ManagerConfig | None = None) -> None:
        self.scenario = scenario
        self.config = config or scenario.config
        self.inner = ReferenceImplementation(self.config, MANIFEST)
        self.manifest = MANIFEST
        self.index = 0

    def step(self, op: Operation) -> StepOutcome:
        outcome = self.inner.step(op)
        bad = _internal_mismatches(self.inner.model, self.scenario.steps[self.index].expect, outcome)
        assert not bad, f"scenario {self.scenario.name!r} step {self.index}: " + "; ".join(bad)
        self.index += 1
        return outcome


def _run(scenario: Scenario, config: ManagerConfig | None = None) -> list[StepOutcome]:
    return run_scenario(scenario, _InternalsChecked(scenario, config))


POLICY_CASES = [(p, s, pol) for p, s in SCENARIOS for pol in s.run_policies()]


@pytest.mark.parametrize(
    ("path", "scenario", "policy"), POLICY_CASES, ids=[f"{p.parent.name}/{p.stem}@{pol}" for p, _, pol in POLICY_CASES]
)
def test_scenario_passes_on_reference_model(path: Path, scenario: Scenario, policy: str) -> None:
    """Under its own policy and under every other policy the file says its
    expectations hold under ("policies")."""
    outcomes = _run(scenario, scenario.config_for(policy))  # type: ignore[arg-type]
    assert len(outcomes) == len(scenario.steps)


def test_most_goldens_run_under_every_policy_of_their_profile() -> None:
    """A port with one eviction policy (LRU, as adapters/c_port) runs every
    golden whose expectations do not depend on the victim."""
    g1 = [(p, s) for p, s in SCENARIOS if s.config.profile in ("kvbm", "atomic") and p.parent.name != "witnesses"]
    under_lru = [p for p, s in g1 if "lru" in s.run_policies()]
    assert len(under_lru) >= 0.85 * len(g1), sorted({p.stem for p, _ in g1} - {p.stem for p in under_lru})
    anywhere = [p for p, s in g1 if s.policies == "any"]
    assert len(anywhere) >= len(g1) // 2


def test_policies_field_is_checked() -> None:
    raw = _raw(SCENARIO_DIR / "kvbm" / "single_use.json")
    assert Scenario.model_validate(raw).run_policies() == ["lineage", "lru", "multi_lru", "unordered"]
    for bad, message in (
        ({"policies": ["lru"]}, "must include config.eviction 'lineage'"),
        ({"policies": ["lineage", "lru", "lru"]}, "twice"),
        ({"policies": ["lineage", "fifo"]}, "policies"),
        ({"policies": "any", "requires": ["policy:lineage"]}, "leave policy:\\* out of 'requires'"),
    ):
        with pytest.raises(ValueError, match=message):
            Scenario.model_validate({**raw, **bad})
    legacy = _raw(SCENARIO_DIR / "legacy" / "stringent_lifecycle.json")
    legacy.pop("requires", None)
    assert Scenario.model_validate({**legacy, "policies": "any"}).run_policies() == ["lru"]
    with pytest.raises(ValueError, match=r"legacy profile evicts by 'lru' only"):
        Scenario.model_validate({**legacy, "policies": ["lru", "lineage"]})


def test_there_are_scenarios_for_every_block_level_profile() -> None:
    profiles = {s.config.profile for _, s in SCENARIOS}
    assert {"kvbm", "legacy", "atomic"} <= profiles
    assert len([1 for p, _ in SCENARIOS if p.parent.name in PROFILE_FOLDERS]) >= 30


@pytest.mark.parametrize(
    ("path", "scenario"),
    [(p, s) for p, s in SCENARIOS if p.parent.name in PROFILE_FOLDERS],
    ids=[i for i, (p, _) in zip(IDS, SCENARIOS, strict=True) if p.parent.name in PROFILE_FOLDERS],
)
def test_scenario_file_conventions(path: Path, scenario: Scenario) -> None:
    """Name = file stem, folder = profile, known capabilities, applicable rules."""
    assert scenario.name == path.stem
    assert scenario.config.profile == path.parent.name
    caps = Capabilities()
    for c in scenario.requires:
        caps.has(c)  # raises ConfigError on an unknown capability name
    if scenario.policies is None:  # pinned: the victim matters
        assert f"policy:{scenario.config.eviction}" in scenario.requires
    else:
        assert not [r for r in scenario.requires if r.startswith("policy:")]
    prof = profile(scenario.config.profile)
    assert [r for r in scenario.rules if not prof.applies(r)] == []
    assert scenario.source.strip() and scenario.description.strip()


def test_hashing_scenarios_carry_dynamo_hashes() -> None:
    """Scenarios that claim HASH-LOCAL / HASH-SEQUENCE use real Dynamo hashes:
    each local hash follows from its tokens, each sequence hash from its parent."""
    claimed = [s for _, s in SCENARIOS if RuleId.HASH_LOCAL in s.rules]
    assert claimed, "no scenario exercises HASH-LOCAL"
    for s in claimed:
        for st in s.steps:
            op = st.op
            if not isinstance(op, Use) or op.token_ids is None:
                continue
            parent = op.parent.full if isinstance(op.parent, FullBlock) else None
            fulls = [b.full for b in op.blocks if isinstance(b, FullBlock)]
            for seq, local, toks in zip(fulls, op.local_hashes, op.token_ids, strict=True):
                assert local == local_block_hash(toks), (s.name, seq)
                assert seq == sequence_hash(parent, local), (s.name, seq)
                parent = seq


# --------------------------------------------------------------------------
# every file is really checked: perturb it and watch the run fail
# --------------------------------------------------------------------------


def _raw(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _first(raw: dict[str, Any], pred: Callable[[dict[str, Any]], bool]) -> int | None:
    return next((i for i, st in enumerate(raw["steps"]) if pred(st["expect"])), None)


def _bump(h: int) -> int:
    return (h + 1) % 2**64


def _perturb_event(raw: dict[str, Any], how: str) -> int | None:
    """Change one expected event in place; return the step index changed."""
    if how == "spurious":
        i = _first(raw, lambda e: e.get("events") == [] and e.get("error") is None)
        if i is None:
            return None
        raw["steps"][i]["expect"]["events"] = [{"event_id": 0, "data": {"removed": {"block_hashes": [7]}}}]
        return i
    if how == "parent":
        for i, st in enumerate(raw["steps"]):
            for ev in st["expect"].get("events") or []:
                if isinstance(ev["data"], dict) and "stored" in ev["data"]:
                    d = ev["data"]["stored"]
                    d["parent_hash"] = 424242 if d.get("parent_hash") is None else None
                    return i
        return None
    i = _first(raw, lambda e: bool(e.get("events")))
    if i is None:
        return None
    events = raw["steps"][i]["expect"]["events"]
    if how == "drop":
        events.pop(0)
    elif how == "hash":
        data = events[0]["data"]
        if "stored" in data:
            data["stored"]["blocks"][0]["block_hash"] = _bump(data["stored"]["blocks"][0]["block_hash"])
        else:
            data["removed"]["block_hashes"][0] = _bump(data["removed"]["block_hashes"][0])
    elif how == "event_id":
        events[-1]["event_id"] += 1
    elif how == "tier":
        events[0]["storage_tier"] = "disk"
    else:
        raise AssertionError(how)
    return i


def _perturb_result(raw: dict[str, Any], how: str) -> int | None:
    if how == "value":
        i = _first(raw, lambda e: e.get("result") is not None)
        if i is None:
            return None
        e = raw["steps"][i]["expect"]
        e["result"] = (not e["result"]) if isinstance(e["result"], bool) else e["result"] + 1
        return i
    if how == "status":
        i = _first(raw, lambda e: e.get("status") is not None)
        if i is None:
            return None
        e = raw["steps"][i]["expect"]
        e["status"] = "capacity" if e["status"] != "capacity" else "ok"
        return i
    if how == "error_rule":
        i = _first(raw, lambda e: e.get("error") is not None)
        if i is None:
            return None
        e = raw["steps"][i]["expect"]
        e["error"] = "COUNTERS" if e["error"] != "COUNTERS" else "USE-VALIDATE"
        return i
    if how == "error_dropped":
        i = _first(raw, lambda e: e.get("error") is not None)
        if i is None:
            return None
        raw["steps"][i]["expect"].pop("error")
        return i
    if how == "error_added":
        i = _first(raw, lambda e: e.get("error") is None)
        if i is None:
            return None
        raw["steps"][i]["expect"] = {"error": "USE-VALIDATE"}
        return i
    if how == "counters":
        i = _first(raw, lambda e: bool(e.get("counters")) and e.get("error") is None)
        if i is None:
            return None
        c = raw["steps"][i]["expect"]["counters"]
        k = next(iter(c))
        c[k] += 1
        return i
    raise AssertionError(how)


def _perturb_internal(raw: dict[str, Any], how: str) -> int | None:
    if how == "active":
        i = _first(raw, lambda e: e.get("active") is not None)
        if i is None:
            return None
        a = raw["steps"][i]["expect"]["active"]
        if a:
            k = next(iter(a))
            a[k] += 1
        else:
            a["123456"] = 1
        return i
    if how == "inactive":
        i = _first(raw, lambda e: e.get("inactive") is not None)
        if i is None:
            return None
        inactive = raw["steps"][i]["expect"]["inactive"]
        if inactive:
            inactive.pop()
        else:
            inactive.append(123456)
        return i
    if how == "g2":
        i = _first(raw, lambda e: e.get("g2") is not None)
        if i is None:
            return None
        g2 = raw["steps"][i]["expect"]["g2"]
        if g2:
            g2.pop()
        else:
            g2.append(123456)
        return i
    raise AssertionError(how)


EVENT_CHANGES = ["hash", "parent", "drop", "event_id", "tier", "spurious"]
RESULT_CHANGES = ["value", "status", "error_rule", "error_dropped", "error_added", "counters"]
INTERNAL_CHANGES = ["active", "inactive", "g2"]


def _expect_failure_at(raw: dict[str, Any], step: int, exc: type[BaseException]) -> None:
    scenario = Scenario.model_validate(raw)
    with pytest.raises(exc) as info:
        _run(scenario)
    assert f"step {step}" in str(info.value), str(info.value)
    if exc is AssertionError:  # an internal expectation, not something the runner saw
        assert not isinstance(info.value, ConformanceFailure), str(info.value)


def _applicable(changes: list[str], perturb: Callable[[dict[str, Any], str], int | None]) -> list[Any]:
    cases = []
    for path, _ in SCENARIOS:
        for how in changes:
            if perturb(copy.deepcopy(_raw(path)), how) is not None:
                cases.append(pytest.param(path, how, id=f"{path.parent.name}/{path.stem}-{how}"))
    return cases


@pytest.mark.parametrize(("path", "how"), _applicable(EVENT_CHANGES, _perturb_event))
def test_changed_expected_event_fails(path: Path, how: str) -> None:
    raw = _raw(path)
    step = _perturb_event(raw, how)
    assert step is not None
    _expect_failure_at(raw, step, ConformanceFailure)


@pytest.mark.parametrize(("path", "how"), _applicable(RESULT_CHANGES, _perturb_result))
def test_changed_expected_result_fails(path: Path, how: str) -> None:
    raw = _raw(path)
    step = _perturb_result(raw, how)
    assert step is not None
    _expect_failure_at(raw, step, ConformanceFailure)


@pytest.mark.parametrize(("path", "how"), _applicable(INTERNAL_CHANGES, _perturb_internal))
def test_changed_internal_expectation_fails(path: Path, how: str) -> None:
    raw = _raw(path)
    step = _perturb_internal(raw, how)
    assert step is not None
    _expect_failure_at(raw, step, AssertionError)


def test_every_scenario_with_events_is_perturbed() -> None:
    """Guard the guard: each file with an expected event gets an event
    perturbation, each with a result gets a result perturbation."""
    with_events = {p for p, s in SCENARIOS if any(st.expect.events for st in s.steps)}
    ev_cases = {c.values[0] for c in _applicable(["hash", "drop"], _perturb_event)}
    assert with_events <= ev_cases
    with_result = {p for p, s in SCENARIOS if any(st.expect.result is not None for st in s.steps)}
    res_cases = {c.values[0] for c in _applicable(["value"], _perturb_result)}
    assert with_result <= res_cases


# --------------------------------------------------------------------------
# the expected streams against the protocol rules
# --------------------------------------------------------------------------

#: scenarios written to show a known break of their profile, and the rules
#: the router view must flag on their expected stream (every other scenario
#: of these folders must be clean)
KNOWN_BREAK_SCENARIOS: dict[str, set[RuleId]] = {
    "kvbm/interleaved_anchor_break": {RuleId.PARENT_ANCHOR},
    "kvbm/evict_reregister_same_batch": {RuleId.STORE_NO_DUP},
    "kvbm/store_no_dup_reregistered_block_afterwards": {RuleId.STORE_NO_DUP},
    "kvbm/lru_evicts_parent_first": {RuleId.REMOVE_NO_ORPHAN},
    "kvbm/capacity_stop_before_cached_blocks": {RuleId.REMOVE_NO_ORPHAN},
    "legacy/interleaved_batch": {RuleId.PARENT_ANCHOR, RuleId.STORE_TOKENS_HASH},
    "legacy/removed_before_stored": {RuleId.EVENT_ORDER, RuleId.REMOVE_NO_ORPHAN},
    "legacy/stringent_lifecycle": {RuleId.EVENT_ORDER},
    "legacy/failed_use_keeps_blocks": {RuleId.REMOVE_EXACT, RuleId.EVENT_ORDER},
}


def _stream_violations(scenario: Scenario) -> set[RuleId]:
    """Replay the scenario's expected events (not the model's) through a strict
    router view that knows, from the operations, each block's true parent and
    local hash."""
    local_of: dict[int, int] = {}

    def tokens_hash_check(parent: int | None, block: int, tokens_hash: int, toks: list[int] | None) -> str | None:
        want = local_of.get(block, 0)
        return None if tokens_hash == want else f"tokens_hash {tokens_hash} is not block {block}'s local hash {want}"

    view = RouterView(mode="set", strict=True, expect_dp_rank=scenario.config.dp_rank, hash_check=tokens_hash_check)
    for st in scenario.steps:
        op = st.op
        if st.expect.error is not None:
            continue  # rejected: it changes nothing and publishes nothing
        if isinstance(op, Use):
            prev = op.parent.full if isinstance(op.parent, FullBlock) else None
            fulls = [b.full for b in op.blocks if isinstance(b, FullBlock)]
            for i, seq in enumerate(fulls):
                view.expect_parent(seq, prev)
                if op.local_hashes:
                    local_of.setdefault(seq, op.local_hashes[i])
                prev = seq
        elif isinstance(op, Promote):
            view.expect_parent(op.seq_hash, op.parent_hash)
            local_of.setdefault(op.seq_hash, op.local_hash)
        elif isinstance(op, SwapIn):
            prev = op.parent
            for b in op.blocks:
                view.expect_parent(b.seq_hash, prev)
                prev = b.seq_hash
        if st.expect.events:
            events: list[KvEvent] = list(st.expect.events)
            view.apply_batch(events, stored_first=True)
    return {v.rule for v in view.violations}


@pytest.mark.parametrize(("path", "scenario"), SCENARIOS, ids=IDS)
def test_expected_stream_breaks_only_known_rules(path: Path, scenario: Scenario) -> None:
    prof = profile(scenario.config.profile)
    flagged = _stream_violations(scenario)
    unexplained = {r for r in flagged if prof.known_break(r, scenario.config.eviction) is None}
    assert unexplained == set(), f"{path.name}: protocol violations that are not known breaks of {prof.name}"
    key = f"{path.parent.name}/{path.stem}"
    if path.parent.name in PROFILE_FOLDERS:
        assert flagged == KNOWN_BREAK_SCENARIOS.get(key, set())


def test_known_break_scenarios_exist() -> None:
    present = {f"{p.parent.name}/{p.stem}" for p, _ in SCENARIOS}
    assert set(KNOWN_BREAK_SCENARIOS) <= present


def test_scenario_dir_is_the_package_data_dir() -> None:
    assert SCENARIO_DIR.is_dir()
    assert {p.parent.name for p, _ in SCENARIOS} >= set(PROFILE_FOLDERS)
