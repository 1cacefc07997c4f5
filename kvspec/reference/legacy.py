"""The ``legacy`` profile: the published dynamo-mocker 1.0.2 KV manager.

One hash cache of capacity N holds active entries (block -> owner count) and
an LRU list of inactive entries; partial blocks are entries like any other.
Where it differs from ``kvbm`` (spec/SPEC.md, "Profiles"):

- a Use returns a boolean; when no slot is left it returns false at once,
  keeping the blocks it placed but publishing no Stored for them;
- an eviction publishes its Removed immediately, before the batch's Stored;
- the Stored's parent is the last hit block of the batch, and its tokens
  hashes are the tail of the caller's local hashes;
- ``Destroy`` removes active blocks outright and publishes Removed;
- a Deref of a block that is not active is ignored; a partial block whose
  last owner goes becomes an inactive entry (it is not freed).

Operations the seed would panic on part-way (a Destroy of a block that is not
active, a Promote of a partial that is not held, a Use that would make a held
partial block the Stored parent, missing local hashes) are rejected here
before anything changes, with the rule id.

USE-VALIDATE is stricter than the source (a known break of the profile):
kvspec wants one local hash and, when token ids are given, one token list
per full block. The 1.0.2 source (ai-dynamo/dynamo lib/mocker/src/kv_manager.rs,
``KvManager::process``, the ``MoveBlock::Use`` arm, and ``publish_kv_event``)
checks neither: the Stored takes the *tail* of the local hashes, as many as
it names blocks, and a token list is read, by the block's position in the
batch, only for a block that is newly placed. ``source_validation = True``
runs a Use that way (rejecting, before anything changes, only what the
source would panic on: fewer local hashes than the blocks the Stored names,
or no token list at a new block's position). It is the lockstep's follow
mode ``legacy_source_validation`` (``FOLLOW``) and what a port that behaves
like the source does; ports that have kvspec's checks declare the capability
``strict_validation``.

The rules are transitions (``reference.transitions``, block operations): per
operation an effect (``OPERATIONS``), per block the first transition of a
table whose guard holds (``PLACE``, ``EVICTION``, ``DEREF``, ``DESTROY``,
``PROMOTE``, at the end of the module's definitions before the class); each
event is published with the label of the transition that decided its blocks.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvspec.reference.labels import label
from kvspec.reference.outcome import Step
from kvspec.reference.transitions import BlockModel, BlockOperation, Transition, always
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError, InvalidOperation
from kvspec.spec.registry import LEGACY_NAME
from kvspec.spec.rules import RuleId, RuleName, rid
from kvspec.spec.wire import (
    BlockRef,
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
    SwapIn,
    Tick,
    Use,
    make_removed,
    make_stored,
)

Key = tuple[str, int | str]  # ("F", seq) or ("P", uuid)
#: the Stored of a Use or a Promote: the blocks it placed, anchored to the last hit
_STORED = label("STORE-NEW-ONLY", parent="PARENT-ANCHOR", tokens="STORE-TOKENS-HASH")
#: an eviction's Removed: the LRU victim, published at once
_EVICTED = label("REMOVE-EXACT", choice="EVICT-POLICY")


def key_of(ref: BlockRef) -> Key:
    return ("F", ref.full) if isinstance(ref, FullBlock) else ("P", ref.partial)


@dataclass(slots=True)
class _Placing:
    """A Use in progress: its events, the blocks its Stored names and the parent it anchors to."""

    op: Use
    events: list[KvEvent] = field(default_factory=list)
    stored: list[int] = field(default_factory=list)
    stored_tokens: list[list[int]] = field(default_factory=list)
    parent: int | None = None


@dataclass(slots=True)
class _Entry:
    """One block of a Use: its cache key and the index of its token list."""

    walk: _Placing
    ref: BlockRef
    key: Key
    idx: int


@dataclass(slots=True)
class _Victim:
    """The LRU entry a Use's block evicts (taken out of the list already)."""

    key: Key
    walk: _Placing


def _full_victim(m: object, v: _Victim) -> bool:
    return isinstance(v.key[1], int)  # a full block (a partial one's key is its uuid)


def _rejected(rule: RuleName, why: str) -> Any:
    def effect(m: object, op: Operation) -> Step:
        raise InvalidOperation(rid(rule), why)

    return effect


