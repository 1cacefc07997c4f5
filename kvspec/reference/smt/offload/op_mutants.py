"""Operation-level mutants of the kvbm-offload encoding: every operation row can fail.

The operation-level proofs (``operations_prove.py``) apply whole operations
(Use, Deref, Promote, SwapIn, each unit of a forward Tick) to a symbolic
pre-state. A row that no broken operation fails shows nothing, so each row
must be refuted by at least one mutant here (``MUTANTS-COVER`` at operation
level, ``cover``). Two kinds:

- a step mutant acting through the operations: the step-level mutant's change
  (``mutants.py``: its patch, or its dropped caller contract) applied to every
  step an operation takes (``ops._Run``), so the bug is the same one, seen
  through whole operations. The step mutants that swap a broken part into a
  transition's own arguments (``extra``) are left out: the operations call the
  transitions directly;
- a bug of the operation itself, which no step has: what the operation
  publishes as a whole (the Use's one Stored and its parent, a Removed that
  names a stored block) or the state it returns in (a Tick that returns with a
  swap-in registration in progress).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import z3

from kvspec.reference.smt.offload.mutants import MUTANTS, OffloadMutant
from kvspec.reference.smt.offload.operations_prove import (
    OP_DISJOINT,
    OP_IDLE,
    Mutate,
    Reshape,
    prove_operations,
)
from kvspec.reference.smt.offload.ops import Op, OpOutcome
from kvspec.reference.smt.offload.state import State
from kvspec.reference.smt.offload.step import EncodedStep, Frag
from kvspec.reference.smt.universe import NONE, Bound
from kvspec.spec.rules import RuleId as R

#: where the operation mutants are refuted: small, every one is refuted there
OP_MUTANT_BOUND = Bound(3, 4)
OP_MUTANT_BATCH = 2


@dataclass(frozen=True)
class OffloadOpMutant:
    name: str
    rule: str
    description: str
    #: the operation row it must break
    expect: str
    mutate: Mutate | None = None
    reshape: Reshape | None = None


def _through_steps(m: OffloadMutant) -> Mutate:
    """The step mutant's change on every step an operation takes."""

    def mutate(step: EncodedStep) -> EncodedStep:
        if m.patch is not None:
            step = m.patch(step)
        for name in m.drop:
            step.requires.pop(name, None)
        return step

    return mutate


def _device(out: OpOutcome, kind: str) -> list[tuple[z3.BoolRef, Frag]]:
    return [(w, f) for w, f in out.frags if f.tier == "device" and f.kind == kind]


def _removes_stored(pre: State, op: Op | None, out: OpOutcome) -> OpOutcome:
    """A Use's Removed names every block its Stored names too."""
    if out.kind != "use":
        return out
    extra = [(w, Frag(w, "device", "removed", f.block)) for w, f in _device(out, "stored")]
    return dataclasses.replace(out, frags=[*out.frags, *extra])


def _parent_is_own_block(pre: State, op: Op | None, out: OpOutcome) -> OpOutcome:
    """A Use's one Stored names the last block it stores as its parent."""
    if out.kind != "use":
        return out
    stored = _device(out, "stored")
    parent: z3.ArithRef = z3.IntVal(NONE)
    for w, f in stored:
        parent = z3.If(w, f.block, parent)
    any_stored = z3.Or([w for w, _ in stored] or [z3.BoolVal(False)])
    anchor_ok = z3.Implies(any_stored, z3.Or(parent == NONE, pre.dev_has(parent)))
    return dataclasses.replace(out, stored_parent=parent, anchor_ok=anchor_ok)


def _registration_left_open(pre: State, op: Op | None, out: OpOutcome) -> OpOutcome:
    """A forward Tick returns with a swap-in registration still in progress."""
    if out.kind != "tick":
        return out
    return dataclasses.replace(out, post=out.post.but(busy=z3.IntVal(0)))


