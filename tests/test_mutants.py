"""The mutants and ``kvspec mutants``.

- the catalogue is well formed (ids, rules, profiles, capabilities);
- every mutant really is broken: on a short hand-written operation sequence,
  under every profile it claims, its outcome differs from the reference's in
  the stated way (a mutant that behaves like the reference would "survive"
  for the wrong reason), while the unmutated variant ``none`` never differs;
- the adapter plumbing: ``--impl=adapters/mutants/NAME`` resolves, the
  manifest declares exactly the reference's capabilities and no deviation;
- the campaign runner, against a tiny stand-in suite: a failing test with a
  rule id is a kill under that rule, a crash is a kill without one, a passing
  run (xfails included) is a survivor, a hang is a timeout.

The real campaign (the whole suite per mutant) is too slow for this file; CI
runs ``kvspec mutants`` on its own.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvspec.adapters.mutants.adapter import open_mutant
from kvspec.adapters.mutants.catalogue import CATALOGUE, MUTANTS, UNMUTATED, make_mutant_model
from kvspec.adapters.mutants.request_bugs import BY_ID as REQUEST_MUTANTS
from kvspec.adapters.reference.adapter import outcome_of
from kvspec.cli import main as cli_main
from kvspec.conformance.block.opener import open_implementation
from kvspec.conformance.commands import mutants as campaign
from kvspec.conformance.run.forkserver import ServerPool, suite_imports
from kvspec.conformance.run.manifest import Capabilities, load_impl, load_manifest, resolve_adapter_dir, resolve_impl
from kvspec.reference import make_model
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.profiles import PROFILES
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import (
    Deref,
    Destroy,
    FullBlock,
    PartialBlock,
    Plh,
    Promote,
    StepOutcome,
    SwapIn,
    SwapInBlock,
    Tick,
    Use,
    event_to_json,
)

BS = 4  # block size of every configuration here
ADAPTERS = Path(__file__).resolve().parents[1] / "adapters"

# ---------------------------------------------------------------- operations


def U(*refs: int | str, start: int = 0, parent: int | None = None, tokens: bool = False, short: bool = False) -> Use:  # noqa: N802
    """Use of full blocks (ints, one chain: each the parent of the next, at
    positions start, start + 1, ...) and partial blocks (strings)."""
    fulls = [r for r in refs if isinstance(r, int)]
    plhs, prev = [], parent
    for i, s in enumerate(fulls):
        plhs.append(Plh(hash=s, parent=prev if start + i > 0 else None, position=start + i))
        prev = s
    toks = [[s] * (BS - 1 if short and i == 0 else BS) for i, s in enumerate(fulls)] if tokens or short else None
    return Use(
        blocks=[FullBlock(full=r) if isinstance(r, int) else PartialBlock(partial=r) for r in refs],
        plhs=plhs,
        local_hashes=[1000 + s for s in fulls],
        token_ids=toks,
        parent=FullBlock(full=parent) if parent is not None else None,
    )


def D(*refs: int | str) -> Deref:  # noqa: N802
    return Deref(blocks=[FullBlock(full=r) if isinstance(r, int) else PartialBlock(partial=r) for r in refs])


def X(*seqs: int) -> Destroy:  # noqa: N802
    return Destroy(blocks=[FullBlock(full=s) for s in seqs])


def P(uuid: str, seq: int, parent: int | None = None) -> Promote:  # noqa: N802
    pos = 0 if parent is None else 1
    return Promote(
        uuid=uuid,
        seq_hash=seq,
        parent_hash=parent,
        local_hash=1000 + seq,
        plh=Plh(hash=seq, parent=parent, position=pos),
    )


def T(ms: float) -> Tick:  # noqa: N802
    return Tick(now_ms=ms)


def S(seq: int, parent: int | None = None) -> SwapIn:  # noqa: N802
    return SwapIn(blocks=[SwapInBlock(seq_hash=seq, plh=Plh(hash=seq, position=0))], parent=parent)


def cfg(profile: str = "kvbm", capacity: int = 4, eviction: str = "lineage", **kw: Any) -> ManagerConfig:
    if profile in ("legacy", "vllm"):
        eviction = "lru"
    return ManagerConfig(profile=profile, capacity=capacity, block_size=BS, eviction=eviction, **kw)  # type: ignore[arg-type]


def off(capacity: int = 1, g2: int = 4) -> ManagerConfig:
    return cfg("kvbm", capacity, offload=OffloadConfig.legacy(num_g2_blocks=g2))


# ------------------------------------------------------------ directed table

ASPECTS: list[tuple[str, Any]] = [
    ("error", lambda o: o.error.rule if o.error is not None else None),
    ("result", lambda o: o.result),
    ("events", lambda o: [event_to_json(e) for e in o.events]),
    ("counters", lambda o: o.counters),
    ("deadline", lambda o: o.earliest_deadline_ms),
]


@dataclass(frozen=True)
class Case:
    mutant: str
    profiles: tuple[str, ...]
    ops: tuple[Any, ...]
    aspect: str  # what differs first: error, result, events, counters, deadline
    capacity: int = 4
    eviction: str = "lineage"
    offload: bool = False
    g2: int = 4
    dp_rank: int = 0
    #: offload with Dynamo's semantics (the defaults) instead of the legacy values
    dynamo: bool = False

    def config(self, profile: str) -> ManagerConfig:
        if self.offload and self.dynamo:
            return cfg("kvbm", self.capacity, offload=OffloadConfig(num_g2_blocks=self.g2, block_size_bytes=1_000_000))
        if self.offload:
            return off(self.capacity, self.g2)
        return cfg(profile, self.capacity, self.eviction, dp_rank=self.dp_rank)


G1 = ("kvbm", "atomic")
DUP = Use(blocks=[FullBlock(full=1), FullBlock(full=1)], plhs=[Plh(hash=1, position=0)] * 2, local_hashes=[1001, 1001])
EVICT1 = (U(1), D(1), U(2))  # capacity 1: the Use of 2 evicts 1

CASES: list[Case] = [
    Case("stored_on_inactive_hit", G1, (U(1, 2), D(2, 1), U(1, 2, 3)), "events"),
    Case("stored_on_active_hit", G1, (U(1, 2), U(1, 2, 3)), "events"),
    Case("stored_dup_in_batch", ("kvbm",), (DUP,), "events"),
    Case("promote_existing_stored", G1, (U(1), U("a"), P("a", 1)), "events"),
    Case("legacy_stored_on_failed_use", ("legacy",), (U(1), U(2, 3)), "events", capacity=2),
    Case("tokens_hash_is_block_hash", G1, (U(1),), "events"),
    Case("parent_first_reused", ("kvbm",), (U(1, 2), U(1, 2, 3)), "events"),
    Case("parent_always_none", (*G1, "legacy"), (U(1, 2), U(1, 2, 3)), "events"),
    Case("promote_parent_dropped", G1, (U(1), U("a"), P("a", 2, parent=1)), "events"),
    Case("removed_extra_block", G1, (U(1), D(1), U(2), D(2), U(3)), "events", capacity=2),
    Case("removed_missing_last", G1, EVICT1, "events", capacity=1),
    Case("legacy_destroy_silent", ("legacy",), (U(1), X(1)), "events"),
    # a block two requests hold: removed outright (one Removed), not dereferenced
    Case("legacy_destroy_shared_drops_one_owner", ("legacy",), (U(1), U(1), X(1)), "events"),
    Case("legacy_destroy_shared_derefs_all", ("legacy",), (U(1), U(1), X(1)), "events"),
    # a Destroy of an inactive block is rejected, not applied to the rest
    Case("legacy_destroy_unheld_accepted", ("legacy",), (U(1), D(1), X(1)), "error"),
    Case("event_id_skip", G1, (*EVICT1, D(2), U(3)), "events", capacity=1),
    Case("event_id_per_tier", ("kvbm",), (*EVICT1, T(0)), "events", capacity=1, offload=True),
    Case("removed_before_stored", G1, EVICT1, "events", capacity=1),
    Case("legacy_removed_after_stored", ("legacy",), EVICT1, "events", capacity=1),
    Case("removed_dp_rank_zero", G1, EVICT1, "events", capacity=1, dp_rank=3),
    Case("evict_active_when_full", ("kvbm",), (U(1), U(2)), "result", capacity=1),
    Case("deref_inactive_at_one", G1, (U(1), U(1), D(1)), "counters"),
    Case("capacity_one_early", ("kvbm",), (U(1),), "result", capacity=1),
    Case("atomic_half_placed", ("atomic",), (U(1, 2),), "result", capacity=1),
    Case("use_counts_new_only", G1, (U(1), U(1, 2)), "result"),
    Case("inactive_hit_takes_slot", ("kvbm",), (U(1), D(1), U(1)), "counters"),
    Case("partial_leaked_on_deref", G1, (U("a"), D("a")), "counters"),
    Case("promote_existing_keeps_slot", G1, (U(1), U("a"), P("a", 1)), "counters"),
    Case("deref_unknown_ignored", G1, (D(9),), "error"),
    Case("validate_after_mutation", G1, (U(1, short=True),), "counters"),
    Case("active_refs_counts_blocks", G1, (U(1), U(1)), "counters"),
    Case(
        "capacity_skips_to_hits",
        ("kvbm",),
        (U(1, 2, 3), U(3, start=2, parent=2), D(3, 2, 1), U(7), U(8), U(1, 2, 3)),
        "result",
    ),
    Case("deref_applied_before_rejection", G1, (U(1), D(1, 9)), "counters"),
    Case(
        "lineage_no_ghost",
        G1,
        (U(1, 2, 3), D(1, 2, 3), U(9), D(9), U(2, start=1, parent=1), U(20)),
        "events",
    ),
    Case(
        "active_hit_touches",
        G1,
        (U(1), U(1), U(1), D(1), D(1), D(1), U(2), D(2), U(3)),
        "events",
        capacity=2,
        eviction="multi_lru",
    ),
    Case("lineage_parent_first", G1, (U(1, 2), D(1, 2), U(3)), "events", capacity=2),
    Case("lru_most_recent_first", G1, (U(1), U(2), D(1), D(2), U(3)), "events", capacity=2, eviction="lru"),
    Case(
        "multi_lru_flat",
        G1,
        (U(1), D(1), U(1), D(1), U(1), D(1), U(2), D(2), U(3)),
        "events",
        capacity=2,
        eviction="multi_lru",
    ),
    Case("legacy_evict_mru", ("legacy",), (U(1), U(2), D(1), D(2), U(3)), "events", capacity=2),
    Case("slot_released_at_enqueue", ("kvbm",), EVICT1, "counters", capacity=1, offload=True),
    Case(
        "quarantine_kept_when_in_g2",
        ("kvbm",),
        (*EVICT1, T(0), U(1), D(1), U(2), T(0)),
        "counters",
        capacity=1,
        offload=True,
    ),
    Case("offload_reports_capacity", ("kvbm",), EVICT1, "result", capacity=1, offload=True),
    Case("g2_stored_at_enqueue", ("kvbm",), EVICT1, "events", capacity=1, offload=True),
    Case(
        "g2_evicts_newest",
        ("kvbm",),
        (*EVICT1, T(0), U(2), D(2), U(3), T(0), U(3), D(3), U(4), T(0)),
        "events",
        capacity=1,
        offload=True,
        g2=2,
    ),
    Case(
        "g2_evict_on_device_tier",
        ("kvbm",),
        (*EVICT1, T(0), U(2), D(2), U(3), T(0), U(3), D(3), U(4), T(0)),
        "events",
        capacity=1,
        offload=True,
        g2=1,
    ),
    Case("device_removed_at_completion", ("kvbm",), EVICT1, "events", capacity=1, offload=True),
    Case("transfer_due_after_deadline", ("kvbm",), (*EVICT1, T(0)), "result", capacity=1, offload=True),
    Case(
        "presence_filter_missing",
        ("kvbm",),
        (*EVICT1, T(1), U(1), D(1), U(2)),
        "counters",
        capacity=1,
        offload=True,
        dynamo=True,
    ),
    Case("tick_backwards_applied", ("kvbm",), (T(100), T(50), *EVICT1), "deadline", capacity=1, offload=True),
    Case(
        "swapin_registers_present",
        ("kvbm",),
        (U(1), D(1), U("a"), U(2), T(0), U(1), D("a"), S(1), T(0)),
        "events",
        capacity=2,
        offload=True,
    ),
    Case("swapin_parent_dropped", ("kvbm",), (*EVICT1, T(0), S(1, parent=9), T(0)), "events", capacity=1, offload=True),
    Case(
        "swapin_unpins_before_offload",
        ("kvbm",),
        (U(1), D(1), U(2), D(2), U(3), T(1), U(3), D(3), S(1), S(1), T(2)),
        "events",
        capacity=2,
        offload=True,
        g2=1,
        dynamo=True,
    ),
]

DIRECTED = [(c, p) for c in CASES for p in c.profiles]


def first_difference(a: list[StepOutcome], b: list[StepOutcome]) -> tuple[int, str] | None:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        for aspect, get in ASPECTS:
            if get(x) != get(y):
                return i, aspect
    return None


def run_ops(model: Any, ops: tuple[Any, ...]) -> list[StepOutcome]:
    return [outcome_of(model, op) for op in ops]


@pytest.mark.parametrize(("case", "profile"), DIRECTED, ids=[f"{c.mutant}-{p}" for c, p in DIRECTED])
def test_mutant_differs_from_reference(case: Case, profile: str) -> None:
    config = case.config(profile)
    expected = run_ops(make_model(config), case.ops)
    actual = run_ops(make_mutant_model(case.mutant, config), case.ops)
    diff = first_difference(expected, actual)
    assert diff is not None, f"mutant {case.mutant} behaves exactly like the reference under {profile}"
    step, aspect = diff
    assert aspect == case.aspect, f"{case.mutant}: step {step} differs first in {aspect}, not {case.aspect}"


@pytest.mark.parametrize(("case", "profile"), DIRECTED, ids=[f"{c.mutant}-{p}" for c, p in DIRECTED])
def test_unmutated_variant_never_differs(case: Case, profile: str) -> None:
    config = case.config(profile)
    assert (
        first_difference(run_ops(make_model(config), case.ops), run_ops(make_mutant_model(UNMUTATED, config), case.ops))
        is None
    )


def test_every_mutant_profile_has_a_directed_case() -> None:
    covered = {(c.mutant, p) for c, p in DIRECTED}
    # request-level mutants have theirs in test_request_mutants.py (a workload, not block operations)
    wanted = {(m.id, p) for m in CATALOGUE for p in m.profiles if m.id not in REQUEST_MUTANTS}
    assert wanted - covered == set(), "mutants/profiles without a directed case"
    assert covered - wanted == set(), "directed cases for profiles the mutant does not claim"


@pytest.mark.parametrize("mutant", [m.id for m in CATALOGUE])
def test_mutant_is_the_reference_outside_its_profiles(mutant: str) -> None:
    m = MUTANTS[mutant]
    for profile in PROFILES:
        config = cfg(profile)
        model = m.model_for(config)
        if profile in m.profiles and mutant not in REQUEST_MUTANTS:  # those are the reference at block level
            assert type(model) is not type(make_model(config))
        else:
            assert type(model) is type(make_model(config))


# ------------------------------------------------------------------ catalogue


def test_catalogue_is_well_formed() -> None:
    ids = [m.id for m in CATALOGUE]
    assert len(ids) >= 30
    assert len(set(ids)) == len(ids), "duplicate mutant ids"
    assert UNMUTATED not in ids
    caps = Capabilities()
    for m in CATALOGUE:
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)+", m.id), m.id
        assert m.description and "\n" not in m.description and len(m.description) <= 110, m.id
        assert isinstance(m.rule, RuleId) and RuleId(m.rule.value) is m.rule
        assert m.profiles and set(m.profiles) <= set(PROFILES), m.id
        assert len(set(m.profiles)) == len(m.profiles)
        assert (m.g1 is not None) == bool({"kvbm", "atomic"} & set(m.profiles)), m.id
        assert (m.legacy is not None) == ("legacy" in m.profiles), m.id
        for need in m.needs:
            caps.has(need)  # raises on an unknown capability name
        for p in m.profiles:
            assert PROFILES[p].applies(m.rule), f"{m.id}: rule {m.rule} does not apply to profile {p}"


def test_issue_named_bugs_are_in_the_catalogue() -> None:
    named = {
        "stored_on_inactive_hit",
        "parent_first_reused",
        "parent_always_none",
        "removed_extra_block",
        "removed_missing_last",
        "evict_active_when_full",
        "deref_inactive_at_one",
        "capacity_one_early",
        "atomic_half_placed",
        "event_id_skip",
        "event_id_per_tier",
        "removed_before_stored",
        "partial_leaked_on_deref",
        "validate_after_mutation",
        "lineage_parent_first",
        "lru_most_recent_first",
        "multi_lru_flat",
        "promote_existing_stored",
        "promote_existing_keeps_slot",
        "deref_unknown_ignored",
        "tokens_hash_is_block_hash",
        "removed_dp_rank_zero",
        "active_refs_counts_blocks",
        "inactive_hit_takes_slot",
        "use_counts_new_only",
        "stored_dup_in_batch",
        "slot_released_at_enqueue",
        "g2_stored_at_enqueue",
        "device_removed_at_completion",
        "swapin_registers_present",
        "tick_backwards_applied",
    }
    assert named <= set(MUTANTS)


# -------------------------------------------------------------- the adapter


def test_manifest_declares_the_reference_capabilities_and_no_deviation() -> None:
    mut = load_manifest(ADAPTERS / "mutants")
    ref = load_manifest(ADAPTERS / "reference")
    # the mutant zoo serves one worker: its bugs live in one G1Model (the several-worker bugs
    # of the shared tiers are variants of adapters/kvbm_port_rs)
    assert mut.capabilities == ref.capabilities.model_copy(update={"workers": 1})
    assert mut.start.requests == "kvspec.adapters.mutants.request_bugs:open_request_mutant"
    assert mut.supported_profiles() == ref.supported_profiles()
    assert mut.deviations == []
    assert [v.name for v in mut.variants] == [m.id for m in CATALOGUE]
    assert ref.variants == [] and mut.variant is None


def test_impl_path_selects_the_mutant_explicitly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ADAPTERS.parent)
    before = dict(os.environ)
    d, manifest = load_impl(str(ADAPTERS / "mutants" / "event_id_skip"))
    assert d == (ADAPTERS / "mutants").resolve() and manifest.variant == "event_id_skip"
    assert resolve_impl("adapters/mutants/capacity_one_early") == (d, "capacity_one_early")
    assert dict(os.environ) == before, "the loader must not pass the variant through the environment"
    # the suite opens the adapter with variant=NAME: the mutant is what runs
    _, manifest = load_impl("adapters/mutants/capacity_one_early")
    impl = open_implementation(manifest, d, cfg(capacity=1))
    assert impl.step(U(1)).result.value == 0  # type: ignore[union-attr]
    # no variant: the unmutated reference
    plain = open_implementation(load_manifest(d), d, cfg(capacity=1))
    assert plain.step(U(1)).result.value == 1  # type: ignore[union-attr]


def test_unknown_variant_or_adapter_without_variants_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ADAPTERS.parent)
    with pytest.raises(ConfigError, match=r"declares no variant 'capacity_one_early'.*no \[\[variants\]\]"):
        resolve_impl("adapters/reference/capacity_one_early")
    with pytest.raises(ConfigError, match=r"declares no variant 'no_such_bug' \(known: stored_on_inactive_hit"):
        resolve_impl("adapters/mutants/no_such_bug")
    with pytest.raises(ConfigError, match=r"selects variant .event_id_skip.*load_impl"):
        resolve_adapter_dir("adapters/mutants/event_id_skip")
    d = ADAPTERS / "mutants"
    with pytest.raises(ConfigError, match="unknown mutant 'no_such_bug'"):
        open_mutant(cfg(), load_manifest(d), d, variant="no_such_bug")


# ------------------------------------------------------------------- the CLI


def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["mutants", "--list"]) == 0
    out = capsys.readouterr().out
    for m in CATALOGUE:
        assert re.search(rf"^{m.id}\s.*{re.escape(str(m.rule))}", out, re.M), m.id
    assert f"{len(CATALOGUE)} mutants" in out


def test_cli_rejects_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["mutants", "--only", "capacity_one_early,not_a_mutant"]) == 2
    assert "not_a_mutant" in capsys.readouterr().err


# ------------------------------------------------------- the campaign runner

FAKE_SUITE = """
import os, time
from pathlib import Path
import pytest
from kvspec.conformance.verdicts.failures import ConformanceFailure