# ---------------------------------------------------------------- the tables
#: one block of a Use (a block that needs a slot has taken the LRU victim's first, if the cache is full)
USE_NEW: Transition[Any, Any] = Transition("USE-NEW", _Entry, always, "_place_new", publishes=_STORED)
PLACE: tuple[Transition[Any, Any], ...] = (
    Transition("USE-HIT-ACTIVE", _Entry, "_is_active", "_hit_active"),
    Transition("USE-HIT-INACTIVE", _Entry, "_is_inactive", "_hit_inactive"),
    Transition("USE-CAPACITY", _Entry, "_cache_full", "_out_of_slots"),
    Transition("USE-PARTIAL", _Entry, "_is_partial", "_place_partial"),
    USE_NEW,
)
#: the LRU victim: a full block's Removed goes out at once, before the batch's Stored
EVICTION: tuple[Transition[Any, Any], ...] = (
    Transition("EVICT-POLICY", _Victim, _full_victim, "_announce_eviction", also=("EVENT-ORDER",), publishes=_EVICTED),
    Transition("EVICT-POLICY", _Victim, always, "_drop_victim"),
)
#: one block of a Deref (a key)
DEREF: tuple[Transition[Any, Any], ...] = (
    Transition("DEREF-UNKNOWN", tuple, "_not_held", "_ignore"),  # the legacy manager ignores it
    Transition("DEREF-OWNER", tuple, always, "_drop_owner"),
)
#: one block of a validated Destroy (a key)
DESTROY: tuple[Transition[Any, Any], ...] = (
    Transition("DESTROY-ACTIVE", tuple, always, "_destroy_entry", publishes=label("DESTROY-ACTIVE")),
)
PROMOTE_NEW: Transition[Any, Any] = Transition("PROMOTE-NEW", Promote, always, "_promote_new", publishes=_STORED)
PROMOTE: tuple[Transition[Any, Any], ...] = (
    Transition("PROMOTE-EXISTING", Promote, "_promotes_cached", "_promote_existing", result=True),
    PROMOTE_NEW,
)
TICK: tuple[Transition[Any, Any], ...] = (Transition("TIME-MONOTONIC", Tick, always, "_tick"),)

#: the operations: the effect that walks each through the tables, and the rule of its result
OPERATIONS: tuple[BlockOperation, ...] = (
    BlockOperation(Use, lambda m, op: m._use(op), "USE-CAPACITY"),
    BlockOperation(Deref, lambda m, op: m._deref(op), "DEREF-OWNER"),
    BlockOperation(
        Destroy,
        lambda m, op: m._destroy(op),
        "DESTROY-ACTIVE",
        silent=(("device", "removed", "DESTROY-ACTIVE"), ("device", "stored", "DESTROY-ACTIVE")),
    ),
    BlockOperation(Promote, lambda m, op: m._promote(op), "PROMOTE-NEW"),
    BlockOperation(Tick, lambda m, op: m.take(TICK, op), "TIME-MONOTONIC"),
    BlockOperation(SwapIn, lambda m, op: Step(OpResult(value=0, status="no_hits"), []), "SWAPIN-RESERVE"),
    BlockOperation(
        Reset, _rejected("CLEAR-ALL", "a prefix-cache reset is an operation of the vllm profile only"), "CLEAR-ALL"
    ),
    BlockOperation(object, lambda m, op: m._unknown(op), "USE-VALIDATE"),
)


