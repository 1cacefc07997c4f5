/*
 * engine.c -- the request-level engine (see engine.h).
 *
 * A request runs the way a vLLM-style scheduler runs it, one engine step at
 * a time (spec/SPEC.md, "vLLM-style pool"):
 *
 *  1. Prefill (its first step). The prompt's full blocks are hashed
 *     (HASH-LOCAL, HASH-SEQUENCE). The prefix hit is the longest run of
 *     leading blocks cached on the device, continued on the host tier,
 *     capped at whole blocks of num_tokens - 1 tokens (VLLM-PREFIX-HIT), so
 *     a block-aligned prompt recomputes its last block. One allocation holds
 *     the block table: the device hits, every other full prompt block
 *     (computed, or loaded from the host: allocated and cached together,
 *     one Stored), then the partial tail. When host blocks are loaded, or
 *     the last block must be recomputed although it is cached, the blocks
 *     after the loaded (or hit) prefix are allocated in a second allocation:
 *     fresh ones up to the first block that is cached on the device, the rest
 *     as hashless blocks that are cached right after (each a new copy of a
 *     cached hash: STORE-COPY). Then every full prompt block is written
 *     through to the host tier.
 *  2. Decode (one step per generated token but the last): a token that
 *     starts a block takes a fresh hashless block; a block that fills up is
 *     cached (one Stored). Generated tokens are this port's own (hidden from
 *     the caller, like a real engine's), so decode block hashes cover them.
 *  3. Finish (the step after the last token): the request frees its block
 *     table in reverse order, leaf first (VLLM-FREE-ORDER).
 *
 * Scheduling: each step first admits waiting requests in arrival order while
 * the next one's peak block count fits beside what the running requests may
 * still take, so no request ever waits for blocks and none is preempted;
 * then every running request takes one step, in admission order. A request
 * whose prompt plus max_tokens - 1 tokens exceed the pool is refused at once.
 */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "xxh3.h"

#define MAX_TOKENS_LIMIT 4096
#define MAX_PROMPT 65536
#define MAX_CAPACITY 1000000
#define MAX_BLOCK_SIZE 4096

enum { WAITING, RUNNING, DONE };

typedef struct {
    char *id;
    uint32_t *prompt;
    size_t n, max_tokens, index;
    int state, rejected;
    size_t phase;    /* engine steps taken */
    size_t computed; /* tokens in the KV cache */
    size_t full;     /* full prompt blocks */
    uint64_t *seq, *local;
    size_t nblocks;  /* blocks at the request's peak */
    uint64_t *bseq;  /* the hash of each block once cached */
    int32_t *bphys;  /* the hashless block held for each block index */
    block_ref *table;
    size_t ntable;
    size_t cached_tokens;
    long long held; /* blocks it made active so far */
} request;

struct engine {
    pool pool;
    host_tier host;
    size_t block_size, capacity;
    request *reqs;
    size_t nreqs, capreqs;
    size_t *waiting, nwaiting, capwaiting, *running, nrunning, caprunning;
    size_t *finished, nfinished, capfinished; /* finished in the current call */
    int has_reset, reset;
};

/* -------------------------------------------------------------- messages */

static int field_error(char *err, size_t len, const char *path, const char *what) {
    snprintf(err, len, "%s: %s", path, what);
    return 0;
}

static int only_keys(const jv *obj, const char *const *allowed, const char *where, char *err, size_t len) {
    for (size_t i = 0; i < obj->len; i++) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++) ok |= strcmp(obj->keys[i], *a) == 0;
        if (!ok) {
            snprintf(err, len, "%s%s%s: unknown field (objects are closed)", where, *where ? "." : "", obj->keys[i]);
            return 0;
        }
    }
    return 1;
}

