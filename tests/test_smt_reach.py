"""Vacuity by construction (``reference/smt/reach.py``): every case of every
transition happens on a trace from the initial state, so a narrowed guard or
an added contract fails ``kvspec prove``, naming the transition and the case."""

from __future__ import annotations

import dataclasses

import pytest
import z3

from kvspec.reference.smt.cli.prove import main
from kvspec.reference.smt.managers import paged, session
from kvspec.reference.smt.managers.reach import paged_system, session_system
from kvspec.reference.smt.radix.reach import system as radix_system
from kvspec.reference.smt.reach import cover, violation


def _never_enabled(s: paged.PState, b: paged.PagedBound, t: str) -> tuple[paged.PState, z3.BoolRef]:
    post, en = paged.swap_in(s, b, t)
    return post, z3.And(en, z3.BoolVal(False))


def test_every_case_of_the_small_encodings_is_reached() -> None:
    for system in (paged_system(), session_system(), radix_system()):
        cov = cover(system)
        assert cov.problems() == [], system.profile
        assert cov.reached and len(cov.reached) == cov.goals


def test_a_paged_swap_in_never_enabled_is_named() -> None:
    cov = cover(paged_system(transitions={**paged.TRANSITIONS, "swap_in": _never_enabled}))
    assert ("swap_in", "enabled") in cov.missing
    assert any(
        p.startswith("paged operation: swap_in: not reached from the initial state") and ": enabled;" in p
        for p in cov.problems()
    )


def test_kvspec_prove_fails_on_a_paged_swap_in_never_enabled(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """INV-PAGED-REFS is still "proven" (a transition never enabled keeps anything), but the run fails."""
    monkeypatch.setitem(paged.TRANSITIONS, "swap_in", _never_enabled)
    assert main(["--profile", "paged"]) == 1
    out = capsys.readouterr().out
    assert any(ln.startswith("INV-PAGED-REFS") and " proven " in ln for ln in out.splitlines())
    assert any(ln.startswith("REACHABLE") and "FAILED" in ln for ln in out.splitlines())
    assert "swap_in: not reached from the initial state within 6 steps" in out and ": enabled;" in out


def test_a_session_release_narrowed_to_leased_slots_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def leased_only(s: session.SState, n: int, t: str) -> tuple[session.SState, z3.BoolRef]:
        post, en = session.release(s, n, t)
        k = z3.Int(f"{t}k")
        return post, z3.And(en, session._at(s.st, k) == session.LEASED)

    cov = cover(session_system(transitions={**session.TRANSITIONS, "release (finalize, reset)": leased_only}))
    assert cov.missing == [("release (finalize, reset)", "case an idle slot")]


def test_a_goal_listed_as_impossible_that_is_reached_is_reported() -> None:
    system = dataclasses.replace(paged_system(), never={("swap_out", "enabled"): "a wrong claim"})
    cov = cover(system)
    assert ("swap_out", "enabled") in cov.stale
    assert any("listed as impossible (a wrong claim) but is reached" in p for p in cov.problems())


def test_a_phase_table_that_lies_is_reported() -> None:
    phases = {**paged_system().phases, "swap_in": frozenset({paged_system().phases["extend"].__iter__().__next__()})}
    cov = cover(dataclasses.replace(paged_system(), phases=phases))
    assert any("swap_in can be enabled outside its phases" in p for p in cov.problems())


def test_a_violation_is_a_trace_from_the_initial_state() -> None:
    """The seed's swap-out breaks INV-PAGED-REFS on a real trace: allocate, then swap out."""
    b = paged.PagedBound()
    system = paged_system(b, {**paged.TRANSITIONS, "swap_out": paged.seed_swap_out})
    trace, _ = violation(system, lambda _t, mv: z3.Not(paged.invariant(mv.post, b)))
    assert trace is not None
    assert [s.transition for s in trace.steps][-1] == "swap_out"
    assert trace.steps[0].transition == "allocate"


def test_an_unreachable_violation_has_no_trace() -> None:
    """INV-SESSION-FENCE holds: no trace of the correct rules breaks it."""
    trace, verdict = violation(session_system(), lambda _t, mv: z3.Not(session.invariant(mv.post, 3)))
    assert trace is None and verdict == z3.unsat
