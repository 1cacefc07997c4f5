"""Legacy USE-VALIDATE follows its source: Dynamo mocker 1.0.2 takes the tail
of extra local hashes and reads token lists only for new blocks. kvspec's
stricter checks stay (a known break of the legacy profile), and the lockstep
sends the Uses that need them only to a port declaring ``strict_validation``,
so a port that behaves like the source passes the whole suite with no
declared deviation (``adapters/declared/legacy_source``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import kvspec.conformance as conformance_pkg
from kvspec.conformance.block.traffic import Traffic
from kvspec.reference.legacy import LegacyModel
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.profiles import LEGACY
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import FullBlock, Stored, Use

CFG = ManagerConfig(profile="legacy", capacity=4, block_size=2, eviction="lru")


def use(*seqs: int, local: list[int] | None = None, tokens: list[list[int]] | None = None) -> Use:
    return Use(
        blocks=[FullBlock(full=s) for s in seqs],
        local_hashes=[s * 10 for s in seqs] if local is None else local,
        plhs=[],
        token_ids=tokens,
    )


def source() -> LegacyModel:
    m = LegacyModel(CFG)
    m.source_validation = True
    return m


def test_extra_local_hashes_are_accepted_and_the_stored_takes_their_tail() -> None:
    m = source()
    m.apply(use(1))
    step = m.apply(use(1, 2, 3, local=[7, 8, 9, 10]))
    stored = step.events[-1]
    assert isinstance(stored.data, Stored)
    assert stored.hashes() == [2, 3]
    assert [b.tokens_hash for b in stored.data.stored.blocks] == [9, 10]  # the tail, as the source's publish_kv_event
    assert stored.data.stored.parent_hash == 1


@pytest.mark.parametrize(
    ("op", "why"),
    [
        (use(1, 2, 3, tokens=[[1, 2], [3, 4]]), "no token list at position 2"),
        (use(1, 2, 3, local=[10, 20]), "2 local hashes for 3 stored blocks"),
    ],
)
def test_what_the_source_panics_on_is_rejected_and_changes_nothing(op: Use, why: str) -> None:
    m = source()
    m.apply(use(4))
    before = m.fingerprint()
    with pytest.raises(InvalidOperation) as ei:
        m.apply(op)
    assert ei.value.rule == RuleId.USE_VALIDATE and why in ei.value.message
    assert m.fingerprint() == before


def test_the_token_list_of_a_hit_may_be_missing() -> None:
    m = source()
    m.apply(use(1, 2))
    step = m.apply(use(1, 2, tokens=[[1, 2]]))  # both hits: no list is read
    assert step.result.value is True and step.events == []


@pytest.mark.parametrize(
    "op", [use(1, 2, local=[10, 20, 30]), use(1, 2, tokens=[[1, 2]])], ids=["extra_local_hash", "short_token_lists"]
)
def test_the_spec_model_keeps_the_stricter_checks(op: Use) -> None:
    m = LegacyModel(CFG)
    with pytest.raises(InvalidOperation) as ei:
        m.apply(op)
    assert ei.value.rule == RuleId.USE_VALIDATE


def test_the_lockstep_sends_the_strict_only_uses_to_legacy_only_with_strict_validation() -> None:
    LEGACY_STRICT_ONLY = LEGACY.strict_only_uses  # noqa: N806 (the profile's declaration, spec/profiles.py)
    assert {"short_token_lists", "extra_local_hash"} == LEGACY_STRICT_ONLY
    assert set(Traffic(CFG, strict_validation=True).invalid_kinds) >= LEGACY_STRICT_ONLY
    assert not LEGACY_STRICT_ONLY & set(Traffic(CFG, strict_validation=False).invalid_kinds)
    kvbm = ManagerConfig(profile="kvbm", capacity=4)
    assert (
        set(Traffic(kvbm, strict_validation=False).invalid_kinds) >= LEGACY_STRICT_ONLY
    )  # kvbm's source checks counts


@pytest.mark.parametrize("effort", ["default", "ci"])
def test_a_port_like_the_source_passes_the_suite_with_no_declaration(
    effort: str, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    """The whole conformance suite against adapters/declared/legacy_source
    (its manifest declares no deviation): exit 0, nothing failed or xfailed,
    and the legacy lockstep ran."""
    suite = str(Path(conformance_pkg.__file__).parent)
    code, out = child_pytest(
        suite, "--impl=adapters/declared/legacy_source", f"--hypothesis-profile={effort}", "-v", "-p", "no:xdist"
    )
    assert code == 0, out[-3000:]
    assert " failed" not in out and "xfail" not in out.lower(), out[-3000:]
    assert "test_lockstep[legacy] PASSED" in out, out[-3000:]
