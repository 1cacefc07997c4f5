"""The radix page-level steps as a transition table for ``smt/reach.py``.

Every step of ``encoding.STEPS`` (with the mutants in force, when any) and
each of its named sub-cases (``RadixTransition.cases``: a leaf under the root, beside
other children, under a locked page, a split of a locked node, ...), from
the empty cache of 4 page slots and 2 lock handles, any capacity and tokens.
The steps name their inputs globally (``in_q``, ``in_e``, ...), so each
step of the unrolling gets its own copies.
"""

from __future__ import annotations

import z3

from kvspec.reference.smt.radix.encoding import STEPS, RadixBound, RState
from kvspec.reference.smt.reach import Move, ReachStart, System, equal_leaves, leaves, renamer
from kvspec.spec.registry import RADIX

REACH_BOUND = RadixBound(pages=4, handles=2)


def _inputs(step_terms: list[z3.ExprRef], prefix: str) -> dict[str, z3.ExprRef]:
    found: dict[str, z3.ExprRef] = {}
    seen: set[int] = set()
    todo = list(step_terms)
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED and str(e).startswith(prefix):
            found[str(e).removeprefix(prefix)] = e
        elif z3.is_app(e):
            todo.extend(e.children())
    return dict(sorted(found.items()))


def system(tw: frozenset[str] = frozenset(), bound: RadixBound = REACH_BOUND, depth: int = 7) -> System[RState]:
    def start() -> ReachStart[RState]:
        cap = z3.Int("reach_cap")
        return ReachStart(RState.initial(bound, cap), [cap >= 1], lambda tag: RState.fresh(bound, tag))

    def move(name: str, pre: RState, prefix: str) -> Move:
        step = STEPS[name](pre, tw)
        terms = [*leaves(step.post), *step.requires, *step.cases.values()]
        sub = renamer(terms, "in_", prefix)
        post, req, cases = sub(step.post), sub(step.requires), sub(step.cases)
        enabled = z3.And(req or [z3.BoolVal(True)])
        return Move(
            post, enabled, {f"case {n}": c for n, c in cases.items()}, _inputs([*leaves(post), enabled], prefix), step
        )

    return System(RADIX, "step", str(bound), list(STEPS), start, equal_leaves, move, depth)
