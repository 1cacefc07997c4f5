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