/* An optional integer field: absent or null -> dflt. */
static int get_uint(const jv *obj, const char *key, int required, uint64_t dflt, uint64_t lo, uint64_t hi,
                    const char *where, uint64_t *out, char *err, size_t len) {
    char path[96];
    snprintf(path, sizeof path, "%s%s%s", where, *where ? "." : "", key);
    const jv *v = json_get(obj, key);
    if (v == NULL || v->kind == JV_NULL) {
        if (required) return field_error(err, len, path, "field required");
        *out = dflt;
        return 1;
    }
    if (v->kind != JV_NUM || !v->is_uint) return field_error(err, len, path, "expected a non-negative integer");
    if (v->uint < lo || v->uint > hi) {
        snprintf(err, len, "%s: %llu is outside %llu..%llu", path, (unsigned long long)v->uint,
                 (unsigned long long)lo, (unsigned long long)hi);
        return 0;
    }
    *out = v->uint;
    return 1;
}

static const char *get_str(const jv *obj, const char *key, const char *dflt) {
    const jv *v = json_get(obj, key);
    if (v == NULL || v->kind == JV_NULL) return dflt;
    return v->kind == JV_STR ? v->str : NULL;
}

/* ----------------------------------------------------------------- open */

engine *engine_open(const char *config_json, const char *engine_json, char *err, size_t len) {
    static const char *const config_keys[] = {"profile", "capacity", "block_size", "dp_rank", "eviction", "offload", NULL};
    static const char *const engine_keys[] = {"host_blocks", NULL};
    char perr[256];
    json_doc *cfg = json_parse(config_json ? config_json : "", perr, sizeof perr);
    json_doc *eng = json_parse(engine_json ? engine_json : "", perr, sizeof perr);
    engine *e = NULL;
    uint64_t capacity, block_size, dp_rank, host_blocks;
    if (cfg == NULL || eng == NULL) {
        snprintf(err, len, "%s: %s", cfg == NULL ? "config" : "engine", perr);
        goto out;
    }
    const jv *c = json_root(cfg), *g = json_root(eng);
    if (c->kind != JV_OBJ || g->kind != JV_OBJ) {
        snprintf(err, len, "%s: expected a JSON object", c->kind != JV_OBJ ? "config" : "engine");
        goto out;
    }
    if (!only_keys(c, config_keys, "config", err, len) || !only_keys(g, engine_keys, "engine", err, len)) goto out;
    const char *profile = get_str(c, "profile", "kvbm"), *eviction = get_str(c, "eviction", "lineage");
    if (profile == NULL || eviction == NULL) {
        snprintf(err, len, "config.%s: expected a string", profile == NULL ? "profile" : "eviction");
        goto out;
    }
    if (strcmp(profile, "vllm") != 0) {
        snprintf(err, len, "config.profile: the vllm_c_port runs the vllm profile only, not '%s'", profile);
        goto out;
    }
    if (strcmp(eviction, "lru") != 0) {
        snprintf(err, len, "config.eviction: the vllm profile evicts from its free queue (eviction 'lru'), not '%s'",
                 eviction);
        goto out;
    }
    const jv *off = json_get(c, "offload");
    if (off != NULL && off->kind != JV_NULL) {
        snprintf(err, len, "config.offload: the vllm profile has no offload tier (the host tier is engine.host_blocks)");
        goto out;
    }
    if (!get_uint(c, "capacity", 1, 0, 1, MAX_CAPACITY, "config", &capacity, err, len) ||
        !get_uint(c, "block_size", 0, 16, 1, MAX_BLOCK_SIZE, "config", &block_size, err, len) ||
        !get_uint(c, "dp_rank", 0, 0, 0, UINT64_MAX, "config", &dp_rank, err, len) ||
        !get_uint(g, "host_blocks", 0, 0, 1, MAX_CAPACITY, "engine", &host_blocks, err, len))
        goto out;
    e = calloc(1, sizeof *e);
    if (e == NULL || !pool_init(&e->pool, capacity, dp_rank) || !host_init(&e->host, host_blocks)) {
        snprintf(err, len, "out of memory");
        if (e) {
            pool_free(&e->pool);
            free(e);
        }
        e = NULL;
        goto out;
    }
    e->block_size = block_size;
    e->capacity = capacity;
out:
    json_free(cfg);
    json_free(eng);
    return e;
}

