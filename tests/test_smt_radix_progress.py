"""radix progress: PROGRESS-RADIX-EVICTABLE, the ranking argument of reference/smt/radix/progress.py.

Proven at the step bound; not vacuous (the premise holds, under a locked
parent too, and the eviction fires below the page and at the page); its
seeded bug is refuted; and the argument fails where it must (a locked page
is not evictable, so dropping "no lock" from the premise breaks it).
"""

from __future__ import annotations

import pytest
import z3

from kvspec.reference.smt.radix import progress as P  # noqa: N812  (P for progress, as the other progress tests)
from kvspec.reference.smt.radix.encoding import RadixBound, RState
from kvspec.reference.smt.radix.steps import DEFAULT_BOUND


def test_an_unlocked_page_is_evictable_at_the_bound() -> None:
    assert P.prove(DEFAULT_BOUND).verdict == "proven"


def test_the_premise_and_each_move_have_a_state() -> None:
    assert P.sanity(DEFAULT_BOUND) == []


@pytest.mark.parametrize("bug", P.PROGRESS_BUGS, ids=[b.name for b in P.PROGRESS_BUGS])
def test_each_progress_bug_is_refuted(bug: P.RadixProgressBug) -> None:
    assert P.refute(bug, DEFAULT_BOUND) == "refuted"


def test_a_locked_page_is_not_evictable(monkeypatch: pytest.MonkeyPatch) -> None:
    def live_only(S: RState, x: int) -> z3.BoolRef:
        return S.live[x]

    monkeypatch.setattr(P, "_premise", live_only)
    assert P.prove(DEFAULT_BOUND).verdict == "refuted"


def test_a_premise_nothing_satisfies_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(P, "_premise", lambda S, x: z3.And(S.live[x], S.lock[x] < 0))
    problems = P.sanity(RadixBound(3, 1))
    assert problems and problems[0] == f"radix {P.PROGRESS_ID}: no state of the universe has a live page without a lock"


def test_the_rows_printed() -> None:
    from kvspec.reference.smt.radix.progress_rows import progress_rows

    rows: list[list[str]] = []

    def emit(cols: list[str]) -> str:
        rows.append(cols)
        return "  ".join(cols)

    assert progress_rows(emit, DEFAULT_BOUND) == []
    verdicts = {c[0]: c[1] for c in rows}
    assert verdicts[f"{P.PROGRESS_ID} (ranking)"] == "proven"
    assert verdicts["SANITY-PROGRESS"] == "ok"
    assert verdicts["  refutes evict-parent-unlocked"] == "refuted"
