/*
 * pool.h -- a vLLM-style block pool and its write-through host tier
 * (spec/SPEC.md, "vLLM-style pool"; profile vllm).
 *
 * The pool holds `capacity` physical blocks. A block is free, held without a
 * hash by one request (a partial tail or a block being computed), or a cached
 * copy of a block hash with an owner count. The same hash may be cached in
 * several copies; each copy has its own Stored and its own Removed
 * (STORE-COPY, REMOVE-COPY). Cached copies nobody owns wait in one LRU queue
 * and are evicted only when an allocation finds no free block, so hashless
 * blocks are always reused first (VLLM-FREE-ORDER); an eviction is reported
 * Removed when the slot is reused (VLLM-LAZY-REMOVE).
 *
 * Every call appends the events it publishes to `pool.events`; the engine
 * (engine.h) serializes them into the reply.
 */
#ifndef VLLM_C_PORT_POOL_H
#define VLLM_C_PORT_POOL_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------ events */

typedef enum { EV_STORED, EV_REMOVED, EV_CLEARED } ev_kind;
typedef enum { TIER_DEVICE, TIER_HOST } ev_tier;

typedef struct {
    uint64_t block_hash, tokens_hash;
} stored_block;

typedef struct {
    ev_kind kind;
    ev_tier tier;
    uint64_t id;
    int has_parent;
    uint64_t parent;
    int has_start;
    uint64_t start_position;
    size_t n;
    stored_block *blocks; /* EV_STORED */
    uint64_t *hashes;     /* EV_REMOVED */
} kv_event;

typedef struct {
    kv_event *items;
    size_t n, cap;
    uint64_t next_id; /* EVENT-ID: from 0, one counter across tiers */
    uint64_t dp_rank;
    int oom;
} event_log;

/* ------------------------------------------------------- u64 -> int32 map */

typedef struct {
    uint64_t *keys;
    int32_t *vals;
    uint8_t *used;
    size_t cap, n;
} u64map;

int map_init(u64map *m, size_t expected);
void map_free(u64map *m);
int32_t map_get(const u64map *m, uint64_t key); /* -1 when absent */
int map_put(u64map *m, uint64_t key, int32_t val); /* 0: out of memory */
void map_del(u64map *m, uint64_t key);
int map_reserve(u64map *m, size_t extra); /* room for extra new keys without growing; 0: out of memory */
void map_clear(u64map *m);

/* -------------------------------------------------------------------- pool */

typedef struct {
    int has_seq;
    uint64_t seq;
    uint32_t owners;
    int held;               /* held without a hash by a request */
    int32_t prev, next;     /* LRU queue links (cached copies nobody owns) */
    int in_lru;
    int32_t copy_next;      /* next copy of the same hash, in caching order */
} pblock;

typedef struct {
    size_t capacity;
    pblock *blocks;
    int32_t *free_stack; /* hashless free blocks */
    size_t nfree;
    int32_t lru_head, lru_tail; /* head: the next victim */
    size_t nlru;
    u64map by_hash; /* hash -> first copy (by caching order) */
    uint64_t refs;  /* active_refs: owners plus held hashless blocks */
    event_log events;
} pool;

typedef struct {
    uint64_t active_blocks, active_refs, inactive_blocks, free_blocks;
} counters;

/* A block-table entry of a request: a full block (by hash) or one physical block. */
typedef struct {
    int is_full;
    uint64_t seq;  /* is_full */
    int32_t block; /* !is_full: the physical block the request holds */
} block_ref;

int pool_init(pool *p, size_t capacity, uint64_t dp_rank);
void pool_free(pool *p);
counters pool_counters(const pool *p);
size_t pool_prefix_hits(const pool *p, const uint64_t *seqs, size_t n);
int pool_cached(const pool *p, uint64_t seq);

/* One allocation: the leading full blocks that are cached are hits (one more
 * owner each), every other full block takes a fresh block and is cached as a
 * new copy, each partial takes a fresh hashless block (its index goes to
 * partial_out). All or nothing: returns 0 when the fresh blocks do not fit
 * (nothing changes), 1 on success (hits in *hits_out), -1 out of memory.
 * Events: one device Removed naming the evicted copies in eviction order,
 * then one device Stored of the new full blocks, anchored to the last hit
 * (else to parent when has_parent). */
int pool_allocate(pool *p, const uint64_t *seqs, const uint64_t *locals, size_t nfull, size_t npartial,
                  int has_parent, uint64_t parent, int32_t *partial_out, size_t *hits_out);

/* The hashless block a request holds is full: cache it as a copy of seq (one Stored). */
int pool_promote(pool *p, int32_t block, uint64_t seq, uint64_t local, int has_parent, uint64_t parent);

/* Release a request's block table entries in the order given. A full block
 * releases the oldest owned copy of its hash; a held block is released
 * itself (back to free when hashless). No events. */
void pool_release(pool *p, const block_ref *refs, size_t n);

/* The prefix-cache reset (CLEAR-ALL): 1 and one Cleared when no block is in
 * use, 0 (nothing changes) otherwise, -1 out of memory. */
int pool_reset(pool *p);

/* --------------------------------------------------------------- host tier */

typedef struct {
    uint64_t seq, local;
    uint64_t position;
} host_block;

typedef struct {
    size_t capacity; /* 0: no host tier */
    u64map index;    /* hash -> entry */
    uint64_t *seq, *clock, *position;
    size_t n;
    uint64_t now;
} host_tier;

int host_init(host_tier *h, size_t capacity);
void host_free(host_tier *h);
/* How many of seqs[start..n) are resident, counting from start. */
size_t host_prefix(const host_tier *h, const uint64_t *seqs, size_t n, size_t start);
/* Write a request's full prompt blocks through (see pool.c); events into log. 0: out of memory. */
int host_write_through(host_tier *h, const host_block *blocks, size_t n, event_log *log);

/* ------------------------------------------------------------------ events */

void events_clear(event_log *log);
void events_free(event_log *log);

#endif
