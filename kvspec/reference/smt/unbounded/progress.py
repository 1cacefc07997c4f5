"""Progress for any number of slots and hashes: ranking arguments over the unbounded encoding.

The bounded progress rows of ``kvspec equivalence`` check, state by state of a
walk, that something can still happen; they say nothing past the walk's
depth. Here each progress property is a *ranking* argument over the
unbounded kvbm-offload encoding (``encoding.py``):

- a **rank**, an integer of the state that is ``>= 0`` in every state the
  inductive hypothesis allows (it is a sum of census counts, each ``>= 0``);
- a **premise**, "work is pending" (``rank >= 1``);
- **moves**: transitions with their inputs named by terms of the pre-state
  (the census witnesses of ``census_facts``: a slot in state X when the count
  of X is positive, a reserved slot of job ``j``, a block G2 holds), each
  with the condition under which it is the one to take.

The proof is ``unsat`` of: the hypothesis (every INV-* and LEMMA-* of the
encoding, which ``kvspec prove --unbounded`` proves inductive, so it holds in
every reachable state at every capacity), the premise, and "no move is
enabled with a smaller rank after it". Then from every reachable state some
enabled step lowers the rank; as the rank is a natural number, at most
``rank`` such steps empty it: the pending work cannot be stuck, at any size.

Two properties (rule ids of SPEC.md, the same as the bounded rows):

- ``PROGRESS-QUARANTINE``: rank = quarantined + reserved slots (the transfers
  in flight); moves are the completions only, ``offload_complete`` and
  ``swapin_register``: no client operation is needed for every quarantined
  slot to be released. Deadlines are not part of this encoding (the bounded
  row checks "by its deadline"); this is "eventually, by completions alone".
- ``PROGRESS-NO-DEADLOCK``: rank = the sum of the active slots' owners +
  partial, quarantined and reserved slots (everything held or pending); moves
  add ``deref(full)`` and ``deref(partial)``: whatever is held or pending,
  some accepted operation reduces it.

Non-vacuity is checked in finite instances (``models.finite_check``: a real
state of 3 slots and 4 hashes satisfying the whole hypothesis): the premise
is satisfiable, and every move is the one that fires in some state. Each
property has a seeded bug that breaks it while every INV-* stays proven (the
point of a progress property): its refutation is a finite state satisfying
the hypothesis where *no* instance of the moves' transitions, over every
input of the finite universe, is enabled with a smaller rank.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.unbounded import models
from kvspec.reference.smt.unbounded.encoding import (
    TRANSITIONS,
    Int,
    Slot,
    Tweaks,
    UState,
    UStep,
    census_facts,
    domain,
    hypothesis,
)
from kvspec.reference.smt.universe import ACTIVE, NONE, PARTIAL, QUARANTINED, RESERVED
from kvspec.spec.rules import RuleId as R

#: a move: (transition name, the condition under which it is taken, its inputs as terms of the pre-state)
Move = tuple[str, Callable[[UState, str], z3.BoolRef], Callable[[UState, str], dict[str, z3.ExprRef]]]


def _wit(prefix: str, X: z3.ExprRef) -> z3.ExprRef:
    """The census witness of slot state X (``census_facts``: in state X whenever the count of X is positive)."""
    return z3.Const(f"{prefix}wit_{X}", Slot)


def _job_slot(prefix: str, j: z3.ArithRef) -> z3.ExprRef:
    """The census witness of a reserved slot of job ``j``."""
    return z3.Function(f"{prefix}jw", Int, Slot)(j)


def _job(S: UState, prefix: str) -> z3.ArithRef:
    """The job to register next: the one registering, else the job of a reserved slot."""
    return z3.If(S.v["busy"] != NONE, S.v["busy"], S.a["jid"][_wit(prefix, RESERVED)])


def _complete_inputs(S: UState, p: str) -> dict[str, z3.ExprRef]:
    return {"s": _wit(p, QUARANTINED), "w": z3.Int(f"{p}g2wit")}


def _register_inputs(S: UState, p: str) -> dict[str, z3.ExprRef]:
    j = _job(S, p)
    return {"j": j, "k": _job_slot(p, j)}


def _deref_full_inputs(S: UState, p: str) -> dict[str, z3.ExprRef]:
    t = _wit(p, ACTIVE)
    return {"h": S.a["blk"][t], "t": t}


def _deref_partial_inputs(S: UState, p: str) -> dict[str, z3.ExprRef]:
    s = _wit(p, PARTIAL)
    return {"u": S.a["pu"][s], "s": s}


def _idle(S: UState, p: str) -> z3.BoolRef:
    return S.v["busy"] == NONE


def _has(X: z3.ExprRef) -> Callable[[UState, str], z3.BoolRef]:
    return lambda S, p: S.cnt(X) >= 1


def _all(*cs: Callable[[UState, str], z3.BoolRef]) -> Callable[[UState, str], z3.BoolRef]:
    return lambda S, p: z3.And([c(S, p) for c in cs])


COMPLETIONS: list[Move] = [
    ("offload_complete", _all(_idle, _has(QUARANTINED)), _complete_inputs),
    ("swapin_register", lambda S, p: z3.Or(S.v["busy"] != NONE, S.cnt(RESERVED) >= 1), _register_inputs),
]
DEREFS: list[Move] = [
    ("deref(full)", _all(_idle, _has(ACTIVE)), _deref_full_inputs),
    ("deref(partial)", _all(_idle, _has(PARTIAL)), _deref_partial_inputs),
]


@dataclass(frozen=True)
class Ranking:
    """One progress property: its rank and the moves that lower it."""

    id: str
    #: what the rank counts, for the reader
    counts: str
    rank: Callable[[UState], z3.ArithRef]
    moves: list[Move]


def _in_flight(S: UState) -> z3.ArithRef:
    return S.cnt(QUARANTINED) + S.cnt(RESERVED)


def _held_or_pending(S: UState) -> z3.ArithRef:
    return S.v["refsum"] + S.cnt(PARTIAL) + S.cnt(QUARANTINED) + S.cnt(RESERVED)


RANKINGS: list[Ranking] = [
    Ranking(R.PROGRESS_QUARANTINE, "quarantined + reserved slots", _in_flight, COMPLETIONS),
    Ranking(
        R.PROGRESS_NO_DEADLOCK, "owners + partial + quarantined + reserved", _held_or_pending, COMPLETIONS + DEREFS
    ),
]


@dataclass(frozen=True)
class ProgressBug:
    """A tweak of the encoding that breaks ``expect`` and no INV-*."""

    name: str
    rule: str
    expect: str
    why: str


#: each progress property's seeded bug (tweaks read by ``encoding.py``'s transitions)
PROGRESS_BUGS: list[ProgressBug] = [
    ProgressBug(
        "complete-waits-for-g2-room",
        R.G2_EVICT,
        R.PROGRESS_QUARANTINE,
        "a completion with G2 full waits for room instead of evicting a G2 block",
    ),
    ProgressBug(
        "deref-refuses-last-owner",
        R.DEREF_OWNER,
        R.PROGRESS_NO_DEADLOCK,
        "a Deref of a block's last owner is refused",
    ),
]


def by_id(pid: str) -> Ranking:
    for r in RANKINGS:
        if r.id == pid:
            return r
    raise KeyError(f"unknown progress property {pid!r}; known: {[r.id for r in RANKINGS]}")


def _step(name: str, S: UState, inputs: dict[str, z3.ExprRef], tw: Tweaks) -> UStep:
    return TRANSITIONS[name][0](S, **inputs, tw=tw)


def _lowers(step: UStep, rank: Callable[[UState], z3.ArithRef]) -> z3.BoolRef:
    return z3.And(step.enabled(), rank(step.post) < rank(step.pre))


def owners_fact(S: UState) -> z3.BoolRef:
    """What the ``refsum`` ghost (the sum of the active slots' owners) means in every finite
    state and ``census_facts`` does not say: a positive sum has an active slot behind it."""
    return z3.Implies(S.v["refsum"] >= 1, S.cnt(ACTIVE) >= 1)


def _premise(S: UState, prefix: str, r: Ranking) -> list[z3.BoolRef]:
    return [*domain(S), *census_facts(S, prefix), owners_fact(S), *hypothesis(S), r.rank(S) >= 1]


def _some_move(S: UState, prefix: str, r: Ranking, tw: Tweaks) -> z3.BoolRef:
    return z3.Or(
        [
            z3.And(when(S, prefix), _lowers(_step(name, S, inputs(S, prefix), tw), r.rank))
            for name, when, inputs in r.moves
        ]
    )


@dataclass
class PResult:
    property_id: str
    #: "proven", "not proven" (z3 found a state where none of the moves *as named* lowers the rank:
    #: the property may still hold by another move; ``refute_finite`` is what shows a real failure)
    #: or "unknown"
    verdict: str
    seconds: float
    detail: str = ""


def prove(r: Ranking, tw: Tweaks = frozenset(), timeout_ms: int = 60_000) -> PResult:
    """The ranking argument of ``r`` for any number of slots and hashes (module docstring)."""
    t0 = time.perf_counter()
    n, cap2 = z3.Int("n"), z3.Int("cap2")
    S = UState.fresh("pg_", n, cap2)
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*_premise(S, "pg_", r), z3.Not(_some_move(S, "pg_", r, tw)))
    a = solving.check(s, timeout_ms=timeout_ms)
    if a.unsat:
        return PResult(r.id, "proven", time.perf_counter() - t0)
    if a.model is not None:
        detail = "a state satisfying the hypothesis where none of the moves, as named, lowers the rank"
        return PResult(r.id, "not proven", time.perf_counter() - t0, detail)
    return PResult(r.id, "unknown", time.perf_counter() - t0, a.verdict)


def sanity(r: Ranking, timeout_ms: int = 60_000) -> list[str]:
    """The premise holds in a finite state, and each move is the one that fires in some finite state."""
    out = []
    res, _ = models.finite_check(lambda S: _premise(S, "fi_", r), timeout_ms=timeout_ms)
    if res != z3.sat:
        out.append(f"{r.id}: no finite state with work pending satisfies the hypothesis ({res})")
    for name, when, inputs in r.moves:

        def fires(S: UState, name: str = name, when=when, inputs=inputs) -> list[z3.BoolRef]:
            step = _step(name, S, inputs(S, "fi_"), frozenset())
            return [*_premise(S, "fi_", r), when(S, "fi_"), _lowers(step, r.rank)]

        res, _ = models.finite_check(fires, timeout_ms=timeout_ms)
        if res != z3.sat:
            out.append(f"{r.id}: the move {name} is not shown to fire ({res})")
    return out


def _finite_inputs(name: str, k: int, H: int) -> list[dict[str, z3.ExprRef]]:
    """Every input of transition ``name`` over a finite universe: ``k`` slots, ints -1..H-1."""
    _fn, ints, slots, int_choices = TRANSITIONS[name]
    names = [*ints, *int_choices, *slots]
    doms: list[list[z3.ExprRef]] = []
    for key in names:
        if key in slots:
            doms.append([z3.Const(f"slot{i}", Slot) for i in range(k)])
        else:
            lo = {**ints, **int_choices}[key]
            doms.append([z3.IntVal(i) for i in range(max(lo, NONE), H)])
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*doms)]


def refute_finite(bug: ProgressBug, timeout_ms: int = 60_000) -> str:
    """``refuted`` when a finite state satisfying the hypothesis has work pending and no
    instance of the moves' transitions, over every input of the finite universe, lowers the rank."""
    r = by_id(bug.expect)
    tw = frozenset({bug.name})
    k, H = models.FINITE_SLOTS, models.FINITE_HASHES

    def stuck(S: UState) -> list[z3.BoolRef]:
        out = _premise(S, "fi_", r)
        for name in dict.fromkeys(m[0] for m in r.moves):
            for inputs in _finite_inputs(name, k, H):
                out.append(z3.Not(_lowers(_step(name, S, inputs, tw), r.rank)))
        return out

    res, _ = models.finite_check(stuck, timeout_ms=timeout_ms)
    return "refuted" if res == z3.sat else "not refuted" if res == z3.unsat else "unknown"
