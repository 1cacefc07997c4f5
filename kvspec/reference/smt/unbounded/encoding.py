"""The INV-* of the kvbm profile with an offload tier, for any number of slots and hashes.

The bounded encoding (``state.py``, ``transitions.py``) names every slot and
hash, so a proof there is for one universe size. Here the same transition
rules are written over an **uninterpreted sort of slots** (z3
``DeclareSort``: any number of them, finite or not) and **unbounded integer
hashes, uuids and jobs**; the per-slot and per-hash fields are z3 arrays and
the invariants are universally quantified formulas (``ForAll`` over at most
one slot or one hash; "two slots" is reduced to one by the ghost maps below).
``unsat`` of "hypothesis, step, not invariant" is then a proof for every
capacity ``n >= 1`` and every number of block hashes at once.

What a quantifier-free, finite encoding counted is carried by ghost state
whose meaning is fixed by construction:

- ``cnt[X]`` -- the census of slots in state X; ``refsum`` -- the sum of the
  active slots' owners; ``jcnt[j]`` -- the reserved slots of job ``j``;
  ``g2n`` -- the blocks G2 holds. They are *defined* as those counts in the
  pre-state, and every write of a slot or of G2 updates them by the
  point-update identity |{x : a'(x) = X}| = |{x : a(x) = X}| - [a(k) = X] +
  [v = X] for a' = a[k := v] (``_write``), so they are exact in the
  post-state as well. The pre-state facts assumed about them
  (``census_facts``) hold of every finite state: counts are >= 0 and add up
  to the capacity, a slot in state X makes ``cnt[X] >= 1``, and
  ``cnt[X] >= 1`` has a witness slot.
- ``reg`` / ``loc`` -- the registered block hashes and the slot holding each;
  ``phel`` / ``ploc`` -- the held partial uuids and their slots. Transitions
  update them explicitly; INV-NO-DUP and INV-PARTIAL-UUID are proven in the
  form "the ghost map and the slots agree both ways", which is equivalent to
  the plain statements (``ghost_checks`` proves the implication; the other
  direction holds by choosing ``reg`` and ``loc`` as the registry). A
  transition that forgot a ghost update would break the agreement and be
  refuted, so the ghosts cannot make a proof pass that should not.

Eviction picks any inactive slot, G2's victim is any block it holds, a
swap-in job's slots register in any order: the "unordered" choices of the
bounded proofs, so what is proven holds under every policy. The transition
rules mirror ``transitions.py`` one for one (same names, same rule ids);
``tests/test_smt_unbounded.py`` checks both encodings give the same verdicts
on every mutant.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.universe import (
    ACTIVE,
    FREE,
    INACTIVE,
    NONE,
    PARTIAL,
    QUARANTINED,
    RESERVED,
    SLOT_STATES,
    SlotSort,
)
from kvspec.spec.rules import RuleId as R

Slot = z3.DeclareSort("Slot")
Int, Bool = z3.IntSort(), z3.BoolSort()
Conjuncts = list[tuple[str, z3.BoolRef]]

#: field -> (index sort, value sort); slot-indexed, hash/job/uuid-indexed (Int)
ARRAYS: dict[str, tuple[Any, Any]] = {
    "st": (Slot, SlotSort),
    "blk": (Slot, Int),
    "own": (Slot, Int),
    "pu": (Slot, Int),
    "mpar": (Slot, Int),
    "itick": (Slot, Int),
    "jid": (Slot, Int),
    "pend": (Slot, Bool),
    "pblk": (Slot, Int),
    "pmpar": (Slot, Int),
    "pord": (Slot, Int),
    "jpar": (Int, Int),
    "jord": (Int, Int),
    "dev": (Int, Bool),
    "g2": (Int, Bool),
    "g2v": (Int, Bool),
    "g2t": (Int, Int),
    "g2par": (Int, Int),
    # ghosts
    "jcnt": (Int, Int),
    "reg": (Int, Bool),
    "loc": (Int, Slot),
    "phel": (Int, Bool),
    "ploc": (Int, Slot),
}
SCALARS = [
    "free_c",
    "afull_c",
    "refs_c",
    "quar_c",
    "resv_c",
    "clock",
    "g2clock",
    "qclock",
    "busy",
    "ranc",
    "rmpar",
    "refsum",
    "g2n",
] + [f"cnt_{n}" for n in SLOT_STATES]


@dataclass(frozen=True)
class UState:
    """One state: ``a[name]`` the arrays, ``v[name]`` the scalars (Int), ``ropen``."""

    a: dict[str, z3.ArrayRef]
    v: dict[str, z3.ArithRef]
    ropen: z3.BoolRef
    n: z3.ArithRef  # capacity (rigid)
    cap2: z3.ArithRef  # G2 capacity (rigid)

    @staticmethod
    def fresh(prefix: str, n: z3.ArithRef, cap2: z3.ArithRef) -> UState:
        a = {k: z3.Array(f"{prefix}{k}", i, r) for k, (i, r) in ARRAYS.items()}
        v = {k: z3.Int(f"{prefix}{k}") for k in SCALARS}
        return UState(a, v, z3.Bool(f"{prefix}ropen"), n, cap2)

    @staticmethod
    def initial(n: z3.ArithRef, cap2: z3.ArithRef) -> UState:
        """Every slot free, nothing registered, pending or announced."""
        k = {
            "st": FREE,
            "pend": z3.BoolVal(False),
            "jpar": z3.IntVal(NONE),
            "dev": z3.BoolVal(False),
            "g2": z3.BoolVal(False),
            "g2v": z3.BoolVal(False),
            "g2par": z3.IntVal(NONE),
            "jcnt": z3.IntVal(0),
            "reg": z3.BoolVal(False),
            "phel": z3.BoolVal(False),
            "mpar": z3.IntVal(NONE),
            "pmpar": z3.IntVal(NONE),
        }
        a = {}
        for name, (i, r) in ARRAYS.items():
            if name in k:
                a[name] = z3.K(i, k[name])
            elif r == Slot:
                a[name] = z3.K(i, z3.Const("init_slot", Slot))
            else:
                a[name] = z3.K(i, z3.IntVal(0))
        v = {x: z3.IntVal(0) for x in SCALARS}
        v |= {"free_c": n, "cnt_free": n, "busy": z3.IntVal(NONE), "ranc": z3.IntVal(NONE), "rmpar": z3.IntVal(NONE)}
        return UState(a, v, z3.BoolVal(False), n, cap2)

    def cnt(self, X: z3.ExprRef) -> z3.ArithRef:
        return self.v[f"cnt_{X}"]

    def but(self, a: dict[str, z3.ArrayRef] | None = None, **v: Any) -> UState:
        ropen = v.pop("ropen", self.ropen)
        return dataclasses.replace(self, a={**self.a, **(a or {})}, v={**self.v, **v}, ropen=ropen)

    # queries
    def registered(self, x: z3.ExprRef) -> z3.BoolRef:
        st = self.a["st"][x]
        return z3.Or(st == ACTIVE, st == INACTIVE)

    def holds(self, x: z3.ExprRef, h: z3.ArithRef) -> z3.BoolRef:
        return z3.And(self.registered(x), self.a["blk"][x] == h)

    def is_active(self, h: z3.ArithRef) -> z3.BoolRef:
        return z3.And(self.a["reg"][h], self.a["st"][self.a["loc"][h]] == ACTIVE)


def _cond(when: z3.BoolRef, new: z3.ArrayRef, old: z3.ArrayRef) -> z3.ArrayRef:
    return new if z3.is_true(when) else z3.If(when, new, old)


def _ind(c: z3.BoolRef) -> z3.ArithRef:
    return z3.If(c, 1, 0)


def _write(S: UState, x: z3.ExprRef, when: z3.BoolRef | bool, **vals: Any) -> UState:
    """Write slot ``x``'s fields (when ``when``), keeping the census ghosts
    exact by the point-update identity (module docstring)."""
    w = z3.BoolVal(when) if isinstance(when, bool) else when
    a = S.a
    old_st, new_st = a["st"][x], vals.get("st", a["st"][x])
    old_own, new_own = a["own"][x], vals.get("own", a["own"][x])
    old_j, new_j = a["jid"][x], vals.get("jid", a["jid"][x])
    arrs = {k: _cond(w, z3.Store(a[k], x, val), a[k]) for k, val in vals.items()}
    cnt = {
        f"cnt_{X}": S.v[f"cnt_{X}"] + z3.If(w, _ind(new_st == X) - _ind(old_st == X), 0) for X in SLOT_STATES.values()
    }
    contrib_old = z3.If(old_st == ACTIVE, old_own, 0)
    contrib_new = z3.If(new_st == ACTIVE, new_own, 0)
    refsum = S.v["refsum"] + z3.If(w, contrib_new - contrib_old, 0)
    j0 = a["jcnt"]
    j1 = z3.Store(j0, old_j, j0[old_j] - _ind(z3.And(w, old_st == RESERVED)))
    j2 = z3.Store(j1, new_j, j1[new_j] + _ind(z3.And(w, new_st == RESERVED)))
    arrs["jcnt"] = j2
    return S.but(arrs, refsum=refsum, **cnt)


def _set(S: UState, name: str, i: z3.ExprRef, val: Any, when: z3.BoolRef | bool = True) -> UState:
    """Write a hash/job-indexed array (``g2`` keeps ``g2n`` exact)."""
    w = z3.BoolVal(when) if isinstance(when, bool) else when
    arr = S.a[name]
    new = _cond(w, z3.Store(arr, i, val), arr)
    if name == "g2":
        g2n = S.v["g2n"] + z3.If(w, _ind(val) - _ind(arr[i]), 0)
        return S.but({name: new}, g2n=g2n)
    return S.but({name: new})


def _add(S: UState, name: str, d: Any) -> UState:
    return S.but(**{name: S.v[name] + d})


# ------------------------------------------------------------------- steps


@dataclass
class UStep:
    name: str
    pre: UState
    post: UState
    params: dict[str, z3.ExprRef]
    requires: dict[str, tuple[str, z3.BoolRef]] = field(default_factory=dict)
    rules: dict[str, z3.BoolRef] = field(default_factory=dict)
    #: (when, tier, kind, block) in publication order
    frags: list[tuple[z3.BoolRef, str, str, z3.ArithRef]] = field(default_factory=list)
    #: INV-ANCHOR obligations: (when, parent, router's device view then)
    anchors: list[tuple[z3.BoolRef, z3.ArithRef, z3.ArrayRef]] = field(default_factory=list)

    def require(self, name: str, category: str, cond: z3.BoolRef) -> None:
        if name in self.requires:
            raise ValueError(f"{self.name}: condition {name} given twice")
        self.requires[name] = (category, cond)

    def enabled(self) -> z3.BoolRef:
        return z3.And([c for _cat, c in self.requires.values()] or [z3.BoolVal(True)])

    def finish(self) -> UStep:
        """Registration atomicity, then the router applies the events in order."""
        if self.name != "swapin_register":
            self.require("ONBOARD-ATOMIC", "valid", self.pre.v["busy"] == NONE)
        dev, g2v = self.pre.a["dev"], self.pre.a["g2v"]
        for when, tier, kind, blk in self.frags:
            val = z3.BoolVal(kind == "stored")
            if tier == "device":
                dev = z3.If(when, z3.Store(dev, blk, val), dev)
            else:
                g2v = z3.If(when, z3.Store(g2v, blk, val), g2v)
        self.post = self.post.but({"dev": dev, "g2v": g2v})
        return self


#: broken variants (the same mutants as ``mutants.py``, written for this encoding)
Tweaks = frozenset[str]


def _victim_ok(S: UState, v: z3.ExprRef, tw: Tweaks) -> z3.BoolRef:
    st = S.a["st"][v]
    if "evict-active" in tw:
        return z3.Or(st == INACTIVE, st == ACTIVE)
    return st == INACTIVE


def _quarantine(step: UStep, S: UState, v: z3.ExprRef, when: z3.BoolRef, tw: Tweaks) -> UState:
    """QUARANTINE-HOLD and DEVICE-REMOVE-IMMEDIATE for the victim in slot ``v``."""
    h = S.a["blk"][v]
    released = "release-at-enqueue" in tw
    S = _write(
        S,
        v,
        when,
        st=FREE if released else QUARANTINED,
        pend=z3.BoolVal(True),
        pblk=h,
        pmpar=S.a["mpar"][v],
        pord=S.v["qclock"],
    )
    S = _add(S, "qclock", _ind(when))
    S = _add(S, "free_c" if released else "quar_c", _ind(when))
    S = _set(S, "reg", h, z3.BoolVal(False), when)
    if "device-removed-at-completion" not in tw:
        step.frags.append((when, "device", "removed", h))
    if "g2-stored-at-enqueue" in tw:
        step.frags.append((when, "host_pinned", "stored", h))
    return S


def _hit(S: UState, t: z3.ExprRef, when: z3.BoolRef) -> UState:
    was_inactive = z3.And(when, S.a["st"][t] == INACTIVE)
    S = _write(S, t, when, st=ACTIVE, own=S.a["own"][t] + 1)
    return S.but(afull_c=S.v["afull_c"] + _ind(was_inactive), refs_c=S.v["refs_c"] + _ind(when))


def _register(S: UState, x: z3.ExprRef, h: z3.ArithRef, when: z3.BoolRef) -> UState:
    S = _set(S, "reg", h, z3.BoolVal(True), when)
    return _set(S, "loc", h, x, when)


def use_full(S: UState, h, a, m, t, s, v, tw: Tweaks) -> UStep:
    step = UStep("use(full)", S, S, {"h": h, "a": a, "m": m})
    step.require("ASSUME-PARENT-REGISTERED", "contract", z3.Or(a == NONE, S.a["reg"][a]))
    hit = S.is_active(h) if "use-registers-registered" in tw else S.a["reg"][h]
    step.require("CHOICE-HOLDER", "choice", z3.Implies(hit, S.holds(t, h)))
    new = z3.And(z3.Not(hit), S.v["free_c"] > 0)
    step.require("CHOICE-FREE-SLOT", "choice", z3.Implies(new, S.a["st"][s] == FREE))
    no_slot = z3.And(z3.Not(hit), z3.Not(S.v["free_c"] > 0))
    any_inactive = S.cnt(INACTIVE) >= 1
    blocked = z3.And(no_slot, any_inactive)
    step.require("CHOICE-VICTIM", "choice", z3.Implies(blocked, _victim_ok(S, v, tw)))
    step.rules = {
        R.USE_HIT_ACTIVE: z3.And(hit, S.a["st"][t] == ACTIVE),
        R.USE_HIT_INACTIVE: z3.And(hit, S.a["st"][t] == INACTIVE),
        R.USE_NEW: new,
        R.OFFLOAD_BLOCKS_USE: blocked,
        R.USE_CAPACITY: z3.And(no_slot, z3.Not(any_inactive)),
    }
    P = _hit(S, t, hit)
    P = _write(P, s, new, st=ACTIVE, blk=h, own=z3.IntVal(1), mpar=m)
    P = P.but(free_c=P.v["free_c"] - _ind(new), afull_c=P.v["afull_c"] + _ind(new), refs_c=P.v["refs_c"] + _ind(new))
    P = _register(P, s, h, new)
    step.frags.append((new, "device", "stored", h))
    step.anchors.append((new, a, S.a["dev"]))
    step.post = _quarantine(step, P, v, blocked, tw)
    return step.finish()


def use_partial(S: UState, u, s, v, tw: Tweaks) -> UStep:
    step = UStep("use(partial)", S, S, {"u": u})
    held = z3.BoolVal(False) if "partial-allocated-again" in tw else S.a["phel"][u]
    new = z3.And(z3.Not(held), S.v["free_c"] > 0)
    step.require("CHOICE-FREE-SLOT", "choice", z3.Implies(new, S.a["st"][s] == FREE))
    no_slot = z3.And(z3.Not(held), z3.Not(S.v["free_c"] > 0))
    any_inactive = S.cnt(INACTIVE) >= 1
    blocked = z3.And(no_slot, any_inactive)
    step.require("CHOICE-VICTIM", "choice", z3.Implies(blocked, _victim_ok(S, v, tw)))
    step.rules = {
        R.USE_PARTIAL: z3.Or(held, new),
        R.OFFLOAD_BLOCKS_USE: blocked,
        R.USE_CAPACITY: z3.And(no_slot, z3.Not(any_inactive)),
    }
    P = _write(S, s, new, st=PARTIAL, pu=u)
    P = _add(P, "free_c", -_ind(new))
    P = _set(P, "phel", u, z3.BoolVal(True), new)
    P = _set(P, "ploc", u, s, new)
    step.post = _quarantine(step, P, v, blocked, tw)
    return step.finish()


def deref_full(S: UState, h, t, tw: Tweaks) -> UStep:
    step = UStep("deref(full)", S, S, {"h": h})
    owned_at = S.a["loc"][h]
    step.require(R.DEREF_UNKNOWN, "valid", z3.And(S.a["reg"][h], S.a["own"][owned_at] >= 1))
    step.require("CHOICE-HOLDER", "choice", z3.And(S.holds(t, h), S.a["own"][t] >= 1))
    own = S.a["own"][t]
    if "deref-refuses-last-owner" in tw:  # a progress bug (progress.py): no INV-* sees it
        step.require("BUG-LAST-OWNER", "valid", own >= 2)
    last = own == 1
    if "deref-inactive-at-one-owner" in tw:
        last = z3.Or(own == 1, own == 2)
    x = z3.Const("x_swapin", Slot)
    anchors_swapin = z3.Exists(
        [x], z3.And(S.a["st"][x] == RESERVED, S.a["jpar"][S.a["jid"][x]] == h), patterns=[S.a["jid"][x]]
    )
    if "contract:swapin-parent-released" not in tw:
        step.require("ASSUME-SWAPIN-PARENT-HELD", "contract", z3.Not(z3.And(own == 1, anchors_swapin)))
    step.rules = {R.DEREF_OWNER: z3.BoolVal(True)}
    P = _write(
        S,
        t,
        True,
        own=own - 1,
        st=z3.If(last, INACTIVE, S.a["st"][t]),
        itick=z3.If(last, S.v["clock"], S.a["itick"][t]),
    )
    step.post = P.but(refs_c=P.v["refs_c"] - 1, clock=P.v["clock"] + _ind(last), afull_c=P.v["afull_c"] - _ind(last))
    return step.finish()


def deref_partial(S: UState, u, s, tw: Tweaks) -> UStep:
    step = UStep("deref(partial)", S, S, {"u": u})
    step.require(R.DEREF_UNKNOWN, "valid", S.a["phel"][u])
    step.require("CHOICE-PARTIAL-SLOT", "choice", z3.And(S.a["st"][s] == PARTIAL, S.a["pu"][s] == u))
    step.rules = {R.DEREF_PARTIAL: z3.BoolVal(True)}
    P = _write(S, s, True, st=FREE)
    P = _add(P, "free_c", 1)
    step.post = _set(P, "phel", u, z3.BoolVal(False))
    return step.finish()


def promote(S: UState, u, h, p, s, t, tw: Tweaks) -> UStep:
    step = UStep("promote", S, S, {"u": u, "h": h, "p": p})
    step.require(R.PROMOTE_UNKNOWN, "valid", S.a["phel"][u])
    step.require("CHOICE-PARTIAL-SLOT", "choice", z3.And(S.a["st"][s] == PARTIAL, S.a["pu"][s] == u))
    step.require("ASSUME-PARENT-REGISTERED", "contract", z3.Or(p == NONE, S.a["reg"][p]))
    exists = S.a["reg"][h]
    step.require("CHOICE-HOLDER", "choice", z3.Implies(exists, S.holds(t, h)))
    new = z3.Not(exists)
    step.rules = {R.PROMOTE_EXISTING: exists, R.PROMOTE_NEW: new}
    P = _write(S, s, exists, st=FREE)
    P = _add(P, "free_c", _ind(exists))
    P = _set(P, "phel", u, z3.BoolVal(False))
    P = _hit(P, t, exists)
    P = _write(P, s, new, st=ACTIVE, blk=h, own=z3.IntVal(1), mpar=p)
    P = P.but(afull_c=P.v["afull_c"] + _ind(new), refs_c=P.v["refs_c"] + _ind(new))
    P = _register(P, s, h, new)
    step.frags.append((new, "device", "stored", h))
    step.anchors.append((new, p, S.a["dev"]))
    step.post = P
    return step.finish()


def evict(S: UState, v, tw: Tweaks) -> UStep:
    step = UStep("evict", S, S, {})
    step.require(R.EVICT_POLICY, "valid", S.cnt(INACTIVE) >= 1)
    step.require("CHOICE-VICTIM", "choice", _victim_ok(S, v, tw))
    step.rules = {R.EVICT_POLICY: z3.BoolVal(True)}
    step.post = _quarantine(step, S, v, z3.BoolVal(True), tw)
    return step.finish()


def offload_complete(S: UState, s, w, tw: Tweaks) -> UStep:
    step = UStep("offload_complete", S, S, {"w": w})
    step.require("PENDING", "valid", S.a["pend"][s])
    h = S.a["pblk"][s]
    in_g2 = S.a["g2"][h]
    full = z3.And(z3.Not(in_g2), S.v["g2n"] >= S.cap2)
    step.require("CHOICE-G2-VICTIM", "choice", z3.Implies(full, z3.And(w >= 0, S.a["g2"][w])))
    if "complete-waits-for-g2-room" in tw:  # a progress bug (progress.py): no INV-* sees it
        step.require("BUG-G2-ROOM", "valid", z3.Not(full))
    release = S.a["st"][s] == QUARANTINED
    step.rules = {R.QUARANTINE_RELEASE: release, R.G2_EVICT: full, R.G2_STORE_ON_COMPLETE: z3.Not(in_g2)}
    P = _write(S, s, True, pend=z3.BoolVal(False), st=z3.If(release, FREE, S.a["st"][s]))
    P = P.but(quar_c=P.v["quar_c"] - _ind(release), free_c=P.v["free_c"] + _ind(release))
    P = _set(P, "g2", w, z3.BoolVal(False), full)
    step.frags.append((full, "host_pinned", "removed", w))
    P = _set(P, "g2", h, z3.BoolVal(True))
    P = _set(P, "g2t", h, P.v["g2clock"])
    P = _add(P, "g2clock", 1)
    P = _set(P, "g2par", h, S.a["pmpar"][s], z3.Not(in_g2))
    if "g2-stored-at-enqueue" not in tw:
        step.frags.append((z3.Not(in_g2), "host_pinned", "stored", h))
    if "device-removed-at-completion" in tw:
        step.frags.append((z3.BoolVal(True), "device", "removed", h))
    step.post = P
    return step.finish()


def swapin_reserve(S: UState, j, h, p, s, tw: Tweaks) -> UStep:
    step = UStep("swapin_reserve", S, S, {"j": j, "h": h, "p": p})
    step.require(R.SWAPIN_RESERVE, "valid", z3.And(j >= 0, S.v["free_c"] > 0, S.a["g2"][h]))
    step.require("CHOICE-FREE-SLOT", "choice", S.a["st"][s] == FREE)
    new_job = S.a["jcnt"][j] == 0
    step.require("ASSUME-SWAPIN-PARENT-HELD", "contract", z3.Implies(new_job, z3.Or(p == NONE, S.is_active(p))))
    step.rules = {R.SWAPIN_RESERVE: z3.BoolVal(True)}
    P = _write(S, s, True, st=RESERVED, blk=h, jid=j)
    P = P.but(free_c=P.v["free_c"] - 1, resv_c=P.v["resv_c"] + 1)
    P = _set(P, "jpar", j, p, new_job)
    P = _set(P, "jord", j, S.v["qclock"], new_job)
    P = _add(P, "qclock", _ind(new_job))
    P = _set(P, "g2t", h, S.v["g2clock"])
    step.post = _add(P, "g2clock", 1)
    return step.finish()


def swapin_register(S: UState, j, k, tw: Tweaks) -> UStep:
    step = UStep("swapin_register", S, S, {"j": j})
    busy = S.v["busy"]
    step.require("PENDING", "valid", z3.And(j >= 0, S.a["jcnt"][j] >= 1, z3.Or(busy == NONE, busy == j)))
    step.require("CHOICE-RESERVED-SLOT", "choice", z3.And(S.a["st"][k] == RESERVED, S.a["jid"][k] == j))
    starting = busy == NONE
    h = S.a["blk"][k]
    first = S.a["g2par"][h] if "swapin-anchor-from-g2" in tw else S.a["jpar"][j]
    anchor = z3.If(starting, first, S.v["ranc"])
    mparent = z3.If(starting, S.a["jpar"][j], S.v["rmpar"])
    group_open = z3.And(z3.Not(starting), S.ropen)
    present = z3.BoolVal(False) if "swapin-registers-present" in tw else S.a["reg"][h]
    skip, reg = present, z3.Not(present)
    last = S.a["jcnt"][j] == 1  # exact: jcnt is the census of the job's reserved slots
    step.rules = {R.SWAPIN_SKIP_PRESENT: skip, R.SWAPIN_ANCHOR: reg}
    starts = z3.And(reg, z3.Not(group_open))
    step.anchors.append((starts, anchor, S.a["dev"]))
    step.frags.append((reg, "device", "stored", h))
    P = _write(
        S,
        k,
        True,
        st=z3.If(skip, FREE, INACTIVE),
        own=z3.If(reg, 0, S.a["own"][k]),
        mpar=z3.If(reg, mparent, S.a["mpar"][k]),
        itick=z3.If(reg, S.v["clock"], S.a["itick"][k]),
    )
    P = _register(P, k, h, reg)
    step.post = P.but(
        clock=P.v["clock"] + _ind(reg),
        free_c=P.v["free_c"] + _ind(skip),
        resv_c=P.v["resv_c"] - 1,
        busy=z3.If(last, z3.IntVal(NONE), j),
        ranc=z3.If(skip, h, anchor),
        rmpar=h,
        ropen=reg,
    )
    return step.finish()


#: name -> (function, hash/int inputs with their lower bound, slot choices, int choices)
TRANSITIONS: dict[str, tuple[Callable[..., UStep], dict[str, int], list[str], dict[str, int]]] = {
    "use(full)": (use_full, {"h": 0, "a": NONE, "m": NONE}, ["t", "s", "v"], {}),
    "use(partial)": (use_partial, {"u": 0}, ["s", "v"], {}),
    "deref(full)": (deref_full, {"h": 0}, ["t"], {}),
    "deref(partial)": (deref_partial, {"u": 0}, ["s"], {}),
    "promote": (promote, {"u": 0, "h": 0, "p": NONE}, ["s", "t"], {}),
    "evict": (evict, {}, ["v"], {}),
    "offload_complete": (offload_complete, {}, ["s"], {"w": NONE}),
    "swapin_reserve": (swapin_reserve, {"j": 0, "h": 0, "p": NONE}, ["s"], {}),
    "swapin_register": (swapin_register, {"j": 0}, ["k"], {}),
}


def instantiate(name: str, S: UState, tw: Tweaks = frozenset()) -> tuple[UStep, list[z3.BoolRef]]:
    """The transition on fresh inputs and choices; returns the step and the
    inputs' domains (hashes >= 0, "hash or none" >= -1, any job or uuid >= 0)."""
    fn, ints, slots, int_choices = TRANSITIONS[name]
    args: dict[str, Any] = {}
    doms: list[z3.BoolRef] = []
    for k, lo in {**ints, **int_choices}.items():
        args[k] = z3.Int(f"in_{k}")
        doms.append(args[k] >= lo)
    for k in slots:
        args[k] = z3.Const(f"in_{k}", Slot)
    return fn(S, **args, tw=tw), doms


