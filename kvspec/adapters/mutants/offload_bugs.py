"""Mutants of the offload tier (kvbm with an offload tier attached): the
quarantine of evicted slots, host-pinned events, swap-in and the clock.

They are only reachable when the configuration has an offload tier, so only
the suite's offload rules and scenarios can kill them.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kvspec.adapters.mutants.edits import is_device, renumber
from kvspec.api import G1Model, Step
from kvspec.reference.g1 import Block, plh_id
from kvspec.spec.config import ManagerConfig
from kvspec.spec.wire import KvEvent, OpResult, SwapIn, Tick, Use, make_stored


def _new_offloads(model: G1Model, n_before: int) -> list[Any]:
    """Payloads of the offload transfers queued since ``pending`` had ``n_before`` entries."""
    return [t.payload for t in model.pending[n_before:] if t.kind == "offload"]


class SlotReleasedAtEnqueue(G1Model):
    """The evicted slot goes back to free when its offload is queued, not when
    the copy completes: a later Use can overwrite data still being copied."""

    def __init__(self, config: ManagerConfig) -> None:
        super().__init__(config)
        self._released: set[int] = set()

    def _publish_evictions(self, evicted: list[int]) -> list[KvEvent]:
        n = len(self.pending)
        events = super()._publish_evictions(evicted)
        for payload in _new_offloads(self, n):
            self.quarantined -= 1
            self.free += 1
            self._released.add(id(payload))
        return events

    def _complete_offload(self, e: Any) -> list[KvEvent]:
        if id(e) in self._released:  # undo the release the reference does here
            self._released.discard(id(e))
            self.quarantined += 1
            self.free -= 1
        return super()._complete_offload(e)


class G2StoredAtEnqueue(G1Model):
    """The host-pinned Stored is published when the offload is queued, before
    the copy has completed, and not again at completion."""

    def __init__(self, config: ManagerConfig) -> None:
        super().__init__(config)
        self._early: set[int] = set()

    def _host_stored(self, e: Any) -> KvEvent:
        ev = make_stored(
            self.next_event_id,
            [e.seq],
            [e.local_hash],
            e.parent_hash,
            dp_rank=self.dp_rank,
            tier="host_pinned",
            token_ids=[e.token_ids] if e.token_ids is not None else None,
        )
        self.next_event_id += 1
        return ev

    def _publish_evictions(self, evicted: list[int]) -> list[KvEvent]:
        n = len(self.pending)
        events = super()._publish_evictions(evicted)
        for payload in _new_offloads(self, n):
            if payload.seq not in self.g2:
                events.append(self._host_stored(payload))
                self._early.add(id(payload))
        return events

    def _complete_offload(self, e: Any) -> list[KvEvent]:
        start = self.next_event_id
        events = super()._complete_offload(e)
        if id(e) not in self._early:
            return events
        self._early.discard(id(e))
        kept = [ev for ev in events if not (ev.storage_tier == "host_pinned" and ev.kind == "stored")]
        self.next_event_id = start + len(kept)
        return renumber(kept, start)


class DeviceRemovedAtCompletion(G1Model):
    """With an offload tier, the device Removed of an evicted block waits for
    its transfer to complete instead of going out at eviction."""

    def __init__(self, config: ManagerConfig) -> None:
        super().__init__(config)
        self._late: set[int] = set()

    def _publish_evictions(self, evicted: list[int]) -> list[KvEvent]:
        start = self.next_event_id
        events = super()._publish_evictions(evicted)
        if self.offload is None:
            return events
        kept: list[KvEvent] = []
        for ev in events:
            if is_device(ev, "removed"):
                self._late.update(ev.hashes())
            else:
                kept.append(ev)
        self.next_event_id = start + len(kept)
        return renumber(kept, start)

    def _complete_offload(self, e: Any) -> list[KvEvent]:
        if e.seq not in self._late:
            return super()._complete_offload(e)
        self._late.discard(e.seq)
        removed = self._removed([e.seq])
        return [removed, *super()._complete_offload(e)]


class SwapInRegistersPresent(G1Model):
    """Swap-in registers every block of the prefix, also those G1 already
    holds: their reserved slots stay taken and one Stored names them all."""

    def _complete_onboard(self, job: Any) -> list[KvEvent]:
        entries = [(entry[0], entry[1]) for entry in job.blocks[: job.slots]]
        present = [seq for seq, plh in entries if seq in self.blocks or plh_id(plh) in self.by_plh]
        start = self.next_event_id
        events = super()._complete_onboard(job)
        if not present:
            return events
        self.free -= len(present)
        metas: list[Block] = []
        for seq, plh in entries:
            b = self.blocks.get(seq)
            metas.append(b if b is not None else self.blocks[self.by_plh[plh_id(plh)]])
        self.next_event_id = start
        return [self._stored([s for s, _ in entries], metas, job.parent)]


class TickBackwardsApplied(G1Model):
    """A tick earlier than the clock moves the clock back; transfers queued
    afterwards get deadlines in the past of what was already observed."""

    def _tick(self, op: Tick) -> Step:
        if op.now_ms < self.now:
            self.now = op.now_ms
        return super()._tick(op)


class G2EvictsNewest(G1Model):
    """A full G2 evicts its most recently stored block instead of its least
    recently used one."""

    def _complete_offload(self, e: Any) -> list[KvEvent]:
        assert self.offload is not None
        events: list[KvEvent] = []
        if e.seq not in self.g2 and len(self.g2) >= self.offload.num_g2_blocks:
            victim, _ = self.g2.popitem(last=True)
            events.append(self._removed([victim], "host_pinned"))
        return [*events, *super()._complete_offload(e)]


class OffloadReportsCapacity(G1Model):
    """A Use stopped by an offload reports plain ``capacity``, so the caller
    cannot tell it should wait for the transfer and retry."""

    def _use(self, op: Use, prefer: Collection[int]) -> Step:
        step = super()._use(op, prefer)
        if step.result.status == "blocked_on_offload":
            return Step(OpResult(value=step.result.value, status="capacity"), step.events)
        return step


class QuarantineKeptWhenInG2(G1Model):
    """When the offloaded block is already in G2 the completion takes the
    early-return path and never releases the quarantined source slot."""

    def _complete_offload(self, e: Any) -> list[KvEvent]:
        already = e.seq in self.g2
        events = super()._complete_offload(e)
        if already:
            self.quarantined += 1
            self.free -= 1
        return events


class SwapInParentDropped(G1Model):
    """The swap-in request's parent is not carried into the onboard job, so the
    swapped-in blocks' Stored is anchored to nothing."""

    def _swap_in(self, op: SwapIn, prefer: Collection[int]) -> Step:
        return super()._swap_in(op.model_copy(update={"parent": None}), prefer)


