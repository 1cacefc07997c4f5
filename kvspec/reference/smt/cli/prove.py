"""``kvspec prove``: prove every profile's invariants with z3 and print one table per profile.

Without ``--profile``, every profile at its default level; an option that
only one profile reads (``--slots``, ``--mutant`` of kvbm-offload, ...)
chooses that profile (kvbm-offload) as before. An option the chosen profile
does not read is a usage error naming the profiles it applies to
(``cli/flags.py``). Every row goes through ``cli/summary.py``: one summary
line per profile, one exit status (``summary.EXIT_CODES_HELP``).
``--mutant NAME`` runs a profile's proofs on a broken variant of its rules,
to see the counterexample the prover finds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from kvspec.reference.smt.cli import summary
from kvspec.reference.smt.cli.flags import (
    APPLIES,
    COUNTEREXAMPLE_PROFILES,
    PROFILES,
    given,
    misapplied,
    profile_specific,
)
from kvspec.spec.registry import KVBM_OFFLOAD, PAGED, RADIX, SESSION, VLLM_NAME

__all__ = ["NOT_ENCODED", "PROFILES", "add_arguments", "main", "mutants_by_profile", "run"]

#: kept for callers of the old name: every profile has an encoding
NOT_ENCODED: tuple[str, ...] = ()


def mutants_by_profile() -> dict[str, list[str]]:
    """Each profile's ``--mutant`` choices."""
    from kvspec.reference.smt.blocks.catalogue import block_encoding
    from kvspec.reference.smt.blocks.encoding import ProfileEncoding
    from kvspec.reference.smt.cli.managers import PAGED_MUTANTS, SESSION_MUTANTS
    from kvspec.reference.smt.cli.radix import ALL_MUTANTS as RADIX_MUTANTS
    from kvspec.reference.smt.offload.mutants import MUTANTS
    from kvspec.reference.smt.offload.op_mutants import OP_MUTANTS
    from kvspec.reference.smt.vllm.copies import MUTANTS as VLLM_MUTANTS
    from kvspec.reference.smt.vllm.ops import MUTANTS as VLLM_OP_MUTANTS

    blocks: dict[str, ProfileEncoding] = {p: block_encoding(p) for p in COUNTEREXAMPLE_PROFILES}
    return {
        KVBM_OFFLOAD: [m.name for m in MUTANTS] + [m.name for m in OP_MUTANTS],
        PAGED: list(PAGED_MUTANTS),
        SESSION: list(SESSION_MUTANTS),
        VLLM_NAME: list(dict.fromkeys([*VLLM_MUTANTS, *VLLM_OP_MUTANTS])),
        **{p: list(prof.mutants) for p, prof in blocks.items()},
        RADIX: list(RADIX_MUTANTS),
    }