def _registers_twice(step: EncodedStep) -> EncodedStep:
    """A slot that registers a block writes its hash into the next registered slot as well."""
    pre, post = step.pre, step.post
    n = len(post.blk)
    blk = list(post.blk)
    for s in range(n):
        t = (s + 1) % n
        newly = z3.And(z3.Not(pre.registered_slot(s)), post.registered_slot(s), post.registered_slot(t))
        blk[t] = z3.If(newly, post.blk[s], blk[t])
    step.post = post.but(blk=blk)
    return step


def _queued_without_parent(step: EncodedStep) -> EncodedStep:
    """An offload queued at an eviction carries the root as its block's parent."""
    pre, post = step.pre, step.post
    newly = [z3.And(z3.Not(pre.pend[k]), post.pend[k]) for k in range(len(post.pend))]
    step.post = post.but(pmpar=[z3.If(c, NONE, x) for c, x in zip(newly, post.pmpar, strict=True)])
    return step


#: step mutants not acted through the operations: their bug is only in what a step obligation
#: checks, which the operation rows do not restate (the host-pinned Stored's parent is
#: ``invariants.step_host_anchor``; ``op:offload-queued-without-parent`` breaks the state part)
STEP_ONLY = {"host-stored-parent-dropped": "a step obligation (the host-pinned Stored's parent)"}


def _catalogue() -> list[OffloadOpMutant]:
    out = [
        OffloadOpMutant(f"op:{m.name}", m.rule, m.description, m.expect, mutate=_through_steps(m))
        for m in MUTANTS
        if (m.patch is not None or m.drop) and m.name not in STEP_ONLY
    ]
    out += [
        OffloadOpMutant(
            "op:use-removes-stored",
            R.EVENT_ORDER,
            "a Use's Removed also names the blocks its Stored names",
            OP_DISJOINT,
            reshape=_removes_stored,
        ),
        OffloadOpMutant(
            "op:use-parent-own-block",
            R.PARENT_ANCHOR,
            "a Use's Stored names its own last block as parent",
            "INV-ANCHOR",
            reshape=_parent_is_own_block,
        ),
        OffloadOpMutant(
            "op:tick-leaves-registration",
            R.TIME_MONOTONIC,
            "a forward Tick returns with a swap-in registration still in progress",
            OP_IDLE,
            reshape=_registration_left_open,
        ),
        OffloadOpMutant(
            "op:registers-twice",
            R.STORE_NO_DUP,
            "a slot that registers a block writes its hash into the next registered slot too",
            "INV-NO-DUP",
            mutate=_registers_twice,
        ),
        OffloadOpMutant(
            "op:offload-queued-without-parent",
            R.G2_STORE_ON_COMPLETE,
            "an offload queued at an eviction carries the root as its block's parent",
            "INV-HOST-ANCHOR",
            mutate=_queued_without_parent,
        ),
    ]
    return out


OP_MUTANTS: list[OffloadOpMutant] = _catalogue()


def broken_rows(m: OffloadOpMutant, bound: Bound = OP_MUTANT_BOUND, n: int = OP_MUTANT_BATCH) -> list[str]:
    """The operation rows the mutant breaks (a counterexample at ``bound``, batches of up to ``n``)."""
    rs = prove_operations(bound, n, mutate=m.mutate, reshape=m.reshape)
    return list(dict.fromkeys(r.property_id for r in rs if not r.proven and not r.unknown))


def op_twin(m: OffloadMutant) -> OffloadOpMutant | None:
    """The operation version of the step mutant ``m`` (``op:NAME``), or None for a step-only one."""
    return next((o for o in OP_MUTANTS if o.name == f"op:{m.name}"), None)


def step_only_reason(m: OffloadMutant) -> str:
    """Why the step mutant ``m`` has no operation version, so no trace of whole operations stands for it."""
    if m.name in STEP_ONLY:
        return f"its bug is only in {STEP_ONLY[m.name]}, which the operation rows do not restate"
    return (
        "it swaps a broken part into a transition's own arguments, and the operations call the transitions"
        " directly (offload/op_mutants.py), so no operation carries it"
    )