@pytest.mark.xfail(reason="an expected failure is never a kill", strict=True)
def test_expected_failure():
    raise ConformanceFailure("REMOVE-EXACT", "declared")

def test_the_one(request):
    VARIANT = Path(request.config.getoption("--impl")).name
    if VARIANT == "lru_most_recent_first":
        raise ConformanceFailure("EVICT-POLICY", "the victim differs")
    if VARIANT == "parent_always_none":
        raise KeyError("adapter crashed")
    if VARIANT == "multi_lru_flat":
        if os.environ.get("KVSPEC_TEST_PIDFILE"):
            with open(os.environ["KVSPEC_TEST_PIDFILE"], "w") as f:
                f.write(str(os.getpid()))
        time.sleep(120)

def test_after():
    pass
"""


@pytest.fixture
def fake_suite(tmp_path: Path) -> Path:
    """A stand-in for the conformance suite whose verdict depends on the variant."""
    suite = tmp_path / "fake_suite"
    suite.mkdir()
    (suite / "test_fake.py").write_text(textwrap.dedent(FAKE_SUITE))
    return suite


@pytest.mark.parametrize("forked", [False, True], ids=["fresh_process", "fork_server"])
def test_campaign_runner_classifies_runs(fake_suite: Path, forked: bool) -> None:
    suite = fake_suite
    timeouts = {"multi_lru_flat": 3.0}
    pool = ServerPool(2, ["kvspec.conformance.verdicts.failures"], cwd=suite.parent) if forked else None

    def one(name: str) -> campaign.SuiteRun:
        server = pool.acquire() if pool is not None else None
        try:
            return campaign.run_suite(name, suite=suite, timeout=timeouts.get(name, 120.0), server=server)
        finally:
            if pool is not None and server is not None:
                pool.release(server)

    t0 = time.monotonic()
    try:
        runs = {
            r.name: r
            for r in campaign.run_many(
                ["lru_most_recent_first", "parent_always_none", UNMUTATED, "multi_lru_flat"], one, jobs=2
            )
        }
    finally:
        if pool is not None:
            pool.close()
    assert time.monotonic() - t0 < 100
    if forked:  # the server reports each forked run's CPU time
        assert all(r.cpu is not None and r.cpu > 0 for r in runs.values() if r.status != "timeout")

    killed = runs["lru_most_recent_first"]
    assert (killed.status, killed.rule, killed.test) == ("killed", "EVICT-POLICY", "test_fake::test_the_one")
    crash = runs["parent_always_none"]
    assert (crash.status, crash.rule) == ("killed", None)
    assert "KeyError" in crash.detail
    assert runs[UNMUTATED].status == "passed"  # the xfail did not count
    hang = runs["multi_lru_flat"]
    assert hang.status == "timeout" and hang.seconds < 60

    table = campaign.format_table(list(runs.values()), {"lru_most_recent_first": "EVICT-POLICY"})
    assert re.search(r"lru_most_recent_first\s+killed\s+[\d.]+\s+([\d.]+|-)\s+EVICT-POLICY", table)
    assert re.search(r"none\s+SURVIVED", table)
    lines = campaign.summary(list(runs.values()))
    assert lines[0] == "killed 2/4 mutants"
    assert any(ln.startswith("time to kill: median") for ln in lines)


def test_junit_without_failures_or_broken_is_not_a_kill(tmp_path: Path) -> None:
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite><testcase classname="conformance.test_x" name="t1">'
        '<skipped type="pytest.xfail" message="expected deviation EVICT-POLICY"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert campaign.first_failure(xml) is None
    assert campaign.classify("m", 1, xml, "out", 1.0).status == "error"
    assert campaign.classify("m", 1, tmp_path / "missing.xml", "out", 1.0).status == "error"
    assert campaign.classify("m", 2, xml, "collection error", 1.0).status == "error"
    assert campaign.rule_in("boom [NOT-A-RULE] then [STORE-NO-DUP] x") == "STORE-NO-DUP"
    assert campaign.rule_in("ConformanceFailure: [COUNTERS] scenario diverged") == "COUNTERS"
    assert campaign.rule_in("[ok] [Errno 2] no rule") is None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_leaves_no_suite_process_behind(fake_suite: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "suite.pid"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvspec",
            "mutants",
            "--suite",
            str(fake_suite),
            "--only",
            "multi_lru_flat",
            "--skip-sanity",
            f"--kvspec-dir={tmp_path / 'wd'}",
        ],
        env={**os.environ, "KVSPEC_TEST_PIDFILE": str(pidfile)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pidfile.exists(), "the suite run never started"
        child = int(pidfile.read_text())
        assert _alive(child)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in err
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the suite's pytest process outlived kvspec mutants"


def test_a_kill_under_a_profile_the_mutant_leaves_alone_is_not_credited() -> None:
    scen = {"deref_unknown": "kvbm", "failed_use_keeps_blocks": "legacy", "stringent_lifecycle_lineage": "kvbm"}
    k = campaign.SuiteRun
    legacy_only = MUTANTS["legacy_destroy_silent"].profiles
    false = campaign.credit(
        k("m", "killed", 1.0, "test_stateful::test_lockstep[kvbm]", "REMOVE-NO-ORPHAN"), legacy_only, scen
    )
    assert false.status == "false_kill" and "kvbm" in false.detail
    assert (
        campaign.credit(
            k("m", "killed", 1.0, "test_stateful::test_lockstep[legacy]", "REMOVE-EXACT"), legacy_only, scen
        ).status
        == "killed"
    )
    # golden scenarios: the profile comes from the scenario file (pytest may suffix duplicate ids)
    assert (
        campaign.credit(
            k("m", "killed", 1.0, "test_golden::test_golden_scenario[stringent_lifecycle_lineage0]"), legacy_only, scen
        ).status
        == "false_kill"
    )
    assert (
        campaign.credit(
            k("m", "killed", 1.0, "test_golden::test_golden_scenario[failed_use_keeps_blocks]"), legacy_only, scen
        ).status
        == "killed"
    )
    # one policy's run of a multi-policy scenario, named FOLDER/NAME@POLICY
    scen["kvbm/deref_unknown"] = "kvbm"
    assert (
        campaign.credit(
            k("m", "killed", 1.0, "test_golden::test_golden_scenario[kvbm/deref_unknown@lru]"), legacy_only, scen
        ).status
        == "false_kill"
    )
    # a test that names no profile is credited
    assert campaign.credit(k("m", "killed", 1.0, "test_x::test_y"), legacy_only, scen).status == "killed"
    assert "FALSE-KILL" in campaign.format_table([false], {})
    assert any("not a kill" in ln for ln in campaign.summary([false]))


def test_fork_server_preloads_what_the_suite_imports_but_not_its_tests() -> None:
    mods = suite_imports(campaign.suite_dir())
    assert "kvspec.conformance.block.scenario_runner" in mods and "hypothesis" in mods
    assert not [m for m in mods if m.rsplit(".", 1)[-1].startswith("test_")]  # pytest must rewrite those itself


def test_log_dir_keeps_output_and_report(fake_suite: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    r = campaign.run_suite("lru_most_recent_first", suite=fake_suite, timeout=120, log_dir=logs)
    assert r.status == "killed"
    assert "EVICT-POLICY" in (logs / "lru_most_recent_first" / "pytest.log").read_text()
    assert campaign.first_failure(logs / "lru_most_recent_first" / "junit.xml") is not None


# ------------------------------------------------------- the [[variants]] format


def _manifest(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "adapter"
    d.mkdir(exist_ok=True)
    (d / "manifest.toml").write_text(textwrap.dedent(body))
    return d


SUBPROCESS_WITH_VARIANTS = """
    name = "port"
    kind = "subprocess"
    profile = "kvbm"

    [start]
    command = ["{python}", "-m", "port"]

    [[variants]]
    name = "evicts_newest"
    rule = "EVICT-POLICY"
    description = "evicts the newest inactive block"
    needs = ["policy:lru"]
