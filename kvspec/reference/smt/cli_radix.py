"""``kvspec prove --profile radix``: the rows of the radix profile's proofs.

Without ``--mutant``: every INV-RADIX-* invariant and the lock-path lemma
proven 1-inductive in the bounded universe, the sanity checks (every step
and every sub-case satisfiable, the invariants satisfiable in a rich
state), the agreement of the encoding with ``reference/radix.py`` on sampled
operation sequences, and one row per mutant of the encoding (refuted by a
counterexample, and whether the agreement catches it too). With
``--mutant NAME``: the same proofs against that mutant, its sanity checks,
and its counterexample. Exit 1 on any failure (with ``--mutant``: when the
counterexample is found, as ``kvspec prove --mutant`` does).
"""

from __future__ import annotations

import time

from .profile_radix import DEFAULT_BOUND, LEMMA_ID, MUTANTS, RadixProof, prove_radix, refute, sanity
from .profile_radix_ops import op_rows
from .radix_agreement import Disagreement, catches, check_agreement
from .radix_encoding import RadixBound

WIDTHS = [36, 12, 42, 9]
#: sampled sequences for the agreement row (12 operations each, page sizes 1 and 2)
AGREEMENT_SEQUENCES = 20


def _row(cols: list[str]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cols, WIDTHS, strict=True)).rstrip()


def run_radix(
    mutant: str | None = None,
    bound: RadixBound = DEFAULT_BOUND,
    unbounded: bool = False,
    timeout_s: float | None = None,
) -> int:
    if unbounded:
        from .cli_radix_unbounded import run_radix_unbounded

        return run_radix_unbounded(mutant, timeout_s)
    tw = frozenset({mutant}) if mutant else frozenset()
    print(f"kvspec prove --profile radix: SGLang-style radix tree at page level, every state of {bound}")
    if mutant:
        m = MUTANTS[mutant]
        print(f"MUTANT {m.name}: {m.description} (breaks {m.rule})")
    print(_row(["invariant", "result", "bound", "time"]))
    print(_row(["-" * w for w in WIDTHS]))
    problems: list[str] = []

    def show(r: RadixProof) -> None:
        where = f" at {', '.join(r.failed_at)}" if r.failed_at else ""
        print(_row([r.property_id, r.verdict, str(bound) if not where else where.strip(), f"{r.seconds:.2f}s"]))

    results = prove_radix(bound, tw=tw, on_result=show)
    bad = [r for r in results if r.verdict != "proven"]
    t1 = time.perf_counter()
    found = sanity(bound, tw)
    ok = "ok" if not found else "FAILED"
    print(_row(["SANITY-RADIX", ok, "steps, cases, rich state", f"{time.perf_counter() - t1:.2f}s"]))
    problems += found
    if mutant:
        cx = refute(mutant, bound)
        if cx is not None:
            print()
            print(cx.text)
        else:
            problems.append(f"the mutant {mutant} was not refuted")
        for p in problems:
            print(f"sanity check failed: {p}")
        return 1 if bad or cx is not None or problems else 0
    t1 = time.perf_counter()
    try:
        run = check_agreement(sequences=AGREEMENT_SEQUENCES)
        print(
            _row(
                [
                    "AGREEMENT-RADIX (reference/radix.py)",
                    "agrees",
                    f"{run.operations} ops, {run.steps} steps",
                    f"{time.perf_counter() - t1:.2f}s",
                ]
            )
        )
    except Disagreement as e:
        print(_row(["AGREEMENT-RADIX (reference/radix.py)", "DISAGREES", "", f"{time.perf_counter() - t1:.2f}s"]))
        problems.append(str(e))
    for name, m in MUTANTS.items():
        t1 = time.perf_counter()
        cx = refute(name, bound)
        scope = m.breaks
        if m.agreement:
            caught = catches(name, sequences=AGREEMENT_SEQUENCES)
            scope += f", agreement: op {caught.operations}" if caught else ", AGREEMENT MISSES IT"
            if caught is None:
                problems.append(f"the agreement check does not catch the radix mutant {name}")
        print(
            _row([f"  refutes {name}", "refuted" if cx else "NOT REFUTED", scope, f"{time.perf_counter() - t1:.2f}s"])
        )
        if cx is None:
            problems.append(f"the radix mutant {name} was not refuted")
    problems += op_rows(_row)
    for r in bad:
        problems.append(f"{r.property_id} {r.verdict} at {', '.join(r.failed_at) or '?'}")
    for p in problems:
        print(f"sanity check failed: {p}")
    return 1 if problems else 0


__all__ = ["LEMMA_ID", "run_radix"]
