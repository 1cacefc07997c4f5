"""G3 and G4 shared by the workers of one process: the tier goldens on the model,
and single-bug variants of the model that each golden set must catch.

The goldens (spec/scenarios/tiers/) are hand-written from Dynamo's source
(SPEC.md, "Lower tiers"); ``reference.process_runner`` runs them on
``reference.process.Process``. The variants below are the bugs issue 25 names
(a duplicate accepted across workers, a G3 eviction published by the wrong
worker, an onboarding that skips G2, a put published before it completes),
planted in the model: each must make some golden fail, or the goldens do not
pin the rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kvspec.conformance.block.opener import open_implementation
from kvspec.conformance.block.scenario_runner import run_scenario
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.reference import g1 as g1_module
from kvspec.reference import lower_tiers
from kvspec.reference.g2_tier import G2Entry
from kvspec.reference.process import Process
from kvspec.reference.process_runner import run_process_scenario
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.process_scenario import ProcessScenario, tier_scenarios
from kvspec.spec.rules import Concern, rules_of
from kvspec.spec.scenario import SCENARIO_DIR, load_scenario

SCENARIOS = tier_scenarios()


@pytest.mark.parametrize(("path", "scenario"), SCENARIOS, ids=[p.stem for p, _ in SCENARIOS])
def test_tier_golden_on_the_model(path: Any, scenario: ProcessScenario) -> None:
    assert run_process_scenario(scenario) is None


def test_every_tier_rule_has_a_golden() -> None:
    covered = {r for _p, s in SCENARIOS for r in s.rules}
    missing = sorted(set(rules_of(Concern.TIERS)) - covered)
    assert not missing, f"tier rules without a golden: {missing}"


# ------------------------------------------------------------------ variants
class _DuplicateAccepted(lower_tiers.LowerTiers):
    """The presence filters look only at what a tier holds (not at copies in
    flight from other workers), and a tier accepts a block it already holds."""

    def _enqueue(self, worker: int, tier: str, entries: list[G2Entry]) -> None:
        pending = self.pending
        self.pending = {}
        try:
            super()._enqueue(worker, tier, entries)
        finally:
            for k, n in self.pending.items():
                pending[k] = pending.get(k, 0) + n
            self.pending = pending

    def _arrive(self, put: Any, e: G2Entry) -> None:
        if put.tier == "g3" and self.g3 is not None and e.seq in self.g3:
            self.g3.blocks.pop(e.seq)
            self.g3.pool.remove(e.seq)
        if put.tier == "g4":
            self.g4.pop(e.pid, None)
        super()._arrive(put, e)


class _HeldBlockSentAgain(lower_tiers.LowerTiers):
    """One worker's duplicate: the presence filter does not look at what the
    tier holds, and the tier stores (and announces) a block it holds."""

    def holds(self, tier: str, e: G2Entry) -> bool:
        return False

    def _arrive(self, put: Any, e: G2Entry) -> None:
        if put.tier == "g3" and self.g3 is not None and e.seq in self.g3:
            self.g3.blocks.pop(e.seq)
            self.g3.pool.remove(e.seq)
        super()._arrive(put, e)


class _EvictionByWrongWorker(lower_tiers.LowerTiers):
    """A G3 victim's disk Removed comes from the worker whose copy evicted it."""

    def _start_put(self, put: Any) -> None:
        self._evicting = put.worker
        super()._start_put(put)

    def _g3_evicted(self, seq: int) -> None:
        self.g3_owner[seq] = self._evicting
        super()._g3_evicted(seq)


class _PutPublishedAtStart(lower_tiers.LowerTiers):
    """A lower-tier copy is announced when it starts, not when it lands."""

    def _start_put(self, put: Any) -> None:
        super()._start_put(put)
        if self.config.lower_tier_events == "owner":
            for e in put.entries:
                self.workers[put.worker].tier_event(lower_tiers.EVENT_TIER[put.tier], "stored", e.seq, e)

    def _arrive(self, put: Any, e: G2Entry) -> None:
        events = self.config.lower_tier_events
        object.__setattr__(self.config, "lower_tier_events", "none")
        try:
            super()._arrive(put, e)
        finally:
            object.__setattr__(self.config, "lower_tier_events", events)


