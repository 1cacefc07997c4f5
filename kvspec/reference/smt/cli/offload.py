"""``kvspec prove --profile kvbm-offload``: the INV-* rows of the kvbm profile with an offload tier.

Bounded (``--slots``, ``--hashes``): each invariant and lemma inductive over
the universe, then the non-vacuity rows: the choices exist
(SANITY-ENABLED), every rule guard and named sub-case is satisfiable under
the invariants (SANITY-RULES-FIRE, SANITY-CASES), every such case, and every
pair of transitions enabled together, happens on a trace from the initial
state (REACHABLE, ``smt/reach.py``), and every row fails on at least one
seeded bug (one ``refutes`` row per mutant at a small bound, and
MUTANTS-COVER: no row that no mutant breaks). Then the operation level.
With ``--unbounded``: ``cli/unbounded.py``. With ``--mutant``: the same proofs
and sanity rows with the mutant in force, its counterexample, and whether a
trace from the initial state reaches it (else: induction only). With
``--mutant op:NAME`` (an operation mutant, ``offload/op_mutants.py``): the
operation-level proofs with it in force (``cli/operations.run_op_mutant``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from kvspec.reference.smt.cli import summary
from kvspec.reference.smt.offload.invariants import ALL_PROPERTIES, INVARIANTS, Property, by_id
from kvspec.reference.smt.offload.mutants import MUTANTS, OffloadMutant, mutant
from kvspec.reference.smt.offload.narrowing import check_cases
from kvspec.reference.smt.prover import (
    Applier,
    Result,
    check_enabled,
    check_rules_reachable,
    contract_free,
    default_applier,
    prove,
)
from kvspec.reference.smt.universe import DEFAULT_BOUND, Bound
from kvspec.spec.registry import KVBM_OFFLOAD

#: where the mutant rows refute their property: small, every mutant is refuted there
MUTANT_BOUND = Bound(3, 4)


def _defaults(args: argparse.Namespace) -> None:
    from kvspec.reference.smt.offload.operations_prove import DEFAULT_BATCH, DEFAULT_OP_BOUND

    for dest, value in (
        ("slots", DEFAULT_BOUND.slots),
        ("hashes", DEFAULT_BOUND.hashes),
        ("op_slots", DEFAULT_OP_BOUND.slots),
        ("op_hashes", DEFAULT_OP_BOUND.hashes),
        ("batch", DEFAULT_BATCH),
    ):
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)


def reach_row(applier: Applier, emit: Callable[[list[str]], None]) -> list[str]:
    """REACHABLE: every case of every transition on a trace from the initial state."""
    from kvspec.reference.smt.offload.reach import system
    from kvspec.reference.smt.reach import cover

    t0 = time.perf_counter()
    cov = cover(system(applier))
    found = cov.problems()
    emit(["REACHABLE", "ok" if not found else "FAILED", cov.summary(), f"{time.perf_counter() - t0:.2f}s"])
    return found


def kill_matrix(bound: Bound = MUTANT_BOUND) -> dict[str, list[str]]:
    """Mutant name -> the rows (invariants, lemmas) it breaks at ``bound``."""
    out: dict[str, list[str]] = {}
    for m in MUTANTS:
        rs = prove(bound, applier=m.applier)
        out[m.name] = [str(r.property_id) for r in rs if not r.proven]
    return out


def mutant_rows(emit: Callable[[list[str]], None], counterexamples: Path | None = None) -> list[str]:
    """One ``refutes`` row per mutant (its own property broken), and
    MUTANTS-COVER: every row is broken by at least one mutant. With
    ``counterexamples``: each refuted mutant's file (``write_counterexample``)."""
    problems: list[str] = []
    t0 = time.perf_counter()
    matrix: dict[str, list[str]] = {}
    for m in MUTANTS:
        t1 = time.perf_counter()
        broken = [str(r.property_id) for r in prove(MUTANT_BOUND, applier=m.applier) if not r.proven]
        matrix[m.name] = broken
        ok = str(m.expect) in broken
        emit(
            [
                f"  refutes {m.name}",
                "refuted" if ok else "NOT REFUTED",
                f"{m.expect} at {MUTANT_BOUND}",
                f"{time.perf_counter() - t1:.2f}s",
            ]
        )
        if not ok:
            problems.append(f"the mutant {m.name} does not break {m.expect}")
        elif counterexamples is not None:
            write_counterexample(counterexamples, m, by_id(str(m.expect)))
    hit = {row for rows in matrix.values() for row in rows}
    lone = [str(p.id) for p in ALL_PROPERTIES if str(p.id) not in hit]
    emit(
        [
            "MUTANTS-COVER",
            "ok" if not lone else "FAILED",
            "every row broken by a mutant" if not lone else "no mutant breaks " + ", ".join(lone),
            f"{time.perf_counter() - t0:.2f}s",
        ]
    )
    problems += [f"{row}: no seeded bug (mutant) breaks it, so nothing shows the row can fail" for row in lone]
    return problems


