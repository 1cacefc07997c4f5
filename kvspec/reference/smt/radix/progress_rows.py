"""The progress rows of ``kvspec prove --profile radix`` (``radix/progress.py``).

``PROGRESS-RADIX-EVICTABLE (ranking)`` at the step bound, ``SANITY-PROGRESS``
(the premise holds, under a locked parent too, and the eviction fires below
the page and at it) and one ``refutes`` row per seeded progress bug. Apart
from the proofs, and from ``cli/radix.py``, which stays small.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kvspec.reference.smt.radix import progress
from kvspec.reference.smt.radix.encoding import RadixBound


def progress_rows(emit: Callable[[list[str]], str], bound: RadixBound) -> list[str]:
    """Print the rows through ``emit`` (a row formatter that files the verdict); return the problems."""
    print(f"progress: a ranking argument over the page encoding ({bound}; bounded)")
    problems: list[str] = []
    res = progress.prove(bound)
    print(emit([f"{progress.PROGRESS_ID} (ranking)", res.verdict, str(bound), f"{res.seconds:.2f}s"]), flush=True)
    if res.verdict != "proven":
        problems.append(f"radix {progress.PROGRESS_ID}: {res.verdict}; its rank: {progress.COUNTS}")
    t0 = time.perf_counter()
    found = progress.sanity(bound)
    problems += found
    print(emit(["SANITY-PROGRESS", "ok" if not found else "FAILED", str(bound), f"{time.perf_counter() - t0:.2f}s"]))
    for b in progress.PROGRESS_BUGS:
        t0 = time.perf_counter()
        verdict = progress.refute(b, bound)
        print(emit([f"  refutes {b.name}", verdict, progress.PROGRESS_ID, f"{time.perf_counter() - t0:.2f}s"]))
        if verdict != "refuted":
            problems.append(f"the radix progress bug {b.name} ({b.why}) was not refuted")
    return problems
