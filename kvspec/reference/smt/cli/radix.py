"""``kvspec prove --profile radix``: the rows of the radix profile's proofs.

Without ``--mutant``: every INV-RADIX-* invariant and the lock-path lemma
proven 1-inductive in the bounded universe, the sanity checks (every step
and every sub-case satisfiable, the invariants satisfiable in a rich
state), the agreement of the encoding with ``reference/radix.py`` on sampled
operation sequences, and one row per mutant of the encoding (refuted by a
counterexample, and whether the agreement catches it too). With
``--mutant NAME``: the same proofs against that mutant, its sanity checks,
and its counterexample. Exit 1 on any failure (with ``--mutant``: when the
counterexample is found, as ``kvspec prove --mutant`` does). An operation
mutant (``profile_radix_ops.OP_MUTANTS``) runs at operation level: the rows of
the operation it breaks, the operations' sanity check and its counterexample,
all with the mutant in force, then the trace from the empty cache that breaks
the same row (``op_reachability``); one that is also a step mutant runs both levels.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from kvspec.reference.smt.cli import summary
from kvspec.reference.smt.cli.profiles import cover_row
from kvspec.reference.smt.radix.agreement import Disagreement, catches, check_agreement
from kvspec.reference.smt.radix.encoding import INVARIANTS, RadixBound
from kvspec.reference.smt.radix.operations import OpBound
from kvspec.reference.smt.radix.ops import DEFAULT_OP_BOUND, OP_MUTANTS, op_rows, prove_ops, refute_op, sanity_ops
from kvspec.reference.smt.radix.steps import (
    ALSO_BREAKS,
    DEFAULT_BOUND,
    LEMMA_ID,
    MUTANTS,
    RadixProof,
    breaks,
    prove_radix,
    refute,
    sanity,
)
from kvspec.spec.registry import RADIX

#: the bound of an operation mutant's run (a module attribute, read at call time, so a test can shrink it)
OP_BOUND: OpBound = DEFAULT_OP_BOUND
#: every mutant ``--profile radix --mutant`` accepts: the step mutants, then the operation-only ones
ALL_MUTANTS: tuple[str, ...] = (*MUTANTS, *(n for n in OP_MUTANTS if n not in MUTANTS))

WIDTHS = [36, 12, 42, 9]
#: sampled sequences for the agreement row (12 operations each, page sizes 1 and 2)
AGREEMENT_SEQUENCES = 20


def _row(cols: list[str]) -> str:
    """A table row, its verdict filed in the run's summary (``cli/summary.py``)."""
    return summary.row(cols, WIDTHS)