static void request_free(request *r) {
    free(r->id);
    free(r->prompt);
    free(r->seq);
    free(r->local);
    free(r->bseq);
    free(r->bphys);
    free(r->table);
}

void engine_close(engine *e) {
    if (e == NULL) return;
    for (size_t i = 0; i < e->nreqs; i++) request_free(&e->reqs[i]);
    free(e->reqs);
    free(e->waiting);
    free(e->running);
    free(e->finished);
    pool_free(&e->pool);
    host_free(&e->host);
    free(e);
}

/* ------------------------------------------------------------ requests */

/* Hidden decode tokens: this port's own, reproducible per (request, position). */
static uint32_t hidden_token(size_t request, size_t position) {
    uint64_t z = 0x6b7673706563ull ^ ((uint64_t)request * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)position << 20);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}

static size_t budget_blocks(const engine *e, const request *r) {
    return (r->n + r->max_tokens - 1 + e->block_size - 1) / e->block_size;
}

static void table_add_full(request *r, uint64_t seq) {
    r->table[r->ntable].is_full = 1;
    r->table[r->ntable].seq = seq;
    r->ntable++;
}

static void table_add_block(request *r, int32_t block) {
    r->table[r->ntable].is_full = 0;
    r->table[r->ntable].block = block;
    r->ntable++;
}

/* 1 ok, 0 blocked (the budget said it fits: an internal error), -1 out of memory */
static int prefill(engine *e, request *r, char *err, size_t len) {
    pool *p = &e->pool;
    size_t bs = e->block_size, n = r->n, full = r->full, cap = (n - 1) / bs, hits;
    size_t on_device = pool_prefix_hits(p, r->seq, full), first, cached;
    int split = 1;
    if (on_device > cap) { /* the capped last block is cached: recompute it into a fresh copy */
        cached = cap;
        first = full - 1;
    } else {
        size_t on_host = host_prefix(&e->host, r->seq, full, on_device);
        cached = on_device + on_host < cap ? on_device + on_host : cap;
        size_t reach = (n - 1 + bs - 1) / bs; /* blocks holding the tokens before the last one */
        size_t onboard = reach > on_device ? (on_host < reach - on_device ? on_host : reach - on_device) : 0;
        if (onboard) {
            first = on_device + onboard;
        } else {
            first = full;
            split = 0;
        }
    }
    int tail = n % bs != 0 && !split;
    int32_t tail_block = -1;
    int rc = pool_allocate(p, r->seq, r->local, first, tail, 0, 0, &tail_block, &hits);
    if (rc <= 0) goto fail;
    for (size_t i = 0; i < first; i++) table_add_full(r, r->seq[i]);
    if (tail) {
        table_add_block(r, tail_block);
        r->bphys[full] = tail_block;
    }
    if (split) { /* blocks after the loaded (or hit) prefix */
        size_t cut = first;
        while (cut < full && !pool_cached(p, r->seq[cut])) cut++;
        size_t ncopies = full - cut, npart = ncopies + (n % bs ? 1 : 0);
        int32_t parts[MAX_BLOCK_SIZE + 1];
        int32_t *part = npart <= MAX_BLOCK_SIZE ? parts : malloc(npart * sizeof *part);
        if (part == NULL) return -1;
        if (cut > first || npart) {
            rc = pool_allocate(p, r->seq + first, r->local + first, cut - first, npart, first > 0,
                               first > 0 ? r->seq[first - 1] : 0, part, &hits);
            if (rc <= 0) {
                if (part != parts) free(part);
                goto fail;
            }
        }
        for (size_t i = first; i < cut; i++) table_add_full(r, r->seq[i]);
        for (size_t k = 0; k < npart; k++) {
            table_add_block(r, part[k]);
            r->bphys[cut + k] = part[k];
        }
        for (size_t i = cut; i < full; i++) {
            if (!pool_promote(p, part[i - cut], r->seq[i], r->local[i], i > 0, i > 0 ? r->seq[i - 1] : 0)) {
                rc = -1;
                break;
            }
        }
        if (part != parts) free(part);
        if (rc < 0) return -1;
    }
    host_block *hb = malloc((full ? full : 1) * sizeof *hb);
    if (hb == NULL) return -1;
    for (size_t i = 0; i < full; i++) {
        hb[i].seq = r->seq[i];
        hb[i].local = r->local[i];
        hb[i].position = i;
    }
    int ok = host_write_through(&e->host, hb, full, &p->events);
    free(hb);
    if (!ok) return -1;
    for (size_t i = 0; i < full; i++) r->bseq[i] = r->seq[i];
    r->cached_tokens = cached * bs;
    r->computed = n;
    return 1;
fail:
    if (rc == 0) snprintf(err, len, "request %s blocked in its prefill although its blocks were reserved", r->id);
    return rc;
}

