"""``kvspec prove --unbounded``: the INV-* for any number of slots and hashes.

One row per invariant and lemma: ``proven`` (every transition preserves it,
for every capacity and every number of block hashes: ``smt/unbounded.py``),
``unknown`` (z3 gave up within the timeout) or ``refuted``; then the
non-vacuity rows: the ghost forms imply the plain statements, the hypothesis
with each step enabled has a finite model and every rule guard fires in one
(``SANITY-UNBOUNDED``), and every mutant is refuted in this encoding too
(its counterexample a finite state of 3 slots and 4 hashes). Then the
progress rows (``smt/unbounded/progress.py``): PROGRESS-QUARANTINE and
PROGRESS-NO-DEADLOCK as ranking arguments for any size, their non-vacuity
in finite models (``SANITY-PROGRESS``) and the refutation of each one's
seeded bug, which no INV-* row sees. ``--mutant`` runs the INV-* rows and
the mutant's refutation only.
"""

from __future__ import annotations

import argparse
import time

from kvspec.reference.smt.cli import summary
from kvspec.reference.smt.unbounded import progress
from kvspec.reference.smt.unbounded.encoding import MUTANTS, PROPERTIES, UResult, by_id, ghost_checks, prove_unbounded
from kvspec.reference.smt.unbounded.models import finite_sanity, refute_finite

WIDTHS = [38, 16, 34, 9]
SCOPE = "any slots, any hashes"


def _row(cols: list[str]) -> str:
    """A table row, its verdict filed in the run's summary (``cli/summary.py``)."""
    return summary.row(cols, WIDTHS)


def run_unbounded(args: argparse.Namespace) -> int:
    timeout_ms = int((args.timeout or 60) * 1000)
    print("kvspec prove --unbounded: kvbm profile with an offload tier, any G1 capacity, any number of block hashes")
    tw = frozenset({args.mutant}) if args.mutant else frozenset()
    if args.mutant:
        m = next(m for m in MUTANTS if m.name == args.mutant)
        print(f"MUTANT {m.name} (breaks {m.rule}): expect {m.expect} refuted")
    chosen = list(args.invariant or [])
    rankings = [r for r in progress.RANKINGS if not chosen or r.id in chosen]
    try:
        props = [by_id(i) for i in chosen if i not in {r.id for r in progress.RANKINGS}] if chosen else list(PROPERTIES)
    except KeyError as e:
        print(f"kvspec prove: {e.args[0]} (or a progress property: {[str(r.id) for r in progress.RANKINGS]})")
        return 2
    if args.no_lemmas and not args.invariant:
        props = [p for p in props if not p.lemma]
    print(_row(["invariant", "result", "scope", "time"]))
    print(_row(["-" * w for w in WIDTHS]))
    t0 = time.perf_counter()

    def show(r: UResult) -> None:
        verdict = {"proven": "unbounded proven"}.get(r.verdict, r.verdict)
        print(_row([str(r.property_id), verdict, SCOPE, f"{r.seconds:.2f}s"]), flush=True)

    results = prove_unbounded(props, tw, timeout_ms, on_result=show) if props else []
    problems: list[str] = []
    if args.mutant:
        t1 = time.perf_counter()
        verdict, where = refute_finite(next(m for m in MUTANTS if m.name == args.mutant), timeout_ms)
        print(
            _row(
                [
                    "  finite counterexample",
                    verdict,
                    f"at {where}" if where else "",
                    f"{time.perf_counter() - t1:.2f}s",
                ]
            )
        )
        for r in results:
            for name, why in r.failures.items():
                print(f"{r.property_id} at {name}: {why}")
        print(f"total {time.perf_counter() - t0:.2f}s")
        if verdict != "refuted":
            print(f"the mutant {m.name} was not refuted with a finite counterexample ({verdict})")
        # as for the bounded proofs: exit 0 only when everything is proven
        return 1 if verdict == "refuted" or any(not r.proven for r in results) else 0
    for rank in rankings:
        pr = progress.prove(rank, timeout_ms=timeout_ms)
        verdict = {"proven": "unbounded proven"}.get(pr.verdict, pr.verdict)
        print(_row([f"{rank.id} (ranking)", verdict, SCOPE, f"{pr.seconds:.2f}s"]), flush=True)
        if pr.verdict != "proven":
            problems.append(f"{rank.id}: {pr.verdict} ({pr.detail}); its rank: {rank.counts}")
    if not args.no_sanity and props:
        t1 = time.perf_counter()
        found = ghost_checks(timeout_ms)
        problems += found
        print(_row(["SANITY-GHOSTS", "ok" if not found else "FAILED", SCOPE, f"{time.perf_counter() - t1:.2f}s"]))
        t1 = time.perf_counter()
        found = finite_sanity(timeout_ms=timeout_ms)
        problems += found
        print(
            _row(
                [
                    "SANITY-UNBOUNDED",
                    "ok" if not found else "FAILED",
                    "finite models",
                    f"{time.perf_counter() - t1:.2f}s",
                ]
            )
        )
        for m in MUTANTS:
            t1 = time.perf_counter()
            verdict, where = refute_finite(m, timeout_ms)
            print(_row([f"  refutes {m.name}", verdict, f"{m.expect} at {where}", f"{time.perf_counter() - t1:.2f}s"]))
            if verdict != "refuted":
                problems.append(f"the mutant {m.name} was not refuted in the unbounded encoding")
    if not args.no_sanity and rankings:
        t1 = time.perf_counter()
        found = [f for rank in rankings for f in progress.sanity(rank, timeout_ms)]
        problems += found
        print(
            _row(
                [
                    "SANITY-PROGRESS",
                    "ok" if not found else "FAILED",
                    "finite models",
                    f"{time.perf_counter() - t1:.2f}s",
                ]
            )
        )
        for b in progress.PROGRESS_BUGS:
            if b.expect not in {rank.id for rank in rankings}:
                continue
            t1 = time.perf_counter()
            verdict = progress.refute_finite(b, timeout_ms)
            print(_row([f"  refutes {b.name}", verdict, f"{b.expect} (finite)", f"{time.perf_counter() - t1:.2f}s"]))
            if verdict != "refuted":
                problems.append(f"the progress bug {b.name} ({b.why}) was not refuted")
    print(f"total {time.perf_counter() - t0:.2f}s")
    for r in results:
        for name, why in r.failures.items():
            print(f"{r.property_id} at {name}: {why}")
    for p in problems:
        print(f"sanity check failed: {p}")
    bad = [r for r in results if not r.proven]
    return 1 if bad or problems else 0
