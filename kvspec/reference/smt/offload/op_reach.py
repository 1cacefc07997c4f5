"""The kvbm-offload operation level as a transition table for ``smt/reach.py``.

The operation-level proofs (``operations_prove.py``) apply each whole
operation of the model (a Use or Deref of every batch shape, Promote, a
SwapIn of every length, each unit of a forward Tick) to any state of the
invariants, so an operation whose contracts or choices rule out an outcome
in every *reachable* state proves nothing about that outcome, and nothing
fails. Here each variant is a transition, its outcomes that matter
(``operations_prove.outcomes``: a Use that stores and evicts, a Stored whose
parent is a block the Use reused, a job that registers two blocks, ...) its
named cases, from the empty cache of a small universe (3 slots, 4 hashes,
any G2 capacity and hash forest), batches of up to 2 blocks. Every pair of
variants enabled together is a goal too: a contract such as "no slot is
reserved" on a Use removes no outcome but every state in which a SwapIn has
reserved one.

A transition is "enabled" when the operation's choices are ones its rules
allow and the caller keeps the contracts its steps name (what the proofs
assume); a Use that stops early, or a Deref that is rejected, is still a
step (the rejection is a case the model has).
"""

from __future__ import annotations

import z3

from kvspec.reference.smt.offload.operations_prove import (
    OPERATIONS,
    TICK_UNITS,
    OpInputs,
    make_use,
    outcomes,
    variants,
)
from kvspec.reference.smt.offload.ops import Chooser, apply_op
from kvspec.reference.smt.offload.state import Rigid, State
from kvspec.reference.smt.reach import Move, ReachStart, ReachStep, ReachTrace, System
from kvspec.reference.smt.universe import Bound
from kvspec.spec.registry import KVBM_OFFLOAD

REACH_BOUND = Bound(3, 4)
REACH_BATCH = 2
REACH_DEPTH = 8


class _Named(OpInputs):
    """Inputs named with a step's prefix, kept under their plain names."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def int(self, name: str, lo: int, hi: int) -> z3.ArithRef:
        c = z3.Int(self.prefix + name)
        self.consts[name] = c
        self.domain.append(z3.And(lo <= c, c < hi))
        return c

    def bool(self, name: str) -> z3.BoolRef:
        c = z3.Bool(self.prefix + name)
        self.consts[name] = c
        return c


def label(name: str, shape: str) -> str:
    return f"{name}[{shape}]" if shape and name != "tick" else (f"tick({shape})" if name == "tick" else name)


def system(bound: Bound = REACH_BOUND, n: int = REACH_BATCH, depth: int = REACH_DEPTH) -> System[State]:
    table = {label(name, shape): (name, shape) for name, shape in variants(n)}

    def start() -> ReachStart[State]:
        rigid = Rigid.fresh(bound, "opreach_")
        return ReachStart(State.initial(bound, rigid), rigid.domain(), lambda tag: State.fresh(bound, rigid, tag))

    def move(t: str, pre: State, prefix: str) -> Move:
        name, shape = table[t]
        inp = _Named(prefix)
        if name == "tick":
            out = TICK_UNITS[shape](pre, inp, None)
        else:
            op = make_use(inp, bound, shape) if name == "use" else OPERATIONS[name](inp, bound, shape)
            out = apply_op(pre, op, Chooser("unordered", free_victims=True, prefix=f"{prefix}ch"))
        names: dict[str, z3.ExprRef] = dict(inp.consts)
        victims = []
        for i, (_w, v) in enumerate(out.victims):
            victims.append(z3.And(0 <= v, v < bound.slots))
            names[f"victim{i}"] = v
        enabled = z3.And([*inp.domain, *victims, *out.constraints, *out.contracts.values()] or [z3.BoolVal(True)])
        cases = {f"case {k}": c for k, c in outcomes(name, shape, out, inp).items()}
        return Move(out.post, enabled, cases, names, out)

    return System(
        KVBM_OFFLOAD,
        "operation",
        f"{bound}, any G2 capacity, batches <= {n}",
        list(table),
        start,
        State.equals,
        move,
        depth,
    )


def _walk(*names: str) -> ReachTrace:
    """A guide trace: the operations in order, every input left to z3."""
    return ReachTrace([ReachStep(n, {}) for n in names])


#: fill the cache, release two blocks, then a Use that must evict: an offload is pending
_PENDING = ("use[FF]", "use[F]", "deref[FF]", "use[F]")
#: the same, then the offload completes and a SwapIn of the offloaded block is scheduled
_JOB = (*_PENDING, "tick(offload)", "swap_in[F]")
#: two evictions: after one offload completes and its block's SwapIn is scheduled, the other is pending
_BOTH = ("use[FF]", "use[F]", "deref[FF]", "use[FF]", "tick(offload)", "swap_in[F]")
_ALL = [label(n, sh) for n, sh in variants(REACH_BATCH)]

#: sequences of operations from the empty cache, written for the encoding: the guide of the recording
#: (``recorded.attribute`` asks z3, at each step, for the inputs reaching each goal not reached yet);
#: the greedy search gives up before a pending offload and a scheduled swap-in (4-7 operations deep).
#: Each operation is taken after a prefix where a Tick unit is due, so it is taken with that unit enabled.
OP_GUIDE: list[ReachTrace] = [
    *[_walk(*_PENDING, t) for t in _ALL if t != "tick(swap_in job)"],
    *[_walk(*_JOB, t) for t in _ALL if t != "tick(offload)"],
    _walk(*_BOTH, "tick(offload)"),
    _walk(*_BOTH, "tick(swap_in job)"),
    _walk("use[FF]", "use[F]", "deref[FF]", "use[FF]", "tick(offload)", "tick(offload)", "swap_in[FF]"),
    _walk(
        "use[FF]",
        "use[F]",
        "deref[FF]",
        "use[FF]",
        "tick(offload)",
        "tick(offload)",
        "swap_in[FF]",
        "tick(swap_in job)",
    ),
]
