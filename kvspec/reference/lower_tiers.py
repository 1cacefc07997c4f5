"""G3 (local disk) and G4 (object store): the lower tiers every worker of a process shares.

Dynamo's mocker keeps one G3 block manager and one G4 object store per
process, whatever the number of mock workers in it (ai-dynamo/dynamo
``lib/mocker/src/kvbm_offload/shared_g3.rs``, ``SharedG3Pool``;
``shared_g4.rs``, ``SharedG4Store``), and copies into them from each
worker's G2 (``engine.rs``, ``MockOffloadEngine::new``: the G2->G3 and
G2->G4 pipelines; ``prepare_tick``: the chains). This module is that shared
state, as a port observes it:

- TIER-CASCADE: a block that completes G1->G2 is enqueued, in the same tick,
  for G2->G3 and for G2->G4 (each tier that is on), as one job per worker
  and tier (the blocks of that tick), in batches of ``batch_size``.
- TIER-DEDUP: each tier's presence filter with a pending tracker shared by
  the process: a block the tier holds, or that any worker is copying there,
  is not sent; G3 rejects duplicates (``BlockDuplicationPolicy::Reject``).
- TIER-ADMIT: a G2->G3 job is admitted at enqueue against G3's shared room
  (``CapacityReservationPolicy``, as G2's ``at_start``); a copy pins its G2
  source blocks until it completes; one G2->G3 transfer at a time per
  worker (``max_concurrent_transfers(1)``), up to ``batch_size`` G2->G4.
- TIER-EVICT: G3 is a lineage pool: a copy takes its destination when it
  starts, evicting G3's oldest leaf; G4 never evicts.
- TIER-OWNER: the tiers' links (one per tier and direction, processor
  sharing as ``offload_link.SharedLink``) are advanced by whichever worker
  ticks, but a completed transfer takes effect (registration, release,
  events, the next waiting batch) when the worker that started it ticks,
  in completion order (``drain_completions_ordered``).
- TIER-ONBOARD: see ``G1Model._swap_in``: a hit past the G2 prefix is staged
  G3->G2 / G4->G2 first, then the whole run goes G2->G1.
- TIER-EVENTS: ``lower_tier_events = "none"`` (Dynamo: G3's registry has no
  events manager, G4 none at all; only G2's lifecycle is translated) or
  ``"owner"``: a completed G2->G3 copy publishes a disk Stored and a G2->G4
  put an external Stored, by the worker that started it; a G3 victim's
  disk Removed is published by the worker that put it there.

The rules are transitions (``reference.transitions``): the tables below,
each decision the first transition whose guard holds; the rules of the
transitions taken go to the step of the worker being served (``did``, which
the worker sets around each of its steps).

Pure: no clock of its own, time enters through ``advance``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvspec.reference.g2_tier import G2Entry, G2Tier
from kvspec.reference.labels import label
from kvspec.reference.offload_link import SharedLink
from kvspec.reference.transitions import Tables, Transition, always
from kvspec.spec.config import OffloadConfig
from kvspec.spec.wire import StorageTier

PlhId = tuple[int, int, int | None]

#: tier name -> the storage tier its events name
EVENT_TIER: dict[str, StorageTier] = {"g3": "disk", "g4": "external"}


class TierWorker(Protocol):
    """What the shared tiers need of a worker (``G1Model``)."""

    worker: int

    def tier_event(self, tier: StorageTier, kind: str, seq: int, entry: G2Entry | None) -> None: ...

    def tier_pin(self, seqs: list[int]) -> list[int]: ...

    def tier_unpin(self, seqs: list[int]) -> None: ...

    def tier_staged(self, job: Any, entries: list[G2Entry]) -> None: ...


@dataclass(slots=True)
class _Put:
    """One batch of one worker's G2->G3 or G2->G4 job."""

    worker: int
    tier: str
    entries: list[G2Entry]
    #: G3 destinations taken when the transfer started
    dests: int = 0
    #: the G2 source blocks it pinned
    pinned: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Stage:
    """Blocks of a swap-in coming back from G3 or G4 into the worker's G2."""

    worker: int
    tier: str
    entries: list[G2Entry]
    job: Any


@dataclass(slots=True)
class _Arrival:
    """A block of a completed G2->G3 / G2->G4 copy that the tier registers."""

    put: _Put
    entry: G2Entry


