"""The transition rules of the kvbm profile with an offload tier, in z3.

One function per operation, each the relation between a pre-state and a
post-state for given inputs, written to be read beside spec/SPEC.md: every
guard is named after the rule that owns it (``step.rules``), every
precondition after the rule that rejects the operation or the caller
contract it assumes (``step.requires``). Compare with ``reference/g1.py``:
the same rules, one block at a time.

Granularity. The model's operations are sequences of these steps (see
``ops.py``): a Use of a batch is one ``use_full``/``use_partial`` per block
until one stops, then as many ``evict`` steps as the rest of the batch would
need (OFFLOAD-BLOCKS-USE); a Tick is one ``offload_complete`` or
``swapin_register`` per due transfer; a SwapIn is one ``swapin_reserve`` per
block of the G2 prefix, or ``evict`` steps when it blocks. With an offload
tier an eviction always stops the Use, so a batch never stores a block it
also removes; applying each step's events at once leaves the router's view
where the batch's events leave it.

Eviction policy. ``policy="unordered"`` lets the victim be any inactive
block; every policy of the spec (lineage, LRU, multi-LRU) picks an inactive
block, so what is proven under "unordered" holds under each of them.
``policy="lru"`` fixes the victim to the block longest in the inactive pool,
as the model's LRU policy does (used to compare with the model and to find
witnesses).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeAlias

import z3

from kvspec.reference.smt.offload.state import State
from kvspec.reference.smt.offload.step import (
    STATUS_BLOCKED,
    STATUS_CAPACITY,
    STATUS_OK,
    Anchor,
    EncodedStep,
    Frag,
    publish,
)
from kvspec.reference.smt.terms import argmin_where, is_min, sel, upd
from kvspec.reference.smt.universe import ACTIVE, FREE, INACTIVE, NONE, PARTIAL, QUARANTINED, RESERVED
from kvspec.spec.rules import RuleId as R

Term: TypeAlias = z3.ExprRef
#: a named policy, or (for mutants) a predicate "slot v may be the victim"
Policy = Literal["unordered", "lru"] | Callable[[State, Term], z3.BoolRef]
#: how a rule finds a block in G1's registry (mutants replace it)
Lookup = Callable[[State, Term], z3.BoolRef]


def registry_lookup(S: State, h: Term) -> z3.BoolRef:
    """Is block ``h`` registered in G1 (active or inactive)?"""
    return S.is_registered(h)


#: caller contracts (spec/INVARIANTS.md): only INV-ANCHOR needs them
ASSUME_PARENT_REGISTERED = "ASSUME-PARENT-REGISTERED"
ASSUME_SWAPIN_PARENT_HELD = "ASSUME-SWAPIN-PARENT-HELD"


def _slot(S: State, i: Term) -> z3.BoolRef:
    return z3.And(0 <= i, i < S.bound.slots)


def victim_allowed(S: State, v: Term, policy: Policy) -> z3.BoolRef:
    """EVICT-POLICY: the victim is an inactive block the policy allows."""
    if callable(policy):
        return policy(S, v)
    inactive = [S.st[k] == INACTIVE for k in S.slots]
    if policy == "lru":
        return is_min(v, inactive, S.itick)
    return z3.And(_slot(S, v), sel(inactive, v))


def lru_victim(S: State) -> Term:
    """The LRU policy's victim: the block longest in the inactive pool."""
    return argmin_where([S.st[k] == INACTIVE for k in S.slots], S.itick)


# ---------------------------------------------------------------- shared parts


def _hit(S: State, t: Term, when: z3.BoolRef) -> State:
    """USE-HIT-ACTIVE / USE-HIT-INACTIVE: the block in slot ``t`` gains an owner;
    an inactive one leaves the pool and becomes active."""
    was_inactive = z3.And(when, sel(S.st, t) == INACTIVE)
    return S.but(
        st=upd(S.st, t, ACTIVE, when),
        own=upd(S.own, t, sel(S.own, t) + 1, when),
        afull_c=S.afull_c + z3.If(was_inactive, 1, 0),
        refs_c=S.refs_c + z3.If(when, 1, 0),
    )


def _quarantine(S: State, v: Term, when: z3.BoolRef) -> tuple[State, list[Frag]]:
    """Evict the inactive block in slot ``v`` with an offload tier attached:
    QUARANTINE-HOLD (the slot is held, not freed, while its transfer to G2 is
    pending) and DEVICE-REMOVE-IMMEDIATE (device Removed now)."""
    h = sel(S.blk, v)
    post = S.but(
        st=upd(S.st, v, QUARANTINED, when),
        pend=upd(S.pend, v, z3.BoolVal(True), when),
        pblk=upd(S.pblk, v, h, when),
        pmpar=upd(S.pmpar, v, sel(S.mpar, v), when),
        pord=upd(S.pord, v, S.qclock, when),
        qclock=S.qclock + z3.If(when, 1, 0),
        quar_c=S.quar_c + z3.If(when, 1, 0),
    )
    return post, [Frag(when, "device", "removed", h)]