# ------------------------------------------------------------ the properties


def _x() -> z3.ExprRef:
    return z3.Const("x", Slot)


def _h() -> z3.ArithRef:
    return z3.Int("hq")


def _all_slots(S: UState, body: Callable[[z3.ExprRef], z3.BoolRef]) -> z3.BoolRef:
    x = _x()
    return z3.ForAll([x], body(x))


def _all_ints(body: Callable[[z3.ArithRef], z3.BoolRef]) -> z3.BoolRef:
    h = _h()
    return z3.ForAll([h], body(h))


def inv_conserve(S: UState) -> Conjuncts:
    v = S.v
    total = v["free_c"] + S.cnt(PARTIAL) + v["afull_c"] + S.cnt(INACTIVE) + v["quar_c"] + v["resv_c"]
    return [("free + partial + active + inactive + quarantined + reserved = capacity", total == S.n)]


def inv_owners(S: UState) -> Conjuncts:
    st, own = S.a["st"], S.a["own"]
    return [
        ("every active slot has an owner", _all_slots(S, lambda x: z3.Implies(st[x] == ACTIVE, own[x] >= 1))),
        ("every inactive slot has no owner", _all_slots(S, lambda x: z3.Implies(st[x] == INACTIVE, own[x] == 0))),
    ]


