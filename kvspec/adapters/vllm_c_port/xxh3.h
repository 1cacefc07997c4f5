/*
 * xxh3.h -- XXH3-64 with a seed, the hash kvspec's block hashes use.
 *
 * spec/SPEC.md, "Hashing": a block's local hash (tokens_hash) is xxh3-64
 * with seed 1337 over its token ids as little-endian u32 (HASH-LOCAL); its
 * sequence hash (block_hash) is the local hash for the first block, else
 * xxh3-64 (seed 1337) over the parent's sequence hash and the local hash,
 * both little-endian u64 (HASH-SEQUENCE). Written from the XXH3 algorithm
 * description; tests/test_vllm_c_port.py checks it against the xxhash
 * package on every input length up to the multi-block path.
 */
#ifndef VLLM_C_PORT_XXH3_H
#define VLLM_C_PORT_XXH3_H

#include <stddef.h>
#include <stdint.h>

#define KV_HASH_SEED 1337u

uint64_t xxh3_64(const void *input, size_t len, uint64_t seed);

/* HASH-LOCAL: the local hash of one block's token ids. */
uint64_t kv_local_hash(const uint32_t *tokens, size_t n);
/* HASH-SEQUENCE: chain a local hash onto its parent (has_parent == 0: first block). */
uint64_t kv_sequence_hash(int has_parent, uint64_t parent, uint64_t local);

#endif
