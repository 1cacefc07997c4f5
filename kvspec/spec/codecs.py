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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgpack
from pydantic import ValidationError

from .errors import WireError
from .hashing import local_block_hash
from .wire import KvEvent, StorageTier, event_to_json, make_cleared, make_removed, make_stored

#: vLLM's storage medium names and kvspec's tiers
MEDIUM_TO_TIER: dict[str | None, StorageTier] = {None: "device", "GPU": "device", "CPU": "host_pinned", "DISK": "disk"}
TIER_TO_MEDIUM: dict[str, str] = {"device": "GPU", "host_pinned": "CPU", "disk": "DISK"}


# ---------------------------------------------------------------- Dynamo


def to_dynamo_event(event: KvEvent) -> dict[str, Any]:
    """Dynamo ``KvCacheEvent`` JSON (no tier, no token ids)."""
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
    if tier not in ("device", "host_pinned", "disk", "remote"):
        raise WireError(f"router event: unknown storage_tier {tier!r}")
    return worker, from_dynamo_event(data["event"], storage_tier=tier, block_token_ids=data.get("block_token_ids"))


# ------------------------------------------------------------------ vLLM


def to_vllm_batch(events: Iterable[KvEvent], *, ts: float = 0.0, block_size: int, dp_rank: int | None = None) -> bytes:
    """Encode events as one vLLM ``KVEventBatch`` (msgpack)."""
    out: list[Any] = []
    for ev in events:
        medium = TIER_TO_MEDIUM.get(ev.storage_tier, "GPU")
        if ev.kind == "stored":
            if ev.block_token_ids is None:
                raise WireError(f"event {ev.event_id}: vLLM's BlockStored needs the token ids of its blocks")
            d = ev.data.stored  # type: ignore[union-attr]
            tokens = [t for block in ev.block_token_ids for t in block]
            out.append(["BlockStored", ev.hashes(), d.parent_hash, tokens, block_size, None, medium])
        elif ev.kind == "removed":
            out.append(["BlockRemoved", ev.hashes(), medium])
        else:
            out.append(["AllBlocksCleared"])
    batch: list[Any] = [ts, out] if dp_rank is None else [ts, out, dp_rank]
    return msgpack.packb(batch)


def from_vllm_batch(payload: bytes, *, first_event_id: int = 0) -> tuple[float, list[KvEvent]]:
    """Decode a vLLM ``KVEventBatch``; event ids count from ``first_event_id``."""
    try:
        batch = msgpack.unpackb(payload, strict_map_key=False)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as e:
        raise WireError(f"vLLM event batch is not valid msgpack: {e}") from None
    if not isinstance(batch, list) or len(batch) not in (2, 3) or not isinstance(batch[1], list):
        raise WireError("vLLM event batch must be [ts, [events...]] or [ts, [events...], dp_rank]")
    ts = batch[0]
    if not isinstance(ts, int | float):
        raise WireError(f"vLLM event batch: ts must be a number, got {ts!r}")
    dp_rank = batch[2] if len(batch) == 3 and batch[2] is not None else 0
    if not isinstance(dp_rank, int) or dp_rank < 0:
        raise WireError(f"vLLM event batch: data_parallel_rank must be a non-negative integer, got {dp_rank!r}")
    events: list[KvEvent] = []
    eid = first_event_id
    for i, raw in enumerate(batch[1]):
        if not isinstance(raw, list) or not raw or not isinstance(raw[0], str):
            raise WireError(f"vLLM event {i}: expected a tagged array, got {raw!r:.80}")
        tag = raw[0]
        try:
            if tag == "BlockStored":
                events.append(_vllm_stored(raw, eid, dp_rank))
            elif tag == "BlockRemoved":
                hashes, medium = raw[1], raw[2] if len(raw) > 2 else None
                _check_hashes(hashes, f"vLLM event {i}: block_hashes")
                events.append(make_removed(eid, list(hashes), dp_rank=dp_rank, tier=_tier(medium)))
            elif tag == "AllBlocksCleared":
                events.append(make_cleared(eid, dp_rank=dp_rank))
            else:
                raise WireError(f"vLLM event {i}: unknown event tag {tag!r}")
        except IndexError:
            raise WireError(f"vLLM event {i} ({tag}): too few fields") from None
        eid += 1
    return float(ts), events


def _vllm_stored(raw: list[Any], eid: int, dp_rank: int) -> KvEvent:
    hashes, parent, tokens, block_size = raw[1], raw[2], raw[3], raw[4]
    medium = raw[6] if len(raw) > 6 else None
    _check_hashes(hashes, "BlockStored.block_hashes")
    if parent is not None:
        _check_hashes([parent], "BlockStored.parent_block_hash")
    if not isinstance(block_size, int) or block_size <= 0:
        raise WireError(f"BlockStored.block_size must be a positive integer, got {block_size!r}")
    if not isinstance(tokens, list) or len(tokens) != block_size * len(hashes):
        raise WireError(
            f"BlockStored.token_ids has {len(tokens) if isinstance(tokens, list) else tokens!r} tokens "
            f"for {len(hashes)} blocks of {block_size}"
        )
    per_block = [tokens[i * block_size : (i + 1) * block_size] for i in range(len(hashes))]
    for blk in per_block:
        for t in blk:
            if not isinstance(t, int) or not 0 <= t < 2**32:
                raise WireError(f"BlockStored.token_ids: {t!r} is not a u32 token id")
    return make_stored(
        eid,
        list(hashes),
        [local_block_hash(b) for b in per_block],
        parent,
        dp_rank=dp_rank,
        tier=_tier(medium),
        token_ids=per_block,
    )


def _tier(medium: Any) -> StorageTier:
    if medium not in MEDIUM_TO_TIER:
        raise WireError(f"unknown vLLM storage medium {medium!r}")
    return MEDIUM_TO_TIER[medium]


def _check_hashes(values: Any, what: str) -> None:
    if not isinstance(values, list) or not values:
        raise WireError(f"{what} must be a non-empty list of u64 hashes")
    for v in values:
        if not isinstance(v, int) or not 0 <= v < 2**64:
            raise WireError(
                f"{what}: {v!r} is not a u64 hash (vLLM's own sha256-based hashes must be reduced to 64 bits)"
            )


def _summarize(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:3]:
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
