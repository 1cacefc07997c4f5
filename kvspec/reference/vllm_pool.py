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

The rules are transitions (``reference.transitions``, block operations): per
operation an effect (``OPERATIONS``), per block the first transition of a
table whose guard holds (``PREFIX_HIT``, ``REUSE``, ``NEW_FULL``, ``DEREF``,
...); an event takes its label from the transitions that decided its blocks
(a block cached or evicted as one copy among several is decided by a copy
transition: ``BlockModel.publish_blocks``).

Pure and deterministic: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from kvspec.reference.labels import EventLabel, label
from kvspec.reference.outcome import Step
from kvspec.reference.transitions import BlockModel, BlockOperation, Transition, always, merged_label
from kvspec.reference.validation import check_use_shape
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError, InvalidOperation
from kvspec.spec.registry import VLLM_NAME
from kvspec.spec.rules import RuleName, rid
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


_CLEARED = label("CLEAR-ALL")
#: the host tier's Removed of a write-through's victims, in the host tier's order
_HOST_EVICTED = label("G2-EVICT", choice="G2-EVICT")
#: a write-through run's host Stored, anchored to the prompt block before it
_HOST_STORED = label("G2-STORE-ON-COMPLETE", parent="PARENT-ANCHOR", tokens="STORE-TOKENS-HASH")
#: a device Removed of the blocks whose slots were reused, in the free queue's order: of a hash's
#: last resident copy, or of one copy while another stays
_REUSED = label("VLLM-LAZY-REMOVE", "VLLM-FREE-ORDER", choice="VLLM-FREE-ORDER")
_REUSED_COPY = label("REMOVE-COPY", "VLLM-FREE-ORDER", choice="VLLM-FREE-ORDER")
#: a device Stored of newly cached blocks: first copies, or one more copy of a resident hash
_STORED = label("STORE-NEW-ONLY", parent="PARENT-ANCHOR", tokens="STORE-TOKENS-HASH")
_STORED_COPY = label("STORE-COPY", "STORE-NEW-ONLY", parent="PARENT-ANCHOR", tokens="STORE-TOKENS-HASH")


@dataclass(slots=True)
class _Reuse:
    """The LRU head whose physical block an allocation takes (out of the queue already)."""

    cid: int


@dataclass(slots=True)
class _Caching:
    """A physical block a request now holds full, to be cached as a copy of ``seq``."""

    cid: int
    seq: int


def _rejected(rule: RuleName, why: str) -> Any:
    def effect(m: object, op: Operation) -> Step:
        raise InvalidOperation(rid(rule), why)

    return effect


