"""The quick tier's cost: ``make quick``'s pytest part, timed, with the machine's load beside it.

Runs ``pytest -q -x -n JOBS -m "not slow and not engines" tests`` (the command of the Makefile's quick
target) in a child process and prints the tests it ran and their outcome, the collection alone
(``--collect-only``, one process), the wall time, the CPU time of pytest and everything it started
(user + system, from the children's resource usage), and the load average before and after. On a
shared machine compare CPU seconds: the wall time grows with the other sessions' load, the CPU time
much less. The last line is the wall time.

    python benchmarks/quick_tier.py [--jobs auto]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["-m", "not slow and not engines"]


def timed(argv: list[str]) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + system of the child and its descendants) of one run, and its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout + proc.stderr


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--jobs", default="auto", help="pytest-xdist workers, as make quick's JOBS (default auto)")
    args = p.parse_args(argv)
    pytest = [sys.executable, "-m", "pytest", "tests"]
    load0 = os.getloadavg()
    cwall, ccpu, out = timed([*pytest, "--collect-only", "-q", *QUICK])
    collected = re.search(r"(\d+)/(\d+) tests collected", out)
    wall, cpu, out = timed([*pytest, "-q", "-x", "-n", args.jobs, *QUICK])
    load1 = os.getloadavg()
    summary = out.strip().splitlines()[-1] if out.strip() else "(no output)"
    for line in out.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            print(line)
    if collected:
        print(f"quick tier: {collected.group(1)} of {collected.group(2)} tests")
    print(f"collection alone: {cwall:.1f} s wall, {ccpu:.1f} s CPU")
    print(f"run: {summary}")
    print(f"CPU {cpu:.1f} s (user + system, pytest and its children), -n {args.jobs}")
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f}")
    print(f"quick_tier: {wall:.1f} s")
    return 0 if " failed" not in summary and " error" not in summary else 1


if __name__ == "__main__":
    sys.exit(main())
