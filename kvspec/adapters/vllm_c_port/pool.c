/* pool.c -- the vLLM-style block pool and the write-through host tier (see pool.h). */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ events */

static kv_event *ev_new(event_log *log, ev_kind kind, ev_tier tier, size_t n) {
    if (log->oom) return NULL;
    if (log->n == log->cap) {
        size_t cap = log->cap ? 2 * log->cap : 16;
        kv_event *items = realloc(log->items, cap * sizeof *items);
        if (items == NULL) {
            log->oom = 1;
            return NULL;
        }
        log->items = items;
        log->cap = cap;
    }
    kv_event *e = &log->items[log->n];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->tier = tier;
    e->n = n;
    if (kind == EV_STORED) e->blocks = calloc(n ? n : 1, sizeof *e->blocks);
    if (kind == EV_REMOVED) e->hashes = calloc(n ? n : 1, sizeof *e->hashes);
    if ((kind == EV_STORED && e->blocks == NULL) || (kind == EV_REMOVED && e->hashes == NULL)) {
        log->oom = 1;
        return NULL;
    }
    e->id = log->next_id++;
    log->n++;
    return e;
}

void events_clear(event_log *log) {
    for (size_t i = 0; i < log->n; i++) {
        free(log->items[i].blocks);
        free(log->items[i].hashes);
    }
    log->n = 0;
}

void events_free(event_log *log) {
    events_clear(log);
    free(log->items);
    log->items = NULL;
    log->cap = 0;
}

/* ------------------------------------------------------- u64 -> int32 map */

static size_t slot_of(const u64map *m, uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ (h >> 29)) & (m->cap - 1);
}

int map_init(u64map *m, size_t expected) {
    size_t cap = 16;
    while (cap < 2 * expected) cap *= 2;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = calloc(cap, sizeof *m->vals);
    m->used = calloc(cap, 1);
    m->cap = cap;
    m->n = 0;
    if (!m->keys || !m->vals || !m->used) {
        map_free(m);
        return 0;
    }
    return 1;
}

void map_free(u64map *m) {
    free(m->keys);
    free(m->vals);
    free(m->used);
    m->keys = NULL;
    m->vals = NULL;
    m->used = NULL;
    m->cap = m->n = 0;
}

int32_t map_get(const u64map *m, uint64_t key) {
    for (size_t i = slot_of(m, key);; i = (i + 1) & (m->cap - 1)) {
        if (!m->used[i]) return -1;
        if (m->keys[i] == key) return m->vals[i];
    }
}

int map_reserve(u64map *m, size_t extra) {
    if (2 * (m->n + extra) <= m->cap) return 1;
    u64map bigger;
    if (!map_init(&bigger, m->n + extra)) return 0;
    for (size_t i = 0; i < m->cap; i++)
        if (m->used[i]) map_put(&bigger, m->keys[i], m->vals[i]);
    map_free(m);
    *m = bigger;
    return 1;
}

