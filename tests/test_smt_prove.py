"""The inductive proofs: every invariant and lemma holds initially and is
kept by every transition, at a small bound in detail and at the default
bound through ``kvspec prove`` (the CLI runs in CI this way)."""

from __future__ import annotations

import pytest

from kvspec.cli import main as kvspec_main
from kvspec.reference.smt.invariants import ALL_PROPERTIES, INVARIANTS, by_id
from kvspec.reference.smt.prover import check_enabled, check_rules_reachable, prove
from kvspec.reference.smt.universe import Bound
from kvspec.spec.rules import RULES, Concern

SMALL = Bound(3, 5)


def test_every_invariant_id_of_the_catalogue_is_proven_here() -> None:
    catalogue = {str(r.id) for r in RULES.values() if r.concern == Concern.INVARIANT}
    # the allocator-level invariants have their own encodings (tests/test_manager_profiles.py)
    catalogue -= {"INV-PAGED-REFS", "INV-SESSION-FENCE", "INV-VLLM-COPIES"}
    assert catalogue == {str(p.id) for p in INVARIANTS}


def test_all_proven_at_a_small_bound() -> None:
    results = prove(SMALL)
    assert [r.property_id for r in results] == [p.id for p in ALL_PROPERTIES]
    bad = [r.counterexample.render() if r.counterexample else r.property_id for r in results if not r.proven]
    assert not bad, "\n\n".join(bad)


def test_symmetry_reduction_loses_nothing() -> None:
    """Fixing the chosen slots (and G2 victim) by symmetry proves the same as
    leaving every choice free."""
    free = prove(SMALL, symmetry=False)
    assert all(r.proven for r in free)
    from kvspec.reference.smt.mutants import mutant

    for name in ("release-at-enqueue", "swapin-registers-present"):
        m = mutant(name)
        reduced = prove(SMALL, props=[by_id(m.expect)], applier=m.applier, symmetry=True)[0]
        unreduced = prove(SMALL, props=[by_id(m.expect)], applier=m.applier, symmetry=False)[0]
        assert not reduced.proven and not unreduced.proven


def test_no_valid_operation_lacks_a_successor_and_every_rule_fires() -> None:
    assert check_enabled(SMALL) == []
    assert check_rules_reachable(SMALL) == []


@pytest.mark.parametrize(
    ("prop", "lemma"),
    [
        ("INV-ROUTER-MATCH", "INV-NO-DUP"),
        ("INV-ANCHOR", "LEMMA-SWAPIN-PARENT-HELD"),
        ("INV-ANCHOR", "LEMMA-ONBOARD-ANCHOR"),
        ("INV-CONSERVE", "INV-OWNERS"),
    ],
)
def test_strengthening_lemma_is_needed(prop: str, lemma: str) -> None:
    """Without the lemma in the inductive hypothesis the invariant is not
    inductive (spec/INVARIANTS.md lists these)."""
    without = [p for p in ALL_PROPERTIES if str(p.id) != lemma]
    r = prove(SMALL, props=[by_id(prop)], assume=without)[0]
    assert not r.proven and r.counterexample is not None
    assert prove(SMALL, props=[by_id(prop)])[0].proven


def test_only_the_anchor_needs_the_caller_contracts() -> None:
    """Without ASSUME-* every invariant but INV-ANCHOR (and the lemmas about
    the swap-in's parent it rests on) is still inductive."""
    from kvspec.reference.smt.prover import contract_free

    free = contract_free(SMALL)
    needs = {str(p.id) for p in ALL_PROPERTIES} - free
    assert needs == {"INV-ANCHOR", "LEMMA-SWAPIN-PARENT-HELD", "LEMMA-ONBOARD-ANCHOR"}


def test_a_lone_invariant_can_fail_to_be_inductive() -> None:
    """INV-ANCHOR assumed alone is not inductive: the prover finds a pre-state
    where a swap-in's parent is gone, which the lemmas rule out."""
    r = prove(SMALL, props=[by_id("INV-ANCHOR")], assume=[by_id("INV-ANCHOR")])[0]
    assert not r.proven and r.counterexample is not None
    assert r.counterexample.transition in ("swapin_register", "use(full)", "promote")


def test_kvspec_prove_at_the_default_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvspec_main(["prove"]) == 0
    out = capsys.readouterr().out
    assert "8 slots, 12 hashes" in out
    for p in ALL_PROPERTIES:
        line = next(ln for ln in out.splitlines() if ln.startswith(str(p.id) + " "))
        assert " proven " in line
    assert "SANITY-ENABLED" in out and "FAILED" not in out


def test_kvspec_prove_reports_a_mutant_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    code = kvspec_main(
        [
            "prove",
            "--slots",
            "3",
            "--hashes",
            "4",
            "--mutant",
            "device-removed-at-completion",
            "--invariant",
            "INV-ROUTER-MATCH",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "counterexample" in out and "COUNTEREXAMPLE to INV-ROUTER-MATCH" in out
    assert "pre-state" in out and "transition:" in out and "post-state" in out


def test_kvspec_prove_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvspec_main(["prove", "--slots", "0"]) == 2
    assert kvspec_main(["prove", "--invariant", "INV-NOPE"]) == 2
    assert "unknown invariant" in capsys.readouterr().err
