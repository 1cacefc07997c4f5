"""The offload rule group of the lockstep machine (conformance/block/machine_offload.py).

Why: the group is only worth its CI time if it is mixed in where it should
be, actually drives the offload tier (ticks complete transfers, swap-ins get
scheduled and registered), reports coverage per offload rule id, and makes
the router views check transfer timing from the stream, so that a G2 Stored
published early is caught even by the protocol-only check.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

from kvspec.conformance.block.lockstep import Lockstep
from kvspec.conformance.block.machine import Digits, MachineSetup, machine_class, run_machine
from kvspec.conformance.block.machine_offload import OffloadGroup
from kvspec.conformance.block.traffic import Planned
from kvspec.conformance.run.manifest import Manifest, load_manifest, resolve_adapter_dir
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Deref, FullBlock, Operation, Plh, SwapIn, SwapInBlock, Tick, Use

REF_DIR = resolve_adapter_dir("adapters/reference")
REF: Manifest = load_manifest(REF_DIR)
RUN = settings(
    max_examples=40,
    stateful_step_count=50,
    phases=[Phase.generate],
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def _without(**caps: bool) -> Manifest:
    return REF.model_copy(update={"capabilities": REF.capabilities.model_copy(update=caps)})


def test_group_applies_to_kvbm_adapters_with_the_offload_capability() -> None:
    assert issubclass(machine_class(MachineSetup(REF, REF_DIR, "kvbm")), OffloadGroup)
    assert not issubclass(machine_class(MachineSetup(REF, REF_DIR, "atomic")), OffloadGroup)
    assert not issubclass(machine_class(MachineSetup(REF, REF_DIR, "legacy")), OffloadGroup)
    assert not issubclass(machine_class(MachineSetup(_without(offload=False), REF_DIR, "kvbm")), OffloadGroup)


def test_swap_in_kind_needs_the_swap_in_capability() -> None:
    kinds = machine_class(MachineSetup(REF, REF_DIR, "kvbm")).optional_kinds()
    assert {"swap_in", "tick", "tick_back", "wait_retry"} <= set(kinds)
    limited = machine_class(MachineSetup(_without(swap_in=False), REF_DIR, "kvbm")).optional_kinds()
    assert "swap_in" not in limited and "tick" in limited


def test_the_machine_exercises_every_offload_rule_on_the_reference() -> None:
    seen: Counter[str] = Counter()
    cls = machine_class(MachineSetup(REF, REF_DIR, "kvbm", record=lambda r, n: seen.update({r: n})))
    # more examples than RUN: each example also draws the offload semantics
    # options, so fewer of them run any one combination
    run_machine(cls, settings=settings(RUN, max_examples=100))
    for r in (
        RuleId.QUARANTINE_HOLD,
        RuleId.QUARANTINE_RELEASE,
        RuleId.OFFLOAD_BLOCKS_USE,
        RuleId.G2_STORE_ON_COMPLETE,
        RuleId.G2_EVICT,
        RuleId.DEVICE_REMOVE_IMMEDIATE,
        RuleId.TIME_MONOTONIC,
        RuleId.SWAPIN_RESERVE,
        RuleId.SWAPIN_ANCHOR,
    ):
        assert seen[str(r)] > 0, f"{r} never exercised: {dict(seen)}"


def _machine(config: ManagerConfig, swarm: frozenset[str]) -> Any:
    m = machine_class(MachineSetup(REF, REF_DIR, "kvbm"))()
    m.start(config, swarm)
    return m


def test_views_are_timed_and_see_each_tick_first() -> None:
    cfg = ManagerConfig(
        capacity=4,
        block_size=4,
        eviction="lru",
        offload=OffloadConfig.legacy(num_g2_blocks=2, block_size_bytes=1_000_000, bandwidth_gbps=1.0),
    )
    m = _machine(cfg, frozenset({"tick", "finish"}))
    try:
        assert m.check.view.now_ms == 0.0 and m.check.model_view.now_ms == 0.0
        m.run(m._tick(2.5, "tick_later"))
        assert m.check.view.now_ms == 2.5 and m._clock == 2.5
        back = m.tick_back.fn(m, Digits(0))
        assert isinstance(back.op, Tick) and back.op.now_ms < 2.5
        m.run(back)
        assert m.check.view.now_ms == 2.5  # a tick backwards does not move the clock
        assert m.check.coverage[RuleId.TIME_MONOTONIC] >= 2
    finally:
        m.teardown()


def test_no_offload_tier_means_no_clock_and_no_offload_actions() -> None:
    m = _machine(ManagerConfig(capacity=4, block_size=4, eviction="lru"), frozenset({"tick", "swap_in"}))
    try:
        assert m.check.view.now_ms is None
        assert not any(a.ready(m) for a in m._actions if a.kind in ("tick", "swap_in", "tick_back"))
    finally:
        m.teardown()


def test_release_of_a_swap_in_anchor_waits_for_the_onboard() -> None:
    """A Deref of the block a pending swap-in anchors to is preceded by the
    Tick that completes the swap-in."""
    cfg = ManagerConfig(
        capacity=4,
        block_size=4,
        eviction="lru",
        offload=OffloadConfig.legacy(num_g2_blocks=4, block_size_bytes=1_000_000, bandwidth_gbps=1.0),
    )
    m = _machine(cfg, frozenset({"tick", "swap_in"}))
    try:
        # offload block 2 to G2, then swap it back in behind block 1
        def ok(out: Any, before: Any) -> None:
            assert out.error is None

        ops: list[Operation] = [
            Use(blocks=[FullBlock(full=1), FullBlock(full=2)], plhs=[Plh(hash=1), Plh(hash=2, parent=1, position=1)]),
            Deref(blocks=[FullBlock(full=2)]),
            Use(
                blocks=[FullBlock(full=3), FullBlock(full=4), FullBlock(full=5)],
                plhs=[Plh(hash=3), Plh(hash=4), Plh(hash=5)],
            ),
        ]
        for op in ops:
            m.run(Planned(op, "test", ok))
        m.run(m._tick(5.0, "tick_next"))
        assert 2 in m.check.model.registered("host_pinned")
        m._anchors = {1}
        m.run(
            Planned(
                SwapIn(blocks=[SwapInBlock(seq_hash=2, plh=Plh(hash=2, parent=1, position=1))], parent=1), "swap_in", ok
            )
        )
        assert m._onboard_deadlines(), "the swap-in is in flight"
        n = len(m.check.ops)
        m.run(Planned(Deref(blocks=[FullBlock(full=1)]), "finish", ok))
        assert isinstance(m.check.ops[n], Tick) and isinstance(m.check.ops[n + 1], Deref)
        assert not m._onboard_deadlines()
    finally:
        m.teardown()


def test_protocol_only_lockstep_flags_an_early_g2_stored_by_timing() -> None:
    """With a 1 ms transfer, a G2 Stored published at eviction time breaks
    G2-STORE-ON-COMPLETE in the router view of the implementation's stream,
    which even the protocol-only check reports."""
    from kvspec.adapters.mutants.adapter import MutantImplementation

    mutants = load_manifest(resolve_adapter_dir("adapters/mutants"))
    cfg = ManagerConfig(
        capacity=1,
        block_size=4,
        offload=OffloadConfig.legacy(num_g2_blocks=2, block_size_bytes=1_000_000, bandwidth_gbps=1.0),
    )
    impl = MutantImplementation("g2_stored_at_enqueue", cfg, mutants)
    ls = Lockstep(impl, cfg, adapter="mutants", protocol_only=True)
    for view in (ls.view, ls.model_view):
        view.enable_timing(cfg.offload.transfer_ms())  # type: ignore[union-attr]
    ls.step(Use(blocks=[FullBlock(full=1)], plhs=[Plh(hash=1)]))
    ls.step(Deref(blocks=[FullBlock(full=1)]))
    with pytest.raises(ConformanceFailure) as ei:
        ls.step(Use(blocks=[FullBlock(full=2)], plhs=[Plh(hash=2)]))
    assert ei.value.rule == RuleId.G2_STORE_ON_COMPLETE


def test_a_fifo_link_draws_no_option_it_ignores() -> None:
    """F5: under link = "fifo" g2_allocation and dedup have one behaviour, so
    the lockstep does not draw them (equivalent configs would look
    different and waste draws); under "shared" every combination is drawn."""
    from hypothesis import given
    from hypothesis import strategies as st

    m = machine_class(MachineSetup(REF, REF_DIR, "kvbm"))()
    base = ManagerConfig(capacity=4, block_size=4, eviction="lru")
    seen: set[tuple[str, str, str, str]] = set()

    @settings(RUN, max_examples=300)
    @given(st.data())
    def draw(data: Any) -> None:
        off = m.configure(base, data).offload
        if off is not None:
            seen.add((off.link, off.g2_eviction, off.g2_allocation, off.dedup))

    draw()
    fifo = {s for s in seen if s[0] == "fifo"}
    shared = {s for s in seen if s[0] == "shared"}
    assert fifo and {(a, d) for _, _, a, d in fifo} == {("at_completion", "resend")}
    assert {e for _, e, _, _ in fifo} == {"lineage", "lru"}  # G2's eviction still matters on a fifo link
    assert len(shared) == 8, sorted(shared)
