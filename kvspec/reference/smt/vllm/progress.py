"""vllm progress for any pool and any hashes: ranking arguments over the operation encoding.

``kvspec equivalence --profile vllm`` checks PROGRESS-USE-FITS and
PROGRESS-NO-DEADLOCK state by state within its walk (2 blocks, depth 6).
Here each is a *ranking* argument over the operation-level encoding
``vllm/ops.py`` (whose blocks are an uninterpreted sort: any pool size, any
hashes), as ``unbounded/progress.py`` does for kvbm with an offload tier:
in every state satisfying the encoding's hypothesis (its ghost facts and
every invariant ``kvspec prove --profile vllm`` proves inductive, so every
reachable state) where the premise holds, some *move* (a transition with its
inputs named by terms of the pre-state, and the condition under which it is
the one to take) is enabled and lowers a natural-number rank. The proof is
``unsat`` of: hypothesis, premise, and "no move is enabled and lowers the rank".

- ``PROGRESS-USE-FITS``: a Use inside its batch (after ``use(begin)`` and its
  prefix hits) whose fresh blocks fit in the free blocks plus the unowned
  copies left after its pins (``budget <= free + idle``: the model's check,
  the pins already taken out of ``idle``), and whose next full block after
  the hits is not cached (the hits are the longest cached prefix, as
  VLLM-PREFIX-HIT makes them). Rank = fresh blocks still to place + 2 while
  the capacity check is ahead + 1 until the close. Moves: ``use(check)``;
  ``use(new)`` or ``use(partial)`` (the request's next fresh block is full or
  partial: a free constant of the premise) in a free block (census witness),
  else in an unowned copy (census witness); ``use(close)``. So a fitting Use
  is accepted: its capacity check is not refused, and it reaches ``use(close)``.
- ``PROGRESS-NO-DEADLOCK``: between operations (phase idle), a block ``w``
  held by a request (a partial block, or a cached copy with an owner). Rank =
  the sum over the pool of owners + 1 per held partial block, a sum over a
  pool of any size: the argument shows the step lowers no block's term and
  lowers ``w``'s (so the sum falls by at least one). Moves: ``deref(partial)``,
  ``deref(full)`` (an owner not the promoted uuid's), ``deref(promoted)``.

Non-vacuity (``sanity``): in a finite pool (3 blocks, hashes -1..2, every
ghost exact: ``ops.finite_check``) the premise holds, and each move is the one
that lowers the rank in some state. Each property has a seeded bug
(``PROGRESS_BUGS``): an extra guard on one step, so it only removes
transitions and every inductive invariant stays inductive; its refutation is a finite state satisfying the
hypothesis and the premise where *no* instance of the moves' transitions,
over every input of the finite universe, lowers the rank (the sum over the
finite pool, for NO-DEADLOCK).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.vllm import ops
from kvspec.reference.smt.vllm.copies import V_CACHED, V_HELD, Block
from kvspec.reference.smt.vllm.ops import HITS, IDLE, NONE, PLACE, VllmOpState, VllmOpStep
from kvspec.spec.rules import RuleId as R

#: the finite pool of the sanity checks and refutations (``ops.finite_check``)
FINITE_BLOCKS, FINITE_HASHES = 3, 3

Cond = Callable[[VllmOpState, str], z3.BoolRef]
Inputs = Callable[[VllmOpState, str], dict[str, z3.ExprRef]]
#: a move: (transition of ``ops.TRANSITIONS``, when it is the one to take, its inputs as terms of the pre-state)
Move = tuple[str, Cond, Inputs]
#: a seeded bug: (transition, pre-state) -> an extra requirement of that step
Patch = Callable[[str, VllmOpState], list[z3.BoolRef]]


def _ind(c: z3.BoolRef) -> z3.ArithRef:
    return z3.If(c, 1, 0)


def _inputs(p: str, **given: z3.ExprRef) -> dict[str, z3.ExprRef]:
    """Every input a transition reads, the ``given`` ones named, the rest unconstrained constants."""
    out = ops.inputs(f"{p}mv_")
    out.update(given)
    return out


def _wit(p: str, census: str) -> z3.ExprRef:
    """The census witness of ``ops.facts``: a block with the property whenever its count is positive."""
    return z3.Const(f"{p}wit_{census}", Block)


def _nxt(p: str) -> z3.ArithRef:
    """The Use's first full block after its hits (NONE: none), a term of the premise."""
    return z3.Int(f"{p}nxt")


