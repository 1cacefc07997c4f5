"""The model's operations as sequences of the encoding's transitions.

``transitions.py`` has one relation per rule-level step; an operation of the
model (a Use of a batch, a Deref of several blocks, a Tick completing every
due transfer, a SwapIn of a G2 prefix) is a fixed sequence of such steps,
each taken or skipped on a condition of the state. ``apply_op`` composes
them, with the rule's choices made canonically (the lowest free slot, the
policy's victim) or left to the solver (``Chooser``), and returns the
post-state, the result, and the events assembled the way the kvbm profile
publishes them. Nothing here calls the Python model: the agreement test
(tests/test_smt_agreement.py) compares the two, and bounded model checking
(``bmc.py``) searches over these operations.

Scope: the kvbm profile with an offload tier whose transfers are instant
(no ``block_size_bytes``): a forward Tick completes every pending transfer,
in queue order. Time only orders completions, and the proofs cover every
order. Block metadata is what the universe carries (local hashes 0, no token
ids), and lineage hashes are the canonical ones of the hash forest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias

import z3

from kvspec.reference.smt.offload.state import State
from kvspec.reference.smt.offload.step import STATUS_BLOCKED, STATUS_CAPACITY, STATUS_OK, EncodedStep, Frag
from kvspec.reference.smt.offload.transitions import (
    Policy,
    deref_full,
    deref_partial,
    evict,
    g2_victim,
    lru_victim,
    offload_complete,
    promote,
    swapin_register,
    swapin_reserve,
    use_full,
    use_partial,
    victim_allowed,
)
from kvspec.reference.smt.terms import argmin_where, count, first_where, sel
from kvspec.reference.smt.universe import ACTIVE, FREE, INACTIVE, NONE, PARTIAL, RESERVED
from kvspec.spec.rules import RuleId as R

Term: TypeAlias = z3.ExprRef

STATUS_NO_HITS, STATUS_SCHEDULED = 3, 4
STATUS_NAMES = {
    STATUS_OK: "ok",
    STATUS_CAPACITY: "capacity",
    STATUS_BLOCKED: "blocked_on_offload",
    STATUS_NO_HITS: "no_hits",
    STATUS_SCHEDULED: "scheduled",
}


# ------------------------------------------------------------------ arguments


@dataclass
class BlockArg:
    """One block of a Use or Deref: full block ``h``, or partial block ``u``."""

    full: z3.BoolRef | bool
    h: Term | int = 0
    u: Term | int = 0


@dataclass
class UseOp:
    blocks: list[BlockArg]
    parent: Term | int = NONE


@dataclass
class DerefOp:
    blocks: list[BlockArg]


@dataclass
class PromoteOp:
    u: Term | int
    h: Term | int
    p: Term | int = NONE


@dataclass
class TickOp:
    #: False: a tick earlier than the clock (TIME-MONOTONIC: changes nothing)
    forward: z3.BoolRef | bool = True


@dataclass
class SwapInOp:
    blocks: list[Term | int]
    parent: Term | int = NONE


Op = UseOp | DerefOp | PromoteOp | TickOp | SwapInOp


# --------------------------------------------------------------------- output


@dataclass
class OpOutcome:
    kind: str  # "use", "deref", "promote", "tick", "swap_in"
    post: State
    #: the operation is accepted (else: rejected with ``error``, nothing changes)
    valid: z3.BoolRef
    error: str | None
    #: the result value (None for operations that return nothing)
    value: Term | None
    status: Term
    #: every block the steps published, in order, with the condition it was
    #: published under (``events.assemble`` groups them into KvEvents)
    frags: list[tuple[z3.BoolRef, Frag]]
    #: the parent of the operation's Stored (Use: the last reused block or
    #: the caller's parent; Promote: the caller's parent)
    stored_parent: Term | None = None
    #: choices the steps made must be ones their rules allow
    constraints: list[z3.BoolRef] = field(default_factory=list)
    #: INV-ANCHOR at the level of the operation: every device Stored's parent
    #: is the root or in the router's device view when the router applies it
    anchor_ok: z3.BoolRef = field(default_factory=lambda: z3.BoolVal(True))
    #: the victims the eviction steps chose, in order (when each was taken)
    victims: list[tuple[z3.BoolRef, Term]] = field(default_factory=list)
    #: caller contract id -> the condition the operation's steps assume (the
    #: caller kept it); the operation-level proofs assume these, the
    #: agreement lockstep evaluates them on every concrete step
    contracts: dict[str, z3.BoolRef] = field(default_factory=dict)


# -------------------------------------------------------------------- choices


class Chooser:
    """Makes the rules' choices. Free slots, holders, jobs and the slot order
    of a swap-in are canonical (lowest index: slots are interchangeable);
    the eviction victim follows ``policy``: "lru" is the model's LRU policy
    (and the default pick of "unordered"); with ``free_victims`` the solver
    may pick any victim the policy allows (ties under "unordered")."""

    def __init__(
        self,
        policy: Policy = "lru",
        *,
        free_victims: bool = False,
        prefix: str = "ch",
        mutate: Callable[[EncodedStep], EncodedStep] | None = None,
    ) -> None:
        self.policy = policy
        #: an operation-level mutant's change to every step the operation takes (``op_mutants.py``)
        self.mutate = mutate
        self.free_victims = free_victims
        self.prefix = prefix
        self.n = 0

    def victim(self, S: State) -> Term:
        if self.free_victims:
            self.n += 1
            return z3.Int(f"{self.prefix}_victim{self.n}")
        return lru_victim(S)

    def victim_policy(self) -> Policy:
        return self.policy if self.free_victims else "lru"


def free_slot(S: State) -> Term:
    return first_where([S.st[k] == FREE for k in S.slots])


def holder(S: State, h: Term | int) -> Term:
    return first_where([S.holds(k, h) for k in S.slots])


def partial_slot(S: State, u: Term | int) -> Term:
    return first_where([z3.And(S.st[k] == PARTIAL, S.pu[k] == u) for k in S.slots])


def fresh_job(S: State) -> Term:
    return first_where([z3.Not(S.job_live(j)) for j in range(S.bound.jobs)])


def job_slot(S: State, j: Term) -> Term:
    return first_where([z3.And(S.st[k] == RESERVED, S.jid[k] == j) for k in S.slots])


# -------------------------------------------------------------- composition


class _Run:
    """Threads a state through guarded steps; with ``concrete`` it simplifies
    after each step so conditions of a concrete state become literals and
    untaken branches are not built at all."""

    def __init__(self, S: State, concrete: bool, mutate: Callable[[EncodedStep], EncodedStep] | None = None) -> None:
        self.state = S
        self.concrete = concrete
        self.mutate = mutate
        self.constraints: list[z3.BoolRef] = []
        self.frags: list[tuple[z3.BoolRef, Frag]] = []
        self.victims: list[tuple[z3.BoolRef, Term]] = []
        self.contracts: dict[str, list[z3.BoolRef]] = {}

    def lit(self, c: z3.BoolRef | bool) -> z3.BoolRef | bool:
        if isinstance(c, bool):
            return c
        if self.concrete:
            v = z3.simplify(c)
            if z3.is_true(v):
                return True
            if z3.is_false(v):
                return False
            return v
        return c

    def pick(self, t: Term) -> Term:
        """A choice term (which slot, which victim): a literal on a concrete state."""
        return z3.simplify(t) if self.concrete else t

    def take(self, make: Callable[[State], EncodedStep], cond: z3.BoolRef | bool = True) -> EncodedStep | None:
        """Take the step ``make(state)`` when ``cond`` holds."""
        c = self.lit(cond)
        if c is False:
            return None
        step = make(self.state)
        if self.mutate is not None:
            step = self.mutate(step)
        guard = z3.BoolVal(True) if c is True else c
        self.constraints.append(z3.Implies(guard, step.enabled("valid", "choice")))
        for cid, cond in step.contracts().items():
            self.contracts.setdefault(cid, []).append(z3.Implies(guard, cond))
        for f in step.frags:
            self.frags.append((z3.And(guard, f.when), f))
        if "v" in step.params:
            taken = step.rules.get(R.QUARANTINE_HOLD, z3.BoolVal(False))
            self.victims.append((z3.And(guard, taken), step.params["v"]))
        if c is True:
            self.state = step.post
        else:
            self.state = merge(c, step.post, self.state)
        if self.concrete:
            self.state = self.state.simplified()
        return step


def _contracts(run: _Run, under: z3.BoolRef | None = None) -> dict[str, z3.BoolRef]:
    out = {cid: z3.And(cs) for cid, cs in run.contracts.items()}
    return out if under is None else {cid: z3.Implies(under, c) for cid, c in out.items()}


def merge(c: z3.BoolRef, a: State, b: State) -> State:
    """The state ``a`` when ``c`` holds, else ``b``."""
    return a.map2(b, lambda x, y: z3.If(c, x, y))


def _frags(run: _Run, tier: str, kind: str, since: int = 0) -> list[tuple[z3.BoolRef, Frag]]:
    return [(w, f) for w, f in run.frags[since:] if f.tier == tier and f.kind == kind]


# -------------------------------------------------------------------- the ops


def apply_use(S: State, op: UseOp, ch: Chooser, concrete: bool = False) -> OpOutcome:
    """A Use of a batch (kvbm, offload tier): blocks in order until one finds
    no slot; a stop that started an offload evicts as many more victims as the
    rest of the batch would need (OFFLOAD-BLOCKS-USE). One Stored for the new
    blocks, parent the last reused block (or the caller's); then one Removed."""
    run = _Run(S, concrete, ch.mutate)
    stopped: z3.BoolRef | bool = False
    status: Term = z3.IntVal(STATUS_OK)
    placed: Term = z3.IntVal(0)
    anchor: Term = z3.IntVal(op.parent) if isinstance(op.parent, int) else op.parent
    mparent: Term = anchor
    extension: Term = z3.IntVal(0)
    pol = ch.victim_policy()
    for i, b in enumerate(op.blocks):
        active = run.lit(z3.Not(stopped) if not isinstance(stopped, bool) else not stopped)
        before = run.state
        is_full = run.lit(b.full)
        hit = z3.And(b.full, before.is_registered(b.h))

        def one(
            St: State, b: BlockArg = b, mp: Term = mparent, a: Term = anchor, is_full: object = is_full
        ) -> EncodedStep:
            pk = run.pick
            if is_full is not False:
                full = use_full(
                    St, b.h, a, mp, t=pk(holder(St, b.h)), s=pk(free_slot(St)), v=pk(ch.victim(St)), policy=pol
                )
                if is_full is True:
                    return full
            part = use_partial(St, b.u, s=pk(free_slot(St)), v=pk(ch.victim(St)), policy=pol)
            if is_full is False:
                return part
            return _choose_step(b.full, full, part)

        step = run.take(one, active)
        if step is None:
            continue
        act = z3.BoolVal(True) if active is True else active
        anchor = z3.If(z3.And(act, hit), b.h, anchor)
        mparent = z3.If(z3.And(act, b.full, step.placed), b.h, mparent)
        placed = placed + z3.If(z3.And(act, step.placed), 1, 0)
        stop_here = z3.And(act, z3.Not(step.placed))
        status = z3.If(stop_here, step.status, status)
        # the rest of the batch: how many blocks would still need a slot
        rest = [
            z3.If(r.full, z3.Not(run.state.is_registered(r.h)), z3.Not(run.state.held_partial(r.u)))
            for r in op.blocks[i + 1 :]
        ]
        extension = z3.If(z3.And(stop_here, step.status == STATUS_BLOCKED), count(rest), extension)
        stopped = run.lit(z3.Or(stopped, stop_here))
        if concrete:
            status, placed, anchor, mparent, extension = (
                z3.simplify(x) for x in (status, placed, anchor, mparent, extension)
            )
    for e in range(len(op.blocks) - 1):
        cond = z3.And(e < extension, z3.Not(run.state.free_c > 0), run.state.any_inactive())
        run.take(lambda St: evict(St, v=run.pick(ch.victim(St)), policy=pol), cond)
    any_stored = z3.Or([w for w, _ in _frags(run, "device", "stored")] or [z3.BoolVal(False)])
    return OpOutcome(
        "use",
        post=run.state,
        valid=z3.BoolVal(True),
        error=None,
        value=placed,
        status=status,
        frags=run.frags,
        stored_parent=anchor,
        constraints=run.constraints,
        contracts=_contracts(run),
        anchor_ok=z3.Implies(any_stored, z3.Or(anchor == NONE, S.dev_has(anchor))),
        victims=run.victims,
    )


def _choose_step(c: z3.BoolRef, a: EncodedStep, b: EncodedStep) -> EncodedStep:
    """A step that is ``a`` when ``c`` holds, else ``b`` (a Use block whose
    kind, full or partial, the solver picks)."""
    out = EncodedStep(f"{a.name}|{b.name}", a.pre, merge(c, a.post, b.post))
    out.requires = {
        "either": ("valid", z3.If(c, a.enabled("valid"), b.enabled("valid"))),
        "either-choice": ("choice", z3.If(c, a.enabled("choice"), b.enabled("choice"))),
    }
    # each side's caller contracts, under their own ids, where that side is taken
    no_contract = z3.BoolVal(True)
    for cid in {**a.contracts(), **b.contracts()}:
        out.require(cid, "contract", z3.If(c, a.contracts().get(cid, no_contract), b.contracts().get(cid, no_contract)))
    out.frags = [Frag(z3.And(c, f.when), f.tier, f.kind, f.block, f.parent, f.starts_group) for f in a.frags]
    out.frags += [Frag(z3.And(z3.Not(c), f.when), f.tier, f.kind, f.block, f.parent, f.starts_group) for f in b.frags]
    out.placed = z3.If(c, a.placed, b.placed)
    out.status = z3.If(c, a.status, b.status)
    no = z3.BoolVal(False)
    out.rules = {
        k: z3.Or(z3.And(c, a.rules.get(k, no)), z3.And(z3.Not(c), b.rules.get(k, no))) for k in {*a.rules, *b.rules}
    }
    out.params = {**b.params, **a.params}
    if "v" in a.params and "v" in b.params:
        out.params["v"] = z3.If(c, a.params["v"], b.params["v"])
    return out


def apply_deref(S: State, op: DerefOp, ch: Chooser, concrete: bool = False) -> OpOutcome:
    """A Deref: each block in order loses one owner (DEREF-OWNER) or, partial,
    frees its slot (DEREF-PARTIAL). If any block is not held (DEREF-UNKNOWN)
    the whole operation is rejected and nothing changes."""
    run = _Run(S, concrete, ch.mutate)
    valid: list[z3.BoolRef] = []
    for b in op.blocks:
        is_full = run.lit(b.full)

        def one(St: State, b: BlockArg = b, is_full: object = is_full) -> EncodedStep:
            if is_full is True:
                return deref_full(St, b.h, t=run.pick(holder(St, b.h)))
            if is_full is False:
                return deref_partial(St, b.u, s=run.pick(partial_slot(St, b.u)))
            return _choose_step(
                b.full, deref_full(St, b.h, t=holder(St, b.h)), deref_partial(St, b.u, s=partial_slot(St, b.u))
            )

        before = run.state
        ok = z3.If(
            b.full,
            z3.Or([z3.And(before.holds(k, b.h), before.own[k] >= 1) for k in before.slots]),
            before.held_partial(b.u),
        )
        valid.append(ok)
        step = run.take(one, ok)
        if step is None:
            break
    ok_all = z3.And(valid) if valid else z3.BoolVal(True)
    post = merge(ok_all, run.state, S) if not concrete else (run.state if z3.is_true(z3.simplify(ok_all)) else S)
    return OpOutcome(
        "deref",
        post,
        ok_all,
        R.DEREF_UNKNOWN,
        None,
        z3.IntVal(STATUS_OK),
        [],
        constraints=[z3.Implies(ok_all, c) for c in run.constraints],
        contracts=_contracts(run, ok_all),
    )


def apply_promote(S: State, op: PromoteOp, ch: Chooser, concrete: bool = False) -> OpOutcome:
    run = _Run(S, concrete, ch.mutate)
    ok = S.held_partial(op.u)
    step = run.take(
        lambda St: promote(St, op.u, op.h, op.p, s=run.pick(partial_slot(St, op.u)), t=run.pick(holder(St, op.h))), ok
    )
    p = z3.IntVal(op.p) if isinstance(op.p, int) else op.p
    any_stored = z3.Or([w for w, _ in _frags(run, "device", "stored")] or [z3.BoolVal(False)])
    return OpOutcome(
        "promote",
        run.state,
        ok,
        R.PROMOTE_UNKNOWN,
        None,
        z3.IntVal(STATUS_OK),
        run.frags,
        stored_parent=p,
        constraints=run.constraints,
        contracts=_contracts(run),
        anchor_ok=z3.Implies(any_stored, z3.Or(p == NONE, S.dev_has(p))) if step else z3.BoolVal(True),
    )


def apply_tick(S: State, op: TickOp, ch: Chooser, concrete: bool = False) -> OpOutcome:
    """A forward Tick (instant transfers): every pending transfer completes,
    in queue order: an offload frees its slot and stores its block in G2
    (QUARANTINE-RELEASE, G2-EVICT, G2-STORE-ON-COMPLETE); a swap-in job
    registers its slots in order (SWAPIN-SKIP-PRESENT, SWAPIN-ANCHOR)."""
    run = _Run(S, concrete, ch.mutate)
    n = S.bound.slots
    done: Term = z3.IntVal(0)
    anchor_ok: list[z3.BoolRef] = []
    for _ in range(n):
        St = run.state
        pend = [St.pend[k] for k in St.slots]
        live = [St.job_live(j) for j in range(St.bound.jobs)]
        any_pending = z3.And(op.forward, z3.Or(*pend, *live))
        if run.lit(any_pending) is False:
            break
        # the next transfer: the smallest queue position among both kinds
        nxt = argmin_where(pend + live, [St.pord[k] for k in St.slots] + [St.jord[j] for j in range(St.bound.jobs)])
        if concrete:
            nxt = z3.simplify(nxt)
        is_offload = z3.And(any_pending, nxt < n)
        is_onboard = z3.And(any_pending, nxt >= n)
        done = done + z3.If(any_pending, 1, 0)

        def complete(St: State, nxt: Term = nxt) -> EncodedStep:
            return offload_complete(St, nxt, w=run.pick(g2_victim(St)), g2_lru=True)

        run.take(complete, is_offload)
        j = nxt - n
        for i in range(n):
            cond = z3.And(is_onboard, run.state.job_live(j) if i == 0 else run.state.busy == j)

            def register(St: State, j: Term = j) -> EncodedStep:
                return swapin_register(St, j, k=run.pick(job_slot(St, j)), ordered=True)

            step = run.take(register, cond)
            if step is None:
                if run.lit(cond) is False:
                    break
                continue
            anchor_ok += [
                z3.Implies(z3.And(cond, a.when), z3.Or(a.parent == NONE, sel(a.view, a.parent))) for a in step.anchors
            ]
    if concrete:
        done = z3.simplify(done)
    return OpOutcome(
        "tick",
        run.state,
        z3.BoolVal(True),
        None,
        done,
        z3.IntVal(STATUS_OK),
        run.frags,
        constraints=run.constraints,
        contracts=_contracts(run),
        anchor_ok=z3.And(anchor_ok) if anchor_ok else z3.BoolVal(True),
        victims=run.victims,
    )


def apply_swap_in(S: State, op: SwapInOp, ch: Chooser, concrete: bool = False) -> OpOutcome:
    """SWAPIN-RESERVE: the longest prefix of the blocks that G2 holds gets one
    reserved G1 slot each, if there are enough free slots (one job, queued);
    otherwise, if there are inactive blocks, the swap-in is blocked on a G1
    offload and evicts as many victims as it lacks slots; otherwise no hits."""
    run = _Run(S, concrete, ch.mutate)
    in_prefix: list[z3.BoolRef] = []
    acc: z3.BoolRef = z3.BoolVal(True)
    for h in op.blocks:
        acc = z3.And(acc, S.g2_has(h))
        in_prefix.append(acc)
    k = count(in_prefix)
    enough = z3.And(k >= 1, S.free_c >= k)
    blocked = z3.And(k >= 1, z3.Not(S.free_c >= k), S.any_inactive())
    j = run.pick(fresh_job(S))
    p = z3.IntVal(op.parent) if isinstance(op.parent, int) else op.parent
    for i, h in enumerate(op.blocks):

        def reserve(St: State, h: Term | int = h) -> EncodedStep:
            return swapin_reserve(St, j, h, p, s=run.pick(free_slot(St)))

        run.take(reserve, z3.And(enough, in_prefix[i]))
    lacking = k - S.free_c
    pol = ch.victim_policy()
    for e in range(len(op.blocks)):
        run.take(
            lambda St: evict(St, v=run.pick(ch.victim(St)), policy=pol),
            z3.And(blocked, e < lacking, run.state.any_inactive()),
        )
    status = z3.If(enough, STATUS_SCHEDULED, z3.If(blocked, STATUS_BLOCKED, STATUS_NO_HITS))
    return OpOutcome(
        "swap_in",
        run.state,
        z3.BoolVal(True),
        None,
        z3.If(enough, k, 0),
        status,
        run.frags,
        constraints=run.constraints,
        contracts=_contracts(run),
        victims=run.victims,
    )


def apply_op(S: State, op: Op, ch: Chooser, concrete: bool = False) -> OpOutcome:
    if isinstance(op, UseOp):
        return apply_use(S, op, ch, concrete)
    if isinstance(op, DerefOp):
        return apply_deref(S, op, ch, concrete)
    if isinstance(op, PromoteOp):
        return apply_promote(S, op, ch, concrete)
    if isinstance(op, TickOp):
        return apply_tick(S, op, ch, concrete)
    if isinstance(op, SwapInOp):
        return apply_swap_in(S, op, ch, concrete)
    raise TypeError(f"not an operation of the encoding: {op!r}")


def counters(S: State) -> dict[str, Term]:
    """The wire counters (spec.wire.Counters) of a state, as the model reports
    them: partial blocks and held slots (quarantined, reserved) count as active."""
    partial = S.census(PARTIAL)
    return {
        "active_blocks": partial + S.afull_c + S.quar_c + S.resv_c,
        "active_refs": partial + S.refs_c,
        "inactive_blocks": S.census(INACTIVE),
        "free_blocks": S.free_c,
        "quarantined_blocks": S.quar_c,
    }


__all__ = ["ACTIVE", "Chooser", "OpOutcome", "apply_op", "counters", "victim_allowed"]
