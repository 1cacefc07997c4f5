"""Record the traces that reach every REACHABLE goal of the systems checked from recordings (``smt/recorded.py``).

The searches from the initial state (vllm's operation level,
``vllm/reach.py``: the greedy search of ``reach.cover`` to 3 steps, then the
scenarios of ``OP_GUIDE`` pinned, ``recorded.attribute``; kvbm-offload's
operation level, ``offload/op_reach.py``: ``reach.cover`` to 2 steps, then the guide's sequences;
radix's operations, ``radix/op_reach.py``: ``reach.cover``, which reaches every goal; the block
profiles' step level, ``blocks/reach.py``: the greedy search to 7 steps,
then the Python model's guide) cost too much for
every ``kvspec prove``; their traces are kept beside the encodings (``RECORDINGS`` below)
and ``prove`` only checks them again, pinned. Run this after changing one of
these encodings on purpose, when its REACHABLE row then fails because a
recorded trace no longer fits. A goal the search does not reach is recorded
as not reached, and the row keeps failing on it.
Usage: ``python scripts/gen_reach_traces.py [SYSTEM...]`` (default: every one).
"""

from __future__ import annotations

import sys
import time

from kvspec.reference.smt import recorded
from kvspec.reference.smt.reach_recordings import RECORDINGS


def main(argv: list[str]) -> int:
    for key in argv or list(RECORDINGS):
        rec = RECORDINGS[key]
        t0 = time.process_time()
        cov = rec.search()
        recorded.save(rec.path, rec.key, recorded.to_json(cov))
        cpu = time.process_time() - t0
        print(f"{key}: {cov.summary()} ({cpu:.1f} s CPU)", flush=True)
        for p in cov.problems():
            print(f"  {p}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
