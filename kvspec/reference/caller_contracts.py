"""The caller contracts (ASSUME-*), evaluated on the reference model.

The z3 proofs of INV-ANCHOR and its two swap-in lemmas assume that the
caller (the scheduler) keeps two contracts (spec/SPEC.md, "Caller
contracts"; ``reference/smt/contracts.py`` gives each a witness that only a
misbehaving caller breaks it). The model does not enforce them: an
operation that breaks one is still accepted. This module states them on the
model's state, so that a driver meant to be a well-behaved caller (the
conformance lockstep machine) can check, on every step, that it is one; a
break is reported under the contract's own id.

They are stated at operation level, on the state before the operation:

- ASSUME-PARENT-REGISTERED: a Use of full blocks or a Promote names as
  parent the root or a block registered in G1 (active or inactive);
- ASSUME-SWAPIN-PARENT-HELD: a swap-in that schedules a job (status
  ``scheduled``: it reserved slots) names as parent the root or an active
  block, and a Deref does not drop the last owner of a block that is the
  parent of a swap-in in flight.

Which contracts apply depends on the profile, as each profile's proofs
assume them (``assumed``): the kvbm profile with an offload tier assumes
both; ``atomic`` (``kvspec prove --profile atomic``, INV-ATOMIC-ANCHOR)
assumes ASSUME-PARENT-REGISTERED, stated at the start of every Use that
names a parent (``profile_atomic.begin``) and on every Promote; ``vllm``
assumes it read as "the request holds its prefix" (``vllm_broken_contracts``,
checked by the request driver the conformance checker runs); kvbm
without offload and ``legacy`` assume none.

The offload encoding states ASSUME-PARENT-REGISTERED per full block of a
Use, against the anchor the batch has reached; under the offload tier an
eviction stops the batch, so the named parent is still registered at every
block the Use places and the two statements agree. The agreement campaign
(``reference/smt/offload/agreement/sampled.py``) compares this module's verdict with the
encoding's on every operation, well-behaved or not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from kvspec.reference.g1 import G1Model
from kvspec.reference.vllm_pool import VllmPoolModel
from kvspec.spec.registry import ATOMIC_NAME, KVBM_NAME, VLLM_NAME
from kvspec.spec.wire import Deref, FullBlock, Operation, Promote, SwapIn, Use

ASSUME_PARENT_REGISTERED = "ASSUME-PARENT-REGISTERED"
ASSUME_SWAPIN_PARENT_HELD = "ASSUME-SWAPIN-PARENT-HELD"
#: every caller contract (the ids of ``reference/smt/contracts.py``'s CONTRACTS)
CONTRACT_IDS = (ASSUME_PARENT_REGISTERED, ASSUME_SWAPIN_PARENT_HELD)


def assumed(profile: str, offload: bool) -> tuple[str, ...]:
    """The caller contracts the proofs of ``profile`` (with or without an
    offload tier) assume: the ones a well-behaved caller must keep there."""
    if profile == KVBM_NAME and offload:
        return CONTRACT_IDS
    if profile in (ATOMIC_NAME, VLLM_NAME):
        return (ASSUME_PARENT_REGISTERED,)
    return ()


@dataclass(frozen=True)
class ContractBreak:
    """Operation ``op`` breaks contract ``id``: ``what`` says how."""

    id: str
    what: str
    #: a swap-in's: broken only if the swap-in schedules a job (``settle``)
    if_scheduled: bool = False

    def __str__(self) -> str:
        return f"[{self.id}] {self.what}"


def broken_contracts(model: G1Model, op: Operation) -> list[ContractBreak]:
    """The caller contracts ``op`` breaks in ``model``'s current state (call
    it before applying ``op``, then ``settle`` with the outcome): those the
    proofs of the model's profile assume (``assumed``), [] where they assume
    none. (Without an offload tier the lockstep's traffic does name parents
    that are no longer registered: a Use anchored to a block evicted since,
    which is how it reaches the kvbm mocker's known PARENT-ANCHOR break;
    that profile's proofs assume no contract.)"""
    ids = assumed(model.config.profile, model.config.offload is not None)
    return [b for b in _breaks(model, op) if b.id in ids] if ids else []


def _breaks(model: G1Model, op: Operation) -> list[ContractBreak]:
    """Every contract ``op`` breaks, as stated for the profile's proofs."""
    out: list[ContractBreak] = []
    if isinstance(op, Use) and isinstance(op.parent, FullBlock):
        # atomic states it for the whole Use (profile_atomic.begin), kvbm-offload per full block
        whole = model.config.profile == ATOMIC_NAME or any(isinstance(b, FullBlock) for b in op.blocks)
        if whole and op.parent.full not in model.registered():
            out.append(
                ContractBreak(ASSUME_PARENT_REGISTERED, f"the Use names parent {op.parent.full}, not registered in G1")
            )
    elif isinstance(op, Promote) and op.parent_hash is not None:
        if op.parent_hash not in model.registered():
            out.append(
                ContractBreak(
                    ASSUME_PARENT_REGISTERED, f"the Promote names parent {op.parent_hash}, not registered in G1"
                )
            )
    elif isinstance(op, SwapIn) and op.parent is not None:
        if model.owners().get(op.parent, 0) < 1:
            out.append(
                ContractBreak(
                    ASSUME_SWAPIN_PARENT_HELD,
                    f"the swap-in names parent {op.parent}, not an active block",
                    if_scheduled=True,
                )
            )
    elif isinstance(op, Deref):
        anchors = {job.parent for _at, job in model.onboards() if job.parent is not None}
        dropped = Counter(b.full for b in op.blocks if isinstance(b, FullBlock))
        owners = model.owners()
        for h in sorted(anchors & set(dropped)):
            if owners.get(h, 0) - dropped[h] < 1:
                out.append(
                    ContractBreak(
                        ASSUME_SWAPIN_PARENT_HELD,
                        f"the Deref drops the last owner of block {h}, the parent of a swap-in in flight",
                    )
                )
    return out


def vllm_broken_contracts(model: VllmPoolModel, op: Operation) -> list[ContractBreak]:
    """The caller contract the vllm profile's operation proof of PARENT-ANCHOR
    assumes (``reference/smt/vllm/ops.py``), broken by ``op`` in
    ``model``'s state before it: ASSUME-PARENT-REGISTERED read as "the
    request holds its prefix", so the parent a Use or a Promote names is a
    cached copy with an owner. (A parent only cached, with no owner, may be
    evicted by the Use's own allocation, and its Stored then names a parent
    the router has just seen removed: mutant ``contract-registered-only``.)"""
    if isinstance(op, Use) and isinstance(op.parent, FullBlock):
        parent: int | None = op.parent.full
    elif isinstance(op, Promote):
        parent = op.parent_hash
    else:
        return []
    if parent is None or any(model.copies[c].owners > 0 for c in model.by_hash.get(parent, ())):
        return []
    what = "Use" if isinstance(op, Use) else "Promote"
    return [
        ContractBreak(ASSUME_PARENT_REGISTERED, f"the {what} names parent {parent}, not a cached copy with an owner")
    ]


class ContractBroken(AssertionError):
    """A driver meant to be a well-behaved caller broke caller contract
    ``contract``: a bug of the driver, never of the implementation under
    test (the message starts with the contract's id)."""

    def __init__(self, brk: ContractBreak, op: Operation) -> None:
        super().__init__(f"{brk} (operation {op!r})")
        self.contract = brk.id


def settle(breaks: list[ContractBreak], status: str | None) -> list[ContractBreak]:
    """The breaks that stand once the operation's result status is known
    (None: the model rejected it, and a rejected operation breaks nothing)."""
    if status is None:
        return []
    return [b for b in breaks if not b.if_scheduled or status == "scheduled"]


__all__ = [
    "ASSUME_PARENT_REGISTERED",
    "ASSUME_SWAPIN_PARENT_HELD",
    "CONTRACT_IDS",
    "ContractBreak",
    "ContractBroken",
    "assumed",
    "broken_contracts",
    "settle",
    "vllm_broken_contracts",
]
