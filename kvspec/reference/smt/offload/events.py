"""Group the blocks an operation's steps published into KvEvents.

The steps publish one block at a time (``Frag``); the kvbm profile's events
group them: a Use publishes one Stored of its new blocks (parent: the last
reused block, or the caller's parent) and then one Removed of its victims; a
SwapIn that blocks publishes one Removed; a Tick publishes, per completed
transfer in order, a host-pinned Removed (G2 eviction) and Stored, or the
device Stored groups of a swap-in job (a new group at each block that opens
one). Event ids count on from ``first_id``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import z3

from kvspec.reference.smt.offload.ops import OpOutcome
from kvspec.reference.smt.universe import NONE
from kvspec.spec.wire import KvEvent, make_removed, make_stored

Eval = Callable[[z3.ExprRef], Any]


def concrete_eval(t: z3.ExprRef | bool | int) -> Any:
    """Evaluate a term over a concrete state (raises if it is not constant)."""
    if isinstance(t, bool | int):
        return t
    v = z3.simplify(t)
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    if z3.is_int_value(v):
        return v.as_long()
    raise ValueError(f"not a constant: {v}")


def model_eval(model: z3.ModelRef) -> Eval:
    def ev(t: z3.ExprRef | bool | int) -> Any:
        if isinstance(t, bool | int):
            return t
        v = model.eval(t, model_completion=True)
        if z3.is_true(v):
            return True
        if z3.is_false(v):
            return False
        return v.as_long()

    return ev


def _parent(v: int) -> int | None:
    return None if v == NONE else v


def assemble(out: OpOutcome, ev: Eval, first_id: int, dp_rank: int = 0) -> list[KvEvent]:
    """The KvEvents of one operation, in publication order."""
    published = [
        (
            f,
            ev(f.block),
            ev(f.parent) if f.parent is not None else None,
            bool(ev(f.starts_group)) if not isinstance(f.starts_group, bool) else f.starts_group,
        )
        for w, f in out.frags
        if ev(w)
    ]
    events: list[KvEvent] = []

    def nid() -> int:
        return first_id + len(events)

    if out.kind in ("use", "promote", "swap_in"):
        stored = [h for f, h, _p, _s in published if f.tier == "device" and f.kind == "stored"]
        removed = [h for f, h, _p, _s in published if f.tier == "device" and f.kind == "removed"]
        if stored:
            parent = _parent(ev(out.stored_parent)) if out.stored_parent is not None else None
            events.append(make_stored(nid(), stored, [0] * len(stored), parent, dp_rank=dp_rank))
        if removed:
            events.append(make_removed(nid(), removed, dp_rank=dp_rank))
        return events
    # a Tick: in order, one event per host-pinned block, device Stored groups
    group: list[int] = []
    group_parent: int | None = None

    def flush() -> None:
        nonlocal group
        if group:
            events.append(make_stored(nid(), group, [0] * len(group), group_parent, dp_rank=dp_rank))
            group = []

    for f, h, p, starts in published:
        if f.tier == "device" and f.kind == "stored":
            if starts:
                flush()
                group_parent = _parent(p) if p is not None else None
            group.append(h)
            continue
        flush()
        if f.kind == "stored":
            events.append(
                make_stored(nid(), [h], [0], _parent(p) if p is not None else None, dp_rank=dp_rank, tier="host_pinned")
            )
        else:
            events.append(
                make_removed(nid(), [h], dp_rank=dp_rank, tier="host_pinned" if f.tier != "device" else "device")
            )
    flush()
    return events
