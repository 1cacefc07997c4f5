"""How many seeded agreement sequences each encoding mutant needs to be caught.

For every seeded encoding bug (kvspec/reference/smt/offload/agreement/encoding_mutants.py),
runs the seeded campaign's plan (agreement_campaign.plan: seeds 0, 1, ...
with the eviction policies in turn) with the bug installed, and prints the
first sequence of the plan that exposes it (a mismatch between the model and
the encoding), how many of the first --max do, and the policies of those.
The unmutated encoding is run over the same --max sequences and must agree.
The last line is the largest first catch over the mutants: the budget the
test (tests/test_smt_agreement.py, agreement_campaign.BUDGET) must at least
run.

    python benchmarks/agreement_budget.py [--max 32]
"""

from __future__ import annotations

import argparse
import resource
import sys

from kvspec.reference.smt.offload.agreement.campaign import BUDGET, plan, sequence
from kvspec.reference.smt.offload.agreement.encoding_mutants import ENCODING_MUTANTS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--max", type=int, default=32, help="sequences of the plan per mutant (default %(default)s)")
    args = p.parse_args(argv)
    worst = 0
    runs = plan(args.max)
    print(f"{'mutant':28} {'kind':8} first  caught  by policy (test budget {BUDGET})")
    for m in ENCODING_MUTANTS:
        hits: list[tuple[int, str]] = []
        with m.installed():
            for seed, policy in runs:
                if sequence(seed, policy).mismatches:
                    hits.append((seed, policy))
        first = hits[0][0] + 1 if hits else None
        by_policy = {pol: sum(1 for _s, q in hits if q == pol) for _s, pol in runs}
        pols = ", ".join(f"{k} {v}" for k, v in by_policy.items())
        print(f"{m.name:28} {m.kind:8} {first or '-':>5}  {len(hits):>2}/{len(runs):<3}  {pols}", flush=True)
        worst = max(worst, first if first is not None else args.max + 1)
    bad = [(s, pol) for s, pol in runs if (lambda r: r.mismatches or r.unflagged_breaks)(sequence(s, pol))]
    print(f"unmutated: {len(runs) - len(bad)}/{len(runs)} sequences agree" + (f" (not: {bad})" if bad else ""))
    cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    print(f"cpu {cpu:.1f}s")
    print(f"agreement_budget: {worst} sequences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
