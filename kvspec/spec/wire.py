"""Wire models: every operation, result and event, as pydantic v2 models.

These models are the one definition of the messages that cross a boundary:
the JSON-lines adapter protocol, the C ABI, scenario files, replay files and
recorded event logs all validate against them, and the JSON Schemas in
``spec/schema/`` are generated from them (``kvspec schemas`` rewrites them; a
test fails when the checked-in files drift).

The event layout follows Dynamo's ``KvCacheEvent`` JSON form: an externally
tagged ``data`` (``{"stored": {...}}``, ``{"removed": {...}}`` or the string
``"cleared"``), plus the storage tier and, when the publisher has them, the
token ids of each stored block. ``spec.codecs`` converts to and from Dynamo's
router envelope and vLLM's msgpack event batches.

Validation is strict (unknown fields are rejected, hashes must fit in u64,
token ids in u32) so that a malformed message is refused with the name of the
offending field instead of being half-understood.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1

U64 = Annotated[int, Field(ge=0, le=U64_MAX, strict=True)]
U32 = Annotated[int, Field(ge=0, le=U32_MAX, strict=True)]
Count = Annotated[int, Field(ge=0, strict=True)]


class Wire(BaseModel):
    """Base of all wire models: frozen, strict about unknown fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------
# Block references and positional lineage hashes
# --------------------------------------------------------------------------


class FullBlock(Wire):
    """A full (immutable, registered) block, named by its sequence hash."""

    full: U64

    def __repr__(self) -> str:
        return f"F{self.full}"


class PartialBlock(Wire):
    """A partial (mutable) block owned by one request, named by a uuid."""

    partial: Annotated[str, Field(min_length=1, max_length=64)]

    def __repr__(self) -> str:
        return f"P{self.partial}"


BlockRef: TypeAlias = FullBlock | PartialBlock


class Plh(Wire):
    """Positional lineage hash: the block's own hash, its parent's, its position.

    The lineage eviction policy links inactive blocks through ``parent``; the
    registry keys blocks by the whole triple.
    """

    hash: U64
    parent: U64 | None = None
    position: Count = 0

    def key(self) -> tuple[int, int]:
        return (self.position, self.hash)

    def parent_key(self) -> tuple[int, int] | None:
        if self.parent is None or self.position == 0:
            return None
        return (self.position - 1, self.parent)


# --------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------


class Use(Wire):
    """Place a request's blocks: hit active, reactivate inactive, or allocate."""

    op: Literal["use"] = "use"
    blocks: list[BlockRef]
    #: one per full block, or empty when the caller has none
    local_hashes: list[U64] = []
    #: exactly one per full block
    plhs: list[Plh] = []
    #: one token list per full block, or absent
    token_ids: list[list[U32]] | None = None
    #: the block before the first one (the caller's anchor), if any
    parent: BlockRef | None = None


class Deref(Wire):
    """Drop one owner of each block, in order."""

    op: Literal["deref"] = "deref"
    blocks: list[BlockRef]


class Destroy(Wire):
    """Legacy profile only: remove active blocks outright and report them."""

    op: Literal["destroy"] = "destroy"
    blocks: list[BlockRef]


class Promote(Wire):
    """A partial block filled up: it becomes the full block ``seq_hash``."""

    op: Literal["promote"] = "promote"
    uuid: Annotated[str, Field(min_length=1, max_length=64)]
    seq_hash: U64
    parent_hash: U64 | None = None
    local_hash: U64 = 0
    plh: Plh
    token_ids: list[U32] | None = None


class Tick(Wire):
    """Advance the offload tier's clock to ``now_ms`` (time is an argument)."""

    op: Literal["tick"] = "tick"
    now_ms: float

    @field_validator("now_ms")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError("now_ms must be a finite, non-negative number")
        return v


class SwapInBlock(Wire):
    """One block of a swap-in request: its sequence hash and lineage hash."""

    seq_hash: U64
    plh: Plh


class SwapIn(Wire):
    """Bring the longest G2-resident prefix of ``blocks`` back into G1.

    ``parent`` is the last G1 block before the first entry (the reused prefix);
    the registered blocks' Stored anchors to it (SWAPIN-ANCHOR).
    """

    op: Literal["swap_in"] = "swap_in"
    blocks: Annotated[list[SwapInBlock], Field(min_length=1)]
    parent: U64 | None = None