class EventIdPerTier(G1Model):
    """Host-pinned events are numbered by their own counter, from 0, instead
    of sharing the manager's one sequence of event ids."""

    def __init__(self, config: ManagerConfig) -> None:
        super().__init__(config)
        self._host_next = 0

    def _complete_offload(self, e: Any) -> list[KvEvent]:
        device_next = self.next_event_id
        self.next_event_id = self._host_next
        try:
            return super()._complete_offload(e)
        finally:
            self._host_next = self.next_event_id
            self.next_event_id = device_next


class G2EvictOnDeviceTier(G1Model):
    """A G2 eviction is announced as a device-tier Removed (the tier of the
    Removed is taken from the manager, not from the pool that evicted)."""

    def _complete_offload(self, e: Any) -> list[KvEvent]:
        return [
            ev.model_copy(update={"storage_tier": "device"})
            if ev.kind == "removed" and ev.storage_tier == "host_pinned"
            else ev
            for ev in super()._complete_offload(e)
        ]


class TransferDueAfterDeadline(G1Model):
    """Deadline arithmetic off at the boundary: a tick completes only the
    transfers whose deadline is strictly earlier than its time, so a tick at
    exactly a deadline (the earliest deadline the manager itself reports)
    completes nothing and the quarantined slot stays held."""

    def _tick(self, op: Tick) -> Step:
        if op.now_ms < self.now:
            return super()._tick(op)
        held = [t for t in self.pending if t.deadline == op.now_ms]
        self.pending = [t for t in self.pending if t.deadline != op.now_ms]
        step = super()._tick(op)
        self.pending.extend(held)
        return step


class PresenceFilterMissing(G1Model):
    """dedup = "filter" declared but not done: an evicted block whose lineage
    hash G2 already holds (or that is already on its way there) is sent
    again, so its source slot stays quarantined for a transfer the source
    never starts (Dynamo's presence filter forgotten by a port)."""

    def _enqueue_offload(self, entries: list[Any], slots: int) -> list[KvEvent]:
        declared = self.offload
        if declared is None or declared.dedup != "filter":
            return super()._enqueue_offload(entries, slots)
        self.offload = declared.model_copy(update={"dedup": "resend"})
        try:
            return super()._enqueue_offload(entries, slots)
        finally:
            self.offload = declared


class SwapInUnpinsBeforeOffload(G1Model):
    """A blocked swap-in lets go of its G2 prefix before it offloads the G1
    blocks its reservation evicted: under g2_allocation = "at_start" those
    transfers take their G2 destinations at once and can evict the very
    prefix the swap-in is waiting for (the model's own bug before finding F6;
    Dynamo holds the prefix until the swap-in returns)."""

    def _end_unreserved_swap_in(self, seqs: list[int], evicted: list[int]) -> list[KvEvent]:
        if self.offload is not None and self.offload.g2_eviction == "lineage":
            self.g2tier.unpin(seqs)
        return self._publish_evictions(evicted)