def _fresh_hash(p: str) -> z3.ArithRef:
    """The hash of the Use's next fresh full block."""
    return z3.Int(f"{p}fh")


def _full_next(p: str) -> z3.BoolRef:
    """The Use's next fresh block is full (else partial)."""
    return z3.Bool(f"{p}fullnext")


def _work(p: str) -> z3.ExprRef:
    """The block a request holds (the premise of NO-DEADLOCK)."""
    return z3.Const(f"{p}work", Block)


# ------------------------------------------------------------------ PROGRESS-USE-FITS
def _batch_rank(S: VllmOpState) -> z3.ArithRef:
    return S.budget + 2 * _ind(S.phase == HITS) + _ind(S.phase != IDLE)


def _fits_premise(S: VllmOpState, p: str) -> list[z3.BoolRef]:
    nxt = _nxt(p)
    return [
        z3.Or(S.phase == HITS, S.phase == PLACE),
        z3.Implies(S.phase == HITS, S.budget <= S.cnt["free"] + S.cnt["idle"]),
        z3.Or(nxt == NONE, z3.And(nxt >= 0, S.ccnt[nxt] == 0)),
        _fresh_hash(p) >= 0,
    ]


def _placing(S: VllmOpState, p: str) -> z3.BoolRef:
    return z3.And(S.phase == PLACE, S.budget >= 1)


def _in_free(kind: bool) -> Cond:
    def when(S: VllmOpState, p: str) -> z3.BoolRef:
        k = _full_next(p) if kind else z3.Not(_full_next(p))
        return z3.And(_placing(S, p), k, S.cnt["free"] >= 1)

    return when


def _in_idle(kind: bool) -> Cond:
    def when(S: VllmOpState, p: str) -> z3.BoolRef:
        k = _full_next(p) if kind else z3.Not(_full_next(p))
        return z3.And(_placing(S, p), k, S.cnt["free"] == 0)

    return when


FITS_MOVES: list[Move] = [
    ("use(check)", lambda S, p: S.phase == HITS, lambda S, p: _inputs(p, h=_nxt(p))),
    ("use(new)", _in_free(True), lambda S, p: _inputs(p, h=_fresh_hash(p), b=_wit(p, "free"))),
    ("use(new)", _in_idle(True), lambda S, p: _inputs(p, h=_fresh_hash(p), b=_wit(p, "idle"))),
    ("use(partial)", _in_free(False), lambda S, p: _inputs(p, b=_wit(p, "free"))),
    ("use(partial)", _in_idle(False), lambda S, p: _inputs(p, b=_wit(p, "idle"))),
    ("use(close)", lambda S, p: z3.And(S.phase == PLACE, S.budget == 0), lambda S, p: _inputs(p)),
]


# ------------------------------------------------------------------ PROGRESS-NO-DEADLOCK
def _term(S: VllmOpState, x: z3.ExprRef) -> z3.ArithRef:
    """One block's term of the NO-DEADLOCK rank: its owners, plus one if it is a held partial block."""
    return S.own[x] + _ind(S.st[x] == V_HELD)


def _held(S: VllmOpState, w: z3.ExprRef) -> z3.BoolRef:
    return z3.Or(S.st[w] == V_HELD, z3.And(S.st[w] == V_CACHED, S.own[w] >= 1))


def _release_premise(S: VllmOpState, p: str) -> list[z3.BoolRef]:
    return [S.phase == IDLE, _held(S, _work(p))]


def _at_work(S: VllmOpState, p: str) -> dict[str, z3.ExprRef]:
    return _inputs(p, b=_work(p))


