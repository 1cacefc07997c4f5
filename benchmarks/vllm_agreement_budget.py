"""How many sampled operations each vllm encoding mutant needs to be caught.

For every encoding mutant of ``reference/smt/vllm/ops.py`` that the
agreement check can see (a parent, a copy count, the all-or-nothing check),
runs ``profile_vllm_agreement.first_mismatch`` over seeds 0..--seeds-1 with
up to --max operations each and prints, per mutant, the operation index of
the first mismatch per seed and how many seeds caught it. The unmutated
encoding must agree on every seed. The last line is the largest first catch
over mutants and seeds (plus one: a count of operations): the budget
``tests/test_smt_vllm_agreement.py`` (``BUDGET``) must at least run.

    python benchmarks/vllm_agreement_budget.py [--seeds 10] [--max 200]
"""

from __future__ import annotations

import argparse
import resource
import sys

from kvspec.reference.smt.vllm.agreement import AGREEMENT_MUTANTS, first_mismatch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seeds", type=int, default=10, help="seeds per mutant (default %(default)s)")
    p.add_argument("--max", type=int, default=200, help="operations per seed (default %(default)s)")
    args = p.parse_args(argv)
    worst, failed = 0, False
    for seed in range(args.seeds):
        at, _seen = first_mismatch(seed, args.max)
        if at is not None:
            print(f"the unmutated encoding disagrees with the model at seed {seed}, operation {at}")
            failed = True
    for mutant in AGREEMENT_MUTANTS:
        firsts = [first_mismatch(seed, args.max, frozenset({mutant}))[0] for seed in range(args.seeds)]
        caught = [f for f in firsts if f is not None]
        print(f"{mutant}: caught on {len(caught)}/{args.seeds} seeds; first mismatch at {firsts}")
        failed |= len(caught) < args.seeds
        worst = max([worst, *(f + 1 for f in caught)])
    cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    print(f"CPU {cpu:.1f} s")
    print(f"vllm_agreement_budget: {worst} operations")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
