"""Progress for any size: the ranking arguments of reference/smt/unbounded/progress.py.

Each property is proven over the unbounded kvbm-offload encoding (any number
of slots and hashes); it is not vacuous (its premise and each of its moves
hold in a finite state satisfying every invariant); each one's seeded bug,
which leaves every INV-* proven, is refuted by a finite state where no
instance of the moves lowers the rank; and a move that never fires, or a
premise that nothing satisfies, is reported by the sanity check.
"""

from __future__ import annotations

import pytest
import z3

from kvspec.reference.smt.unbounded import encoding as U  # noqa: N812  (U for unbounded, as in the module's notation)
from kvspec.reference.smt.unbounded import progress as P  # noqa: N812  (P for progress)
from kvspec.spec.rules import rule


@pytest.mark.parametrize("r", P.RANKINGS, ids=[str(r.id) for r in P.RANKINGS])
def test_each_progress_property_is_proven_for_any_size(r: P.Ranking) -> None:
    assert rule(r.id).id == r.id  # a rule of SPEC.md
    res = P.prove(r, timeout_ms=120_000)
    assert res.verdict == "proven", res


@pytest.mark.parametrize("r", P.RANKINGS, ids=[str(r.id) for r in P.RANKINGS])
def test_each_progress_property_has_finite_models_where_every_move_fires(r: P.Ranking) -> None:
    assert P.sanity(r) == []


def test_a_move_that_never_fires_is_reported() -> None:
    r = P.by_id("PROGRESS-QUARANTINE")
    dead = ("offload_complete", lambda S, p: z3.BoolVal(False), r.moves[0][2])
    broken = P.Ranking(r.id, r.counts, r.rank, [*r.moves, dead])
    assert P.sanity(broken) == [f"{r.id}: the move offload_complete is not shown to fire (unsat)"]


def test_a_premise_nothing_satisfies_is_reported() -> None:
    r = P.by_id("PROGRESS-QUARANTINE")
    impossible = P.Ranking(r.id, r.counts, lambda S: z3.IntVal(0) * S.n, r.moves)
    problems = P.sanity(impossible)
    assert problems[0].startswith(f"{r.id}: no finite state with work pending")


@pytest.mark.parametrize("bug", P.PROGRESS_BUGS, ids=[b.name for b in P.PROGRESS_BUGS])
def test_each_progress_bug_is_refuted_and_invisible_to_the_invariants(bug: P.ProgressBug) -> None:
    assert P.refute_finite(bug) == "refuted"
    # the bug leaves every INV-* and LEMMA-* proven: only the progress row sees it
    bad = [r.property_id for r in U.prove_unbounded(tw=frozenset({bug.name}), timeout_ms=120_000) if not r.proven]
    assert bad == []


def test_without_the_bug_the_finite_refutation_finds_nothing() -> None:
    bug = P.PROGRESS_BUGS[0]
    clean = P.ProgressBug("no-such-tweak", bug.rule, bug.expect, "no change")
    assert P.refute_finite(clean) == "not refuted"


def test_cli_prints_the_progress_rows(capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.reference.smt.cli.prove import main

    assert main(["--unbounded", "--invariant", "PROGRESS-QUARANTINE", "--invariant", "PROGRESS-NO-DEADLOCK"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for pid in ("PROGRESS-QUARANTINE", "PROGRESS-NO-DEADLOCK"):
        assert any(ln.startswith(f"{pid} (ranking)") and "unbounded proven" in ln for ln in lines), pid
    assert any(ln.startswith("SANITY-PROGRESS") and " ok " in ln for ln in lines)
    for b in P.PROGRESS_BUGS:
        assert any(ln.strip().startswith(f"refutes {b.name}") and "refuted" in ln for ln in lines), b.name


def test_cli_refuses_an_unknown_progress_id(capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.reference.smt.cli.prove import main

    assert main(["--unbounded", "--invariant", "PROGRESS-NOTHING"]) == 2
    assert "PROGRESS-QUARANTINE" in capsys.readouterr().err