class LegacyModel(BlockModel):
    """Reference model of the legacy profile (LRU only, no offload)."""

    OPERATIONS: ClassVar[Sequence[BlockOperation]] = OPERATIONS
    TABLES: ClassVar[Sequence[Sequence[Transition[Any, Any]]]] = (PLACE, EVICTION, DEREF, DESTROY, PROMOTE, TICK)

    #: the lockstep's follow modes (``conformance/block/follow.py``):
    #: condition -> (the rule departed from, the switch that runs it)
    FOLLOW: dict[str, tuple[RuleId, str]] = {"legacy_source_validation": (RuleId.USE_VALIDATE, "source_validation")}
    #: validate a Use as the 1.0.2 source does (see the module doc)
    source_validation: bool = False

    def __init__(self, config: ManagerConfig) -> None:
        if config.profile != LEGACY_NAME:
            raise ConfigError("LegacyModel runs the legacy profile only")
        self.config = config
        self.capacity = config.capacity
        self.block_size = config.block_size
        self.dp_rank = config.dp_rank
        self.active: dict[Key, int] = {}
        self.inactive: OrderedDict[Key, None] = OrderedDict()
        self.unannounced: set[int] = set()
        self.next_event_id = 0
        self.begin_step()

    # ---------------------------------------------------------------- queries
    def counters(self) -> Counters:
        n_active = len(self.active)
        return Counters(
            active_blocks=n_active,
            active_refs=sum(self.active.values()),
            inactive_blocks=len(self.inactive),
            free_blocks=self.capacity - n_active - len(self.inactive),
        )

    def registered(self, tier: str = "device") -> set[int]:
        if tier != "device":
            return set()
        return {k[1] for k in (*self.active, *self.inactive) if isinstance(k[1], int)}

    def announced(self, tier: str = "device") -> set[int]:
        return self.registered(tier) - self.unannounced

    def owners(self) -> dict[int, int]:
        return {k[1]: n for k, n in self.active.items() if isinstance(k[1], int)}

    def inactive_blocks(self) -> list[int]:
        return [k[1] for k in self.inactive if isinstance(k[1], int)]

    def allowed_victims(self) -> list[int]:
        first = next(iter(self.inactive), None)
        return [first[1]] if first is not None and isinstance(first[1], int) else []

    def earliest_deadline(self) -> float | None:
        return None

    def fingerprint(self) -> Any:
        return (
            tuple(sorted(self.active.items(), key=repr)),
            tuple(self.inactive),
            tuple(sorted(self.unannounced)),
            self.next_event_id,
        )

    # --------------------------------------------------------------- dispatch
    def step(self, op: Operation) -> Step:
        """``apply`` with no eviction preference: the one model protocol (``spec.model.ProfileModel``)."""
        return self.apply(op)

    def apply(self, op: Operation, *, prefer: Collection[int] = ()) -> Step:
        self.begin_step()
        step: Step = self.run_operation(op)
        step.labels = self.step_labels(step.events)
        return step

    def _unknown(self, op: Operation) -> Step:
        raise InvalidOperation(rid("USE-VALIDATE"), f"unknown operation {type(op).__name__}")

    def _tick(self, op: Tick) -> Step:
        return Step(OpResult(value=0), [])

    def _event_id(self) -> int:
        eid = self.next_event_id
        self.next_event_id += 1
        return eid

    # ------------------------------------------------------------------- Use
    def _use(self, op: Use) -> Step:
        if self.source_validation:
            return self._use_as_source(op)
        n_full = sum(1 for b in op.blocks if isinstance(b, FullBlock))
        if len(op.local_hashes) != n_full:
            raise InvalidOperation(
                rid("USE-VALIDATE"),
                f"the legacy Use needs one local hash per full block ({len(op.local_hashes)} for {n_full})",
            )
        if op.token_ids is not None and len(op.token_ids) != n_full:
            raise InvalidOperation(
                rid("USE-VALIDATE"), f"token_ids has {len(op.token_ids)} entries for {n_full} full blocks"
            )
        self._check_parent_and_partials(op)
        return self._place(op)

    def _check_parent_and_partials(self, op: Use) -> None:
        if op.parent is not None:
            raise InvalidOperation(rid("USE-VALIDATE"), "the legacy Use takes no parent")
        for ref in op.blocks:
            if isinstance(ref, PartialBlock) and ("P", ref.partial) in self.active:
                raise InvalidOperation(
                    rid("USE-VALIDATE"), f"partial block {ref.partial} is already held (it would become the parent)"
                )

    def _use_as_source(self, op: Use) -> Step:
        """A Use validated as the 1.0.2 source does it (module doc): run it,
        and if the source would have panicked part-way, put everything back
        and reject it."""
        self._check_parent_and_partials(op)
        saved = (copy.copy(self.active), copy.copy(self.inactive), set(self.unannounced), self.next_event_id)
        try:
            return self._place(op, by_position=True)
        except InvalidOperation:
            self.active, self.inactive, self.unannounced, self.next_event_id = saved
            raise

    def _place(self, op: Use, *, by_position: bool = False) -> Step:
        """Place the blocks of a validated Use (``by_position``: token lists
        read by the block's position in the batch, local hashes not counted
        up front: the source's way)."""
        walk = _Placing(op)
        fi = 0
        for pos, ref in enumerate(op.blocks):
            k = key_of(ref)
            e = _Entry(walk, ref, k, pos if by_position else fi)
            if isinstance(ref, FullBlock):
                fi += 1
            if k not in self.active and k not in self.inactive and self._cache_full(e) and self.inactive:
                victim, _ = self.inactive.popitem(last=False)
                self.take(EVICTION, _Victim(victim, walk))
            stop: Step | None = self.take(PLACE, e)
            if stop is not None:
                return stop
        events, stored = walk.events, walk.stored
        if stored:
            if len(op.local_hashes) < len(stored):
                raise InvalidOperation(
                    rid("USE-VALIDATE"), f"{len(op.local_hashes)} local hashes for {len(stored)} stored blocks"
                )
            tokens_hashes = op.local_hashes[len(op.local_hashes) - len(stored) :]
            ev = make_stored(
                self._event_id(),
                stored,
                list(tokens_hashes),
                walk.parent,
                dp_rank=self.dp_rank,
                token_ids=walk.stored_tokens if op.token_ids is not None else None,
            )
            events.append(self.publish(ev, USE_NEW))
        return Step(OpResult(value=True), events)

    def _is_active(self, e: _Entry) -> bool:
        return e.key in self.active

    def _is_inactive(self, e: _Entry) -> bool:
        return e.key in self.inactive

    def _cache_full(self, e: _Entry) -> bool:
        return len(self.active) + len(self.inactive) >= self.capacity

    def _is_partial(self, e: _Entry) -> bool:
        return isinstance(e.ref, PartialBlock)

    def _hit_active(self, e: _Entry) -> None:
        self.active[e.key] += 1
        if isinstance(e.ref, FullBlock):
            e.walk.parent = e.ref.full

    def _hit_inactive(self, e: _Entry) -> None:
        del self.inactive[e.key]
        self.active[e.key] = 1
        if isinstance(e.ref, FullBlock):
            e.walk.parent = e.ref.full

    def _out_of_slots(self, e: _Entry) -> Step:
        """False at once; the blocks placed stay, with no Stored."""
        self.unannounced.update(e.walk.stored)
        return Step(OpResult(value=False, status="capacity"), e.walk.events)

    def _place_partial(self, e: _Entry) -> None:
        self.active[e.key] = 1

    def _place_new(self, e: _Entry) -> None:
        op, ref, idx = e.walk.op, e.ref, e.idx
        assert isinstance(ref, FullBlock)
        self.active[e.key] = 1
        e.walk.stored.append(ref.full)
        if op.token_ids is not None:
            if idx >= len(op.token_ids):
                raise InvalidOperation(rid("USE-VALIDATE"), f"no token list at position {idx} for new block {ref.full}")
            e.walk.stored_tokens.append(op.token_ids[idx])

    def _announce_eviction(self, v: _Victim) -> None:
        seq = v.key[1]
        assert isinstance(seq, int)
        self.unannounced.discard(seq)
        ev = make_removed(self._event_id(), [seq], dp_rank=self.dp_rank)
        v.walk.events.append(self.publish(ev, EVICTION[0]))

    def _drop_victim(self, v: _Victim) -> None:
        """A partial block's entry goes with no event."""

    # ------------------------------------------------------------ the others
    def _deref(self, op: Deref) -> Step:
        for ref in op.blocks:
            self.take(DEREF, key_of(ref))
        return Step(OpResult(value=True), [])

    def _not_held(self, k: Key) -> bool:
        return k not in self.active

    def _ignore(self, k: Key) -> None:
        """The legacy manager ignores a Deref of a block it does not hold."""

    def _drop_owner(self, k: Key) -> None:
        n = self.active[k]
        if n == 1:
            del self.active[k]
            self.inactive[k] = None
        else:
            self.active[k] = n - 1

    def _destroy(self, op: Destroy) -> Step:
        keys = [key_of(r) for r in op.blocks]
        for k in keys:
            if k not in self.active:
                raise InvalidOperation(rid("DESTROY-ACTIVE"), f"Destroy of block {k[1]} that is not active")
        if len(set(keys)) != len(keys):
            raise InvalidOperation(rid("DESTROY-ACTIVE"), "Destroy names a block twice")
        gone = [seq for seq in (self.take(DESTROY, k) for k in keys) if seq is not None]
        events = [self.publish(make_removed(self._event_id(), gone, dp_rank=self.dp_rank), DESTROY[0])] if gone else []
        return Step(OpResult(value=True), events)

    def _destroy_entry(self, k: Key) -> int | None:
        """The entry goes at once; a full block's hash is in the Destroy's Removed (returned)."""
        del self.active[k]
        if isinstance(k[1], int):
            self.unannounced.discard(k[1])
            return k[1]
        return None

    def _promote(self, op: Promote) -> Step:
        pk: Key = ("P", op.uuid)
        if self.active.get(pk) != 1:
            raise InvalidOperation(
                rid("PROMOTE-UNKNOWN"), f"Promote of partial block {op.uuid} that is not held by exactly one owner"
            )
        del self.active[pk]
        step: Step = self.take(PROMOTE, op)
        return step

    def _promotes_cached(self, op: Promote) -> bool:
        fk: Key = ("F", op.seq_hash)
        return fk in self.active or fk in self.inactive

    def _promote_existing(self, op: Promote) -> Step:
        fk: Key = ("F", op.seq_hash)
        if fk in self.active:
            self.active[fk] += 1
        else:
            del self.inactive[fk]
            self.active[fk] = 1
        return Step(OpResult(value=True), [])

    def _promote_new(self, op: Promote) -> Step:
        fk: Key = ("F", op.seq_hash)
        self.active[fk] = 1
        ev = make_stored(
            self._event_id(),
            [op.seq_hash],
            [op.local_hash],
            op.parent_hash,
            dp_rank=self.dp_rank,
            token_ids=[op.token_ids] if op.token_ids is not None else None,
        )
        return Step(OpResult(value=True), [self.publish(ev, PROMOTE_NEW)])
