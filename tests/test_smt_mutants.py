"""The proofs are not vacuous: every mutant of the rules is refuted.

Each mutant of reference/smt/offload/mutants.py breaks one rule the way an
implementation could; the prover must then fail on the invariant the mutant
names, with a counterexample (a pre-state satisfying every invariant and
lemma, a transition and its inputs, and the broken post-state). Each
counterexample is checked again without the solver, by evaluating the
mutant's transition on the concrete state, and against the correct rules,
which on the same state and inputs keep the invariant.
"""

from __future__ import annotations

import pytest

from kvspec.reference.smt.offload.mutants import MUTANTS, OffloadMutant, refute
from kvspec.reference.smt.prover import replay
from kvspec.reference.smt.universe import Bound

BOUND = Bound(3, 4)


@pytest.mark.parametrize("m", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_refuted_with_a_counterexample(m: OffloadMutant) -> None:
    [result] = refute(m, BOUND)
    assert result.property_id == m.expect
    assert not result.proven, f"mutant {m.name} should break {m.expect}, but the prover proved it"
    cex = result.counterexample
    assert cex is not None and cex.pre is not None, "a counterexample with a pre-state and a transition"
    text = cex.render()
    assert f"COUNTEREXAMPLE to {m.expect}" in text
    assert f"transition: {cex.transition}(" in text and "pre-state" in text and "post-state" in text
    assert cex.failed, "the broken conjuncts are named"
    # the counterexample is real: evaluated without z3's search, the mutant
    # takes a state satisfying every invariant to one that breaks m.expect
    before, enabled, after = replay(cex, m.applier)
    assert before and enabled and not after
    # and the correct rules, on the same state and inputs, keep the invariant
    # (or do not allow the step at all)
    before, enabled, after = replay(cex)
    assert before and (not enabled or after), f"the unmutated rules should not break {m.expect} here"


def test_the_mutant_catalogue_covers_every_invariant() -> None:
    from kvspec.reference.smt.offload.invariants import INVARIANTS

    covered = {m.expect for m in MUTANTS}
    assert {str(p.id) for p in INVARIANTS} <= {str(c) for c in covered}


def test_host_stored_parent_dropped_breaks_only_the_host_anchor() -> None:
    """INV-HOST-ANCHOR is its own row: a host-pinned Stored naming the root instead of its block's
    recorded parent keeps every other invariant and lemma (views are sets, G2 keeps its record)."""
    from kvspec.reference.smt.offload.mutants import mutant

    broken = {r.property_id for r in refute(mutant("host-stored-parent-dropped"), BOUND, only_expected=False)
              if not r.proven}  # fmt: skip
    assert broken == {"INV-HOST-ANCHOR"}
