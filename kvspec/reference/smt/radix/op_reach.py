"""The radix operations as a transition table for ``smt/reach.py``, from the empty cache.

``radix/ops.py`` proves each whole operation (``operations.OPERATIONS``: a
match, an insert, a lock, an unlock, a batched eviction, a reset) from any
state satisfying the invariants, and ``SANITY-RADIX-OPS`` shows each named
case of each operation satisfiable in *some* such state. A contract or a
guard narrowed so that a case happens only in unreachable states passes
both. Here each operation is a transition (its guard the model's, its cases
``OpTransition.cases``: a match that misses or hits part of its key, an
insert after a split, an eviction of a node and then its parent, of a full
cache, a lock on a locked path, a reset with a lock held, ...), every pair
of operations enabled together is a goal too, and the unrolling starts from
the empty cache of the proofs' own bound (``ops.DEFAULT_OP_BOUND``: 5
pages, 2 locks, keys of 3 pages, evictions of 2 nodes of 3 pages), any
capacity. No goal is impossible by design (``NEVER`` is empty: the greedy
search reaches every one, and a goal listed there would be asked of z3 when
recording and must stay unreached).

The operations name their inputs globally (``m_tok0``, ``i_q1``,
``x_v0_2``, the steps' ``in_*``), so each step of the unrolling renames them
with its own prefix; the move's ``step`` is the operation so renamed, whose
rows (``ops.obligations``) the counterexample search of an operation
mutant asks about (``cli/radix.write_counterexample``).

The search runs offline (``scripts/gen_reach_traces.py radix-operation``:
``search``) and ``kvspec prove`` re-checks its traces pinned
(``smt/recorded.py``, the ``op REACHABLE`` row).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

import z3

from kvspec.reference.smt.radix.encoding import RState
from kvspec.reference.smt.radix.operations import OPERATIONS, OpBound, OpTransition, Sub
from kvspec.reference.smt.radix.ops import DEFAULT_OP_BOUND
from kvspec.reference.smt.reach import Coverage, Move, ReachStart, System, cover, equal_leaves, leaves
from kvspec.spec.registry import RADIX

REACH_BOUND = DEFAULT_OP_BOUND
#: the greedy search reaches every goal by 4 operations; two more to spare
REACH_DEPTH = 6
#: (operation, goal) -> why it never happens: none
NEVER: dict[tuple[str, str], str] = {}
#: the prefixes the operations (and the steps they run) name their inputs with
_PREFIXES = ("in_", "m_", "i_", "l_", "u_", "x_")


def _free_inputs(name: str, bound: OpBound, tw: frozenset[str]) -> list[z3.ExprRef]:
    """The inputs ``name`` creates (constants named with one of ``_PREFIXES``): the same whatever
    the state it runs from, so they are found once, on a fresh state, and kept (``_INPUTS``)."""
    make = OPERATIONS[name]
    key = (make, bound, tw)
    if key not in _INPUTS:
        op = make(RState.fresh(bound.radix, "probe_"), bound, tw)
        found: dict[str, z3.ExprRef] = {}
        seen: set[int] = set()
        todo = leaves(op)
        while todo:
            e = todo.pop()
            if e.get_id() in seen:
                continue
            seen.add(e.get_id())
            if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED and str(e).startswith(_PREFIXES):
                found[str(e)] = e
            elif z3.is_app(e):
                todo.extend(e.children())
        _INPUTS[key] = [found[k] for k in sorted(found)]
    return _INPUTS[key]


#: (the operation's builder, bound, mutants) -> its inputs
_INPUTS: dict[tuple[Callable[..., OpTransition], OpBound, frozenset[str]], list[z3.ExprRef]] = {}


def _renamed(op: OpTransition, inputs: list[z3.ExprRef], prefix: str) -> tuple[OpTransition, dict[str, z3.ExprRef]]:
    """``op`` with each of its ``inputs`` renamed to start with ``prefix``, and the renamed inputs by their
    old names (what a trace pins)."""
    new = {str(c): z3.Const(prefix + str(c), c.sort()) for c in inputs}
    pairs = [(c, new[str(c)]) for c in inputs]

    def sub(x: Any) -> Any:
        if isinstance(x, z3.ExprRef):
            return z3.substitute(x, *pairs) if pairs else x
        if isinstance(x, RState):
            return replace(x, **{f.name: sub(getattr(x, f.name)) for f in fields(x)})
        if isinstance(x, Sub):
            return Sub(x.step, sub(x.when), sub(x.guard))
        if isinstance(x, (tuple, list)):
            return type(x)(sub(y) for y in x)
        if isinstance(x, dict):
            return {k: sub(v) for k, v in x.items()}
        return x

    out = OpTransition(
        op.name, op.pre, sub(op.post), sub(op.requires), sub(op.subs), op.rules, sub(op.events), sub(op.cases)
    )
    return out, new


def system(tw: frozenset[str] = frozenset(), bound: OpBound = REACH_BOUND, depth: int = REACH_DEPTH) -> System[RState]:
    """``operations.OPERATIONS`` (the mutants ``tw`` in force) from the empty cache of ``bound``."""
    rb = bound.radix

    def start() -> ReachStart[RState]:
        cap = z3.Int("opreach_cap")
        return ReachStart(RState.initial(rb, cap), [cap >= 1], lambda tag: RState.fresh(rb, tag), {"cap": cap})

    def move(name: str, pre: RState, prefix: str) -> Move:
        op, inputs = _renamed(OPERATIONS[name](pre, bound, tw), _free_inputs(name, bound, tw), prefix)
        enabled = z3.And(op.requires or [z3.BoolVal(True)])
        cases = {f"case {n}": c for n, c in op.cases.items()}
        return Move(op.post, enabled, cases, inputs, op)

    return System(RADIX, "operation", str(bound), list(OPERATIONS), start, equal_leaves, move, depth, never=NEVER)


def search() -> Coverage:
    """The offline search whose traces are recorded: greedy BMC from the empty cache
    (``reach.cover``, which also asks z3 for each goal of ``NEVER``, none here)."""
    return cover(system())
