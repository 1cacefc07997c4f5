"""The kvbm, legacy and atomic encodings agree with the Python model on
sampled operations (every eviction policy), and every seeded encoding bug is
caught by that check (smt/profile_agreement.py): each profile's rule mutants
(but the one that only drops a caller contract) and its encoding mutants
(smt/profile_encoding_mutants.py), which together change every kind of step
the profile encodes."""

from __future__ import annotations

import pytest

from kvspec.reference.smt.blocks.agreement import (
    _plh,
    _use,
    agreement_mutants,
    changed_steps,
    policies,
    replay,
    run_agreement,
    steps_of,
)
from kvspec.reference.smt.blocks.catalogue import block_encoding
from kvspec.spec.wire import Deref, FullBlock, Operation, PartialBlock, Plh, Promote, Use

PROFILES = ("kvbm", "legacy", "atomic")
#: the budget: sampled operations per policy (legacy has one policy); kill rates over 10 seeds:
#: benchmarks/profile_agreement_kills.py
OPS = {"kvbm": 50, "atomic": 50, "legacy": 100}
#: the steps that carry no state of their own to get wrong (they only open the batch)
#: steps with no state change of their own: ``use(begin)`` only enters the batch, legacy's
#: ``use(validate partial)`` is a guard (the model refuses the Use). A bug there lets the encoding
#: move where the model refuses, which this one-way check cannot see: ``GUARD_MUTANTS`` and
#: ``tests/test_smt_equivalence.py`` (the exhaustive check, both ways) cover them
STATELESS = {"kvbm": {"use(begin)"}, "legacy": {"use(begin)", "use(validate partial)"}, "atomic": set()}


@pytest.mark.parametrize("profile", PROFILES)
def test_the_model_moves_as_the_encoding_allows(profile: str) -> None:
    r = run_agreement(profile, ops=OPS[profile], seed=1)
    assert not r.mismatches, r.mismatches
    assert r.checked >= 10 * len(policies(profile)) // 2, "too few operations accepted to mean anything"


@pytest.mark.parametrize(
    ("profile", "mutant"), [(p, m) for p in PROFILES for m in agreement_mutants(p)], ids=lambda x: str(x)
)
def test_each_seeded_encoding_bug_is_caught(profile: str, mutant: str) -> None:
    """Every seeded bug, by sampled traffic (kill rates over seeds 0-9:
    benchmarks/profile_agreement_kills.py); the two that
    need an aimed state (``_aimed``) are also pinned by scenarios below."""
    r = run_agreement(profile, ops=OPS[profile], seed=1, mutant=mutant, first=True)
    assert r.mismatches, f"the {mutant} encoding bug went unnoticed in {r.checked} operations"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_kind_of_step_has_a_seeded_bug(profile: str) -> None:
    prof = block_encoding(profile)
    covered = {s for m in agreement_mutants(profile) for s in changed_steps(profile, m)}
    expected = set(prof.transitions) - set(prof.unreachable) - STATELESS[profile]
    assert expected <= covered, f"no seeded encoding bug changes {sorted(expected - covered)}"


def _f(*hs: int) -> list[FullBlock | PartialBlock]:
    return [FullBlock(full=h) for h in hs]


def test_removed_announced_only_is_caught_on_its_scenario() -> None:
    """kvbm, 2 slots, LRU: 0 is evicted and registered again by one Use (left
    unannounced), released, then evicted and registered again by another Use,
    whose Removed must name it. The end state is the same whichever inactive
    block the encoding evicts, so only the Removed comparison sees the bug."""
    ops: list[Operation] = [
        _use(_f(0, 1)),
        Deref(blocks=_f(0, 1)),
        _use(_f(2, 0, 1)),  # 2 evicts 0, 0 evicts 1 and comes back unannounced, 1 finds no room
        Deref(blocks=_f(0)),
        Deref(blocks=_f(2)),
        _use(_f(3, 0, 2)),  # 3 evicts the unannounced 0, which comes back in 2's slot
    ]
    assert replay("kvbm", 2, "lru", ops) == (len(ops), [])
    checked, bad = replay("kvbm", 2, "lru", ops, "removed-announced-only")
    assert len(bad) == 1 and "F3" in bad[0] and checked == len(ops)


@pytest.mark.parametrize("profile", PROFILES)
def test_promote_existing_no_owner_is_caught_on_its_scenario(profile: str) -> None:
    """A held partial promoted onto a registered block: the block gains an owner
    (uniform traffic rarely promoted a held partial onto a registered hash:
    ``_aimed`` now does)."""
    ops: list[Operation] = [
        _use([PartialBlock(partial="u0")]),
        _use(_f(0)),
        Promote(uuid="u0", seq_hash=0, parent_hash=None, local_hash=100, plh=_plh(0)),
    ]
    assert replay(profile, 3, "lru", ops) == (3, [])
    _checked, bad = replay(profile, 3, "lru", ops, "promote-existing-no-owner")
    assert len(bad) == 1 and "promote" in bad[0]


def test_the_contract_mutant_is_not_an_agreement_target() -> None:
    """contract-dropped widens what the caller may do, not what the encoding
    does with the model's operations: the model stays inside it."""
    assert "contract-dropped" in block_encoding("atomic").mutants
    assert "contract-dropped" not in agreement_mutants("atomic")


def test_an_atomic_use_that_failed_its_check_stops_at_the_check() -> None:
    op = Use(blocks=[FullBlock(full=1), PartialBlock(partial="u0")], plhs=[Plh(hash=1, position=1)], local_hashes=[101])
    names = [n for n, _ in steps_of("atomic", op, 0)]
    assert names == ["use(begin)", "use(declare full)", "use(declare partial)", "use(check)"]
    names = [n for n, _ in steps_of("atomic", op, 2)]
    assert names[-3:] == ["use(place full)", "use(place partial)", "use(close)"]
