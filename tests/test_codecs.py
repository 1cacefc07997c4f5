"""Dynamo router-event JSON and vLLM msgpack batches, both directions, and
clear errors on malformed input."""

from __future__ import annotations

import msgpack
import pytest

from kvspec.spec.codecs import (
    from_dynamo_event,
    from_router_event,
    from_vllm_batch,
    to_dynamo_event,
    to_router_event,
    to_vllm_batch,
)
from kvspec.spec.errors import WireError
from kvspec.spec.hashing import local_block_hash
from kvspec.spec.wire import make_cleared, make_removed, make_stored


def test_dynamo_event_has_no_tier_or_tokens_and_round_trips() -> None:
    ev = make_stored(5, [1, 2], [11, 12], None, tier="host_pinned", token_ids=[[1], [2]])
    js = to_dynamo_event(ev)
    assert set(js) == {"event_id", "data", "dp_rank"}
    back = from_dynamo_event(js, storage_tier="host_pinned", block_token_ids=[[1], [2]])
    assert back == ev


def test_router_envelope_round_trips_with_worker_and_tier() -> None:
    ev = make_removed(7, [3, 4], tier="host_pinned", dp_rank=2)
    worker, back = from_router_event(to_router_event(ev, worker_id=9))
    assert worker == 9 and back == ev


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "an object"),
        ({"event": {"event_id": 0, "data": "cleared"}, "worker_id": -1}, "worker_id"),
        ({"event": {"event_id": 0, "data": "cleared"}, "storage_tier": "moon"}, "storage_tier"),
        ({"event": {"event_id": 0, "data": {"stored": {"blocks": "x"}}}}, "blocks"),
    ],
)
def test_malformed_router_events_are_named(data: object, message: str) -> None:
    with pytest.raises(WireError, match=message):
        from_router_event(data)


def test_vllm_batch_round_trip_computes_tokens_hashes() -> None:
    toks = [[1, 2, 3, 4], [5, 6, 7, 8]]
    stored = make_stored(0, [100, 200], [local_block_hash(t) for t in toks], 99, token_ids=toks, dp_rank=1)
    removed = make_removed(1, [100], dp_rank=1)
    cleared = make_cleared(2, dp_rank=1)
    payload = to_vllm_batch([stored, removed, cleared], ts=1.5, block_size=4, dp_rank=1)
    raw = msgpack.unpackb(payload)
    assert raw[0] == 1.5 and raw[2] == 1
    assert raw[1][0] == ["BlockStored", [100, 200], 99, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU"]
    assert raw[1][1] == ["BlockRemoved", [100], "GPU"]
    assert raw[1][2] == ["AllBlocksCleared"]
    ts, events = from_vllm_batch(payload)
    assert ts == 1.5
    assert events == [stored, removed, cleared]


def test_vllm_event_ids_are_assigned_in_arrival_order() -> None:
    payload = msgpack.packb([0.0, [["BlockRemoved", [1], "CPU"], ["BlockRemoved", [2], None]]])
    _, events = from_vllm_batch(payload, first_event_id=10)
    assert [e.event_id for e in events] == [10, 11]
    assert [e.storage_tier for e in events] == ["host_pinned", "device"]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb({"a": 1}), "missing required field `ts`"),
        (msgpack.packb([0.0, [["Boom"]]]), "Invalid value 'Boom'"),
        (msgpack.packb([0.0, [["BlockStored", [1], None, [1, 2, 3], 4, None, "GPU"]]]), "token_ids has 3"),
        (
            # a negative hash is SGLang's signed form: the ZMQ feed reads it, a kvspec event cannot hold it
            msgpack.packb([0.0, [["BlockStored", [-1], None, [1], 1, None, "GPU"]]]),
            "block_hashes: -1 is negative",
        ),
        (msgpack.packb([0.0, [["BlockRemoved", [1], "TAPE"]]]), "medium"),
        (msgpack.packb([0.0, [["BlockStored", [1]]]]), "of at least length 5, got 2"),
        (msgpack.packb([0.0, [{"type": "BlockRemoved", "block_hashes": [1], "group_idx": 2}]]), "KV cache group 2"),
    ],
)
def test_malformed_vllm_batches_are_named(payload: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        from_vllm_batch(payload)


def test_vllm_stored_needs_token_ids() -> None:
    with pytest.raises(WireError, match="token ids"):
        to_vllm_batch([make_stored(0, [1], [0], None)], block_size=4)


def test_vllm_batch_in_the_map_layout_of_vllm_0_32() -> None:
    """vLLM 0.32 sends each event as a map with a ``type`` key (and more
    fields than the array layout had): the same events come out."""
    toks = [[1, 2, 3, 4]]
    batch = [
        2.5,
        [
            {
                "type": "BlockStored",
                "block_hashes": [100],
                "parent_block_hash": None,
                "token_ids": toks[0],
                "block_size": 4,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
                "extra_keys": [None],
                "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            },
            {"type": "BlockRemoved", "block_hashes": [100], "medium": "CPU", "group_idx": 0},
            {"type": "AllBlocksCleared"},
        ],
        3,
    ]
    ts, events = from_vllm_batch(msgpack.packb(batch), first_event_id=4)
    assert ts == 2.5
    assert events == [
        make_stored(4, [100], [local_block_hash(toks[0])], None, dp_rank=3, token_ids=toks),
        make_removed(5, [100], dp_rank=3, tier="host_pinned"),
        make_cleared(6, dp_rank=3),
    ]
