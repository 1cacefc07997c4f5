"""Write tests/slow_tests.txt: the test functions a timed run measured as slow.

``make quick`` runs ``pytest tests -m "not slow and not engines"``; which tests are slow is measured, not
guessed: this script runs the tests once with ``--durations=0`` (or reads the output of such a run with
``--from LOG``), adds up each test function's setup, call and teardown over all its parameters, and lists
every function above ``--seconds``. tests/conftest.py marks the listed functions ``slow``.

    python scripts/slow_tests.py                  # run the tests (-n auto) and rewrite the list
    python scripts/slow_tests.py --from run.log   # from an earlier run's output

Run it on a quiet machine: under load every test looks slow.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "slow_tests.txt"
LINE = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+tests/(\S+?\.py)::([^\s\[]+)")


def durations(text: str) -> dict[str, float]:
    """``module.py::function`` -> seconds, summed over the function's parameters and phases."""
    total: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            total[f"{m.group(2)}::{m.group(3)}"] += float(m.group(1))
    return dict(total)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="log", type=Path, help="read a finished run's output instead of running")
    ap.add_argument("--seconds", type=float, default=5.0, help="a function slower than this is slow (default 5)")
    args = ap.parse_args(argv)
    if args.log is not None:
        text = args.log.read_text()
    else:
        cmd = [sys.executable, "-m", "pytest", "tests", "-q", "-n", "auto", "--durations=0", "-p", "no:randomly"]
        text = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False).stdout
    found = durations(text)
    if not found:
        print("no durations in the output: was it a pytest run with --durations=0?", file=sys.stderr)
        return 2
    slow = sorted(f for f, s in found.items() if s > args.seconds)
    header = (
        f"# written by scripts/slow_tests.py (--seconds {args.seconds:g}): {len(slow)} of {len(found)} test "
        f"functions, {sum(found[f] for f in slow):.0f} of {sum(found.values()):.0f} s\n"
    )
    OUT.write_text(header + "".join(f"{f}\n" for f in slow))
    print(header.strip("# \n"))
    print(f"slow_tests: {len(slow)} functions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
