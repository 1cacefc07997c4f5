"""EQUIV-PAGED and EQUIV-SESSION: the allocator encodings and their models, both ways.

The paged and session encodings were proven inductive and sampled for
reachability, but nothing compared them with ``reference/paged.py`` and
``reference/session.py``. Here: equal at a small depth, the whole bound
closed (slow tier), and each seeded encoding mutant and model bug caught,
on the side it should be (an encoding that allows more, or less).
"""

from __future__ import annotations

import pytest

from kvspec.reference.smt.cli.equivalence import main as equivalence_main
from kvspec.reference.smt.equivalence import explore
from kvspec.reference.smt.managers.paged_equivalence import CowLeaksOriginal, PagedSubject
from kvspec.reference.smt.managers.session_equivalence import ParkKeepsOrder, SessionSubject


def test_paged_equal_at_depth_3() -> None:
    rep = explore(PagedSubject(), 3)
    assert rep.equal and rep.complete, [d.render() for d in rep.differences]
    assert rep.states >= 40 and rep.outcomes > 100


def test_session_equal_at_depth_3() -> None:
    rep = explore(SessionSubject(), 3)
    assert rep.equal and rep.complete, [d.render() for d in rep.differences]
    assert rep.states >= 20 and rep.outcomes > 100


@pytest.mark.slow
@pytest.mark.parametrize(("subject", "depth"), [(PagedSubject, 8), (SessionSubject, 6)])
def test_the_whole_bound_is_equal_and_closed(subject: type, depth: int) -> None:
    """At the CLI's depths the walk reaches every state of the bound: nothing one more operation reaches is new."""
    rep = explore(subject(), depth)
    assert rep.equal and rep.closed, [d.render() for d in rep.differences]


@pytest.mark.parametrize(
    ("mutant", "depth", "side"),
    [
        ("fork-shares-all", 2, "both"),  # a fork of 0 blocks shares every block
        ("cow-copies-unshared", 2, "model"),  # nothing free to copy into: the encoding refuses
        ("seed-swap-out", 2, "both"),
        ("seed-extend-copy", 2, "both"),
    ],
)
def test_paged_mutants_differ(mutant: str, depth: int, side: str) -> None:
    rep = explore(PagedSubject(mutant=mutant), depth)
    assert rep.differences, mutant
    d = rep.differences[0]
    assert bool(d.only_model) == (side in ("model", "both")) and bool(d.only_encoding) == (side == "both")


@pytest.mark.parametrize(
    ("mutant", "depth", "side"),
    [
        ("steal-most-recent", 5, "both"),
        ("warm-ignores-flag", 3, "encoding"),  # a cold admission may also resume warm
        ("release-same-gen", 2, "both"),
    ],
)
def test_session_mutants_differ(mutant: str, depth: int, side: str) -> None:
    rep = explore(SessionSubject(mutant=mutant), depth)
    assert rep.differences, mutant
    d = rep.differences[0]
    assert bool(d.only_encoding) == (side in ("encoding", "both")) and bool(d.only_model) == (side == "both")


def test_model_bugs_are_caught() -> None:
    paged = explore(PagedSubject(model_class=CowLeaksOriginal), 3)
    assert paged.differences and "PagedWrite" in repr(paged.differences[0].op)
    session = explore(SessionSubject(model_class=ParkKeepsOrder), 5)
    assert session.differences and "SessionFinalize" in repr(session.differences[0].op)


def test_cli_rows_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    # depth 1: the CLI's rows and exit status (the walks themselves, deeper: the depth-3 tests above;
    # at depth 2 this test's two walks cost 4.3 s of CPU)
    assert equivalence_main(["--profile", "paged", "--profile", "session", "--depth", "1"]) == 0
    out = capsys.readouterr().out
    assert "EQUIV-PAGED    equal" in out and "EQUIV-SESSION  equal" in out
    assert equivalence_main(["--profile", "session", "--depth", "3", "--mutant", "warm-ignores-flag"]) == 1
    assert equivalence_main(["--profile", "paged", "--model-bug", "park-keeps-order"]) == 2