def _finish(step: EncodedStep) -> EncodedStep:
    """Every step but a swap-in registration's waits for a registration in
    progress to finish (the model registers a job within one operation);
    then the router applies the step's events."""
    if step.name != "swapin_register":
        step.require("ONBOARD-ATOMIC", "valid", step.pre.busy == NONE)
    step.post = publish(step.pre, step.post, step.frags)
    return step


# ------------------------------------------------------------------ Use


def use_full(
    S: State,
    h: Term,
    a: Term,
    m: Term,
    *,
    t: Term,
    s: Term,
    v: Term,
    policy: Policy = "unordered",
    lookup: Lookup = registry_lookup,
) -> EncodedStep:
    """Use of one full block ``h``; ``a`` is the parent the batch's Stored names
    (the caller's parent or the last reused block), ``m`` the block before
    ``h`` in the batch (recorded as its parent). Choices: ``t`` the slot that
    holds ``h`` if registered, ``s`` the free slot it takes, ``v`` the victim."""
    step = EncodedStep("use(full)", S, S, params={"h": h, "a": a, "m": m, "t": t, "s": s, "v": v})
    step.require(ASSUME_PARENT_REGISTERED, "contract", z3.Or(a == NONE, S.is_registered(a)))
    hit = lookup(S, h)
    holds_h = z3.Or([z3.And(t == k, S.holds(k, h)) for k in S.slots])
    step.require("CHOICE-HOLDER", "choice", z3.Implies(hit, z3.And(_slot(S, t), holds_h)))
    new = z3.And(z3.Not(hit), S.free_c > 0)
    step.require("CHOICE-FREE-SLOT", "choice", z3.Implies(new, z3.And(_slot(S, s), sel(S.st, s) == FREE)))
    no_slot = z3.And(z3.Not(hit), z3.Not(S.free_c > 0))
    blocked = z3.And(no_slot, S.any_inactive())
    step.require("CHOICE-VICTIM", "choice", z3.Implies(blocked, victim_allowed(S, v, policy)))
    capacity = z3.And(no_slot, z3.Not(S.any_inactive()))
    step.rules = {
        R.USE_HIT_ACTIVE: z3.And(hit, sel(S.st, t) == ACTIVE),
        R.USE_HIT_INACTIVE: z3.And(hit, sel(S.st, t) == INACTIVE),
        R.USE_NEW: new,
        R.OFFLOAD_BLOCKS_USE: blocked,
        R.QUARANTINE_HOLD: blocked,
        R.USE_CAPACITY: capacity,
    }
    post = _hit(S, t, hit)
    # USE-NEW: take a free slot and register h there with one owner; Stored
    post = post.but(
        st=upd(post.st, s, ACTIVE, new),
        blk=upd(post.blk, s, h, new),
        own=upd(post.own, s, z3.IntVal(1), new),
        mpar=upd(post.mpar, s, m, new),
        free_c=post.free_c - z3.If(new, 1, 0),
        afull_c=post.afull_c + z3.If(new, 1, 0),
        refs_c=post.refs_c + z3.If(new, 1, 0),
    )
    step.frags.append(Frag(new, "device", "stored", h, parent=a, starts_group=True))
    step.anchors.append(Anchor(new, a, list(S.dev)))
    # no free slot: evicting starts an offload, the Use stops (OFFLOAD-BLOCKS-USE)
    post, frags = _quarantine(post, v, blocked)
    step.frags += frags
    step.post = post
    step.placed = z3.Or(hit, new)
    step.status = z3.If(blocked, STATUS_BLOCKED, z3.If(capacity, STATUS_CAPACITY, STATUS_OK))
    return _finish(step)


