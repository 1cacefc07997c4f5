"""Bounded model checking over the model's operations.

A trace is a sequence of operations of a small concrete universe (a few
slots, a forest of block hashes, a G2 capacity, a policy), each operation
symbolic: which kind (a Use of one or two blocks, a Deref of one or two, a
Promote, a Tick, a SwapIn of one or two blocks) and its arguments. Every
operation is a request a scheduler could make: Use and SwapIn name chains of
the forest anchored to their parent, which the caller holds; Deref and
Promote name blocks the caller holds. ``search`` deepens the trace one
operation at a time and asks z3 for one that reaches the target.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias

import z3

from kvspec.reference.smt.offload.agreement.sampled import Universe
from kvspec.reference.smt.offload.ops import (
    STATUS_OK,
    BlockArg,
    Chooser,
    DerefOp,
    Op,
    OpOutcome,
    PromoteOp,
    SwapInOp,
    TickOp,
    UseOp,
    apply_op,
)
from kvspec.reference.smt.offload.state import State
from kvspec.reference.smt.solving import check
from kvspec.reference.smt.terms import sel
from kvspec.reference.smt.universe import NONE

Term: TypeAlias = z3.ExprRef

KINDS = ("use1", "use2", "use_partial", "deref1", "deref2", "promote", "tick", "swap_in1", "swap_in2")


@dataclass
class OpVars:
    """The symbolic arguments of one operation of a trace."""

    kind: z3.ArithRef
    h1: z3.ArithRef
    h2: z3.ArithRef
    u: z3.ArithRef
    full2: z3.BoolRef  # use2: the second block is full (else partial ``u``)
    full1: z3.BoolRef  # deref1: the block is full (else partial ``u``)
    p: z3.ArithRef  # the parent a Use, Promote or SwapIn names

    @staticmethod
    def fresh(i: int) -> OpVars:
        return OpVars(
            z3.Int(f"op{i}_kind"),
            z3.Int(f"op{i}_h1"),
            z3.Int(f"op{i}_h2"),
            z3.Int(f"op{i}_u"),
            z3.Bool(f"op{i}_full2"),
            z3.Bool(f"op{i}_full1"),
            z3.Int(f"op{i}_p"),
        )

    def is_(self, kind: str) -> z3.BoolRef:
        return self.kind == KINDS.index(kind)

    def op(self, kind: str) -> Op:
        """The encoding's operation of this kind with these arguments."""
        if kind == "use1":
            return UseOp([BlockArg(True, h=self.h1)], self.p)
        if kind == "use2":
            return UseOp([BlockArg(True, h=self.h1), BlockArg(self.full2, h=self.h2, u=self.u)], self.p)
        if kind == "use_partial":
            return UseOp([BlockArg(False, u=self.u)], NONE)
        if kind == "deref1":
            return DerefOp([BlockArg(self.full1, h=self.h1, u=self.u)])
        if kind == "deref2":
            return DerefOp([BlockArg(True, h=self.h2), BlockArg(True, h=self.h1)])
        if kind == "promote":
            return PromoteOp(self.u, self.h1, self.p)
        if kind == "tick":
            return TickOp(True)
        if kind == "swap_in1":
            return SwapInOp([self.h1], self.p)
        if kind == "swap_in2":
            return SwapInOp([self.h1, self.h2], self.p)
        raise KeyError(kind)


@dataclass
class BmcStep:
    index: int
    pre: State
    post: State
    vars: OpVars
    outcomes: dict[str, OpOutcome]

    def value(self, field_name: str) -> Term:
        """A field of the outcome of whichever kind this step is."""
        out: Term | None = None
        for kind in reversed(KINDS):
            v = getattr(self.outcomes[kind], field_name)
            if v is None:
                v = z3.IntVal(-1)
            out = v if out is None else z3.If(self.vars.is_(kind), v, out)
        assert out is not None
        return out

    @property
    def status(self) -> Term:
        return self.value("status")

    @property
    def result(self) -> Term:
        return self.value("value")

    @property
    def anchor_ok(self) -> z3.BoolRef:
        return self.value("anchor_ok")


@dataclass
class BmcTrace:
    universe: Universe
    chooser: Chooser
    kinds: tuple[str, ...]
    steps: list[BmcStep] = field(default_factory=list)
    constraints: list[z3.BoolRef] = field(default_factory=list)


