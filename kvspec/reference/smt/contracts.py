"""The caller contracts the proofs assume, each with its witness.

A contract (``EncodedStep.require(..., "contract", ...)``, id ``ASSUME-...``)
narrows the proofs to callers that keep it. That is only honest if breaking
it is the caller's doing, never the rules': each contract here carries a
*witness*, an operation sequence from the initial state that the model
accepts in full, whose last operation breaks the contract (evaluated on the
encoding's concrete state, the way the proofs state it) while every earlier
operation keeps every contract. The step that breaks it is a caller
choosing to (naming a parent it does not hold, dropping the owner a pending
swap-in needs), not a rule. The other half, that well-behaved callers never
break one, is checked on every step of the agreement campaign
(``agreement_campaign.py``: every contract break falls on an operation the
caller flagged as misbehaving).

``tests/test_smt_agreement.py`` replays every witness and checks that every
contract any transition requires is listed here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvspec.reference.smt.offload.agreement.sampled import Universe, use_op
from kvspec.reference.smt.offload.transitions import ASSUME_PARENT_REGISTERED, ASSUME_SWAPIN_PARENT_HELD
from kvspec.reference.smt.universe import NONE
from kvspec.reference.smt.witnesses import WITNESS_DIR, universe_of
from kvspec.spec.scenario import load_scenario
from kvspec.spec.wire import Operation


@dataclass(frozen=True)
class Contract:
    id: str
    statement: str
    #: the universe and the operations of the witness (the last one breaks it)
    witness: Callable[[], tuple[Universe, list[Operation]]]


def _parent_not_held() -> tuple[Universe, list[Operation]]:
    """A Use of block 1 naming block 0 as its parent while G1 holds no 0."""
    u = Universe(2, (NONE, 0), 1, "lineage")
    return u, [use_op(u, [1], parent=0)]


def _swapin_parent_dropped() -> tuple[Universe, list[Operation]]:
    """The BMC witness ``swapin_parent_evicted_before_registration``, up to
    the Deref that drops the last owner of the pending swap-in's parent."""
    sc = load_scenario(WITNESS_DIR / "swapin_parent_evicted_before_registration.json")
    ops = [s.op for s in sc.steps]
    cut = next(i for i in range(1, len(ops)) if ops[i].op == "deref" and ops[i - 1].op == "swap_in")
    return universe_of(sc), ops[: cut + 1]


CONTRACTS: dict[str, Contract] = {
    ASSUME_PARENT_REGISTERED: Contract(
        ASSUME_PARENT_REGISTERED,
        "the parent a Use or a Promote names is the root or a block registered in G1",
        _parent_not_held,
    ),
    ASSUME_SWAPIN_PARENT_HELD: Contract(
        ASSUME_SWAPIN_PARENT_HELD,
        "a swap-in names the root or an active block as parent, and the caller keeps one owner of it "
        "until the swap-in completes",
        _swapin_parent_dropped,
    ),
}

__all__ = ["CONTRACTS", "Contract"]
