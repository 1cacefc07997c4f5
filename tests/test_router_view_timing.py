"""The router view's transfer-timing check (G2-STORE-ON-COMPLETE).

Why: the differential checker only sees a G2 Stored published too early when
it runs the model beside the implementation. A router, or an offline check of
a log with a clock, can see it from the stream alone: a host-pinned Stored of
a block cannot come before that block's device Removed (which started its
transfer) plus the time one block takes on the link. These tests pin that
check down, including that it never fires where timing is not observable and
never on a stream some transfer order could produce.
"""

from __future__ import annotations

from typing import Any

from kvspec.adapters.mutants.offload_bugs import G2StoredAtEnqueue
from kvspec.reference import G1Model, RouterView
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Deref, FullBlock, KvEvent, Operation, Plh, Tick, Use, make_removed, make_stored


def dev_stored(eid: int, h: int) -> KvEvent:
    return make_stored(eid, [h], [h + 100], None)


def dev_removed(eid: int, *hs: int) -> KvEvent:
    return make_removed(eid, list(hs))


def host_stored(eid: int, h: int) -> KvEvent:
    return make_stored(eid, [h], [h + 100], None, tier="host_pinned")


def host_removed(eid: int, h: int) -> KvEvent:
    return make_removed(eid, [h], tier="host_pinned")


def rules(vs: list[Any]) -> list[RuleId]:
    return [v.rule for v in vs]


def timed(min_ms: float = 1.0) -> RouterView:
    v = RouterView()
    v.enable_timing(min_ms)
    return v


def test_stored_after_the_minimum_transfer_time_passes() -> None:
    v = timed(1.0)
    assert v.apply_batch([dev_stored(0, 1)]) == []
    assert v.apply_batch([dev_removed(1, 1)]) == []
    v.observe_time(1.0)
    assert v.apply_batch([host_stored(2, 1)]) == []
    assert v.now_ms == 1.0


def test_stored_before_the_transfer_could_complete_is_flagged() -> None:
    v = timed(1.0)
    v.apply_batch([dev_stored(0, 1)])
    v.observe_time(2.0)
    v.apply_batch([dev_removed(1, 1)])
    v.observe_time(2.5)
    out = v.apply_batch([host_stored(2, 1)])
    assert rules(out) == [RuleId.G2_STORE_ON_COMPLETE]
    assert out[0].context["transfer_started_ms"] == 2.0
    assert out[0].context["earliest_completion_ms"] == 3.0


def test_stored_in_the_same_operation_as_the_eviction_is_flagged() -> None:
    """What a manager that publishes the G2 Stored at enqueue does."""
    v = timed(0.5)
    v.apply_batch([dev_stored(0, 1)])
    out = v.apply_batch([dev_removed(1, 1), host_stored(2, 1)])
    assert rules(out) == [RuleId.G2_STORE_ON_COMPLETE]


def test_host_stored_without_any_device_removed_is_flagged_from_the_start() -> None:
    v = timed(0.0)  # even instant transfers need the eviction first
    out = v.apply_batch([dev_stored(0, 1), host_stored(1, 1)])
    assert rules(out) == [RuleId.G2_STORE_ON_COMPLETE]


def test_timing_enabled_mid_stream_skips_unknown_history() -> None:
    v = RouterView()
    v.apply_batch([dev_stored(0, 1), dev_removed(1, 1)])  # before the clock is known
    v.enable_timing(1.0)
    assert v.apply_batch([host_stored(2, 1)]) == []


def test_untimed_view_skips_the_check() -> None:
    """A recorded log without timestamps: nothing to compare with."""
    v = RouterView()
    assert v.apply_batch([dev_stored(0, 1), dev_removed(1, 1), host_stored(2, 1)]) == []
    assert v.now_ms is None


def test_each_host_stored_pairs_with_the_earliest_unpaired_removal() -> None:
    v = timed(1.0)
    v.apply_batch([dev_stored(0, 1), dev_removed(1, 1)])  # transfer A starts at 0
    v.observe_time(0.6)
    v.apply_batch([dev_stored(2, 1), dev_removed(3, 1)])  # transfer B starts at 0.6
    v.observe_time(1.0)
    assert v.apply_batch([host_stored(4, 1)]) == []  # A completes: fine
    v.observe_time(1.2)
    out = v.apply_batch([host_removed(5, 1), host_stored(6, 1)])  # B cannot be done before 1.6
    assert rules(out) == [RuleId.G2_STORE_ON_COMPLETE]


def test_a_clock_going_back_is_ignored() -> None:
    v = timed(1.0)
    v.observe_time(5.0)
    v.observe_time(1.0)
    assert v.now_ms == 5.0
    v.apply_batch([dev_stored(0, 1), dev_removed(1, 1)])
    v.observe_time(5.5)
    assert rules(v.apply_batch([host_stored(2, 1)])) == [RuleId.G2_STORE_ON_COMPLETE]


def test_clock_rounding_is_tolerated() -> None:
    """Deadlines computed as seconds * 1000 differ in the last bits."""
    v = timed(0.2)
    v.observe_time(0.1)
    v.apply_batch([dev_stored(0, 1), dev_removed(1, 1)])
    v.observe_time(0.0003 * 1000)  # 0.30000000000000004 or 0.29999999999999999
    assert v.apply_batch([host_stored(2, 1)]) == []


def _drive(model: G1Model, view: RouterView) -> list[Any]:
    """Evict block 1 from a one-slot G1 and tick to the deadline, as the
    lockstep checker would feed a live stream (clock on each Tick)."""
    out: list[Any] = []
    ops: list[Operation] = [
        Use(blocks=[FullBlock(full=1)], plhs=[Plh(hash=1)]),
        Deref(blocks=[FullBlock(full=1)]),
        Use(blocks=[FullBlock(full=2)], plhs=[Plh(hash=2)]),
        Tick(now_ms=1.0),
    ]
    for op in ops:
        if isinstance(op, Tick):
            view.observe_time(op.now_ms)
        out.extend(view.apply_batch(model.apply(op).events))
    return out


def test_reference_stream_passes_and_early_g2_stored_is_caught_from_the_stream() -> None:
    cfg = ManagerConfig(
        capacity=1,
        block_size=4,
        offload=OffloadConfig.legacy(num_g2_blocks=2, block_size_bytes=1_000_000, bandwidth_gbps=1.0),
    )
    off = cfg.offload
    assert off is not None
    v = timed(off.transfer_ms())
    assert _drive(G1Model(cfg), v) == []
    assert v.stored("host_pinned") == {1}
    v = timed(off.transfer_ms())
    assert rules(_drive(G2StoredAtEnqueue(cfg), v)) == [RuleId.G2_STORE_ON_COMPLETE]
