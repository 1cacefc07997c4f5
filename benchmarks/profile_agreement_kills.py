"""Kill rates of the profile agreement's seeded encoding bugs over seeds.

For each block-level profile (kvbm, legacy, atomic) and each seeded bug the
agreement must catch (``profile_agreement.agreement_mutants``: rule mutants
but caller-contract ones, and ``profile_encoding_mutants.py``), runs the
sampled agreement (``run_agreement``) at the test's budget
(tests/test_smt_profile_agreement.py ``OPS``) over seeds 0..N-1 and prints on
how many seeds the bug is caught and how many operations the first catch
took. The unmutated encoding must agree at every seed. The last line is the
number of seeded bugs caught at every seed.

    python benchmarks/profile_agreement_kills.py [--seeds 10] [--profile P] [--mutant M]
"""

from __future__ import annotations

import argparse
import resource
import sys

from kvspec.reference.smt.blocks.agreement import agreement_mutants, run_agreement

#: the test's budget (operations per policy); tests/test_smt_profile_agreement.py OPS
OPS = {"kvbm": 50, "atomic": 50, "legacy": 100}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default %(default)s)")
    p.add_argument("--profile", action="append", choices=sorted(OPS), help="only this profile (repeatable)")
    p.add_argument("--mutant", action="append", help="only this mutant (repeatable)")
    args = p.parse_args(argv)
    seeds = range(args.seeds)
    total = every = 0
    broken: list[str] = []
    print(f"{'profile':8} {'mutant':34} caught  first catch (checked operations) per seed")
    for profile in args.profile or ("kvbm", "legacy", "atomic"):
        for s in seeds:
            r = run_agreement(profile, ops=OPS[profile], seed=s)
            if r.mismatches:
                broken.append(f"{profile} seed {s}: {r.mismatches[0]}")
        for m in agreement_mutants(profile):
            if args.mutant and m not in args.mutant:
                continue
            firsts = []
            for s in seeds:
                r = run_agreement(profile, ops=OPS[profile], seed=s, mutant=m, first=True)
                firsts.append(str(r.checked) if r.mismatches else "-")
            hits = sum(1 for f in firsts if f != "-")
            total += 1
            every += hits == len(seeds)
            print(f"{profile:8} {m:34} {hits:>2}/{len(seeds):<3}  {' '.join(firsts)}", flush=True)
    print(f"unmutated: {broken if broken else 'agrees at every seed'}")
    print(f"cpu {resource.getrusage(resource.RUSAGE_SELF).ru_utime:.1f}s")
    print(f"profile_agreement_kills: {every}/{total} seeded bugs caught at every seed")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
