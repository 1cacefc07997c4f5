"""session progress: an admission finds a slot whenever one is not leased, as a one-step ranking.

``PROGRESS-SESSION-ADMIT`` (SPEC.md; INVARIANTS.md, section "Progress"): at
the bound of ``managers/session.py`` (3 slots), in every
state satisfying INV-SESSION-FENCE (proven inductive there), a session ``x``
that holds no leased slot and is admitted (warm flag ``w`` either way) while
some slot is not leased is accepted in one operation: some ``cold lease`` or
``warm admit`` of the transition table (the model's rule table:
SESSION-CANDIDATE, SESSION-LEASE, SESSION-LRU) is enabled for ``x`` and leaves
``x`` holding a leased slot. The rank is 1 while ``x`` holds no leased slot,
0 after; the moves are the admissions of ``x`` at each slot. A session whose
own slot is leased is refused by the rules (one lease per session), and so is
an admission with every slot leased; neither is in the premise.

The hypothesis adds ``LEMMA-SESSION-STAMPS`` to INV-SESSION-FENCE: every idle
slot was parked before the clock's present value, and no two idle slots were
parked at one tick (so SESSION-LRU's "parked least recently" names one slot).
Without it the proof fails on a state the rules never reach (two idle slots
with one stamp: no steal is enabled). ``prove_lemma`` proves it inductive (the
initial state, then every transition of ``session.TRANSITIONS`` from a state
of both), so the hypothesis holds in every reachable state of the bound.

``sanity``: the premise holds, and each way in is taken in some state (the
session's own idle slot, cold or warm; the lowest free slot; with none free,
the idle slot parked least recently, another session's). The seeded bug
``cold-never-steals`` (a cold lease takes a free slot or the session's own,
never another session's idle slot) only adds a guard, so INV-SESSION-FENCE
stays inductive; it is refuted by a state where every slot is parked for
other sessions and an admission finds none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.managers.session import (
    FREE,
    IDLE,
    LEASED,
    TRANSITIONS,
    SState,
    Transition,
    _at,
    _holds,
    cold_lease,
    fresh,
    initial,
    invariant,
    warm_admit,
)
from kvspec.spec.rules import RuleName

PROGRESS_ID: RuleName = "PROGRESS-SESSION-ADMIT"
LEMMA_ID = "LEMMA-SESSION-STAMPS"
COUNTS = "1 while the admitted session holds no leased slot"
#: (move, pre-state, slot, session) -> an extra requirement of that step (a seeded progress bug)
Patch = Callable[[str, SState, z3.ArithRef, z3.ArithRef], list[z3.BoolRef]]
MOVES: dict[str, Transition] = {"cold lease": cold_lease, "warm admit": warm_admit}


def _no_patch(name: str, s: SState, k: z3.ArithRef, x: z3.ArithRef) -> list[z3.BoolRef]:
    return []


def _never_steals(name: str, s: SState, k: z3.ArithRef, x: z3.ArithRef) -> list[z3.BoolRef]:
    return [z3.Or(_at(s.st, k) == FREE, _at(s.own, k) == x)] if name == "cold lease" else []


@dataclass
class SessionPResult:
    verdict: str  # proven | refuted | unknown (...)
    seconds: float


@dataclass(frozen=True)
class SessionProgressBug:
    name: str
    why: str
    patch: Patch


PROGRESS_BUGS: list[SessionProgressBug] = [
    SessionProgressBug("cold-never-steals", "a cold lease never takes another session's idle slot", _never_steals),
]


def lemma_stamps(s: SState, n: int) -> z3.BoolRef:
    """LEMMA-SESSION-STAMPS: idle slots were parked before the clock, each at its own tick."""
    out = [z3.Implies(s.st[i] == IDLE, s.stamp[i] < s.clock) for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            out.append(z3.Implies(z3.And(s.st[i] == IDLE, s.st[j] == IDLE), s.stamp[i] != s.stamp[j]))
    return z3.And(out)


def _hyp(s: SState, n: int) -> list[z3.BoolRef]:
    return [invariant(s, n), lemma_stamps(s, n)]


def prove_lemma(n: int, timeout_ms: int = 60_000, transitions: dict[str, Transition] | None = None) -> SessionPResult:
    """LEMMA-SESSION-STAMPS holds initially and is kept by every transition (from a state of the hypothesis)."""
    t0 = time.perf_counter()
    verdicts = []
    solver = z3.Solver()
    solver.add(z3.Not(lemma_stamps(initial(n), n)))
    verdicts.append(solving.check(solver, timeout_ms=timeout_ms).verdict)
    for name, tr in (TRANSITIONS if transitions is None else transitions).items():
        pre = fresh(n, "lm_")
        post, en = tr(pre, n, f"lm_{name.replace(' ', '_')}_")
        solver = z3.Solver()
        solver.set("timeout", timeout_ms)
        solver.add(*_hyp(pre, n), en, z3.Not(lemma_stamps(post, n)))
        verdicts.append(solving.check(solver, timeout_ms=timeout_ms).verdict)
    worst = next((v for v in verdicts if v != "proven"), "proven")
    return SessionPResult(worst, time.perf_counter() - t0)


def _x(p: str) -> z3.ArithRef:
    return z3.Int(f"{p}adm_x")


def _w(p: str) -> z3.BoolRef:
    return z3.Bool(f"{p}adm_w")


def _premise(s: SState, n: int, p: str) -> list[z3.BoolRef]:
    x = _x(p)
    return [x >= 0, z3.Not(_holds(s, n, x, LEASED)), z3.Or([st != LEASED for st in s.st])]


def _move(name: str, s: SState, n: int, j: int, p: str, patch: Patch) -> tuple[SState, z3.BoolRef]:
    """The move ``name`` at slot ``j`` for the premise's session and warm flag (inputs substituted)."""
    t = f"{p}{name.replace(' ', '_')}{j}_"
    post, en = MOVES[name](s, n, t)
    sub = [
        (z3.Int(f"{t}k"), z3.IntVal(j)),
        (z3.Int(f"{t}x"), _x(p)),
        (z3.Bool(f"{t}w"), _w(p)),
        (z3.Bool(f"{t}sup"), z3.BoolVal(False)),
    ]

    def s_(e: z3.ExprRef) -> z3.ExprRef:
        return z3.substitute(e, *sub)

    vals = {f.name: getattr(post, f.name) for f in fields(SState)}
    post = SState(**{k: [s_(e) for e in v] if isinstance(v, list) else s_(v) for k, v in vals.items()})
    return post, s_(z3.And(en, *patch(name, s, z3.IntVal(j), _x(p))))


