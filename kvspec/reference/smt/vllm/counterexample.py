"""vllm: a refuted operation-level row's counterexample, as wire operations from an empty pool.

``find`` unrolls the operation-level encoding (``vllm/ops.py``, the
transition table of ``vllm/reach.op_system``: 2 physical blocks, hashes
0..1) from the empty pool, with the mutant in force, and asks for the
shortest trace whose last step breaks one of the operation-level rows (an
invariant of the post-state, an obligation of the step, or owner safety
between the two). ``operations`` reads the trace back as the operations a
caller sent: a Use is its begin (the caller's parent), its hits and its
fresh blocks (full blocks first, then the partial ones, each partial block
a uuid of its own), closed where the trace closes it, or where the trace
ends; a Deref names the released block's hash (a cached copy) or its uuid
(a held or promoted block); a Promote names the held block's uuid; a Reset
is a Reset. A Use the trace cuts before all its fresh blocks are placed (a
row broken at its capacity check) gets the rest as the Use's ``F`` says: the
first full block after the hits that the check names, then partial blocks
(fresh uuids), so that the model is asked for the whole Use.

The guide (``guided``) is the scenarios of ``reach.OP_GUIDE`` plus
``cx_guide()``, written for violations a whole scenario cannot show: the
guide's scenarios are whole operations, and a row broken at a Use's capacity
check leaves the Use unable to close (``check-before-pins``: a hit pins the
last unowned copy, the check still counts it, and a fresh block has no room).

What such a file replays. The mutant is a bug of the *encoding*, not of the
Python model: no variant of ``adapters/mutants`` has it (``TWINS`` is where
one would be named), so the file records the reference, and the operations
are a valid run of the rules as written there (``kvspec replay`` passes).
What failed is the encoding with the mutant in force on those operations:
``divergence`` feeds them, one by one, to the model and to the encoding
(``vllm/agreement.compare``, the check that binds the two) and names the
first operation at which the mutated encoding cannot make the model's move
(or publishes another Removed, Stored or parent); the unmutated encoding
must make every move. The file is cut after that operation and records it,
with the mutant's rule, as its failure. A contract mutant (the caller may
break ASSUME-PARENT-REGISTERED) names the operation at which the caller
breaks the contract instead: the model is not bound there.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import z3

from kvspec.reference.smt.reach import Move, ReachTrace, violation
from kvspec.reference.smt.vllm import ops as vops
from kvspec.spec import registry
from kvspec.spec.config import ManagerConfig
from kvspec.spec.wire import Deref, FullBlock, Operation, PartialBlock, Plh, Promote, Reset, Use

#: per solver call of the search (each depth is one call)
TIMEOUT_MS = 30_000
#: the greedy search's depth: the shallow violations (one Use) are found there; the deep ones
#: (an eviction: a full pool, a release and a second Use) along the scenarios (``guided``)
GREEDY_DEPTH = 6
#: (encoding mutant) -> the variant of adapters/mutants with the same bug in the model (none yet)
TWINS: dict[str, str] = {}


def cx_guide() -> list[ReachTrace]:
    """The counterexample search's own scenarios (see the module doc), after those of
    ``reach.OP_GUIDE``: they end inside a Use (transitions fixed, inputs free, as there)."""
    from kvspec.reference.smt.vllm.reach import _new, _s, _use

    return [
        # a copy cached and released (unowned), then a Use that pins it by a hit and is checked
        ReachTrace([*_use(1, _new(0, 0)), _s("deref(full)", b=0), _s("use(begin)"), _s("use(hit)"), _s("use(check)")]),
    ]


def broken(_t: str, mv: Move) -> z3.BoolRef:
    """The step breaks some operation-level row (quantifiers over the universe expanded)."""
    from kvspec.reference.smt.vllm.reach import _flat

    props = list(vops.invariants(mv.step.pre))
    return _flat(z3.Not(z3.And([vops.goal(p, mv.step) for p in props])))


def find(
    tw: frozenset[str], depth: int | None = None, timeout_ms: int = TIMEOUT_MS, why: list[str] | None = None
) -> tuple[ReachTrace | None, z3.CheckSatResult]:
    """The shortest trace from the empty pool (``op_system``, up to ``depth`` steps) whose last step breaks a row."""
    from kvspec.reference.smt.vllm.reach import op_system

    return violation(op_system(tw), broken, depth=depth, timeout_ms=timeout_ms, why=why)


def guided(tw: frozenset[str], timeout_ms: int = TIMEOUT_MS) -> ReachTrace | None:
    """The shortest trace found along the scenarios of ``reach.OP_GUIDE`` whose last step breaks a row.

    The greedy search gives up before the deepest cases (an eviction needs a
    full pool, an unowned copy and a second Use: 9 steps). The scenarios are
    those of ``OP_GUIDE`` and ``cx_guide()``. Each scenario
    fixes only the sequence of transitions; its inputs (hashes, blocks, the
    caller's parent, the fresh count) are left to z3, so a scenario that
    evicts an unowned copy also stands for one that evicts an owned copy,
    when the mutant allows it. A trace found so is a trace of the encoding
    from its initial state all the same."""
    from kvspec.reference.smt import solving
    from kvspec.reference.smt.reach import _Unrolling
    from kvspec.reference.smt.vllm.reach import OP_GUIDE, op_system

    sysm = op_system(tw, depth=1)
    best: ReachTrace | None = None
    for scenario in sorted([*OP_GUIDE, *cx_guide()], key=len):
        if best is not None and len(best) <= len(scenario):
            continue  # a shorter trace is found already
        s = z3.Solver()
        s.set("timeout", timeout_ms)
        u = _Unrolling(sysm, s)
        while len(u.choice) < len(scenario):
            u.extend()
        for j, st in enumerate(scenario.steps, 1):
            s.add(u.takes(j, st.transition))
        bad = {j: broken(st.transition, u.moves[j - 1][st.transition]) for j, st in enumerate(scenario.steps, 1)}
        a = solving.check(s, z3.Or(list(bad.values())), timeout_ms=timeout_ms)
        if a.model is None:
            continue
        last = next(j for j in bad if z3.is_true(a.model.eval(bad[j], model_completion=True)))
        best = u.trace(a.model, last)
    return best


@dataclass
class _VllmUseSoFar:
    parent: int
    #: fresh blocks still to place (``use(begin)``'s F, less each new or partial block)
    fresh: int = 0
    #: the first full block after the hits, as the capacity check names it (NONE: none)
    nxt: int = vops.NONE
    fulls: list[int] = field(default_factory=list)
    partials: list[str] = field(default_factory=list)

    def finish(self, uuid_of: Callable[[], str]) -> None:
        """A Use cut before its fresh blocks are placed: the check's next block, then partial blocks."""
        if self.fresh >= 1 and self.nxt != vops.NONE:
            self.fulls.append(self.nxt)
            self.fresh -= 1
        while self.fresh >= 1:
            self.partials.append(uuid_of())
            self.fresh -= 1

    def op(self) -> Use:
        refs: list[FullBlock | PartialBlock] = [FullBlock(full=h) for h in self.fulls]
        refs += [PartialBlock(partial=u) for u in self.partials]
        plhs = [Plh(hash=h, parent=None, position=i) for i, h in enumerate(self.fulls)]
        parent = FullBlock(full=self.parent) if self.parent != vops.NONE else None
        return Use(blocks=refs, plhs=plhs, local_hashes=[h + 100 for h in self.fulls], parent=parent)


def operations(trace: ReachTrace) -> list[Operation]:
    """The wire operations a trace of the operation-level steps stands for (see the module doc)."""
    out: list[Operation] = []
    use: _VllmUseSoFar | None = None
    hsh: dict[int, int] = {}  # physical block -> the hash it caches
    uuid: dict[int, str] = {}  # physical block -> the uuid of the partial block placed there
    made = 0
    extra = itertools.count(len([s for s in trace.steps if s.transition == "use(partial)"]))
    for st in trace.steps:
        t, i = st.transition, st.inputs
        b = int(i.get("b", 0))
        if t == "use(begin)":
            use = _VllmUseSoFar(int(i["p"]), fresh=int(i.get("F", 0)))
        elif t == "use(hit)" and use is not None:
            use.fulls.append(int(i["h"]))
        elif t == "use(check)" and use is not None:
            use.nxt = int(i.get("h", vops.NONE))
        elif t == "use(new)" and use is not None:
            use.fulls.append(int(i["h"]))
            use.fresh -= 1
            hsh[b] = int(i["h"])
            uuid.pop(b, None)
        elif t == "use(partial)" and use is not None:
            uuid[b] = f"u{made}"
            made += 1
            use.partials.append(uuid[b])
            use.fresh -= 1
        elif t == "use(close)" and use is not None:
            out.append(use.op())
            use = None
        elif t == "promote":
            h, p = int(i["h"]), int(i["p"])
            hsh[b] = h
            out.append(
                Promote(
                    uuid=uuid[b],
                    seq_hash=h,
                    parent_hash=None if p == vops.NONE else p,
                    local_hash=h + 100,
                    plh=Plh(hash=h, parent=None, position=0),
                )
            )
        elif t == "deref(full)":
            out.append(Deref(blocks=[FullBlock(full=hsh[b])]))
        elif t in ("deref(partial)", "deref(promoted)"):
            out.append(Deref(blocks=[PartialBlock(partial=uuid[b])]))
        elif t == "reset":
            out.append(Reset())
    if use is not None:
        use.finish(lambda: f"u{next(extra)}")
        out.append(use.op())
    return out


def config() -> ManagerConfig:
    """The pool of the searched universe: ``BLOCKS`` physical blocks."""
    from kvspec.reference.smt.vllm.reach import BLOCKS

    return ManagerConfig(profile=registry.VLLM_NAME, capacity=BLOCKS, block_size=4, eviction="lru")


def divergence(ops: list[Operation], tw: frozenset[str]) -> tuple[int, str] | None:
    """The first operation (its index, and what differs) at which the encoding with ``tw`` in
    force does not make the model's move (``agreement.compare``), or at which the caller breaks
    ASSUME-PARENT-REGISTERED (the model is not bound there); None when every move agrees."""
    from kvspec.reference.smt.vllm.agreement import Mirror, VllmMismatch, compare
    from kvspec.reference.vllm_pool import VllmPoolModel

    m = Mirror(VllmPoolModel(config()))
    for n, op in enumerate(ops):
        try:
            verdict = compare(m, op, tw)
        except VllmMismatch as e:
            return n, str(e)
        if verdict == "skipped":
            return n, f"{op.op}: the model refuses it or the caller breaks ASSUME-PARENT-REGISTERED"
    return None


def emit(folder: Path, mutant: str, rule: str, what: str, depth: int | None = None, guide: bool = True) -> list[str]:
    """Search (greedy to ``depth`` steps, then, with ``guide``, along the scenarios), write the
    replay file (or the statement that none was found within the bound) into ``folder``, and
    return the lines to print."""
    from kvspec.reference.smt import counterexamples as cx
    from kvspec.reference.smt.vllm.reach import BLOCKS, HASHES, OP_GUIDE

    name = f"vllm-{mutant}"
    tw = frozenset({mutant})
    bound = f"{BLOCKS} blocks, hashes 0..{HASHES - 1}"
    depth = depth or GREEDY_DEPTH
    why: list[str] = []
    trace, _verdict = find(tw, depth, why=why)
    if trace is None and guide:
        trace = guided(tw)
    if trace is None:
        kind = f"unknown ({why[0]})" if why else "induction only"
        greedy = f"the search gave up at some depth <= {depth}" if why else f"no trace of <= {depth} steps breaks a row"
        if guide:
            n = len(OP_GUIDE) + len(cx_guide())
            greedy += f"; along the {n} scenarios of vllm/reach.py and cx_guide (transitions fixed, inputs free) none"
        statement = (
            f"{name}: {kind}: from the empty pool ({bound}) {greedy}; the induction counterexample's pre-state"
            " is not shown reachable within that bound"
        )
        path = cx.not_reachable(folder, name, f"{name}: {what} (breaks {rule})\n{statement}")
        return [statement, f"  (written to {path})"]
    ops = operations(trace)
    head = [
        f"reachable: from the empty pool ({bound}), {len(trace)} operation-level steps ({len(ops)} operations):"
        f" the last breaks a row ({rule})",
        trace.render("  "),
    ]
    unmutated = divergence(ops, frozenset())
    if unmutated is not None:
        # the operations are not a run the rules as written follow step for step: no replay file
        n, diff = unmutated
        text = [
            f"{name}: {what} (breaks {rule})",
            *head,
            f"not a replay file: the unmutated encoding departs from the model at operation {n}: {diff}",
        ]
        path = cx.not_reachable(folder, name, "\n".join(text))
        return [*text[1:], f"  (written to {path})"]
    found = divergence(ops, tw)
    if found is None:
        # the mutant widens a guard: the encoding can make the model's moves and more; the step that
        # breaks the row is one of the "more" (agreement binds one way: the model's move is enabled)
        note = (
            f"  the encoding with {mutant} makes the model's move on every operation as well: the step that"
            " breaks the row is one the model does not take (a widened guard), so the reference and the"
            " mutated encoding do not differ on these operations"
        )
    else:
        n, diff = found
        ops = ops[: n + 1]
        note = f"  the encoding with {mutant} departs from the model at operation {n}: {diff}"
    twin = TWINS.get(mutant)
    w = cx.write(folder, name, config(), ops, rule=rule, what=what, twin=twin)
    return [*head, note, *w.lines()]
