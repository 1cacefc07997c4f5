"""``kvspec witnesses``: regenerate the bounded-model-checking scenarios.

Searches each witness (reference/smt/witnesses.py) with z3, derives its
expected values from the solver's trace, and writes
spec/scenarios/witnesses/NAME.json. ``--check`` searches nothing and writes
nothing: it exits 1 unless every checked-in file still reaches its target and
holds exactly the expected values the encoding derives from its operations.
(A new search may find a different trace of the same length: z3 returns one
shortest trace, not a canonical one.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvspec.reference.smt.witnesses import WITNESS_DIR, WITNESSES, generate, path_of, verify, witness, write
from kvspec.spec.scenario import load_scenario


def add_arguments(p: argparse.ArgumentParser) -> None:
    # the help names the folder inside the package, not this machine's path of it
    # (docs/reference/cli.md is generated from the help and must not depend on the checkout)
    p.add_argument(
        "--out", type=Path, default=WITNESS_DIR, help="directory to write (default: spec/scenarios/witnesses in kvspec)"
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        choices=[w.name for w in WITNESSES],
        help="regenerate only this witness (repeatable)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="verify the checked-in files (target reached, expectations current) instead of searching",
    )


def run(args: argparse.Namespace) -> int:
    chosen = [witness(n) for n in args.only] if args.only else WITNESSES
    bad = 0
    for w in chosen:
        t0 = time.perf_counter()
        path = path_of(w, args.out)
        if args.check:
            if not path.exists():
                print(f"{w.name}: MISSING ({path})")
                bad += 1
                continue
            problems = verify(w, load_scenario(path))
            bad += bool(problems)
            status = "ok" if not problems else "STALE: " + "; ".join(problems)
            print(f"{w.name}: {status} ({time.perf_counter() - t0:.1f}s, {path})")
            continue
        try:
            scenario, found = generate(w)
        except RuntimeError as e:
            print(f"{w.name}: {e}", file=sys.stderr)
            return 1
        write(scenario, path)
        print(f"{w.name}: {found.depth} operations, {time.perf_counter() - t0:.1f}s, wrote {path}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvspec witnesses", description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