# ---------------------------------------------------------------- the tables
#: a leading full block with a cached copy: its first copy gains an owner (pinned before any eviction)
PREFIX_HIT: tuple[Transition[Any, Any], ...] = (Transition("VLLM-PREFIX-HIT", int, always, "_pin_hit"),)
#: a Use whose fresh blocks do not fit changes nothing
REFUSE: tuple[Transition[Any, Any], ...] = (Transition("USE-CAPACITY", Use, always, "_refuse_whole"),)
#: an allocation with no free block takes the LRU head's: reported gone when it was its hash's last
#: copy, or (variant remove_copies, the spec) as one copy while another stays; else nothing visible
REUSE: tuple[Transition[Any, Any], ...] = (
    Transition("VLLM-LAZY-REMOVE", _Reuse, "_copy_stays_reported", "_reuse", publishes=_REUSED_COPY, copy=True),
    Transition("VLLM-LAZY-REMOVE", _Reuse, "_copy_stays", "_reuse"),
    Transition("VLLM-LAZY-REMOVE", _Reuse, always, "_reuse", publishes=_REUSED),
)
#: a fresh block cached under its hash: the first copy, one more announced copy (store_copies, the
#: spec), or one more copy not announced
NEW_FULL: tuple[Transition[Any, Any], ...] = (
    Transition("USE-NEW", _Caching, "_resident_announced", "_cache_owned", publishes=_STORED_COPY, copy=True),
    Transition("USE-NEW", _Caching, "_resident", "_cache_owned"),
    Transition("USE-NEW", _Caching, always, "_cache_owned", publishes=_STORED),
)
NEW_PARTIAL: tuple[Transition[Any, Any], ...] = (Transition("USE-PARTIAL", tuple, always, "_hold_partial"),)
#: the Removed of the reused slots goes before the Use's Stored
REUSED_OUT: tuple[Transition[Any, Any], ...] = (Transition("EVENT-ORDER", list, always, "_publish_reused"),)
PROMOTE: tuple[Transition[Any, Any], ...] = (
    Transition("PROMOTE-NEW", _Caching, "_resident_announced", "_cache_owned", publishes=_STORED_COPY, copy=True),
    Transition("PROMOTE-NEW", _Caching, "_resident", "_cache_owned"),
    Transition("PROMOTE-NEW", _Caching, always, "_cache_owned", publishes=_STORED),
)
#: one block of a validated Deref: (ref, the copies held under a uuid)
DEREF: tuple[Transition[Any, Any], ...] = (
    Transition("DEREF-OWNER", tuple, "_names_hash", "_release_hash"),
    Transition("DEREF-PARTIAL", tuple, always, "_release_uuid"),
)
#: a copy that loses its last owner joins the free queue at its tail
FREE_QUEUE: tuple[Transition[Any, Any], ...] = (Transition("VLLM-FREE-ORDER", int, always, "_queue_free"),)
RESET: tuple[Transition[Any, Any], ...] = (
    Transition("CLEAR-ALL", Reset, "_anything_held", "_refuse_reset"),
    Transition("CLEAR-ALL", Reset, always, "_clear_all", publishes=_CLEARED),
)
#: the host tier's write-through: its victims' Removed, then one Stored per run of missing blocks
#: (the runs are the write-through's own, not a rule of their own: only their label is the table's)
HOST_EVICTION: tuple[Transition[Any, Any], ...] = (
    Transition("G2-EVICT", list, always, "_host_removed", publishes=_HOST_EVICTED),
)
HOST_STORE: Transition[Any, Any] = Transition("G2-STORE-ON-COMPLETE", list, always, always, publishes=_HOST_STORED)


def removed_label(evicted: Sequence[int], copies: set[int]) -> EventLabel:
    """The label of a device Removed of the blocks whose slots were reused, in the free queue's
    order (``copies``: those evicted while another copy stays): the REUSE transitions' that decide
    such victims (for a checker labelling an event the model did not publish)."""
    if not evicted:
        return replace(_REUSED_COPY if copies else _REUSED, copies=frozenset(copies))
    lab = merged_label([(REUSE[0] if h in copies else REUSE[2], h) for h in evicted])
    return replace(lab, copies=frozenset(copies))


#: every operation: an unexpected device Removed breaks VLLM-LAZY-REMOVE (a cached block is
#: reported gone only when its slot is reused)
_LAZY: tuple[tuple[str, str, RuleName], ...] = (("device", "removed", "VLLM-LAZY-REMOVE"),)
OPERATIONS: tuple[BlockOperation, ...] = (
    BlockOperation(Use, lambda m, op: m._use(op), "USE-CAPACITY", silent=_LAZY),
    BlockOperation(Promote, lambda m, op: m._promote(op), "PROMOTE-NEW", silent=_LAZY),
    BlockOperation(Deref, lambda m, op: m._deref(op), "DEREF-OWNER", silent=_LAZY),
    BlockOperation(Reset, lambda m, op: m._reset(), "CLEAR-ALL", silent=_LAZY),
    BlockOperation(
        Destroy,
        _rejected("DESTROY-ACTIVE", "Destroy is an operation of the legacy profile only"),
        "DESTROY-ACTIVE",
        silent=_LAZY,
    ),
    BlockOperation((Tick, SwapIn), lambda m, op: m._not_vllm(op), "USE-VALIDATE", silent=_LAZY),
    BlockOperation(object, lambda m, op: m._unknown(op), "USE-VALIDATE", silent=_LAZY),
)