def _admits(s: SState, n: int, name: str, j: int, p: str, patch: Patch) -> z3.BoolRef:
    post, en = _move(name, s, n, j, p, patch)
    return z3.And(en, _holds(post, n, _x(p), LEASED))


def _stuck(s: SState, n: int, p: str, patch: Patch) -> list[z3.BoolRef]:
    return [z3.Not(_admits(s, n, name, j, p, patch)) for name in MOVES for j in range(n)]


def prove(n: int, patch: Patch = _no_patch, timeout_ms: int = 60_000) -> SessionPResult:
    t0 = time.perf_counter()
    s = fresh(n, "sp_")
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*_hyp(s, n), *_premise(s, n, "sp_"), *_stuck(s, n, "sp_", patch))
    return SessionPResult(solving.check(solver, timeout_ms=timeout_ms).verdict, time.perf_counter() - t0)


def sanity(n: int, timeout_ms: int = 60_000) -> list[str]:
    """The premise holds and each way in is the one taken in some state."""
    s, p = fresh(n, "ss_"), "ss_"
    x = _x(p)

    def by(name: str, slot_is: Callable[[int], z3.BoolRef]) -> z3.BoolRef:
        return z3.Or([z3.And(slot_is(j), _admits(s, n, name, j, p, _no_patch)) for j in range(n)])

    cases = {
        "the premise": z3.BoolVal(True),
        "a cold lease of its own idle slot": by("cold lease", lambda j: z3.And(s.st[j] == IDLE, s.own[j] == x)),
        "a cold lease of a free slot": by("cold lease", lambda j: s.st[j] == FREE),
        "a cold lease of another session's idle slot": by(
            "cold lease", lambda j: z3.And(s.st[j] == IDLE, s.own[j] != x)
        ),
        "a warm admission": by("warm admit", lambda j: z3.BoolVal(True)),
    }
    out = []
    for label, goal in cases.items():
        solver = z3.Solver()
        solver.set("timeout", timeout_ms)
        solver.add(*_hyp(s, n), *_premise(s, n, p), goal)
        if not solving.check(solver, timeout_ms=timeout_ms).sat:
            out.append(f"session {PROGRESS_ID}: no state of {n} slots has {label}")
    return out


def refute(bug: SessionProgressBug, n: int, timeout_ms: int = 60_000) -> str:
    r = prove(n, bug.patch, timeout_ms)
    return "refuted" if r.verdict == "refuted" else "not refuted" if r.verdict == "proven" else r.verdict


def progress_rows(emit: Callable[[list[str]], None], n: int) -> list[str]:
    """The rows of ``kvspec prove --profile session`` (``emit`` prints one and files its verdict);
    returns the problems."""
    problems: list[str] = []
    lem = prove_lemma(n)
    emit([LEMMA_ID, lem.verdict, f"{n} slots (progress hypothesis)", f"{lem.seconds:.2f}s"])
    res = prove(n)
    emit([f"{PROGRESS_ID} (ranking)", res.verdict, f"{n} slots", f"{res.seconds:.2f}s"])
    for what, r in ((LEMMA_ID, lem), (PROGRESS_ID, res)):
        if r.verdict != "proven":
            problems.append(f"session {what}: {r.verdict}")
    t0 = time.perf_counter()
    found = sanity(n)
    problems += found
    emit(["SANITY-PROGRESS", "ok" if not found else "FAILED", f"{n} slots", f"{time.perf_counter() - t0:.2f}s"])
    for b in PROGRESS_BUGS:
        t0 = time.perf_counter()
        verdict = refute(b, n)
        emit([f"  refutes {b.name}", verdict, PROGRESS_ID, f"{time.perf_counter() - t0:.2f}s"])
        if verdict != "refuted":
            problems.append(f"the session progress bug {b.name} ({b.why}) was not refuted")
    return problems
