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
    from kvspec.reference.smt.cli.equivalence import BIND_ROW, BOUNDS, EQUIV_ROWS, ORDER_ROW
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
    assert ORDER_ROW == "EQUIV-ORDER" and ORDER_ROW in {r.value for r in RuleId}
    assert set(EQUIV_ROWS) == set(BOUNDS)
    progress = {"PROGRESS-NO-DEADLOCK", "PROGRESS-USE-FITS", "PROGRESS-QUARANTINE"}
    assert {*EQUIV_ROWS.values(), BIND_ROW, *progress} <= {r.value for r in RuleId}
    assert BIND_ROW == "BIND-VLLM-STEPS"


#: the states a refusing model's walk visits: the initial one and the first few after it
REFUSING_STATES = 3


@pytest.mark.parametrize("profile", ["kvbm", "legacy", "atomic"])
def test_block_progress_holds_and_a_refusing_model_violates_it(profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """PROGRESS-NO-DEADLOCK for the block profiles: holds at depth 1 (checked on the walk of
    test_smt_equivalence.py's test_blocks_equal_at_depth_1, the same walk); a model whose every
    Deref is refused violates it. The first state that holds a block (after the first Use) shows
    it, so the walk stops after the first states (``max_states``): the whole depth-1 walk sends
    every state's operations to z3 and costs 3-5 times as much for the same finding."""
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
    rep = explore(BlocksSubject(profile), 1, first=False, max_states=REFUSING_STATES)
    assert any(v.startswith("PROGRESS-NO-DEADLOCK") for v in rep.progress_violations)


@pytest.mark.parametrize("policy", ["lru", "multi_lru", "lineage"])
def test_policy_order_encodings_equal_the_policies(policy: str) -> None:
    """EQUIV-ORDER: every state of 4 entries the Python policy reaches, both ways, the walk closed."""
    from kvspec.reference.smt.order.policy_equivalence import PolicyOrderSubject

    rep = explore(PolicyOrderSubject(policy), 12)
    assert rep.equal and rep.closed, [d.render() for d in rep.differences]


def test_lineage_parent_known_only_once_inserted() -> None:
    """A ghost made for a missing parent knows no grandparent: with 0 and 3 in the pool (1 never
    inserted) the policy evicts 0. The encoding once read ancestry through the constant forest
    and refused; here both sides give 0."""
    from kvspec.reference.smt.order.policy_equivalence import PolicyOrderSubject, PolicyWalkNode

    sub = PolicyOrderSubject("lineage")
    [n] = sub.initial()
    for op in [("insert", 0, 0), ("insert", 3, 0)]:
        [(_, n)] = [(o, m) for o, m in sub.model_outcomes(n, op)]
        assert isinstance(n, PolicyWalkNode)
    assert {o[1] for o in sub.encoding_outcomes(n, ("evict",)) if isinstance(o, tuple)} == {0}
    assert [o[1] for o, _ in sub.model_outcomes(n, ("evict",)) if isinstance(o, tuple)] == [0]


@pytest.mark.parametrize(
    ("policy", "bug", "depth"),
    [
        ("lru", "lru-newest-first", 3),
        ("multi_lru", "multi-lru-hottest-first", 3),
        ("lineage", "lineage-newest-leaf", 3),
        ("vllm-free", "vllm-release-at-head", 4),
    ],
)
def test_policy_bugs_differ(policy: str, bug: str, depth: int) -> None:
    from kvspec.reference.smt.order.policy_equivalence import PolicyOrderSubject

    rep = explore(PolicyOrderSubject(policy, bug=bug), depth)
    assert rep.differences, bug


@pytest.mark.slow
def test_vllm_free_queue_equals_the_pool() -> None:
    from kvspec.reference.smt.order.policy_equivalence import PolicyOrderSubject

    rep = explore(PolicyOrderSubject("vllm-free"), 8)
    assert rep.equal and rep.closed, [d.render() for d in rep.differences]