def use_partial(S: State, u: Term, *, s: Term, v: Term, policy: Policy = "unordered") -> EncodedStep:
    """Use of one partial block ``u`` (USE-PARTIAL): nothing if held, else a slot."""
    step = EncodedStep("use(partial)", S, S, params={"u": u, "s": s, "v": v})
    held = S.held_partial(u)
    new = z3.And(z3.Not(held), S.free_c > 0)
    step.require("CHOICE-FREE-SLOT", "choice", z3.Implies(new, z3.And(_slot(S, s), sel(S.st, s) == FREE)))
    no_slot = z3.And(z3.Not(held), z3.Not(S.free_c > 0))
    blocked = z3.And(no_slot, S.any_inactive())
    step.require("CHOICE-VICTIM", "choice", z3.Implies(blocked, victim_allowed(S, v, policy)))
    capacity = z3.And(no_slot, z3.Not(S.any_inactive()))
    step.rules = {
        R.USE_PARTIAL: z3.Or(held, new),
        R.OFFLOAD_BLOCKS_USE: blocked,
        R.QUARANTINE_HOLD: blocked,
        R.USE_CAPACITY: capacity,
    }
    post = S.but(
        st=upd(S.st, s, PARTIAL, new),
        pu=upd(S.pu, s, u, new),
        free_c=S.free_c - z3.If(new, 1, 0),
    )
    post, frags = _quarantine(post, v, blocked)
    step.frags += frags
    step.post = post
    step.placed = z3.Or(held, new)
    step.status = z3.If(blocked, STATUS_BLOCKED, z3.If(capacity, STATUS_CAPACITY, STATUS_OK))
    return _finish(step)


# ---------------------------------------------------------------- Deref


def deref_full(S: State, h: Term, *, t: Term) -> EncodedStep:
    """Deref of one full block (DEREF-OWNER): one owner less; at zero the block
    becomes inactive and enters the pool as its newest member."""
    step = EncodedStep("deref(full)", S, S, params={"h": h, "t": t})
    step.require(R.DEREF_UNKNOWN, "valid", z3.Or([z3.And(S.holds(k, h), S.own[k] >= 1) for k in S.slots]))
    owned = z3.Or([z3.And(t == k, S.holds(k, h), S.own[k] >= 1) for k in S.slots])
    step.require("CHOICE-HOLDER", "choice", z3.And(_slot(S, t), owned))
    last = sel(S.own, t) == 1
    anchors_swapin = z3.Or([z3.And(S.job_live(j), S.jpar[j] == h) for j in range(S.bound.jobs)])
    step.require(ASSUME_SWAPIN_PARENT_HELD, "contract", z3.Not(z3.And(last, anchors_swapin)))
    step.rules = {R.DEREF_OWNER: z3.BoolVal(True)}
    step.post = S.but(
        own=upd(S.own, t, sel(S.own, t) - 1),
        refs_c=S.refs_c - 1,
        st=upd(S.st, t, INACTIVE, last),
        itick=upd(S.itick, t, S.clock, last),
        clock=S.clock + z3.If(last, 1, 0),
        afull_c=S.afull_c - z3.If(last, 1, 0),
    )
    return _finish(step)


def deref_partial(S: State, u: Term, *, s: Term) -> EncodedStep:
    """Deref of a partial block (DEREF-PARTIAL): its slot goes back to free."""
    step = EncodedStep("deref(partial)", S, S, params={"u": u, "s": s})
    step.require(R.DEREF_UNKNOWN, "valid", S.held_partial(u))
    step.require("CHOICE-PARTIAL-SLOT", "choice", z3.And(_slot(S, s), sel(S.st, s) == PARTIAL, sel(S.pu, s) == u))
    step.rules = {R.DEREF_PARTIAL: z3.BoolVal(True)}
    step.post = S.but(st=upd(S.st, s, FREE), free_c=S.free_c + 1)
    return _finish(step)


# -------------------------------------------------------------- Promote


def promote(S: State, u: Term, h: Term, p: Term, *, s: Term, t: Term) -> EncodedStep:
    """Promote partial ``u`` to full block ``h`` with parent ``p``."""
    step = EncodedStep("promote", S, S, params={"u": u, "h": h, "p": p, "s": s, "t": t})
    step.require(R.PROMOTE_UNKNOWN, "valid", S.held_partial(u))
    step.require("CHOICE-PARTIAL-SLOT", "choice", z3.And(_slot(S, s), sel(S.st, s) == PARTIAL, sel(S.pu, s) == u))
    step.require(ASSUME_PARENT_REGISTERED, "contract", z3.Or(p == NONE, S.is_registered(p)))
    exists = S.is_registered(h)
    holds_h = z3.Or([z3.And(t == k, S.holds(k, h)) for k in S.slots])
    step.require("CHOICE-HOLDER", "choice", z3.Implies(exists, z3.And(_slot(S, t), holds_h)))
    new = z3.Not(exists)
    step.rules = {R.PROMOTE_EXISTING: exists, R.PROMOTE_NEW: new}
    # PROMOTE-EXISTING: the partial slot goes back to free, the block gains an owner
    post = S.but(st=upd(S.st, s, FREE, exists), free_c=S.free_c + z3.If(exists, 1, 0))
    post = _hit(post, t, exists)
    # PROMOTE-NEW: registered in place with one owner; Stored
    post = post.but(
        st=upd(post.st, s, ACTIVE, new),
        blk=upd(post.blk, s, h, new),
        own=upd(post.own, s, z3.IntVal(1), new),
        mpar=upd(post.mpar, s, p, new),
        afull_c=post.afull_c + z3.If(new, 1, 0),
        refs_c=post.refs_c + z3.If(new, 1, 0),
    )
    step.frags.append(Frag(new, "device", "stored", h, parent=p, starts_group=True))
    step.anchors.append(Anchor(new, p, list(S.dev)))
    step.post = post
    return _finish(step)