def trace_lines(m: OffloadMutant, prop: Property) -> list[str]:
    """Whether the mutant's violation of ``prop`` is reachable from the initial state (a trace), or induction only."""
    from kvspec.reference.smt.offload.reach import REACH_BOUND, REACH_DEPTH, broken, system
    from kvspec.reference.smt.reach import violation

    trace, verdict = violation(system(m.applier), broken(prop))
    if trace is not None:
        return [
            f"reachable: from the initial state ({REACH_BOUND}), {len(trace)} steps break {prop.id}:",
            trace.render("  "),
        ]
    why = "the solver gave up" if str(verdict) == "unknown" else f"no trace of up to {REACH_DEPTH} steps breaks it"
    return [f"induction only: from the initial state ({REACH_BOUND}) {why}; the pre-state above may be unreachable"]


def write_counterexample(folder: Path, m: OffloadMutant | None, prop: Property) -> None:
    """``--counterexamples``. A step mutant with an operation version (``op_mutants.op_twin``),
    for the row it stands for: that version searched from the empty cache at operation level and
    written as a replay file, ``folder/kvbm-offload-MUTANT.jsonl`` (``offload/counterexample.py``).
    Otherwise (the rules as written, a step-only mutant, another row): the trace of the step
    encoding from the initial state to a step that breaks ``prop`` (``offload/reach.py``), or why
    there is none, as a text file ``folder/kvbm-offload-MUTANT.txt`` that says why it is no
    replay file (``counterexamples.NOT_WIRE``, or the step-only mutant's reason)."""
    from kvspec.reference.smt import counterexamples as cx
    from kvspec.reference.smt.offload.op_mutants import op_twin, step_only_reason
    from kvspec.reference.smt.offload.reach import REACH_BOUND, broken, system

    name = f"kvbm-offload-{(m.name if m else 'rules').replace(':', '-')}"  # a file name: no colon
    own_row = m is not None and str(prop.id) == str(m.expect)
    twin = op_twin(m) if m is not None and own_row else None
    if m is not None and twin is not None:
        from kvspec.reference.smt.offload.counterexample import emit

        print(f"counterexample of kvbm-offload {m.name} ({prop.id}), as its operation version {twin.name}:")
        for line in emit(folder, twin, name=name):
            print(line)
        return
    if not own_row:  # a row other than the one the mutant stands for
        name += f"-{prop.id}"
    rule = m.rule if m else str(prop.id)
    what = m.description if m else f"{prop.id} is broken"
    reason = None
    if m is not None and own_row:
        reason = f"{cx.NOT_WIRE[KVBM_OFFLOAD]}; {m.name} is a step-only mutant: {step_only_reason(m)}"
    print(f"counterexample of kvbm-offload {m.name if m else 'rules as written'} ({prop.id}):")
    sysm = system(m.applier if m else default_applier)
    for line in cx.search_statement(
        folder,
        KVBM_OFFLOAD,
        name,
        sysm,
        broken(prop),
        rule=rule,
        what=what,
        bound=f"{REACH_BOUND}, any G2 capacity",
        row=str(prop.id),
        reason=reason,
    ):
        print(line)