def inv_router_match(S: UState) -> Conjuncts:
    a = S.a
    return [
        ("device view == registered in G1", _all_ints(lambda h: a["dev"][h] == a["reg"][h])),
        ("host-pinned view == held in G2", _all_ints(lambda h: a["g2v"][h] == a["g2"][h])),
    ]


def inv_no_dup(S: UState) -> Conjuncts:
    a = S.a
    return [
        (
            "every registered slot is its block's only slot",
            _all_slots(
                S, lambda x: z3.Implies(S.registered(x), z3.And(a["reg"][a["blk"][x]], a["loc"][a["blk"][x]] == x))
            ),
        ),
        (
            "every registered hash is held by its slot",
            _all_ints(lambda h: z3.Implies(a["reg"][h], S.holds(a["loc"][h], h))),
        ),
    ]


def inv_partial_uuid(S: UState) -> Conjuncts:
    a = S.a
    return [
        (
            "every partial slot is its uuid's only slot",
            _all_slots(
                S,
                lambda x: z3.Implies(a["st"][x] == PARTIAL, z3.And(a["phel"][a["pu"][x]], a["ploc"][a["pu"][x]] == x)),
            ),
        ),
        (
            "every held uuid is in its slot",
            _all_ints(
                lambda u: z3.Implies(a["phel"][u], z3.And(a["st"][a["ploc"][u]] == PARTIAL, a["pu"][a["ploc"][u]] == u))
            ),
        ),
    ]