# ------------------------------------------------------------- eviction


def evict(S: State, *, v: Term, policy: Policy = "unordered") -> EncodedStep:
    """One eviction step with an offload tier (a blocked Use or swap-in taking
    as many victims as it still needs): EVICT-POLICY picks an inactive block,
    QUARANTINE-HOLD keeps its slot, DEVICE-REMOVE-IMMEDIATE announces it."""
    step = EncodedStep("evict", S, S, params={"v": v})
    step.require(R.EVICT_POLICY, "valid", S.any_inactive())
    step.require("CHOICE-VICTIM", "choice", victim_allowed(S, v, policy))
    step.rules = {
        R.EVICT_POLICY: z3.BoolVal(True),
        R.QUARANTINE_HOLD: z3.BoolVal(True),
        R.DEVICE_REMOVE_IMMEDIATE: z3.BoolVal(True),
    }
    step.post, step.frags = _quarantine(S, v, z3.BoolVal(True))
    return _finish(step)


# ------------------------------------------------------ offload completion


def g2_victim(S: State) -> Term:
    """G2's LRU victim: the block G2 used least recently."""
    return argmin_where(list(S.g2), S.g2t)


def offload_complete(S: State, s: Term, *, w: Term, g2_lru: bool = False) -> EncodedStep:
    """The offload transfer out of slot ``s`` completes. Choice: ``w`` the G2
    victim when G2 is full: any block G2 holds, or with ``g2_lru`` the one G2
    used least recently (the model's G2 policy). The proofs leave it free, so
    they hold for any G2 eviction policy."""
    step = EncodedStep("offload_complete", S, S, params={"s": s, "w": w})
    step.require("PENDING", "valid", z3.And(_slot(S, s), sel(S.pend, s)))
    h = sel(S.pblk, s)
    in_g2 = sel(S.g2, h)
    full = z3.And(z3.Not(in_g2), S.g2_count() >= S.rigid.cap2)
    g2_ok = is_min(w, list(S.g2), S.g2t) if g2_lru else sel(S.g2, w)
    step.require("CHOICE-G2-VICTIM", "choice", z3.Implies(full, z3.And(0 <= w, w < S.bound.hashes, g2_ok)))
    release = sel(S.st, s) == QUARANTINED
    step.rules = {
        R.QUARANTINE_RELEASE: release,
        R.G2_EVICT: full,
        R.G2_STORE_ON_COMPLETE: z3.Not(in_g2),
    }
    # QUARANTINE-RELEASE: the source slot goes back to free, exactly once
    post = S.but(
        pend=upd(S.pend, s, z3.BoolVal(False)),
        st=upd(S.st, s, FREE, release),
        quar_c=S.quar_c - z3.If(release, 1, 0),
        free_c=S.free_c + z3.If(release, 1, 0),
    )
    # G2-EVICT: a full G2 drops its LRU block, host-pinned Removed
    g2 = upd(post.g2, w, z3.BoolVal(False), full)
    step.frags.append(Frag(full, "host_pinned", "removed", w))
    # G2-STORE-ON-COMPLETE: G2 holds h now (or uses it again), host-pinned Stored
    g2 = upd(g2, h, z3.BoolVal(True))
    post = post.but(
        g2=g2,
        g2t=upd(post.g2t, h, post.g2clock),
        g2clock=post.g2clock + 1,
        g2par=upd(post.g2par, h, sel(S.pmpar, s), z3.Not(in_g2)),
    )
    step.frags.append(Frag(z3.Not(in_g2), "host_pinned", "stored", h, parent=sel(S.pmpar, s), starts_group=True))
    step.post = post
    return _finish(step)


# ---------------------------------------------------------------- swap-in


