"""Semantics options: the config table, what adapters declare, the shared link.

The options themselves (spec/config.py ``SEMANTICS``) are exercised by the
offload goldens pinned to each value; these tests cover the machinery: an
adapter that names no option supports only the legacy values, manifests
reject unknown options and values, goldens are skipped (with the option
named) where an adapter lacks a value, the lockstep draws only declared
values, and the processor-sharing link times transfers as Dynamo's model.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kvspec.conformance.block.machine import MachineSetup, machine_class
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.conformance.test_golden import _skip_reason
from kvspec.reference.offload_link import SharedLink
from kvspec.spec.config import SEMANTICS, ManagerConfig, OffloadConfig
from kvspec.spec.manifest import Capabilities
from kvspec.spec.scenario import SCENARIO_DIR, load_scenario

REF_DIR = resolve_adapter_dir("adapters/reference")
REF = load_manifest(REF_DIR)


def test_defaults_are_dynamo_and_legacy_is_the_old_behaviour() -> None:
    off = OffloadConfig(num_g2_blocks=1)
    assert off.options() == {n: o.default for n, o in SEMANTICS.items()}
    assert off.options() == {
        "link": "shared",
        "g2_eviction": "lineage",
        "g2_allocation": "at_start",
        "dedup": "filter",
        "tick_result": "none",
        "lower_tier_events": "none",
    }
    legacy = OffloadConfig.legacy(num_g2_blocks=1)
    assert legacy.options() == {
        "link": "fifo",
        "g2_eviction": "lru",
        "g2_allocation": "at_completion",
        "dedup": "resend",
        "tick_result": "transfers",
        "lower_tier_events": "none",
    }
    assert OffloadConfig.legacy(num_g2_blocks=1, link="shared").link == "shared"


def test_an_adapter_that_names_no_option_supports_only_the_legacy_values() -> None:
    caps = Capabilities()
    for name, opt in SEMANTICS.items():
        assert caps.supports(name, opt.legacy)
        # lower_tier_events: Dynamo's default is also what kvspec had (no G3/G4 events)
        assert caps.supports(name, opt.default) == (opt.default == opt.legacy)
        assert caps.supported(name) == [opt.legacy]
    both = Capabilities(semantics={"link": ["fifo", "shared"]})
    assert both.supported("link") == ["shared", "fifo"]  # Dynamo's default first
    assert both.supports("dedup", "resend") and not both.supports("dedup", "filter")


@pytest.mark.parametrize(
    ("semantics", "needle"),
    [
        ({"linkk": ["fifo"]}, "unknown semantics option 'linkk'"),
        ({"link": ["serial"]}, "takes values from ['shared', 'fifo']"),
        ({"dedup": []}, "takes values from"),
    ],
)
def test_manifest_rejects_unknown_options_and_values(semantics: dict[str, list[str]], needle: str) -> None:
    with pytest.raises(ValidationError) as e:
        Capabilities(semantics=semantics)
    assert needle in str(e.value)


def test_golden_with_options_the_adapter_lacks_is_skipped_naming_them() -> None:
    dynamo = load_scenario(SCENARIO_DIR / "offload" / "shared_link_one_transfer_per_use.json")
    legacy = load_scenario(SCENARIO_DIR / "offload" / "offload_link_is_fifo.json")
    old = REF.model_copy(update={"capabilities": REF.capabilities.model_copy(update={"semantics": {}})})
    reason = _skip_reason(old, dynamo, dynamo.config)
    assert reason is not None and "semantics:link=shared" in reason
    assert _skip_reason(old, legacy, legacy.config) is None
    assert _skip_reason(REF, dynamo, dynamo.config) is None and _skip_reason(REF, legacy, legacy.config) is None


def _configure(manifest_semantics: dict[str, list[str]] | None) -> set[tuple[str, ...]]:
    """Every option tuple the offload group's configure draws for an adapter."""
    manifest = REF
    if manifest_semantics is not None:
        caps = REF.capabilities.model_copy(update={"semantics": manifest_semantics})
        manifest = REF.model_copy(update={"capabilities": caps})
    machine = machine_class(MachineSetup(manifest, REF_DIR, "kvbm"))
    seen: set[tuple[str, ...]] = set()
    base = ManagerConfig(profile="kvbm", capacity=4)

    @settings(max_examples=200, database=None, derandomize=True)
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        cfg = machine.configure(machine.__new__(machine), base, data)
        if cfg.offload is not None:
            seen.add(tuple(cfg.offload.options().values()))

    draw()
    return seen


def test_lockstep_draws_only_the_values_the_adapter_declares() -> None:
    legacy = tuple(o.legacy for o in SEMANTICS.values())
    assert _configure({}) == {legacy}
    everything = _configure(None)
    assert legacy in everything and tuple(o.default for o in SEMANTICS.values()) in everything
    assert len(everything) > 4


# -------------------------------------------------- the processor-sharing link
def test_one_transfer_alone_takes_its_size_over_the_bandwidth() -> None:
    link = SharedLink.for_bandwidth(1.0)  # 1e6 bytes per ms
    link.start(0.0, 7, 1_000_000)
    assert link.earliest() == 1.0
    assert link.advance(0.5) == []
    assert link.earliest() == 1.0
    assert link.advance(1.0) == [7]
    assert link.earliest() is None


def test_concurrent_transfers_share_the_bandwidth() -> None:
    link = SharedLink.for_bandwidth(1.0)
    link.start(0.0, 1, 1_000_000)
    link.start(0.0, 2, 1_000_000)
    assert link.earliest() == 2.0
    assert link.advance(1.99) == []
    assert link.advance(2.0) == [1, 2]  # a tie: the first in the link's order first


def test_a_later_transfer_shares_what_is_left() -> None:
    link = SharedLink.for_bandwidth(1.0)
    link.start(0.0, 1, 1_000_000)
    assert link.advance(0.5) == []
    link.start(0.5, 2, 1_000_000)
    assert link.deadline_for(1) == 1.5 and link.deadline_for(2) == 2.0
    assert link.advance(1.5) == [1]
    assert link.advance(2.0) == [2]


def test_completion_order_follows_swap_remove() -> None:
    """After a completion the last transfer takes the removed one's place, so
    among equal remainders the later-started one can go first (as Dynamo)."""
    link = SharedLink.for_bandwidth(1.0)
    link.start(0.0, 1, 1_000_000)
    link.start(0.0, 2, 2_000_000)
    link.start(0.0, 3, 2_000_000)
    link.start(0.0, 4, 2_000_000)
    # 1 completes first and 4 moves into its place: [4, 2, 3]; the other
    # three then finish together, 4 first, and 3 moves into 4's place
    assert link.advance(100.0) == [1, 4, 3, 2]


def test_unbounded_bandwidth_and_backward_time() -> None:
    link = SharedLink.for_bandwidth(0.0)
    assert math.isinf(link.rate)
    link.start(10.0, 1, 10**9)
    assert link.earliest() == 10.0
    assert link.advance(9.0) == []  # earlier than the link's clock: nothing
    assert link.advance(10.0) == [1]
