"""Write tests/slow_tests.txt: the test functions a timed run measured as slow.

``make quick`` runs ``pytest tests -m "not slow and not engines"``; which tests are slow is measured, not
guessed: this script runs the tests once, each phase's time appended to a log as it ends
(``KVSPEC_DURATIONS``, tests/conftest.py), or reads such logs or ``--durations=0`` output (``--from``),
adds up each test function's setup, call and teardown over all its parameters, and lists the slowest
functions that together take ``--share`` of the whole run's time. A share rather than a number of
seconds: under load every test looks slow, but the order of the functions holds.
tests/conftest.py marks the listed functions ``slow``.

    python scripts/slow_tests.py                       # run the tests (-n auto) and rewrite the list
    python scripts/slow_tests.py --from a.log b.log    # from earlier runs' logs or output
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
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
    ap.add_argument("--from", dest="logs", type=Path, nargs="+", help="read earlier runs' logs instead of running")
    ap.add_argument(
        "--share", type=float, default=0.95, help="the slowest functions taking this share of the time (0.95)"
    )
    args = ap.parse_args(argv)
    if args.logs:
        text = "\n".join(p.read_text() for p in args.logs)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "durations.log"
            cmd = [sys.executable, "-m", "pytest", "tests", "-q", "-n", "auto"]
            subprocess.run(cmd, cwd=ROOT, env={**os.environ, "KVSPEC_DURATIONS": str(log)}, check=False)
            text = log.read_text() if log.exists() else ""
    found = durations(text)
    if not found:
        print("no durations in the input: a KVSPEC_DURATIONS log or --durations=0 output?", file=sys.stderr)
        return 2
    total = sum(found.values())
    slow: list[str] = []
    taken = 0.0
    for f, s in sorted(found.items(), key=lambda kv: -kv[1]):
        if taken >= args.share * total:
            break
        slow.append(f)
        taken += s
    slow.sort()
    header = (
        f"# written by scripts/slow_tests.py (--share {args.share:g}): {len(slow)} of {len(found)} test "
        f"functions, {taken:.0f} of {total:.0f} s measured\n"
    )
    OUT.write_text(header + "".join(f"{f}\n" for f in slow))
    print(header.strip("# \n"))
    print(f"slow_tests: {len(slow)} functions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
