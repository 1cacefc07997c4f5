"""The z3 encoding and the Python model agree, operation by operation.

Random operation sequences (Hypothesis) and every witness scenario run
through ``reference.g1.G1Model`` and the encoding side by side
(``reference.smt.offload.agreement.EncodingLockstep``): after each operation the abstract
states, results, counters, events and router views must be equal, and a
rejection must be a rejection with the same rule on both sides. A broken
encoding must be caught, so the comparison itself is tested too.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.reference.smt.offload import ops as smt_ops
from kvspec.reference.smt.offload.agreement.sampled import (
    POLICY_NAMES,
    EncodingLockstep,
    Universe,
    deref_op,
    promote_op,
    swap_in_op,
    use_op,
)
from kvspec.reference.smt.witnesses import WITNESS_DIR, universe_of
from kvspec.spec.config import PolicyName
from kvspec.spec.scenario import all_scenarios
from kvspec.spec.wire import Tick

FOREST = (-1, 0, 1, 0, -1, 4, 5)  # 0 <- 1 <- 2, 0 <- 3, 4 <- 5 <- 6


def _op(data: st.DataObject, ls: EncodingLockstep) -> Any:
    u = ls.universe
    model = ls.model
    kind = data.draw(st.sampled_from(["use", "use", "use", "deref", "deref", "promote", "tick", "tick", "swap_in"]))
    uuids = [f"u{i}" for i in range(u.slots)]
    if kind == "use":
        h = data.draw(st.sampled_from(range(len(u.par))))
        chain = u.chain(h)
        start = data.draw(st.integers(0, len(chain) - 1))
        blocks: list[int | str] = [*chain[start:][:3]]
        if data.draw(st.booleans()):
            blocks.append(data.draw(st.sampled_from(uuids)))
        parent = chain[start - 1] if start > 0 else None
        if data.draw(st.integers(0, 9)) == 0:  # now and then a parent that is not the block before
            parent = data.draw(st.sampled_from([None, *range(len(u.par))]))
        return use_op(u, blocks, parent)
    if kind == "deref":
        held: list[int | str] = [h for h, n in model.owners().items() for _ in range(n)] + list(model.partial)
        pool: list[int | str] = held if held and bool(data.draw(st.integers(0, 5))) else [*range(len(u.par)), *uuids]
        return deref_op(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3)))
    if kind == "promote":
        partials: list[str] = list(model.partial) or uuids
        return promote_op(u, data.draw(st.sampled_from(partials)), data.draw(st.sampled_from(range(len(u.par)))))
    if kind == "tick":
        back = data.draw(st.integers(0, 7)) == 0
        return Tick(now_ms=max(0.0, ls.now - 1.0) if back else ls.now + data.draw(st.sampled_from([0.0, 1.0, 2.5])))
    h = data.draw(st.sampled_from(range(len(u.par))))
    chain = u.chain(h)
    start = data.draw(st.integers(0, len(chain) - 1))
    return swap_in_op(u, chain[start:][:3], chain[start - 1] if start > 0 else None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    slots=st.integers(2, 4),
    cap2=st.integers(1, 3),
    policy=st.sampled_from(POLICY_NAMES),
    data=st.data(),
)
def test_random_operation_sequences_agree(slots: int, cap2: int, policy: PolicyName, data: st.DataObject) -> None:
    ls = EncodingLockstep(Universe(slots, FOREST, cap2, policy))
    n = data.draw(st.integers(1, 25))
    for _ in range(n):
        op = _op(data, ls)
        mismatches = ls.step(op)
        assert not mismatches, "\n".join(str(m) for m in mismatches)


WITNESSES = all_scenarios(WITNESS_DIR) if WITNESS_DIR.exists() else []


@pytest.mark.parametrize(("path", "scenario"), WITNESSES, ids=[p.stem for p, _ in WITNESSES])
def test_witness_agrees_with_the_model(path: Any, scenario: Any) -> None:
    """Each witness, replayed through the model and the encoding (choices as
    the model makes them; the witness's own values come from the solver)."""
    ls = EncodingLockstep(universe_of(scenario))
    for i, step in enumerate(scenario.steps):
        mismatches = ls.step(step.op)
        assert not mismatches, f"step {i}: " + "\n".join(str(m) for m in mismatches)


def test_there_are_witnesses() -> None:
    assert len(WITNESSES) >= 4, "spec/scenarios/witnesses/ should hold the BMC witnesses (kvspec witnesses)"


def _known_sequence(u: Universe) -> list[Any]:
    # two slots: 1 goes inactive before 0, so LRU evicts 1 for block 4
    return [use_op(u, [0, 1]), deref_op([1, 0]), use_op(u, [4]), Tick(now_ms=1.0), use_op(u, [4])]


def test_the_comparison_catches_a_broken_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """An encoding whose LRU victim is the newest inactive block instead of the
    oldest disagrees with the model, and the lockstep says where."""
    u = Universe(2, FOREST, 2, "lru")
    assert EncodingLockstep(u).run(_known_sequence(u)) == []

    def newest(state: Any) -> Any:
        from kvspec.reference.smt.terms import argmin_where

        return argmin_where([state.st[k] == smt_ops.INACTIVE for k in state.slots], [-t for t in state.itick])

    monkeypatch.setattr(smt_ops, "lru_victim", newest)
    mismatches = EncodingLockstep(u).run(_known_sequence(u))
    assert mismatches, "a wrong victim must be noticed"
    assert any(m.what in ("events", "state") for m in mismatches)


# ------------------------------------------------------- caller contracts


def test_every_contract_a_transition_requires_has_a_witness() -> None:
    from kvspec.reference.smt.contracts import CONTRACTS
    from kvspec.reference.smt.offload.catalogue import TRANSITIONS
    from kvspec.reference.smt.offload.state import Rigid, State
    from kvspec.reference.smt.universe import Bound

    bound = Bound(3, 4)
    required: set[str] = set()
    for spec in TRANSITIONS:
        step, _c, _d = spec.instantiate(State.fresh(bound, Rigid.fresh(bound), "p_"), "i_", "unordered")
        required |= set(step.contracts())
    assert required and required <= set(CONTRACTS), required - set(CONTRACTS)


@pytest.mark.parametrize("cid", ["ASSUME-PARENT-REGISTERED", "ASSUME-SWAPIN-PARENT-HELD"])
def test_a_contract_is_broken_only_by_the_callers_last_operation(cid: str) -> None:
    """The witness: the model accepts every operation and agrees with the
    encoding; every operation but the last keeps every contract; the last
    (the caller naming a parent it does not hold, or dropping the owner a
    pending swap-in needs) breaks this one."""
    from kvspec.reference.smt.contracts import CONTRACTS

    universe, ops = CONTRACTS[cid].witness()
    ls = EncodingLockstep(universe)
    for op in ops:
        assert ls.step(op) == []
    assert ls.contract_breaks == [(len(ops) - 1, cid)]


# ------------------------------------------- the seeded campaign's budget


def test_the_unmutated_encoding_agrees_over_the_campaigns_budget() -> None:
    """Every sequence of the budget (``agreement_campaign.plan``: each eviction
    policy in turn) agrees, and every contract break falls on an operation the
    caller flagged as misbehaving; the misbehaving caller does break contracts
    within the budget (so the check has something to see)."""
    from kvspec.reference.smt.offload.agreement.campaign import plan, sequence

    flagged = 0
    for seed, policy in plan():
        r = sequence(seed, policy)
        assert not r.mismatches, f"sequence {seed} ({policy}): " + "\n".join(str(m) for m in r.mismatches)
        assert not r.unflagged_breaks, f"sequence {seed} ({policy}): a well-behaved caller broke {r.unflagged_breaks}"
        flagged += len(r.flagged_breaks)
    assert flagged, "no misbehaving operation broke a contract within the budget"


def _encoding_mutants() -> list[Any]:
    from kvspec.reference.smt.offload.agreement.encoding_mutants import ENCODING_MUTANTS

    return ENCODING_MUTANTS


@pytest.mark.parametrize("m", _encoding_mutants(), ids=lambda m: m.name)
def test_each_encoding_mutant_is_caught_within_the_campaigns_budget(m: Any) -> None:
    """The budget is enough: with the seeded encoding bug installed, a sequence
    of ``plan(BUDGET)`` disagrees with the model (measured by
    benchmarks/agreement_budget.py). Deterministic: the plan's seeds are fixed."""
    from kvspec.reference.smt.offload.agreement.campaign import BUDGET, first_failure

    with m.installed():
        r = first_failure()
    assert r is not None, f"{m.name} ({m.kind}) was not caught in {BUDGET} sequences"
    assert r.mismatches, f"{m.name}: caught only by a contract break, not by a disagreement"


def test_the_encoding_mutants_cover_parents_and_recency() -> None:
    kinds = {m.kind for m in _encoding_mutants()}
    assert kinds == {"parent", "recency"}
