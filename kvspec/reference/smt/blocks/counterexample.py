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
from functools import partial
from pathlib import Path

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.blocks.agreement import _plh, _use, pool_policy
from kvspec.reference.smt.blocks.encoding import NONE, ProfileEncoding
from kvspec.reference.smt.reach import Move, ReachTrace, violation
from kvspec.spec.config import ManagerConfig
from kvspec.spec.profiles import block_semantics
from kvspec.spec.registry import ATOMIC_NAME, KVBM_NAME, LEGACY_NAME
from kvspec.spec.wire import Deref, Destroy, FullBlock, Operation, PartialBlock, Promote

#: (profile, encoding mutant) -> the variant of adapters/mutants that is the same bug in the Python model
TWINS: dict[tuple[str, str], str] = {
    (KVBM_NAME, "deref-partial-keeps-slot"): "partial_leaked_on_deref",
    (ATOMIC_NAME, "deref-partial-keeps-slot"): "partial_leaked_on_deref",
    (LEGACY_NAME, "destroy-silent"): "legacy_destroy_silent",
}

#: per solver call of the search (each depth is one call)
TIMEOUT_MS = 30_000
#: the model-guided search's CPU time, when the greedy one gave up
GUIDED_BUDGET_S = 60.0


@dataclass
class _Use:
    parent: int
    placed: list[FullBlock | PartialBlock] = field(default_factory=list)
    declared: list[FullBlock | PartialBlock] = field(default_factory=list)


def _ref(t: str, inputs: dict[str, int | bool | str]) -> FullBlock | PartialBlock:
    return FullBlock(full=int(inputs["h"])) if "full" in t else PartialBlock(partial=f"u{inputs['u']}")


def _close(profile: str, u: _Use) -> Operation | None:
    # a Use that declares its batch names every block before placing any (a refused check places none);
    # the caller's parent is in the encoding only where it anchors a Stored group
    traits = block_semantics(profile)
    refs = u.declared if traits.declares_batch else u.placed
    if not refs:
        return None
    parent = FullBlock(full=u.parent) if traits.stored_parents and u.parent != NONE else None
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
            parent = p if block_semantics(profile).stored_parents and p != NONE else None
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

    return violation(system(prof, tw), partial(_unused, prof), depth=depth or DEPTH, timeout_ms=timeout_ms)


def _unused(prof: ProfileEncoding, _t: str, mv: Move) -> z3.BoolRef:
    return _broken(prof, mv)


def guided(
    prof: ProfileEncoding, tw: frozenset[str], depth: int = 2, budget_s: float = GUIDED_BUDGET_S
) -> tuple[list[Operation], ReachTrace] | str | None:
    """The operations and steps of a trace the model proposes that breaks an invariant, None when none of
    up to ``depth`` operations does, "budget" when the search ran out of time first.

    When the greedy search gives up, the operations are proposed by the
    Python model (``blocks/equivalence.BlocksSubject``, capacity 2, breadth
    first, as ``blocks/reach.model_guided`` does for the REACHABLE goals);
    each operation's steps (``agreement.steps_of``) are pinned in the
    encoding with the mutant in force, victims left to z3, which is asked
    whether one of the last operation's steps breaks an invariant. A trace
    found this way is a trace of the encoding from its initial state; the
    model only proposes it."""
    import copy
    import time

    from kvspec.reference.smt.blocks.agreement import steps_of
    from kvspec.reference.smt.blocks.equivalence import BlocksSubject
    from kvspec.reference.smt.blocks.reach import CAP, H, system
    from kvspec.reference.smt.reach import ReachStep, _Unrolling
    from kvspec.spec.errors import InvalidOperation

    t0 = time.process_time()  # CPU, z3's included: the machine's load does not shrink the search
    sysm = system(prof, tw, depth=1)
    subject = BlocksSubject(prof.name, capacity=CAP, hashes=H)
    frontier: list[tuple[object, list[Operation], list[ReachStep]]] = [(subject.initial()[0], [], [])]
    seen = {subject.key(frontier[0][0])}  # type: ignore[arg-type]
    for _ in range(depth):
        nxt: list[tuple[object, list[Operation], list[ReachStep]]] = []
        for node, ops, path in frontier:
            for op in subject.alphabet(node):  # type: ignore[arg-type]
                if time.process_time() - t0 > budget_s:
                    return "budget"
                m = copy.deepcopy(node.model)  # type: ignore[attr-defined]
                try:
                    res = m.apply(op)
                except InvalidOperation:
                    continue
                value = res.result.value if res.result is not None else None
                steps = path + [ReachStep(t, {k: NONE if x is None else x for k, x in given.items()})
                                for t, given in steps_of(prof.name, op, value)]  # fmt: skip
                s = z3.Solver()
                s.set("timeout", TIMEOUT_MS)
                u = _Unrolling(sysm, s)
                u.pin(ReachTrace(steps))
                news = range(len(path) + 1, len(steps) + 1)
                bad = {j: _broken(prof, u.moves[j - 1][steps[j - 1].transition]) for j in news}
                found_sat = solving.check(s, z3.Or(list(bad.values())), timeout_ms=TIMEOUT_MS)
                if found_sat.model is not None:
                    model = found_sat.model
                    last = next(j for j in news if z3.is_true(model.eval(bad[j], model_completion=True)))
                    trace = u.trace(model, last)
                    return [*ops, op], ReachTrace(trace.steps, {"capacity": CAP})
                for _key, succ in subject.model_outcomes(node, op)[:1]:  # type: ignore[arg-type]
                    k = subject.key(succ)
                    if k not in seen:
                        seen.add(k)
                        nxt.append((succ, [*ops, op], steps))
        frontier = nxt
    return None


