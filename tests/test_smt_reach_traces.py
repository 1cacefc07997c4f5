"""REACHABLE for the block profiles in ``kvspec prove``: recorded traces checked again, pinned.

The recorded traces reach every case of each recorded profile; a guard
narrowed after the recording (legacy's ``use(full)`` refusing every new
block, planted by monkeypatching the encoding) makes ``kvspec prove
--profile legacy`` fail, naming the transition and the case."""

from __future__ import annotations

import pytest
import z3

from kvspec.reference.smt import reach_recordings
from kvspec.reference.smt.blocks import legacy
from kvspec.reference.smt.blocks.encoding import BState, BStep
from kvspec.reference.smt.cli import prove as prove_cli


def _no_new(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    """legacy's use(full), narrowed: only a block already registered may be used."""
    step = legacy.use_full(S, i, tw)
    step.requires = [*step.requires, S.a["reg"][i["h"]]]
    return step


@pytest.mark.parametrize("key", ["kvbm-step", "legacy-step"])
def test_the_recorded_traces_reach_every_case(key: str) -> None:
    assert reach_recordings.recorded_for(key), reach_recordings.not_checked(key)
    chk = reach_recordings.check(key)
    assert chk.problems == []
    assert chk.reached == chk.goals > 0


def test_a_narrowed_guard_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(legacy.PROFILE.transitions, "use(full)", _no_new)
    chk = reach_recordings.check("legacy-step")
    named = [p for p in chk.problems if p.startswith("legacy step: use(full):")]
    assert named and "rule USE-NEW" in named[0]


@pytest.mark.slow
def test_a_narrowed_guard_fails_prove(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(legacy.PROFILE.transitions, "use(full)", _no_new)
    assert prove_cli.main(["--profile", "legacy"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("REACHABLE"))
    assert "FAILED" in row
    assert any("use(full)" in line and "rule USE-NEW" in line for line in out.splitlines() if "not reached" in line)
