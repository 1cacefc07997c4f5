"""The eviction-order rows (ORDER-*) and the radix recency equivalence (EQUIV-RADIX)."""

from __future__ import annotations

import pytest

from kvspec.reference.radix import RadixModel
from kvspec.reference.smt.equivalence import explore
from kvspec.reference.smt.order.encoding import POLICIES, ROW, STAMPS, mutants_of, prove, refute, sanity
from kvspec.reference.smt.order.radix_equivalence import LeafTimeZero, RadixOrderSubject


@pytest.mark.parametrize("policy", POLICIES)
def test_order_rows_are_proven_and_not_vacuous(policy: str) -> None:
    proofs = prove(policy)
    assert {p.row for p in proofs} == {STAMPS, ROW[policy]}
    assert all(p.verdict == "proven" for p in proofs), [(p.row, p.step, p.verdict) for p in proofs]
    assert sanity(policy) == []


@pytest.mark.parametrize(("policy", "mutant"), [(p, m) for p in POLICIES for m in mutants_of(p)])
def test_every_order_mutant_is_refuted_at_its_row(policy: str, mutant: str) -> None:
    where = refute(policy, mutant)
    assert where is not None
    assert ("ORDER-STAMPS" in where) == (mutant in ("insert-stamp-zero", "touch-keeps-stamp")), where


def test_the_row_ids_are_the_spec_ones() -> None:
    assert sorted(ROW.values()) == [
        "ORDER-LINEAGE",
        "ORDER-LRU",
        "ORDER-MULTI-LRU",
        "ORDER-RADIX-LRU",
        "ORDER-VLLM-FREE",
    ]


def test_radix_model_and_order_encoding_agree_at_depth_3() -> None:
    rep = explore(RadixOrderSubject(RadixModel), 3)
    assert rep.equal and rep.complete and rep.states > 20  # EQUIV-RADIX


def test_new_radix_leaf_with_time_zero_is_caught() -> None:
    """The escape of issue 24: it agreed with the sampled radix agreement over 300 operations."""
    rep = explore(RadixOrderSubject(LeafTimeZero), 3)
    assert rep.differences and len(rep.differences[0].trace) + 1 == 2


@pytest.mark.parametrize("mutant", ["order-reversed", "touch-keeps-stamp", "radix-evicts-locked"])
def test_radix_order_mutants_differ_from_the_model(mutant: str) -> None:
    rep = explore(RadixOrderSubject(RadixModel, mutant=mutant), 4)
    assert rep.differences, mutant


def test_the_equivalence_rows_are_catalogue_rules() -> None:
    """The ids `kvspec equivalence` prints are rules of SPEC.md (each profile its own row)."""
    from kvspec.reference.smt.cli.equivalence import BIND_ROW, BOUNDS, EQUIV_ROWS
    from kvspec.spec.rules import RuleId

    assert EQUIV_ROWS == {
        "kvbm-offload": "EQUIV-KVBM-OFFLOAD",
        "vllm": "EQUIV-VLLM",
        "kvbm": "EQUIV-KVBM",
        "legacy": "EQUIV-LEGACY",
        "atomic": "EQUIV-ATOMIC",
        "radix": "EQUIV-RADIX",
        "paged": "EQUIV-PAGED",
        "session": "EQUIV-SESSION",
    }
    assert set(EQUIV_ROWS) == set(BOUNDS)
    progress = {"PROGRESS-NO-DEADLOCK", "PROGRESS-USE-FITS", "PROGRESS-QUARANTINE"}
    assert {*EQUIV_ROWS.values(), BIND_ROW, *progress} <= {r.value for r in RuleId}
    assert BIND_ROW == "BIND-VLLM-STEPS"


@pytest.mark.parametrize("profile", ["kvbm", "legacy", "atomic"])
def test_block_progress_holds_and_a_refusing_model_violates_it(profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """PROGRESS-NO-DEADLOCK for the block profiles: holds at depth 1 (checked on the walk of
    test_smt_equivalence.py's test_blocks_equal_at_depth_1, the same walk); a model whose every
    Deref is refused violates it."""
    from kvspec.reference.smt.blocks.equivalence import BlocksSubject
    from kvspec.spec.errors import InvalidOperation
    from kvspec.spec.rules import rid

    model = type(BlocksSubject(profile).initial()[0].model)
    orig = model.apply

    def refuse(self: object, op: object) -> object:
        if getattr(op, "op", None) == "deref":
            raise InvalidOperation(rid("DEREF-UNKNOWN"), "seeded: every Deref refused")
        return orig(self, op)

    monkeypatch.setattr(model, "apply", refuse)
    rep = explore(BlocksSubject(profile), 1, first=False)
    assert any(v.startswith("PROGRESS-NO-DEADLOCK") for v in rep.progress_violations)