int map_put(u64map *m, uint64_t key, int32_t val) {
    size_t i = slot_of(m, key);
    while (m->used[i] && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    if (!m->used[i]) { /* a new key: make room first (growing moves the slots) */
        if (2 * (m->n + 1) > m->cap) {
            if (!map_reserve(m, 1)) return 0;
            i = slot_of(m, key);
            while (m->used[i]) i = (i + 1) & (m->cap - 1);
        }
        m->n++;
    }
    m->used[i] = 1;
    m->keys[i] = key;
    m->vals[i] = val;
    return 1;
}

void map_clear(u64map *m) {
    memset(m->used, 0, m->cap);
    m->n = 0;
}

void map_del(u64map *m, uint64_t key) {
    size_t i = slot_of(m, key);
    while (m->used[i] && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    if (!m->used[i]) return;
    m->used[i] = 0;
    m->n--;
    /* backward-shift deletion keeps every probe sequence unbroken */
    for (size_t j = (i + 1) & (m->cap - 1); m->used[j]; j = (j + 1) & (m->cap - 1)) {
        size_t home = slot_of(m, m->keys[j]);
        int between = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (between) continue;
        m->keys[i] = m->keys[j];
        m->vals[i] = m->vals[j];
        m->used[i] = 1;
        m->used[j] = 0;
        i = j;
    }
}

/* -------------------------------------------------------------------- pool */

int pool_init(pool *p, size_t capacity, uint64_t dp_rank) {
    memset(p, 0, sizeof *p);
    p->capacity = capacity;
    p->blocks = calloc(capacity, sizeof *p->blocks);
    p->free_stack = calloc(capacity, sizeof *p->free_stack);
    if (!p->blocks || !p->free_stack || !map_init(&p->by_hash, 64)) {
        pool_free(p);
        return 0;
    }
    for (size_t i = 0; i < capacity; i++) {
        p->blocks[i].prev = p->blocks[i].next = p->blocks[i].copy_next = -1;
        p->free_stack[i] = (int32_t)(capacity - 1 - i);
    }
    p->nfree = capacity;
    p->lru_head = p->lru_tail = -1;
    p->events.dp_rank = dp_rank;
    return 1;
}

void pool_free(pool *p) {
    free(p->blocks);
    free(p->free_stack);
    map_free(&p->by_hash);
    events_free(&p->events);
    p->blocks = NULL;
    p->free_stack = NULL;
}

counters pool_counters(const pool *p) {
    counters c;
    c.free_blocks = p->nfree;
    c.inactive_blocks = p->nlru;
    c.active_blocks = p->capacity - p->nfree - p->nlru;
    c.active_refs = p->refs;
    return c;
}

int pool_cached(const pool *p, uint64_t seq) { return map_get(&p->by_hash, seq) >= 0; }

size_t pool_prefix_hits(const pool *p, const uint64_t *seqs, size_t n) {
    size_t k = 0;
    while (k < n && pool_cached(p, seqs[k])) k++;
    return k;
}

static void lru_remove(pool *p, int32_t b) {
    pblock *x = &p->blocks[b];
    if (!x->in_lru) return;
    if (x->prev >= 0) p->blocks[x->prev].next = x->next;
    else p->lru_head = x->next;
    if (x->next >= 0) p->blocks[x->next].prev = x->prev;
    else p->lru_tail = x->prev;
    x->prev = x->next = -1;
    x->in_lru = 0;
    p->nlru--;
}

static void lru_push(pool *p, int32_t b) { /* newest at the tail */
    pblock *x = &p->blocks[b];
    x->prev = p->lru_tail;
    x->next = -1;
    if (p->lru_tail >= 0) p->blocks[p->lru_tail].next = b;
    else p->lru_head = b;
    p->lru_tail = b;
    x->in_lru = 1;
    p->nlru++;
}

/* Append block b to the copies of seq (caching order). 0: out of memory. */
static int copies_append(pool *p, int32_t b, uint64_t seq) {
    int32_t head = map_get(&p->by_hash, seq);
    p->blocks[b].copy_next = -1;
    if (head < 0) return map_put(&p->by_hash, seq, b);
    while (p->blocks[head].copy_next >= 0) head = p->blocks[head].copy_next;
    p->blocks[head].copy_next = b;
    return 1;
}

static void copies_remove(pool *p, int32_t b, uint64_t seq) {
    int32_t head = map_get(&p->by_hash, seq);
    if (head == b) {
        if (p->blocks[b].copy_next >= 0) map_put(&p->by_hash, seq, p->blocks[b].copy_next); /* key exists: no growth */
        else map_del(&p->by_hash, seq);
    } else {
        while (head >= 0 && p->blocks[head].copy_next != b) head = p->blocks[head].copy_next;
        if (head >= 0) p->blocks[head].copy_next = p->blocks[b].copy_next;
    }
    p->blocks[b].copy_next = -1;
}

/* Take a block: a free one, else evict the LRU head (its hash into *victim). */
static int32_t take_block(pool *p, int *evicted, uint64_t *victim) {
    *evicted = 0;
    if (p->nfree) return p->free_stack[--p->nfree];
    int32_t b = p->lru_head;
    lru_remove(p, b);
    copies_remove(p, b, p->blocks[b].seq);
    *evicted = 1;
    *victim = p->blocks[b].seq;
    p->blocks[b].has_seq = 0;
    return b;
}

int pool_allocate(pool *p, const uint64_t *seqs, const uint64_t *locals, size_t nfull, size_t npartial,
                  int has_parent, uint64_t parent, int32_t *partial_out, size_t *hits_out) {
    size_t hits = pool_prefix_hits(p, seqs, nfull);
    size_t fresh = nfull - hits + npartial;
    size_t pinned = 0;
    for (size_t i = 0; i < hits; i++) {
        int32_t b = map_get(&p->by_hash, seqs[i]);
        int repeat = 0;
        for (size_t j = 0; j < i; j++) repeat |= map_get(&p->by_hash, seqs[j]) == b;
        if (p->blocks[b].in_lru && !repeat) pinned++;
    }
    if (fresh > p->nfree + p->nlru - pinned) return 0; /* USE-CAPACITY: nothing changes */
    /* reserve everything that can fail before the first change */
    uint64_t *victims = calloc(fresh ? fresh : 1, sizeof *victims);
    if (victims == NULL) return -1;
    if (!map_reserve(&p->by_hash, nfull - hits)) { /* grow the index now, not halfway through */
        free(victims);
        return -1;
    }
    for (size_t i = 0; i < hits; i++) { /* pin the prefix before any eviction (VLLM-PREFIX-HIT) */
        int32_t b = map_get(&p->by_hash, seqs[i]);
        lru_remove(p, b);
        p->blocks[b].owners++;
        p->refs++;
    }
    size_t nvictims = 0;
    for (size_t i = hits; i < nfull; i++) {
        int ev;
        uint64_t v;
        int32_t b = take_block(p, &ev, &v);
        if (ev) victims[nvictims++] = v;
        p->blocks[b].has_seq = 1;
        p->blocks[b].seq = seqs[i];
        p->blocks[b].owners = 1;
        p->refs++;
        copies_append(p, b, seqs[i]);
    }
    for (size_t k = 0; k < npartial; k++) {
        int ev;
        uint64_t v;
        int32_t b = take_block(p, &ev, &v);
        if (ev) victims[nvictims++] = v;
        p->blocks[b].held = 1;
        p->blocks[b].owners = 0;
        p->refs++;
        partial_out[k] = b;
    }
    if (nvictims) {
        kv_event *e = ev_new(&p->events, EV_REMOVED, TIER_DEVICE, nvictims);
        if (e) memcpy(e->hashes, victims, nvictims * sizeof *victims);
    }
    free(victims);
    if (nfull > hits) {
        kv_event *e = ev_new(&p->events, EV_STORED, TIER_DEVICE, nfull - hits);
        if (e) {
            for (size_t i = hits; i < nfull; i++) {
                e->blocks[i - hits].block_hash = seqs[i];
                e->blocks[i - hits].tokens_hash = locals ? locals[i] : 0;
            }
            e->has_parent = hits ? 1 : has_parent;
            e->parent = hits ? seqs[hits - 1] : parent;
        }
    }
    *hits_out = hits;
    return p->events.oom ? -1 : 1;
}

int pool_promote(pool *p, int32_t block, uint64_t seq, uint64_t local, int has_parent, uint64_t parent) {
    if (!map_reserve(&p->by_hash, 1)) return 0;
    pblock *x = &p->blocks[block];
    x->held = 0;
    x->has_seq = 1;
    x->seq = seq;
    x->owners = 1; /* the request's reference moves from the hashless block to the copy */
    if (!copies_append(p, block, seq)) return 0;
    kv_event *e = ev_new(&p->events, EV_STORED, TIER_DEVICE, 1);
    if (e == NULL) return 0;
    e->blocks[0].block_hash = seq;
    e->blocks[0].tokens_hash = local;
    e->has_parent = has_parent;
    e->parent = parent;
    return 1;
}

static void release_copy(pool *p, int32_t b) {
    p->blocks[b].owners--;
    p->refs--;
    if (p->blocks[b].owners == 0) lru_push(p, b); /* newest at the tail (VLLM-FREE-ORDER) */
}

void pool_release(pool *p, const block_ref *refs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (refs[i].is_full) {
            int32_t b = map_get(&p->by_hash, refs[i].seq);
            while (b >= 0 && p->blocks[b].owners == 0) b = p->blocks[b].copy_next;
            if (b >= 0) release_copy(p, b);
        } else if (p->blocks[refs[i].block].held) { /* hashless: straight back to free */
            p->blocks[refs[i].block].held = 0;
            p->refs--;
            p->free_stack[p->nfree++] = refs[i].block;
        } else {
            release_copy(p, refs[i].block);
        }
    }
}

int pool_reset(pool *p) {
    counters c = pool_counters(p);
    if (c.active_blocks) return 0;
    if (ev_new(&p->events, EV_CLEARED, TIER_DEVICE, 0) == NULL) return -1;
    while (p->lru_head >= 0) {
        int32_t b = p->lru_head;
        lru_remove(p, b);
        p->blocks[b].has_seq = 0;
        p->blocks[b].copy_next = -1;
        p->free_stack[p->nfree++] = b;
    }
    map_clear(&p->by_hash);
    return 1;
}

/* --------------------------------------------------------------- host tier */

int host_init(host_tier *h, size_t capacity) {
    memset(h, 0, sizeof *h);
    h->capacity = capacity;
    if (capacity == 0) return 1;
    h->seq = calloc(capacity, sizeof *h->seq);
    h->clock = calloc(capacity, sizeof *h->clock);
    h->position = calloc(capacity, sizeof *h->position);
    if (!h->seq || !h->clock || !h->position || !map_init(&h->index, capacity)) {
        host_free(h);
        return 0;
    }
    return 1;
}

void host_free(host_tier *h) {
    free(h->seq);
    free(h->clock);
    free(h->position);
    map_free(&h->index);
    h->seq = h->clock = h->position = NULL;
}

size_t host_prefix(const host_tier *h, const uint64_t *seqs, size_t n, size_t start) {
    size_t k = 0;
    if (h->capacity == 0) return 0;
    while (start + k < n && map_get(&h->index, seqs[start + k]) >= 0) k++;
    return k;
}

static void host_remove(host_tier *h, uint64_t seq) {
    int32_t i = map_get(&h->index, seq);
    if (i < 0) return;
    map_del(&h->index, seq);
    size_t last = h->n - 1;
    if ((size_t)i != last) { /* keep the entries dense */
        h->seq[i] = h->seq[last];
        h->clock[i] = h->clock[last];
        h->position[i] = h->position[last];
        map_put(&h->index, h->seq[i], i);
    }
    h->n--;
}

static void host_set(host_tier *h, uint64_t seq, uint64_t clock, uint64_t position) {
    int32_t i = map_get(&h->index, seq);
    if (i < 0) {
        i = (int32_t)h->n++;
        h->seq[i] = seq;
        map_put(&h->index, seq, i);
    }
    h->clock[i] = clock;
    h->position[i] = position;
}

/* Victim order: the least recent first; inside one batch (one clock value) the
 * deepest block first, leaves before parents (G2-EVICT); then the lower hash. */
static const host_tier *sort_tier;
static int victim_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const host_tier *h = sort_tier;
    if (h->clock[x] != h->clock[y]) return h->clock[x] < h->clock[y] ? -1 : 1;
    if (h->position[x] != h->position[y]) return h->position[x] > h->position[y] ? -1 : 1;
    if (h->seq[x] != h->seq[y]) return h->seq[x] < h->seq[y] ? -1 : 1;
    return 0;
}

