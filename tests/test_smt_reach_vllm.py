"""REACHABLE for the vllm profile: every step, rule guard and pair of steps from the empty pool.

The step level (``vllm/copies.py``) is searched on every ``kvspec prove``;
the operation level (``vllm/ops.py``) is checked from recorded traces
(``smt/recorded.py``, recorded by ``scripts/gen_reach_traces.py``). A guard
narrowed by monkeypatching the encoding (an evict that only takes a hash's
last copy; a Use that never stores a second copy of a hash) makes the row
fail, naming the step and the rule."""

from __future__ import annotations

import re

import pytest
import z3

from kvspec.reference.smt import reach_recordings
from kvspec.reference.smt.cli import profiles
from kvspec.reference.smt.cli import prove as prove_cli
from kvspec.reference.smt.cli.prove_output import ProveOutput
from kvspec.reference.smt.reach import cover
from kvspec.reference.smt.vllm import copies, ops
from kvspec.reference.smt.vllm.reach import op_system, step_system


def _evict_last_only(S: copies.VState, tw: frozenset[str]) -> copies.VStep:
    """copies.evict, narrowed: only the last cached copy of a hash may go (REMOVE-COPY never fires)."""
    step = copies.evict(S, tw)
    b = z3.Const("in_b", copies.Block)
    step.requires = [*step.requires, S.ccnt[S.hsh[b]] == 1]
    return step


def _new_uncached_only(S: ops.VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> ops.VllmOpStep:
    """ops.new, narrowed: a fresh full block only for a hash with no cached copy (STORE-COPY never fires)."""
    step = ops.new(S, inp, tw)
    step.requires = [*step.requires, S.ccnt[inp["h"]] == 0]
    return step


def _reach_row(whole_prove: ProveOutput, label: str) -> tuple[int, int]:
    """The vllm profile's ``label`` row in the whole ``kvspec prove`` (tests/conftest.py
    ``whole_prove``; ``kvspec prove --profile vllm`` prints the same rows): it is "ok" (no problem
    found) and its scope says ``reached/goals cases reached ...``; return (reached, goals)."""
    rows = [ln for ln in whole_prove.section("vllm").splitlines() if re.match(rf"{label}\s{{2}}", ln)]
    assert len(rows) == 1, whole_prove.section("vllm")
    m = re.match(rf"{label}\s+ok\s+(\d+)/(\d+) cases reached in <= \d+ steps", rows[0])
    assert m, rows[0]
    return int(m.group(1)), int(m.group(2))


def test_the_recorded_operation_traces_reach_every_case() -> None:
    chk = reach_recordings.check("vllm-operation")
    assert chk.problems == []
    assert chk.reached == chk.goals > 40


def test_a_narrowed_operation_guard_fails_the_row(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(ops.TRANSITIONS, "use(new)", _new_uncached_only)
    found = profiles.vllm_reach_row("operation")
    row = capsys.readouterr().out.splitlines()[0]
    assert row.startswith("operation: REACHABLE") and "FAILED" in row
    named = [p for p in found if p.startswith("vllm operation: use(new):")]
    assert named and "rule STORE-COPY" in named[0]
    assert reach_recordings.check("vllm-operation", op_system()).problems == found


def test_a_narrowed_step_guard_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(copies.TRANSITIONS, "evict", _evict_last_only)
    cov = cover(step_system(depth=3))
    named = [p for p in cov.problems() if p.startswith("vllm step: evict:")]
    assert named and "rule REMOVE-COPY" in named[0]


def test_every_step_case_is_reached(whole_prove: ProveOutput) -> None:
    """The step-level row searches ``cover(step_system())`` (``cli/profiles.vllm_reach_row``)."""
    reached, _goals = _reach_row(whole_prove, "REACHABLE")
    assert reached > 60


@pytest.mark.slow
def test_a_narrowed_guard_fails_prove(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(copies.TRANSITIONS, "evict", _evict_last_only)
    assert prove_cli.main(["--profile", "vllm"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("REACHABLE"))
    assert "FAILED" in row
    assert any("evict:" in line and "rule REMOVE-COPY" in line for line in out.splitlines() if "not reached" in line)