def _broken(prof: ProfileEncoding, mv: Move) -> z3.BoolRef:
    return z3.Not(z3.And([f for inv in prof.invariants.values() for _l, f in inv(mv.post)]))


def emit(
    folder: Path,
    prof: ProfileEncoding,
    mutant: str | None,
    rule: str,
    what: str,
    depth: int | None = None,
    guide: bool = True,
) -> list[str]:
    """Search (greedy to ``depth`` steps, then, with ``guide``, the
    model-guided stage), write the replay file (or the statement that none
    was found within the bound) into ``folder``, and return the lines to print."""
    from kvspec.reference.smt import counterexamples as cx
    from kvspec.reference.smt.blocks.reach import BOUND, DEPTH

    name = f"{prof.name}-{mutant or 'rules'}"
    tw = frozenset({mutant}) if mutant else frozenset()
    depth = depth or DEPTH
    trace, verdict = find(prof, tw, depth)
    ops: list[Operation] | None = None
    found = guided(prof, tw) if trace is None and guide else None
    if isinstance(found, tuple):
        ops, trace = found
    if trace is None:
        greedy = (
            f"the search gave up (unknown: timeout after {TIMEOUT_MS / 1000:.0f} s at some depth <= {depth})"
            if verdict == z3.unknown
            else f"no trace of up to {depth} steps breaks an invariant"
        )
        if guide:
            greedy += (
                "; of the model-proposed operations (up to 2), none breaks one"
                if found is None
                else f"; the model-guided search ran out of its {GUIDED_BUDGET_S:.0f} s of CPU"
            )
        kind = "unknown" if verdict == z3.unknown or found == "budget" else "induction only"
        statement = (
            f"{name}: {kind}: from the initial state ({BOUND}) {greedy}; the induction counterexample's pre-state"
            " is not shown reachable within that bound"
        )
        path = cx.not_reachable(folder, name, statement)
        return [statement, f"  (written to {path})"]
    cap = int(trace.params.get("capacity", 2))
    config = ManagerConfig(profile=prof.name, capacity=cap, eviction=pool_policy(prof.name))  # type: ignore[arg-type]
    ops = ops if ops is not None else operations(prof.name, trace)
    twin = TWINS.get((prof.name, mutant)) if mutant else None
    w = cx.write(folder, name, config, ops, rule=rule, what=what, twin=twin)
    head = (
        f"reachable: from an empty cache of capacity {cap}, {len(trace)} steps ({len(ops)} operations):"
        f" the last breaks an invariant ({rule})"
    )
    return [head, trace.render("  "), *w.lines()]
