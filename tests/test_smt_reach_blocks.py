"""The block profiles' finite transition table for ``smt/reach.py`` (``blocks/reach.py``).

kvbm's STORE-NO-DUP needs 9 steps (10 for its ``use(close)``), where z3's
greedy search times out; a trace proposed from outside (the model-guided
stage) is pinned and checked against the encoding in well under a second.
A narrowed guard makes the same trace miss the case.
"""

from __future__ import annotations

import dataclasses

import z3

from kvspec.reference.smt.blocks import kvbm
from kvspec.reference.smt.blocks.encoding import BState, BStep, ProfileEncoding
from kvspec.reference.smt.blocks.reach import _ask, system
from kvspec.reference.smt.reach import ReachStep, ReachTrace

STORE_NO_DUP = [("use(full)", "rule STORE-NO-DUP"), ("use(close)", "rule STORE-NO-DUP")]


def _evict_then_rename() -> list[ReachStep]:
    """Two blocks used and released at capacity 2, then a Use of a third block and the first again."""

    def s(t: str, **k: int) -> ReachStep:
        return ReachStep(t, dict(k))

    return [
        s("use(begin)", p=-1),
        s("use(full)", h=0),
        s("use(full)", h=1),
        s("use(close)"),
        s("deref(full)", h=0),
        s("deref(full)", h=1),
        s("use(begin)", p=-1),
        s("use(full)", h=2),
        s("use(full)", h=0),
        s("use(close)"),
    ]


def test_a_pinned_trace_reaches_store_no_dup_in_the_encoding() -> None:
    reached: dict[tuple[str, str], ReachTrace] = {}
    _ask(system(kvbm.PROFILE, depth=1), _evict_then_rename(), 0, STORE_NO_DUP, reached)
    assert {g: len(t) for g, t in reached.items()} == {STORE_NO_DUP[0]: 9, STORE_NO_DUP[1]: 10}
    assert [st.transition for st in reached[STORE_NO_DUP[1]].steps][-2:] == ["use(full)", "use(close)"]


def _narrowed() -> ProfileEncoding:
    """kvbm whose ``use(full)`` refuses to register again a block the batch evicted (a planted narrowing)."""
    base = kvbm.PROFILE.transitions["use(full)"]

    def use_full(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
        step = base(S, i, tw)
        step.requires = [*step.requires, z3.Not(z3.And(z3.Not(S.a["reg"][i["h"]]), S.a["ev"][i["h"]]))]
        return step

    return dataclasses.replace(kvbm.PROFILE, transitions={**kvbm.PROFILE.transitions, "use(full)": use_full})


def test_a_narrowed_use_misses_store_no_dup_on_the_same_trace() -> None:
    reached: dict[tuple[str, str], ReachTrace] = {}
    _ask(system(_narrowed(), depth=1), _evict_then_rename(), 0, STORE_NO_DUP, reached)
    assert reached == {}


def test_the_greedy_search_names_a_case_a_narrowing_removes() -> None:
    """Depth 3 from the empty cache: a Use places a new block; narrowed away, the case is named."""
    from kvspec.reference.smt.reach import cover

    def no_new(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
        step = kvbm.use_full(S, i, tw)
        step.requires = [*step.requires, S.a["reg"][i["h"]]]
        return step

    narrowed = dataclasses.replace(kvbm.PROFILE, transitions={**kvbm.PROFILE.transitions, "use(full)": no_new})
    good = cover(dataclasses.replace(system(kvbm.PROFILE, depth=3), guide=None))
    bad = cover(dataclasses.replace(system(narrowed, depth=3), guide=None))
    assert ("use(full)", "rule USE-NEW") in good.reached
    assert ("use(full)", "rule USE-NEW") in bad.missing
    assert any("use(full)" in p and "rule USE-NEW" in p for p in bad.problems())