class Reset(Wire):
    """vLLM profile: reset the prefix cache (succeeds only if every block is free)."""

    op: Literal["reset"] = "reset"


Operation: TypeAlias = Annotated[Use | Deref | Destroy | Promote | Tick | SwapIn | Reset, Field(discriminator="op")]
OPERATION_ADAPTER: TypeAdapter[Any] = TypeAdapter(Operation)


def parse_operation(data: Any) -> Use | Deref | Destroy | Promote | Tick | SwapIn | Reset:
    """Validate a decoded JSON object as an operation (raises pydantic.ValidationError)."""
    return OPERATION_ADAPTER.validate_python(data)


# --------------------------------------------------------------------------
# Results and counters
# --------------------------------------------------------------------------

Status = Literal["ok", "capacity", "blocked_on_offload", "no_hits", "scheduled", "rejected"]


class OpResult(Wire):
    """What an operation returned.

    ``value`` is the operation's return value in its profile: the number of
    blocks placed (kvbm, atomic), a boolean (legacy), or null. ``status`` says
    why a Use stopped short: ``capacity`` (no slot), ``blocked_on_offload``
    (the eviction it needed started an offload).
    """

    value: int | bool | None = None
    status: Status = "ok"


class Counters(Wire):
    """The manager's counters after an operation.

    ``active_blocks`` counts distinct slots in use (partial, full with owners,
    and quarantined); ``active_refs`` counts owner references (partial blocks
    count one each); ``free_blocks`` are slots with no block.
    """

    active_blocks: Count
    active_refs: Count
    inactive_blocks: Count
    free_blocks: Count
    quarantined_blocks: Count = 0


# --------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------

#: ``external`` is Dynamo 1.6's name for a tier outside the worker (kvspec's
#: older ``remote``); both are accepted
StorageTier = Literal["device", "host_pinned", "disk", "remote", "external"]


class StoredBlock(Wire):
    block_hash: U64
    tokens_hash: U64


class StoredData(Wire):
    parent_hash: U64 | None = None
    blocks: Annotated[list[StoredBlock], Field(min_length=1)]
    start_position: Count | None = None


class RemovedData(Wire):
    block_hashes: Annotated[list[U64], Field(min_length=1)]


class Stored(Wire):
    stored: StoredData


class Removed(Wire):
    removed: RemovedData


EventData: TypeAlias = Stored | Removed | Literal["cleared"]


class KvEvent(Wire):
    """One published KV event (Dynamo ``KvCacheEvent`` plus tier and tokens)."""

    event_id: Count
    data: EventData
    dp_rank: Count = 0
    storage_tier: StorageTier = "device"
    #: token ids of each stored block, when the publisher carries them
    block_token_ids: list[list[U32]] | None = None

    @model_validator(mode="after")
    def _tokens_match_blocks(self) -> KvEvent:
        if self.block_token_ids is not None:
            if not isinstance(self.data, Stored):
                raise ValueError("block_token_ids is only allowed on a stored event")
            if len(self.block_token_ids) != len(self.data.stored.blocks):
                raise ValueError("block_token_ids must have one entry per stored block")
        return self

    # -- convenience ------------------------------------------------------
    @property
    def kind(self) -> Literal["stored", "removed", "cleared"]:
        if isinstance(self.data, Stored):
            return "stored"
        if isinstance(self.data, Removed):
            return "removed"
        return "cleared"

    def hashes(self) -> list[int]:
        """The block hashes the event names (empty for cleared)."""
        if isinstance(self.data, Stored):
            return [b.block_hash for b in self.data.stored.blocks]
        if isinstance(self.data, Removed):
            return list(self.data.removed.block_hashes)
        return []

    def brief(self) -> str:
        """One-line human form, used in failure reports."""
        tier = "" if self.storage_tier == "device" else f"[{self.storage_tier}]"
        if isinstance(self.data, Stored):
            d = self.data.stored
            return f"#{self.event_id}{tier} Stored{self.hashes()} parent={d.parent_hash}"
        if isinstance(self.data, Removed):
            return f"#{self.event_id}{tier} Removed{self.hashes()}"
        return f"#{self.event_id}{tier} Cleared"


def _built(cls: type[Wire], fields: dict[str, Any]) -> Any:
    """An instance of a wire model from fields the model itself produced.

    The reference model emits many events; they are correct by construction,
    so it skips validation (like ``model_construct``, at half its cost)."""
    obj = cls.__new__(cls)
    object.__setattr__(obj, "__dict__", fields)
    object.__setattr__(obj, "__pydantic_fields_set__", set(fields))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


