"""The kvbm, legacy and atomic step encodings as transition tables for ``smt/reach.py``.

The block encodings are proven for any capacity and any hashes (arrays over
unbounded integers, batch ghosts), so the reachability search runs on a
finite instance of them: hashes 0..2 and uuids 0..1 (each array stored as
one constant per index, -1 included for "no block", and nothing elsewhere),
a capacity of 1 or 2, and every step's inputs (hash, victim, uuid, parent)
in that range. Such a state is a finite vector, so the unrolling is plain
z3 arithmetic (the arrays of the unbounded form, with ``use(close)``'s
lambdas, make z3 give up at depth 2).

A Use runs in phases (``phase``: idle, declaring for atomic, placing,
stopped), so the pairs of steps with no phase in common are left out of the
"enabled together" goals; the phase table is checked by ``reach``. The
search is greedy to ``DEPTH`` steps, then guided by the model
(``model_guided``): kvbm's ``STORE-NO-DUP`` (a Use evicts a block and
registers it again) needs two inactive blocks and a Use of a third hash then
the first: 9 steps, 10 for its ``use(close)``, where z3's greedy search timed
out (depth 9: 35 s CPU, unknown).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from functools import partial
from typing import Any

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.blocks.encoding import (
    CENSUS,
    DECLARE,
    HASH_FIELDS,
    IDLE,
    NONE,
    PLACE,
    SCALARS,
    STOPPED,
    UUID_FIELDS,
    Bool,
    BState,
    ProfileEncoding,
    inputs,
)
from kvspec.reference.smt.reach import Move, ReachStart, ReachStep, ReachTrace, System, _Unrolling
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.profiles import block_semantics

#: the finite instance searched: hashes 0..H-1, uuids 0..U-1, capacity 1..CAP
H, U, CAP = 3, 2, 2
DEPTH = 7
BOUND = f"hashes 0..{H - 1}, uuids 0..{U - 1}, capacity 1..{CAP}"
_IDLE_STEPS = frozenset({"use(begin)", "deref(full)", "deref(partial)", "destroy(full)", "destroy(partial)", "promote"})
_DECLARE_STEPS = frozenset({"use(declare full)", "use(declare partial)", "use(check)"})


def _indices(k: str) -> range:
    return range(NONE, H) if k in HASH_FIELDS else range(NONE, U)


def fresh(p: str) -> BState:
    """A state of the finite instance: one constant per index of each array, nothing elsewhere."""
    a = {}
    for k, s in {**HASH_FIELDS, **UUID_FIELDS}.items():
        arr = z3.K(z3.IntSort(), z3.BoolVal(False) if s == Bool else z3.IntVal(0))
        for i in _indices(k):
            arr = z3.Store(arr, i, z3.Const(f"{p}{k}_{i}", s))
        a[k] = arr
    return BState(a, {k: z3.Const(f"{p}{k}", s) for k, s in SCALARS.items()}, {k: z3.Int(f"{p}c_{k}") for k in CENSUS})


def equal(x: BState, y: BState) -> z3.BoolRef:
    """Equal on every index of the instance, every scalar and census."""
    out = [x.a[k][i] == y.a[k][i] for k in x.a for i in _indices(k)]
    out += [x.v[k] == y.v[k] for k in x.v] + [x.c[k] == y.c[k] for k in x.c]
    return z3.And(out)


#: every index a quantifier over the instance can tell apart: the indices of its arrays (-1..H-1;
#: uuids -1..U-1 within them), and one below and one above them, where every array reads its default
_INTS = [z3.IntVal(x) for x in range(NONE - 1, max(H, U) + 1)]


def _ground(e: z3.ExprRef, memo: dict[int, tuple[z3.ExprRef, z3.ExprRef]]) -> z3.ExprRef:
    """``e`` with no quantifier left: a ForAll (Exists) over indices is the conjunction
    (disjunction) of its instances at ``_INTS``, a lambda (the bulk updates of
    ``use(close)`` and of a Stored group) the array of its values there, the value one
    above them elsewhere. In the finite instance every array is its default outside
    -1..H-1, so these instances decide each quantifier. Left to z3, the quantifiers
    (atomic's "every block of the batch placed", its lambdas) make it answer "unknown
    (incomplete quantifiers)" on long pinned traces."""
    key = e.get_id()
    if key in memo:
        return memo[key][1]
    out: z3.ExprRef
    if z3.is_quantifier(e):
        assert e.num_vars() == 1 and e.var_sort(0) == z3.IntSort(), "one Int variable per quantifier"
        inst = [_ground(z3.substitute_vars(e.body(), c), memo) for c in _INTS]
        if e.is_lambda():
            arr = z3.K(z3.IntSort(), inst[-1])
            for c, x in zip(_INTS[:-1], inst[:-1], strict=True):
                arr = z3.Store(arr, c, x)
            out = arr
        else:
            out = z3.And(inst) if e.is_forall() else z3.Or(inst)
    elif z3.is_app(e) and e.num_args() > 0:
        out = e.decl()(*[_ground(c, memo) for c in e.children()])
    else:
        out = e
    memo[key] = (e, out)  # ``e`` kept alive: z3 gives a freed term's id to the next one
    return out


def _ground_state(S: BState, memo: dict[int, tuple[z3.ExprRef, z3.ExprRef]]) -> BState:
    return BState(
        {k: _ground(x, memo) for k, x in S.a.items()},
        {k: _ground(x, memo) for k, x in S.v.items()},
        {k: _ground(x, memo) for k, x in S.c.items()},
    )


def _never(profile: str) -> dict[tuple[str, str], str]:
    """The goals ``profile``'s steps can never reach, with the reason (a profile that declares its
    batch, atomic: ``atomic_reach.NEVER``, its place and close steps)."""
    from kvspec.reference.smt.blocks.atomic_reach import NEVER

    return dict(NEVER) if block_semantics(profile).declares_batch else {}


def phases(prof: ProfileEncoding) -> dict[str, frozenset[int]]:
    """Idle steps run between operations; a profile that declares its batch (atomic) declares before
    its check; the rest place blocks."""
    declares = block_semantics(prof.name).declares_batch
    out = {}
    for t in prof.transitions:
        if t in _IDLE_STEPS:
            out[t] = frozenset({IDLE})
        elif declares and t in _DECLARE_STEPS:
            out[t] = frozenset({DECLARE})
        else:
            out[t] = frozenset({PLACE, STOPPED})
    return out


def system(
    prof: ProfileEncoding,
    tw: frozenset[str] = frozenset(),
    depth: int = DEPTH,
    never: Mapping[tuple[str, str], str] | None = None,
) -> System[BState]:
    """``prof`` (with the mutants ``tw`` in force) from an empty cache of capacity 1..CAP."""

    def start() -> ReachStart[BState]:
        cap = z3.Int("reach_cap")
        return ReachStart(prof.initial(cap), [cap >= 1, cap <= CAP], fresh, {"capacity": cap})

    last: list[tuple[BState, dict[int, tuple[z3.ExprRef, z3.ExprRef]]]] = []

    def move(t: str, pre: BState, prefix: str) -> Move:
        i = inputs(prefix)
        st = prof.transitions[t](pre, i, tw)
        dom = [z3.And(i[k] >= 0, i[k] < (H if k in ("h", "v") else U)) for k in ("h", "v", "u", "w")]
        dom.append(z3.And(i["p"] >= NONE, i["p"] < H))
        # one memo for the moves from one pre-state (they are built in a row): its terms are walked once
        if not last or last[0][0] is not pre:
            last[:] = [(pre, {})]
        memo = last[0][1]
        cases = {f"rule {r}": z3.simplify(_ground(g, memo)) for r, g in st.rules.items()}
        enabled = z3.simplify(_ground(z3.And(*st.requires, *dom), memo))
        return Move(_ground_state(st.post, memo), enabled, cases, dict(i), st)

    sys = System(
        prof.name,
        "step",
        BOUND,
        list(prof.transitions),
        start,
        equal,
        move,
        depth,
        never=dict(never if never is not None else _never(prof.name)),
        phase=lambda S: S.v["phase"],
        phases=phases(prof),
        unreachable=prof.unreachable,
    )
    sys.guide = partial(model_guided, sys)
    return sys


def model_guided(
    system: System[BState], goals: list[tuple[str, str]], reached: dict[tuple[str, str], ReachTrace], depth: int = 3
) -> None:
    """Reach goals the search left through the Python model, explicitly.

    Breadth first over the model's states (``blocks/equivalence.BlocksSubject``:
    capacity 2, hashes 0..2, every Use, Deref, Promote of one or two blocks)
    up to ``depth`` operations; for each operation the model accepts, the
    encoding's steps for the operations from the initial state
    (``agreement.steps_of``) are pinned (transitions, hashes, uuids, parents;
    victims left to z3) and z3 is asked whether the last operation's steps
    reach a goal still missing. A goal marked here is on a trace of the
    encoding from its initial state, as the greedy search's are; the model
    only proposes the operations."""
    from kvspec.reference.smt.blocks.agreement import steps_of
    from kvspec.reference.smt.blocks.equivalence import BlocksSubject

    subject = BlocksSubject(system.profile, capacity=CAP, hashes=H)
    frontier: list[tuple[Any, list[ReachStep]]] = [(subject.initial()[0], [])]
    seen = {subject.key(frontier[0][0])}
    for _ in range(depth):
        nxt: list[tuple[Any, list[ReachStep]]] = []
        for node, path in frontier:
            for op in subject.alphabet(node):
                if not (todo := [g for g in goals if g not in reached]):
                    return
                m = copy.deepcopy(node.model)
                try:
                    res = m.apply(op)
                except InvalidOperation:
                    continue
                steps = path + [ReachStep(t, {k: NONE if x is None else x for k, x in given.items()})
                                for t, given in steps_of(system.profile, op, res.result.value)]  # fmt: skip
                _ask(system, steps, len(path), todo, reached)
                for _key, succ in subject.model_outcomes(node, op)[:1]:
                    k = subject.key(succ)
                    if k not in seen:
                        seen.add(k)
                        nxt.append((succ, steps))
        frontier = nxt


def _ask(
    system: System[BState],
    steps: list[ReachStep],
    start: int,
    todo: list[tuple[str, str]],
    reached: dict[tuple[str, str], ReachTrace],
) -> None:
    if any(st.transition not in system.transitions for st in steps):
        return
    s = z3.Solver()
    s.set("timeout", 30_000)
    u = _Unrolling(system, s)
    u.pin(ReachTrace(steps))
    cands = [(j, t, g) for j in range(start + 1, len(steps) + 1) for t, g in todo if steps[j - 1].transition == t]
    while cands := [(j, t, g) for j, t, g in cands if (t, g) not in reached]:
        found = solving.check(s, z3.Or([u.goal(j, t, g) for j, t, g in cands]), timeout_ms=30_000)
        if found.model is None:
            return
        m = found.model
        trace = u.trace(m, len(steps))
        for j, t, g in cands:
            if (t, g) not in reached and z3.is_true(m.eval(u.goal(j, t, g), model_completion=True)):
                reached[(t, g)] = ReachTrace(trace.steps[:j], trace.params)
