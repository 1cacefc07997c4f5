"""``INV-SESSION-FENCE``: generation fencing of session slot leases, proven inductive with z3.

The universe: ``slots`` slots, each with a generation and a state (free,
idle, leased), and one ghost *old handle* ``(slot, generation)``: any handle
the manager handed out for an earlier lease of a slot (when a lease ends or
a slot is taken for a new lease, the transition may choose the superseded
handle as the ghost). The invariant: the ghost handle's generation is below
its slot's, so a ``finalize`` or ``reset`` carrying it (which acts only when
its generation is the slot's) can never act (``SESSION-FENCE``); and every
slot's generation is at least 0.

Transitions of the ``session`` profile, each as the model's rule table
(``reference/session.py``) has it: a cold lease (generation up) of the
session's own idle slot, else the lowest free slot, else the slot of the
idle session parked least recently (``SESSION-LRU``: each slot records its
session and when it was parked, from a clock), refused while the session
holds a leased slot; a warm re-admission (same lease, same generation); a
park (``finalize`` keeping the slot, by its session with the current
handle); a release (``finalize`` without keeping, ``reset``: generation up);
``evict_all`` (every generation up). A release that does not move the
generation on (``release without a new generation``) must be refuted.
``managers/session_equivalence.py`` checks the transitions against the model
both ways (``EQUIV-SESSION``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvspec.reference.smt import solving

FREE, IDLE, LEASED = 0, 1, 2
#: ``own`` of a slot no session holds
NOBODY = -1


@dataclass
class SState:
    gen: list[z3.ArithRef]
    st: list[z3.ArithRef]
    old_slot: z3.ArithRef
    old_gen: z3.ArithRef
    has_old: z3.BoolRef
    #: the session (a number) the slot is leased or parked for, else ``NOBODY``
    own: list[z3.ArithRef]
    #: when the slot was last parked (the clock then): idle slots in LRU order by it
    stamp: list[z3.ArithRef]
    clock: z3.ArithRef


def fresh(n: int, p: str) -> SState:
    return SState(
        gen=[z3.Int(f"{p}gen{i}") for i in range(n)],
        st=[z3.Int(f"{p}st{i}") for i in range(n)],
        old_slot=z3.Int(f"{p}oslot"),
        old_gen=z3.Int(f"{p}ogen"),
        has_old=z3.Bool(f"{p}hasold"),
        own=[z3.Int(f"{p}own{i}") for i in range(n)],
        stamp=[z3.Int(f"{p}stamp{i}") for i in range(n)],
        clock=z3.Int(f"{p}clock"),
    )


def initial(n: int) -> SState:
    """Every slot free at generation 0, nobody's, no old handle."""
    z = z3.IntVal(0)
    return SState(gen=[z] * n, st=[z3.IntVal(FREE)] * n, old_slot=z, old_gen=z, has_old=z3.BoolVal(False),
                  own=[z3.IntVal(NOBODY)] * n, stamp=[z] * n, clock=z)  # fmt: skip


def _at(xs: list[z3.ArithRef], i: z3.ArithRef) -> z3.ArithRef:
    out = xs[-1]
    for k in range(len(xs) - 2, -1, -1):
        out = z3.If(i == k, xs[k], out)
    return out


def invariant(s: SState, n: int) -> z3.BoolRef:
    c = [z3.And(g >= 0, st >= FREE, st <= LEASED) for g, st in zip(s.gen, s.st, strict=True)]
    c.append(z3.Implies(s.has_old, z3.And(s.old_slot >= 0, s.old_slot < n, s.old_gen < _at(s.gen, s.old_slot))))
    return z3.And(c)


Transition = Callable[[SState, int, str], tuple[SState, z3.BoolRef]]


