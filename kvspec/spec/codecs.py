"""Codecs between kvspec's events and the formats engines publish.

- Dynamo: a ``KvCacheEvent`` is JSON (or msgpack) with ``event_id``,
  ``dp_rank`` and an externally tagged ``data`` (``{"stored": ...}``,
  ``{"removed": ...}`` or ``"cleared"``); a router event wraps it with the
  ``worker_id`` and the ``storage_tier``. kvspec's own event is the same
  object plus the tier and the optional token ids, so the conversion is a
  re-arrangement, never a reinterpretation.
- vLLM: a ``KVEventBatch`` is a msgpack array ``[ts, [events...], dp_rank?]``
  whose events are tagged arrays: ``["BlockStored", block_hashes,
  parent_block_hash, token_ids, block_size, lora_id, medium, ...]``,
  ``["BlockRemoved", block_hashes, medium, ...]`` and
  ``["AllBlocksCleared"]``. vLLM events carry no event id and no tokens
  hash: ids are assigned by the consumer in arrival order and tokens hashes
  are computed from the token ids (spec/hashing.py), as Dynamo's bridge does.

Decoding failures raise ``WireError`` naming what was wrong.

Two decoding routes. The functions of the first half build validated
``KvEvent`` objects (pydantic), for adapters and tests that handle a few
events at a time. The second half ("typed stream decoding") declares the
published formats as msgspec structs, so that ``kvspec check-log`` and
``kvspec watch`` decode a long stream at close to the speed of an untyped
decoder and still refuse a wrong type with the path of the field:

- ``RouterEventMsg``: Dynamo's RouterEvent as its event plane carries it and
  as ``RadixTree.dump_tree_as_events()`` prints it (ai-dynamo/dynamo
  lib/kv-router/src/protocols.rs, ``RouterEvent``, ``KvCacheEvent``,
  ``KvCacheStoreData``, ``KvCacheStoredBlockData`` with ``mm_extra_info``);
  unknown fields are refused by the strict decoder, and ``decode_router_line``
  falls back to ignoring them (the caller warns once);
- ``KvspecEventMsg``: kvspec's own event JSON (a Dynamo ``KvCacheEvent``
  plus ``storage_tier`` and ``block_token_ids``);
- vLLM's ``KVEventBatch`` (vllm-project/vllm vllm/distributed/kv_events.py,
  ``EventBatch``, ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) in
  both layouts msgspec produces: the batch as an array ``[ts, events,
  data_parallel_rank]`` or a map, each event a tagged array
  (``["BlockStored", ...]``, older vLLM) or a map with a ``type`` key (vLLM
  0.32, and the ai-dynamo mocker's ``zmq_kv_events_port`` feed,
  ai-dynamo/dynamo lib/mocker/src/services/zmq_events.rs,
  ``encode_event_batch``). Unknown fields are ignored there (vLLM adds fields
  often, and the array layout is positional).

msgspec cannot bound an integer above 2**63 in a type, so u64 fields are
checked after decoding (``check_u64``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgpack
import msgspec

from kvspec.spec.errors import WireError
from kvspec.spec.hashing import local_block_hash

if TYPE_CHECKING:  # the pydantic event model is imported where it is used: the stream readers need none of it
    from pydantic import ValidationError

    from kvspec.spec.wire import KvEvent, StorageTier

#: the largest unsigned 64-bit value (``wire.U64_MAX``, here so that the
#: stream readers need not import the pydantic model)
U64_MAX = 2**64 - 1

#: vLLM's storage medium names and kvspec's tiers, with the names Dynamo's
#: ``StorageTier::from_kv_medium`` accepts (ai-dynamo/dynamo
#: lib/kv-router/src/protocols.rs)
MEDIUM_TO_TIER: dict[str | None, StorageTier] = {
    None: "device",
    "GPU": "device",
    "DEVICE": "device",
    "CPU": "host_pinned",
    "CPU_PINNED": "host_pinned",
    "CPU_TIER1": "host_pinned",
    "CPU_TIER2": "disk",
    "DISK": "disk",
    "NVME": "disk",
    "EXTERNAL": "external",
    "NETWORK": "external",
    "REMOTE": "external",
    "SHARED": "external",
}
#: the storage tiers a router event may name
TIERS: frozenset[str] = frozenset({"device", "host_pinned", "disk", "remote", "external"})
TIER_TO_MEDIUM: dict[str, str] = {"device": "GPU", "host_pinned": "CPU", "disk": "DISK"}


# ---------------------------------------------------------------- Dynamo


def to_dynamo_event(event: KvEvent) -> dict[str, Any]:
    """Dynamo ``KvCacheEvent`` JSON (no tier, no token ids)."""
    from kvspec.spec.wire import event_to_json

    out = event_to_json(event)
    out.pop("storage_tier", None)
    out.pop("block_token_ids", None)
    return out


def to_router_event(event: KvEvent, worker_id: int = 0) -> dict[str, Any]:
    """Dynamo router envelope: ``{"worker_id", "storage_tier", "event"}``."""
    return {"worker_id": worker_id, "storage_tier": event.storage_tier, "event": to_dynamo_event(event)}


def from_dynamo_event(
    data: Any, *, storage_tier: StorageTier = "device", block_token_ids: list[list[int]] | None = None
) -> KvEvent:
    from pydantic import ValidationError

    from kvspec.spec.wire import KvEvent

    if not isinstance(data, dict):
        raise WireError(f"a Dynamo KvCacheEvent is an object, got {type(data).__name__}")
    try:
        return KvEvent.model_validate({**data, "storage_tier": storage_tier, "block_token_ids": block_token_ids})
    except ValidationError as e:
        raise WireError(f"invalid Dynamo KvCacheEvent: {_summarize(e)}") from None


def from_router_event(data: Any) -> tuple[int, KvEvent]:
    """Decode a router envelope into (worker_id, event)."""
    if not isinstance(data, dict) or "event" not in data:
        raise WireError("a router event is an object with 'worker_id', 'storage_tier' and 'event'")
    worker = data.get("worker_id", 0)
    if not isinstance(worker, int) or worker < 0:
        raise WireError(f"router event: worker_id must be a non-negative integer, got {worker!r}")
    tier = data.get("storage_tier", "device")
    if tier not in TIERS:
        raise WireError(f"router event: unknown storage_tier {tier!r}")
    return worker, from_dynamo_event(
        _without_mm(data["event"]), storage_tier=tier, block_token_ids=data.get("block_token_ids")
    )


def _without_mm(event: Any) -> Any:
    """Dynamo writes ``mm_extra_info`` on every stored block (null without
    multimodal input); kvspec's event has no such field, so a null one is
    dropped (a non-null one stays and is refused by name)."""
    try:
        blocks = event["data"]["stored"]["blocks"]
    except (TypeError, KeyError):
        return event
    if not isinstance(blocks, list):
        return event
    new = [
        {k: v for k, v in b.items() if k != "mm_extra_info"}
        if isinstance(b, dict) and b.get("mm_extra_info", 0) is None
        else b
        for b in blocks
    ]
    return {**event, "data": {"stored": {**event["data"]["stored"], "blocks": new}}}


# ------------------------------------------------------------------ vLLM


def to_vllm_batch(events: Iterable[KvEvent], *, ts: float = 0.0, block_size: int, dp_rank: int | None = None) -> bytes:
    """Encode events as one vLLM ``KVEventBatch`` (msgpack)."""
    from kvspec.spec.wire import Stored

    out: list[Any] = []
    for ev in events:
        medium = TIER_TO_MEDIUM.get(ev.storage_tier, "GPU")
        if ev.kind == "stored":
            if ev.block_token_ids is None:
                raise WireError(f"event {ev.event_id}: vLLM's BlockStored needs the token ids of its blocks")
            assert isinstance(ev.data, Stored)
            d = ev.data.stored
            tokens = [t for block in ev.block_token_ids for t in block]
            out.append(["BlockStored", ev.hashes(), d.parent_hash, tokens, block_size, None, medium])
        elif ev.kind == "removed":
            out.append(["BlockRemoved", ev.hashes(), medium])
        else:
            out.append(["AllBlocksCleared"])
    batch: list[Any] = [ts, out] if dp_rank is None else [ts, out, dp_rank]
    return msgpack.packb(batch)


def from_vllm_batch(payload: bytes, *, first_event_id: int = 0) -> tuple[float, list[KvEvent]]:
    """Decode a vLLM ``KVEventBatch`` (array or map layout, see the typed
    decoders below) into events; ids count from ``first_event_id``, tokens
    hashes are computed from the token ids. A KV cache group other than 0
    is refused (kvspec's event has no group)."""
    from kvspec.spec.wire import make_cleared, make_removed, make_stored

    batch = VllmBatchDecoder().decode(payload)
    dp_rank = batch.data_parallel_rank or 0
    if dp_rank > 2**32 - 1:
        raise WireError(f"vLLM event batch: data_parallel_rank {dp_rank} does not fit in 32 bits")
    events: list[KvEvent] = []
    for i, ev in enumerate(batch.events):
        eid = first_event_id + i
        if isinstance(ev, VllmClearedArr | VllmClearedMap):
            events.append(make_cleared(eid, dp_rank=dp_rank))
            continue
        if ev.group_idx:
            raise WireError(f"vLLM event {i}: KV cache group {ev.group_idx} (kvspec events name no group)")
        tier = MEDIUM_TO_TIER.get(ev.medium)
        if tier is None:
            raise WireError(f"vLLM event {i}: unknown vLLM storage medium {ev.medium!r}")
        hashes = [vllm_hash_int(h) for h in ev.block_hashes]
        if not hashes:
            raise WireError(f"vLLM event {i}: block_hashes is empty")
        check_u64(hashes, f"vLLM event {i}: block_hashes")
        if isinstance(ev, VllmRemovedArr | VllmRemovedMap):
            events.append(make_removed(eid, hashes, dp_rank=dp_rank, tier=tier))
            continue
        bs, tokens = ev.block_size, ev.token_ids
        if len(tokens) != bs * len(hashes):
            raise WireError(
                f"BlockStored.token_ids has {len(tokens)} tokens for {len(hashes)} blocks of {bs} (vLLM event {i})"
            )
        per_block = [tokens[k * bs : (k + 1) * bs] for k in range(len(hashes))]
        parent = None if ev.parent_block_hash is None else vllm_hash_int(ev.parent_block_hash)
        events.append(
            make_stored(
                eid,
                hashes,
                [local_block_hash(b) for b in per_block],
                parent,
                dp_rank=dp_rank,
                tier=tier,
                token_ids=per_block,
            )
        )
    return float(batch.ts), events


def _summarize(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:3]:
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


# ------------------------------------------------- typed stream decoding

#: a non-negative integer; the u64 upper bound is checked after decoding
Uint = Annotated[int, msgspec.Meta(ge=0)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]


#: the tiers a router event may name (Dynamo's ``StorageTier``, plus kvspec's ``remote``)
Tier = Literal["device", "host_pinned", "disk", "external", "remote"]


def check_u64(values: Sequence[int], what: str) -> None:
    """Raise WireError when a decoded hash list holds a value above u64 or
    a negative one (SGLang's signed hashes are mapped before this check)."""
    if values and max(values) > U64_MAX:
        bad = next(v for v in values if v > U64_MAX)
        raise WireError(f"{what}: {bad} does not fit in 64 bits")
    if values and min(values) < 0:
        bad = next(v for v in values if v < 0)
        raise WireError(f"{what}: {bad} is negative (a signed hash, as SGLang publishes, is not read here)")


class MmObjectMsg(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One multimodal object of a block (Dynamo ``BlockMmObjectInfo``)."""

    mm_hash: Uint
    offsets: list[tuple[Uint, Uint]]


class BlockExtraInfoMsg(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Dynamo ``BlockExtraInfo``: the multimodal objects of one block."""

    mm_objects: list[MmObjectMsg] = []


class StoredBlockMsg(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    block_hash: Uint
    tokens_hash: Uint
    mm_extra_info: BlockExtraInfoMsg | None = None


class StoreDataMsg(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    blocks: list[StoredBlockMsg]
    parent_hash: Uint | None = None
    start_position: U32 | None = None


class RemoveDataMsg(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    block_hashes: list[Uint]


class EventDataMsg(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Dynamo's externally tagged ``KvCacheEventData`` object form: exactly
    one of ``stored`` and ``removed`` (``"cleared"`` is a plain string)."""

    stored: StoreDataMsg | None = None
    removed: RemoveDataMsg | None = None


class KvCacheEventMsg(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    event_id: Uint
    data: EventDataMsg | Literal["cleared"]
    dp_rank: U32 = 0


class RouterEventMsg(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Dynamo ``RouterEvent``: a worker's event and the tier it concerns."""

    worker_id: Uint
    event: KvCacheEventMsg
    storage_tier: Tier = "device"
    residency_domain: str | None = None


class KvspecEventMsg(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """kvspec's event JSON (``spec/schema/kv_event.json``)."""

    event_id: Uint
    data: EventDataMsg | Literal["cleared"]
    dp_rank: U32 = 0
    storage_tier: Tier = "device"
    block_token_ids: list[list[U32]] | None = None


ROUTER_DECODER = msgspec.json.Decoder(RouterEventMsg)
KVSPEC_DECODER = msgspec.json.Decoder(KvspecEventMsg)

#: the fields each level of a router event knows, for dropping a newer
#: producer's additions (``strip_unknown``)
_KNOWN: dict[str, frozenset[str]] = {
    "router": frozenset(RouterEventMsg.__struct_fields__),
    "event": frozenset(KvCacheEventMsg.__struct_fields__),
    "data": frozenset(EventDataMsg.__struct_fields__),
    "stored": frozenset(StoreDataMsg.__struct_fields__),
    "removed": frozenset(RemoveDataMsg.__struct_fields__),
    "block": frozenset(StoredBlockMsg.__struct_fields__),
    "extra": frozenset(BlockExtraInfoMsg.__struct_fields__),
    "mm": frozenset(MmObjectMsg.__struct_fields__),
}


def strip_unknown(obj: Any, unknown: set[str]) -> Any:
    """A router event (untyped) without the fields this decoder does not
    know; their dotted paths are added to ``unknown``."""

    def keep(d: Any, level: str, path: str) -> Any:
        if not isinstance(d, dict):
            return d
        out = {}
        for k, v in d.items():
            if k in _KNOWN[level]:
                out[k] = v
            else:
                unknown.add(f"{path}.{k}" if path else str(k))
        return out

    top = keep(obj, "router", "")
    if not isinstance(top, dict):
        return top
    ev = top["event"] = keep(top.get("event"), "event", "event")
    if isinstance(ev, dict):
        data = ev.get("data")  # an unknown key here is an unknown variant: left for the decoder to refuse
        if isinstance(data, dict):
            if "stored" in data:
                st = data["stored"] = keep(data["stored"], "stored", "event.data.stored")
                if isinstance(st, dict) and isinstance(st.get("blocks"), list):
                    blocks = []
                    for b in st["blocks"]:
                        b = keep(b, "block", "event.data.stored.blocks[]")
                        if isinstance(b, dict) and isinstance(b.get("mm_extra_info"), dict):
                            x = b["mm_extra_info"] = keep(b["mm_extra_info"], "extra", "mm_extra_info")
                            if isinstance(x.get("mm_objects"), list):
                                x["mm_objects"] = [keep(m, "mm", "mm_objects[]") for m in x["mm_objects"]]
                        blocks.append(b)
                    st["blocks"] = blocks
            if "removed" in data:
                data["removed"] = keep(data["removed"], "removed", "event.data.removed")
    return top


def event_data(data: EventDataMsg | str) -> StoreDataMsg | RemoveDataMsg | None:
    """The one variant of a decoded ``data`` (None for cleared); raises
    WireError when the object names none or both."""
    if isinstance(data, str):
        return None
    if data.stored is not None:
        if data.removed is not None:
            raise WireError("event data names both 'stored' and 'removed'")
        return data.stored
    if data.removed is not None:
        return data.removed
    raise WireError("event data names no variant: expected 'stored', 'removed' or \"cleared\"")


# vLLM ------------------------------------------------------------------

#: vLLM's ``ExternalBlockHash``: an int (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``,
#: the default) or the full hash bytes. SGLang's events have the same shape
#: with the hash as a signed int64 (``sglang/srt/mem_cache/utils.py``,
#: ``hash_str_to_int64``), so a negative int is read too: the feed maps it to
#: the unsigned value of the same 8 bytes (``zmqfeed.ZmqFeed``)
VllmHash = Annotated[int, msgspec.Meta(ge=-(2**63))] | bytes


class _StoredFields(msgspec.Struct, gc=False):
    block_hashes: list[VllmHash]
    token_ids: list[U32]
    block_size: Annotated[int, msgspec.Meta(ge=1)]
    parent_block_hash: VllmHash | None = None
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: Annotated[int, msgspec.Meta(ge=0)] | None = None
    #: SGLang: the request's cache salt (its pages' hashes are chained from it)
    cache_salt: str | None = None


class _RemovedFields(msgspec.Struct, gc=False):
    block_hashes: list[VllmHash]
    medium: str | None = None
    group_idx: Annotated[int, msgspec.Meta(ge=0)] | None = None


# The array layout is positional: vLLM's field order (block_hashes,
# parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
# extra_keys, group_idx); trailing fields a newer vLLM adds are ignored.
class VllmStoredArr(msgspec.Struct, array_like=True, tag="BlockStored", gc=False):
    block_hashes: list[VllmHash]
    parent_block_hash: VllmHash | None
    token_ids: list[U32]
    block_size: Annotated[int, msgspec.Meta(ge=1)]
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: Annotated[int, msgspec.Meta(ge=0)] | None = None


class VllmRemovedArr(msgspec.Struct, array_like=True, tag="BlockRemoved", gc=False):
    block_hashes: list[VllmHash]
    medium: str | None = None
    group_idx: Annotated[int, msgspec.Meta(ge=0)] | None = None


class VllmClearedArr(msgspec.Struct, array_like=True, tag="AllBlocksCleared", gc=False):
    pass


class VllmStoredMap(_StoredFields, tag="BlockStored", tag_field="type", gc=False):
    pass


class VllmRemovedMap(_RemovedFields, tag="BlockRemoved", tag_field="type", gc=False):
    pass


class VllmClearedMap(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", gc=False):
    pass


VllmArrEvent = VllmStoredArr | VllmRemovedArr | VllmClearedArr
VllmMapEvent = VllmStoredMap | VllmRemovedMap | VllmClearedMap
VllmStored = VllmStoredArr | VllmStoredMap
VllmRemoved = VllmRemovedArr | VllmRemovedMap
VllmEvent = VllmArrEvent | VllmMapEvent
STORED_TYPES = (VllmStoredArr, VllmStoredMap)
REMOVED_TYPES = (VllmRemovedArr, VllmRemovedMap)


class VllmBatchArrMap(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[VllmMapEvent]
    data_parallel_rank: Annotated[int, msgspec.Meta(ge=0)] | None = None


class VllmBatchArrArr(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[VllmArrEvent]
    data_parallel_rank: Annotated[int, msgspec.Meta(ge=0)] | None = None


class VllmBatchMapMap(msgspec.Struct, gc=False):
    ts: float
    events: list[VllmMapEvent]
    data_parallel_rank: Annotated[int, msgspec.Meta(ge=0)] | None = None


class VllmBatchMapArr(msgspec.Struct, gc=False):
    ts: float
    events: list[VllmArrEvent]
    data_parallel_rank: Annotated[int, msgspec.Meta(ge=0)] | None = None


VllmBatch = VllmBatchArrMap | VllmBatchArrArr | VllmBatchMapMap | VllmBatchMapArr


class VllmBatchDecoder:
    """Decodes ``KVEventBatch`` payloads in whichever of the four layouts the
    stream uses; the layout that worked last is tried first."""

    def __init__(self) -> None:
        self._decoders: list[msgspec.msgpack.Decoder[Any]] = [
            msgspec.msgpack.Decoder(VllmBatchArrMap),  # vLLM 0.32, Dynamo's mocker
            msgspec.msgpack.Decoder(VllmBatchArrArr),  # older vLLM (array_like everywhere)
            msgspec.msgpack.Decoder(VllmBatchMapMap),
            msgspec.msgpack.Decoder(VllmBatchMapArr),
        ]

    def decode(self, payload: bytes) -> VllmBatch:
        errors: list[str] = []
        for i, dec in enumerate(self._decoders):
            try:
                batch: VllmBatch = dec.decode(payload)
            except msgspec.ValidationError as e:
                errors.append(str(e))
                continue
            except (msgspec.DecodeError, ValueError) as e:
                raise WireError(f"not valid msgpack: {e}") from None
            except RecursionError:
                raise WireError("msgpack nested too deeply") from None
            if i:
                self._decoders.insert(0, self._decoders.pop(i))
            return batch

        # the layout that got furthest into the payload says what is wrong (a
        # layout mismatch, map for array or array for map, least)
        def depth(m: str) -> tuple[int, int]:
            path = len(m.rpartition(" - at `")[2]) if " - at `" in m else 0
            mismatch = "Expected `object`, got `array`" in m or "Expected `array`, got `object`" in m
            return path, 0 if mismatch else 1

        best = max(errors, key=depth)
        raise WireError(f"not a vLLM KVEventBatch: {best}")


def vllm_tier(medium: str | None, group_idx: int | None) -> str:
    """The tier a vLLM event concerns; a KV cache group other than 0 (hybrid
    models) is a pool of its own, named ``TIER/gN``."""
    tier = MEDIUM_TO_TIER.get(medium)
    if tier is None:
        raise WireError(f"unknown vLLM storage medium {medium!r}")
    return tier if not group_idx else f"{tier}/g{group_idx}"


def vllm_hash_int(h: int | bytes) -> int:
    """A vLLM block hash as the u64 a router keys it by: ints as they are,
    hash bytes reduced the way vLLM's own ``maybe_convert_block_hash`` does
    (the low 64 bits of the big-endian value)."""
    if isinstance(h, bytes):
        return int.from_bytes(h, "big") & U64_MAX
    return h
