"""The options and rows of ``kvspec prove`` for the operation-level proofs
(``operations_prove.py``), kept apart so the step-level CLI stays small."""

from __future__ import annotations

import argparse
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
    return operation_rows(
        emit,
        Bound(args.op_slots, args.op_hashes),
        args.batch,
        sanity=not args.no_sanity,
        timeout_ms=int(args.timeout * 1000) if args.timeout else None,
    )