static int decode(engine *e, request *r, char *err, size_t len) {
    pool *p = &e->pool;
    size_t bs = e->block_size, hits;
    if (r->computed % bs == 0) { /* this token starts a new block */
        int32_t b;
        int rc = pool_allocate(p, NULL, NULL, 0, 1, 0, 0, &b, &hits);
        if (rc <= 0) {
            if (rc == 0) snprintf(err, len, "request %s blocked in decode although its blocks were reserved", r->id);
            return rc;
        }
        table_add_block(r, b);
        r->bphys[r->computed / bs] = b;
    }
    r->computed++;
    if (r->computed % bs == 0) { /* a block filled up: cache it */
        size_t k = r->computed / bs - 1, start = k * bs;
        uint32_t tokens[MAX_BLOCK_SIZE];
        for (size_t i = 0; i < bs; i++)
            tokens[i] = start + i < r->n ? r->prompt[start + i] : hidden_token(r->index, start + i);
        uint64_t local = kv_local_hash(tokens, bs);
        uint64_t seq = kv_sequence_hash(k > 0, k > 0 ? r->bseq[k - 1] : 0, local);
        r->bseq[k] = seq;
        if (!pool_promote(p, r->bphys[k], seq, local, k > 0, k > 0 ? r->bseq[k - 1] : 0)) return -1;
    }
    return 1;
}

static void finish(engine *e, request *r) {
    for (size_t i = 0; i < r->ntable / 2; i++) { /* free in reverse order, leaf first */
        block_ref t = r->table[i];
        r->table[i] = r->table[r->ntable - 1 - i];
        r->table[r->ntable - 1 - i] = t;
    }
    pool_release(&e->pool, r->table, r->ntable);
    r->ntable = 0;
    r->state = DONE;
    e->finished[e->nfinished++] = r->index;
}

static long long budget_left(const engine *e) {
    counters c = pool_counters(&e->pool);
    long long left = (long long)(c.free_blocks + c.inactive_blocks);
    for (size_t i = 0; i < e->nrunning; i++) {
        const request *r = &e->reqs[e->running[i]];
        left -= (long long)budget_blocks(e, r) - r->held;
    }
    return left;
}

static int step(engine *e, char *err, size_t len) {
    while (e->nwaiting && (long long)budget_blocks(e, &e->reqs[e->waiting[0]]) <= budget_left(e)) {
        size_t i = e->waiting[0];
        memmove(e->waiting, e->waiting + 1, (e->nwaiting - 1) * sizeof *e->waiting);
        e->nwaiting--;
        e->reqs[i].state = RUNNING;
        e->reqs[i].held = 0;
        e->running[e->nrunning++] = i;
    }
    if (e->nwaiting && !e->nrunning) {
        snprintf(err, len, "request %s can never be admitted", e->reqs[e->waiting[0]].id);
        return 0;
    }
    size_t keep = 0, nrun = e->nrunning;
    for (size_t k = 0; k < nrun; k++) {
        request *r = &e->reqs[e->running[k]];
        if (r->phase == r->max_tokens) {
            finish(e, r);
            continue;
        }
        uint64_t before = pool_counters(&e->pool).active_blocks;
        int rc = r->phase == 0 ? prefill(e, r, err, len) : decode(e, r, err, len);
        if (rc <= 0) {
            if (rc < 0) snprintf(err, len, "out of memory");
            return 0;
        }
        r->phase++;
        r->held += (long long)pool_counters(&e->pool).active_blocks - (long long)before;
        e->running[keep++] = e->running[k];
    }
    e->nrunning = keep;
    return 1;
}

