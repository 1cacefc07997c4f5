"""The model of the ``vllm`` profile: a vLLM-style block pool (and its host tier).

The pool holds ``capacity`` physical blocks. A physical block is free, held
without a hash by one request (the partial tail, or a block being computed),
or a cached *copy* of a block hash with an owner count. Cached copies with no
owner wait in one LRU list (oldest first) and are evicted only when an
allocation finds no free block; blocks without a hash go straight back to the
free slots, so they are always reused before a cached block is evicted
(VLLM-FREE-ORDER). A request frees its blocks in reverse order, leaf first,
so that under pressure its leaves go before its parents.

Operations (``spec.wire``), as the request driver (``reference.requests``)
issues them for one engine step:

- ``Use(blocks)``: the request's block table for this step. The leading full
  blocks that have a cached copy are prefix hits (VLLM-PREFIX-HIT): their
  first copy gains an owner (taken out of the LRU list if it had none). Every
  later full block takes a fresh physical block and is cached as a new copy
  (USE-NEW); each partial block takes a fresh physical block without a hash
  (USE-PARTIAL). All-or-nothing (USE-CAPACITY): when the fresh blocks do not
  fit in the free slots plus the evictable cached copies, nothing changes.
  Events: one Removed naming the evicted copies' hashes in eviction order
  (VLLM-LAZY-REMOVE: this is the only moment a cached block is reported
  gone), then one Stored for the new full blocks, anchored to the last hit
  (PARENT-ANCHOR). Result value: the number of prefix-hit blocks.
- ``Promote(uuid)``: the physical block the request holds as ``uuid`` is now
  full and is cached as a copy of ``seq_hash`` (a decode-filled block, or a
  recomputed prompt block): one Stored.
- ``Deref(blocks)``: release, in the order given. A full block releases the
  oldest copy of that hash with an owner not held under a uuid; a partial
  block (named by its uuid, before or after its Promote) releases exactly
  that physical block, so a promoted block is freed by its uuid only
  (DEREF-UNKNOWN otherwise). No events.
- ``Reset``: the prefix-cache reset; succeeds only with no block held, drops
  every cached copy and publishes one Cleared (CLEAR-ALL).

The spec's copy rules (STORE-COPY, REMOVE-COPY): the same hash may be cached
in several physical copies (a block-aligned prompt recomputes its last block
although it is cached); every copy has its own Stored when it is cached and
its own Removed when it is evicted, so that a router counting copies per hash
always knows whether some copy is still resident.

Where vLLM publishes one ``BlockRemoved`` per evicted block, the model
publishes one Removed per allocation naming all of them in eviction order
(the form Dynamo's KV event publisher uses); the order and content are the
same.

The host tier (``HostTier``) models the write-through CPU tier the request
driver uses, as the Dynamo mocker's was seen to behave: after a request's
prefill every full prompt block is written through; blocks already there are
refreshed, deepest first, so the earliest block is the most recent; the
missing ones are stored as one batch, newer than the refreshed ones, and
inside a batch the deepest block is evicted first (leaves before parents, as
on the device). Victims are the least recent blocks outside the request; a
batch that cannot fit is not stored at all. Events: one host_pinned Removed for the batch's victims, then
one host_pinned Stored per run of consecutive missing blocks, anchored to the
block before the run (``start_position`` = the run's first block index).

``PoolVariant`` holds the departures from the spec that the conformance
checker can *follow*: each is named by the rule it breaks, is off by default,
and lets the checker keep comparing an implementation exactly after it has
reported that departure (the way it follows an eviction-tie choice). The spec
is the default variant; a variant is never a passing verdict.

Pure and deterministic: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kvspec.reference.labels import EventLabel, Trace, label
from kvspec.reference.outcome import Step
from kvspec.reference.validation import check_use_shape
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError, InvalidOperation
from kvspec.spec.registry import VLLM_NAME
from kvspec.spec.rules import rid
from kvspec.spec.wire import (
    Counters,
    Deref,
    Destroy,
    FullBlock,
    KvEvent,
    Operation,
    OpResult,
    PartialBlock,
    Promote,
    Reset,
    Stored,
    StoredBlock,
    StoredData,
    SwapIn,
    Tick,
    Use,
    make_cleared,
    make_removed,
)


@dataclass(frozen=True, slots=True)
class PoolVariant:
    """Departures from the spec an implementation may show, by rule.

    - ``first_event_id`` (EVENT-ID): the id of the first published event.
    - ``store_copies`` (STORE-COPY): True is the spec; False publishes no
      Stored for a copy of a hash that already has a resident copy.
    - ``remove_copies`` (REMOVE-COPY): True is the spec; False publishes no
      Removed for an evicted copy while another copy of its hash stays.
    - ``host_order`` (G2-EVICT): inside one host batch, ``"leaf_first"`` is
      the spec; ``"hash"`` evicts in ascending block-hash order.
    - ``full_prompt_hit`` (VLLM-PREFIX-HIT): False is the spec; True lets a
      hit cover the whole block-aligned prompt (no recomputed last block, so
      no second copy of it).
    - ``host_writes_hits`` (G2-EVICT, G2-STORE-ON-COMPLETE): True is the
      spec; False writes through to the host tier only the prompt blocks the
      request did not hit on the device (condition ``host_write_missing``:
      a device hit is neither stored on nor refreshed in the host tier).
    """

    first_event_id: int = 0
    store_copies: bool = True
    remove_copies: bool = True
    host_order: Literal["leaf_first", "hash"] = "leaf_first"
    full_prompt_hit: bool = False
    host_writes_hits: bool = True


SPEC_VARIANT = PoolVariant()


@dataclass(slots=True)
class Copy:
    """One physical block: a cached copy of ``seq`` (or no hash yet)."""

    cid: int
    seq: int | None
    owners: int = 0


@dataclass(frozen=True, slots=True)
class HostBlock:
    """One full prompt block offered to the host tier."""

    seq: int
    local: int
    position: int


@dataclass(slots=True)
class HostTier:
    """The write-through host tier (storage tier ``host_pinned``).

    Recency is a clock: a request first refreshes the blocks it finds on the
    host, deepest first, so that its earliest block is the most recent (each
    refresh takes its own clock value); then the blocks it stores take one
    new clock value together, and inside that batch the deepest block is the
    oldest (``leaf_first``, the spec) or the lowest hash is
    (``hash``, the departure the checker can follow). Victims: the oldest
    entries not among the request's own blocks.
    """

    capacity: int
    order: Literal["leaf_first", "hash"] = "leaf_first"
    #: seq hash -> (clock, position in the request that stored or refreshed it)
    entries: dict[int, tuple[int, int]] = field(default_factory=dict)
    clock: int = 0

    def prefix(self, hashes: Sequence[int], start: int = 0) -> int:
        """How many of ``hashes[start:]`` are resident, counting from ``start``."""
        n = 0
        for h in hashes[start:]:
            if h not in self.entries:
                break
            n += 1
        return n

    def _victim_key(self, h: int) -> tuple[int, int, int]:
        clock, pos = self.entries[h]
        if self.order == "hash":
            return (clock, h, 0)
        return (clock, -pos, h)

    def victims_order(self) -> list[int]:
        """Every entry, next victim first."""
        return sorted(self.entries, key=self._victim_key)

    def plan(self, blocks: Sequence[HostBlock], skip: int = 0) -> tuple[list[int], list[list[HostBlock]]] | None:
        """The victims and the runs of missing blocks a write-through of
        ``blocks`` needs, or None when the batch cannot fit (the first
        ``skip`` blocks are not written, but are still the request's own)."""
        protected = {b.seq for b in blocks}
        missing = [b for b in blocks[skip:] if b.seq not in self.entries]
        need = len(missing) - (self.capacity - len(self.entries))
        victims: list[int] = []
        if need > 0:
            candidates = [h for h in self.victims_order() if h not in protected]
            if len(candidates) < need:
                return None
            victims = candidates[:need]
        runs: list[list[HostBlock]] = []
        prev_missing = False
        for b in blocks[skip:]:
            if b.seq in self.entries:
                prev_missing = False
                continue
            if not prev_missing:
                runs.append([])
            runs[-1].append(b)
            prev_missing = True
        return victims, runs

    def write_through(self, blocks: Sequence[HostBlock], skip: int = 0) -> tuple[list[int], list[list[HostBlock]]]:
        """Refresh the present blocks, then store the missing ones (evicting
        first); the first ``skip`` blocks are neither (``host_writes_hits``).
        Returns (victims, runs); both empty when the batch did not fit (the
        refresh still happened: it is the request's lookup)."""
        planned = self.plan(blocks, skip)
        for b in reversed(blocks[skip:]):
            if b.seq in self.entries:
                self.clock += 1
                self.entries[b.seq] = (self.clock, b.position)
        if planned is None:
            return [], []
        victims, runs = planned
        for h in victims:
            del self.entries[h]
        self.clock += 1
        for run in runs:
            for b in run:
                self.entries[b.seq] = (self.clock, b.position)
        return victims, runs


class VllmPoolModel:
    """Reference model of the ``vllm`` profile (one manager, one dp_rank)."""

    def __init__(
        self, config: ManagerConfig, *, host_blocks: int | None = None, variant: PoolVariant = SPEC_VARIANT
    ) -> None:
        if config.profile != VLLM_NAME:
            raise ConfigError(f"VllmPoolModel runs the vllm profile, not {config.profile!r}")
        if host_blocks is not None and host_blocks < 1:
            raise ConfigError(f"host_blocks must be at least 1, got {host_blocks}")
        self.config = config
        self.variant = variant
        self.capacity = config.capacity
        self.block_size = config.block_size
        self.dp_rank = config.dp_rank
        self.copies: dict[int, Copy] = {}
        self.by_hash: dict[int, list[int]] = {}
        self.inactive: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.held: dict[str, int] = {}  # uuid -> copy id (request-owned physical block)
        self.free = config.capacity
        self.next_cid = 0
        self.next_event_id = variant.first_event_id
        self.host: HostTier | None = HostTier(host_blocks, variant.host_order) if host_blocks else None
        #: the rules behind the current step (``reference.labels``)
        self.trace = Trace()
        #: event id -> the rules behind every event published so far (the
        #: request driver publishes host events outside ``apply``); ``copies``
        #: names the hashes an event names as one copy among several (a
        #: Stored of a hash already resident, a Removed of a copy while
        #: another stays): STORE-COPY / REMOVE-COPY
        self.event_labels: dict[int, EventLabel] = {}

    # ------------------------------------------------------------------ queries
    def cached(self, seq: int) -> bool:
        """Does ``seq`` have a resident copy on the device?"""
        return seq in self.by_hash

    def prefix_hits(self, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` have a resident device copy."""
        n = 0
        for h in hashes:
            if h not in self.by_hash:
                break
            n += 1
        return n

    def counters(self) -> Counters:
        held_hashless = sum(1 for cid in self.held.values() if self.copies[cid].seq is None)
        owned = [c for c in self.copies.values() if c.seq is not None and c.owners > 0]
        return Counters(
            active_blocks=held_hashless + len(owned),
            active_refs=held_hashless + sum(c.owners for c in owned),
            inactive_blocks=len(self.inactive),
            free_blocks=self.free,
        )

    def registered(self, tier: str = "device") -> set[int]:
        if tier == "host_pinned":
            return set(self.host.entries) if self.host else set()
        return set(self.by_hash)

    def announced(self, tier: str = "device") -> set[int]:
        return self.registered(tier)

    def copy_counts(self) -> dict[int, int]:
        """Resident physical copies per hash."""
        return {h: len(ids) for h, ids in self.by_hash.items()}

    def inactive_order(self) -> list[int]:
        """Hashes of the evictable copies, next victim first."""
        return [s for cid in self.inactive if (s := self.copies[cid].seq) is not None]

    def earliest_deadline(self) -> float | None:
        return None

    def fingerprint(self) -> Any:
        return (
            tuple(sorted((c.cid, c.seq, c.owners) for c in self.copies.values())),
            tuple(self.inactive),
            tuple(sorted(self.held.items())),
            self.free,
            self.next_event_id,
            tuple(sorted(self.host.entries.items())) if self.host else None,
            self.host.clock if self.host else None,
        )

    # ---------------------------------------------------------------- events
    def _next_id(self) -> int:
        eid = self.next_event_id
        self.next_event_id += 1
        return eid

    def _stored(
        self,
        blocks: Sequence[tuple[int, int]],
        parent: int | None,
        *,
        tier: Literal["device", "host_pinned"] = "device",
        start_position: int | None = None,
    ) -> KvEvent:
        data = Stored.model_construct(
            stored=StoredData.model_construct(
                parent_hash=parent,
                blocks=[StoredBlock.model_construct(block_hash=s, tokens_hash=t) for s, t in blocks],
                start_position=start_position,
            )
        )
        return KvEvent.model_construct(
            event_id=self._next_id(), data=data, dp_rank=self.dp_rank, storage_tier=tier, block_token_ids=None
        )

    def _removed(self, hashes: list[int], tier: Literal["device", "host_pinned"] = "device") -> KvEvent:
        return make_removed(self._next_id(), hashes, dp_rank=self.dp_rank, tier=tier)

    # ------------------------------------------------------------- dispatch
    def step(self, op: Operation) -> Step:
        """``apply`` with no eviction preference: the one model protocol (``spec.model.ProfileModel``)."""
        return self.apply(op)

    def apply(self, op: Operation, *, prefer: Collection[int] = ()) -> Step:
        self.trace.start()
        self.trace.silent("device", "removed", "VLLM-LAZY-REMOVE")
        step = self._dispatch(op)
        step.labels = labels = self.trace.labels(step.events)
        self.event_labels.update(zip((e.event_id for e in step.events), labels.events, strict=True))
        return step

    def _label(self, ev: KvEvent, lab: EventLabel) -> KvEvent:
        self.event_labels[ev.event_id] = lab
        return self.trace.event(ev, lab)

    def _dispatch(self, op: Operation) -> Step:
        if isinstance(op, Use):
            return self._use(op)
        if isinstance(op, Promote):
            return self._promote(op)
        if isinstance(op, Deref):
            return self._deref(op)
        if isinstance(op, Reset):
            return self._reset()
        if isinstance(op, Destroy):
            raise InvalidOperation(rid("DESTROY-ACTIVE"), "Destroy is an operation of the legacy profile only")
        if isinstance(op, Tick | SwapIn):
            raise InvalidOperation(rid("USE-VALIDATE"), f"the vllm profile has no {op.op} operation")
        raise InvalidOperation(rid("USE-VALIDATE"), f"unknown operation {type(op).__name__}")

    # ------------------------------------------------------------ slot taking
    def _new_copy(self, copy_victims: set[int]) -> tuple[int, int | None]:
        """Take a physical block: a free one, else evict the LRU head.
        Returns (copy id, evicted hash to report or None); a reported victim
        that leaves another copy behind goes into ``copy_victims``.
        Capacity was checked."""
        if self.free:
            self.free -= 1
            victim = None
        else:
            self.trace.did("VLLM-LAZY-REMOVE")
            old, _ = self.inactive.popitem(last=False)
            c = self.copies.pop(old)
            assert c.seq is not None
            ids = self.by_hash[c.seq]
            ids.remove(old)
            victim = c.seq
            if not ids:
                del self.by_hash[c.seq]
            elif not self.variant.remove_copies:
                victim = None  # another copy stays resident: nothing visible changed
            else:
                copy_victims.add(c.seq)
        cid = self.next_cid
        self.next_cid += 1
        self.copies[cid] = Copy(cid, None)
        return cid, victim

    def _cache(self, cid: int, seq: int) -> tuple[bool, bool]:
        """Give physical block ``cid`` the hash ``seq``. Returns (announce it,
        it is a copy beside another resident one): every copy is announced
        in the spec, only the first resident one without ``store_copies``."""
        first = seq not in self.by_hash
        self.copies[cid].seq = seq
        self.by_hash.setdefault(seq, []).append(cid)
        return first or self.variant.store_copies, not first

    # ------------------------------------------------------------------- Use
    def _validate_use(self, op: Use) -> None:
        check_use_shape(op, self.block_size)
        seen_partial: set[str] = set()
        for b in op.blocks:
            if isinstance(b, PartialBlock):
                if b.partial in self.held or b.partial in seen_partial:
                    raise InvalidOperation(rid("USE-PARTIAL"), f"partial block {b.partial} is already held")
                seen_partial.add(b.partial)
            elif seen_partial:
                raise InvalidOperation(
                    rid("USE-VALIDATE"), f"full block {b.full} follows a partial block in one block table"
                )

    def _use(self, op: Use) -> Step:
        self._validate_use(op)
        fulls = [b.full for b in op.blocks if isinstance(b, FullBlock)]
        partials = [b.partial for b in op.blocks if isinstance(b, PartialBlock)]
        hits = self.prefix_hits(fulls)
        hit_cids = [self.by_hash[h][0] for h in fulls[:hits]]
        fresh = len(fulls) - hits + len(partials)
        pinned_inactive = len({cid for cid in hit_cids if cid in self.inactive})
        if fresh > self.free + len(self.inactive) - pinned_inactive:
            self.trace.did("USE-CAPACITY")
            return Step(OpResult(value=0, status="capacity"), [])
        for cid in hit_cids:  # pin the prefix before any eviction
            self.trace.did("VLLM-PREFIX-HIT")
            self.inactive.pop(cid, None)
            self.copies[cid].owners += 1
        evicted: list[int] = []
        copy_victims: set[int] = set()
        new_blocks: list[tuple[int, int]] = []
        new_copies: set[int] = set()
        for i in range(hits, len(fulls)):
            cid, victim = self._new_copy(copy_victims)
            if victim is not None:
                evicted.append(victim)
            self.trace.did("USE-NEW")
            self.copies[cid].owners = 1
            announce, is_copy = self._cache(cid, fulls[i])
            if announce:
                local = op.local_hashes[i] if op.local_hashes else 0
                new_blocks.append((fulls[i], local))
                if is_copy:
                    new_copies.add(fulls[i])
        for uuid in partials:
            cid, victim = self._new_copy(copy_victims)
            if victim is not None:
                evicted.append(victim)
            self.trace.did("USE-PARTIAL")
            self.held[uuid] = cid
        events: list[KvEvent] = []
        if evicted:
            self.trace.did("EVENT-ORDER")  # the Removed of the slots it reused before the Use's Stored
            events.append(self._label(self._removed(evicted), removed_label(evicted, copy_victims)))
        if new_blocks:
            if hits:
                parent: int | None = fulls[hits - 1]
            else:
                parent = op.parent.full if isinstance(op.parent, FullBlock) else None
            first_new = fulls.index(new_blocks[0][0], hits)
            if first_new > hits:  # without store_copies: anchored to the block before the first announced one
                parent = fulls[first_new - 1]
            events.append(self._label(self._stored(new_blocks, parent), _stored_label(new_blocks, new_copies)))
        return Step(OpResult(value=hits, status="ok"), events)

    # --------------------------------------------------------------- Promote
    def _promote(self, op: Promote) -> Step:
        cid = self.held.get(op.uuid)
        if cid is None:
            raise InvalidOperation(rid("PROMOTE-UNKNOWN"), f"Promote of partial block {op.uuid} that is not held")
        if self.copies[cid].seq is not None:
            raise InvalidOperation(rid("PROMOTE-UNKNOWN"), f"partial block {op.uuid} was already promoted")
        if op.token_ids is not None and len(op.token_ids) != self.block_size:
            raise InvalidOperation(
                rid("USE-VALIDATE"),
                f"Promote token_ids has {len(op.token_ids)} tokens; a full block has {self.block_size}",
            )
        self.copies[cid].owners = 1
        events: list[KvEvent] = []
        announce, is_copy = self._cache(cid, op.seq_hash)
        self.trace.did("PROMOTE-NEW")
        if announce:
            new = [(op.seq_hash, op.local_hash)]
            copies = {op.seq_hash} if is_copy else set()
            events.append(self._label(self._stored(new, op.parent_hash), _stored_label(new, copies)))
        return Step(OpResult(value=None), events)

    # ----------------------------------------------------------------- Deref
    def _deref(self, op: Deref) -> Step:
        # validate everything first: a rejected Deref changes nothing
        held = set(self.held.values())
        need: dict[int, int] = {}
        seen: set[str] = set()
        for ref in op.blocks:
            if isinstance(ref, FullBlock):
                need[ref.full] = need.get(ref.full, 0) + 1
                owned = sum(self._hash_owners(c, held) for c in self.by_hash.get(ref.full, ()))
                if need[ref.full] > owned:
                    raise InvalidOperation(
                        rid("DEREF-UNKNOWN"), f"Deref of full block {ref.full} drops more owners than it has ({owned})"
                    )
            else:
                if ref.partial not in self.held or ref.partial in seen:
                    raise InvalidOperation(
                        rid("DEREF-UNKNOWN"), f"Deref of partial block {ref.partial} that is not held"
                    )
                seen.add(ref.partial)
        for ref in op.blocks:
            if isinstance(ref, FullBlock):
                self.trace.did("DEREF-OWNER")
                cid = next(c for c in self.by_hash[ref.full] if self._hash_owners(c, held) > 0)
                self._release(cid)
            else:
                self.trace.did("DEREF-PARTIAL")
                cid = self.held.pop(ref.partial)
                held.discard(cid)
                if self.copies[cid].seq is None:  # straight back to free
                    del self.copies[cid]
                    self.free += 1
                else:
                    self._release(cid)
        return Step(OpResult(value=None), [])

    def _hash_owners(self, cid: int, held: Collection[int]) -> int:
        """The owners of copy ``cid`` that a Deref may drop by naming its hash.

        A promoted block stays held by its request under its uuid: that owner
        is released by naming the uuid, never by the hash. Counting it here
        would let a caller free one physical block twice (once by hash, once
        by uuid), which is the double free DEREF-UNKNOWN rejects: the copy
        would go inactive, be evicted while its uuid is still held, and leave
        an owner count of -1 or a uuid naming no block."""
        return self.copies[cid].owners - (1 if cid in held else 0)

    def _release(self, cid: int) -> None:
        c = self.copies[cid]
        c.owners -= 1
        if c.owners == 0:
            self.trace.did("VLLM-FREE-ORDER")
            self.inactive[cid] = None  # newest at the tail

    # ----------------------------------------------------------------- Reset
    def _reset(self) -> Step:
        self.trace.did("CLEAR-ALL")
        if self.held or any(c.owners for c in self.copies.values()):
            return Step(OpResult(value=False), [])
        self.free += len(self.copies)
        self.copies.clear()
        self.by_hash.clear()
        self.inactive.clear()
        return Step(OpResult(value=True), [self._label(make_cleared(self._next_id(), dp_rank=self.dp_rank), _CLEARED)])

    # ------------------------------------------------------------- host tier
    def host_write_through(self, blocks: Sequence[HostBlock], hits: int = 0) -> list[KvEvent]:
        """Write a request's full prompt blocks through to the host tier
        (``hits``: its blocks hit on the device, skipped unless the variant
        writes hits through, the spec)."""
        if self.host is None or not blocks:
            return []
        victims, runs = self.host.write_through(blocks, 0 if self.variant.host_writes_hits else hits)
        events: list[KvEvent] = []
        if victims:
            self.trace.did("G2-EVICT")
            events.append(self._label(self._removed(victims, "host_pinned"), _HOST_EVICTED))
        by_pos = {b.position: b for b in blocks}
        for run in runs:
            first = run[0].position
            parent = by_pos[first - 1].seq if first > 0 and first - 1 in by_pos else None
            ev = self._stored([(b.seq, b.local) for b in run], parent, tier="host_pinned", start_position=first)
            events.append(self._label(ev, _HOST_STORED))
        return events


_CLEARED = label("CLEAR-ALL")
#: the host tier's Removed of a write-through's victims, in the host tier's order
_HOST_EVICTED = label("G2-EVICT", choice="G2-EVICT")
#: a write-through run's host Stored, anchored to the prompt block before it
_HOST_STORED = label("G2-STORE-ON-COMPLETE", parent="PARENT-ANCHOR", tokens="STORE-TOKENS-HASH")


def removed_label(evicted: Sequence[int], copies: set[int]) -> EventLabel:
    """A device Removed of the blocks whose slots were reused, in the free
    queue's order; ``copies``: those evicted while another copy stays."""
    return label(
        "REMOVE-COPY" if copies and set(evicted) <= copies else "VLLM-LAZY-REMOVE",
        "VLLM-FREE-ORDER",
        choice="VLLM-FREE-ORDER",
        copies=frozenset(copies),
    )


def _stored_label(blocks: Sequence[tuple[int, int]], copies: set[int]) -> EventLabel:
    """A device Stored of newly cached blocks; ``copies``: those cached as another physical copy."""
    every_copy = bool(copies) and all(h in copies for h, _ in blocks)
    return label(
        "STORE-COPY" if every_copy else "STORE-NEW-ONLY",
        "STORE-NEW-ONLY",
        parent="PARENT-ANCHOR",
        tokens="STORE-TOKENS-HASH",
        copies=frozenset(copies),
    )
