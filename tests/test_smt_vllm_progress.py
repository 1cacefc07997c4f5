"""vllm progress for any pool: the ranking arguments of reference/smt/vllm/progress.py.

Each property is proven over the vllm operation encoding (any pool, any
hashes); it is not vacuous (its premise and each move hold in a finite pool
satisfying every invariant); each seeded progress bug, an extra guard that no
invariant row sees, is refuted by a finite pool where no instance of the
moves lowers the rank; and the proof fails when a needed move is missing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import z3

from kvspec.reference.smt.vllm import progress as P  # noqa: N812  (P for progress, as tests/test_smt_progress.py)
from kvspec.spec.rules import rule


@pytest.mark.parametrize("r", P.RANKINGS, ids=[str(r.id) for r in P.RANKINGS])
def test_each_progress_property_is_proven_for_any_pool(r: P.VllmRanking) -> None:
    assert rule(r.id).id == r.id  # a rule of SPEC.md
    assert P.prove(r, timeout_ms=120_000).verdict == "proven"


@pytest.mark.parametrize("r", P.RANKINGS, ids=[str(r.id) for r in P.RANKINGS])
def test_each_property_has_a_finite_pool_where_every_move_fires(r: P.VllmRanking) -> None:
    assert P.sanity(r) == []


def test_without_the_moves_into_unowned_copies_use_fits_is_not_proven() -> None:
    r = P.by_id("PROGRESS-USE-FITS")
    # moves 2 and 4 place a fresh block in an unowned copy (none free): a full pool needs them
    partial = replace(r, moves=[m for i, m in enumerate(r.moves) if i not in (2, 4)])
    assert P.prove(partial, timeout_ms=20_000).verdict != "proven"


def test_without_the_premise_fits_use_fits_is_not_proven() -> None:
    r = P.by_id("PROGRESS-USE-FITS")
    loose = replace(r, premise=lambda S, p: [f for i, f in enumerate(r.premise(S, p)) if i != 1])
    assert P.prove(loose, timeout_ms=20_000).verdict != "proven"


def test_without_deref_promoted_no_deadlock_fails() -> None:
    r = P.by_id("PROGRESS-NO-DEADLOCK")
    # a promoted block held by its uuid only is released by deref(promoted) alone: without it a
    # finite pool has a held block and no release of it
    clean = P.VllmProgressBug("no-bug", "DEREF-OWNER", r.id, "no change", lambda name, S: [])
    assert P.refute_finite(clean) == "not refuted"
    assert P.refute_finite(clean, replace(r, moves=r.moves[:2])) == "refuted"


def test_a_move_that_never_fires_is_reported() -> None:
    r = P.by_id("PROGRESS-NO-DEADLOCK")
    name, _when, inputs = r.moves[0]
    dead = replace(r, moves=[*r.moves, (name, lambda S, p: z3.BoolVal(False), inputs)])
    assert P.sanity(dead) == [f"vllm {r.id}: the move {name} (#{len(r.moves)}) is not shown to fire"]


def test_a_premise_nothing_satisfies_is_reported() -> None:
    r = P.by_id("PROGRESS-USE-FITS")
    impossible = replace(r, premise=lambda S, p: [*r.premise(S, p), z3.BoolVal(False)])
    assert P.sanity(impossible)[0] == f"vllm {r.id}: no finite pool satisfies the hypothesis and the premise"


@pytest.mark.parametrize("bug", P.PROGRESS_BUGS, ids=[b.name for b in P.PROGRESS_BUGS])
def test_each_progress_bug_is_refuted(bug: P.VllmProgressBug) -> None:
    assert rule(bug.rule).id == bug.rule
    assert P.refute_finite(bug) == "refuted"


@pytest.mark.parametrize("bug", P.PROGRESS_BUGS, ids=[b.name for b in P.PROGRESS_BUGS])
def test_without_the_bug_the_finite_refutation_finds_nothing(bug: P.VllmProgressBug) -> None:
    clean = P.VllmProgressBug("no-bug", bug.rule, bug.expect, "no change", lambda name, S: [])
    assert P.refute_finite(clean) == "not refuted"


def test_the_rows_printed(capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.reference.smt.vllm.progress_rows import progress_rows

    rows: list[list[str]] = []

    def emit(cols: list[str]) -> str:
        rows.append(cols)
        return "  ".join(cols)

    assert progress_rows(emit) == []
    verdicts = {c[0]: c[1] for c in rows}
    for r in P.RANKINGS:
        assert verdicts[f"{r.id} (ranking)"] == "unbounded proven"
    assert verdicts["SANITY-PROGRESS"] == "ok"
    for b in P.PROGRESS_BUGS:
        assert verdicts[f"  refutes {b.name}"] == "refuted"