/* ------------------------------------------------------------ add_request */

static int grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * size);
    if (q == NULL) return 0;
    *p = q;
    *cap = c;
    return 1;
}

/* -1: invalid request (err), 0: out of memory, 1: added */
static int add_request(engine *e, const jv *op, char *err, size_t len) {
    static const char *const keys[] = {"op", "request_id", "prompt", "max_tokens", NULL};
    if (!only_keys(op, keys, "", err, len)) return -1;
    const jv *id = json_get(op, "request_id"), *prompt = json_get(op, "prompt");
    uint64_t max_tokens;
    const char *bad = NULL, *why = NULL;
    if (id == NULL) bad = "request_id", why = "field required";
    else if (id->kind != JV_STR || id->chars < 1 || id->chars > 64)
        bad = "request_id", why = "expected a string of 1 to 64 characters";
    else if (prompt == NULL) bad = "prompt", why = "field required";
    else if (prompt->kind != JV_ARR || prompt->len < 1 || prompt->len > MAX_PROMPT)
        bad = "prompt", why = "expected an array of 1 to 65536 token ids";
    if (bad != NULL) {
        field_error(err, len, bad, why);
        return -1;
    }
    for (size_t i = 0; i < prompt->len; i++) {
        const jv *t = &prompt->items[i];
        if (t->kind != JV_NUM || !t->is_uint || t->uint > 0xFFFFFFFFull) {
            snprintf(err, len, "prompt.%zu: expected a token id (an integer 0..4294967295)", i);
            return -1;
        }
    }
    if (!get_uint(op, "max_tokens", 1, 0, 1, MAX_TOKENS_LIMIT, "", &max_tokens, err, len)) return -1;
    for (size_t i = 0; i < e->nreqs; i++) {
        if (strcmp(e->reqs[i].id, id->str) == 0) {
            snprintf(err, len, "request_id: '%s' is already in use in this session", id->str);
            return -1;
        }
    }
#if defined(KVSPEC_TEST_HOOKS)
    if (strcmp(id->str, "__crash__") == 0) abort();
    if (strcmp(id->str, "__hang__") == 0) {
        volatile int spin = 1;
        while (spin) {
        }
    }
    if (strcmp(id->str, "__print__") == 0) {
        printf("engine: hello from the library\n");
        fflush(stdout);
    }
#endif
    if (!grow((void **)&e->reqs, &e->capreqs, e->nreqs + 1, sizeof *e->reqs)) return 0;
    request *r = &e->reqs[e->nreqs];
    memset(r, 0, sizeof *r);
    r->index = e->nreqs;
    r->n = prompt->len;
    r->max_tokens = max_tokens;
    r->id = malloc(id->len + 1);
    r->prompt = malloc(r->n * sizeof *r->prompt);
    size_t bs = e->block_size;
    r->full = r->n / bs;
    r->nblocks = budget_blocks(e, r) + 1;
    r->seq = calloc(r->full + 1, sizeof *r->seq);
    r->local = calloc(r->full + 1, sizeof *r->local);
    r->bseq = calloc(r->nblocks, sizeof *r->bseq);
    r->bphys = calloc(r->nblocks, sizeof *r->bphys);
    r->table = calloc(r->nblocks + r->full, sizeof *r->table);
    size_t nq = e->nreqs + 1; /* each queue holds at most every request */
    if (!r->id || !r->prompt || !r->seq || !r->local || !r->bseq || !r->bphys || !r->table ||
        !grow((void **)&e->waiting, &e->capwaiting, nq, sizeof *e->waiting) ||
        !grow((void **)&e->running, &e->caprunning, nq, sizeof *e->running) ||
        !grow((void **)&e->finished, &e->capfinished, nq, sizeof *e->finished)) {
        request_free(r);
        return 0;
    }
    memcpy(r->id, id->str, id->len + 1);
    for (size_t i = 0; i < r->n; i++) r->prompt[i] = (uint32_t)prompt->items[i].uint;
    uint64_t parent = 0;
    for (size_t b = 0; b < r->full; b++) { /* HASH-LOCAL, HASH-SEQUENCE */
        r->local[b] = kv_local_hash(r->prompt + b * bs, bs);
        parent = r->seq[b] = kv_sequence_hash(b > 0, parent, r->local[b]);
    }
    e->nreqs++;
    if (r->n + max_tokens - 1 > e->capacity * bs) { /* can never fit the pool */
        r->rejected = 1;
        r->state = DONE;
        e->finished[e->nfinished++] = r->index;
    } else {
        r->state = WAITING;
        e->waiting[e->nwaiting++] = r->index;
    }
    return 1;
}

