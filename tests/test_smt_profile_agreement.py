"""The kvbm, legacy and atomic encodings agree with the Python model on
sampled operations (every eviction policy), and a seeded encoding bug is
caught by that check (smt/profile_agreement.py)."""

from __future__ import annotations

import pytest

from kvspec.reference.smt.profile_agreement import POLICIES, run_agreement, steps_of
from kvspec.spec.wire import FullBlock, PartialBlock, Plh, Use


@pytest.mark.parametrize("profile", ["kvbm", "legacy", "atomic"])
def test_the_model_moves_as_the_encoding_allows(profile: str) -> None:
    r = run_agreement(profile, ops=30, seed=1)
    assert not r.mismatches, r.mismatches
    assert r.checked >= 10 * len(POLICIES[profile]) // 2, "too few operations accepted to mean anything"


@pytest.mark.parametrize(
    ("profile", "mutant"),
    [("kvbm", "evict-silent"), ("legacy", "ignores-capacity"), ("atomic", "no-pin"), ("atomic", "hit-keeps-group")],
)
def test_a_seeded_encoding_bug_is_caught(profile: str, mutant: str) -> None:
    # no-pin needs an inactive hit evicted by its own batch: rarer, so more operations
    r = run_agreement(profile, ops=60 if mutant == "no-pin" else 30, seed=1, tw=frozenset({mutant}))
    assert r.mismatches, f"the {mutant} encoding bug went unnoticed in {r.checked} operations"


def test_an_atomic_use_that_failed_its_check_stops_at_the_check() -> None:
    op = Use(blocks=[FullBlock(full=1), PartialBlock(partial="u0")], plhs=[Plh(hash=1, position=1)], local_hashes=[101])
    names = [n for n, _ in steps_of("atomic", op, 0)]
    assert names == ["use(begin)", "use(declare full)", "use(declare partial)", "use(check)"]
    names = [n for n, _ in steps_of("atomic", op, 2)]
    assert names[-3:] == ["use(place full)", "use(place partial)", "use(close)"]