def run_radix(
    mutant: str | None = None,
    bound: RadixBound = DEFAULT_BOUND,
    unbounded: bool = False,
    timeout_s: float | None = None,
    counterexamples: Path | None = None,
) -> int:
    """The radix rows (see the module doc). With ``counterexamples``, each refuted row's trace
    from the initial state, or why there is none, is written there (``write_counterexample``)."""
    if unbounded:
        if mutant is not None and mutant not in MUTANTS:
            print(
                f"kvspec prove: {mutant} is an operation mutant, encoded in a bounded universe only (drop --unbounded)",
                file=sys.stderr,
            )
            return 2
        from kvspec.reference.smt.cli.radix_unbounded import run_radix_unbounded

        return run_radix_unbounded(mutant, timeout_s)
    if mutant is not None and mutant not in MUTANTS:
        code = run_op_mutant(mutant)
        if counterexamples is not None and code == 1:
            write_counterexample(counterexamples, mutant)
        return code
    tw = frozenset({mutant}) if mutant else frozenset()
    print(f"kvspec prove --profile radix: SGLang-style radix tree at page level, every state of {bound}")
    if mutant:
        m = MUTANTS[mutant]
        print(f"MUTANT {m.name}: {m.description} (breaks {m.rule})")
    print(_row(["invariant", "result", "bound", "time"]))
    print(_row(["-" * w for w in WIDTHS]))
    problems: list[str] = []

    def show(r: RadixProof) -> None:
        where = f" at {', '.join(r.failed_at)}" if r.failed_at else ""
        print(_row([r.property_id, r.verdict, str(bound) if not where else where.strip(), f"{r.seconds:.2f}s"]))

    results = prove_radix(bound, tw=tw, on_result=show)
    bad = [r for r in results if r.verdict != "proven"]
    t1 = time.perf_counter()
    found = sanity(bound, tw)
    ok = "ok" if not found else "FAILED"
    print(_row(["SANITY-RADIX", ok, "steps, cases, rich state", f"{time.perf_counter() - t1:.2f}s"]))
    problems += found
    problems += _reach_row(tw)
    if mutant:
        cx = refute(mutant, bound)
        if cx is not None:
            print()
            print(cx.text)
        else:
            problems.append(f"the mutant {mutant} was not refuted")
        refuted = bool(bad or cx is not None or problems)
        if mutant in OP_MUTANTS:
            print()
            refuted |= run_op_mutant(mutant) == 1
        if counterexamples is not None and refuted:
            write_counterexample(counterexamples, mutant)
        for p in problems:
            print(f"sanity check failed: {p}")
        return 1 if refuted else 0
    t1 = time.perf_counter()
    try:
        run = check_agreement(sequences=AGREEMENT_SEQUENCES)
        print(
            _row(
                [
                    "AGREEMENT-RADIX (reference/radix.py)",
                    "agrees",
                    f"{run.operations} ops, {run.steps} steps",
                    f"{time.perf_counter() - t1:.2f}s",
                ]
            )
        )
    except Disagreement as e:
        print(_row(["AGREEMENT-RADIX (reference/radix.py)", "DISAGREES", "", f"{time.perf_counter() - t1:.2f}s"]))
        problems.append(str(e))
    broken: list[str] = []
    for name, m in MUTANTS.items():
        t1 = time.perf_counter()
        cx = refute(name, bound)
        scope = m.breaks
        if m.agreement:
            caught = catches(name, sequences=AGREEMENT_SEQUENCES)
            scope += f", agreement: op {caught.operations}" if caught else ", AGREEMENT MISSES IT"
            if caught is None:
                problems.append(f"the agreement check does not catch the radix mutant {name}")
        print(
            _row([f"  refutes {name}", "refuted" if cx else "NOT REFUTED", scope, f"{time.perf_counter() - t1:.2f}s"])
        )
        if cx is None:
            problems.append(f"the radix mutant {name} was not refuted")
        else:
            broken.append(f"{m.step} ({m.breaks})")
            if counterexamples is not None:
                write_counterexample(counterexamples, name)
    for row, name in ALSO_BREAKS.items():  # a row no mutant names: the mutant declared to break it too
        if name not in MUTANTS or not breaks(name, row, bound):
            continue
        broken.append(f"{MUTANTS[name].step} ({row})")
    problems += cover_row([*INVARIANTS, LEMMA_ID], broken, "MUTANTS-COVER", _row)

    def op_counterexample(name: str) -> None:
        if counterexamples is not None and name not in MUTANTS:  # a step mutant's file is written above
            write_counterexample(counterexamples, name)

    problems += op_rows(
        _row,
        cover=lambda rows, broken: cover_row(rows, broken, "op MUTANTS-COVER", _row),
        reach=op_reach_row,
        refuted=op_counterexample,
    )
    from kvspec.reference.smt.radix.progress_rows import progress_rows

    problems += progress_rows(_row, bound)
    from kvspec.reference.smt.cli.profiles import order_rows
    from kvspec.reference.smt.order.encoding import RADIX_ORDER

    problems += order_rows((RADIX_ORDER,))
    for r in bad:
        problems.append(f"{r.property_id} {r.verdict} at {', '.join(r.failed_at) or '?'}")
    if counterexamples is not None and any(r.verdict == "refuted" for r in bad):
        write_counterexample(counterexamples, None)
    for p in problems:
        print(f"sanity check failed: {p}")
    return 1 if problems else 0


def _reach_row(tw: frozenset[str]) -> list[str]:
    """REACHABLE: every step, each of its named cases, and every pair of steps
    enabled together happen on a trace from the empty cache (``radix/reach.py``)."""
    from kvspec.reference.smt.radix.reach import system
    from kvspec.reference.smt.reach import cover

    t1 = time.perf_counter()
    cov = cover(system(tw))
    found = cov.problems()
    print(_row(["REACHABLE", "ok" if not found else "FAILED", cov.summary(), f"{time.perf_counter() - t1:.2f}s"]))
    return found


def op_reach_row() -> list[str]:
    """op REACHABLE: every operation, each of its named cases, and every pair of operations
    enabled together on a trace from the empty cache (``radix/op_reach.py``), from the recorded
    traces checked again pinned (``smt/recorded.py``); the problems name the operation and case."""
    from kvspec.reference.smt import reach_recordings

    key = "radix-operation"
    if not reach_recordings.recorded_for(key):
        print(reach_recordings.not_checked(key))
        return [f"radix operation: no recorded traces ({reach_recordings.HOW} {key})"]
    t1 = time.process_time()
    chk = reach_recordings.check(key)
    ok = chk.verdict
    print(_row(["op REACHABLE", ok, chk.summary(), f"{time.process_time() - t1:.2f}s"]))
    return chk.problems


