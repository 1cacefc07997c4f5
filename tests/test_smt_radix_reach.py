"""op REACHABLE for radix: every operation, case and pair of operations from the empty cache.

``radix/op_reach.py`` makes each whole radix operation a transition; its
traces are recorded offline (``scripts/gen_reach_traces.py radix-operation``)
and ``kvspec prove --profile radix`` checks them again pinned. A contract that
every case of an operation survives (``SANITY-RADIX-OPS`` stays ok) but that
removes it from every reachable state fails the row, naming the operation
and the goal; so does a guard narrowed so that a case never happens."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import z3

from kvspec.reference.smt import reach_recordings
from kvspec.reference.smt.cli import radix as cli_radix
from kvspec.reference.smt.radix import op_reach
from kvspec.reference.smt.radix import operations as radix_operations
from kvspec.reference.smt.radix.encoding import RState
from kvspec.reference.smt.radix.operations import OpBound, OpTransition
from kvspec.reference.smt.radix.ops import sanity_ops
from kvspec.reference.smt.reach import cover

KEY = "radix-operation"
Make = Callable[[RState, OpBound, frozenset[str]], OpTransition]


def _with(name: str, extra: Callable[[RState, OpTransition], z3.BoolRef]) -> Make:
    """The operation ``name`` with one more requirement (a planted contract or narrowed guard)."""
    real = radix_operations.OPERATIONS[name]

    def narrowed(S: RState, b: OpBound, tw: frozenset[str]) -> OpTransition:
        op = real(S, b, tw)
        op.requires.append(extra(S, op))
        return op

    return narrowed


def _every_lock_held(S: RState, _op: OpTransition) -> z3.BoolRef:
    return z3.And(S.held)


def _nothing_cached(_S: RState, _op: OpTransition) -> z3.BoolRef:
    return z3.Int("i_got") == 0


def test_the_recorded_traces_reach_every_case_and_pair(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_radix.op_reach_row() == []
    line = capsys.readouterr().out.strip()
    # 6 operations, each enabled and with each other enabled (6 * 7), and their 32 named cases
    assert re.fullmatch(
        r"op REACHABLE +ok +74/74 cases reached in <= [1-6] steps \(recorded traces, pinned\) +\S+s", line
    )


def test_a_contract_every_case_survives_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """unlock only when every lock handle is held: each case of unlock is still satisfiable under
    the invariants, but an unlock never happens while a lock can be taken."""
    monkeypatch.setitem(radix_operations.OPERATIONS, "unlock", _with("unlock", _every_lock_held))
    assert sanity_ops(ops=("unlock",)) == []
    found = cli_radix.op_reach_row()
    named = [p for p in found if p.startswith("radix operation: unlock:")]
    assert named and "with lock enabled" in named[0]


@pytest.mark.slow
def test_the_search_again_leaves_only_the_pair_the_contract_removes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded traces of unlock's other goals held one lock, so they no longer fit either
    (the row says to record again if the change is meant); the search from the empty cache decides:
    only an unlock while a lock can be taken is gone (and a lock while one can be given back)."""
    monkeypatch.setitem(radix_operations.OPERATIONS, "unlock", _with("unlock", _every_lock_held))
    cov = cover(op_reach.system())
    assert sorted(cov.missing) == [("lock", "with unlock enabled"), ("unlock", "with lock enabled")]


def test_a_narrowed_guard_is_named_with_its_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """insert only of keys the tree has no page of: the case with everything cached is named."""
    monkeypatch.setitem(radix_operations.OPERATIONS, "insert", _with("insert", _nothing_cached))
    found = cli_radix.op_reach_row()
    named = [p for p in found if p.startswith("radix operation: insert:")]
    assert named and "case everything cached: no Stored" in named[0]


def test_a_missing_recording_fails_the_row(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rec = reach_recordings.RECORDINGS[KEY]
    monkeypatch.setitem(
        reach_recordings.RECORDINGS,
        KEY,
        reach_recordings.Recording(rec.system, tmp_path / "none.json", rec.key, rec.search),
    )
    assert cli_radix.op_reach_row() == [
        "radix operation: no recorded traces (python scripts/gen_reach_traces.py radix-operation)"
    ]


@pytest.mark.slow
def test_kvspec_prove_fails_on_the_contract(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(radix_operations.OPERATIONS, "unlock", _with("unlock", _every_lock_held))
    assert cli_radix.run_radix() == 1
    out = capsys.readouterr().out
    assert "SANITY-RADIX-OPS                      ok" in out
    assert "op REACHABLE                          FAILED" in out
    assert "sanity check failed: radix operation: unlock: not reached from the initial state" in out


def test_an_operation_mutant_gets_a_trace_from_the_empty_cache(tmp_path: Path) -> None:
    """``--counterexamples`` for an operation-only mutant: the operations searched from the empty
    cache with the mutant in force, to an insert whose Stored names the root as its parent."""
    cli_radix.write_counterexample(tmp_path, "op-stored-parent-none")
    text = (tmp_path / "radix-op-stored-parent-none.txt").read_text().splitlines()
    assert text[1].startswith("reachable: from the initial state (operations, 5 pages, 2 locks")
    assert text[1].endswith("steps, the last breaks OP-EVENTS:")
    steps = [ln.strip() for ln in text[2:-1]]
    # an insert under the root, then one under its page (the Stored's parent must be that page)
    assert [s.split("(")[0].split(". ")[1] for s in steps] == ["insert", "insert"]
    assert "i_got=0" in steps[0] and "i_got=0" not in steps[1]
    assert text[-1].startswith("not a replay file: radix operations")


def test_a_goal_z3_gives_up_on_is_unknown_not_unreached(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A timeout (a busy machine) on one goal makes the row unknown, counted as unknown: it does not
    fail the row as a narrowed guard would, and it is not counted as reached."""
    from kvspec.reference.smt import recorded, solving
    from kvspec.reference.smt.cli import summary

    real = solving.check
    gave_up: list[int] = []

    def first_goal_times_out(s: z3.Solver, *goal: z3.BoolRef, **kw: object) -> solving.Answer:
        if goal and not gave_up:
            gave_up.append(1)
            return solving.Answer(z3.unknown, reason="timeout after 30 s")
        return real(s, *goal, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(recorded.solving, "check", first_goal_times_out)
    summary.reset()
    tally = summary.start("radix")
    assert cli_radix.op_reach_row() == []
    line = capsys.readouterr().out.strip()
    assert re.match(r"op REACHABLE +unknown \(1 goals undecided: \S+: .+ \(timeout after 30 s\)\)", line), line
    assert "73/74 cases reached" in line
    assert (tally.held, tally.failed, tally.unknown) == (0, 0, 1)
    summary.reset()