def inv_quarantine(S: UState) -> Conjuncts:
    a = S.a
    return [
        ("transfer pending <=> quarantined", _all_slots(S, lambda x: a["pend"][x] == (a["st"][x] == QUARANTINED))),
        ("quarantined counter == quarantined slots", S.v["quar_c"] == S.cnt(QUARANTINED)),
    ]


def step_quarantine(step: UStep) -> Conjuncts:
    pre, post = step.pre.a, step.post.a

    def body(x: z3.ExprRef) -> z3.BoolRef:
        leaves = z3.And(pre["st"][x] == QUARANTINED, post["st"][x] != QUARANTINED)
        return z3.Implies(leaves, z3.And(post["st"][x] == FREE, pre["pend"][x], z3.Not(post["pend"][x])))

    return [("leaves quarantine only to free, at its transfer's completion", _all_slots(step.pre, body))]


def step_anchor(step: UStep) -> Conjuncts:
    return [
        (f"device Stored #{i} names a parent the router holds", z3.Implies(w, z3.Or(p == NONE, view[p])))
        for i, (w, p, view) in enumerate(step.anchors)
    ]


def _counter(label: str, counter: str, X: z3.ExprRef | None) -> Callable[[UState], Conjuncts]:
    def conj(S: UState) -> Conjuncts:
        return [(label, S.v[counter] == (S.cnt(X) if X is not None else S.v["refsum"]))]

    return conj


