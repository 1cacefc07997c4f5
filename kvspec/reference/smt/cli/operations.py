"""The options and rows of ``kvspec prove`` for the operation-level proofs
(``operations_prove.py``), kept apart so the step-level CLI stays small."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kvspec.reference.smt.offload.operations_prove import (
    DEFAULT_BATCH,
    DEFAULT_OP_BOUND,
    OffloadOpProof,
    operation_rows,
)
from kvspec.reference.smt.universe import Bound

if TYPE_CHECKING:
    from kvspec.reference.smt.offload.op_mutants import OffloadOpMutant


def add_operation_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("operation level (whole operations of the model)")
    g.add_argument("--no-operations", action="store_true", help="skip the operation-level proofs (kvbm-offload)")
    g.add_argument(
        "--op-slots",
        type=int,
        help=f"G1 slots of the operation-level universe (kvbm-offload; default {DEFAULT_OP_BOUND.slots})",
    )
    g.add_argument(
        "--op-hashes",
        type=int,
        help=f"block hashes of the operation-level universe (kvbm-offload; default {DEFAULT_OP_BOUND.hashes})",
    )
    g.add_argument(
        "--batch",
        type=int,
        metavar="N",
        help=f"blocks per Use, Deref and SwapIn batch, every shape up to N (kvbm-offload; default {DEFAULT_BATCH})",
    )


def run_operation_rows(args: argparse.Namespace, emit: Callable[[list[str]], None]) -> list[str]:
    """Print the operation-level rows; return the problems found."""
    print(f"operation level: whole operations (Use, Deref, Promote, SwapIn, Tick), batches of 1..{args.batch} blocks")
    problems = operation_rows(
        emit,
        Bound(args.op_slots, args.op_hashes),
        args.batch,
        sanity=not args.no_sanity,
        timeout_ms=int(args.timeout * 1000) if args.timeout else None,
    )
    if not args.no_sanity:
        problems += reach_row(emit)
        problems += mutant_rows(emit, getattr(args, "counterexamples", None))
    return problems


def mutant_rows(emit: Callable[[list[str]], None], counterexamples: Path | None = None) -> list[str]:
    """One ``refutes`` row per operation-level mutant (``offload/op_mutants.py``: its own row
    broken), and ``operation: MUTANTS-COVER``: every operation row is broken by one of them.
    With ``counterexamples``: the replay file of each refuted mutant that is a bug of whole
    operations only (a step mutant's operation version is written with the step rows:
    ``cli/offload.write_counterexample``)."""
    from kvspec.reference.smt.offload.invariants import ALL_PROPERTIES
    from kvspec.reference.smt.offload.mutants import MUTANTS
    from kvspec.reference.smt.offload.op_mutants import OP_MUTANT_BATCH, OP_MUTANT_BOUND, OP_MUTANTS, broken_rows
    from kvspec.reference.smt.offload.operations_prove import OP_DISJOINT, OP_IDLE

    t0 = time.perf_counter()
    problems: list[str] = []
    hit: set[str] = set()
    where = f"{OP_MUTANT_BOUND}, batches <= {OP_MUTANT_BATCH}"
    for m in OP_MUTANTS:
        t1 = time.perf_counter()
        rows = broken_rows(m)
        hit.update(rows)
        ok = m.expect in rows
        emit([f"  refutes {m.name}", "refuted" if ok else "NOT REFUTED", f"{m.expect} at {where}",
              f"{time.perf_counter() - t1:.2f}s"])  # fmt: skip
        if not ok:
            problems.append(f"the operation mutant {m.name} does not break {m.expect}")
        elif counterexamples is not None and m.name.removeprefix("op:") not in {s.name for s in MUTANTS}:
            from kvspec.reference.smt.offload.counterexample import emit as emit_file

            print(f"counterexample of kvbm-offload {m.name} ({m.expect}), from the empty cache:")
            for line in emit_file(counterexamples, m):
                print(line)
    lone = [r for r in [*(str(p.id) for p in ALL_PROPERTIES), OP_IDLE, OP_DISJOINT] if r not in hit]
    scope = "every operation row broken by a mutant" if not lone else "no mutant breaks " + ", ".join(lone)
    emit(["operation: MUTANTS-COVER", "ok" if not lone else "FAILED", scope, f"{time.perf_counter() - t0:.2f}s"])
    problems += [f"operation {r}: no seeded bug (mutant) breaks it, so nothing shows the row can fail" for r in lone]
    return problems


def reach_row(emit: Callable[[list[str]], None]) -> list[str]:
    """REACHABLE at operation level: every operation variant, each of its outcomes
    and every pair enabled together on a trace from the empty cache
    (``offload/op_reach.py``), from recorded traces checked again pinned
    (the search costs minutes: ``smt/recorded.py``). Its own universe (3 slots,
    4 hashes, batches of up to 2), whatever ``--op-slots`` says."""
    from kvspec.reference.smt import reach_recordings

    if not reach_recordings.recorded_for("kvbm-offload-operation"):
        print(reach_recordings.not_checked("kvbm-offload-operation"))
        return []
    t0 = time.perf_counter()
    chk = reach_recordings.check("kvbm-offload-operation")
    emit(
        [
            "operation: REACHABLE",
            chk.verdict,
            chk.summary(),
            f"{time.perf_counter() - t0:.2f}s",
        ]
    )
    return chk.problems


def op_mutant(name: str) -> OffloadOpMutant | None:
    """The operation-level mutant ``name`` (``op:...``), or None."""
    from kvspec.reference.smt.offload.op_mutants import OP_MUTANTS

    return next((m for m in OP_MUTANTS if m.name == name), None)


def run_op_mutant(args: argparse.Namespace, m: OffloadOpMutant) -> int:
    """``--mutant op:NAME``: the operation-level proofs with the mutant in force (at the bound
    where the ``refutes`` rows refute it unless ``--op-slots``, ``--op-hashes``, ``--batch`` say
    otherwise), each refuted row's counterexample, and with ``--counterexamples`` its trace from
    the empty cache as a replay file (``offload/counterexample.py``). Exit 1: the mutant is caught."""
    from kvspec.reference.smt.cli import summary
    from kvspec.reference.smt.offload.op_mutants import OP_MUTANT_BATCH, OP_MUTANT_BOUND
    from kvspec.reference.smt.offload.operations_prove import prove_operations

    bound = Bound(args.op_slots or OP_MUTANT_BOUND.slots, args.op_hashes or OP_MUTANT_BOUND.hashes)
    n = args.batch or OP_MUTANT_BATCH
    where = f"operation: {bound}, batches <= {n}"
    print(f"kvspec prove --profile kvbm-offload: the operation level, every state of {bound}, batches <= {n}")
    print(f"MUTANT {m.name}: {m.description} (breaks {m.rule}; operation row {m.expect})")
    widths = [26, 15, 44, 9]
    print(summary.header(["invariant", "result", "bound", "time"], widths))
    print(summary.header(["-" * w for w in widths], widths))
    timeout_ms = int(args.timeout * 1000) if args.timeout else None
    by_prop: dict[str, list[OffloadOpProof]] = {}
    for r in prove_operations(bound, n, timeout_ms=timeout_ms, mutate=m.mutate, reshape=m.reshape):
        by_prop.setdefault(r.property_id, []).append(r)
    refuted = unknown = False
    shown: list[OffloadOpProof] = []
    for pid, rs in by_prop.items():
        bad = [r for r in rs if not r.proven]
        cex = [r for r in bad if not r.unknown]
        verdict = "proven" if not bad else ("counterexample" if cex else "unknown")
        refuted |= bool(cex)
        unknown |= bool(bad) and not cex
        shown += cex[:1]
        print(summary.row([pid, verdict, where, f"{sum(r.seconds for r in rs):.2f}s"], widths), flush=True)
    for r in shown:
        print()
        print(f"{r.property_id} not kept by the operation {r.operation}:")
        print(r.counterexample)
    if args.counterexamples is not None and refuted:
        from kvspec.reference.smt.offload.counterexample import emit

        print()
        print(f"counterexample of kvbm-offload {m.name} ({m.expect}), from the empty cache:")
        for line in emit(args.counterexamples, m):
            print(line)
    if not refuted and m.expect not in by_prop:
        print(f"sanity check failed: {m.expect} is not an operation row")
    return summary.EXIT_FAILED if refuted else (summary.EXIT_UNKNOWN if unknown else summary.EXIT_OK)
