"""How many seeded agreement sequences each encoding mutant needs to be caught.

For every seeded encoding bug (kvspec/reference/smt/encoding_mutants.py) and
every eviction policy, runs the seeded campaign (agreement_campaign.sequence,
seeds 0, 1, ...) with the bug installed, and prints the first seed whose
sequence exposes it (a mismatch between the model and the encoding), or
"not caught" within --max. The last line is the largest number of sequences
any mutant needed under its best policy (the budget the test must run).

    python benchmarks/agreement_budget.py [--max 60]
"""

from __future__ import annotations

import argparse
import resource
import sys

from kvspec.reference.smt.agreement import POLICY_NAMES
from kvspec.reference.smt.agreement_campaign import sequence
from kvspec.reference.smt.encoding_mutants import ENCODING_MUTANTS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--max", type=int, default=60, help="sequences per mutant and policy (default %(default)s)")
    args = p.parse_args(argv)
    worst = 0
    for m in ENCODING_MUTANTS:
        best: int | None = None
        cols = []
        for policy in POLICY_NAMES:
            found = None
            with m.installed():
                for seed in range(args.max):
                    r = sequence(seed, policy)
                    if r.mismatches:
                        found = seed + 1
                        break
            cols.append(f"{policy} {found if found else 'not caught'}")
            if found is not None:
                best = found if best is None else min(best, found)
        print(f"{m.name:28} {m.kind:8} " + ", ".join(cols), flush=True)
        worst = max(worst, best if best is not None else args.max + 1)
    cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    print(f"cpu {cpu:.1f}s")
    print(f"agreement_budget: {worst} sequences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
