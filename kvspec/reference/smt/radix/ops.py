"""The radix profile at operation level: invariant ∧ operation ⇒ invariant.

For every operation of ``radix_operations.OPERATIONS`` (a whole match, insert,
lock, unlock, batched eviction, reset) and every INV-RADIX-* invariant: from
any state of the bounded universe satisfying all seven, the operation (under
the model's guard, not its steps' guards) leads to a state satisfying the
invariant, with the router's counts those of the events the operation
assembles. Three more kinds of row per operation:

- ``steps``: whenever the operation is enabled, every step it is made of is
  enabled (its guard in ``radix_encoding`` holds where it runs): the operation
  is a sequence of the steps ``profile_radix`` proves and ``radix_agreement``
  binds to the model;
- ``events``: the event the operation assembles says what happened (the
  Stored's parent is the page the new leaf hangs under and the router holds
  it, its pages are the new ones in path order; the Removed names exactly
  the pages that went), and the steps' router counts equal the events';
- sanity: the operation is enabled and each named sub-case of it is
  satisfiable under the invariants (``sanity_ops``).

``OP_MUTANTS`` break an operation (or, for ``split-forgets-lock``, the split
step); ``refute_op`` finds the counterexample of each.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.radix.encoding import INVARIANTS, RState, all_invariants
from kvspec.reference.smt.radix.operations import OPERATIONS, OpBound, OpTransition
from kvspec.spec.rules import RuleId as R

DEFAULT_OP_BOUND = OpBound()
#: the row ids of the two kinds of rows besides the invariants
STEPS_ROW = "OP-STEPS-ENABLED"
EVENTS_ROW = "OP-EVENTS"


@dataclass(frozen=True)
class OpMutant:
    """A broken operation: the operation it changes, the rule it breaks and the row that refutes it."""

    name: str
    rule: str
    op: str
    breaks: str
    description: str


OP_MUTANTS: dict[str, OpMutant] = {
    m.name: m
    for m in [
        OpMutant(
            "op-insert-republishes-prefix",
            R.RADIX_INSERT,
            "insert",
            R.INV_RADIX_ROUTER,
            "insert's Stored also names the cached page the new leaf hangs under",
        ),
        OpMutant(
            "op-stored-parent-none",
            R.RADIX_INSERT,
            "insert",
            EVENTS_ROW,
            "insert's Stored names no parent (the root) whatever the leaf hangs under",
        ),
        OpMutant(
            "op-batch-evicts-locked",
            R.RADIX_LOCKED_KEPT,
            "evict",
            R.INV_RADIX_LOCKS,
            "a batched eviction checks the lock of its first victim only",
        ),
        OpMutant(
            "op-removed-names-first-page-only",
            R.RADIX_REMOVE,
            "evict",
            R.INV_RADIX_ROUTER,
            "the Removed names each evicted node's first page only",
        ),
        OpMutant(
            "op-walk-stops-early",
            R.RADIX_MATCH,
            "insert",
            R.INV_RADIX_NO_DUP,
            "the walk may stop before a child that holds the next page: insert stores that page again",
        ),
        OpMutant(
            "op-insert-no-split",
            R.RADIX_MATCH,
            "insert",
            R.INV_RADIX_RUN,
            "insert hangs its leaf under a page inside a node's run without splitting the node",
        ),
        OpMutant(
            "op-evict-inner",
            R.RADIX_EVICT_LRU,
            "evict",
            R.INV_RADIX_ANCHOR,
            "a batched eviction takes a node whose last page still has children",
        ),
        OpMutant(
            "split-forgets-lock",
            R.RADIX_MATCH,
            "lock",
            R.INV_RADIX_LOCKS,
            "a split leaves the new upper node unlocked (its pages' lock counts 0)",
        ),
    ]
}


#: rows no operation mutant names as the one it breaks -> (a mutant, step or operation, and the
#: operation it breaks the row at) (``op_breaks`` checks it)
OP_ALSO_BREAKS: dict[str, tuple[str, str]] = {
    R.INV_RADIX_TREE: ("split-forgets-parent", "lock"),
    R.INV_RADIX_CAPACITY: ("insert-takes-no-slot", "insert"),
    STEPS_ROW: ("op-batch-evicts-locked", "evict"),
}


def op_breaks(mutant: str, op: str, row: str, bound: OpBound = DEFAULT_OP_BOUND) -> bool:
    """The operation ``op`` with ``mutant`` in force (a step mutant acts through
    the steps the operation runs) breaks ``row`` from a state of the invariants."""
    t = build(op, bound, frozenset({mutant}))
    s = z3.Solver()
    s.add(*_hyp(t.pre), *t.requires, z3.Not(obligations(t)[row]))
    return solving.check(s).sat


def cover_rows() -> list[str]:
    """The rows of an operation MUTANTS-COVER counts: each invariant, the steps row, the events row."""
    return [*map(str, INVARIANTS), STEPS_ROW, EVENTS_ROW]


def also_broken(bound: OpBound = DEFAULT_OP_BOUND) -> list[str]:
    """ "op (row)" for each row of ``OP_ALSO_BREAKS`` its mutant does break."""
    return [f"{op} ({r})" for r, (mutant, op) in OP_ALSO_BREAKS.items() if op_breaks(mutant, op, r, bound)]


@dataclass
class RadixOpProof:
    """One row: an invariant (or the steps / events row) at one operation."""

    property_id: str
    op: str
    verdict: str  # "proven" | "refuted" | "unknown"
    seconds: float


def _hyp(S: RState) -> list[z3.BoolRef]:
    return [S.cap >= 0, *all_invariants(S)]


def _check(premises: list[z3.BoolRef], goal: z3.BoolRef, timeout_ms: int | None) -> str:
    s = z3.Solver()
    if timeout_ms:
        s.set("timeout", timeout_ms)
    s.add(*premises, z3.Not(goal))
    return solving.check(s, timeout_ms=timeout_ms).kind


def build(op: str, bound: OpBound, tw: frozenset[str] = frozenset()) -> OpTransition:
    return OPERATIONS[op](RState.fresh(bound.radix, "pre_"), bound, tw)


def obligations(t: OpTransition) -> dict[str, z3.BoolRef]:
    """Every row of one operation: its goal (premises: invariants and its guard)."""
    goals = {str(pid): inv(t.post) for pid, inv in INVARIANTS.items()}
    goals[STEPS_ROW] = z3.And([z3.Implies(s.when, z3.And(s.guard)) for s in t.subs])
    goals[EVENTS_ROW] = z3.And(list(t.events.values()) or [z3.BoolVal(True)])
    return goals


def prove_ops(
    bound: OpBound = DEFAULT_OP_BOUND,
    tw: frozenset[str] = frozenset(),
    ops: tuple[str, ...] = tuple(OPERATIONS),
    timeout_ms: int | None = None,
    on_result: Callable[[RadixOpProof], None] | None = None,
) -> list[RadixOpProof]:
    """Every row of every operation in ``ops``."""
    out = []
    for name in ops:
        t = build(name, bound, tw)
        for pid, goal in obligations(t).items():
            t0 = time.process_time()
            verdict = _check([*_hyp(t.pre), *t.requires], goal, timeout_ms)
            res = RadixOpProof(pid, name, verdict, time.process_time() - t0)
            if on_result:
                on_result(res)
            out.append(res)
    return out


def sanity_ops(
    bound: OpBound = DEFAULT_OP_BOUND, tw: frozenset[str] = frozenset(), ops: tuple[str, ...] = tuple(OPERATIONS)
) -> list[str]:
    """Every operation enabled and every named sub-case of it satisfiable under
    the invariants; the problems found (empty: ok)."""
    problems = []
    for name in ops:
        t = build(name, bound, tw)
        s = z3.Solver()
        s.add(*_hyp(t.pre), *t.requires)
        if not solving.check(s).sat:
            problems.append(f"radix operation {name}: never enabled")
            continue
        for case, cond in t.cases.items():
            s.push()
            s.add(cond)
            if not solving.check(s).sat:
                problems.append(f"radix operation {name}: the case {case!r} is never possible")
            s.pop()
    return problems


def refute_op(name: str, bound: OpBound = DEFAULT_OP_BOUND) -> str | None:
    """The mutant's counterexample as text (None: not refuted)."""
    from kvspec.reference.smt.radix.steps import render

    m = OP_MUTANTS[name]
    t = build(m.op, bound, frozenset({name}))
    s = z3.Solver()
    s.add(*_hyp(t.pre), *t.requires, z3.Not(obligations(t)[m.breaks]))
    model = solving.check(s).model
    if model is None:
        return None
    head = f"MUTANT {name}: {m.description} (breaks {m.rule})\n{m.breaks} fails after the operation {m.op}:"
    return "\n".join([head, render(t.pre, model, "before"), render(t.post, model, "after")])


