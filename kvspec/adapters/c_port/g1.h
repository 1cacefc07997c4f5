/*
 * g1.h -- the G1 block manager of the kvbm profile (LRU eviction, no offload
 * tier), ported to C from the semantics of kvspec's reference model
 * (reference/g1.py, G1Model with profile "kvbm" and eviction "lru").
 *
 * Operations are decoded by abi.c into the structs below; every operation is
 * validated in full before any state changes, so a rejected one (an outcome
 * with `rule` set) leaves the manager exactly as it was.
 */
#ifndef KVSPEC_PORT_G1_H
#define KVSPEC_PORT_G1_H

#include <stddef.h>
#include <stdint.h>

#define G1_UUID_MAX 256 /* bytes: 64 code points of UTF-8 */

typedef struct {
    uint64_t hash, parent, position;
    uint8_t has_parent;
} g1_plh;

typedef struct {
    uint8_t partial;
    uint64_t full;
    const char *uuid; /* partial: not NUL-terminated */
    uint32_t uuid_len;
} g1_ref;

typedef struct {
    const g1_ref *blocks;
    size_t nblocks;
    const uint64_t *local_hashes; /* nlocal == 0: none given */
    size_t nlocal;
    const g1_plh *plhs;
    size_t nplhs;
    uint8_t has_tokens;
    const uint32_t *const *tokens; /* ntokens lists */
    const size_t *token_lens;
    size_t ntokens;
    uint8_t has_parent;
    g1_ref parent;
} g1_use;

typedef struct {
    const g1_ref *blocks;
    size_t nblocks;
} g1_deref;

typedef struct {
    const char *uuid;
    uint32_t uuid_len;
    uint64_t seq_hash;
    uint8_t has_parent_hash;
    uint64_t parent_hash;
    uint64_t local_hash;
    g1_plh plh;
    uint8_t has_tokens;
    const uint32_t *tokens;
    size_t ntokens;
} g1_promote;

/* What one operation reported. Events: at most one Stored (stored_n > 0)
 * published before at most one Removed (removed_n > 0). */
typedef struct {
    const char *rule; /* non-NULL: rejected under this rule id */
    char message[512];
    uint8_t has_value;
    uint64_t value;
    const char *status;
    /* Stored: pool indices of the newly registered blocks, in order */
    uint64_t stored_event_id;
    const int32_t *stored;
    size_t stored_n;
    uint8_t stored_has_parent;
    uint64_t stored_parent;
    /* Removed: sequence hashes, in eviction order */
    uint64_t removed_event_id;
    const uint64_t *removed;
    size_t removed_n;
} g1_outcome;

typedef struct g1_mgr g1_mgr;

typedef struct {
    uint64_t active_blocks, active_refs, inactive_blocks, free_blocks;
} g1_counters;

/* NULL on out of memory. */
g1_mgr *g1_new(uint64_t capacity, uint32_t block_size, uint64_t dp_rank);
void g1_free(g1_mgr *m);

/* Each returns 0, or -1 on out of memory before any change (out->message
 * says so). A rejection by the spec is a 0 return with out->rule set. */
int g1_use_op(g1_mgr *m, const g1_use *op, g1_outcome *out);
int g1_deref_op(g1_mgr *m, const g1_deref *op, g1_outcome *out);
int g1_promote_op(g1_mgr *m, const g1_promote *op, g1_outcome *out);

g1_counters g1_get_counters(const g1_mgr *m);
uint64_t g1_dp_rank(const g1_mgr *m);
/* Metadata of a registered block by pool index (valid until the next op). */
void g1_block_meta(const g1_mgr *m, int32_t idx, uint64_t *seq, uint64_t *local_hash, const uint32_t **tokens);
uint32_t g1_block_size(const g1_mgr *m);

#endif