"""


def test_a_subprocess_variant_is_an_argv_of_its_command(tmp_path: Path) -> None:
    d = _manifest(tmp_path, SUBPROCESS_WITH_VARIANTS)
    plain = load_manifest(d)
    assert plain.start.command == ["{python}", "-m", "port"] and plain.variant is None
    adapter_dir, chosen = load_impl(str(d / "evicts_newest"))
    assert adapter_dir == d.resolve() and chosen.variant == "evicts_newest"
    assert chosen.start.command == ["{python}", "-m", "port", "--variant", "evicts_newest"]
    assert chosen.variant_profiles(chosen.variants[0]) == ["kvbm"]  # no profiles: every profile it runs


def test_a_c_abi_variant_is_a_compile_flag(tmp_path: Path) -> None:
    body = SUBPROCESS_WITH_VARIANTS.replace('kind = "subprocess"', 'kind = "c_abi"').replace(
        'command = ["{python}", "-m", "port"]', 'sources = ["port.c"]'
    )
    _, chosen = load_impl(str(_manifest(tmp_path, body) / "evicts_newest"))
    assert chosen.start.cflags[-1] == "-DKVSPEC_VARIANT_evicts_newest=1"


TOP = "top"  # the edit goes before the first table (a top-level key)


@pytest.mark.parametrize(
    ("where", "edit", "message"),
    [
        (
            TOP,
            lambda s: s + "variants = true\n",
            r"(?s)`variants = true` is no longer accepted.*table",
        ),
        (TOP, lambda s: s + 'variant = "evicts_newest"\n', "chosen with --impl=DIR/NAME"),
        ("", lambda s: s.replace('"evicts_newest"', '"Evicts-Newest"'), "must be snake_case"),
        ("", lambda s: s.replace('"EVICT-POLICY"', '"NO-SUCH-RULE"'), "rule"),
        (
            "",
            lambda s: s.replace('needs = ["policy:lru"]', 'needs = ["warp_drive"]'),
            "unknown capability 'warp_drive'",
        ),
        ("", lambda s: s.replace('needs = ["policy:lru"]', 'profiles = ["legacy"]'), "legacy not run by this adapter"),
        ("", lambda s: s + s[s.index("[[variants]]") :], "declared twice: evicts_newest"),
    ],
)
def test_bad_variant_declarations_are_refused_by_name(tmp_path: Path, where: str, edit: Any, message: str) -> None:
    body = textwrap.dedent(SUBPROCESS_WITH_VARIANTS)
    if where == TOP:
        head, _, rest = body.partition("[start]")
        if "variants = true" in edit(""):  # the old flag, in place of the tables
            rest = rest[: rest.index("[[variants]]")]
        body = edit(head) + "[start]" + rest
    else:
        body = edit(body)
    with pytest.raises(ConfigError, match=message):
        load_manifest(_manifest(tmp_path, body))


def test_kvspec_mutants_runs_any_folders_variants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _manifest(tmp_path, SUBPROCESS_WITH_VARIANTS)
    assert cli_main(["mutants", "--impl", str(d), "--list"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^evicts_newest\s+kvbm\s+EVICT-POLICY\s+evicts the newest", out, re.M)
    assert "1 mutants" in out
    assert cli_main(["mutants", "--impl", "adapters/reference", "--list"]) == 2
    assert "declares no [[variants]]" in capsys.readouterr().err


def test_the_campaign_names_each_variant_of_the_folder_it_was_given(tmp_path: Path) -> None:
    d = tmp_path / "zoo"
    cmd = campaign.pytest_command("evicts_newest", tmp_path, tmp_path / "j.xml", tmp_path / "r", "ci", d)
    assert f"--impl={d / 'evicts_newest'}" in cmd
    sanity = campaign.pytest_command(campaign.UNMUTATED, tmp_path, tmp_path / "j.xml", tmp_path, "ci", d)
    assert f"--impl={d}" in sanity
