"""``kvspec prove``: prove every lifecycle invariant with z3 and print a table.

Exit status 0 when every invariant and lemma is proven (and the sanity checks
pass), 1 on any counterexample or unknown result, 2 on bad arguments.
``--mutant NAME`` runs the same proofs on a broken variant of the rules, to
see the counterexample the prover finds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from kvspec.reference.smt.cli.operations import add_operation_arguments, check_operation_arguments, run_operation_rows
from kvspec.reference.smt.cli.profiles import BLOCK_PROFILES, block_mutants
from kvspec.reference.smt.offload.invariants import ALL_PROPERTIES, INVARIANTS, by_id
from kvspec.reference.smt.offload.mutants import MUTANTS, mutant
from kvspec.reference.smt.offload.narrowing import check_cases
from kvspec.reference.smt.prover import (
    Result,
    check_enabled,
    check_rules_reachable,
    contract_free,
    default_applier,
    prove,
)
from kvspec.reference.smt.radix.ops import OP_MUTANTS as RADIX_OP_MUTANTS
from kvspec.reference.smt.radix.steps import MUTANTS as RADIX_STEP_MUTANTS
from kvspec.reference.smt.universe import DEFAULT_BOUND, Bound
from kvspec.reference.smt.vllm.copies import MUTANTS as VLLM_MUTANTS
from kvspec.reference.smt.vllm.ops import MUTANTS as VLLM_OP_MUTANTS

#: the radix profile's mutants: step level (profile_radix) and operation level (profile_radix_ops)
RADIX_MUTANTS = {**dict.fromkeys(RADIX_STEP_MUTANTS), **dict.fromkeys(RADIX_OP_MUTANTS)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--slots", type=int, default=DEFAULT_BOUND.slots, help="G1 slots in the universe (default %(default)s)"
    )
    p.add_argument(
        "--hashes", type=int, default=DEFAULT_BOUND.hashes, help="block hashes in the universe (default %(default)s)"
    )
    p.add_argument(
        "--invariant",
        action="append",
        metavar="ID",
        help="prove only this invariant or lemma (repeatable; default: all)",
    )
    p.add_argument("--no-lemmas", action="store_true", help="leave the LEMMA-* rows out of the table (still assumed)")
    p.add_argument(
        "--no-sanity",
        action="store_true",
        help="skip the checks that every valid operation has a successor and every rule fires",
    )
    p.add_argument("--no-symmetry", action="store_true", help="do not fix the chosen slots by symmetry (slower)")
    p.add_argument(
        "--contracts",
        action="store_true",
        help="also find which invariants need the caller contracts (ASSUME-*): prove them again without",
    )
    p.add_argument(
        "--mutant",
        choices=[m.name for m in MUTANTS]
        + sorted(set(block_mutants()) - {m.name for m in MUTANTS})
        + sorted(RADIX_MUTANTS)
        + sorted((set(VLLM_MUTANTS) | set(VLLM_OP_MUTANTS)) - set(block_mutants()) - set(RADIX_MUTANTS)),
        help="prove against a broken variant of the rules (expect a counterexample); with --profile"
        " kvbm, legacy, atomic, radix or vllm, one of that profile's mutants",
    )
    p.add_argument(
        "--profile",
        choices=PROFILES,
        help="prove one profile's invariants only (default: kvbm-offload, paged and session)",
    )
    p.add_argument(
        "--unbounded",
        action="store_true",
        help="prove the invariants for any number of slots and hashes (quantified, smt/unbounded.py)",
    )
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="per solver call (default: none)")
    add_operation_arguments(p)


def _pad(cols: list[str], free: set[str] | None) -> list[str]:
    return [*cols[:3], "", *cols[3:]] if free is not None else cols


#: the profiles with an encoding: kvbm with an offload tier (the INV-* rows),
#: the allocator-level profiles (smt/paged.py, smt/session.py), vllm copy counting (smt/profile_vllm.py)
#: the block-level profiles without offload (smt/profile_kvbm.py, profile_legacy.py, profile_atomic.py)
#: and the radix tree (smt/profile_radix.py)
PROFILES = ("kvbm-offload", "paged", "session", "vllm", "kvbm", "legacy", "atomic", "radix")
NOT_ENCODED: tuple[str, ...] = ()


def _row(cols: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()


def run(args: argparse.Namespace) -> int:
    if args.slots < 1 or args.hashes < 1:
        print("kvspec prove: --slots and --hashes must be at least 1", file=sys.stderr)
        return 2
    bad_op_args = check_operation_arguments(args)
    if bad_op_args:
        print(f"kvspec prove: {bad_op_args}", file=sys.stderr)
        return 2
    profile = getattr(args, "profile", None)
    if profile in NOT_ENCODED:
        print(
            f"kvspec prove: the {profile} profile has no z3 encoding yet (issue 13);"
            " encoded: kvbm-offload, paged, session, vllm",
            file=sys.stderr,
        )
        return 2
    if profile == "vllm":
        from kvspec.reference.smt.cli.profiles import run_vllm

        return run_vllm(args.mutant)
    if profile == "radix" or args.mutant in RADIX_MUTANTS:
        if args.mutant and (profile != "radix" or args.mutant not in RADIX_MUTANTS):
            which = (
                "is not a mutant of the radix profile" if profile == "radix" else "is a radix mutant (--profile radix)"
            )
            print(f"kvspec prove: {args.mutant} {which}", file=sys.stderr)
            return 2
        from kvspec.reference.smt.cli.radix import run_radix

        return run_radix(args.mutant, unbounded=getattr(args, "unbounded", False), timeout_s=args.timeout)
    if profile in BLOCK_PROFILES:
        from kvspec.reference.smt.cli.profiles import run_blocks

        return run_blocks(profile, args.mutant)
    if args.mutant and args.mutant not in {m.name for m in MUTANTS} and args.mutant not in block_mutants():
        print(f"kvspec prove: {args.mutant} is a mutant of --profile vllm", file=sys.stderr)
        return 2
    if args.mutant and args.mutant not in {m.name for m in MUTANTS}:
        print(
            f"kvspec prove: {args.mutant} is a mutant of --profile {'/'.join(block_mutants()[args.mutant])}",
            file=sys.stderr,
        )
        return 2
    if profile in ("paged", "session"):
        from kvspec.reference.smt.cli.managers import prove_managers

        widths = [26, 15, 22, 9]
        print(f"kvspec prove --profile {profile}")
        found = prove_managers(lambda cols: print(_row(cols, widths), flush=True), only=profile)
        for line in found:
            print(f"sanity check failed: {line}")
        return 1 if found else 0
    if getattr(args, "unbounded", False):
        from kvspec.reference.smt.cli.unbounded import run_unbounded

        return run_unbounded(args)
    bound = Bound(args.slots, args.hashes)
    try:
        props = [by_id(i) for i in args.invariant] if args.invariant else list(ALL_PROPERTIES)
    except KeyError as e:
        print(f"kvspec prove: {e.args[0]}", file=sys.stderr)
        return 2
    if args.no_lemmas and not args.invariant:
        props = list(INVARIANTS)
    applier = default_applier
    title = f"kvspec prove: kvbm profile with an offload tier, every state of {bound} (G2 capacity: any)"
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
    print(_row(head, widths))
    print(_row(["-" * w for w in widths], widths))

    def show(r: Result) -> None:
        cols = [str(r.property_id), r.verdict, str(bound), f"{r.seconds:.2f}s"]
        if free is not None:
            cols.insert(3, "no" if str(r.property_id) in free else "yes (ASSUME-*)")
        print(_row(cols, widths), flush=True)

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
            cols = [name, "ok" if not found else "FAILED", str(bound), f"{time.perf_counter() - t1:.2f}s"]
            if free is not None:
                cols.insert(3, "")
            print(_row(cols, widths))
    if not args.mutant and not args.invariant and not args.no_operations:
        problems += run_operation_rows(args, lambda cols: print(_row(_pad(cols, free), widths), flush=True))
    if not args.mutant and not args.invariant:
        # the shared G3 tier of several workers (smt/tiers/shared.py): its two
        # invariants, a sanity row and its mutants, at their own small bound
        from kvspec.reference.smt.tiers.shared import prove_shared_tier

        for row in prove_shared_tier():
            print(_row(_pad([row.name, row.verdict, row.detail, f"{row.seconds:.2f}s"], free), widths), flush=True)
            if not row.ok:
                problems.append(f"{row.name}: {row.verdict} ({row.detail})")
    if not args.mutant and not args.invariant and profile is None:
        from kvspec.reference.smt.cli.managers import prove_managers

        def emit(cols: list[str]) -> None:
            if free is not None:
                cols.insert(3, "")
            print(_row(cols, widths), flush=True)

        problems += prove_managers(emit)
    total = time.perf_counter() - t0
    print(f"total {total:.2f}s")
    bad = [r for r in results if not r.proven]
    for r in bad:
        print()
        if r.counterexample is not None:
            print(r.counterexample.render())
        else:
            print(f"{r.property_id}: the solver gave up (unknown); try a larger --timeout")
    for p in problems:
        print(f"sanity check failed: {p}")
    return 1 if bad or problems else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvspec prove", description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