def op_rows(
    row: Callable[[list[str]], str],
    bound: OpBound = DEFAULT_OP_BOUND,
    cover: Callable[[list[str], list[str]], list[str]] | None = None,
    reach: Callable[[], list[str]] | None = None,
    refuted: Callable[[str], None] | None = None,
) -> list[str]:
    """``kvspec prove --profile radix``'s operation rows: one per operation
    (its invariant, steps and events rows), the sanity check, ``reach()``
    (the op REACHABLE row, ``cli/radix.py``), one per operation mutant, then
    ``cover(rows, "op (row)" broken)`` (MUTANTS-COVER); prints them through
    ``row`` and returns the problems. ``refuted(name)`` is called for each
    operation mutant refuted (``--counterexamples``: its trace)."""
    problems: list[str] = []
    print(f"operations (whole match, insert, lock, unlock, batched evict, reset), every state of {bound}:")
    for name in OPERATIONS:
        t0 = time.process_time()
        rs = prove_ops(bound, ops=(name,))
        bad = [r.property_id for r in rs if r.verdict != "proven"]
        verdict = "proven" if not bad else "FAILED"
        print(
            row(
                [
                    f"  op {name}",
                    verdict,
                    f"{len(rs)} rows" + (f": {', '.join(bad)}" if bad else ""),
                    f"{time.process_time() - t0:.2f}s",
                ]
            )
        )
        problems += [f"radix operation {name}: {b} not proven" for b in bad]
    t0 = time.process_time()
    found = sanity_ops(bound)
    print(
        row(
            [
                "SANITY-RADIX-OPS",
                "ok" if not found else "FAILED",
                "operations, cases",
                f"{time.process_time() - t0:.2f}s",
            ]
        )
    )
    problems += found
    if reach is not None:
        problems += reach()
    broken: list[str] = []
    for name, m in OP_MUTANTS.items():
        t0 = time.process_time()
        cx = refute_op(name, bound)
        print(
            row(
                [
                    f"  refutes {name}",
                    "refuted" if cx else "NOT REFUTED",
                    f"{m.breaks} at {m.op}",
                    f"{time.process_time() - t0:.2f}s",
                ]
            )
        )
        if cx is None:
            problems.append(f"the radix operation mutant {name} was not refuted")
        else:
            broken.append(f"{m.op} ({m.breaks})")
            if refuted is not None:
                refuted(name)
    if cover is not None:
        problems += cover(cover_rows(), broken + also_broken(bound))
    return problems
