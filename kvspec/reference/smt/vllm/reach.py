"""The vllm encodings (step: ``copies.py``; operation: ``ops.py``) as transition tables for ``smt/reach.py``.

Both encodings are proven per step from any state satisfying their
invariants, over an uninterpreted sort of physical blocks, so a guard
written too strongly (or a contract that removes a case) makes the proofs
say nothing about that case without failing them. Here each step, each rule
guard it names (``rules``) and each pair of steps enabled together must
happen on a trace from the empty pool.

The universe searched is finite: ``BLOCKS`` distinct physical blocks and
block hashes ``0..HASHES-1`` (``NONE`` for the caller's parent). A state of
the unrolling is a finite table: each array is stores of fresh values at
the universe's indices over a constant, and two states are equal when they
agree there. Nothing reads an array elsewhere: a step's block is one of the
universe's (its inputs are constrained to them), a hash it writes is an
input in range or the block's own, so the tables are the whole state. A
quantifier over blocks in a guard (a Reset needs nothing held) is expanded
over the universe's blocks, which are all the blocks there are.

Operation level: the steps of a Use run in phases (``ops.IDLE`` between
operations, ``ops.HITS`` while pinning the prefix, ``ops.PLACE`` while
placing fresh blocks), so pairs of steps of different phases are never
enabled together (``System.phases``, itself checked). A few pairs are
impossible by design and listed with their reason (``NEVER_*``). The
greedy search gives up before the operation level's deepest cases, so its
traces are recorded offline from the scenarios of ``OP_GUIDE``
(``smt/recorded.py``, ``scripts/gen_reach_traces.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import z3

from kvspec.reference.smt.reach import Move, ReachStart, ReachStep, ReachTrace, System, renamer
from kvspec.reference.smt.unbounded.models import _expand
from kvspec.reference.smt.vllm import copies, ops
from kvspec.reference.smt.vllm.copies import V_FREE, Block, VBlockSort, VState
from kvspec.reference.smt.vllm.ops import NONE, VllmOpState
from kvspec.spec.registry import VLLM_NAME

#: physical blocks and block hashes of the universe searched
BLOCKS, HASHES = 2, 2
STEP_DEPTH, OP_DEPTH = 5, 9

_IDLE_ONLY = "a Reset needs no held block and no owner"
#: (step, goal) -> why it never happens (step level)
NEVER_STEP: dict[tuple[str, str], str] = {
    **{(t, "with reset enabled"): _IDLE_ONLY for t in ("deref(full)", "deref(partial)", "promote")},
    **{("reset", f"with {t} enabled"): _IDLE_ONLY for t in ("deref(full)", "deref(partial)", "promote")},
}
_DONE = "use(close) needs every fresh block placed, use(new)/use(partial) one still to place"
#: (step, goal) -> why it never happens (operation level)
_HOLDS = ("deref(full)", "deref(partial)", "deref(promoted)", "promote")
NEVER_OP: dict[tuple[str, str], str] = {
    **{(t, "with reset enabled"): _IDLE_ONLY for t in _HOLDS},
    **{("reset", f"with {t} enabled"): _IDLE_ONLY for t in _HOLDS},
    **{(t, "with use(close) enabled"): _DONE for t in ("use(new)", "use(partial)")},
    **{("use(close)", f"with {t} enabled"): _DONE for t in ("use(new)", "use(partial)")},
}
OP_PHASES: dict[str, frozenset[int]] = {
    **{t: frozenset({ops.IDLE}) for t in ("use(begin)", "promote", "deref(full)", "deref(partial)")},
    **{t: frozenset({ops.IDLE}) for t in ("deref(promoted)", "reset")},
    **{t: frozenset({ops.HITS}) for t in ("use(hit)", "use(check)")},
    **{t: frozenset({ops.PLACE}) for t in ("use(new)", "use(partial)", "use(close)")},
}


def blocks() -> list[z3.ExprRef]:
    return [z3.Const(f"vreach_blk{i}", Block) for i in range(BLOCKS)]


def _hashes() -> range:
    return range(NONE, HASHES)


def _btable(p: str, sort: z3.SortRef, default: z3.ExprRef) -> z3.ArrayRef:
    arr = z3.K(Block, default)
    for i, b in enumerate(blocks()):
        arr = z3.Store(arr, b, z3.Const(f"{p}_{i}", sort))
    return arr


def _htable(p: str) -> z3.ArrayRef:
    arr = z3.K(z3.IntSort(), z3.IntVal(0))
    for h in _hashes():
        arr = z3.Store(arr, h, z3.Int(f"{p}_{h}"))
    return arr


def _arrays_equal(a: z3.ArrayRef, b: z3.ArrayRef) -> list[z3.BoolRef]:
    idx: list[Any] = blocks() if a.domain() == Block else [z3.IntVal(h) for h in _hashes()]
    return [a[i] == b[i] for i in idx]


def _equal(a: Any, b: Any) -> z3.BoolRef:
    """Equal on the universe: every table at its indices, every scalar."""
    out: list[z3.BoolRef] = []
    for f in a.__dataclass_fields__:
        x, y = getattr(a, f), getattr(b, f)
        if isinstance(x, dict):
            out += [x[k] == y[k] for k in x]
        elif z3.is_array(x):
            out += _arrays_equal(x, y)
        else:
            out.append(x == y)
    return z3.And(out)


def _in_universe(b: z3.ExprRef) -> z3.BoolRef:
    return z3.Or([b == x for x in blocks()])


def _block_index(b: z3.ExprRef) -> z3.ArithRef:
    """A block input as a number (its index in the universe), so a trace can print and pin it."""
    out: z3.ArithRef = z3.IntVal(BLOCKS - 1)
    for i, x in reversed(list(enumerate(blocks()[:-1]))):
        out = z3.If(b == x, i, out)
    return out


def _flat(e: z3.BoolRef) -> z3.BoolRef:
    """``e`` with each quantifier over blocks (or hashes) expanded over the universe."""
    return _expand(e, blocks(), [z3.IntVal(h) for h in _hashes()], {})


def _distinct() -> list[z3.BoolRef]:
    return [z3.Distinct(*blocks())] if BLOCKS > 1 else []


# -- step level (copies.py) -------------------------------------------------------------------


def _step_fresh(tag: str) -> VState:
    n = z3.IntVal(BLOCKS)
    return VState(
        _btable(f"{tag}st", VBlockSort, V_FREE),
        _btable(f"{tag}hsh", z3.IntSort(), z3.IntVal(0)),
        _btable(f"{tag}own", z3.IntSort(), z3.IntVal(0)),
        _htable(f"{tag}ccnt"),
        _htable(f"{tag}view"),
        {k: z3.Int(f"{tag}cnt_{k}") for k in copies.STATES},
        n,
    )


def step_system(tw: frozenset[str] = frozenset(), depth: int = STEP_DEPTH) -> System[VState]:
    """``copies.TRANSITIONS`` (with the mutants ``tw`` in force) from the empty pool of ``BLOCKS`` blocks."""
    table: dict[str, Callable[[VState, frozenset[str]], copies.VStep]] = dict(copies.TRANSITIONS)

    def start() -> ReachStart[VState]:
        z = z3.IntVal(0)
        init = VState(
            z3.K(Block, V_FREE),
            z3.K(Block, z),
            z3.K(Block, z),
            z3.K(z3.IntSort(), z),
            z3.K(z3.IntSort(), z),
            {"free": z3.IntVal(BLOCKS), "held": z, "cached": z},
            z3.IntVal(BLOCKS),
        )
        return ReachStart(init, _distinct(), _step_fresh)

    def move(name: str, pre: VState, prefix: str) -> Move:
        step = table[name](pre, tw)
        terms = [*step.requires, *step.rules.values()]
        sub = renamer([*terms, *_leaves(step.post)], "in_", prefix)
        h, b = z3.Int(f"{prefix}h"), z3.Const(f"{prefix}b", Block)
        dom = [_in_universe(b), h >= NONE, h < HASHES]
        enabled = z3.And([*dom, *(_flat(sub(r)) for r in step.requires)])
        cases = {f"rule {r}": _flat(sub(c)) for r, c in step.rules.items()}
        return Move(sub(step.post), enabled, cases, {"b": _block_index(b), "h": h}, step)

    return System(
        VLLM_NAME,
        "step",
        f"{BLOCKS} blocks, hashes 0..{HASHES - 1}",
        list(table),
        start,
        _equal,
        move,
        depth,
        never=NEVER_STEP,
    )


# -- operation level (ops.py) -----------------------------------------------------------------


def _op_fresh(tag: str) -> VllmOpState:
    f = z3.BoolVal(False)
    return VllmOpState(
        _btable(f"{tag}st", VBlockSort, V_FREE),
        _btable(f"{tag}hsh", z3.IntSort(), z3.IntVal(0)),
        _btable(f"{tag}own", z3.IntSort(), z3.IntVal(0)),
        _btable(f"{tag}nb", z3.BoolSort(), f),
        _btable(f"{tag}uo", z3.BoolSort(), f),
        _htable(f"{tag}ccnt"),
        _htable(f"{tag}ncnt"),
        _htable(f"{tag}view"),
        _htable(f"{tag}prem"),
        _htable(f"{tag}psto"),
        {k: z3.Int(f"{tag}cnt_{k}") for k in ops.CENSUS},
        z3.Int(f"{tag}phase"),
        z3.Int(f"{tag}prev"),
        z3.Const(f"{tag}pblk", Block),
        z3.Int(f"{tag}spar"),
        z3.Const(f"{tag}sblk", Block),
        z3.Bool(f"{tag}sopen"),
        z3.Int(f"{tag}budget"),
        z3.Int(f"{tag}pins"),
    )


def op_system(
    tw: frozenset[str] = frozenset(), depth: int = OP_DEPTH, transitions: dict[str, ops.Transition] | None = None
) -> System[VllmOpState]:
    """``ops.TRANSITIONS`` (or ``transitions``; the mutants ``tw`` in force) from the empty pool."""
    table = dict(ops.TRANSITIONS if transitions is None else transitions)

    def start() -> ReachStart[VllmOpState]:
        z, f = z3.IntVal(0), z3.BoolVal(False)
        zh = z3.K(z3.IntSort(), z)
        b0 = blocks()[0]
        init = VllmOpState(
            z3.K(Block, V_FREE),
            z3.K(Block, z),
            z3.K(Block, z),
            z3.K(Block, f),
            z3.K(Block, f),
            zh,
            zh,
            zh,
            zh,
            zh,
            {"free": z3.IntVal(BLOCKS), "held": z, "cached": z, "idle": z},
            z3.IntVal(ops.IDLE),
            z3.IntVal(NONE),
            b0,
            z3.IntVal(NONE),
            b0,
            f,
            z,
            z,
        )
        return ReachStart(init, _distinct(), _op_fresh)

    def move(name: str, pre: VllmOpState, prefix: str) -> Move:
        inp = ops.inputs(prefix)
        step = table[name](pre, inp, tw)
        h, p, F = inp["h"], inp["p"], inp["F"]
        dom = [_in_universe(inp["b"]), _in_universe(inp["pb"]), h >= NONE, h < HASHES, p >= NONE, p < HASHES]
        dom += [F >= 0, F <= BLOCKS]
        enabled = z3.And([*dom, *(_flat(r) for r in step.requires)])
        cases = {f"rule {r}": _flat(c) for r, c in step.rules.items()}
        names = {"h": h, "p": p, "F": F, "b": _block_index(inp["b"]), "pb": _block_index(inp["pb"])}
        return Move(step.post, enabled, cases, names, step)

    return System(
        VLLM_NAME,
        "operation",
        f"{BLOCKS} blocks, hashes 0..{HASHES - 1}",
        list(table),
        start,
        _equal,
        move,
        depth,
        never=NEVER_OP,
        phase=lambda s: s.phase,
        phases=OP_PHASES,
    )


def _leaves(x: Any) -> list[z3.ExprRef]:
    from kvspec.reference.smt.reach import leaves

    return leaves(x)


def _s(t: str, **inputs: int) -> ReachStep:
    return ReachStep(t, dict(inputs))


def _use(F: int, *placed: ReachStep, p: int = NONE, pb: int = 0, nxt: int = NONE) -> list[ReachStep]:
    """A whole Use: begin, the capacity check (``nxt``: the first block after the hits), the blocks, close."""
    return [_s("use(begin)", F=F, p=p, pb=pb), _s("use(check)", h=nxt), *placed, _s("use(close)")]


def _new(b: int, h: int) -> ReachStep:
    return _s("use(new)", b=b, h=h)


def _part(b: int) -> ReachStep:
    return _s("use(partial)", b=b)


#: scenarios from the empty pool for the operation level, written for the encoding (blocks 0 and 1,
#: hashes 0 and 1): the guide of the recording (``recorded.attribute``), since the greedy search gives
#: up before the deepest cases (an eviction needs a full pool, an unowned copy and a second Use: 9 steps)
OP_GUIDE: list[ReachTrace] = [
    # two copies of hash 0 (STORE-COPY), one released, then a Use of its prefix (PARENT-ANCHOR, a hit)
    ReachTrace(
        [
            *_use(2, _new(0, 0), _new(1, 0)),
            _s("deref(full)", b=0),
            _s("use(begin)", F=0, p=0, pb=1),
            _s("use(hit)", h=0, b=0),
            _s("use(hit)", h=0, b=1),
            _s("use(check)", h=NONE),
            _s("use(close)"),
        ]
    ),
    # a full pool with an unowned copy: the next fresh block evicts it (VLLM-LAZY-REMOVE), full then partial
    ReachTrace([*_use(2, _new(0, 0), _new(1, 0)), _s("deref(full)", b=0), *_use(1, _new(0, 1), nxt=1)]),
    ReachTrace([*_use(2, _new(0, 0), _new(1, 1)), _s("deref(full)", b=0), *_use(1, _part(0))]),
    # a held block promoted to a second copy of a cached hash, released by its uuid, then a reset
    ReachTrace(
        [
            *_use(2, _new(1, 0), _part(0)),
            _s("promote", b=0, h=0, p=NONE),
            _s("deref(promoted)", b=0),
            _s("deref(full)", b=1),
            _s("reset"),
        ]
    ),
    # a held block beside an owned copy: each idle step taken while the others are enabled
    ReachTrace([*_use(2, _new(1, 0), _part(0)), _s("deref(full)", b=1)]),
    ReachTrace([*_use(2, _new(1, 0), _part(0)), _s("deref(partial)", b=0)]),
    ReachTrace([*_use(2, _new(1, 0), _part(0)), *_use(0)]),
    # a promoted block beside a held one, the same
    ReachTrace([*_use(2, _part(0), _part(1)), _s("promote", b=0, h=1, p=NONE), _s("deref(promoted)", b=0)]),
    ReachTrace([*_use(2, _part(0), _part(1)), _s("promote", b=0, h=1, p=NONE), _s("promote", b=1, h=0, p=NONE)]),
    ReachTrace([*_use(2, _part(0), _part(1)), _s("promote", b=0, h=1, p=NONE), *_use(0)]),
    ReachTrace([*_use(2, _part(0), _part(1)), _s("promote", b=0, h=1, p=NONE), _s("deref(partial)", b=1)]),
    ReachTrace(
        [
            *_use(2, _new(1, 1), _part(0)),
            _s("promote", b=0, h=0, p=1, pb=1),
            _s("deref(full)", b=1),
            _s("deref(promoted)", b=0),
        ]
    ),
    # hits on an unowned copy beside an owned one, a reset after everything is released
    ReachTrace([*_use(1, _new(0, 0)), _s("deref(full)", b=0), _s("reset"), *_use(1, _new(1, 1))]),
]
