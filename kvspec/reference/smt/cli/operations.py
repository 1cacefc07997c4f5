"""The options and rows of ``kvspec prove`` for the operation-level proofs
(``operations_prove.py``), kept apart so the step-level CLI stays small."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kvspec.reference.smt.offload.operations_prove import DEFAULT_BATCH, DEFAULT_OP_BOUND, operation_rows
from kvspec.reference.smt.universe import Bound


def add_operation_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("operation level (whole operations of the model)")
    g.add_argument("--no-operations", action="store_true", help="skip the operation-level proofs")
    g.add_argument(
        "--op-slots",
        type=int,
        default=DEFAULT_OP_BOUND.slots,
        help="G1 slots of the operation-level universe (default %(default)s)",
    )
    g.add_argument(
        "--op-hashes",
        type=int,
        default=DEFAULT_OP_BOUND.hashes,
        help="block hashes of the operation-level universe (default %(default)s)",
    )
    g.add_argument(
        "--batch",
        type=int,
        default=DEFAULT_BATCH,
        metavar="N",
        help="blocks per Use, Deref and SwapIn batch, every shape up to N (default %(default)s)",
    )


def check_operation_arguments(args: argparse.Namespace) -> str | None:
    """The error message for bad operation-level options, or None."""
    if args.op_slots < 1 or args.op_hashes < 1:
        return "--op-slots and --op-hashes must be at least 1"
    if args.batch < 1:
        return "--batch must be at least 1"
    return None


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