/*
 * After a request's prefill every full prompt block is written through:
 * blocks already on the host are refreshed, deepest first, so the earliest
 * block becomes the most recent; the missing ones are stored as one batch,
 * newer than the refreshed ones. Victims are the least recent entries outside
 * the request; a batch that cannot fit is not stored at all (the refresh
 * still happens). Events: one host Removed of the victims, then one host
 * Stored per run of consecutive missing blocks, anchored to the block before
 * the run, with start_position = the run's first block index.
 */
int host_write_through(host_tier *h, const host_block *blocks, size_t n, event_log *log) {
    if (h->capacity == 0 || n == 0) return 1;
    int ok = 0;
    u64map mine;
    int32_t *cand = NULL;
    char *missing = calloc(n, 1);
    if (missing == NULL || !map_init(&mine, n)) {
        free(missing);
        return 0;
    }
    size_t nmissing = 0;
    for (size_t i = 0; i < n; i++) {
        if (!map_put(&mine, blocks[i].seq, (int32_t)i)) goto out;
        if (map_get(&h->index, blocks[i].seq) < 0) {
            missing[i] = 1;
            nmissing++;
        }
    }
    size_t room = h->capacity - h->n;
    size_t need = nmissing > room ? nmissing - room : 0;
    int fits = 1;
    size_t ncand = 0;
    if (need) {
        cand = calloc(h->n ? h->n : 1, sizeof *cand);
        if (cand == NULL) goto out;
        for (size_t i = 0; i < h->n; i++)
            if (map_get(&mine, h->seq[i]) < 0) cand[ncand++] = (int32_t)i;
        sort_tier = h;
        qsort(cand, ncand, sizeof *cand, victim_cmp);
        fits = ncand >= need;
    }
    for (size_t i = n; i-- > 0;) /* refresh, deepest first */
        if (!missing[i]) host_set(h, blocks[i].seq, ++h->now, blocks[i].position);
    if (fits) {
        if (need) {
            kv_event *e = ev_new(log, EV_REMOVED, TIER_HOST, need);
            if (e == NULL) goto out;
            for (size_t k = 0; k < need; k++) e->hashes[k] = h->seq[cand[k]];
            for (size_t k = 0; k < need; k++) host_remove(h, e->hashes[k]);
        }
        h->now++;
        for (size_t i = 0; i < n; i++) {
            if (!missing[i] || (i > 0 && missing[i - 1])) continue;
            size_t end = i;
            while (end < n && missing[end]) end++;
            kv_event *e = ev_new(log, EV_STORED, TIER_HOST, end - i);
            if (e == NULL) goto out;
            for (size_t k = i; k < end; k++) {
                e->blocks[k - i].block_hash = blocks[k].seq;
                e->blocks[k - i].tokens_hash = blocks[k].local;
                host_set(h, blocks[k].seq, h->now, blocks[k].position);
            }
            e->has_parent = i > 0;
            e->parent = i > 0 ? blocks[i - 1].seq : 0;
            e->has_start = 1;
            e->start_position = blocks[i].position;
        }
    }
    ok = 1;
out:
    free(cand);
    free(missing);
    map_free(&mine);
    return ok;
}
