"""Wall time of ``kvspec mutants`` with one suite run at a time and with two.

``kvspec mutants`` runs the conformance suite once per mutant, ``--jobs``
runs at a time (default 2), each forked from a fork server that has already
imported pytest, Hypothesis and kvspec (one server per job). This runs the
same fixed subset of the bundled mutants twice in one go, at ``-j 1`` and at
``-j 2`` (alternating, ``ROUNDS`` times each, the best wall time of each
kept), so that both see the same machine. The subset (``SUBSET``: twelve
mutants killed by golden scenarios of every folder, and one killed only by
the lockstep machine) keeps it to a few minutes; the whole campaign is
``kvspec mutants``.

It also prints the CPU seconds of the runs (``resource.getrusage`` of the
children): the figure to compare across machines and loads. On 2 free cores
``-j 2`` should take a little over half the wall time of ``-j 1``; on a
loaded machine the ratio is closer to 1. The last line is the speed-up
``wall(-j 1) / wall(-j 2)``.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

#: a fixed subset: block-level kills by goldens of each folder (atomic, kvbm,
#: legacy, offload) and one lockstep kill (stored_dup_in_batch; the slowest,
#: removed_dp_rank_zero, would alone set the -j 2 wall time)
SUBSET = (
    "stored_on_inactive_hit",
    "removed_extra_block",
    "legacy_destroy_silent",
    "event_id_per_tier",
    "capacity_one_early",
    "deref_unknown_ignored",
    "lineage_no_ghost",
    "multi_lru_flat",
    "g2_evicts_newest",
    "presence_filter_missing",
    "swapin_parent_dropped",
    "swapin_unpins_before_offload",
    "stored_dup_in_batch",
)
ROUNDS = 1


def campaign(jobs: int) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the children, summary) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec", "mutants", "--jobs", str(jobs), "--only", ",".join(SUBSET)],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"kvspec mutants -j {jobs} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("killed", "time to kill", "CPU time"))]
    return wall, cpu, "; ".join(lines)


def main() -> None:
    print(f"{len(SUBSET)} mutants, {ROUNDS} rounds per setting, load average {os.getloadavg()[0]:.1f}")
    best: dict[int, tuple[float, float, str]] = {}
    for _ in range(ROUNDS):
        for jobs in (1, 2):
            run = campaign(jobs)
            print(f"-j {jobs}: {run[0]:.1f} s wall, {run[1]:.1f} s CPU  ({run[2]})", flush=True)
            if jobs not in best or run[0] < best[jobs][0]:
                best[jobs] = run
    print(f"best: -j 1 {best[1][0]:.1f} s, -j 2 {best[2][0]:.1f} s wall; load average {os.getloadavg()[0]:.1f}")
    print(f"mutants_parallel: {best[1][0] / best[2][0]:.2f} x")


if __name__ == "__main__":
    main()
