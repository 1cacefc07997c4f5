"""Wire models of the two allocator-level profiles: ``paged`` and ``session``.

The G1 profiles speak blocks named by hashes and publish KV events; these two
managers speak neither. A paged allocator (block tables, shared prefixes,
copy-on-write, swap between a device and a host pool) and a session-slot
manager (physical sequences leased to sessions, fenced by generation
counters) are checked on what they *hold*: every outcome carries a snapshot
of the manager's observable state, and the suite compares it with the
reference model after every operation (SPEC.md, "Paged allocator" and
"Session slot leases").

The same models travel in golden scenarios (``spec/scenarios/paged/``,
``spec/scenarios/session/``), in replay files and over protocol version 3 of
the JSON-lines protocol (PROTOCOL.md section 10); ``kvspec schemas`` exports
them.

Physical block ids are the implementation's own choice: the suite never
requires a particular block, only that the same sharing, reference counts and
contents appear (``conformance/managers/check.py`` matches block ids of the
implementation to the model's one step at a time).
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias, TypeGuard

from pydantic import Field, TypeAdapter, model_validator

from kvspec.spec.registry import PAGED, SESSION
from kvspec.spec.wire import Count, Wire

#: a sequence (paged) or a session (session) is named by a short string
Name = Annotated[str, Field(min_length=1, max_length=64)]
#: a token value written into the cache; stands for the K/V data of one slot
TokenValue = Annotated[int, Field(ge=0, le=2**31 - 1, strict=True)]

# --------------------------------------------------------------------------
# paged: configuration
# --------------------------------------------------------------------------


class PagedConfig(Wire):
    """A paged allocator: a device pool, a host pool for swapping, a prefix cache.

    Pressure is read from the device pool's free fraction: below
    ``critical_below`` it is ``critical``, below ``high_below`` ``high``,
    otherwise ``low`` (the ferrum manager's ``high_watermark`` and
    ``low_watermark``, whose names are the other way round).
    """

    kind: Literal["paged"] = PAGED
    device_blocks: int = Field(ge=1, le=4096)
    host_blocks: int = Field(default=0, ge=0, le=4096)
    block_size: int = Field(default=4, ge=1, le=256)
    max_prefixes: int = Field(default=4, ge=0, le=1024)
    high_below: float = Field(default=0.3, ge=0.0, le=1.0)
    critical_below: float = Field(default=0.1, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _thresholds(self) -> PagedConfig:
        if self.critical_below > self.high_below:
            raise ValueError("critical_below must not exceed high_below")
        return self


# --------------------------------------------------------------------------
# paged: operations
# --------------------------------------------------------------------------


class PagedAllocate(Wire):
    """A new sequence holding ``tokens`` tokens (nothing written yet)."""

    op: Literal["allocate"] = "allocate"
    seq: Name
    tokens: Count


class PagedExtend(Wire):
    """The sequence grows by ``tokens`` tokens (nothing written in them yet)."""

    op: Literal["extend"] = "extend"
    seq: Name
    tokens: Count


class PagedFork(Wire):
    """``dst`` (new) shares the first ``blocks`` blocks of ``src`` (all when null)."""

    op: Literal["fork"] = "fork"
    src: Name
    dst: Name
    blocks: Count | None = None


class PagedWrite(Wire):
    """Write ``value`` at token ``position`` of the sequence (copy-on-write if shared)."""

    op: Literal["write"] = "write"
    seq: Name
    position: Count
    value: TokenValue


class PagedSwapOut(Wire):
    """Move the sequence's blocks from the device pool to the host pool."""

    op: Literal["swap_out"] = "swap_out"
    seq: Name


class PagedSwapIn(Wire):
    """Bring a swapped-out sequence back to the device pool."""

    op: Literal["swap_in"] = "swap_in"
    seq: Name


class PagedFree(Wire):
    """The sequence ends: each of its blocks loses one holder."""

    op: Literal["free"] = "free"
    seq: Name


class PagedStorePrefix(Wire):
    """The prefix cache keeps the sequence's first ``blocks`` blocks under ``key``."""

    op: Literal["store_prefix"] = "store_prefix"
    key: Name
    seq: Name
    blocks: Annotated[int, Field(ge=1, strict=True)]


class PagedMatchPrefix(Wire):
    """A new sequence ``dst`` starts from the cached prefix ``key``."""

    op: Literal["match_prefix"] = "match_prefix"
    key: Name
    dst: Name


class PagedEvictPrefixes(Wire):
    """Evict up to ``count`` prefix-cache entries no sequence holds, oldest use first."""

    op: Literal["evict_prefixes"] = "evict_prefixes"
    count: Count


PagedOp: TypeAlias = Annotated[
    PagedAllocate
    | PagedExtend
    | PagedFork
    | PagedWrite
    | PagedSwapOut
    | PagedSwapIn
    | PagedFree
    | PagedStorePrefix
    | PagedMatchPrefix
    | PagedEvictPrefixes,
    Field(discriminator="op"),
]

# --------------------------------------------------------------------------
# paged: outcome
# --------------------------------------------------------------------------

Tier = Literal["device", "host"]
Pressure = Literal["low", "high", "critical"]


class PagedSeqView(Wire):
    """One live sequence: where it is, its block table, what it reads back."""

    tier: Tier
    tokens: Count
    #: physical block ids, one per logical block, in the pool of ``tier``
    blocks: list[Count]
    #: the value at every token position, read through the block table; null
    #: (or any value, from an implementation) where nothing was written since
    #: the block was taken: the spec leaves those values open
    data: list[int | None]


class PagedPrefixView(Wire):
    key: Name
    blocks: list[Count]