def _epilog() -> str:
    lines = ["mutants (--mutant NAME, with --profile P; kvbm-offload's without --profile):"]
    for p, names in mutants_by_profile().items():
        lines.append(f"  {p}: {', '.join(names)}")
    lines.append("")
    lines.append(summary.EXIT_CODES_HELP)
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from kvspec.reference.smt.cli.operations import add_operation_arguments
    from kvspec.reference.smt.universe import DEFAULT_BOUND

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _epilog()
    p.add_argument(
        "--profile",
        choices=PROFILES,
        help="prove one profile only (default: every profile, each at its default level)",
    )
    p.add_argument("--slots", type=int, help=f"G1 slots in the universe (kvbm-offload; default {DEFAULT_BOUND.slots})")
    p.add_argument(
        "--hashes", type=int, help=f"block hashes in the universe (kvbm-offload; default {DEFAULT_BOUND.hashes})"
    )
    p.add_argument(
        "--invariant",
        action="append",
        metavar="ID",
        help=(
            "prove only this invariant or lemma (kvbm-offload; repeatable; default: all); with --unbounded"
            " also a progress property (PROGRESS-QUARANTINE, PROGRESS-NO-DEADLOCK)"
        ),
    )
    p.add_argument(
        "--no-lemmas", action="store_true", help="leave the LEMMA-* rows out of the table (still assumed; kvbm-offload)"
    )
    p.add_argument(
        "--no-sanity",
        action="store_true",
        help="skip the sanity, reachability and mutant rows (kvbm-offload)",
    )
    p.add_argument("--no-symmetry", action="store_true", help="do not fix the chosen slots by symmetry (kvbm-offload)")
    p.add_argument(
        "--contracts",
        action="store_true",
        help="also find which invariants need the caller contracts (ASSUME-*): prove them again without (kvbm-offload)",
    )
    names = sorted({n for ns in mutants_by_profile().values() for n in ns})
    p.add_argument(
        "--mutant",
        choices=names,
        metavar="NAME",
        help="prove against a broken variant of the rules (expect a counterexample); the choices per profile are"
        " listed below",
    )
    p.add_argument(
        "--unbounded",
        action="store_true",
        help="prove for any size (kvbm-offload: any number of slots and hashes; radix: any number of pages)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="per solver call of the proof rows (every profile; default: the profile's own)",
    )
    p.add_argument(
        "--counterexamples",
        type=Path,
        metavar="DIR",
        help="for each refuted row (an invariant, or a mutant with --mutant or in the refutes rows), search a"
        " trace from the initial state that breaks it and write it to DIR: a replay file of operations"
        " (`kvspec replay FILE`; kvbm, legacy, atomic, and the operation-level mutants of kvbm-offload and"
        " vllm), else a text file with the trace and why it is not a replay file (the step-only mutants and"
        " invariants of kvbm-offload and vllm; paged, session, radix; not with --unbounded), or saying it"
        " is induction only or unknown",
    )
    add_operation_arguments(p)


def _usage(msg: str) -> int:
    print(f"kvspec prove: {msg}", file=sys.stderr)
    return summary.EXIT_USAGE


def _choose(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """(the profiles to run, a usage error or None)."""
    mutants = mutants_by_profile()
    profile = args.profile
    if profile is None and (profile_specific(args) or args.mutant):
        if args.mutant and args.mutant not in mutants[KVBM_OFFLOAD]:
            owners = [p for p, ns in mutants.items() if args.mutant in ns]
            return [], f"{args.mutant} is a mutant of --profile {'/'.join(owners)}"
        profile = KVBM_OFFLOAD
    if profile is None:
        return list(PROFILES), None
    bad = misapplied(args, profile)
    if bad:
        return [], bad
    if args.mutant and args.mutant not in mutants[profile]:
        return [], f"the {profile} profile has no mutant {args.mutant!r}; its mutants: {', '.join(mutants[profile])}"
    if profile == KVBM_OFFLOAD and args.mutant and args.mutant.startswith("op:"):
        # an operation mutant runs the operation-level proofs only: the step level's options do nothing there
        step_only = ("--unbounded", "--slots", "--hashes", "--invariant", "--no-lemmas", "--no-symmetry", "--contracts",
                     "--no-operations", "--no-sanity")  # fmt: skip
        for option in step_only:
            if given(args, APPLIES[option][0]):
                return [], (
                    f"{option} does not apply to an operation mutant ({args.mutant}: the operation-level proofs;"
                    " their options are --op-slots, --op-hashes, --batch, --timeout, --counterexamples)"
                )
    if profile == KVBM_OFFLOAD and args.unbounded and args.mutant:
        from kvspec.reference.smt.offload.mutants import BOUNDED_ONLY

        if args.mutant in BOUNDED_ONLY:
            return [], f"{args.mutant} is a mutant of the bounded encoding only (drop --unbounded)"
    return [profile], None


def _check_values(args: argparse.Namespace) -> str | None:
    for opt in ("slots", "hashes", "op_slots", "op_hashes", "batch"):
        v = getattr(args, opt, None)
        if v is not None and v < 1:
            return f"--{opt.replace('_', '-')} must be at least 1"
    if args.timeout is not None and args.timeout <= 0:
        return "--timeout must be positive"
    return None


def _run_offload(profile: str, a: argparse.Namespace) -> int:
    from kvspec.reference.smt.cli.offload import run_offload

    return run_offload(a)


def _run_manager(profile: str, a: argparse.Namespace) -> int:
    from kvspec.reference.smt.cli.managers import run_manager

    return run_manager(profile, a.mutant, a.timeout, a.counterexamples)


def _run_vllm(profile: str, a: argparse.Namespace) -> int:
    from kvspec.reference.smt.cli.profiles import run_vllm

    return run_vllm(a.mutant, a.timeout, a.counterexamples)


def _run_radix(profile: str, a: argparse.Namespace) -> int:
    from kvspec.reference.smt.cli.radix import run_radix

    return run_radix(a.mutant, unbounded=a.unbounded, timeout_s=a.timeout, counterexamples=a.counterexamples)


def _run_blocks(profile: str, a: argparse.Namespace) -> int:
    from kvspec.reference.smt.cli.profiles import run_blocks

    return run_blocks(profile, a.mutant, a.timeout, a.counterexamples)


#: encoding (``--profile``) -> how it is run: a lookup, so that an encoding without a runner is a
#: KeyError here and a failing test (tests/test_smt_prove_cli.py), not a silent fall-through
RUNNERS: dict[str, Callable[[str, argparse.Namespace], int]] = {
    KVBM_OFFLOAD: _run_offload,
    PAGED: _run_manager,
    SESSION: _run_manager,
    VLLM_NAME: _run_vllm,
    RADIX: _run_radix,
    **dict.fromkeys(COUNTEREXAMPLE_PROFILES, _run_blocks),
}


def _runner(profile: str) -> Callable[[argparse.Namespace], int]:
    run_one = RUNNERS[profile]
    return lambda a: run_one(profile, a)


def run(args: argparse.Namespace) -> int:
    bad = _check_values(args)
    if bad:
        return _usage(bad)
    profiles, bad = _choose(args)
    if bad:
        return _usage(bad)
    if args.invariant:
        from kvspec.reference.smt.offload.invariants import by_id
        from kvspec.reference.smt.unbounded.encoding import by_id as u_by_id
        from kvspec.reference.smt.unbounded.progress import RANKINGS

        ranked = {str(r.id) for r in RANKINGS}
        try:
            for i in args.invariant:
                if not (args.unbounded and i in ranked):
                    (u_by_id if args.unbounded else by_id)(i)
        except KeyError as e:
            more = f" (with --unbounded also: {', '.join(sorted(ranked))})"
            return _usage(str(e.args[0]) + more)
    if len(profiles) > 1:
        print(f"kvspec prove: every profile at its default level ({', '.join(profiles)})")
        print(
            "skipped: the --unbounded levels of kvbm-offload and radix (the same rows for any size; run"
            " `kvspec prove --unbounded` and `kvspec prove --profile radix --unbounded`)"
        )
    summary.reset()
    codes: list[int] = []
    for p in profiles:
        if len(profiles) > 1:
            print()
        summary.start(p, args.timeout)
        codes.append(_runner(p)(args))
    if summary.EXIT_USAGE in codes:  # a runner found the options do not fit (it said why)
        return summary.EXIT_USAGE
    print()
    for t in summary.tallies():
        print(t.line())
    if args.mutant:
        # a mutant run "fails" (exit 1) when the mutant is caught, as it must be
        caught = any(c == summary.EXIT_FAILED for c in codes)
        unknown = any(t.unknown for t in summary.tallies())
        return summary.EXIT_FAILED if caught else (summary.EXIT_UNKNOWN if unknown else summary.EXIT_OK)
    status = summary.exit_status()
    if any(c == summary.EXIT_FAILED for c in codes):
        status = summary.EXIT_FAILED
    return status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvspec prove", description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
