"""CPU time the progress rows add to plain ``kvspec prove``: vllm, radix, session, each in a child.

The rows (``vllm/progress_rows.py``, ``radix/progress_rows.py``,
``managers/session_progress.py``: the ranking arguments, session's lemma,
``SANITY-PROGRESS`` and the refutation of each seeded progress bug)
run in a fresh child process per profile, so z3's state is not the one a
previous profile left. Each figure is the CPU time (user + system, comparable
under load) of the rows alone, imports excluded, measured in the child with
``time.process_time``; the load average is printed beside them. The last line
is their sum: ``progress_rows: VALUE s``.

Run from the repository root: ``python benchmarks/progress_rows.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_CHILD = """
import json, sys, time
from kvspec.reference.smt.cli import summary
summary.reset()
summary.start(sys.argv[1])
emit = lambda cols: summary.row(cols, [36, 16, 34, 9])
if sys.argv[1] == "vllm":
    from kvspec.reference.smt.vllm.progress_rows import progress_rows
    run = lambda: progress_rows(emit)
elif sys.argv[1] == "session":
    from kvspec.reference.smt.managers.session_progress import progress_rows
    run = lambda: progress_rows(emit, 3)
else:
    from kvspec.reference.smt.radix.progress_rows import progress_rows
    from kvspec.reference.smt.radix.steps import DEFAULT_BOUND
    run = lambda: progress_rows(emit, DEFAULT_BOUND)
t0 = time.process_time()
problems = run()
print(json.dumps({"cpu": time.process_time() - t0, "problems": problems}))
"""


def main() -> int:
    total = 0.0
    bad = False
    for profile in ("vllm", "radix", "session"):
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, profile], capture_output=True, text=True, timeout=1800, check=False
        )
        last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
        res = json.loads(last) if proc.returncode == 0 else {"cpu": 0.0, "problems": [proc.stderr[-500:]]}
        total += res["cpu"]
        bad |= bool(res["problems"])
        print(f"{profile}: {res['cpu']:.2f} s CPU, {len(res['problems'])} problem(s)")
    print(f"load average: {os.getloadavg()[0]:.2f}")
    print(f"progress_rows: {total:.2f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