class _StagingSkipsG2(lower_tiers.LowerTiers):
    """A G3 or G4 hit is copied straight into G1: no G2 hop."""

    def deliver(self, worker: int) -> None:
        for _t, _i, payload in self.done.get(worker, []):
            if isinstance(payload, lower_tiers._Stage):
                w: Any = self.workers[worker]
                w.g2tier.admitted -= len(payload.entries)
                payload.job.stages -= 1
                if payload.job.stages == 0:
                    w._pending_tier_g2_events.extend(w._complete_onboard(payload.job))
        self.done[worker] = [d for d in self.done.get(worker, []) if not isinstance(d[2], lower_tiers._Stage)]
        super().deliver(worker)


@contextmanager
def _planted(cls: type[lower_tiers.LowerTiers]) -> Iterator[None]:
    import kvspec.reference.process as process_module

    saved = (process_module.LowerTiers, g1_module.LowerTiers)
    process_module.LowerTiers = cls  # type: ignore[misc]
    g1_module.LowerTiers = cls  # type: ignore[misc]
    try:
        yield
    finally:
        process_module.LowerTiers, g1_module.LowerTiers = saved  # type: ignore[misc]


@pytest.mark.parametrize(
    ("variant", "rule"),
    [
        (_DuplicateAccepted, "TIER-DEDUP"),
        (_EvictionByWrongWorker, "TIER-EVENTS"),
        (_PutPublishedAtStart, "TIER-EVENTS"),
        (_StagingSkipsG2, "TIER-ONBOARD"),
    ],
    ids=[
        "duplicate_accepted_across_workers",
        "g3_eviction_by_wrong_worker",
        "put_published_at_start",
        "onboard_skips_g2",
    ],
)
def test_each_planted_bug_fails_a_golden_of_its_rule(variant: type[lower_tiers.LowerTiers], rule: str) -> None:
    with _planted(variant):
        failed = [s.name for _p, s in SCENARIOS if rule in s.rules and run_process_scenario(s) is not None]
    assert failed, f"{variant.__name__}: no golden of {rule} fails"


def test_lower_tiers_need_the_shared_link_and_a_process_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="link = 'shared'"):
        OffloadConfig(num_g2_blocks=1, num_g3_blocks=1, link="fifo")
    cfg = ManagerConfig(capacity=1, offload=OffloadConfig(num_g2_blocks=1, g4=True))
    with pytest.raises(Exception, match="at least one worker"):
        Process(cfg, 0)
    p = Process(cfg, 2)
    assert p.workers[0].tiers is p.workers[1].tiers is p.tiers


REF_DIR = resolve_adapter_dir("adapters/reference")
SINGLE = sorted((SCENARIO_DIR / "offload").glob("tier_*.json"))


@pytest.mark.parametrize(
    "variant",
    [_HeldBlockSentAgain, _PutPublishedAtStart, _StagingSkipsG2],
    ids=["held_block_sent_again", "put_published_at_start", "onboard_skips_g2"],
)
def test_the_single_worker_tier_goldens_catch_a_planted_bug_through_the_adapter(
    variant: type[lower_tiers.LowerTiers],
) -> None:
    """The offload/tier_* goldens, run as the conformance suite runs them on the
    in-process reference adapter, pass unmutated and fail with the bug planted."""
    manifest = load_manifest(REF_DIR)
    assert SINGLE

    def failures() -> list[str]:
        out = []
        for path in SINGLE:
            s = load_scenario(path)
            with open_implementation(manifest, REF_DIR, s.config) as impl:
                try:
                    run_scenario(s, impl)
                except Exception as e:  # ConformanceFailure
                    out.append(f"{s.name}: {e}")
        return out

    assert failures() == []
    with _planted(variant):
        assert failures(), f"{variant.__name__}: no single-worker tier golden fails"
