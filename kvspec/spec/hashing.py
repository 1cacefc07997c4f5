"""Block hashing as Dynamo computes it (rules HASH-LOCAL, HASH-SEQUENCE).

- local hash (``tokens_hash`` in events): xxh3-64 with seed 1337 over the
  block's token ids encoded as little-endian u32;
- sequence hash (``block_hash`` in events): the first block's sequence hash is
  its local hash; each later block's is xxh3-64 (seed 1337) over the parent's
  sequence hash and the block's local hash, both as little-endian u64.

``tests/test_hashing.py`` checks these against vectors recorded from the
published ``ai-dynamo-runtime`` wheel (``spec/vectors/hash_vectors.json``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

SEED = 1337


def salt_seed(lora_name: str | None = None, cache_namespace: str | None = None) -> int:
    """The local-hash seed: 1337, plus xxh3-64 of the LoRA name (seed 0) and of
    the cache namespace (seed 1) when they are non-empty, modulo 2**64."""
    seed = SEED
    if lora_name:
        seed += xxhash.xxh3_64_intdigest(lora_name.encode(), seed=0)
    if cache_namespace:
        seed += xxhash.xxh3_64_intdigest(cache_namespace.encode(), seed=1)
    return seed % 2**64


def local_block_hash(tokens: Sequence[int], *, seed: int = SEED) -> int:
    """xxh3-64 of the tokens as little-endian u32 (HASH-LOCAL); seed 1337
    unless a LoRA name or cache namespace salts it (``salt_seed``)."""
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(tokens)}I", *tokens), seed=seed)


def sequence_hash(parent: int | None, local: int) -> int:
    """Chain a block's local hash onto its parent's sequence hash (HASH-SEQUENCE)."""
    if parent is None:
        return local
    return xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent, local), seed=SEED)


def block_hashes(tokens: Sequence[int], block_size: int, *, seed: int = SEED) -> list[tuple[int, int]]:
    """(sequence hash, local hash) of every full block of ``tokens``; a
    trailing partial block has no hash."""
    out: list[tuple[int, int]] = []
    parent: int | None = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        local = local_block_hash(tokens[start : start + block_size], seed=seed)
        parent = sequence_hash(parent, local)
        out.append((parent, local))
    return out