def lemma_swapin_parent_held(S: UState) -> Conjuncts:
    a = S.a

    def body(x: z3.ExprRef) -> z3.BoolRef:
        p = a["jpar"][a["jid"][x]]
        return z3.Implies(a["st"][x] == RESERVED, z3.Or(p == NONE, S.is_active(p)))

    return [("a pending job's parent is root or active", _all_slots(S, body))]


def lemma_onboard_anchor(S: UState) -> Conjuncts:
    busy = S.v["busy"] != NONE
    return [
        (
            "registration in progress => its job still has a reserved slot",
            z3.Implies(busy, S.a["jcnt"][S.v["busy"]] >= 1),
        ),
        (
            "registration in progress => its anchor is root or registered",
            z3.Implies(busy, z3.Or(S.v["ranc"] == NONE, S.a["reg"][S.v["ranc"]])),
        ),
    ]


def lemma_g2_capacity(S: UState) -> Conjuncts:
    return [("G2 count <= G2 capacity", S.v["g2n"] <= S.cap2)]


@dataclass(frozen=True)
class UProperty:
    id: str
    state: Callable[[UState], Conjuncts] | None = None
    step: Callable[[UStep], Conjuncts] | None = None
    lemma: bool = False

    def state_conjuncts(self, S: UState) -> Conjuncts:
        return self.state(S) if self.state else []

    def step_conjuncts(self, step: UStep) -> Conjuncts:
        return self.state_conjuncts(step.post) + (self.step(step) if self.step else [])