def swapin_reserve(S: State, j: Term, h: Term, p: Term, *, s: Term) -> EncodedStep:
    """SWAPIN-RESERVE: reserve one free G1 slot as the destination of G2 block
    ``h`` for swap-in job ``j`` (anchored to ``p``); copying it back counts as
    a use of ``h`` in G2. The first reservation of a job queues its transfer."""
    step = EncodedStep("swapin_reserve", S, S, params={"j": j, "h": h, "p": p, "s": s})
    step.require(R.SWAPIN_RESERVE, "valid", z3.And(0 <= j, j < S.bound.jobs, S.free_c > 0, sel(S.g2, h)))
    step.require("CHOICE-FREE-SLOT", "choice", z3.And(_slot(S, s), sel(S.st, s) == FREE))
    new_job = z3.Not(S.job_live(j))
    step.require(ASSUME_SWAPIN_PARENT_HELD, "contract", z3.Implies(new_job, z3.Or(p == NONE, S.is_active(p))))
    step.rules = {R.SWAPIN_RESERVE: z3.BoolVal(True)}
    step.post = S.but(
        st=upd(S.st, s, RESERVED),
        blk=upd(S.blk, s, h),
        jid=upd(S.jid, s, j),
        free_c=S.free_c - 1,
        resv_c=S.resv_c + 1,
        jpar=upd(S.jpar, j, p, new_job),
        jord=upd(S.jord, j, S.qclock, new_job),
        qclock=S.qclock + z3.If(new_job, 1, 0),
        g2t=upd(S.g2t, h, S.g2clock),
        g2clock=S.g2clock + 1,
    )
    return _finish(step)


def swapin_register(
    S: State,
    j: Term,
    *,
    k: Term,
    ordered: bool = False,
    lookup: Lookup = registry_lookup,
    first_anchor: Callable[[State, Term, Term], Term] | None = None,
) -> EncodedStep:
    """The onboard transfer of swap-in job ``j`` has completed; register its
    reserved slot ``k``. The model registers a whole job at once, its slots in
    order; here each slot is one step, and no other step runs until the job's
    last slot is done (``busy``). The slot either registers its block as
    inactive with a device Stored, in the current group or opening a new one
    anchored to the group's anchor (SWAPIN-ANCHOR), or, when G1 already holds
    the block, goes back to free, closes the group and makes that block the
    next group's anchor (SWAPIN-SKIP-PRESENT).

    ``ordered`` makes ``k`` the job's lowest remaining slot, the order of the
    job's blocks; the proofs leave the order free, covering every order.
    ``first_anchor(S, j, h)`` is the first group's anchor (the swap-in's
    parent; mutants replace it)."""
    step = EncodedStep("swapin_register", S, S, params={"j": j, "k": k})
    in_job = [z3.And(S.st[i] == RESERVED, S.jid[i] == j) for i in S.slots]
    step.require(
        "PENDING", "valid", z3.And(0 <= j, j < S.bound.jobs, S.job_live(j), z3.Or(S.busy == NONE, S.busy == j))
    )
    choice = z3.And(_slot(S, k), sel(in_job, k))
    if ordered:
        choice = z3.And(choice, *[z3.Implies(i < k, z3.Not(in_job[i])) for i in S.slots])
    step.require("CHOICE-RESERVED-SLOT", "choice", choice)
    starting = S.busy == NONE
    h = sel(S.blk, k)
    first = sel(S.jpar, j) if first_anchor is None else first_anchor(S, j, h)
    anchor = z3.If(starting, first, S.ranc)
    mparent = z3.If(starting, sel(S.jpar, j), S.rmpar)
    group_open = z3.And(z3.Not(starting), S.ropen)
    present = lookup(S, h)
    skip, reg = present, z3.Not(present)
    last = z3.Not(z3.Or([z3.And(in_job[i], i != k) for i in S.slots]))
    step.rules = {R.SWAPIN_SKIP_PRESENT: skip, R.SWAPIN_ANCHOR: reg}
    starts = z3.And(reg, z3.Not(group_open))
    step.anchors.append(Anchor(starts, anchor, list(S.dev)))
    step.frags.append(Frag(reg, "device", "stored", h, parent=anchor, starts_group=starts))
    step.post = S.but(
        st=upd(S.st, k, z3.If(skip, FREE, INACTIVE)),
        own=upd(S.own, k, z3.IntVal(0), reg),
        mpar=upd(S.mpar, k, mparent, reg),
        itick=upd(S.itick, k, S.clock, reg),
        clock=S.clock + z3.If(reg, 1, 0),
        free_c=S.free_c + z3.If(skip, 1, 0),
        resv_c=S.resv_c - 1,
        busy=z3.If(last, z3.IntVal(NONE), j),
        ranc=z3.If(skip, h, anchor),
        rmpar=h,
        ropen=reg,
    )
    return _finish(step)