class VllmPoolModel(BlockModel):
    """Reference model of the ``vllm`` profile (one manager, one dp_rank)."""

    OPERATIONS: ClassVar[Sequence[BlockOperation]] = OPERATIONS
    TABLES: ClassVar[Sequence[Sequence[Transition[Any, Any]]]] = (
        PREFIX_HIT,
        REFUSE,
        REUSE,
        NEW_FULL,
        NEW_PARTIAL,
        REUSED_OUT,
        PROMOTE,
        DEREF,
        FREE_QUEUE,
        RESET,
        HOST_EVICTION,
    )

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
        self.begin_step()
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
        self.begin_step()
        step: Step = self.run_operation(op)
        step.labels = labels = self.step_labels(step.events)
        self.event_labels.update(zip((e.event_id for e in step.events), labels.events, strict=True))
        return step

    def publish(self, ev: KvEvent, by: Transition[Any, Any]) -> KvEvent:
        super().publish(ev, by)
        self.event_labels[ev.event_id] = self._published[ev.event_id]
        return ev

    def publish_blocks(self, ev: KvEvent, decided: Sequence[tuple[Transition[Any, Any], int]]) -> KvEvent:
        super().publish_blocks(ev, decided)
        self.event_labels[ev.event_id] = self._published[ev.event_id]
        return ev

    def _not_vllm(self, op: Tick | SwapIn) -> Step:
        raise InvalidOperation(rid("USE-VALIDATE"), f"the vllm profile has no {op.op} operation")

    def _unknown(self, op: Operation) -> Step:
        raise InvalidOperation(rid("USE-VALIDATE"), f"unknown operation {type(op).__name__}")

    # ------------------------------------------------------------ slot taking
    def _new_copy(self, reused: list[tuple[Transition[Any, Any], int]]) -> int:
        """Take a physical block: a free one, else the LRU head's (REUSE; a reported victim, with
        the transition that decided it, goes into ``reused``). Returns its copy id. Capacity was
        checked."""
        if self.free:
            self.free -= 1
        else:
            old, _ = self.inactive.popitem(last=False)
            t, seq = self.taken(REUSE, _Reuse(old))
            if t.publishes is not None:
                reused.append((t, seq))
        cid = self.next_cid
        self.next_cid += 1
        self.copies[cid] = Copy(cid, None)
        return cid

    def _copy_stays(self, r: _Reuse) -> bool:
        seq = self.copies[r.cid].seq
        assert seq is not None
        return len(self.by_hash[seq]) > 1

    def _copy_stays_reported(self, r: _Reuse) -> bool:
        return self.variant.remove_copies and self._copy_stays(r)

    def _reuse(self, r: _Reuse) -> int:
        c = self.copies.pop(r.cid)
        assert c.seq is not None
        ids = self.by_hash[c.seq]
        ids.remove(r.cid)
        if not ids:
            del self.by_hash[c.seq]
        return c.seq

    def _cache(self, cid: int, seq: int) -> None:
        """Give physical block ``cid`` the hash ``seq`` (one more copy if it is resident)."""
        self.copies[cid].seq = seq
        self.by_hash.setdefault(seq, []).append(cid)

    def _resident(self, c: _Caching) -> bool:
        return c.seq in self.by_hash

    def _resident_announced(self, c: _Caching) -> bool:
        """Every copy is announced in the spec, only the first resident one without ``store_copies``."""
        return self.variant.store_copies and c.seq in self.by_hash

    def _cache_owned(self, c: _Caching) -> None:
        self.copies[c.cid].owners = 1
        self._cache(c.cid, c.seq)

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
            refused: Step = self.take(REFUSE, op)
            return refused
        for cid in hit_cids:  # pin the prefix before any eviction
            self.take(PREFIX_HIT, cid)
        reused: list[tuple[Transition[Any, Any], int]] = []
        new_blocks: list[tuple[int, int]] = []
        decided: list[tuple[Transition[Any, Any], int]] = []
        for i in range(hits, len(fulls)):
            cid = self._new_copy(reused)
            t, _ = self.taken(NEW_FULL, _Caching(cid, fulls[i]))
            if t.publishes is not None:
                new_blocks.append((fulls[i], op.local_hashes[i] if op.local_hashes else 0))
                decided.append((t, fulls[i]))
        for uuid in partials:
            cid = self._new_copy(reused)
            self.take(NEW_PARTIAL, (uuid, cid))
        events: list[KvEvent] = []
        if reused:
            events.append(self.take(REUSED_OUT, reused))
        if new_blocks:
            if hits:
                parent: int | None = fulls[hits - 1]
            else:
                parent = op.parent.full if isinstance(op.parent, FullBlock) else None
            first_new = fulls.index(new_blocks[0][0], hits)
            if first_new > hits:  # without store_copies: anchored to the block before the first announced one
                parent = fulls[first_new - 1]
            events.append(self.publish_blocks(self._stored(new_blocks, parent), decided))
        return Step(OpResult(value=hits, status="ok"), events)

    def _refuse_whole(self, op: Use) -> Step:
        return Step(OpResult(value=0, status="capacity"), [])

    def _pin_hit(self, cid: int) -> None:
        self.inactive.pop(cid, None)
        self.copies[cid].owners += 1

    def _hold_partial(self, held: tuple[str, int]) -> None:
        self.held[held[0]] = held[1]

    def _publish_reused(self, reused: list[tuple[Transition[Any, Any], int]]) -> KvEvent:
        return self.publish_blocks(self._removed([h for _t, h in reused]), reused)

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
        events: list[KvEvent] = []
        t, _ = self.taken(PROMOTE, _Caching(cid, op.seq_hash))
        if t.publishes is not None:
            ev = self._stored([(op.seq_hash, op.local_hash)], op.parent_hash)
            events.append(self.publish_blocks(ev, [(t, op.seq_hash)]))
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
            self.take(DEREF, (ref, held))
        return Step(OpResult(value=None), [])

    def _names_hash(self, item: tuple[FullBlock | PartialBlock, set[int]]) -> bool:
        return isinstance(item[0], FullBlock)

    def _release_hash(self, item: tuple[FullBlock, set[int]]) -> None:
        ref, held = item
        cid = next(c for c in self.by_hash[ref.full] if self._hash_owners(c, held) > 0)
        self._release(cid)

    def _release_uuid(self, item: tuple[PartialBlock, set[int]]) -> None:
        ref, held = item
        cid = self.held.pop(ref.partial)
        held.discard(cid)
        if self.copies[cid].seq is None:  # straight back to free
            del self.copies[cid]
            self.free += 1
        else:
            self._release(cid)

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
            self.take(FREE_QUEUE, cid)

    def _queue_free(self, cid: int) -> None:
        self.inactive[cid] = None  # newest at the tail

    # ----------------------------------------------------------------- Reset
    def _reset(self) -> Step:
        step: Step = self.take(RESET, Reset())
        return step

    def _anything_held(self, op: Reset) -> bool:
        return bool(self.held) or any(c.owners for c in self.copies.values())

    def _refuse_reset(self, op: Reset) -> Step:
        return Step(OpResult(value=False), [])

    def _clear_all(self, op: Reset) -> Step:
        self.free += len(self.copies)
        self.copies.clear()
        self.by_hash.clear()
        self.inactive.clear()
        return Step(OpResult(value=True), [self.publish(make_cleared(self._next_id(), dp_rank=self.dp_rank), RESET[1])])

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
            events.append(self.take(HOST_EVICTION, victims))
        by_pos = {b.position: b for b in blocks}
        for run in runs:
            first = run[0].position
            parent = by_pos[first - 1].seq if first > 0 and first - 1 in by_pos else None
            ev = self._stored([(b.seq, b.local) for b in run], parent, tier="host_pinned", start_position=first)
            events.append(self.publish(ev, HOST_STORE))
        return events

    def _host_removed(self, victims: list[int]) -> KvEvent:
        return self.publish(self._removed(victims, "host_pinned"), HOST_EVICTION[0])