PROPERTIES: list[UProperty] = [
    UProperty(R.INV_CONSERVE, inv_conserve),
    UProperty(R.INV_OWNERS, inv_owners),
    UProperty(R.INV_ROUTER_MATCH, inv_router_match),
    UProperty(R.INV_NO_DUP, inv_no_dup),
    UProperty(R.INV_QUARANTINE, inv_quarantine, step_quarantine),
    UProperty(R.INV_ANCHOR, None, step_anchor),
    UProperty(R.INV_PARTIAL_UUID, inv_partial_uuid),
    UProperty("LEMMA-FREE-COUNT", _counter("free counter == free slots", "free_c", FREE), lemma=True),
    UProperty("LEMMA-ACTIVE-COUNT", _counter("active counter == active slots", "afull_c", ACTIVE), lemma=True),
    UProperty("LEMMA-RESERVED-COUNT", _counter("reserved counter == reserved slots", "resv_c", RESERVED), lemma=True),
    UProperty("LEMMA-REFS", _counter("refs counter == sum of the active owners", "refs_c", None), lemma=True),
    UProperty("LEMMA-SWAPIN-PARENT-HELD", lemma_swapin_parent_held, lemma=True),
    UProperty("LEMMA-ONBOARD-ANCHOR", lemma_onboard_anchor, lemma=True),
    UProperty("LEMMA-G2-CAPACITY", lemma_g2_capacity, lemma=True),
]