@dataclass(slots=True)
class _Enqueue:
    """Blocks that just reached ``worker``'s G2, for one tier."""

    worker: int
    tier: str
    entries: list[G2Entry]


def _events_owned(m: Any, item: object) -> bool:
    return bool(m.config.lower_tier_events == "owner")


#: with lower_tier_events = "owner", a block registered in G3/G4 is announced by the worker that
#: put it there (``G1Model.drain_outbox`` publishes the lower tiers' events with this label)
TIER_EVENTS: Transition[Any, Any] = Transition(
    "TIER-EVENTS",
    _Arrival,
    always,
    "_announce_stored",
    publishes=label("TIER-EVENTS", parent="TIER-EVENTS", tokens="TIER-EVENTS"),
)
ANNOUNCE: tuple[Transition[Any, Any], ...] = (TIER_EVENTS,)
#: blocks that reached a worker's G2 are enqueued for a lower tier
CASCADE: tuple[Transition[Any, Any], ...] = (Transition("TIER-CASCADE", _Enqueue, always, "_enqueue_entries"),)
#: a block the tier holds or that is on its way there is not sent (and G3 rejects a duplicate)
DEDUP: tuple[Transition[Any, Any], ...] = (Transition("TIER-DEDUP", G2Entry, always, "_not_sent"),)
#: a G2->G3 job is admitted at enqueue against G3's room
ADMIT: tuple[Transition[Any, Any], ...] = (Transition("TIER-ADMIT", list, always, "_admit_g3"),)
#: G3's victim leaves it; with owner events its owner publishes a disk Removed
G3_EVICTION: tuple[Transition[Any, Any], ...] = (
    Transition("TIER-EVICT", int, _events_owned, "_g3_drop_announced", also=("TIER-EVENTS",)),
    Transition("TIER-EVICT", int, always, "_g3_drop"),
)
#: a swap-in's run past the G2 prefix is copied from G3/G4 into the worker's G2 first
STAGE: tuple[Transition[Any, Any], ...] = (Transition("TIER-ONBOARD", _Stage, always, "_start_stage"),)
#: a completed transfer takes effect when the worker that started it ticks
OWNER: tuple[Transition[Any, Any], ...] = (Transition("TIER-OWNER", tuple, always, "_take_effect"),)


