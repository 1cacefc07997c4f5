"""``kvspec prove --profile paged|session``: ``INV-PAGED-REFS`` and ``INV-SESSION-FENCE``.

Each invariant is proven per transition (``managers/paged.py``,
``managers/session.py``); one row per invariant says whether every transition
preserves it. Non-vacuity: REACHABLE (every transition, each of its cases
and each pair of transitions enabled together happen on a trace from the
initial state: ``managers/reach.py``), and one row per deliberately broken
transition (the ferrum seed's swap-out and its copy in extend; a release
that keeps the generation), which z3 must refute: a broken transition that
is "proven" means the encoding checks nothing. ``--mutant NAME`` proves the
profile with that broken transition in place of the correct one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvspec.reference.smt.cli import summary
from kvspec.reference.smt.managers import paged, session
from kvspec.reference.smt.managers.paged import PagedBound, prove_paged
from kvspec.reference.smt.managers.session import prove_session
from kvspec.reference.smt.reach import System
from kvspec.spec.registry import PAGED, SESSION

SESSION_SLOTS = 3
WIDTHS = [34, 15, 44, 9]

#: mutant name -> (the transition it replaces, the broken one)
PAGED_MUTANTS: dict[str, tuple[str, paged.Transition]] = {
    "seed-swap-out": ("swap_out", paged.seed_swap_out),
    "seed-extend-copy": ("extend", paged.seed_extend_copy),
}
SESSION_MUTANTS: dict[str, tuple[str, session.Transition]] = {
    "release-same-gen": ("release (finalize, reset)", session.release_without_bump),
}


def _verdict(proven: bool, unknown: bool) -> str:
    return "proven" if proven else ("unknown" if unknown else "counterexample")


def _bad(profile: str) -> Callable[[str, Any], Any]:
    """``bad`` for ``reach.violation``: the move's post-state breaks the profile's invariant."""
    import z3

    def bad(_t: str, mv: Any) -> z3.BoolRef:
        post = mv.post
        return z3.Not(
            paged.invariant(post, PagedBound()) if profile == PAGED else session.invariant(post, SESSION_SLOTS)
        )

    return bad


def write_counterexample(folder: Path, profile: str, mutant: str | None, timeout_s: float | None = None) -> None:
    """``--counterexamples``: the refuted row's trace from the initial state (or why there is none) as a text
    file ``folder/PROFILE-MUTANT.txt`` (allocator operations are no replay file: ``counterexamples.NOT_WIRE``)."""
    from kvspec.reference.smt import counterexamples as cx
    from kvspec.reference.smt.managers.reach import paged_system, session_system

    system: System[Any]
    if profile == PAGED:
        ptable: dict = dict(paged.TRANSITIONS)
        if mutant:
            ptable[PAGED_MUTANTS[mutant][0]] = PAGED_MUTANTS[mutant][1]
        system, inv, bound = paged_system(PagedBound(), ptable), "INV-PAGED-REFS", str(PagedBound())
    else:
        stable: dict = dict(session.TRANSITIONS)
        if mutant:
            stable[SESSION_MUTANTS[mutant][0]] = SESSION_MUTANTS[mutant][1]
        system, inv, bound = session_system(SESSION_SLOTS, stable), "INV-SESSION-FENCE", f"{SESSION_SLOTS} slots"
    replaced = (PAGED_MUTANTS if profile == PAGED else SESSION_MUTANTS)[mutant][0] if mutant else ""
    what = f"{replaced} replaced by a broken variant" if mutant else f"{inv} is broken"
    name = f"{profile}-{mutant or 'rules'}"
    print(f"counterexample of {profile} {mutant or 'rules as written'} ({inv}):")
    timeout_ms = int(timeout_s * 1000) if timeout_s else 30_000
    for line in cx.search_statement(
        folder, profile, name, system, _bad(profile), rule=inv, what=what, bound=bound, timeout_ms=timeout_ms
    ):
        print(line)


def _trace(profile: str, system: System[Any], inv: str) -> str:
    """Whether the broken invariant is broken on a trace from the initial state, or by induction only."""
    import z3

    from kvspec.reference.smt.reach import violation

    trace, verdict = violation(system, _bad(profile))
    if trace is not None:
        return f"reachable: from the initial state, {len(trace)} steps break {inv}:\n{trace.render('  ')}"
    why = "the solver gave up" if verdict == z3.unknown else f"no trace of up to {system.depth} steps breaks it"
    return f"induction only: from the initial state {why}; the counterexample's pre-state may be unreachable"


def run_manager(
    profile: str, mutant: str | None = None, timeout_s: float | None = None, counterexamples: Path | None = None
) -> int:
    """One allocator profile's rows; exit 1 on any failure (with ``mutant``: when it is caught). With
    ``counterexamples``, each refuted row's trace from the initial state, or why there is none, is
    written there (``write_counterexample``)."""
    from kvspec.reference.smt.managers.reach import paged_system, session_system
    from kvspec.reference.smt.reach import cover

    timeout_ms = int(timeout_s * 1000) if timeout_s else None
    problems: list[str] = []
    system: System[Any]
    if profile == PAGED:
        b = PagedBound()
        table: dict = dict(paged.TRANSITIONS)
        if mutant:
            name, broken = PAGED_MUTANTS[mutant]
            table[name] = broken
        inv, scope = "INV-PAGED-REFS", str(b)
        proofs, refuted = prove_paged(b, table, timeout_ms)
        system = paged_system(b, table)
        rows = [(p.transition, p.proven, p.unknown, p.seconds) for p in proofs]
        why = {p.reason for p in proofs if p.unknown}
        seeds = [(p.transition, p.proven, p.unknown, p.reason, p.seconds) for p in refuted]
    else:
        stable: dict = dict(session.TRANSITIONS)
        if mutant:
            name, sbroken = SESSION_MUTANTS[mutant]
            stable[name] = sbroken
        inv, scope = "INV-SESSION-FENCE", f"{SESSION_SLOTS} slots"
        sproofs, sbroken_proofs = prove_session(SESSION_SLOTS, stable, timeout_ms)
        system = session_system(SESSION_SLOTS, stable)
        rows = [(p.transition, p.proven, p.unknown, p.seconds) for p in sproofs]
        why = {p.reason for p in sproofs if p.unknown}
        seeds = [(p.transition, p.proven, p.unknown, p.reason, p.seconds) for p in sbroken_proofs]
    print(f"kvspec prove --profile {profile}: {inv}, every state of {scope}")
    if mutant:
        print(f"MUTANT {mutant}: {name} replaced by a broken variant")
    print(summary.header(["invariant", "result", "scope", "time"], WIDTHS))
    print(summary.header(["-" * w for w in WIDTHS], WIDTHS))

    def emit(cols: list[str]) -> None:
        print(summary.row(cols, WIDTHS), flush=True)

    failed = [n for n, proven, unknown, _ in rows if not proven and not unknown]
    unknown = [n for n, proven, unk, _ in rows if unk]
    verdict = "proven" if not failed and not unknown else ("counterexample" if failed else "unknown")
    if verdict == "unknown" and not all(not w or w.startswith("timeout") for w in why):
        verdict = f"unknown ({', '.join(sorted(why))})"
    emit([inv, verdict, scope, f"{sum(r[3] for r in rows):.2f}s"])
    problems += [f"{inv}: not preserved by {n}" for n in failed]
    t0 = time.perf_counter()
    cov = cover(system)
    found = cov.problems()
    emit(["REACHABLE", "ok" if not found else "FAILED", cov.summary(), f"{time.perf_counter() - t0:.2f}s"])
    problems += found
    if not mutant:
        for n, proven, unk, reason, secs in seeds:
            seed_verdict = "NOT REFUTED" if proven else f"unknown ({reason})" if unk else "refuted"
            emit([f"  refutes {n}", seed_verdict, inv, f"{secs:.2f}s"])
            if proven:
                problems.append(f"the broken transition {n!r} was not refuted: the encoding is vacuous")
        # MUTANTS-COVER: the profile's one row is the property some refuted seeded bug breaks
        lone = not any(not proven and not unk for _n, proven, unk, _r, _s in seeds)  # an unknown breaks nothing
        emit(
            [
                "MUTANTS-COVER",
                "ok" if not lone else "FAILED",
                f"no mutant breaks {inv}" if lone else "every row broken by a mutant",
                "",
            ]
        )
        if lone:
            problems.append(f"{inv}: no seeded bug (mutant) breaks it, so nothing shows the row can fail")
        if profile == SESSION:
            from kvspec.reference.smt.managers.session_progress import progress_rows

            problems += progress_rows(emit, SESSION_SLOTS)
    for n in failed:
        print(f"{inv}: counterexample at {n}")
    if failed:
        print(_trace(profile, system, inv))
    if counterexamples is not None:
        mutants: dict[str, tuple[str, Any]] = dict(PAGED_MUTANTS if profile == PAGED else SESSION_MUTANTS)
        seeded: dict[str, Any] = dict(paged.SEED_TRANSITIONS if profile == PAGED else session.BROKEN)
        # the refutes rows refuted (each a broken transition; the mutant is the one that puts it in place)
        done = {n for n, proven, unk, _r, _s in seeds if not proven and not unk}
        to_write = [m for m, (_n, tr) in mutants.items() if any(seeded[n] is tr for n in done)] if not mutant else []
        if mutant and failed:
            to_write = [mutant]
        if failed and not mutant:
            write_counterexample(counterexamples, profile, None, timeout_s)
        for m in to_write:
            write_counterexample(counterexamples, profile, m, timeout_s)
    for p in problems:
        print(f"sanity check failed: {p}")
    return 1 if problems else 0
