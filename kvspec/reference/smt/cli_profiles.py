"""``kvspec prove --profile vllm``: the rows of the vllm profile's proofs."""

from __future__ import annotations

import time

from .profile_vllm import INVARIANT_ID, MUTANTS, prove_vllm, refute, sanity

WIDTHS = [30, 18, 30, 9]


def _row(cols: list[str]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cols, WIDTHS, strict=True)).rstrip()


def run_vllm() -> int:
    """INV-VLLM-COPIES for any pool size and hashes, its sanity check, and one
    refuted mutant per copy rule. Exit 1 on any failure."""
    print("kvspec prove --profile vllm: copy counting, any pool size, any number of block hashes")
    print(_row(["invariant", "result", "scope", "time"]))
    print(_row(["-" * w for w in WIDTHS]))
    problems: list[str] = []
    t0 = time.perf_counter()
    proofs = prove_vllm()
    bad = [p.transition for p in proofs if p.verdict != "proven"]
    verdict = "unbounded proven" if not bad else "NOT proven"
    print(_row([INVARIANT_ID, verdict, "any blocks, any hashes", f"{time.perf_counter() - t0:.2f}s"]))
    problems += [f"INV-VLLM-COPIES not proven at {t}" for t in bad]
    t1 = time.perf_counter()
    found = sanity()
    problems += found
    print(_row(["SANITY-VLLM", "ok" if not found else "FAILED", "finite models", f"{time.perf_counter() - t1:.2f}s"]))
    for name, rule in MUTANTS.items():
        t1 = time.perf_counter()
        where = refute(name)
        print(
            _row(
                [
                    f"  refutes {name}",
                    "refuted" if where else "NOT REFUTED",
                    f"{rule} at {where}" if where else rule,
                    f"{time.perf_counter() - t1:.2f}s",
                ]
            )
        )
        if where is None:
            problems.append(f"the vllm mutant {name} was not refuted")
    for p in problems:
        print(f"sanity check failed: {p}")
    return 1 if problems else 0
