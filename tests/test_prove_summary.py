"""The per-profile summary lines of ``kvspec prove`` time each profile, not the run so far."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvspec.reference.smt.cli import summary


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    summary.reset()
    yield
    summary.reset()


def _burn() -> None:
    sum(i * i for i in range(300_000))


def test_a_profile_span_ends_when_the_next_profile_starts() -> None:
    first = summary.start("kvbm")
    _burn()
    summary.start("legacy")
    frozen = first.line()
    _burn()
    assert first.line() == frozen  # later work is not charged to kvbm
    assert first.cpu1 is not None and first.wall1 is not None


def test_only_the_last_profile_is_still_running() -> None:
    tallies = [summary.start(p) for p in ("kvbm", "legacy", "radix")]
    assert [t.cpu1 is None for t in tallies] == [False, False, True]
    assert summary.tallies() == tallies