RELEASE_MOVES: list[Move] = [
    ("deref(partial)", lambda S, p: S.st[_work(p)] == V_HELD, _at_work),
    (
        "deref(full)",
        lambda S, p: z3.And(S.st[_work(p)] == V_CACHED, S.own[_work(p)] - _ind(S.uo[_work(p)]) >= 1),
        _at_work,
    ),
    ("deref(promoted)", lambda S, p: z3.And(S.st[_work(p)] == V_CACHED, S.uo[_work(p)]), _at_work),
]


# ------------------------------------------------------------------ the properties
@dataclass(frozen=True)
class VllmRanking:
    """One progress property: premise, moves, and what "lowers the rank" is for a step."""

    id: str
    #: what the rank counts, for the reader
    counts: str
    premise: Callable[[VllmOpState, str], list[z3.BoolRef]]
    moves: list[Move]
    #: the step lowers the rank (in the proof: for any pool size)
    lowers: Callable[[VllmOpStep, str], z3.BoolRef]
    #: the rank as a term, over the blocks of a finite pool (refutation)
    finite_rank: Callable[[VllmOpState, list[z3.ExprRef]], z3.ArithRef]


def _batch_lowers(step: VllmOpStep, p: str) -> z3.BoolRef:
    return _batch_rank(step.post) < _batch_rank(step.pre)


def _release_lowers(step: VllmOpStep, p: str) -> z3.BoolRef:
    x = z3.Const(f"{p}rk", Block)
    w = _work(p)
    none_up = z3.ForAll([x], _term(step.post, x) <= _term(step.pre, x))
    return z3.And(none_up, _term(step.post, w) < _term(step.pre, w))


RANKINGS: list[VllmRanking] = [
    VllmRanking(
        R.PROGRESS_USE_FITS,
        "fresh blocks to place + 2 before the check + 1 before the close",
        _fits_premise,
        FITS_MOVES,
        _batch_lowers,
        lambda S, bs: _batch_rank(S),
    ),
    VllmRanking(
        R.PROGRESS_NO_DEADLOCK,
        "owners + held partial blocks, summed over the pool",
        _release_premise,
        RELEASE_MOVES,
        _release_lowers,
        lambda S, bs: z3.Sum([_term(S, b) for b in bs]),
    ),
]


def by_id(pid: str) -> VllmRanking:
    for r in RANKINGS:
        if r.id == pid:
            return r
    raise KeyError(f"unknown vllm progress property {pid!r}; known: {[str(r.id) for r in RANKINGS]}")


@dataclass(frozen=True)
class VllmProgressBug:
    """An extra guard on one step: it keeps every invariant (fewer transitions) and breaks ``expect``."""

    name: str
    rule: str
    expect: str
    why: str
    patch: Patch


def _check_counts_free_only(name: str, S: VllmOpState) -> list[z3.BoolRef]:
    return [S.budget <= S.cnt["free"]] if name == "use(check)" else []


def _deref_refused_when_full(name: str, S: VllmOpState) -> list[z3.BoolRef]:
    return [S.cnt["free"] >= 1] if name.startswith("deref(") else []


PROGRESS_BUGS: list[VllmProgressBug] = [
    VllmProgressBug(
        "check-counts-free-only",
        R.USE_CAPACITY,
        R.PROGRESS_USE_FITS,
        "the capacity check counts the free blocks only, not the unowned copies a Use may evict",
        _check_counts_free_only,
    ),
    VllmProgressBug(
        "deref-refused-when-full",
        R.DEREF_OWNER,
        R.PROGRESS_NO_DEADLOCK,
        "a Deref is refused while no block is free",
        _deref_refused_when_full,
    ),
]


def _no_patch(name: str, S: VllmOpState) -> list[z3.BoolRef]:
    return []


def _step(name: str, S: VllmOpState, inputs: dict[str, z3.ExprRef], patch: Patch) -> VllmOpStep:
    step = ops.TRANSITIONS[name](S, inputs, frozenset())
    return replace(step, requires=[*step.requires, *patch(name, S)])


def _enabled_lowering(r: VllmRanking, step: VllmOpStep, p: str) -> z3.BoolRef:
    return z3.And(*step.requires, r.lowers(step, p))


