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
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from kvspec.reference.labels import Trace, label
from kvspec.reference.outcome import Step
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError, InvalidOperation
from kvspec.spec.registry import LEGACY_NAME
from kvspec.spec.rules import RuleId, rid
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


class LegacyModel:
    """Reference model of the legacy profile (LRU only, no offload)."""

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
        #: the rules behind the current step (``reference.labels``)
        self.trace = Trace()

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
        self.trace.start()
        step = self._dispatch(op)
        step.labels = self.trace.labels(step.events)
        return step

    def _dispatch(self, op: Operation) -> Step:
        if isinstance(op, Use):
            return self._use(op)
        if isinstance(op, Deref):
            return self._deref(op)
        if isinstance(op, Destroy):
            return self._destroy(op)
        if isinstance(op, Promote):
            return self._promote(op)
        if isinstance(op, Tick):
            self.trace.did("TIME-MONOTONIC")
            return Step(OpResult(value=0), [])
        if isinstance(op, SwapIn):
            return Step(OpResult(value=0, status="no_hits"), [])
        if isinstance(op, Reset):
            raise InvalidOperation(rid("CLEAR-ALL"), "a prefix-cache reset is an operation of the vllm profile only")
        raise InvalidOperation(rid("USE-VALIDATE"), f"unknown operation {type(op).__name__}")

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
        events: list[KvEvent] = []
        stored: list[int] = []
        stored_tokens: list[list[int]] = []
        parent: int | None = None
        fi = 0
        for pos, ref in enumerate(op.blocks):
            k = key_of(ref)
            idx = pos if by_position else fi
            if isinstance(ref, FullBlock):
                fi += 1
            if k in self.active:
                self.trace.did("USE-HIT-ACTIVE")
                self.active[k] += 1
                parent = ref.full if isinstance(ref, FullBlock) else parent
                continue
            if k in self.inactive:
                self.trace.did("USE-HIT-INACTIVE")
                del self.inactive[k]
                self.active[k] = 1
                parent = ref.full if isinstance(ref, FullBlock) else parent
                continue
            if len(self.active) + len(self.inactive) >= self.capacity:
                if not self.inactive:
                    # false at once; placed blocks stay, no Stored
                    self.trace.did("USE-CAPACITY")
                    self.unannounced.update(stored)
                    return Step(OpResult(value=False, status="capacity"), events)
                victim, _ = self.inactive.popitem(last=False)
                self.trace.did("EVICT-POLICY")
                if isinstance(victim[1], int):  # a full block (a partial one's key is its uuid)
                    self.unannounced.discard(victim[1])
                    self.trace.did("EVENT-ORDER")  # the Removed at once, before the batch's Stored
                    ev = make_removed(self._event_id(), [victim[1]], dp_rank=self.dp_rank)
                    events.append(self.trace.event(ev, _EVICTED))
            self.trace.did("USE-PARTIAL" if isinstance(ref, PartialBlock) else "USE-NEW")
            self.active[k] = 1
            if isinstance(ref, FullBlock):
                stored.append(ref.full)
                if op.token_ids is not None:
                    if idx >= len(op.token_ids):
                        raise InvalidOperation(
                            rid("USE-VALIDATE"), f"no token list at position {idx} for new block {ref.full}"
                        )
                    stored_tokens.append(op.token_ids[idx])
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
                parent,
                dp_rank=self.dp_rank,
                token_ids=stored_tokens if op.token_ids is not None else None,
            )
            events.append(self.trace.event(ev, _STORED))
        return Step(OpResult(value=True), events)

    # ------------------------------------------------------------ the others
    def _deref(self, op: Deref) -> Step:
        for ref in op.blocks:
            k = key_of(ref)
            n = self.active.get(k)
            if n is None:
                self.trace.did("DEREF-UNKNOWN")  # the legacy manager ignores a Deref of a block it does not hold
                continue
            self.trace.did("DEREF-OWNER")
            if n == 1:
                del self.active[k]
                self.inactive[k] = None
            else:
                self.active[k] = n - 1
        return Step(OpResult(value=True), [])

    def _destroy(self, op: Destroy) -> Step:
        keys = [key_of(r) for r in op.blocks]
        for k in keys:
            if k not in self.active:
                raise InvalidOperation(rid("DESTROY-ACTIVE"), f"Destroy of block {k[1]} that is not active")
        if len(set(keys)) != len(keys):
            raise InvalidOperation(rid("DESTROY-ACTIVE"), "Destroy names a block twice")
        gone: list[int] = []
        self.trace.silent("device", "removed", "DESTROY-ACTIVE")
        self.trace.silent("device", "stored", "DESTROY-ACTIVE")
        for k in keys:
            self.trace.did("DESTROY-ACTIVE")
            del self.active[k]
            if isinstance(k[1], int):
                gone.append(k[1])
                self.unannounced.discard(k[1])
        events = [make_removed(self._event_id(), gone, dp_rank=self.dp_rank)] if gone else []
        for ev in events:
            self.trace.event(ev, label("DESTROY-ACTIVE"))
        return Step(OpResult(value=True), events)

    def _promote(self, op: Promote) -> Step:
        pk: Key = ("P", op.uuid)
        if self.active.get(pk) != 1:
            raise InvalidOperation(
                rid("PROMOTE-UNKNOWN"), f"Promote of partial block {op.uuid} that is not held by exactly one owner"
            )
        del self.active[pk]
        fk: Key = ("F", op.seq_hash)
        if fk in self.active or fk in self.inactive:
            self.trace.did("PROMOTE-EXISTING")
            self.trace.result("PROMOTE-EXISTING")
        if fk in self.active:
            self.active[fk] += 1
            return Step(OpResult(value=True), [])
        if fk in self.inactive:
            del self.inactive[fk]
            self.active[fk] = 1
            return Step(OpResult(value=True), [])
        self.trace.did("PROMOTE-NEW")
        self.active[fk] = 1
        ev = make_stored(
            self._event_id(),
            [op.seq_hash],
            [op.local_hash],
            op.parent_hash,
            dp_rank=self.dp_rank,
            token_ids=[op.token_ids] if op.token_ids is not None else None,
        )
        return Step(OpResult(value=True), [self.trace.event(ev, _STORED)])
