"""REACHABLE for the block profiles in ``kvspec prove``: recorded traces checked again, pinned.

The recorded traces reach every case of each recorded profile; a guard
narrowed after the recording (legacy's ``use(full)`` refusing every new
block; atomic's ``use(place full)`` that never evicts, planted by
monkeypatching the encoding) makes ``kvspec prove --profile legacy`` (and
``atomic``) fail, naming the transition and the case. atomic's two goals
listed as impossible are refuted by z3 over any state of the instance."""

from __future__ import annotations

import re

import pytest
import z3

from kvspec.reference.smt import reach_recordings
from kvspec.reference.smt.blocks import atomic, atomic_reach, legacy
from kvspec.reference.smt.blocks.catalogue import block_encoding
from kvspec.reference.smt.blocks.encoding import BState, BStep, ProfileEncoding, Transition
from kvspec.reference.smt.blocks.reach import system
from kvspec.reference.smt.cli import prove as prove_cli
from kvspec.reference.smt.cli.prove_output import ProveOutput


def _no_new(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    """legacy's use(full), narrowed: only a block already registered may be used."""
    step = legacy.use_full(S, i, tw)
    step.requires = [*step.requires, S.a["reg"][i["h"]]]
    return step


def _never_evicts(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    """atomic's use(place full), narrowed: a new block needs a free slot (no eviction)."""
    step = atomic.place_full(S, i, tw)
    step.requires = [*step.requires, z3.Or(S.a["reg"][i["h"]], S.v["free"] >= 1)]
    return step


@pytest.mark.parametrize("profile", ["kvbm", "legacy", "atomic"])
def test_the_recorded_traces_reach_every_case(profile: str, whole_prove: ProveOutput) -> None:
    """The REACHABLE row of ``kvspec prove --profile P`` (read from the whole ``kvspec prove``,
    tests/conftest.py ``whole_prove``): printed only where traces are recorded for ``P-step``, "ok"
    only without a problem, and its scope is ``reached/goals cases reached ...``
    (``recorded.Checked.summary``)."""
    assert reach_recordings.recorded_for(f"{profile}-step"), reach_recordings.not_checked(f"{profile}-step")
    rows = [ln for ln in whole_prove.section(profile).splitlines() if ln.startswith("REACHABLE ")]
    assert len(rows) == 1, whole_prove.section(profile)
    m = re.match(r"REACHABLE\s+ok\s+(\d+)/(\d+) cases reached in <= \d+ steps", rows[0])
    assert m, rows[0]
    assert int(m.group(1)) == int(m.group(2)) > 0


#: (profile encoding, transition narrowed, its narrowed step, the case the narrowing removes)
NARROWED = [
    pytest.param(legacy.PROFILE, "use(full)", _no_new, "rule USE-NEW", id="legacy"),
    pytest.param(atomic.PROFILE, "use(place full)", _never_evicts, "rule EVICT-POLICY", id="atomic"),
]


@pytest.mark.parametrize(("prof", "t", "narrowed", "case"), NARROWED)
def test_a_narrowed_guard_is_named(
    monkeypatch: pytest.MonkeyPatch, prof: ProfileEncoding, t: str, narrowed: Transition, case: str
) -> None:
    monkeypatch.setitem(prof.transitions, t, narrowed)
    chk = reach_recordings.check(f"{prof.name}-step")
    named = [p for p in chk.problems if p.startswith(f"{prof.name} step: {t}:")]
    assert named and case in named[0]


@pytest.mark.slow
@pytest.mark.parametrize(("prof", "t", "narrowed", "case"), NARROWED)
def test_a_narrowed_guard_fails_prove(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    prof: ProfileEncoding,
    t: str,
    narrowed: Transition,
    case: str,
) -> None:
    monkeypatch.setitem(prof.transitions, t, narrowed)
    assert prove_cli.main(["--profile", prof.name]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("REACHABLE"))
    assert "FAILED" in row
    assert any(f" {t}:" in line and case in line for line in out.splitlines() if "not reached" in line)


def test_the_impossible_atomic_goals_are_refuted_in_every_state() -> None:
    assert atomic_reach.never_reached(system(block_encoding("atomic"))) == []


def test_a_reachable_goal_listed_as_impossible_is_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = ("use(place full)", "with use(place partial) enabled")
    monkeypatch.setitem(atomic_reach.NEVER, wrong, "not so")
    assert atomic_reach.never_reached(system(block_encoding("atomic"))) == [wrong]