def make_stored(
    event_id: int,
    block_hashes: list[int],
    tokens_hashes: list[int],
    parent_hash: int | None,
    *,
    dp_rank: int = 0,
    tier: StorageTier = "device",
    token_ids: list[list[int]] | None = None,
) -> KvEvent:
    """Build a Stored event without re-validating (the model's hot path)."""
    pairs = zip(block_hashes, tokens_hashes, strict=True)
    blocks = [_built(StoredBlock, {"block_hash": h, "tokens_hash": t}) for h, t in pairs]
    data = _built(
        Stored, {"stored": _built(StoredData, {"parent_hash": parent_hash, "blocks": blocks, "start_position": None})}
    )
    return _built(
        KvEvent,
        {
            "event_id": event_id,
            "data": data,
            "dp_rank": dp_rank,
            "storage_tier": tier,
            "block_token_ids": token_ids,
        },
    )


def make_removed(event_id: int, block_hashes: list[int], *, dp_rank: int = 0, tier: StorageTier = "device") -> KvEvent:
    """Build a Removed event without re-validating (the model's hot path)."""
    data = _built(Removed, {"removed": _built(RemovedData, {"block_hashes": list(block_hashes)})})
    return _built(
        KvEvent,
        {
            "event_id": event_id,
            "data": data,
            "dp_rank": dp_rank,
            "storage_tier": tier,
            "block_token_ids": None,
        },
    )


def make_cleared(event_id: int, *, dp_rank: int = 0, tier: StorageTier = "device") -> KvEvent:
    return _built(
        KvEvent,
        {
            "event_id": event_id,
            "data": "cleared",
            "dp_rank": dp_rank,
            "storage_tier": tier,
            "block_token_ids": None,
        },
    )


EVENT_ADAPTER: TypeAdapter[KvEvent] = TypeAdapter(KvEvent)


def event_to_json(event: KvEvent) -> dict[str, Any]:
    """Canonical JSON form of an event (null token ids omitted)."""
    out = event.model_dump(mode="json", exclude_none=False)
    if out.get("block_token_ids") is None:
        out.pop("block_token_ids", None)
    stored = out["data"].get("stored") if isinstance(out["data"], dict) else None
    if stored is not None and stored.get("start_position") is None:
        stored.pop("start_position", None)
    return out


# --------------------------------------------------------------------------
# One step: operation in, result, counters and events out
# --------------------------------------------------------------------------


class ErrorInfo(Wire):
    """A rejected operation: the rule it broke and a message."""

    rule: str
    message: str


class StepOutcome(Wire):
    """Everything an implementation reports for one operation."""

    result: OpResult | None = None
    error: ErrorInfo | None = None
    counters: Counters
    events: list[KvEvent] = []
    #: the earliest pending transfer deadline after the operation (offload tier)
    earliest_deadline_ms: float | None = None

    @model_validator(mode="after")
    def _result_xor_error(self) -> StepOutcome:
        if (self.result is None) == (self.error is None):
            raise ValueError("a step outcome carries exactly one of result and error")
        return self


class WorkerEvents(Wire):
    """The events one worker of a process published during another worker's step."""

    worker: Count
    events: Annotated[list[KvEvent], Field(min_length=1)]


class ProcessOutcome(Wire):
    """One operation on one worker of a process that runs several (SPEC.md "Lower tiers").

    ``outcome`` is that worker's step, as a one-worker session reports it
    (its counters, its events). ``others`` lists the events any other worker
    published during the step, in worker order: a shared tier's event is
    published by the worker that owns the block (TIER-OWNER, TIER-EVENTS),
    whichever worker's operation caused it."""

    outcome: StepOutcome
    others: list[WorkerEvents] = []

    @model_validator(mode="after")
    def _others_distinct(self) -> ProcessOutcome:
        ws = [o.worker for o in self.others]
        if ws != sorted(set(ws)):
            raise ValueError("others: each worker at most once, in increasing worker order")
        return self

    def events_of(self, worker: int, stepped: int) -> list[KvEvent]:
        """The events ``worker`` published (``stepped`` is the worker the operation went to)."""
        if worker == stepped:
            return self.outcome.events
        return next((o.events for o in self.others if o.worker == worker), [])
