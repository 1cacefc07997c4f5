"""The paged and session encodings as transition tables for ``smt/reach.py``.

Both are proven per transition from any state satisfying the invariant, so
a transition quietly never enabled (a guard written too strongly) would
"prove" anything. Here each transition, and each case named below, must
happen on a trace from the initial state (every holder free, every block
free; every slot free at generation 0).

Paged: every transition acts on holder 0 (``fork`` gives holder 1 a share),
which is live on the device, live on the host, or not live; that is the
phase of a state, and transitions of different phases are never enabled
together. Session: slots are chosen by each transition, so every pair can
be enabled together.
"""

from __future__ import annotations

from collections.abc import Mapping

import z3

from kvspec.reference.smt.managers import paged, session
from kvspec.reference.smt.managers.paged import PagedBound, PState, Transition
from kvspec.reference.smt.reach import Move, ReachStart, System, equal_leaves
from kvspec.spec.registry import PAGED, SESSION

#: holder 0's phase: not live, live on the device, live on the host
NOT_LIVE, ON_DEVICE, ON_HOST = 0, 1, 2
PAGED_PHASES: dict[str, frozenset[int]] = {
    "allocate": frozenset({NOT_LIVE}),
    "extend": frozenset({ON_DEVICE}),
    "fork/prefix share": frozenset({ON_DEVICE}),
    "write (copy-on-write)": frozenset({ON_DEVICE}),
    "swap_out": frozenset({ON_DEVICE}),
    "swap_in": frozenset({ON_HOST}),
    "free/prefix evict": frozenset({ON_DEVICE, ON_HOST}),
}


def paged_initial(b: PagedBound) -> PState:
    """Every holder not live, every block free with no reference."""
    f, z = z3.BoolVal(False), z3.IntVal(0)
    return PState(
        live=[f] * b.holders,
        on_device=[z3.BoolVal(True)] * b.holders,
        length=[z] * b.holders,
        table=[[z] * b.length for _ in range(b.holders)],
        refs_d=[z] * b.device,
        refs_h=[z] * b.host,
        free_d=[z3.BoolVal(True)] * b.device,
        free_h=[z3.BoolVal(True)] * b.host,
    )


def _paged_cases(name: str, pre: PState, post: PState, prefix: str) -> dict[str, z3.BoolRef]:
    """Both sides of each split the transition makes."""
    n, m = z3.Int(f"{prefix}n"), z3.Int(f"{prefix}m")
    some_shared = z3.Or([r > 1 for r in pre.refs_d])
    last_goes = z3.Or(
        [z3.And(a, z3.Not(b)) for a, b in zip(post.free_d + post.free_h, pre.free_d + pre.free_h, strict=True)]
    )
    return {
        "allocate": {"case takes blocks": n >= 1},
        "extend": {"case appends blocks": m >= 1},
        "fork/prefix share": {"case shares blocks": n >= 1},
        "write (copy-on-write)": {
            "case the block is shared (copied)": z3.Or(
                [z3.And(pre.table[0][0] == x, r > 1) for x, r in enumerate(pre.refs_d)]
            ),
            "case the block is not shared (written in place)": z3.Or(
                [z3.And(pre.table[0][0] == x, r == 1) for x, r in enumerate(pre.refs_d)]
            ),
        },
        "swap_out": {"case moves blocks": pre.length[0] >= 1},
        "swap_in": {"case moves blocks": pre.length[0] >= 1},
        "free/prefix evict": {
            "case a block becomes free": last_goes,
            "case a shared block stays held": z3.And(pre.length[0] >= 1, some_shared),
        },
    }[name]


def paged_system(
    b: PagedBound | None = None, transitions: Mapping[str, Transition] | None = None, depth: int = 6
) -> System[PState]:
    b = b or PagedBound()
    table = dict(paged.TRANSITIONS if transitions is None else transitions)

    def start() -> ReachStart[PState]:
        return ReachStart(paged_initial(b), [], lambda tag: paged.fresh(b, tag))

    def move(name: str, pre: PState, prefix: str) -> Move:
        post, enabled = table[name](pre, b, prefix)
        return Move(post, enabled, _paged_cases(name, pre, post, prefix), _inputs(prefix, post))

    def phase(s: PState) -> z3.ArithRef:
        return z3.If(z3.Not(s.live[0]), NOT_LIVE, z3.If(s.on_device[0], ON_DEVICE, ON_HOST))

    return System(
        PAGED, "operation", str(b), list(table), start, equal_leaves, move, depth, phase=phase, phases=PAGED_PHASES
    )


def _inputs(prefix: str, post: object) -> dict[str, z3.ExprRef]:
    """The transition's own constants (named with ``prefix``), to print a trace."""
    from kvspec.reference.smt.reach import leaves

    found: dict[str, z3.ExprRef] = {}
    todo = leaves(post)
    seen: set[int] = set()
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


def _session_cases(name: str, pre: session.SState, prefix: str, n: int) -> dict[str, z3.BoolRef]:
    k = z3.Int(f"{prefix}k")
    st = session._at(pre.st, k)
    return {
        "cold lease": {
            "case a free slot": st == session.FREE,
            "case an idle slot (its parked session goes)": st == session.IDLE,
        },
        "warm admit": {},
        "park (finalize, keep)": {},
        "release (finalize, reset)": {
            "case a leased slot": st == session.LEASED,
            "case an idle slot": st == session.IDLE,
        },
        "evict_all": {"case some slot leased": z3.Or([x == session.LEASED for x in pre.st])},
    }[name]


def session_system(
    n: int = 3, transitions: Mapping[str, session.Transition] | None = None, depth: int = 6
) -> System[session.SState]:
    table = dict(session.TRANSITIONS if transitions is None else transitions)

    def start() -> ReachStart[session.SState]:
        return ReachStart(session.initial(n), [], lambda tag: session.fresh(n, tag))

    def move(name: str, pre: session.SState, prefix: str) -> Move:
        post, enabled = table[name](pre, n, prefix)
        return Move(post, enabled, _session_cases(name, pre, prefix, n), _inputs(prefix, post))

    return System(SESSION, "operation", f"{n} slots", list(table), start, equal_leaves, move, depth)