def _hypothesis(S: VllmOpState, p: str, r: VllmRanking) -> list[z3.BoolRef]:
    return [*ops.facts(S, p), *ops.hypothesis(S), *r.premise(S, p)]


def _some_move(S: VllmOpState, p: str, r: VllmRanking, patch: Patch) -> z3.BoolRef:
    return z3.Or(
        [
            z3.And(when(S, p), _enabled_lowering(r, _step(name, S, inputs(S, p), patch), p))
            for name, when, inputs in r.moves
        ]
    )


@dataclass
class VllmPResult:
    property_id: str
    #: "proven"; "not proven" (a state where none of the moves *as named* lowers the rank: the
    #: property may still hold by another move, ``refute_finite`` shows a real failure); "unknown (...)"
    verdict: str
    seconds: float


def prove(r: VllmRanking, patch: Patch = _no_patch, timeout_ms: int = 60_000) -> VllmPResult:
    """The ranking argument of ``r`` for any pool size and any hashes (module docstring)."""
    t0 = time.perf_counter()
    S = VllmOpState.fresh("vp_")
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*_hypothesis(S, "vp_", r), z3.Not(_some_move(S, "vp_", r, patch)))
    a = solving.check(s, timeout_ms=timeout_ms)
    verdict = "proven" if a.unsat else "not proven" if a.model is not None else a.verdict
    return VllmPResult(r.id, verdict, time.perf_counter() - t0)


def _finite(build: Callable[[VllmOpState], list[z3.BoolRef]]) -> z3.CheckSatResult:
    return ops.finite_check(build, k=FINITE_BLOCKS, H=FINITE_HASHES)


def sanity(r: VllmRanking) -> list[str]:
    """The premise holds in a finite pool, and each move is the one that lowers the rank in some finite pool."""
    out = []
    p = "fi_"
    if _finite(lambda S: _hypothesis(S, p, r)) != z3.sat:
        out.append(f"vllm {r.id}: no finite pool satisfies the hypothesis and the premise")
    for i, (name, when, inputs) in enumerate(r.moves):

        def fires(S: VllmOpState, name: str = name, when: Cond = when, inputs: Inputs = inputs) -> list[z3.BoolRef]:
            step = _step(name, S, inputs(S, p), _no_patch)
            return [*_hypothesis(S, p, r), when(S, p), _enabled_lowering(r, step, p)]

        if _finite(fires) != z3.sat:
            out.append(f"vllm {r.id}: the move {name} (#{i}) is not shown to fire")
    return out


def _finite_inputs(k: int, H: int) -> list[dict[str, z3.ExprRef]]:
    """Every (hash, block) input over the finite universe (the other inputs are read by no move)."""
    bs = [z3.Const(f"blk{i}", Block) for i in range(k)]
    hs = [z3.IntVal(i) for i in range(NONE, H)]
    return [_inputs("fin_", h=h, b=b) for h, b in itertools.product(hs, bs)]


def refute_finite(bug: VllmProgressBug, ranking: VllmRanking | None = None) -> str:
    """``refuted`` when a finite pool satisfying the hypothesis and the premise has no instance of
    the moves' transitions, over every input of the finite universe, that lowers the rank
    (of ``ranking``, by default the property the bug breaks)."""
    r = ranking or by_id(bug.expect)
    bs = [z3.Const(f"blk{i}", Block) for i in range(FINITE_BLOCKS)]

    def stuck(S: VllmOpState) -> list[z3.BoolRef]:
        out = _hypothesis(S, "fi_", r)
        for name in dict.fromkeys(m[0] for m in r.moves):
            for inputs in _finite_inputs(FINITE_BLOCKS, FINITE_HASHES):
                step = _step(name, S, inputs, bug.patch)
                lowered = r.finite_rank(step.post, bs) < r.finite_rank(step.pre, bs)
                out.append(z3.Not(z3.And(*step.requires, lowered)))
        return out

    res = _finite(stuck)
    return "refuted" if res == z3.sat else "not refuted" if res == z3.unsat else "unknown"
