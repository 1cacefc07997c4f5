"""``kvspec witnesses``: regenerate the bounded-model-checking scenarios.

Searches each witness (reference/smt/witnesses.py) with z3, derives its
expected values from the solver's trace, and writes
spec/scenarios/witnesses/NAME.json. ``--check`` writes nothing and exits 1
when a checked-in file differs from what the search produces now.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvspec.spec.scenario import dump_scenario

from .witnesses import WITNESS_DIR, WITNESSES, generate, path_of, witness, write


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=WITNESS_DIR, help="directory to write (default: %(default)s)")
    p.add_argument("--only", action="append", metavar="NAME", choices=[w.name for w in WITNESSES],
                   help="regenerate only this witness (repeatable)")
    p.add_argument("--check", action="store_true", help="compare with the files instead of writing them")


def run(args: argparse.Namespace) -> int:
    chosen = [witness(n) for n in args.only] if args.only else WITNESSES
    stale = 0
    for w in chosen:
        t0 = time.perf_counter()
        try:
            scenario, found = generate(w)
        except RuntimeError as e:
            print(f"{w.name}: {e}", file=sys.stderr)
            return 1
        path = path_of(w, args.out)
        text = dump_scenario(scenario)
        took = time.perf_counter() - t0
        if args.check:
            same = path.exists() and path.read_text() == text
            stale += not same
            print(f"{w.name}: {found.depth} operations, {took:.1f}s, {'up to date' if same else 'DIFFERS'} ({path})")
        else:
            write(scenario, path)
            print(f"{w.name}: {found.depth} operations, {took:.1f}s, wrote {path}")
    return 1 if stale else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvspec witnesses", description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