def by_id(pid: str) -> UProperty:
    for p in PROPERTIES:
        if p.id == pid:
            return p
    raise KeyError(f"unknown property {pid!r}; known: {[str(p.id) for p in PROPERTIES]}")


# --------------------------------------------------- what every state satisfies


def domain(S: UState) -> list[z3.BoolRef]:
    """The fields' types: hashes >= 0, parents >= -1 (NONE), counts >= 0."""
    a = S.a
    x, i = _x(), _h()
    return [
        S.n >= 1,
        S.cap2 >= 1,
        z3.ForAll(
            [x],
            z3.And(
                a["blk"][x] >= 0,
                a["own"][x] >= 0,
                a["pu"][x] >= 0,
                a["mpar"][x] >= NONE,
                a["jid"][x] >= 0,
                a["pblk"][x] >= 0,
                a["pmpar"][x] >= NONE,
            ),
        ),
        z3.ForAll([i], z3.And(a["jpar"][i] >= NONE, a["g2par"][i] >= NONE), patterns=[a["jpar"][i]]),
        z3.ForAll([i], a["g2par"][i] >= NONE, patterns=[a["g2par"][i]]),
        S.v["busy"] >= NONE,
        S.v["ranc"] >= NONE,
        S.v["rmpar"] >= NONE,
    ]


def census_facts(S: UState, prefix: str) -> list[z3.BoolRef]:
    """What the census ghosts satisfy in every finite state when they are the
    counts they stand for (module docstring); the witnesses are fresh
    constants, one per slot state, one Skolem function for the jobs and one
    for G2."""
    a, v = S.a, S.v
    x, j, h = _x(), _h(), z3.Int("hw")
    out = [v[f"cnt_{X}"] >= 0 for X in SLOT_STATES.values()]
    out.append(z3.Sum([v[f"cnt_{X}"] for X in SLOT_STATES.values()]) == S.n)
    for X in SLOT_STATES.values():
        out.append(z3.ForAll([x], z3.Implies(a["st"][x] == X, v[f"cnt_{X}"] >= 1)))
        wit = z3.Const(f"{prefix}wit_{X}", Slot)
        out.append(z3.Implies(v[f"cnt_{X}"] >= 1, a["st"][wit] == X))
    jw = z3.Function(f"{prefix}jw", Int, Slot)
    out += [
        z3.ForAll([j], a["jcnt"][j] >= 0),
        z3.ForAll([x], z3.Implies(a["st"][x] == RESERVED, a["jcnt"][a["jid"][x]] >= 1)),
        z3.ForAll([j], z3.Implies(a["jcnt"][j] >= 1, z3.And(a["st"][jw(j)] == RESERVED, a["jid"][jw(j)] == j))),
        v["refsum"] >= 0,
        v["g2n"] >= 0,
        z3.ForAll([h], z3.Implies(a["g2"][h], v["g2n"] >= 1)),
    ]
    g2w = z3.Int(f"{prefix}g2wit")
    out.append(z3.Implies(v["g2n"] >= 1, z3.And(g2w >= 0, a["g2"][g2w])))
    out.append(z3.ForAll([h], z3.Implies(a["g2"][h], h >= 0)))
    return out


def hypothesis(S: UState, props: list[UProperty] | None = None) -> list[z3.BoolRef]:
    return [c for p in (PROPERTIES if props is None else props) for _l, c in p.state_conjuncts(S)]


# ------------------------------------------------------------------ prover


@dataclass
class UResult:
    property_id: str
    verdict: str  # "proven", "refuted", "unknown"
    seconds: float
    #: transition -> verdict where not proven; with the broken conjuncts when refuted
    failures: dict[str, str] = field(default_factory=dict)

    @property
    def proven(self) -> bool:
        return self.verdict == "proven"


def _solver(timeout_ms: int) -> z3.Solver:
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    return s


def _base(name: str, tw: Tweaks, assume: list[UProperty] | None = None) -> tuple[UStep, list[z3.BoolRef]]:
    n, cap2 = z3.Int("n"), z3.Int("cap2")
    pre = UState.fresh("pre_", n, cap2)
    step, doms = instantiate(name, pre, tw)
    base = [*domain(pre), *census_facts(pre, "pre_"), *doms, *hypothesis(pre, assume), step.enabled()]
    return step, base


def check_initial(prop: UProperty) -> str:
    n, cap2 = z3.Int("n"), z3.Int("cap2")
    init = UState.initial(n, cap2)
    conj = prop.state_conjuncts(init)
    if not conj:
        return "proven"
    s = _solver(10_000)
    s.add(n >= 1, cap2 >= 1, z3.Not(z3.And([c for _l, c in conj])))
    return solving.check(s, timeout_ms=10_000).kind