/* ----------------------------------------------------------------- reply */

static void write_event(jbuf *b, const kv_event *ev, uint64_t dp_rank) {
    jb_raw(b, "{\"event_id\":");
    jb_u64(b, ev->id);
    jb_raw(b, ",\"data\":");
    if (ev->kind == EV_CLEARED) {
        jb_raw(b, "\"cleared\"");
    } else if (ev->kind == EV_REMOVED) {
        jb_raw(b, "{\"removed\":{\"block_hashes\":[");
        for (size_t i = 0; i < ev->n; i++) {
            if (i) jb_raw(b, ",");
            jb_u64(b, ev->hashes[i]);
        }
        jb_raw(b, "]}}");
    } else {
        jb_raw(b, "{\"stored\":{\"parent_hash\":");
        if (ev->has_parent) jb_u64(b, ev->parent);
        else jb_raw(b, "null");
        jb_raw(b, ",\"blocks\":[");
        for (size_t i = 0; i < ev->n; i++) {
            jb_raw(b, i ? ",{\"block_hash\":" : "{\"block_hash\":");
            jb_u64(b, ev->blocks[i].block_hash);
            jb_raw(b, ",\"tokens_hash\":");
            jb_u64(b, ev->blocks[i].tokens_hash);
            jb_raw(b, "}");
        }
        jb_raw(b, "],\"start_position\":");
        if (ev->has_start) jb_u64(b, ev->start_position);
        else jb_raw(b, "null");
        jb_raw(b, "}}");
    }
    jb_raw(b, ",\"dp_rank\":");
    jb_u64(b, dp_rank);
    jb_raw(b, ev->tier == TIER_HOST ? ",\"storage_tier\":\"host_pinned\"}" : ",\"storage_tier\":\"device\"}");
}

static void write_outcome(engine *e, jbuf *b) {
    jb_raw(b, "{\"finished\":[");
    for (size_t i = 0; i < e->nfinished; i++) {
        const request *r = &e->reqs[e->finished[i]];
        jb_raw(b, i ? ",{\"request_id\":" : "{\"request_id\":");
        jb_str(b, r->id);
        if (r->rejected) {
            jb_raw(b, ",\"finish_reason\":\"rejected\",\"cached_tokens\":null,\"output_tokens\":0}");
            continue;
        }
        jb_raw(b, ",\"finish_reason\":\"length\",\"cached_tokens\":");
        jb_u64(b, r->cached_tokens);
        jb_raw(b, ",\"output_tokens\":");
        jb_u64(b, r->max_tokens);
        jb_raw(b, "}");
    }
    jb_raw(b, "],\"running\":");
    jb_u64(b, e->nrunning);
    jb_raw(b, ",\"waiting\":");
    jb_u64(b, e->nwaiting);
    if (e->has_reset) jb_raw(b, e->reset ? ",\"reset\":true" : ",\"reset\":false");
    counters c = pool_counters(&e->pool);
    jb_raw(b, ",\"counters\":{\"active_blocks\":");
    jb_u64(b, c.active_blocks);
    jb_raw(b, ",\"active_refs\":");
    jb_u64(b, c.active_refs);
    jb_raw(b, ",\"inactive_blocks\":");
    jb_u64(b, c.inactive_blocks);
    jb_raw(b, ",\"free_blocks\":");
    jb_u64(b, c.free_blocks);
    jb_raw(b, ",\"quarantined_blocks\":0},\"events\":[");
    for (size_t i = 0; i < e->pool.events.n; i++) {
        if (i) jb_raw(b, ",");
        write_event(b, &e->pool.events.items[i], e->pool.events.dp_rank);
    }
    jb_raw(b, "]}");
}

