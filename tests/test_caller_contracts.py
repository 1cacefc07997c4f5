"""The caller contracts (ASSUME-*) stated on the model, and the lockstep's hook.

``reference/caller_contracts.py`` states the contracts the proofs assume on
the model's state; the conformance lockstep evaluates them on every step of
its traffic (a well-behaved caller by design) and reports a break under its
ASSUME-* id. The statement is bound to the encoding's by the agreement
campaign (tests/test_smt_agreement.py compares both on every operation);
here: the same ids as the encoding's, each contract's witness breaks it at
its last operation and nowhere before, and the lockstep's hook reports it.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.conformance.block.lockstep import Lockstep
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.conformance.verdicts.failures import CallerContractBroken
from kvspec.reference.caller_contracts import CONTRACT_IDS, broken_contracts, settle
from kvspec.reference.g1 import G1Model
from kvspec.reference.smt.contracts import CONTRACTS
from kvspec.spec.errors import InvalidOperation

MANIFEST = load_manifest(resolve_adapter_dir("adapters/reference"))


def test_the_model_side_names_the_encodings_contracts() -> None:
    assert set(CONTRACT_IDS) == set(CONTRACTS)


def _verdicts(universe: Any, ops: list[Any]) -> list[list[str]]:
    """The contracts each operation breaks, as the model-side statement says."""
    m = G1Model(universe.config())
    out: list[list[str]] = []
    for op in ops:
        said = broken_contracts(m, op)
        try:
            status: str | None = m.apply(op).result.status
        except InvalidOperation:
            status = None
        out.append([b.id for b in settle(said, status)])
    return out


@pytest.mark.parametrize("cid", sorted(CONTRACTS))
def test_each_contracts_witness_breaks_it_only_at_its_last_operation(cid: str) -> None:
    universe, ops = CONTRACTS[cid].witness()
    assert _verdicts(universe, ops) == [[] for _ in ops[:-1]] + [[cid]]


@pytest.mark.parametrize("cid", sorted(CONTRACTS))
def test_the_lockstep_reports_a_broken_contract_by_its_id(cid: str) -> None:
    universe, ops = CONTRACTS[cid].witness()
    config = universe.config()
    checked = Lockstep(ReferenceImplementation(config, MANIFEST), config, adapter="reference", caller_contracts=True)
    for op in ops[:-1]:
        checked.step(op)
    with pytest.raises(CallerContractBroken) as exc:
        checked.step(ops[-1])
    assert exc.value.contract == cid
    assert str(exc.value).startswith(f"[{cid}]")
    assert f"step {len(ops) - 1}" in exc.value.report
    assert checked.contracts_checked == len(ops)
    # the same operations without the hook: the implementation is not to blame
    plain = Lockstep(ReferenceImplementation(config, MANIFEST), config, adapter="reference")
    for op in ops:
        plain.step(op)
    assert plain.contracts_checked == 0


def test_a_swap_in_that_schedules_nothing_breaks_no_contract() -> None:
    """A swap-in naming a parent it does not hold, with nothing of its blocks
    in G2 (no hits): no job, nothing to anchor (the encoding requires the
    contract only of a reservation)."""
    from kvspec.reference.smt.offload.agreement.sampled import Universe, swap_in_op

    u = Universe(2, (-1, 0), 1, "lineage")
    m = G1Model(u.config())
    op = swap_in_op(u, [1], 0)
    said = broken_contracts(m, op)
    assert [b.id for b in said] == ["ASSUME-SWAPIN-PARENT-HELD"]
    assert m.apply(op).result.status == "no_hits"
    assert settle(said, "no_hits") == []


def test_each_profile_checks_the_contracts_its_proofs_assume() -> None:
    """kvbm with offload assumes both contracts, atomic ASSUME-PARENT-REGISTERED
    (INV-ATOMIC-ANCHOR), kvbm without offload none: there a Use naming a parent
    that is not registered breaks nothing (the lockstep's traffic does send such
    Uses there); under atomic it breaks the contract, even with no full block
    (profile_atomic.begin states it for the whole Use)."""
    from kvspec.reference.caller_contracts import assumed
    from kvspec.reference.smt.offload.agreement.sampled import Universe, use_op
    from kvspec.spec.config import ManagerConfig
    from kvspec.spec.wire import FullBlock, PartialBlock, Use

    assert assumed("kvbm", True) == CONTRACT_IDS
    assert assumed("atomic", False) == assumed("vllm", False) == ("ASSUME-PARENT-REGISTERED",)
    assert assumed("kvbm", False) == assumed("legacy", False) == ()
    u = Universe(2, (-1, 0), 1, "lineage")
    op = use_op(u, [1], parent=0)
    assert [b.id for b in broken_contracts(G1Model(u.config()), op)] == ["ASSUME-PARENT-REGISTERED"]
    plain = ManagerConfig(profile="kvbm", capacity=2, eviction="lineage")
    assert broken_contracts(G1Model(plain), op) == []
    atomic = ManagerConfig(profile="atomic", capacity=2, eviction="lineage")
    assert [b.id for b in broken_contracts(G1Model(atomic), op)] == ["ASSUME-PARENT-REGISTERED"]
    partial_only = Use(blocks=[PartialBlock(partial="p")], parent=FullBlock(full=0))
    assert [b.id for b in broken_contracts(G1Model(atomic), partial_only)] == ["ASSUME-PARENT-REGISTERED"]


def test_the_atomic_lockstep_catches_a_caller_that_names_an_unregistered_parent() -> None:
    """The misbehaving-caller witness under atomic: the model accepts the Use
    (it does not enforce the contract), the lockstep reports the break by its
    id; the same Use with its parent registered first passes."""
    from kvspec.reference.smt.offload.agreement.sampled import Universe, use_op
    from kvspec.spec.config import ManagerConfig

    config = ManagerConfig(profile="atomic", capacity=2, eviction="lineage")
    u = Universe(2, (-1, 0), 1, "lineage")
    checked = Lockstep(ReferenceImplementation(config, MANIFEST), config, adapter="reference", caller_contracts=True)
    with pytest.raises(CallerContractBroken) as exc:
        checked.step(use_op(u, [1], parent=0))
    assert exc.value.contract == "ASSUME-PARENT-REGISTERED"
    fine = Lockstep(ReferenceImplementation(config, MANIFEST), config, adapter="reference", caller_contracts=True)
    fine.step(use_op(u, [0]))
    fine.step(use_op(u, [1], parent=0))
    assert fine.contracts_checked == 2
