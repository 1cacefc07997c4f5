"""What the exhaustive model-encoding check costs, profile by profile (``kvspec equivalence``).

Each profile runs in its own child process at its default bound and depth
(``cli/equivalence.BOUNDS``) and reports the states and (state, operation)
pairs it compared, whether every reachable state of the bound was reached
("closed") and the child's CPU time (user + system: comparable under load;
wall time beside it). The last line is the CPU time of all profiles summed:
``equivalence: VALUE s``.

Run from the repository root: ``python benchmarks/equivalence.py [--profile P ...] [--depth N]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

from kvspec.reference.smt.cli.equivalence import BOUNDS


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--profile", action="append", choices=sorted(BOUNDS))
    p.add_argument("--depth", type=int, default=None)
    args = p.parse_args()
    total = 0.0
    ok = True
    for prof in args.profile or list(BOUNDS):
        cmd = [sys.executable, "-m", "kvspec", "equivalence", "--profile", prof]
        if args.depth is not None:
            cmd += ["--depth", str(args.depth)]
        c0, w0 = _cpu_children(), time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        cpu, wall = _cpu_children() - c0, time.perf_counter() - w0
        total += cpu
        line = next((x for x in run.stdout.splitlines() if x.startswith("EQUIV-")), run.stdout.strip()[:200])
        print(f"{prof:<13} exit {run.returncode}  {cpu:7.1f} s CPU  {wall:7.1f} s wall  {line}", flush=True)
        ok &= run.returncode == 0
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"equivalence: {total:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