/* ------------------------------------------------------------------ call */

int engine_call(engine *e, const char *request_json, jbuf *reply, char *err, size_t len) {
    static const char *const bare[] = {"op", NULL};
    char perr[256];
    json_doc *doc = json_parse(request_json, perr, sizeof perr);
    if (doc == NULL) {
        snprintf(err, len, "%s", perr);
        return -1;
    }
    const jv *op = json_root(doc);
    const char *kind = op->kind == JV_OBJ ? get_str(op, "op", NULL) : NULL;
    int rc = 1;
    e->nfinished = 0;
    e->has_reset = 0;
    events_clear(&e->pool.events);
    if (op->kind != JV_OBJ) {
        snprintf(err, len, "request: expected a JSON object (one request-level operation)");
        rc = -1;
    } else if (kind == NULL) {
        snprintf(err, len, "op: field required (a string: add_request, step or reset_prefix_cache)");
        rc = -1;
    } else if (strcmp(kind, "add_request") == 0) {
        rc = add_request(e, op, err, len);
    } else if (strcmp(kind, "step") == 0 || strcmp(kind, "reset_prefix_cache") == 0) {
        if (!only_keys(op, bare, "", err, len)) {
            rc = -1;
        } else if (kind[0] == 's') {
            rc = step(e, err, len) ? 1 : -4;
        } else {
            int r = pool_reset(&e->pool);
            e->has_reset = 1;
            e->reset = r == 1;
            rc = r < 0 ? 0 : 1;
        }
    } else {
        snprintf(err, len, "op: '%s' is not a request-level operation of this engine "
                 "(add_request, step, reset_prefix_cache)", kind);
        rc = -1;
    }
    json_free(doc);
    if (rc == 0 || e->pool.events.oom) {
        snprintf(err, len, "out of memory");
        return -4;
    }
    if (rc < 0) return rc;
    jb_reset(reply);
#if defined(KVSPEC_TEST_HOOKS)
    if (e->nreqs && strcmp(e->reqs[e->nreqs - 1].id, "__bad_reply__") == 0 && strcmp(kind, "add_request") == 0) {
        jb_raw(reply, "{\"finished\":[],\"running\":-1,\"waiting\":0,\"counters\":{}}");
        return 0;
    }
    if (e->nreqs && strcmp(e->reqs[e->nreqs - 1].id, "__huge__") == 0 && strcmp(kind, "add_request") == 0) {
        jb_raw(reply, "{\"finished\":[],\"running\":0,\"waiting\":1,\"counters\":{\"active_blocks\":0,"
                      "\"active_refs\":0,\"inactive_blocks\":0,\"free_blocks\":0},\"events\":[");
        for (int i = 0; i < 200000; i++) jb_raw(reply, i ? ",{\"event_id\":0,\"data\":\"cleared\"}" : "{\"event_id\":0,\"data\":\"cleared\"}");
        jb_raw(reply, "]}");
        return reply->oom ? -4 : 0;
    }
#endif
    write_outcome(e, reply);
    return reply->oom ? -4 : 0;
}
