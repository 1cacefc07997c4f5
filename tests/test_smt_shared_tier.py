"""z3 rows of the shared G3 tier (smt/tiers/shared.py): proven, not vacuous, mutants refuted."""

from __future__ import annotations

from kvspec.reference.smt.tiers.shared import MUTANTS, prove_shared_tier


def test_shared_tier_invariants_proven_and_every_mutant_refuted() -> None:
    rows = {r.name: r for r in prove_shared_tier()}
    assert rows["TIER-ADMIT"].verdict == "proven"
    assert rows["TIER-DEDUP"].verdict == "proven"
    assert rows["SANITY-TIER-FIRES"].ok
    for m in MUTANTS:
        r = rows[f"mutant {m}"]
        assert r.ok and r.verdict.startswith("refuted"), (m, r.verdict)
    assert rows["mutant pending_ignored"].verdict == "refuted (TIER-DEDUP)"


def test_a_bound_too_small_to_fly_two_copies_cannot_refute_the_dedup_mutant() -> None:
    """Why the default G3 has three blocks: with two, a copy in flight counts
    twice against the room, so two copies never fly at once and a presence
    filter that ignores other workers' copies looks harmless."""
    rows = {r.name: r for r in prove_shared_tier(capacity=2)}
    assert rows["TIER-DEDUP"].verdict == "proven"
    assert rows["mutant pending_ignored"].verdict == "NOT REFUTED"
