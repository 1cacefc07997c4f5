"""Write tests/slow_tests.txt: the test functions a timed run measured as slow.

``make quick`` runs ``pytest tests -m "not slow and not engines"``; which tests are slow is measured, not
guessed: this script runs the tests once, each phase's time appended to a log as it ends
(``KVSPEC_DURATIONS``, tests/conftest.py), or reads such logs or ``--durations=0`` output (``--from``),
adds up each test function's setup, call and teardown over all its parameters, and lists the slowest
functions that together take ``--share`` of the run's time. A share rather than a number of seconds:
under load every test looks slow, but the order of the functions holds. tests/conftest.py marks the
listed functions ``slow``.

Two rules keep every area in the quick tier (tests/test_quick_tier.py checks them): a module's fastest
function is never listed, so each module keeps a quick test; a module with nothing fast to offer is
listed whole by hand (``module.py  # why``), and those lines are kept as they are.

    python scripts/slow_tests.py                       # run the whole suite (-n auto), rewrite the list
    python scripts/slow_tests.py --from a.log b.log    # from earlier runs' logs or output
    python scripts/slow_tests.py --quick --share 0.8   # run the quick tier, add its slowest functions
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


def read_list(path: Path) -> tuple[list[str], list[str]]:
    """The list's function lines and its whole-module lines (kept as written, reason included)."""
    functions: list[str] = []
    modules: list[str] = []
    if path.exists():
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            (functions if "::" in line.partition("#")[0] else modules).append(line)
    return functions, modules


def choose(found: dict[str, float], share: float, keep: set[str]) -> tuple[list[str], float]:
    """The slowest functions taking ``share`` of the time of those that may be listed: each module's
    fastest function may not (``keep`` lists the functions already slow, which do not count as a
    module's quick ones)."""
    fastest: dict[str, str] = {}
    for f, _s in sorted(found.items(), key=lambda kv: kv[1]):
        if f not in keep:
            fastest.setdefault(f.split("::", 1)[0], f)
    eligible = {f: s for f, s in found.items() if fastest.get(f.split("::", 1)[0]) != f}
    total = sum(eligible.values())
    slow: list[str] = []
    taken = 0.0
    for f, s in sorted(eligible.items(), key=lambda kv: -kv[1]):
        if taken >= share * total:
            break
        slow.append(f)
        taken += s
    return slow, taken


def run(args: list[str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "durations.log"
        cmd = [sys.executable, "-m", "pytest", "tests", "-q", "-n", "auto", *args]
        subprocess.run(cmd, cwd=ROOT, env={**os.environ, "KVSPEC_DURATIONS": str(log)}, check=False)
        return log.read_text() if log.exists() else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="logs", type=Path, nargs="+", help="read earlier runs' logs instead of running")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="measure the quick tier only and add its slowest functions to the list (the list's entries stay)",
    )
    ap.add_argument(
        "--share", type=float, default=0.95, help="the slowest functions taking this share of the time (0.95)"
    )
    args = ap.parse_args(argv)
    listed, modules = read_list(OUT)
    if args.logs:
        text = "\n".join(p.read_text() for p in args.logs)
    else:
        text = run(["-m", "not slow and not engines"] if args.quick else [])
    found = durations(text)
    if not found:
        print("no durations in the input: a KVSPEC_DURATIONS log or --durations=0 output?", file=sys.stderr)
        return 2
    whole = {m.partition("#")[0].strip() for m in modules}
    found = {f: s for f, s in found.items() if f.split("::", 1)[0] not in whole}
    kept = set(listed) if args.quick else set()
    slow, taken = choose(found, args.share, kept)
    total = sum(found.values())
    names = sorted(kept | set(slow))
    how = "--quick, added to the list" if args.quick else "the whole suite"
    header = (
        f"# written by scripts/slow_tests.py ({how}, --share {args.share:g}): {len(slow)} of {len(found)} "
        f"test functions measured, {taken:.0f} of {total:.0f} s\n"
        "# whole modules (kept by hand, each with its reason: nothing in them is fast enough for make quick)\n"
    )
    OUT.write_text(
        header + "".join(f"{m}\n" for m in modules) + "# test functions\n" + "".join(f"{f}\n" for f in names)
    )
    print(header.splitlines()[0].strip("# "))
    print(f"slow_tests: {len(names)} functions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
