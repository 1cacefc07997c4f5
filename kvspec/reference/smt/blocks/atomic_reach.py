"""atomic's REACHABLE goals (step level), from a scenario run on the Python model.

The greedy search of ``reach.cover`` over atomic's step table gives up: a
Use is at least begin, a declare, the check, a place and close (5 steps),
the deep cases need three or four operations before them (an eviction needs
the cache full and a block released; a pinned hit that splits the Stored
group needs a new block before it), and ``use(close)``'s "every block
placed" is a quantifier z3 answers slowly at every depth (the search did not
finish in 900 s of CPU). So the recording (``scripts/gen_reach_traces.py
atomic-step``, ``reach_recordings``) searches only 3 steps greedily, then
runs ``SCENARIO``, operations written for the atomic profile's cases, on the
Python model (``reference/g1.py``, atomic profile, capacity 2, eviction
unordered): each operation must be accepted, and its encoding steps
(``agreement.steps_of``: a Use the model refused for room is begin, the
declares and a failing check) make one trace that ``recorded.attribute``
pins (transitions and inputs; the victims and the capacity left to z3) and
asks z3, at each step, for every goal of that step not reached yet. A goal
marked is on a run of the encoding from its initial state; the model only
proposes the operations.

Two goals cannot happen in any state (``NEVER``, with the reason): the
recording asks z3 for each over an unconstrained state of the instance
(``never_reached``), and lists it as stale if z3 finds one. Every other goal
not reached by the scenario is recorded as not reached, and the row fails on it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.reach import Coverage, ReachStep, ReachTrace, System, cover
from kvspec.spec.registry import ATOMIC_NAME
from kvspec.spec.wire import BlockRef, Deref, FullBlock, Operation, PartialBlock, Plh, Promote, Use

CAPACITY = 2

#: the greedy search before the scenario (it reaches the first Use's declares and check)
SHALLOW = 3

#: (transition, goal) -> why atomic's step encoding can never reach it
NEVER: dict[tuple[str, str], str] = {
    ("use(place full)", "with use(close) enabled"): (
        "use(place full) needs a full block of the batch still to place; use(close) needs none left"
    ),
    ("use(close)", "with use(place full) enabled"): (
        "use(close) needs every block of the batch placed; use(place full) needs one still to place"
    ),
}


def _plh(h: int) -> Plh:
    return Plh(hash=h, parent=None, position=h)


def _use(refs: list[BlockRef], parent: int | None = None) -> Use:
    fulls = [r.full for r in refs if isinstance(r, FullBlock)]
    return Use(
        blocks=refs,
        plhs=[_plh(h) for h in fulls],
        local_hashes=[h + 100 for h in fulls],
        parent=None if parent is None else FullBlock(full=parent),
    )


def _f(h: int) -> FullBlock:
    return FullBlock(full=h)


def _p(u: int) -> PartialBlock:
    return PartialBlock(partial=f"u{u}")


def _promote(u: int, h: int) -> Promote:
    return Promote(uuid=f"u{u}", seq_hash=h, parent_hash=None, local_hash=h + 100, plh=_plh(h))


#: each operation with the goals it is written for (at capacity 2)
SCENARIO: list[tuple[Operation, str]] = [
    (_use([_f(0), _p(0)]), "new full and partial blocks; a place full while a partial is still to place"),
    (_use([_p(0), _f(1)], parent=0), "the caller's parent; a held partial declared; no room: all or nothing"),
    (Deref(blocks=[_f(0)]), "to inactive, with a partial held"),
    (_promote(0, 1), "PROMOTE-NEW, with a partial held"),
    (Deref(blocks=[_f(1)]), "two inactive blocks"),
    (_use([_f(2), _f(0)]), "evicts 1 for 2 (its Removed); 0 a pinned hit that splits the Stored group"),
    (_use([_f(2)]), "a hit on an active block, declared and placed"),
    (Deref(blocks=[_f(2)]), "DEREF-OWNER: two owners to one"),
    (Deref(blocks=[_f(2)]), "to inactive again"),
    (_use([_p(1)]), "a new partial evicts 2"),
    (_promote(1, 0), "PROMOTE-EXISTING while a full block is held"),
    (_use([_p(0), _f(0)]), "a place partial while a full block is still to place"),
    (_use([_f(0), _p(0)]), "the held partial placed last: use(close) enabled with it"),
    (Deref(blocks=[_p(0)]), "DEREF-PARTIAL while a full block is held"),
]


def guide() -> list[ReachTrace]:
    """``SCENARIO`` run on the atomic model, as one trace of encoding steps (victims left free)."""
    from kvspec.reference import make_model
    from kvspec.reference.smt.blocks.agreement import steps_of
    from kvspec.reference.smt.blocks.encoding import NONE
    from kvspec.spec.config import ManagerConfig

    m = make_model(ManagerConfig(profile=ATOMIC_NAME, capacity=CAPACITY, eviction="unordered"))
    steps: list[ReachStep] = []
    for op, _why in SCENARIO:
        res = m.apply(op)  # an InvalidOperation here: the scenario is stale
        for t, given in steps_of(ATOMIC_NAME, op, res.result.value):
            steps.append(ReachStep(t, {k: NONE if x is None else x for k, x in given.items()}))
    return [ReachTrace(steps)]


def never_reached(system: System[Any]) -> list[tuple[str, str]]:
    """The goals of ``NEVER`` z3 does not refute over any state of the instance (stale entries)."""
    st = system.start().fresh("never_")
    stale = []
    for t, g in NEVER:
        u = g.removeprefix("with ").removesuffix(" enabled")
        s = z3.Solver()
        s.add(system.move(t, st, "never_t_").enabled, system.move(u, st, "never_u_").enabled)
        if not solving.check(s).unsat:
            stale.append((t, g))
    return stale


def search(system: System[Any]) -> Coverage:
    """The greedy search to ``SHALLOW`` steps, then the scenario's trace pinned (``recorded.attribute``)."""
    from kvspec.reference.smt import recorded

    shallow = cover(dataclasses.replace(system, depth=SHALLOW, guide=None))
    cov = recorded.attribute(system, guide(), shallow.reached)
    cov.stale = [*shallow.stale, *cov.stale, *never_reached(system)]
    return cov
