"""The vllm operation-level encoding agrees with the Python model
(``reference/smt/vllm/agreement.py``), and each encoding mutant
(parent, copy count, all-or-nothing) is caught within the measured budget."""

from __future__ import annotations

import pytest

from kvspec.reference.smt.vllm import agreement as ag
from kvspec.reference.smt.vllm.ops import MUTANTS
from kvspec.reference.vllm_pool import VllmPoolModel
from kvspec.spec.config import ManagerConfig
from kvspec.spec.wire import Deref, FullBlock, Plh, Use


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


def test_witness_a_parent_only_registered_is_removed_before_the_stored_that_names_it() -> None:
    """Why PARENT-ANCHOR needs the caller's parent held, not only registered
    (the mutant contract-registered-only): the model accepts a Use whose
    parent is a cached copy with no owner, evicts that copy for the Use's
    own block, and publishes its Removed before the Stored that names it.
    The agreement check counts that operation as the caller's break, not a
    comparison."""
    m = ag.Mirror(VllmPoolModel(ManagerConfig(profile="vllm", capacity=1, block_size=4, eviction="lru")))
    assert ag.compare(m, Use(blocks=[FullBlock(full=1)], plhs=[Plh(hash=1, parent=None, position=0)])) == "ok"
    assert ag.compare(m, Deref(blocks=[FullBlock(full=1)])) == "ok"
    child = Use(blocks=[FullBlock(full=2)], plhs=[Plh(hash=2, parent=1, position=1)], parent=FullBlock(full=1))
    seen = len(m.model.event_labels)
    assert ag.compare(m, child) == "skipped"
    assert m.router[1] == 0 and m.router[2] == 1  # the router saw 1 go, then 2 stored under 1
    assert len(m.model.event_labels) == seen + 2  # a Removed (of 1) and a Stored (of 2, parent 1)
