"""Hashing against vectors recorded from the published ai-dynamo-runtime wheel
(spec/vectors/hash_vectors.json): local hashes from its
compute_block_hash_for_seq, sequence hashes from the Stored events its mocker
published for the same tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvspec.spec as spec_pkg
from kvspec.spec.hashing import block_hashes, local_block_hash, salt_seed, sequence_hash

VECTORS = json.loads((Path(spec_pkg.__file__).parent / "vectors" / "hash_vectors.json").read_text())["vectors"]


@pytest.mark.parametrize("vec", VECTORS, ids=[v["name"] for v in VECTORS])
def test_local_hashes_match_the_wheel(vec: dict) -> None:
    seed = salt_seed(vec["salt"].get("lora_name"), vec["salt"].get("cache_namespace"))
    got = [local for _, local in block_hashes(vec["tokens"], vec["block_size"], seed=seed)]
    assert got == vec["local_hashes"]


WITH_EVENTS = [v for v in VECTORS if "event_blocks" in v]


def test_there_are_event_vectors() -> None:
    assert len(WITH_EVENTS) >= 5


@pytest.mark.parametrize("vec", WITH_EVENTS, ids=[v["name"] for v in WITH_EVENTS])
def test_sequence_hashes_match_the_mocker_events(vec: dict) -> None:
    ours = block_hashes(vec["tokens"], vec["block_size"])
    by_local = {local: seq for seq, local in ours}
    for blk in vec["event_blocks"]:
        assert by_local[blk["tokens_hash"]] == blk["block_hash"]


def test_first_block_sequence_hash_is_its_local_hash() -> None:
    local = local_block_hash([1, 2, 3, 4])
    assert sequence_hash(None, local) == local
    assert sequence_hash(local, local) != local


def test_partial_trailing_block_has_no_hash() -> None:
    assert block_hashes([1, 2, 3], 4) == []
    assert len(block_hashes(list(range(9)), 4)) == 2


@given(st.lists(st.integers(0, 2**32 - 1), min_size=8, max_size=8))
def test_chain_depends_on_every_prefix_token(tokens: list[int]) -> None:
    a = block_hashes(tokens, 4)
    changed = [tokens[0] ^ 1, *tokens[1:]]
    b = block_hashes(changed, 4)
    assert a[1][1] == b[1][1]  # the second block's own tokens did not change
    assert a[1][0] != b[1][0]  # but its sequence hash chains the first block