def _with(
    s: SState,
    k: z3.ArithRef,
    n: int,
    *,
    gen_up: bool,
    state: int,
    supersede: z3.BoolRef,
    owner: z3.ArithRef | None = None,
    park: bool = False,
) -> SState:
    """Slot ``k`` gets ``state`` (and a new generation if ``gen_up``, the session ``owner`` if
    given, a park stamp from the clock if ``park``); the ghost may become its old handle."""
    gen = [z3.If(k == i, s.gen[i] + (1 if gen_up else 0), s.gen[i]) for i in range(n)]
    st = [z3.If(k == i, z3.IntVal(state), s.st[i]) for i in range(n)]
    own = s.own if owner is None else [z3.If(k == i, owner, s.own[i]) for i in range(n)]
    stamp = [z3.If(k == i, s.clock, s.stamp[i]) for i in range(n)] if park else list(s.stamp)
    return SState(
        gen=gen,
        st=st,
        old_slot=z3.If(supersede, k, s.old_slot),
        old_gen=z3.If(supersede, _at(s.gen, k), s.old_gen),
        has_old=z3.Or(s.has_old, supersede),
        own=list(own),
        stamp=stamp,
        clock=s.clock + 1 if park else s.clock,
    )


def _holds(s: SState, n: int, x: z3.ArithRef, state: int) -> z3.BoolRef:
    """Session ``x`` holds a slot in ``state``."""
    return z3.Or([z3.And(s.own[i] == x, s.st[i] == state) for i in range(n)])


def _slot(k: z3.ArithRef, n: int) -> z3.BoolRef:
    return z3.And(k >= 0, k < n)


def cold_lease(s: SState, n: int, t: str) -> tuple[SState, z3.BoolRef]:
    """An admission of session ``x`` as a new lease (SESSION-CANDIDATE cold, SESSION-LEASE,
    SESSION-LRU): its own idle slot when not warm; else the lowest free slot; else the slot of
    the idle session parked least recently. A session with a leased slot is refused."""
    k, sup, x, w = z3.Int(f"{t}k"), z3.Bool(f"{t}sup"), z3.Int(f"{t}x"), z3.Bool(f"{t}w")
    st = _at(s.st, k)
    own_idle = _holds(s, n, x, IDLE)
    case_own = z3.And(z3.Not(w), st == IDLE, _at(s.own, k) == x)
    case_free = z3.And(z3.Not(own_idle), st == FREE, *[z3.Or(k <= i, s.st[i] != FREE) for i in range(n)])
    no_free = z3.And([x_ != FREE for x_ in s.st])
    oldest = z3.And([z3.Or(k == i, s.st[i] != IDLE, _at(s.stamp, k) < s.stamp[i]) for i in range(n)])
    case_steal = z3.And(z3.Not(own_idle), no_free, st == IDLE, oldest)
    en = z3.And(_slot(k, n), x >= 0, z3.Not(_holds(s, n, x, LEASED)), z3.Or(case_own, case_free, case_steal))
    return _with(s, k, n, gen_up=True, state=LEASED, supersede=sup, owner=x), en


def warm_admit(s: SState, n: int, t: str) -> tuple[SState, z3.BoolRef]:
    """A warm admission of session ``x`` onto its own idle slot: same lease, same generation."""
    k, x, w = z3.Int(f"{t}k"), z3.Int(f"{t}x"), z3.Bool(f"{t}w")
    en = z3.And(_slot(k, n), w, _at(s.st, k) == IDLE, _at(s.own, k) == x, z3.Not(_holds(s, n, x, LEASED)))
    return _with(s, k, n, gen_up=False, state=LEASED, supersede=z3.BoolVal(False)), en


def _current(s: SState, n: int, t: str) -> tuple[z3.ArithRef, z3.BoolRef]:
    """The handle ``(k, g)`` carried by session ``x`` acts: the slot's current lease, held by ``x``."""
    k, g, x = z3.Int(f"{t}k"), z3.Int(f"{t}g"), z3.Int(f"{t}x")
    return k, z3.And(_slot(k, n), _at(s.st, k) != FREE, g == _at(s.gen, k), _at(s.own, k) == x)


def park(s: SState, n: int, t: str) -> tuple[SState, z3.BoolRef]:
    """A finalize keeping the slot: idle for its session, the most recently parked."""
    k, en = _current(s, n, t)
    return _with(s, k, n, gen_up=False, state=IDLE, supersede=z3.BoolVal(False), park=True), en


