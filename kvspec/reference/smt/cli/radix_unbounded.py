"""``kvspec prove --profile radix --unbounded``: the INV-RADIX-* for any number of pages, tokens and locks.

One row per invariant and the lock-path lemma: ``unbounded proven``
(``smt/radix_unbounded.py``: every step preserves it over uninterpreted
sorts of pages and lock handles), ``unknown`` or ``refuted``; then the
non-vacuity rows in finite models (``smt/radix_unbounded_models.py``): the
invariants hold of a rich state, every step is enabled and every sub-case of
every step possible (``SANITY-RADIX-UNBOUNDED``), and every mutant of
``profile_radix.MUTANTS`` is refuted in this encoding twice over: its
invariant is no longer proven, and a finite counterexample is found.
With ``--mutant NAME``: the proofs against that mutant and its
counterexample; exit 1 when the counterexample is found.
"""

from __future__ import annotations

import time

from kvspec.reference.smt.cli import summary
from kvspec.reference.smt.radix.steps import MUTANTS
from kvspec.reference.smt.radix.unbounded import URProof, prove_radix_unbounded
from kvspec.reference.smt.radix.unbounded_models import FINITE_HANDLES, FINITE_PAGES, finite_sanity, refute_finite

WIDTHS = [36, 16, 38, 9]
SCOPE = "any pages, tokens, locks"
#: per solver call when re-proving a mutant's invariant at its step (it must not be proven)
MUTANT_PROOF_MS = 10_000
FINITE = f"finite: {FINITE_PAGES} pages, {FINITE_HANDLES} locks"


def _row(cols: list[str]) -> str:
    """A table row, its verdict filed in the run's summary (``cli/summary.py``)."""
    return summary.row(cols, WIDTHS)


def _show(r: URProof) -> None:
    verdict = {"proven": "unbounded proven"}.get(r.verdict, r.verdict)
    where = f"at {', '.join(r.failed_at)}" if r.failed_at else SCOPE
    print(_row([r.property_id, verdict, where, f"{r.seconds:.2f}s"]), flush=True)


def run_radix_unbounded(mutant: str | None = None, timeout_s: float | None = None) -> int:
    timeout_ms = int((timeout_s or 20) * 1000)
    tw = frozenset({mutant}) if mutant else frozenset()
    print("kvspec prove --profile radix --unbounded: SGLang-style radix tree at page level, any number of")
    print("pages, tokens and lock handles (uninterpreted sorts; smt/radix_unbounded.py)")
    if mutant:
        m = MUTANTS[mutant]
        print(f"MUTANT {m.name}: {m.description} (breaks {m.rule})")
    print(_row(["invariant", "result", "scope", "time"]))
    print(_row(["-" * w for w in WIDTHS]))
    t0 = time.perf_counter()
    results = prove_radix_unbounded(tw, timeout_ms, on_result=_show)
    problems = [f"{r.property_id} {r.verdict} at {', '.join(r.failed_at)}" for r in results if r.verdict != "proven"]
    if mutant:
        m = MUTANTS[mutant]
        t1 = time.perf_counter()
        verdict, text = refute_finite(m.name, m.step, m.breaks, timeout_ms * 3)
        print(
            _row(["  finite counterexample", verdict, f"{m.breaks} after {m.step}", f"{time.perf_counter() - t1:.2f}s"])
        )
        if text:
            print(text)
        print(f"total {time.perf_counter() - t0:.2f}s")
        return 1 if verdict == "refuted" or problems else 0
    t1 = time.perf_counter()
    found = finite_sanity(timeout_ms=timeout_ms * 3)
    problems += found
    ok = "ok" if not found else "FAILED"
    print(
        _row(["SANITY-RADIX-UNBOUNDED", ok, f"steps, cases, rich state ({FINITE})", f"{time.perf_counter() - t1:.2f}s"])
    )
    for m in MUTANTS.values():
        t1 = time.perf_counter()
        verdict, _text = refute_finite(m.name, m.step, m.breaks, timeout_ms * 3)
        # the mutant's own step, one seed: refuted or unknown, either way no longer proven
        (proof,) = prove_radix_unbounded(
            frozenset({m.name}), MUTANT_PROOF_MS, only=[m.breaks], steps=[m.step], seeds=(0,)
        )
        if verdict != "refuted":
            problems.append(f"the radix mutant {m.name} has no finite counterexample ({verdict})")
        if proof.verdict == "proven":
            problems.append(f"the radix mutant {m.name} still proves {m.breaks} unbounded")
        scope = f"{m.breaks} at {', '.join(proof.failed_at) or 'nowhere'}, finite cx"
        print(_row([f"  refutes {m.name}", verdict, scope, f"{time.perf_counter() - t1:.2f}s"]), flush=True)
    print(f"total {time.perf_counter() - t0:.2f}s")
    for p in problems:
        print(f"sanity check failed: {p}")
    return 1 if problems else 0


__all__ = ["run_radix_unbounded"]
