"""The kvbm-with-offload step encoding as a transition table for ``smt/reach.py``.

Every transition of ``catalogue.TRANSITIONS`` (through an ``Applier``, so a
mutant or a narrowed contract is what is searched), its rule guards and the
named sub-cases of ``narrowing.CASES``, from the empty cache of a small
universe (3 slots, 4 block hashes, any G2 capacity and hash forest). The
goals are those of ``reach.System``; 9 steps reach all of them.
"""

from __future__ import annotations

from collections.abc import Callable

import z3

from kvspec.reference.smt.offload.catalogue import TRANSITIONS
from kvspec.reference.smt.offload.invariants import Property
from kvspec.reference.smt.offload.narrowing import cases_of
from kvspec.reference.smt.offload.state import Rigid, State
from kvspec.reference.smt.offload.transitions import Policy
from kvspec.reference.smt.prover import Applier, default_applier
from kvspec.reference.smt.reach import Move, ReachStart, System
from kvspec.reference.smt.universe import Bound
from kvspec.spec.registry import KVBM_OFFLOAD

#: the universe searched: small, so the unrolling stays cheap; every goal is reached in it
REACH_BOUND = Bound(3, 4)
REACH_DEPTH = 9


def system(
    applier: Applier = default_applier,
    bound: Bound = REACH_BOUND,
    depth: int = REACH_DEPTH,
    policy: Policy = "unordered",
) -> System[State]:
    specs = {t.name: t for t in TRANSITIONS}

    def start() -> ReachStart[State]:
        rigid = Rigid.fresh(bound, "reach_")
        return ReachStart(State.initial(bound, rigid), rigid.domain(), lambda tag: State.fresh(bound, rigid, tag))

    def move(name: str, pre: State, prefix: str) -> Move:
        step, consts, doms = applier(specs[name], pre, prefix, policy, symmetry=False)
        return Move(step.post, z3.And(*doms, step.enabled()), cases_of(step, name), dict(consts), step)

    return System(KVBM_OFFLOAD, "step", f"{bound}, any G2 capacity", list(specs), start, State.equals, move, depth)


def broken(prop: Property) -> Callable[[str, Move], z3.BoolRef | None]:
    """``bad`` for ``reach.violation``: the move breaks ``prop`` (its step conjuncts)."""

    def bad(_name: str, mv: Move) -> z3.BoolRef | None:
        conj = prop.step_conjuncts(mv.step)
        return z3.Not(z3.And([c for _l, c in conj])) if conj else None

    return bad
