"""The allocator-level rows of ``kvspec prove``: ``INV-PAGED-REFS`` and ``INV-SESSION-FENCE``.

Each invariant is proven per transition (``smt/paged.py``, ``smt/session.py``);
one row per invariant says whether every transition preserves it, and one row
per deliberately broken transition (the ferrum seed's swap-out and its
copy in extend; a release that keeps the generation) says whether z3 refuted it,
as it must: a broken transition that is "proven" means the encoding checks
nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from kvspec.reference.smt.managers.paged import PagedBound, prove_paged
from kvspec.reference.smt.managers.session import prove_session

SESSION_SLOTS = 3


def prove_managers(emit: Callable[[list[str]], None], only: str | None = None) -> list[str]:
    """Print the rows through ``emit([id, result, bound, time])``; return the
    problems found. ``only``: "paged" or "session" (``kvspec prove --profile``)."""
    problems: list[str] = []
    rows: list[tuple[str, str, list[tuple[str, bool, float, str | None]]]] = []
    seed: list = []
    s_broken: list = []
    if only in (None, "paged"):
        bound = PagedBound()
        ok, seed = prove_paged(bound)
        rows.append(("INV-PAGED-REFS", str(bound), [(p.transition, p.proven, p.seconds, p.counterexample) for p in ok]))
    if only in (None, "session"):
        s_ok, s_broken = prove_session(SESSION_SLOTS)
        rows.append(
            ("INV-SESSION-FENCE", f"{SESSION_SLOTS} slots", [(p.transition, p.proven, p.seconds, None) for p in s_ok])
        )
    for inv, where, proofs in rows:
        failed = [name for name, proven, _, _ in proofs if not proven]
        emit([inv, "proven" if not failed else "COUNTEREXAMPLE", where, f"{sum(p[2] for p in proofs):.2f}s"])
        problems += [f"{inv}: not preserved by {name}" for name in failed]
    refuted = [(p.transition, p.proven, p.seconds) for p in seed] + [
        (p.transition, p.proven, p.seconds) for p in s_broken
    ]
    for name, proven, secs in refuted:
        emit([f"  refutes {name}", "refuted" if not proven else "NOT REFUTED", "", f"{secs:.2f}s"])
        if proven:
            problems.append(f"the broken transition {name!r} was not refuted: the encoding is vacuous")
    return problems
