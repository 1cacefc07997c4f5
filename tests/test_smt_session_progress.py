"""session progress: PROGRESS-SESSION-ADMIT and its hypothesis LEMMA-SESSION-STAMPS
(reference/smt/managers/session_progress.py).

Both proven at the profile's bound; each way in has a state; the seeded bug is
refuted; without the lemma the argument fails; a park that does not advance
the clock breaks the lemma.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import z3

from kvspec.reference.smt.managers import session
from kvspec.reference.smt.managers import session_progress as P  # noqa: N812  (P for progress)

N = 3


def test_admission_progress_and_its_lemma_are_proven() -> None:
    assert P.prove_lemma(N).verdict == "proven"
    assert P.prove(N).verdict == "proven"


def test_each_way_in_has_a_state() -> None:
    assert P.sanity(N) == []


@pytest.mark.parametrize("bug", P.PROGRESS_BUGS, ids=[b.name for b in P.PROGRESS_BUGS])
def test_each_progress_bug_is_refuted(bug: P.SessionProgressBug) -> None:
    assert P.refute(bug, N) == "refuted"


def test_without_the_lemma_admission_is_not_proven(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(P, "lemma_stamps", lambda s, n: z3.BoolVal(True))
    assert P.prove(N).verdict == "refuted"


def test_a_park_that_keeps_the_clock_breaks_the_lemma() -> None:
    def park_same_tick(s: session.SState, n: int, t: str) -> tuple[session.SState, z3.BoolRef]:
        post, en = session.park(s, n, t)
        return replace(post, clock=s.clock), en

    table = {**session.TRANSITIONS, "park (finalize, keep)": park_same_tick}
    assert P.prove_lemma(N, transitions=table).verdict == "refuted"


def test_the_rows_printed() -> None:
    rows: list[list[str]] = []
    assert P.progress_rows(rows.append, N) == []
    verdicts = {c[0]: c[1] for c in rows}
    assert verdicts[P.LEMMA_ID] == "proven"
    assert verdicts[f"{P.PROGRESS_ID} (ranking)"] == "proven"
    assert verdicts["SANITY-PROGRESS"] == "ok"
    assert verdicts["  refutes cold-never-steals"] == "refuted"
