"""The witness scenarios under spec/scenarios/witnesses/ are what the encoding
says about their operations, and reach their targets.

Regenerating them (``kvspec witnesses``) runs the bounded search, which takes
minutes; these tests instead re-derive every expected value of each
checked-in file from its operations with the encoding (no search, no Python
model) and check that the file still says the same, and that each witness
shows what its name promises.
"""

from __future__ import annotations

import pytest

from kvspec.reference.router_view import RouterView
from kvspec.reference.smt.witnesses import WITNESSES, Witness, derive, path_of, universe_of, verify
from kvspec.spec.rules import RuleId
from kvspec.spec.scenario import Scenario, load_scenario


def _load(w: Witness) -> Scenario:
    path = path_of(w)
    assert path.exists(), f"{path} is missing: run `kvspec witnesses`"
    return load_scenario(path)


@pytest.mark.parametrize("w", WITNESSES, ids=[w.name for w in WITNESSES])
def test_expectations_are_the_encodings(w: Witness) -> None:
    s = _load(w)
    assert s.name == w.name and s.config == w.universe.config()
    derived = derive(universe_of(s), [step.op for step in s.steps])
    for i, (step, exp) in enumerate(zip(s.steps, derived, strict=True)):
        assert step.expect == exp, f"step {i} ({step.note}) is stale: run `kvspec witnesses`"


def test_verify_accepts_the_file_and_rejects_a_trace_that_misses_the_target() -> None:
    """What ``kvspec witnesses --check`` does, on the cheapest witness."""
    w = next(w for w in WITNESSES if w.name == "eviction_tie_unordered")
    s = _load(w)
    assert verify(w, s) == []
    cut = s.model_copy(update={"steps": s.steps[:-1]})  # no Tick after the tie: target not reached
    assert any("target" in p for p in verify(w, cut))


def _counters(s: Scenario, i: int) -> dict[str, int]:
    c = s.steps[i].expect.counters
    assert c is not None
    return c


def test_capacity_mid_batch_with_an_offload_pending() -> None:
    s = _load(next(w for w in WITNESSES if w.name == "capacity_mid_batch_quarantine_held"))
    i = next(i for i, st in enumerate(s.steps) if st.expect.status == "capacity")
    assert s.steps[i].expect.result == 1 and len(s.steps[i].op.blocks) == 2  # type: ignore[union-attr]
    assert _counters(s, i - 1)["quarantined_blocks"] >= 1 and _counters(s, i)["quarantined_blocks"] >= 1
    assert s.steps[-1].expect.status == "ok" and s.steps[-1].expect.result == 2


def test_blocked_mid_batch_with_an_offload_pending() -> None:
    s = _load(next(w for w in WITNESSES if w.name == "blocked_mid_batch_offload_pending"))
    i = max(i for i, st in enumerate(s.steps) if st.expect.status == "blocked_on_offload")
    assert s.steps[i].expect.result == 1
    assert _counters(s, i - 1)["quarantined_blocks"] >= 1
    assert _counters(s, i)["quarantined_blocks"] == _counters(s, i - 1)["quarantined_blocks"] + 1


def test_swapin_parent_eviction_breaks_the_anchor_for_a_router() -> None:
    """Fed to a router view, the witness's own expected events show the
    PARENT-ANCHOR break on the swap-in's registration, and nowhere before."""
    s = _load(next(w for w in WITNESSES if w.name == "swapin_parent_evicted_before_registration"))
    view = RouterView()
    flagged: list[int] = []
    for i, step in enumerate(s.steps):
        assert step.expect.events is not None
        if any(v.rule == RuleId.PARENT_ANCHOR for v in view.apply_batch(step.expect.events)):
            flagged.append(i)
    assert flagged == [len(s.steps) - 1]
    assert any(step.op.op == "swap_in" and step.expect.status == "scheduled" for step in s.steps)


def test_eviction_tie_leaves_the_victim_unchecked() -> None:
    s = _load(next(w for w in WITNESSES if w.name == "eviction_tie_unordered"))
    assert s.config.eviction == "unordered"
    i = next(i for i, st in enumerate(s.steps) if st.expect.status == "blocked_on_offload")
    assert _counters(s, i - 1)["inactive_blocks"] >= 2 and _counters(s, i - 1)["free_blocks"] == 0
    assert s.steps[i].expect.events is None and s.steps[i].expect.counters is not None
    assert s.steps[i - 1].expect.events is not None
