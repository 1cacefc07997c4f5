"""The vllm operation-level encoding agrees with the Python model
(``reference/smt/profile_vllm_agreement.py``), and each encoding mutant
(parent, copy count, all-or-nothing) is caught within the measured budget."""

from __future__ import annotations

import pytest

from kvspec.reference.smt import profile_vllm_agreement as ag
from kvspec.reference.smt.profile_vllm_ops import MUTANTS


@pytest.mark.parametrize("seed", [0, 1])
def test_the_encoding_makes_every_move_of_the_model(seed: int) -> None:
    at, seen = ag.first_mismatch(seed, ag.SPEC_OPS)
    assert at is None
    assert seen["ok"] >= ag.SPEC_OPS * 3 // 4  # most operations are compared, not skipped


def test_every_agreement_mutant_is_an_encoding_mutant_of_its_kind() -> None:
    kinds = {MUTANTS[m][0] for m in ag.AGREEMENT_MUTANTS}
    assert kinds == {"PARENT-ANCHOR", "STORE-COPY", "REMOVE-COPY", "USE-CAPACITY"}


@pytest.mark.parametrize("mutant", ag.AGREEMENT_MUTANTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_encoding_mutant_is_caught_within_the_budget(mutant: str, seed: int) -> None:
    at, _ = ag.first_mismatch(seed, ag.BUDGET, frozenset({mutant}))
    assert at is not None, f"{mutant} not caught in {ag.BUDGET} operations at seed {seed}"