def run_op_mutant(mutant: str, bound: OpBound | None = None) -> int:
    """One operation mutant at operation level: every row of the operation it
    breaks and the operations' sanity check, with the mutant in force, then its
    counterexample. Exit 1 when it is caught (a row not proven, a sanity
    problem, or a counterexample), 0 when not, 2 for a name no operation has."""
    if mutant not in OP_MUTANTS:
        print(
            f"kvspec prove: the radix profile has no mutant {mutant!r}; its mutants: {', '.join(ALL_MUTANTS)}",
            file=sys.stderr,
        )
        return 2
    b = bound if bound is not None else OP_BOUND
    m = OP_MUTANTS[mutant]
    tw = frozenset({mutant})
    print(f"kvspec prove --profile radix: operation {m.op}, every state of {b}")
    print(f"MUTANT {m.name} (operation level): {m.description} (breaks {m.rule})")
    print(_row(["row", "result", "operation", "time"]))
    print(_row(["-" * w for w in WIDTHS]))
    results = prove_ops(
        b, tw, ops=(m.op,), on_result=lambda r: print(_row([r.property_id, r.verdict, r.op, f"{r.seconds:.2f}s"]))
    )
    bad = [r.property_id for r in results if r.verdict != "proven"]
    t0 = time.process_time()
    found = sanity_ops(b, tw)  # with the mutant in force: a narrowed operation shows here
    ok = "ok" if not found else "FAILED"
    print(_row(["SANITY-RADIX-OPS", ok, "operations, cases", f"{time.process_time() - t0:.2f}s"]))
    cx = refute_op(mutant, b)
    print()
    print(cx if cx is not None else f"no counterexample to {m.breaks} at {m.op} in {b}")
    if cx is not None:
        for line in op_reachability(mutant, b):
            print(line)
    for p in found:
        print(f"sanity check failed: {p}")
    return 1 if bad or found or cx is not None else 0


def _op_bad(row: str) -> Any:
    """``bad`` for ``reach.violation`` over the operations: the operation breaks ``row`` (an
    INV-RADIX-* of the state after it, OP-EVENTS of its events, OP-STEPS-ENABLED of its steps)."""
    import z3

    from kvspec.reference.smt.radix.ops import obligations

    def bad(_t: str, mv: Any) -> z3.BoolRef:
        return z3.Not(obligations(mv.step)[row])

    return bad


def op_reachability(mutant: str, bound: OpBound) -> list[str]:
    """Whether an operation mutant's violation happens on a trace from the empty cache of ``bound``
    (``radix/op_reach.py``, the mutant in force): the trace, else "induction only" (or "unknown")."""
    from kvspec.reference.smt.radix import op_reach
    from kvspec.reference.smt.reach import violation

    row = OP_MUTANTS[mutant].breaks
    sysm = op_reach.system(frozenset({mutant}), bound)
    why: list[str] = []
    trace, _ = violation(sysm, _op_bad(row), timeout_ms=30_000, why=why)
    if trace is not None:
        return [
            f"reachable: from the initial state ({bound}), {len(trace)} operations, the last breaks {row}:",
            trace.render("  "),
        ]
    if why:
        return [
            f"unknown ({why[0]}): the search from the empty cache ({bound}) gave up; the pre-state may be unreachable"
        ]
    return [
        f"induction only: no trace of up to {sysm.depth} operations from the empty cache ({bound}) breaks {row};"
        " the pre-state above may be unreachable"
    ]


def write_counterexample(folder: Path, mutant: str | None) -> None:
    """``--counterexamples``: a trace from the empty tree to a step that breaks the row the mutant
    names (the rules as written: any INV-RADIX-*), as a text file ``folder/radix-MUTANT.txt``
    (``counterexamples.NOT_WIRE``: no replay file). A step mutant (or the rules) is searched over
    the step encoding (``radix/reach.py``), an operation-only mutant over the operations
    (``radix/op_reach.py``), each with the mutant in force."""
    import z3

    from kvspec.reference.smt import counterexamples as cx
    from kvspec.reference.smt.radix import op_reach
    from kvspec.reference.smt.radix.reach import REACH_BOUND, system

    name = f"radix-{mutant or 'rules'}"
    if mutant is not None and mutant not in MUTANTS:
        om = OP_MUTANTS[mutant]
        print(f"counterexample of radix {mutant} ({om.rule}):")
        for line in cx.search_statement(
            folder,
            RADIX,
            name,
            op_reach.system(frozenset({mutant})),
            _op_bad(om.breaks),
            rule=om.rule,
            what=om.description,
            bound=f"operations, {op_reach.REACH_BOUND}",
            row=om.breaks,
        ):
            print(line)
        return
    m = MUTANTS[mutant] if mutant else None
    rows = {m.breaks: INVARIANTS[m.breaks]} if m else dict(INVARIANTS)

    def bad(_t: str, mv: Any) -> z3.BoolRef:
        return z3.Not(z3.And([inv(mv.post) for inv in rows.values()]))

    rule = m.rule if m else ", ".join(rows)
    what = m.description if m else "an invariant is broken"
    print(f"counterexample of radix {mutant or 'rules as written'} ({rule}):")
    sysm = system(frozenset({mutant}) if mutant else frozenset())
    for line in cx.search_statement(
        folder, RADIX, name, sysm, bad, rule=rule, what=what, bound=str(REACH_BOUND), row=", ".join(rows)
    ):
        print(line)


__all__ = ["ALL_MUTANTS", "LEMMA_ID", "run_op_mutant", "run_radix", "write_counterexample"]
