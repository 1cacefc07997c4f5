"""Record the traces that reach every REACHABLE goal of kvbm, legacy and atomic (``blocks/reach_traces.py``).

The search (``reach.cover`` over ``blocks/reach.py``: greedy BMC, then the
model-guided stage for what it left) costs minutes, too much for every
``kvspec prove``; its traces are kept in ``kvspec/reference/smt/blocks/reach_traces.json``
and ``prove`` only checks them again, pinned (``blocks/reach_traces.check``).
Run this after changing a block encoding whose REACHABLE row then fails
because a recorded trace no longer fits. Usage: ``python scripts/gen_block_reach_traces.py [PROFILE...]``.
"""

from __future__ import annotations

import sys
import time

from kvspec.reference.smt.blocks.reach_traces import record


def main(argv: list[str]) -> int:
    for profile in argv or ["legacy", "kvbm", "atomic"]:
        t0 = time.process_time()
        missing = record(profile)
        cpu = time.process_time() - t0
        print(f"{profile}: recorded ({cpu:.1f} s CPU); not reached: {missing or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
