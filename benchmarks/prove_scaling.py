"""How the z3 proofs scale with the bound: proof time per invariant at 4, 8
and 16 slots (1.5 block hashes per slot), then the total at the default bound
(8 slots, 12 hashes; median of three runs) as the last line:
``prove_scaling: VALUE s``.

Run from the repository root: ``python benchmarks/prove_scaling.py``.
"""

from __future__ import annotations

import statistics
import sys
import time

from kvspec.reference.smt.prover import prove
from kvspec.reference.smt.universe import DEFAULT_BOUND, Bound

SLOTS = (4, 8, 16)


def bound_for(slots: int) -> Bound:
    return Bound(slots, slots * 3 // 2)


def main() -> int:
    rows: dict[str, dict[int, float]] = {}
    totals: dict[int, float] = {}
    for n in SLOTS:
        t0 = time.perf_counter()
        results = prove(bound_for(n))
        totals[n] = time.perf_counter() - t0
        for r in results:
            if not r.proven:
                print(f"{r.property_id} not proven at {bound_for(n)}", file=sys.stderr)
                return 1
            rows.setdefault(str(r.property_id), {})[n] = r.seconds
    head = "invariant".ljust(26) + "".join(f"{bound_for(n)!s:>24}" for n in SLOTS)
    print(head)
    for pid, times in rows.items():
        print(pid.ljust(26) + "".join(f"{times[n]:>23.2f}s" for n in SLOTS))
    print("total (with building)".ljust(26) + "".join(f"{totals[n]:>23.2f}s" for n in SLOTS))
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        prove(DEFAULT_BOUND)
        runs.append(time.perf_counter() - t0)
    print(f"prove_scaling: {statistics.median(runs):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
