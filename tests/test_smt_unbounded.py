"""The INV-* for any number of slots and hashes (reference/smt/unbounded/encoding.py).

Every invariant and lemma is proven inductive over an uninterpreted sort of
slots and unbounded hashes; the proofs are not vacuous (the hypothesis with
each step enabled has a finite model, every rule fires in one, the ghost
forms imply the plain statements), and every mutant of the bounded encoding,
written for this one, is refuted with a finite counterexample (a model of
the quantified hypothesis, the step and the broken invariant).
"""

from __future__ import annotations

import pytest
import z3

from kvspec.reference.smt.offload.invariants import BOUNDED_ONLY_INVARIANTS, INVARIANTS
from kvspec.reference.smt.offload.mutants import BOUNDED_ONLY
from kvspec.reference.smt.offload.mutants import MUTANTS as BOUNDED_MUTANTS
from kvspec.reference.smt.unbounded import encoding as U  # noqa: N812  (U for unbounded, as in the module's notation)
from kvspec.reference.smt.unbounded import models as M  # noqa: N812  (M for models)


def test_every_invariant_and_lemma_is_proven_for_any_size() -> None:
    results = U.prove_unbounded(timeout_ms=120_000)
    assert {str(p.id) for p in INVARIANTS} - set(BOUNDED_ONLY_INVARIANTS) <= {r.property_id for r in results}
    bad = {r.property_id: r.failures for r in results if not r.proven}
    assert not bad, bad


def test_the_ghost_forms_imply_the_plain_statements() -> None:
    assert U.ghost_checks() == []


def test_the_hypothesis_has_finite_models_where_every_rule_fires() -> None:
    assert M.finite_sanity() == []


def test_a_narrowed_hypothesis_is_caught_by_the_sanity_check() -> None:
    # a contradiction hidden in the census facts would make every proof pass;
    # the finite-model check must then fail
    def contradictory(S: U.UState) -> list[z3.BoolRef]:
        return [*U.census_facts(S, "fi_"), S.cnt(U.FREE) == S.n + 1]

    r, _ = M.finite_check(contradictory)
    assert r == z3.unsat


def test_the_unbounded_mutants_are_the_bounded_ones() -> None:
    shared = [m for m in BOUNDED_MUTANTS if m.name not in BOUNDED_ONLY]
    assert [m.name for m in U.MUTANTS] == [m.name for m in shared]
    assert [m.expect for m in U.MUTANTS] == [str(m.expect) for m in shared]


@pytest.mark.parametrize("m", U.MUTANTS, ids=[m.name for m in U.MUTANTS])
def test_mutant_is_refuted_unbounded(m: U.UMutant) -> None:
    verdict, where = M.refute_finite(m)
    # a finite state satisfying every invariant and lemma of the unbounded
    # encoding, from which the mutant's step breaks its invariant
    assert verdict == "refuted" and where is not None


def test_cli_reports_unbounded_rows(capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.reference.smt.cli.prove import main

    assert main(["--unbounded", "--no-sanity"]) == 0
    out = capsys.readouterr().out
    assert "any G1 capacity, any number of block hashes" in out
    for p in (p for p in INVARIANTS if str(p.id) not in BOUNDED_ONLY_INVARIANTS):
        assert any(line.startswith(str(p.id)) and "unbounded proven" in line for line in out.splitlines()), p.id


def test_cli_mutant_exits_non_zero_with_a_finite_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.reference.smt.cli.prove import main

    args = ["--unbounded", "--mutant", "evict-active", "--invariant", "INV-CONSERVE", "--timeout", "2"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "finite counterexample" in out and "refuted" in out and "at use(full)" in out


def test_the_unbounded_encoding_takes_the_bounded_encodings_steps() -> None:
    from kvspec.reference.smt.unbounded.agreement import disagreements

    assert disagreements() == []


def test_the_agreement_check_catches_a_broken_unbounded_rule() -> None:
    from kvspec.reference.smt.unbounded.agreement import disagreements

    found = disagreements(tw=frozenset({"release-at-enqueue"}))
    assert {p.split(":")[0] for p in found} == {"use(full)", "use(partial)", "evict"}, found