@dataclass(slots=True)
class LowerTiers(Tables):
    """G3 and G4 of one process, their links, and the copies in flight."""

    config: OffloadConfig
    g3: G2Tier | None = None
    #: G3 blocks by sequence hash -> the worker that put them (events)
    g3_owner: dict[int, int] = field(default_factory=dict)
    #: G4 objects by lineage hash -> (metadata, the worker that put it)
    g4: dict[PlhId, tuple[G2Entry, int]] = field(default_factory=dict)
    links: dict[tuple[str, str], SharedLink] = field(default_factory=dict)
    transfers: dict[int, _Put | _Stage] = field(default_factory=dict)
    #: (tier, lineage hash) -> copies in flight (the shared pending tracker)
    pending: dict[tuple[str, PlhId], int] = field(default_factory=dict)
    #: (worker, tier) -> batches waiting for the worker's transfer slot
    waiting: dict[tuple[int, str], list[_Put]] = field(default_factory=dict)
    #: (worker, tier) -> put transfers running
    running: dict[tuple[int, str], int] = field(default_factory=dict)
    #: worker -> completed transfers it has not taken yet, in completion order,
    #: each with the time it completed
    done: dict[int, list[tuple[float, int, _Put | _Stage]]] = field(default_factory=dict)
    workers: dict[int, TierWorker] = field(default_factory=dict)
    clock: float = 0.0
    _next: int = 0
    #: set by the model around each step: where the rules of the transitions taken go
    did: Callable[[str], None] = lambda _name: None

    TABLES = (ANNOUNCE, CASCADE, DEDUP, ADMIT, G3_EVICTION, STAGE, OWNER)

    def __post_init__(self) -> None:
        off = self.config
        if off.num_g3_blocks is not None:
            self.g3 = G2Tier(off.num_g3_blocks, "lineage")
        for tier, gbps in (("g3", off.bandwidth_g3_gbps), ("g4", off.bandwidth_g4_gbps)):
            for way in ("put", "get"):
                self.links[(tier, way)] = SharedLink.for_bandwidth(gbps)

    # ---------------------------------------------------------------- queries
    def on(self, tier: str) -> bool:
        return self.g3 is not None if tier == "g3" else self.config.g4

    def holds(self, tier: str, e: G2Entry) -> bool:
        if tier == "g3":
            return self.g3 is not None and e.seq in self.g3 and self.g3.blocks[e.seq].pid == e.pid
        return e.pid in self.g4

    def lookup(self, tier: str, seq: int, pid: PlhId) -> G2Entry | None:
        """The metadata a tier holds for block ``seq`` (same lineage hash), or None."""
        if tier == "g3":
            e = self.g3.get(seq) if self.g3 is not None else None
            return e if e is not None and e.pid == pid else None
        got = self.g4.get(pid)
        return got[0] if got is not None and got[0].seq == seq else None

    def contents(self, tier: str) -> set[int]:
        if tier == "g3":
            return set(self.g3.blocks) if self.g3 is not None else set()
        return {e.seq for e, _w in self.g4.values()}

    def earliest(self, worker: int) -> float | None:
        """When something of ``worker``'s can next change: a shared link's next
        completion, or at once when a completion waits for it."""
        times = [t for t in (link.earliest() for link in self.links.values()) if t is not None]
        times += [t for t, _i, _p in self.done.get(worker, [])]
        return min(times, default=None)

    def state(self) -> tuple[object, ...]:
        return (
            self.g3.state() if self.g3 is not None else None,
            tuple(sorted(self.g3_owner.items())),
            tuple(sorted((k, e.seq, w) for k, (e, w) in self.g4.items())),
            tuple((k, link.state()) for k, link in sorted(self.links.items())),
            tuple(sorted((i, _key(t)) for i, t in self.transfers.items())),
            tuple(sorted(self.pending.items())),
            tuple(sorted((k, tuple(_key(b) for b in v)) for k, v in self.waiting.items())),
            tuple(sorted(self.running.items())),
            tuple(sorted((w, tuple((t, i, _key(p)) for t, i, p in v)) for w, v in self.done.items())),
            self.clock,
        )

    # ---------------------------------------------------------- the cascade
    def cascade(self, worker: int, entries: list[G2Entry]) -> None:
        """TIER-CASCADE: ``entries`` just reached ``worker``'s G2."""
        for tier in ("g3", "g4"):
            if self.on(tier) and entries:
                self._enqueue(worker, tier, list(entries))

    def _apply_rules(self, t: Transition[Any, Any]) -> None:
        for r in t.rules:
            self.did(r)

    def _enqueue(self, worker: int, tier: str, entries: list[G2Entry]) -> None:
        self.take(CASCADE, _Enqueue(worker, tier, entries))

    def _not_sent(self, e: G2Entry) -> None:
        """A duplicate: nothing to do."""

    def _admit_g3(self, kept: list[G2Entry]) -> list[G2Entry]:
        assert self.g3 is not None
        return kept[: self.g3.admit(len(kept))]

    def _enqueue_entries(self, q: _Enqueue) -> None:
        worker, tier = q.worker, q.tier
        kept: list[G2Entry] = []
        seen: set[PlhId] = set()
        for e in q.entries:
            if self.holds(tier, e) or (tier, e.pid) in self.pending or e.pid in seen:
                self.take(DEDUP, e)
                continue
            seen.add(e.pid)
            kept.append(e)
        if tier == "g3" and kept:
            kept = self.take(ADMIT, kept)
        if not kept:
            return
        for e in kept:
            self.pending[(tier, e.pid)] = self.pending.get((tier, e.pid), 0) + 1
        size = self.config.batch_size
        queue = self.waiting.setdefault((worker, tier), [])
        for i in range(0, len(kept), size):
            queue.append(_Put(worker, tier, kept[i : i + size]))
        self._start_waiting(worker, tier)

    def _cap(self, tier: str) -> int:
        return 1 if tier == "g3" else self.config.batch_size

    def _start_waiting(self, worker: int, tier: str) -> None:
        queue = self.waiting.get((worker, tier), [])
        while queue and self.running.get((worker, tier), 0) < self._cap(tier):
            self._start_put(queue.pop(0))
        if not queue:
            self.waiting.pop((worker, tier), None)

    def _start_put(self, put: _Put) -> None:
        """A copy starts: G3 takes its destinations now (TIER-EVICT), and the
        G2 source blocks are pinned until it completes (TIER-ADMIT)."""
        if put.tier == "g3":
            assert self.g3 is not None
            kept: list[G2Entry] = []
            for e in put.entries:
                got, victims = self.g3.make_room()
                for v in victims:
                    self._g3_evicted(v)
                if got:
                    self.g3.reserved += 1
                    put.dests += 1
                    kept.append(e)
                else:  # every G3 block is taken: the block is not sent
                    self.g3.admitted -= 1
                    self._settle(put.tier, e)
            put.entries = kept
            if not kept:
                return
        put.pinned = self.workers[put.worker].tier_pin([e.seq for e in put.entries])
        self._start((put.tier, "put"), put, len(put.entries))
        self.running[(put.worker, put.tier)] = self.running.get((put.worker, put.tier), 0) + 1

    def _start(self, link: tuple[str, str], payload: _Put | _Stage, blocks: int) -> None:
        ident = self._next
        self._next += 1
        self.transfers[ident] = payload
        self.links[link].start(self.clock, ident, blocks * (self.config.block_size_bytes or 0))

    def _g3_evicted(self, seq: int) -> None:
        self.take(G3_EVICTION, seq)

    def _g3_drop(self, seq: int) -> int:
        return self.g3_owner.pop(seq)

    def _g3_drop_announced(self, seq: int) -> None:
        self.workers[self._g3_drop(seq)].tier_event("disk", "removed", seq, None)

    def _settle(self, tier: str, e: G2Entry) -> None:
        key = (tier, e.pid)
        n = self.pending[key] - 1
        if n:
            self.pending[key] = n
        else:
            del self.pending[key]

    # --------------------------------------------------------------- staging
    def stage(self, worker: int, tier: str, entries: list[G2Entry], job: Any) -> None:
        """TIER-ONBOARD: copy ``entries`` from ``tier`` into ``worker``'s G2
        for swap-in ``job`` (one transfer on the tier's get link)."""
        self.take(STAGE, _Stage(worker, tier, entries, job))

    def _start_stage(self, stage: _Stage) -> None:
        self._start((stage.tier, "get"), stage, len(stage.entries))

    # ------------------------------------------------------------------ time
    def advance(self, now: float) -> None:
        """Move the tiers' links to ``now``; completed transfers wait for their
        worker (TIER-OWNER)."""
        if now < self.clock:
            return
        self.clock = now
        for key in (("g3", "put"), ("g4", "put"), ("g3", "get"), ("g4", "get")):
            for ident in self.links[key].advance(now):
                payload = self.transfers.pop(ident)
                self.done.setdefault(payload.worker, []).append((now, ident, payload))

    def deliver(self, worker: int) -> None:
        """TIER-OWNER: apply ``worker``'s completed transfers, in order."""
        for _t, _i, payload in self.done.pop(worker, []):
            self.take(OWNER, (worker, payload))

    def _take_effect(self, done: tuple[int, _Put | _Stage]) -> None:
        worker, payload = done
        if isinstance(payload, _Stage):
            self.workers[worker].tier_staged(payload.job, payload.entries)
            return
        w = self.workers[worker]
        for e in payload.entries:
            self._arrive(payload, e)
        w.tier_unpin(payload.pinned)
        self.running[(worker, payload.tier)] -= 1
        if not self.running[(worker, payload.tier)]:
            del self.running[(worker, payload.tier)]
        self._start_waiting(worker, payload.tier)

    def _arrive(self, put: _Put, e: G2Entry) -> None:
        self._settle(put.tier, e)
        if put.tier == "g3":
            assert self.g3 is not None
            self.g3.reserved -= 1
            self.g3.admitted -= 1
            if e.seq in self.g3:  # duplicates are rejected
                self.take(DEDUP, e)
                return
            self.g3.register(e)
            self.g3_owner[e.seq] = put.worker
        else:
            if e.pid in self.g4:
                self.take(DEDUP, e)
                return
            self.g4[e.pid] = (e, put.worker)
        if self.config.lower_tier_events == "owner":
            self.take(ANNOUNCE, _Arrival(put, e))

    def _announce_stored(self, a: _Arrival) -> None:
        self.workers[a.put.worker].tier_event(EVENT_TIER[a.put.tier], "stored", a.entry.seq, a.entry)


def _key(p: _Put | _Stage) -> Any:
    return (p.worker, p.tier, tuple((e.seq, e.pid) for e in p.entries), getattr(p, "dests", None))
