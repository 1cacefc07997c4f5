"""The options and rows of ``kvspec prove`` for the operation-level proofs
(``operations_prove.py``), kept apart so the step-level CLI stays small."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from kvspec.reference.smt.offload.operations_prove import DEFAULT_BATCH, DEFAULT_OP_BOUND, operation_rows
from kvspec.reference.smt.universe import Bound


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
        problems += mutant_rows(emit)
    return problems


def mutant_rows(emit: Callable[[list[str]], None]) -> list[str]:
    """One ``refutes`` row per operation-level mutant (``offload/op_mutants.py``: its own row
    broken), and ``operation: MUTANTS-COVER``: every operation row is broken by one of them."""
    from kvspec.reference.smt.offload.invariants import ALL_PROPERTIES
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
            "ok" if not chk.problems else "FAILED",
            chk.summary(),
            f"{time.perf_counter() - t0:.2f}s",
        ]
    )
    return chk.problems
