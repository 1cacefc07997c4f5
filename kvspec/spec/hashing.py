"""Block hashing as Dynamo computes it (rules HASH-LOCAL, HASH-SEQUENCE).

- local hash (``tokens_hash`` in events): xxh3-64 with seed 1337 over the
  block's token ids encoded as little-endian u32;
- sequence hash (``block_hash`` in events): the first block's sequence hash is
  its local hash; each later block's is xxh3-64 (seed 1337) over the parent's
  sequence hash and the block's local hash, both as little-endian u64.

The local hash's seed is salted by a LoRA name and a cache namespace
(``salt_seed``); Eagle speculative decoding hashes each block with the first
token of the next (``local_hashes(is_eagle=True)``); blocks with multimodal
objects hash their object ids too (``local_hash_mm``).

``tests/test_hashing.py`` checks these against vectors recorded from the
published ``ai-dynamo-runtime`` wheel (``spec/vectors/hash_vectors.json``)
and against the wheel's own ``compute_block_hash_for_seq``.

vLLM hashes blocks differently (sha256 or xxh3-128 over a pickled or CBOR
tuple, chained through the parent's full digest): ``vllm_block_hash`` and
friends at the end of this module.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Any

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


_LE_U64 = struct.Struct("<Q")
_PAIR = struct.Struct("<QQ")


def chain(parent: int | None, local: int) -> int:
    """``sequence_hash`` with a preallocated packer (the checker's hot path)."""
    if parent is None:
        return local
    return xxhash.xxh3_64_intdigest(_PAIR.pack(parent, local), seed=SEED)


def local_hash_mm(tokens: Sequence[int], mm_hashes: Sequence[int], *, seed: int = SEED) -> int:
    """The local hash of a block that carries multimodal objects: the tokens
    (little-endian u32) followed by the objects' ``mm_hash`` values, sorted,
    as little-endian u64 (ai-dynamo/dynamo lib/kv-router/src/protocols.rs,
    ``compute_block_hash_for_seq``)."""
    data = struct.pack(f"<{len(tokens)}I", *tokens) + b"".join(_LE_U64.pack(h) for h in sorted(mm_hashes))
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def local_hashes(
    tokens: Sequence[int],
    block_size: int,
    *,
    lora_name: str | None = None,
    cache_namespace: str | None = None,
    is_eagle: bool = False,
    mm_hashes: Sequence[Sequence[int] | None] | None = None,
) -> list[int]:
    """The local hash of every complete block of ``tokens``, as Dynamo's
    ``compute_block_hash_for_seq`` computes it: the seed salted by the LoRA
    name and the cache namespace (``salt_seed``); with ``is_eagle`` each
    block's window is its own tokens plus the first token of the next block
    (``block_size + 1`` tokens, stride ``block_size``), so a block counts as
    complete only when that next token exists; ``mm_hashes[i]`` are the
    multimodal object hashes of block ``i``."""
    if block_size <= 0:
        return []
    seed = salt_seed(lora_name, cache_namespace)
    window = block_size + 1 if is_eagle else block_size
    out: list[int] = []
    for i, start in enumerate(range(0, len(tokens) - window + 1, block_size)):
        chunk = tokens[start : start + window]
        mm = mm_hashes[i] if mm_hashes is not None and i < len(mm_hashes) else None
        out.append(local_hash_mm(chunk, mm, seed=seed) if mm else local_block_hash(chunk, seed=seed))
    return out


# ------------------------------------------------------------------ vLLM
#
# vLLM's prefix-cache block hash (vllm-project/vllm vllm/v1/core/kv_cache_utils.py,
# ``hash_block_tokens``): hash_fn((parent_hash, tuple(token_ids), extra_keys)),
# where parent_hash is the parent's full hash bytes, or NONE_HASH for the
# first block; NONE_HASH = hash_fn(seed), the seed being PYTHONHASHSEED when
# set, else (vLLM 0.32, ``resolve_none_hash_seed``) "vllm-none-hash" for the
# sha256 functions and random bytes for the xxhash ones. The hash functions
# (vllm/utils/hashing.py) serialise with pickle (protocol 5) or canonical
# CBOR and digest with sha256 or xxh3-128. Events carry the low 64 bits of
# the big-endian digest (``maybe_convert_block_hash``).

VLLM_DEFAULT_SEED = "vllm-none-hash"
VLLM_HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def _vllm_serialise(algo: str, obj: Any) -> bytes:
    if algo.endswith("_cbor"):
        import cbor2

        return bytes(cbor2.dumps(obj, canonical=True))
    return pickle.dumps(obj, protocol=5)


def vllm_hash_fn(algo: str) -> Callable[[Any], bytes]:
    """One of vLLM's prefix-caching hash functions, by its config name."""
    if algo not in VLLM_HASH_ALGOS:
        raise ValueError(f"unknown vLLM hash algorithm {algo!r}; known: {', '.join(VLLM_HASH_ALGOS)}")
    if algo.startswith("sha256"):
        return lambda obj: hashlib.sha256(_vllm_serialise(algo, obj)).digest()
    return lambda obj: xxhash.xxh3_128_digest(_vllm_serialise(algo, obj))


def vllm_none_hash(algo: str, seed: str = VLLM_DEFAULT_SEED) -> bytes:
    """The root parent of every vLLM hash chain for this algorithm and seed."""
    return vllm_hash_fn(algo)(seed)


def as_tuples(obj: Any) -> Any:
    """msgpack brings vLLM's tuples back as lists; pickle tells them apart,
    so extra keys are turned back into tuples before hashing."""
    if isinstance(obj, list | tuple):
        return tuple(as_tuples(x) for x in obj)
    return obj


def vllm_block_hash(
    algo: str,
    parent: bytes,
    token_ids: Sequence[int],
    extra_keys: Any = None,
    *,
    fn: Callable[[Any], bytes] | None = None,
) -> bytes:
    """The full vLLM hash of one block (``parent``: the parent's full hash,
    or ``vllm_none_hash`` for a first block)."""
    h = fn if fn is not None else vllm_hash_fn(algo)
    return h((parent, tuple(token_ids), as_tuples(extra_keys)))


def vllm_external(full: bytes) -> int:
    """The u64 a vLLM event carries for a full hash."""
    return int.from_bytes(full, "big") & 0xFFFFFFFFFFFFFFFF


def sglang_page_digests(tokens: Sequence[int], page_size: int, prior: bytes | None = None) -> list[bytes]:
    """SGLang's page hashes of ``tokens`` (whole pages), chained from ``prior``
    (the full digest of the page before, None at the tree's root): each is
    sha256 of the prior digest (absent at the root) followed by the page's
    token ids as little-endian u32 (``sgl-project/sglang``
    ``python/sglang/srt/mem_cache/cpp_utils/hash_binding.cpp`` ``hash_page``,
    reached from ``mem_cache/utils.py::compute_node_hash_values`` for keys
    without a LoRA or cache-salt namespace and token ids below 2**32)."""
    out: list[bytes] = []
    for start in range(0, len(tokens) - page_size + 1, page_size):
        page = tokens[start : start + page_size]
        h = hashlib.sha256()
        if prior is not None:
            h.update(prior)
        h.update(struct.pack(f"<{len(page)}I", *page))
        prior = h.digest()
        out.append(prior)
    return out


def sglang_event_hash(digest: bytes) -> int:
    """The signed int64 an SGLang KV event carries for a page digest: its
    first 8 bytes, big-endian (``mem_cache/utils.py::hash_str_to_int64``)."""
    return int.from_bytes(digest[:8], "big", signed=True)


#: the tag SGLang hashes a cache salt with to seed a salted page chain
#: (``mem_cache/utils.py::compute_node_event_hash_values``)
SGLANG_SALT_TAG = b"sglang-cache-salt-v1\0"
#: the tag of SGLang's event namespace seed (``disaggregation/kv_events.py``,
#: ``_NAMESPACE_SEED_TAG``; its dynamo event format namespaces block hashes)
SGLANG_NAMESPACE_TAG = b"sglang-kv-event-namespace-v1"


def sglang_salt_prior(cache_salt: str) -> bytes:
    """The digest a salted SGLang page chain starts from (the root's "prior")."""
    return hashlib.sha256(SGLANG_SALT_TAG + cache_salt.encode("utf-8")).digest()


def sglang_page_digest(prior: bytes | None, page: Sequence[int]) -> bytes:
    """One page of ``sglang_page_digests``: sha256 of the prior digest (none
    at the root) and the page's token ids as little-endian u32."""
    h = hashlib.sha256(prior) if prior else hashlib.sha256()
    h.update(struct.pack(f"<{len(page)}I", *page))
    return h.digest()


def sglang_namespace_seed(extra_key: str | None, cache_salt: str | None) -> bytes | None:
    """SGLang's ``kv_event_namespace_seed``: None without a namespace; else
    sha256 of its tag and each part as a presence byte, its UTF-8 length (8
    bytes little-endian) and its bytes."""
    if extra_key is None and cache_salt is None:
        return None
    h = hashlib.sha256(SGLANG_NAMESPACE_TAG)
    for part in (extra_key, cache_salt):
        if part is None:
            h.update(b"\x00")
            continue
        b = part.encode("utf-8")
        h.update(b"\x01" + len(b).to_bytes(8, "little") + b)
    return h.digest()


def sglang_namespaced(block_hash: int, seed: bytes) -> int:
    """SGLang's ``namespaced_block_hash`` of a published hash, both as the
    unsigned 64-bit value of their 8 big-endian bytes (SGLang writes them
    signed: the same bytes)."""
    return int.from_bytes(
        hashlib.sha256(seed + (block_hash & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")).digest()[:8], "big"
    )


def sglang_u64(digest: bytes) -> int:
    """The unsigned 64-bit value of the hash an SGLang event carries for a
    page digest (``sglang_event_hash`` reads the same 8 bytes signed)."""
    return int.from_bytes(digest[:8], "big")