def run_offload(args: argparse.Namespace) -> int:
    if getattr(args, "unbounded", False):
        from kvspec.reference.smt.cli.unbounded import run_unbounded

        return run_unbounded(args)
    if args.mutant and args.mutant.startswith("op:"):
        from kvspec.reference.smt.cli.operations import op_mutant, run_op_mutant

        om = op_mutant(args.mutant)
        assert om is not None  # prove._choose accepts only the catalogue's names
        return run_op_mutant(args, om)
    _defaults(args)
    bound = Bound(args.slots, args.hashes)
    props = [by_id(i) for i in args.invariant] if args.invariant else list(ALL_PROPERTIES)
    if args.no_lemmas and not args.invariant:
        props = list(INVARIANTS)
    applier: Applier = default_applier
    title = f"kvspec prove --profile kvbm-offload: kvbm with an offload tier, every state of {bound} (G2 capacity: any)"
    m: OffloadMutant | None = None
    if args.mutant:
        m = mutant(args.mutant)
        applier = m.applier
        title += f"\nMUTANT {m.name}: {m.description} (breaks {m.rule})"
    print(title)
    t0 = time.perf_counter()
    free: set[str] | None = None
    if args.contracts and not args.mutant:
        free = contract_free(bound)
    widths = [26, 15, 22, 16, 9] if free is not None else [26, 15, 22, 9]
    head = ["invariant", "result", "bound", "needs contracts", "time"]
    if free is None:
        head.remove("needs contracts")
    print(summary.header(head, widths))
    print(summary.header(["-" * w for w in widths], widths))

    def emit(cols: list[str]) -> None:
        if free is not None:
            cols = [*cols[:3], "", *cols[3:]]
        print(summary.row(cols, widths), flush=True)

    def show(r: Result) -> None:
        cols = [str(r.property_id), r.verdict, str(bound), f"{r.seconds:.2f}s"]
        if free is not None:
            cols.insert(3, "no" if str(r.property_id) in free else "yes (ASSUME-*)")
        print(summary.row(cols, widths), flush=True)

    results = prove(
        bound,
        props=props,
        applier=applier,
        symmetry=not args.no_symmetry,
        timeout_ms=int(args.timeout * 1000) if args.timeout else None,
        on_result=show,
    )
    problems: list[str] = []
    if not args.no_sanity:
        # also under a mutant: a broken rule must not hide behind a narrowed case
        checks: list[tuple[str, Callable[[], list[str]]]] = [
            ("SANITY-ENABLED", lambda: check_enabled(bound, applier=applier)),
            ("SANITY-RULES-FIRE", lambda: check_rules_reachable(bound, applier=applier)),
            ("SANITY-CASES", lambda: check_cases(bound, applier=applier)),
        ]
        for name, check in checks:
            t1 = time.perf_counter()
            found = check()
            problems += found
            emit([name, "ok" if not found else "FAILED", str(bound), f"{time.perf_counter() - t1:.2f}s"])
        if not args.invariant:
            problems += reach_row(applier, emit)
            if not args.mutant:
                problems += mutant_rows(emit, args.counterexamples)
    if not args.mutant and not args.invariant and not args.no_operations:
        from kvspec.reference.smt.cli.operations import run_operation_rows

        problems += run_operation_rows(args, emit)
    if not args.mutant and not args.invariant:
        # the shared G3 tier of several workers (smt/tiers/shared.py): its two
        # invariants, a sanity row and its mutants, at their own small bound
        from kvspec.reference.smt.tiers.shared import prove_shared_tier

        for row in prove_shared_tier():
            emit([row.name, row.verdict, row.detail, f"{row.seconds:.2f}s"])
            if not row.ok:
                problems.append(f"{row.name}: {row.verdict} ({row.detail})")
    print(f"total {time.perf_counter() - t0:.2f}s")
    bad = [r for r in results if not r.proven]
    for r in bad:
        print()
        if r.counterexample is not None:
            print(r.counterexample.render())
            if m is not None or r.counterexample.pre is not None:
                for line in trace_lines(m or _UNMUTATED, by_id(r.property_id)):
                    print(line)
            if args.counterexamples is not None:
                write_counterexample(args.counterexamples, m, by_id(r.property_id))
        else:
            print(f"{r.property_id}: {summary.unknown_text(timeout_s=args.timeout)}; try a larger --timeout")
    for p in problems:
        print(f"sanity check failed: {p}")
    return 1 if any(not r.proven and not r.unknown for r in bad) or problems else (3 if bad else 0)


#: the unbroken rules, for a trace of a counterexample found without a mutant
_UNMUTATED = OffloadMutant("(none)", "", "the rules as written", "")