def _release(s: SState, n: int, t: str, *, bump: bool) -> tuple[SState, z3.BoolRef]:
    k, en = _current(s, n, t)
    sup = z3.Bool(f"{t}sup")
    return _with(s, k, n, gen_up=bump, state=FREE, supersede=sup, owner=z3.IntVal(NOBODY)), en


def release(s: SState, n: int, t: str) -> tuple[SState, z3.BoolRef]:
    return _release(s, n, t, bump=True)


def release_without_bump(s: SState, n: int, t: str) -> tuple[SState, z3.BoolRef]:
    return _release(s, n, t, bump=False)


def evict_all(s: SState, n: int, t: str) -> tuple[SState, z3.BoolRef]:
    k, sup = z3.Int(f"{t}k"), z3.Bool(f"{t}sup")
    post = SState(
        gen=[g + 1 for g in s.gen],
        st=[z3.IntVal(FREE) for _ in s.st],
        old_slot=z3.If(sup, k, s.old_slot),
        old_gen=z3.If(sup, _at(s.gen, k), s.old_gen),
        has_old=z3.Or(s.has_old, sup),
        own=[z3.IntVal(NOBODY) for _ in s.own],
        stamp=list(s.stamp),
        clock=s.clock,
    )
    return post, _slot(k, n)


def stale_acts(s: SState, n: int, t: str) -> tuple[SState, z3.BoolRef]:
    """A finalize or reset carrying the ghost handle: enabled only if its generation is current."""
    post, en = _release(s, n, t, bump=True)
    return post, z3.And(en, s.has_old, z3.Int(f"{t}k") == s.old_slot, z3.Int(f"{t}g") == s.old_gen)


TRANSITIONS: dict[str, Transition] = {
    "cold lease": cold_lease,
    "warm admit": warm_admit,
    "park (finalize, keep)": park,
    "release (finalize, reset)": release,
    "evict_all": evict_all,
}
BROKEN: dict[str, Transition] = {"release, same gen": release_without_bump}


@dataclass
class SessionProof:
    transition: str
    proven: bool
    seconds: float
    unknown: bool = False
    #: why z3's answer is unknown (``solving.Answer.reason``)
    reason: str = ""


def check(name: str, tr: Transition, n: int, timeout_ms: int | None = None) -> SessionProof:
    t0 = time.perf_counter()
    pre = fresh(n, "pre_")
    post, en = tr(pre, n, "x_")
    solver = z3.Solver()
    if timeout_ms:
        solver.set("timeout", timeout_ms)
    solver.add(invariant(pre, n), en, z3.Not(invariant(post, n)))
    r = solving.check(solver, timeout_ms=timeout_ms)
    return SessionProof(name, r.unsat, time.perf_counter() - t0, r.unknown, r.reason)


def stale_never_acts(n: int) -> SessionProof:
    """No state satisfying the invariant lets the ghost handle act."""
    t0 = time.perf_counter()
    pre = fresh(n, "pre_")
    _, en = stale_acts(pre, n, "x_")
    solver = z3.Solver()
    solver.add(invariant(pre, n), en)
    r = solving.check(solver)
    return SessionProof("a stale handle acts", r.unsat, time.perf_counter() - t0, r.unknown, r.reason)


def prove_session(
    n: int = 3, transitions: dict[str, Transition] | None = None, timeout_ms: int | None = None
) -> tuple[list[SessionProof], list[SessionProof]]:
    """(the profile's transitions, all to be proven; the broken ones, all to be
    refuted). ``transitions``: the table to prove (a mutant replaces one)."""
    s = z3.Solver()
    s.add(z3.Not(invariant(initial(n), n)))
    r = solving.check(s)
    ok = [SessionProof("initial state", r.unsat, 0.0, r.unknown, r.reason)]
    ok += [check(name, tr, n, timeout_ms) for name, tr in (TRANSITIONS if transitions is None else transitions).items()]
    ok.append(stale_never_acts(n))
    return ok, [check(name, tr, n, timeout_ms) for name, tr in BROKEN.items()]
