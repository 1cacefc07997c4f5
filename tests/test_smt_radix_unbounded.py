"""The INV-RADIX-* for any number of pages, tokens and locks (reference/smt/radix/unbounded.py).

Every invariant and the lock-path lemma is proven inductive over
uninterpreted sorts of pages and lock handles; the proofs are not vacuous
(the invariants hold of a rich finite state, every step is enabled and every
sub-case possible in a finite state), and every mutant of the bounded radix
encoding is refuted in this one too: its invariant is no longer proven and
a finite counterexample is found.
"""

from __future__ import annotations

import pytest
import z3

from kvspec.reference.smt.cli.prove import main
from kvspec.reference.smt.radix import unbounded as U  # noqa: N812  (U for unbounded, as in the module)
from kvspec.reference.smt.radix import unbounded_models as M  # noqa: N812  (M for models)
from kvspec.reference.smt.radix.encoding import INVARIANTS as BOUNDED_INVARIANTS
from kvspec.reference.smt.radix.steps import MUTANTS


def test_every_radix_invariant_and_the_lemma_are_proven_for_any_size() -> None:
    results = U.prove_radix_unbounded()
    assert {r.property_id for r in results} == {*BOUNDED_INVARIANTS, U.LEMMA_ID}
    bad = {r.property_id: r.failed_at for r in results if r.verdict != "proven"}
    assert not bad, bad


def test_the_invariants_have_finite_models_where_every_step_and_case_fires() -> None:
    assert M.finite_sanity() == []


def test_a_contradictory_hypothesis_is_caught_by_the_finite_sanity_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # a contradiction hidden in the hypothesis would make every proof pass;
    # the finite-model check must then fail
    def narrowed(S: U.UR) -> list[z3.BoolRef]:
        return [*U.hypothesis(S), S.free < 0]

    monkeypatch.setattr(M, "hypothesis", narrowed)
    problems = M.finite_sanity()
    assert any("no finite state with a branch" in p for p in problems), problems
    assert any("never enabled" in p for p in problems), problems


def test_a_step_that_changes_more_than_it_names_breaks_the_census_frame() -> None:
    # unlock claiming no handle changes: the lock census would silently go
    # stale; the frame obligation of INV-RADIX-LOCKS must refute it
    step = U.unlock(U.UR.fresh("pre_"), frozenset())
    step.hk = None
    assert U.check_step("INV-RADIX-LOCKS", U._finish(step), 10_000, seeds=(0,)) != z3.unsat


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_every_bounded_radix_mutant_has_a_finite_counterexample(name: str) -> None:
    m = MUTANTS[name]
    verdict, text = M.refute_finite(m.name, m.step, m.breaks)
    assert verdict == "refuted", (name, verdict)
    assert "before:" in text


@pytest.mark.parametrize("name", ["lock-node-only", "evict-locked", "split-forgets-parent"])
def test_a_mutant_no_longer_proves_its_invariant_unbounded(name: str) -> None:
    m = MUTANTS[name]
    (proof,) = U.prove_radix_unbounded(frozenset({name}), 10_000, only=[m.breaks], steps=[m.step], seeds=(0,))
    assert proof.verdict != "proven"
    assert any(f.startswith(m.step) for f in proof.failed_at), proof.failed_at


def test_cli_radix_unbounded_mutant_prints_its_finite_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "radix", "--unbounded", "--mutant", "lock-node-only", "--timeout", "3"]) == 1
    out = capsys.readouterr().out
    assert "MUTANT lock-node-only" in out and "finite counterexample" in out and "refuted" in out
    assert "INV-RADIX-TREE                        unbounded proven" in out
