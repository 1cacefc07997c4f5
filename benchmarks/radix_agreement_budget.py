"""How many sampled operations each radix encoding mutant needs to be caught.

For every mutant of ``reference/smt/radix`` that changes a successor (``m.agreement``: the ones the
sampled agreement with ``RadixModel`` can see), runs ``radix/agreement.catches`` over seeds
0..--seeds-1 with the sequences ``kvspec prove --profile radix`` runs (``AGREEMENT_SEQUENCES``
uniform ones, then the aimed ``sample_locked_splits`` ones) and prints, per mutant, the number of
operations until the first disagreement at each seed and on how many seeds it was caught. The
unmutated encoding must agree at every seed; exit 1 otherwise, or when a mutant goes uncaught at
some seed. The last line is the largest first catch over mutants and seeds, in operations.

    python benchmarks/radix_agreement_budget.py [--seeds 10]
"""

from __future__ import annotations

import argparse
import resource
import sys

from kvspec.reference.smt.cli.radix import AGREEMENT_SEQUENCES
from kvspec.reference.smt.radix.agreement import Disagreement, catches, check_agreement
from kvspec.reference.smt.radix.steps import MUTANTS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default %(default)s)")
    args = p.parse_args(argv)
    seeds = range(args.seeds)
    failed, worst, ops = False, 0, 0
    for seed in seeds:
        try:
            ops = check_agreement(sequences=AGREEMENT_SEQUENCES, seed=seed).operations
        except Disagreement as e:
            print(f"the unmutated encoding disagrees with the model at seed {seed}: {e}")
            failed = True
    print(f"{AGREEMENT_SEQUENCES} uniform sequences and their aimed ones: {ops} operations per seed")
    for name, m in MUTANTS.items():
        if not m.agreement:
            continue
        firsts = [catches(name, sequences=AGREEMENT_SEQUENCES, seed=seed) for seed in seeds]
        caught = [f.operations for f in firsts if f is not None]
        shown = ", ".join("-" if f is None else str(f.operations) for f in firsts)
        print(f"{name}: caught on {len(caught)}/{len(seeds)} seeds; operations to the first catch: {shown}", flush=True)
        failed |= len(caught) < len(seeds)
        worst = max([worst, *caught])
    print(f"CPU {resource.getrusage(resource.RUSAGE_SELF).ru_utime:.1f} s")
    print(f"radix_agreement_budget: {worst} operations")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