def _par(universe: Universe, h: Term) -> Term:
    return sel([z3.IntVal(p) for p in universe.par], h)


def well_formed(S: State, v: OpVars, universe: Universe, kinds: tuple[str, ...]) -> z3.BoolRef:
    """The operation is one a scheduler could make from state ``S``: chains of
    the forest, parents and dereferenced blocks held by the caller."""
    m, uu = S.bound.hashes, S.bound.uuids
    held_parent = z3.Or(v.p == NONE, S.is_active(v.p))
    chain1 = z3.And(v.p == _par(universe, v.h1), held_parent)
    chain2 = z3.And(chain1, _par(universe, v.h2) == v.h1)
    by_kind = {
        "use1": chain1,
        "use2": z3.And(chain1, z3.If(v.full2, _par(universe, v.h2) == v.h1, z3.BoolVal(True))),
        "use_partial": z3.BoolVal(True),
        "deref1": z3.If(v.full1, S.is_active(v.h1), S.held_partial(v.u)),
        "deref2": z3.And(_par(universe, v.h2) == v.h1, S.is_active(v.h1), S.is_active(v.h2)),
        "promote": z3.And(S.held_partial(v.u), chain1),
        "tick": z3.BoolVal(True),
        "swap_in1": chain1,
        "swap_in2": chain2,
    }
    return z3.And(
        z3.Or([v.is_(k) for k in kinds]),
        0 <= v.h1,
        v.h1 < m,
        0 <= v.h2,
        v.h2 < m,
        0 <= v.u,
        v.u < uu,
        NONE <= v.p,
        v.p < m,
        *[z3.Implies(v.is_(k), by_kind[k]) for k in kinds],
    )


def extend(trace: BmcTrace) -> BmcStep:
    """Add one symbolic operation to the trace."""
    i = len(trace.steps)
    pre = trace.steps[-1].post if trace.steps else trace.universe.initial()
    v = OpVars.fresh(i)
    outcomes = {k: apply_op(pre, v.op(k), trace.chooser) for k in KINDS if k in trace.kinds}
    for k in KINDS:
        if k not in outcomes:
            outcomes[k] = apply_op(pre, TickOp(False), trace.chooser)  # never taken
    post = State.fresh(pre.bound, pre.rigid, f"s{i + 1}_")
    # post = If(kind == k1, post1, If(kind == k2, post2, ...))
    merged: State | None = None
    for k in reversed(trace.kinds):
        o = outcomes[k]
        merged = o.post if merged is None else o.post.map2(merged, lambda a, b, k=k: z3.If(v.is_(k), a, b))
    assert merged is not None
    trace.constraints.append(well_formed(pre, v, trace.universe, trace.kinds))
    for k in trace.kinds:
        o = outcomes[k]
        trace.constraints.append(z3.Implies(v.is_(k), z3.And(o.valid, *o.constraints)))
    trace.constraints.append(post.equals(merged))
    step = BmcStep(i, pre, post, v, outcomes)
    trace.steps.append(step)
    return step


Target = Callable[[BmcTrace], z3.BoolRef]


@dataclass
class Found:
    trace: BmcTrace
    model: z3.ModelRef
    depth: int
    seconds: float


def search(
    universe: Universe,
    target: Target,
    *,
    max_depth: int,
    kinds: tuple[str, ...] = KINDS,
    chooser: Chooser | None = None,
    min_depth: int = 1,
    timeout_ms: int = 120_000,
) -> Found | None:
    """The shortest trace (up to ``max_depth`` operations) reaching ``target``."""
    t0 = time.perf_counter()
    trace = BmcTrace(universe, chooser or Chooser("lru"), kinds)
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    done = 0
    for depth in range(1, max_depth + 1):
        extend(trace)
        s.add(*trace.constraints[done:])
        done = len(trace.constraints)
        if depth < min_depth:
            continue
        s.push()
        s.add(target(trace))
        a = check(s, timeout_ms=timeout_ms)
        if a.model is not None:
            return Found(trace, a.model, depth, time.perf_counter() - t0)
        s.pop()
    return None


def ok_status(step: BmcStep) -> z3.BoolRef:
    return step.status == STATUS_OK
