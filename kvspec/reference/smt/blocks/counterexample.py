"""kvbm, legacy, atomic: a refuted invariant's counterexample as wire operations from an empty cache.

``find`` searches the finite instance of ``blocks/reach.py`` (hashes 0..2,
uuids 0..1, capacity 1..2) for a trace of the encoding's steps, with the
mutant in force, whose last step breaks an invariant (``reach.violation``).
``operations`` reads the trace back as operations: a Use is its begin, one
step per block (atomic: its declares give the blocks) and its close; a Deref
or Destroy step is one operation of one block; a promote is a Promote. A
trace that ends inside a Use is closed there (the operation is what the
caller sent; the violation is on a step of it). kvbm and legacy ignore the
Use's parent in the encoding, so their Uses name none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import z3

from kvspec.reference.smt.blocks.agreement import _plh, _use
from kvspec.reference.smt.blocks.encoding import NONE, ProfileEncoding
from kvspec.reference.smt.reach import Move, ReachTrace, violation
from kvspec.spec.config import ManagerConfig
from kvspec.spec.wire import Deref, Destroy, FullBlock, Operation, PartialBlock, Promote

#: (profile, encoding mutant) -> the variant of adapters/mutants that is the same bug in the Python model
TWINS: dict[tuple[str, str], str] = {
    ("kvbm", "deref-partial-keeps-slot"): "partial_leaked_on_deref",
    ("atomic", "deref-partial-keeps-slot"): "partial_leaked_on_deref",
    ("legacy", "destroy-silent"): "legacy_destroy_silent",
}

#: per solver call of the search (each depth is one call)
TIMEOUT_MS = 30_000


@dataclass
class _Use:
    parent: int
    placed: list[FullBlock | PartialBlock] = field(default_factory=list)
    declared: list[FullBlock | PartialBlock] = field(default_factory=list)


def _ref(t: str, inputs: dict[str, int | bool | str]) -> FullBlock | PartialBlock:
    return FullBlock(full=int(inputs["h"])) if "full" in t else PartialBlock(partial=f"u{inputs['u']}")


def _close(profile: str, u: _Use) -> Operation | None:
    refs = u.declared if profile == "atomic" else u.placed
    if not refs:
        return None
    parent = FullBlock(full=u.parent) if profile == "atomic" and u.parent != NONE else None
    return _use(list(refs), parent)


def operations(profile: str, trace: ReachTrace) -> list[Operation]:
    """The wire operations a trace of ``profile``'s steps stands for (see the module doc)."""
    ops: list[Operation] = []
    use: _Use | None = None
    for st in trace.steps:
        t, i = st.transition, st.inputs
        if t == "use(begin)":
            use = _Use(int(i["p"]))
        elif use is not None and t.startswith("use(declare"):
            use.declared.append(_ref(t, i))
        elif use is not None and t in ("use(full)", "use(partial)", "use(place full)", "use(place partial)"):
            use.placed.append(_ref(t, i))
        elif t == "use(close)" and use is not None:
            if (op := _close(profile, use)) is not None:
                ops.append(op)
            use = None
        elif t.startswith(("deref(", "destroy(")):
            kind = Deref if t.startswith("deref(") else Destroy
            ops.append(kind(blocks=[_ref(t, i)]))
        elif t == "promote":
            h, p = int(i["h"]), int(i["p"])
            parent = p if profile == "atomic" and p != NONE else None
            ops.append(Promote(uuid=f"u{i['u']}", seq_hash=h, parent_hash=parent, local_hash=h + 100, plh=_plh(h)))
    if use is not None and (op := _close(profile, use)) is not None:
        ops.append(op)
    return ops


def find(
    prof: ProfileEncoding, tw: frozenset[str], depth: int | None = None, timeout_ms: int = TIMEOUT_MS
) -> tuple[ReachTrace | None, z3.CheckSatResult]:
    """The shortest trace from an empty cache (the finite instance), of up to
    ``depth`` steps (``reach.DEPTH``), whose last step breaks an invariant."""
    from kvspec.reference.smt.blocks.reach import DEPTH, system

    def bad(_t: str, mv: Move) -> z3.BoolRef:
        return z3.Not(z3.And([f for inv in prof.invariants.values() for _l, f in inv(mv.post)]))

    return violation(system(prof, tw), bad, depth=depth or DEPTH, timeout_ms=timeout_ms)


def emit(
    folder: Path, prof: ProfileEncoding, mutant: str | None, rule: str, what: str, depth: int | None = None
) -> list[str]:
    """Search, write the replay file (or the statement that none exists within
    the bound) into ``folder``, and return the lines to print."""
    from kvspec.reference.smt import counterexamples as cx
    from kvspec.reference.smt.blocks.reach import BOUND, DEPTH

    name = f"{prof.name}-{mutant or 'rules'}"
    tw = frozenset({mutant}) if mutant else frozenset()
    depth = depth or DEPTH
    trace, verdict = find(prof, tw, depth)
    if trace is None:
        if verdict == z3.unknown:
            statement = (
                f"{name}: unknown: the search for a trace from the initial state ({BOUND}) gave up"
                f" (timeout after {TIMEOUT_MS / 1000:.0f} s per depth); the counterexample is induction only"
            )
        else:
            statement = (
                f"{name}: induction only: no trace of up to {depth} steps from the initial state ({BOUND})"
                " breaks an invariant; the induction counterexample's pre-state is unreachable within that bound"
            )
        path = cx.not_reachable(folder, name, statement)
        return [statement, f"  (written to {path})"]
    policy = "lru" if prof.name == "legacy" else "unordered"
    cap = int(trace.params.get("capacity", 2))
    config = ManagerConfig(profile=prof.name, capacity=cap, eviction=policy)  # type: ignore[arg-type]
    ops = operations(prof.name, trace)
    twin = TWINS.get((prof.name, mutant)) if mutant else None
    w = cx.write(folder, name, config, ops, rule=rule, what=what, twin=twin)
    head = (
        f"reachable: from an empty cache of capacity {cap}, {len(trace)} steps ({len(ops)} operations):"
        f" the last breaks an invariant ({rule})"
    )
    return [head, trace.render("  "), *w.lines()]