class PagedSnapshot(Wire):
    """The allocator's observable state after an operation."""

    sequences: dict[str, PagedSeqView]
    #: reference count of every device block in use (block id as a string)
    device_refs: dict[str, Annotated[int, Field(ge=1, strict=True)]]
    host_refs: dict[str, Annotated[int, Field(ge=1, strict=True)]]
    free_device: Count
    free_host: Count
    #: prefix-cache entries, least recently used first
    prefixes: list[PagedPrefixView]
    pressure: Pressure


class OpError(Wire):
    """The spec rejects the operation: the rule, and a message. Nothing changed."""

    rule: str
    message: str


class PagedOutcome(Wire):
    """Exactly one of ``value`` (a count, 0 when the op returns nothing) and ``error``."""

    value: Count | None = None
    error: OpError | None = None
    state: PagedSnapshot

    @model_validator(mode="after")
    def _value_xor_error(self) -> PagedOutcome:
        if (self.value is None) == (self.error is None):
            raise ValueError("a paged outcome carries exactly one of value and error")
        return self


# --------------------------------------------------------------------------
# session: configuration, operations, outcome
# --------------------------------------------------------------------------


class SessionConfig(Wire):
    """A session-slot manager over ``slots`` physical sequences."""

    kind: Literal["session"] = SESSION
    slots: int = Field(ge=1, le=1024)


class SessionAdmit(Wire):
    """Lease a slot to ``session``; ``warm``: reuse its idle slot if still valid."""

    op: Literal["admit"] = "admit"
    session: Name
    warm: bool = True


class SessionFinalize(Wire):
    """The lease ``(slot, generation)`` ends; ``keep``: park the slot idle with ``tokens``."""

    op: Literal["finalize"] = "finalize"
    session: Name
    slot: Count
    generation: Count
    keep: bool = True
    tokens: list[Annotated[int, Field(ge=0, le=2**31 - 1, strict=True)]] = []


class SessionReset(Wire):
    """Release the session's slot named by the handle ``(slot, generation)``."""

    op: Literal["reset"] = "reset"
    session: Name
    slot: Count
    generation: Count


class SessionEvictAll(Wire):
    """Release every slot and forget every session."""

    op: Literal["evict_all"] = "evict_all"


class SessionSnapshot(Wire):
    """Queue a prefix snapshot of the lease ``(slot, generation)``."""

    op: Literal["snapshot"] = "snapshot"
    slot: Count
    generation: Count


class SessionDrain(Wire):
    """Take the queued snapshots whose lease is still current; drop the others."""

    op: Literal["drain"] = "drain"


SessionOp: TypeAlias = Annotated[
    SessionAdmit | SessionFinalize | SessionReset | SessionEvictAll | SessionSnapshot | SessionDrain,
    Field(discriminator="op"),
]

SlotState = Literal["free", "idle", "leased"]


class SlotView(Wire):
    state: SlotState
    generation: Count
    #: the session leasing it or parked on it (null when free)
    session: Name | None = None


class Admission(Wire):
    """What ``admit`` hands out: the handle, and what the caller must do with the slot."""

    slot: Count
    generation: Count
    #: "live": the slot still holds this session's cache (``tokens``); "none": start empty
    candidate: Literal["none", "live"]
    #: the slot held someone's cache before: clear it before use
    requires_clear: bool
    tokens: list[int] = []


class SessionState(Wire):
    slots: list[SlotView]
    #: idle sessions, least recently parked first
    idle_lru: list[Name]
    #: sessions with a lease in flight
    in_flight: list[Name]
    #: queued snapshots as [slot, generation]
    pending: list[tuple[Count, Count]]


class SessionOutcome(Wire):
    """``admission`` for a granted admit; ``refused`` names the rule of a refused
    admit; ``applied`` says whether a handle-carrying op acted (false: fenced);
    ``drained`` lists what a drain took. ``error`` rejects a malformed op."""

    admission: Admission | None = None
    refused: str | None = None
    applied: bool | None = None
    drained: list[tuple[Count, Count]] | None = None
    error: OpError | None = None
    state: SessionState


ManagerConfigKind: TypeAlias = Annotated[PagedConfig | SessionConfig, Field(discriminator="kind")]
ManagerOp: TypeAlias = PagedOp | SessionOp
ManagerOutcome: TypeAlias = PagedOutcome | SessionOutcome

#: the operation classes of each profile (``is_paged_op`` / ``is_session_op``)
PAGED_OPS = (
    PagedAllocate,
    PagedExtend,
    PagedFork,
    PagedWrite,
    PagedSwapOut,
    PagedSwapIn,
    PagedFree,
    PagedStorePrefix,
    PagedMatchPrefix,
    PagedEvictPrefixes,
)
SESSION_OPS = (SessionAdmit, SessionFinalize, SessionReset, SessionEvictAll, SessionSnapshot, SessionDrain)


def is_paged_op(op: ManagerOp) -> TypeGuard[PagedOp]:
    """Is ``op`` an operation of the paged profile (narrows the type)?"""
    return isinstance(op, PAGED_OPS)


def is_session_op(op: ManagerOp) -> TypeGuard[SessionOp]:
    """Is ``op`` an operation of the session profile (narrows the type)?"""
    return isinstance(op, SESSION_OPS)


PAGED_OP_ADAPTER: TypeAdapter[PagedOp] = TypeAdapter(PagedOp)
SESSION_OP_ADAPTER: TypeAdapter[SessionOp] = TypeAdapter(SessionOp)
MANAGER_CONFIG_ADAPTER: TypeAdapter[ManagerConfigKind] = TypeAdapter(ManagerConfigKind)