def prove_unbounded(
    props: list[UProperty] | None = None,
    tw: Tweaks = frozenset(),
    timeout_ms: int = 60_000,
    on_result: Callable[[UResult], None] | None = None,
    transitions: list[str] | None = None,
) -> list[UResult]:
    """Each property: initial state, then every transition, from a state
    satisfying every property (the inductive hypothesis)."""
    props = PROPERTIES if props is None else props
    names = list(TRANSITIONS) if transitions is None else transitions
    built = []
    for name in names:
        step, base = _base(name, tw)
        s = _solver(timeout_ms)
        s.add(*base)
        built.append((name, step, s))
    out = []
    for prop in props:
        t0 = time.perf_counter()
        res = UResult(prop.id, "proven", 0.0)
        init = check_initial(prop)
        if init != "proven":
            res.verdict, res.failures["initial state"] = init, init
        for name, step, s in built:
            conj = prop.step_conjuncts(step)
            if not conj:
                continue
            s.push()
            s.add(z3.Not(z3.And([c for _l, c in conj])))
            a = solving.check(s, timeout_ms=timeout_ms)
            if a.model is not None:
                m = a.model
                broken = [lbl for lbl, c in conj if z3.is_false(m.eval(c, model_completion=True))]
                res.failures[name] = "refuted: " + ("; ".join(broken) or "(see the model)")
                res.verdict = "refuted"
            elif a.unknown:
                res.failures[name] = a.verdict
                if res.verdict == "proven":
                    res.verdict = "unknown"
            s.pop()
        res.seconds = time.perf_counter() - t0
        out.append(res)
        if on_result is not None:
            on_result(res)
    return out


def sanity(timeout_ms: int = 60_000, tw: Tweaks = frozenset()) -> list[str]:
    """Non-vacuity: for every transition the hypothesis, the census facts and
    the step's conditions are satisfiable together, and so is each rule guard
    (every rule fires in some state the unbounded proof covers). Returns the
    problems (a check the solver could not decide counts as one)."""
    problems = []
    for name in TRANSITIONS:
        step, base = _base(name, tw)
        s = _solver(timeout_ms)
        s.add(*base)
        a = solving.check(s, timeout_ms=timeout_ms)
        if not a.sat:
            problems.append(f"{name}: assumptions not shown satisfiable ({a.result} {a.reason})")
            continue
        for rule, guard in step.rules.items():
            s.push()
            s.add(guard)
            a = solving.check(s, timeout_ms=timeout_ms)
            if not a.sat:
                problems.append(f"{name}: rule {rule} not shown to fire ({a.result} {a.reason})")
            s.pop()
    return problems


def ghost_checks(timeout_ms: int = 60_000) -> list[str]:
    """The ghost forms of INV-NO-DUP, INV-PARTIAL-UUID and INV-ROUTER-MATCH imply
    the plain statements over two slots / an existential slot."""
    problems = []
    n, cap2 = z3.Int("n"), z3.Int("cap2")
    S = UState.fresh("g_", n, cap2)
    a = S.a
    x, y, h = z3.Const("gx", Slot), z3.Const("gy", Slot), z3.Int("gh")
    z = z3.Const("gz", Slot)
    goals = {
        "INV-NO-DUP": (
            inv_no_dup(S),
            z3.Implies(z3.And(S.registered(x), S.registered(y), x != y), a["blk"][x] != a["blk"][y]),
        ),
        "INV-PARTIAL-UUID": (
            inv_partial_uuid(S),
            z3.Implies(z3.And(a["st"][x] == PARTIAL, a["st"][y] == PARTIAL, x != y), a["pu"][x] != a["pu"][y]),
        ),
        "INV-ROUTER-MATCH": (
            inv_no_dup(S) + inv_router_match(S),
            a["dev"][h] == z3.Exists([z], S.holds(z, h)),
        ),
    }
    for pid, (hyp, goal) in goals.items():
        s = _solver(timeout_ms)
        s.add(*[c for _l, c in hyp], z3.Not(goal))
        r = solving.check(s, timeout_ms=timeout_ms).result
        if r != z3.unsat:
            problems.append(f"{pid}: the ghost form does not imply the plain statement ({r})")
    return problems


@dataclass(frozen=True)
class UMutant:
    name: str
    rule: str
    expect: str


#: the bounded mutants (``mutants.py``), as tweaks of this encoding
MUTANTS: list[UMutant] = [
    UMutant("release-at-enqueue", R.QUARANTINE_HOLD, R.INV_QUARANTINE),
    UMutant("deref-inactive-at-one-owner", R.DEREF_OWNER, R.INV_OWNERS),
    UMutant("use-registers-registered", R.USE_HIT_INACTIVE, R.INV_NO_DUP),
    UMutant("evict-active", R.EVICT_POLICY, R.INV_CONSERVE),
    UMutant("partial-allocated-again", R.USE_PARTIAL, R.INV_PARTIAL_UUID),
    UMutant("g2-stored-at-enqueue", R.G2_STORE_ON_COMPLETE, R.INV_ROUTER_MATCH),
    UMutant("device-removed-at-completion", R.DEVICE_REMOVE_IMMEDIATE, R.INV_ROUTER_MATCH),
    UMutant("swapin-registers-present", R.SWAPIN_SKIP_PRESENT, R.INV_NO_DUP),
    UMutant("swapin-anchor-from-g2", R.SWAPIN_ANCHOR, R.INV_ANCHOR),
    UMutant("contract:swapin-parent-released", "ASSUME-SWAPIN-PARENT-HELD", "LEMMA-SWAPIN-PARENT-HELD"),
]


def refute(m: UMutant, timeout_ms: int = 60_000) -> UResult:
    return prove_unbounded([by_id(m.expect)], frozenset({m.name}), timeout_ms)[0]
