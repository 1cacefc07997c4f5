"""Wire models: strict validation that names the offending field, and JSON
forms compatible with Dynamo's KvCacheEvent."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.wire import (
    Counters,
    ErrorInfo,
    FullBlock,
    KvEvent,
    OpResult,
    StepOutcome,
    Use,
    event_to_json,
    make_stored,
    parse_operation,
)


def test_operation_round_trips_through_json() -> None:
    op = parse_operation(
        {"op": "use", "blocks": [{"full": 2**64 - 1}, {"partial": "u1"}], "plhs": [{"hash": 1, "position": 0}]}
    )
    assert isinstance(op, Use)
    assert parse_operation(json.loads(op.model_dump_json())) == op


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"op": "use", "blocks": [{"full": 2**64}]}, "blocks.0"),
        ({"op": "use", "blocks": [{"full": -1}]}, "blocks.0"),
        ({"op": "use", "blocks": [{"full": "7"}]}, "blocks.0"),
        ({"op": "use", "blocks": [], "surprise": 1}, "surprise"),
        ({"op": "deref"}, "blocks"),
        ({"op": "promote", "uuid": "", "seq_hash": 1, "plh": {"hash": 1}}, "uuid"),
        ({"op": "tick", "now_ms": float("nan")}, "now_ms"),
        ({"op": "tick", "now_ms": -1}, "now_ms"),
        ({"op": "use", "blocks": [], "token_ids": [[2**32]]}, "token_ids"),
    ],
)
def test_malformed_operations_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        parse_operation(data)
    locs = [".".join(str(x) for x in err["loc"]) for err in e.value.errors()]
    assert any(field in loc for loc in locs), locs


def test_unknown_operation_is_rejected_by_tag() -> None:
    with pytest.raises(ValidationError) as e:
        parse_operation({"op": "explode"})
    assert "explode" in str(e.value)


def test_event_json_is_dynamo_shaped() -> None:
    ev = make_stored(3, [11, 12], [101, 102], 10, dp_rank=1, token_ids=[[1, 2], [3, 4]])
    js = event_to_json(ev)
    assert js["event_id"] == 3 and js["dp_rank"] == 1 and js["storage_tier"] == "device"
    assert js["data"] == {
        "stored": {
            "parent_hash": 10,
            "blocks": [{"block_hash": 11, "tokens_hash": 101}, {"block_hash": 12, "tokens_hash": 102}],
        }
    }
    assert KvEvent.model_validate(js) == KvEvent.model_validate(json.loads(ev.model_dump_json()))


def test_cleared_is_a_bare_string_like_serde_unit_variant() -> None:
    ev = KvEvent.model_validate({"event_id": 0, "data": "cleared"})
    assert ev.kind == "cleared" and event_to_json(ev)["data"] == "cleared"


def test_event_token_ids_must_match_blocks() -> None:
    with pytest.raises(ValidationError, match="one entry per stored block"):
        KvEvent.model_validate(
            {
                "event_id": 0,
                "data": {"stored": {"blocks": [{"block_hash": 1, "tokens_hash": 1}]}},
                "block_token_ids": [],
            }
        )
    with pytest.raises(ValidationError, match="only allowed on a stored"):
        KvEvent.model_validate({"event_id": 0, "data": {"removed": {"block_hashes": [1]}}, "block_token_ids": [[1]]})


def test_empty_removed_and_stored_are_malformed() -> None:
    with pytest.raises(ValidationError):
        KvEvent.model_validate({"event_id": 0, "data": {"removed": {"block_hashes": []}}})
    with pytest.raises(ValidationError):
        KvEvent.model_validate({"event_id": 0, "data": {"stored": {"blocks": []}}})


def test_step_outcome_carries_result_xor_error() -> None:
    c = Counters(active_blocks=0, active_refs=0, inactive_blocks=0, free_blocks=1)
    StepOutcome(result=OpResult(value=1), counters=c)
    StepOutcome(error=ErrorInfo(rule="USE-VALIDATE", message="x"), counters=c)
    with pytest.raises(ValidationError):
        StepOutcome(counters=c)
    with pytest.raises(ValidationError):
        StepOutcome(result=OpResult(), error=ErrorInfo(rule="X", message="x"), counters=c)


def test_config_rejects_profile_policy_mismatches() -> None:
    with pytest.raises(ValidationError, match="legacy profile evicts by 'lru' only"):
        ManagerConfig(profile="legacy", capacity=4, eviction="lineage")
    with pytest.raises(ValidationError, match="vllm profile evicts by 'lru' only"):
        ManagerConfig(profile="vllm", capacity=4, eviction="multi_lru")
    with pytest.raises(ValidationError, match="no offload tier"):
        ManagerConfig(profile="atomic", capacity=4, eviction="lru", offload=OffloadConfig(num_g2_blocks=1))
    assert ManagerConfig(profile="kvbm", capacity=4, eviction="lru", offload=OffloadConfig(num_g2_blocks=1)).offload
    with pytest.raises(ValidationError, match="no offload tier"):
        ManagerConfig(profile="legacy", capacity=4, eviction="lru", offload=OffloadConfig(num_g2_blocks=1))
    with pytest.raises(ValidationError):
        ManagerConfig(capacity=0)


def test_offload_transfer_time_from_bandwidth() -> None:
    assert OffloadConfig(
        num_g2_blocks=1, block_size_bytes=1_000_000, bandwidth_gbps=1.0
    ).transfer_ms() == pytest.approx(1.0)
    assert OffloadConfig(num_g2_blocks=1).transfer_ms() == 0.0


def test_block_refs_are_hashable_and_distinct() -> None:
    assert {FullBlock(full=1), FullBlock(full=1)} == {FullBlock(full=1)}
