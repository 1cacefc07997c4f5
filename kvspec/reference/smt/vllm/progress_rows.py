"""The progress rows of ``kvspec prove --profile vllm`` (``vllm/progress.py``).

One row per ranking argument (PROGRESS-USE-FITS, PROGRESS-NO-DEADLOCK, any
pool and any hashes), ``SANITY-PROGRESS`` (each premise holds and each move
fires in a finite pool) and one ``refutes`` row per seeded progress bug, which
no invariant row sees (it only narrows a guard). Apart from the proofs, and
from ``cli/profiles.py``, which stays small (``cli/`` holds at most 15 modules).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kvspec.reference.smt.vllm import progress


def progress_rows(emit: Callable[[list[str]], str], timeout_ms: int = 60_000) -> list[str]:
    """Print the rows through ``emit`` (a row formatter that files the verdict); return the problems."""
    print("progress: ranking arguments over the operation encoding (any blocks, any hashes)")
    problems: list[str] = []
    for r in progress.RANKINGS:
        res = progress.prove(r, timeout_ms=timeout_ms)
        verdict = {"proven": "unbounded proven"}.get(res.verdict, res.verdict)
        print(emit([f"{r.id} (ranking)", verdict, "any blocks, any hashes", f"{res.seconds:.2f}s"]), flush=True)
        if res.verdict != "proven":
            problems.append(f"vllm {r.id}: {res.verdict}; its rank: {r.counts}")
    t0 = time.perf_counter()
    found = [f for r in progress.RANKINGS for f in progress.sanity(r)]
    problems += found
    print(
        emit(["SANITY-PROGRESS", "ok" if not found else "FAILED", "finite models", f"{time.perf_counter() - t0:.2f}s"])
    )
    for b in progress.PROGRESS_BUGS:
        t0 = time.perf_counter()
        verdict = progress.refute_finite(b)
        print(emit([f"  refutes {b.name}", verdict, f"{b.expect} (finite)", f"{time.perf_counter() - t0:.2f}s"]))
        if verdict != "refuted":
            problems.append(f"the vllm progress bug {b.name} ({b.why}) was not refuted")
    return problems
