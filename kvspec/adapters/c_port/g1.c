/*
 * g1.c -- see g1.h. The kvbm lifecycle with LRU eviction and no offload tier.
 *
 * Data layout (WHY: O(1) per block at any capacity, no allocation while an
 * operation mutates state):
 *   - registered blocks live in a pool (array + free list); two open-address
 *     tables index them by sequence hash and by positional lineage hash;
 *   - the inactive blocks form a doubly linked LRU list through the pool
 *     (head = least recently made inactive = next victim);
 *   - partial blocks live in a second pool indexed by uuid;
 *   - token id buffers (block_size u32 each) are recycled through a stack.
 * Every operation first validates, then reserves all memory it could need,
 * and only then mutates: an error or an allocation failure changes nothing.
 */
#include "g1.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t seq;
    g1_plh plh;
    uint64_t local_hash;
    uint32_t *tokens; /* NULL when the Use/Promote carried no token ids */
    uint64_t owners;
    uint64_t pending; /* Deref validation scratch, 0 between operations */
    uint8_t announced;
    int32_t prev, next; /* LRU links while inactive; `next` chains the free list */
} block;

typedef struct {
    char uuid[G1_UUID_MAX];
    uint32_t len;
    uint8_t seen; /* Deref validation scratch */
    int32_t next_free;
} partial;

typedef struct {
    uint64_t h;
    int32_t idx; /* -1: empty */
} slot;

typedef struct {
    slot *s;
    size_t mask, count;
} table;

typedef struct {
    uint64_t seq;
    g1_plh plh;
    uint8_t announced;
} evicted;

struct g1_mgr {
    uint64_t capacity;
    uint32_t block_size;
    uint64_t dp_rank;
    uint64_t free_slots, active_full, refs, next_event_id;

    block *blocks;
    size_t blocks_cap, blocks_hw;
    int32_t block_free;
    table by_seq, by_plh;
    int32_t lru_head, lru_tail;
    uint64_t lru_len;

    partial *parts;
    size_t parts_cap, parts_hw;
    int32_t part_free;
    uint64_t nparts;
    table by_uuid;

    uint32_t **tokfree;
    size_t ntokfree, tokfree_cap, tok_total;

    /* per-operation scratch */
    int32_t *stored;
    size_t stored_cap;
    evicted *ev;
    size_t ev_cap;
    uint64_t *removed;
    size_t removed_cap;
    int32_t *found;
    size_t found_cap;
};

/* ------------------------------------------------------------ hashing */

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t plh_hash(const g1_plh *p) {
    uint64_t h = mix(p->hash) ^ mix(p->position + 0x51ed27ull);
    return mix(h ^ (p->has_parent ? mix(p->parent ^ 0xa0761d6478bd642full) : 0x2545f4914f6cdd1dull));
}

static int plh_eq(const g1_plh *a, const g1_plh *b) {
    return a->hash == b->hash && a->position == b->position && a->has_parent == b->has_parent &&
           (!a->has_parent || a->parent == b->parent);
}

static uint64_t str_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return mix(h);
}

/* ------------------------------------------------------------- tables */

static int table_init(table *t, size_t size) {
    t->s = malloc(size * sizeof *t->s);
    if (!t->s) return -1;
    for (size_t i = 0; i < size; i++) t->s[i].idx = -1;
    t->mask = size - 1;
    t->count = 0;
    return 0;
}

/* Make room for `more` insertions at load factor <= 1/2. */
static int table_reserve(table *t, size_t more) {
    size_t size = t->mask + 1;
    if ((t->count + more) * 2 <= size) return 0;
    size_t ns = size;
    while ((t->count + more) * 2 > ns) ns *= 2;
    slot *s = malloc(ns * sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < ns; i++) s[i].idx = -1;
    for (size_t i = 0; i < size; i++) {
        if (t->s[i].idx < 0) continue;
        size_t j = t->s[i].h & (ns - 1);
        while (s[j].idx >= 0) j = (j + 1) & (ns - 1);
        s[j] = t->s[i];
    }
    free(t->s);
    t->s = s;
    t->mask = ns - 1;
    return 0;
}

static void table_insert(table *t, uint64_t h, int32_t idx) {
    size_t i = h & t->mask;
    while (t->s[i].idx >= 0) i = (i + 1) & t->mask;
    t->s[i].h = h;
    t->s[i].idx = idx;
    t->count++;
}

/* Remove the entry of `idx` (stored under hash h): backward-shift deletion. */
static void table_remove(table *t, uint64_t h, int32_t idx) {
    size_t i = h & t->mask;
    while (t->s[i].idx != idx) i = (i + 1) & t->mask;
    size_t j = i;
    for (;;) {
        j = (j + 1) & t->mask;
        if (t->s[j].idx < 0) break;
        size_t k = t->s[j].h & t->mask;
        /* move s[j] into the hole at i unless its home k lies cyclically in (i, j] */
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            t->s[i] = t->s[j];
            i = j;
        }
    }
    t->s[i].idx = -1;
    t->count--;
}

static int32_t find_seq(const g1_mgr *m, uint64_t seq) {
    uint64_t h = mix(seq);
    const table *t = &m->by_seq;
    for (size_t i = h & t->mask; t->s[i].idx >= 0; i = (i + 1) & t->mask)
        if (t->s[i].h == h && m->blocks[t->s[i].idx].seq == seq) return t->s[i].idx;
    return -1;
}

static int32_t find_plh(const g1_mgr *m, const g1_plh *p) {
    uint64_t h = plh_hash(p);
    const table *t = &m->by_plh;
    for (size_t i = h & t->mask; t->s[i].idx >= 0; i = (i + 1) & t->mask)
        if (t->s[i].h == h && plh_eq(&m->blocks[t->s[i].idx].plh, p)) return t->s[i].idx;
    return -1;
}

static int32_t find_uuid(const g1_mgr *m, const char *u, uint32_t n) {
    uint64_t h = str_hash(u, n);
    const table *t = &m->by_uuid;
    for (size_t i = h & t->mask; t->s[i].idx >= 0; i = (i + 1) & t->mask) {
        const partial *p = &m->parts[t->s[i].idx];
        if (t->s[i].h == h && p->len == n && memcmp(p->uuid, u, n) == 0) return t->s[i].idx;
    }
    return -1;
}

/* -------------------------------------------------------- reservations */

#define GROW(ptr, cap, need)                                              \
    do {                                                                  \
        if ((need) > (cap)) {                                             \
            size_t nc_ = (cap) ? (cap) : 16;                              \
            while (nc_ < (need)) nc_ *= 2;                                \
            void *np_ = realloc((ptr), nc_ * sizeof *(ptr));              \
            if (!np_) return -1;                                          \
            (ptr) = np_;                                                  \
            (cap) = nc_;                                                  \
        }                                                                 \
    } while (0)

static size_t min_sz(size_t a, uint64_t b) { return (uint64_t)a < b ? a : (size_t)b; }

/* Reserve everything an operation can need: `nb` new blocks (with token
 * buffers when `tokens`), `np` new partials, `n` scratch entries. */
static int reserve(g1_mgr *m, size_t nb, int tokens, size_t np, size_t n) {
    size_t nblk = min_sz(m->by_seq.count + nb, m->capacity);
    GROW(m->blocks, m->blocks_cap, nblk);
    if (table_reserve(&m->by_seq, nblk - m->by_seq.count)) return -1;
    if (table_reserve(&m->by_plh, nblk - m->by_plh.count)) return -1;
    size_t npart = min_sz((size_t)m->nparts + np, m->capacity);
    GROW(m->parts, m->parts_cap, npart);
    if (table_reserve(&m->by_uuid, npart - (size_t)m->nparts)) return -1;
    if (tokens) {
        size_t want = min_sz(nb, m->capacity);
        while (m->ntokfree < want) {
            GROW(m->tokfree, m->tokfree_cap, m->tok_total + 1);
            uint32_t *buf = malloc((size_t)m->block_size * sizeof *buf);
            if (!buf) return -1;
            m->tokfree[m->ntokfree++] = buf;
            m->tok_total++;
        }
    }
    size_t s = n ? n : 1;
    GROW(m->stored, m->stored_cap, s);
    GROW(m->ev, m->ev_cap, s);
    GROW(m->removed, m->removed_cap, s);
    GROW(m->found, m->found_cap, s);
    return 0;
}

/* ------------------------------------------------------------ lifecycle */

g1_mgr *g1_new(uint64_t capacity, uint32_t block_size, uint64_t dp_rank) {
    g1_mgr *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->capacity = capacity;
    m->block_size = block_size;
    m->dp_rank = dp_rank;
    m->free_slots = capacity;
    m->block_free = m->part_free = -1;
    m->lru_head = m->lru_tail = -1;
    if (table_init(&m->by_seq, 64) || table_init(&m->by_plh, 64) || table_init(&m->by_uuid, 64) ||
        reserve(m, 0, 0, 0, 16)) {
        g1_free(m);
        return NULL;
    }
    return m;
}

void g1_free(g1_mgr *m) {
    if (!m) return;
    for (size_t i = 0; i < m->blocks_hw; i++) free(m->blocks[i].tokens);
    for (size_t i = 0; i < m->ntokfree; i++) free(m->tokfree[i]);
    free(m->blocks);
    free(m->parts);
    free(m->tokfree);
    free(m->by_seq.s);
    free(m->by_plh.s);
    free(m->by_uuid.s);
    free(m->stored);
    free(m->ev);
    free(m->removed);
    free(m->found);
    free(m);
}

g1_counters g1_get_counters(const g1_mgr *m) {
    g1_counters c = {m->nparts + m->active_full, m->nparts + m->refs, m->lru_len, m->free_slots};
    return c;
}

uint64_t g1_dp_rank(const g1_mgr *m) { return m->dp_rank; }
uint32_t g1_block_size(const g1_mgr *m) { return m->block_size; }

void g1_block_meta(const g1_mgr *m, int32_t idx, uint64_t *seq, uint64_t *local_hash, const uint32_t **tokens) {
    const block *b = &m->blocks[idx];
    *seq = b->seq;
    *local_hash = b->local_hash;
    *tokens = b->tokens;
}

/* ----------------------------------------------------------- LRU policy */

static void lru_unlink(g1_mgr *m, int32_t i) {
    block *b = &m->blocks[i];
    if (b->prev >= 0)
        m->blocks[b->prev].next = b->next;
    else
        m->lru_head = b->next;
    if (b->next >= 0)
        m->blocks[b->next].prev = b->prev;
    else
        m->lru_tail = b->prev;
    b->prev = b->next = -1;
    m->lru_len--;
}

static void lru_push_newest(g1_mgr *m, int32_t i) {
    block *b = &m->blocks[i];
    b->prev = m->lru_tail;
    b->next = -1;
    if (m->lru_tail >= 0)
        m->blocks[m->lru_tail].next = i;
    else
        m->lru_head = i;
    m->lru_tail = i;
    m->lru_len++;
}

/* --------------------------------------------------------- block moves */

static void reject(g1_outcome *out, const char *rule, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void reject(g1_outcome *out, const char *rule, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->message, sizeof out->message, fmt, ap);
    va_end(ap);
    out->rule = rule;
}

static void fmt_plh(char *buf, size_t n, const g1_plh *p) {
    if (p->has_parent)
        snprintf(buf, n, "(%" PRIu64 ", %" PRIu64 ", %" PRIu64 ")", p->position, p->hash, p->parent);
    else
        snprintf(buf, n, "(%" PRIu64 ", %" PRIu64 ", None)", p->position, p->hash);
}

/* USE-VALIDATE: a block keeps its lineage hash; a lineage hash names one block. */
static int check_identity(const g1_mgr *m, uint64_t seq, const g1_plh *plh, g1_outcome *out) {
    char a[96], b[96];
    int32_t i = find_seq(m, seq);
    if (i >= 0 && !plh_eq(&m->blocks[i].plh, plh)) {
        fmt_plh(a, sizeof a, &m->blocks[i].plh);
        fmt_plh(b, sizeof b, plh);
        reject(out, "USE-VALIDATE", "block %" PRIu64 " is registered with lineage hash %s, not %s", seq, a, b);
        return -1;
    }
    int32_t o = find_plh(m, plh);
    if (o >= 0 && m->blocks[o].seq != seq) {
        fmt_plh(a, sizeof a, plh);
        reject(out, "USE-VALIDATE", "lineage hash %s belongs to block %" PRIu64 ", not %" PRIu64, a,
               m->blocks[o].seq, seq);
        return -1;
    }
    return 0;
}

/* An owner joins a registered block (USE-HIT-ACTIVE / USE-HIT-INACTIVE). */
static void hit(g1_mgr *m, int32_t i) {
    block *b = &m->blocks[i];
    if (b->owners == 0) {
        lru_unlink(m, i);
        m->active_full++;
    }
    b->owners++;
    m->refs++;
}

static int32_t register_block(g1_mgr *m, uint64_t seq, const g1_plh *plh, uint64_t local, const uint32_t *toks) {
    int32_t i;
    if (m->block_free >= 0) {
        i = m->block_free;
        m->block_free = m->blocks[i].next;
    } else {
        i = (int32_t)m->blocks_hw++;
    }
    block *b = &m->blocks[i];
    b->seq = seq;
    b->plh = *plh;
    b->local_hash = local;
    b->tokens = NULL;
    if (toks) {
        b->tokens = m->tokfree[--m->ntokfree];
        memcpy(b->tokens, toks, (size_t)m->block_size * sizeof *toks);
    }
    b->owners = 1;
    b->pending = 0;
    b->announced = 1;
    b->prev = b->next = -1;
    table_insert(&m->by_seq, mix(seq), i);
    table_insert(&m->by_plh, plh_hash(plh), i);
    m->active_full++;
    m->refs++;
    return i;
}

/* Take the LRU victim out of the pool and the registry; remember what the
 * Removed event needs. */
static void evict(g1_mgr *m, int32_t i, evicted *snap) {
    block *b = &m->blocks[i];
    lru_unlink(m, i);
    table_remove(&m->by_seq, mix(b->seq), i);
    table_remove(&m->by_plh, plh_hash(&b->plh), i);
    snap->seq = b->seq;
    snap->plh = b->plh;
    snap->announced = b->announced;
    if (b->tokens) {
        m->tokfree[m->ntokfree++] = b->tokens;
        b->tokens = NULL;
    }
    b->next = m->block_free;
    m->block_free = i;
}

/* A free slot first, else evict the least recently inactive block.
 * Returns 0 when there is neither (USE-CAPACITY). */
static int take_slot(g1_mgr *m, size_t *nev) {
    if (m->free_slots) {
        m->free_slots--;
        return 1;
    }
    if (m->lru_head < 0) return 0;
    evict(m, m->lru_head, &m->ev[(*nev)++]);
    return 1;
}

static void add_partial(g1_mgr *m, const char *u, uint32_t n) {
    int32_t i;
    if (m->part_free >= 0) {
        i = m->part_free;
        m->part_free = m->parts[i].next_free;
    } else {
        i = (int32_t)m->parts_hw++;
    }
    partial *p = &m->parts[i];
    memcpy(p->uuid, u, n);
    p->len = n;
    p->seen = 0;
    table_insert(&m->by_uuid, str_hash(u, n), i);
    m->nparts++;
}

static void drop_partial(g1_mgr *m, int32_t i) {
    partial *p = &m->parts[i];
    table_remove(&m->by_uuid, str_hash(p->uuid, p->len), i);
    p->next_free = m->part_free;
    m->part_free = i;
    m->nparts--;
}

/* Device Removed after the Stored: every evicted block a router was told
 * about. A block evicted and registered again within the same batch is
 * reported Removed although it is back (the kvbm seed drops its metadata),
 * and from then on it is not announced: its later eviction reports nothing. */
static void publish_evictions(g1_mgr *m, size_t nev, g1_outcome *out) {
    size_t n = 0;
    for (size_t k = 0; k < nev; k++) {
        /* a block registered in this batch has an owner until the batch
         * ends, so no sequence hash is evicted twice in one operation */
        int32_t again = find_seq(m, m->ev[k].seq);
        int rereg = again >= 0 && plh_eq(&m->blocks[again].plh, &m->ev[k].plh);
        if (rereg || m->ev[k].announced) m->removed[n++] = m->ev[k].seq;
        if (rereg) m->blocks[again].announced = 0;
    }
    if (n) {
        out->removed = m->removed;
        out->removed_n = n;
        out->removed_event_id = m->next_event_id++;
    }
}

static void publish_stored(g1_mgr *m, size_t n, int has_parent, uint64_t parent, g1_outcome *out) {
    if (!n) return;
    out->stored = m->stored;
    out->stored_n = n;
    out->stored_has_parent = (uint8_t)has_parent;
    out->stored_parent = parent;
    out->stored_event_id = m->next_event_id++;
}

/* ------------------------------------------------------------------ Use */

static int validate_use(const g1_mgr *m, const g1_use *op, size_t nfull, g1_outcome *out) {
    if (op->nplhs != nfull) {
        reject(out, "USE-VALIDATE", "plhs has %zu entries for %zu full blocks", op->nplhs, nfull);
        return -1;
    }
    if (op->nlocal && op->nlocal != nfull) {
        reject(out, "USE-VALIDATE", "local_hashes has %zu entries for %zu full blocks", op->nlocal, nfull);
        return -1;
    }
    if (op->has_tokens) {
        if (op->ntokens != nfull) {
            reject(out, "USE-VALIDATE", "token_ids has %zu entries for %zu full blocks", op->ntokens, nfull);
            return -1;
        }
        for (size_t i = 0; i < op->ntokens; i++) {
            if (op->token_lens[i] != m->block_size) {
                reject(out, "USE-VALIDATE", "token_ids[%zu] has %zu tokens; a full block has %u", i,
                       op->token_lens[i], m->block_size);
                return -1;
            }
        }
    }
    if (op->has_parent && op->parent.partial) {
        reject(out, "USE-VALIDATE", "a partial block cannot be the parent of a Use");
        return -1;
    }
    size_t fi = 0;
    for (size_t i = 0; i < op->nblocks; i++) {
        if (op->blocks[i].partial) continue;
        if (check_identity(m, op->blocks[i].full, &op->plhs[fi++], out)) return -1;
    }
    return 0;
}

int g1_use_op(g1_mgr *m, const g1_use *op, g1_outcome *out) {
    memset(out, 0, sizeof *out);
    size_t nfull = 0;
    for (size_t i = 0; i < op->nblocks; i++) nfull += !op->blocks[i].partial;
    if (validate_use(m, op, nfull, out)) return 0;
    if (reserve(m, nfull, op->has_tokens, op->nblocks - nfull, op->nblocks)) {
        snprintf(out->message, sizeof out->message, "out of memory");
        return -1;
    }
    size_t nev = 0, nstored = 0, placed = 0, fi = 0;
    int has_anchor = op->has_parent;
    uint64_t anchor = op->has_parent ? op->parent.full : 0;
    const char *status = "ok";
    for (size_t k = 0; k < op->nblocks; k++) {
        const g1_ref *r = &op->blocks[k];
        if (!r->partial) {
            size_t idx = fi++;
            int32_t b = find_seq(m, r->full);
            if (b >= 0) {
                hit(m, b);
                has_anchor = 1;
                anchor = r->full;
            } else {
                if (!take_slot(m, &nev)) {
                    status = "capacity";
                    break;
                }
                const uint32_t *toks = op->has_tokens ? op->tokens[idx] : NULL;
                uint64_t local = op->nlocal ? op->local_hashes[idx] : 0;
                m->stored[nstored++] = register_block(m, r->full, &op->plhs[idx], local, toks);
            }
        } else if (find_uuid(m, r->uuid, r->uuid_len) < 0) {
            if (!take_slot(m, &nev)) {
                status = "capacity";
                break;
            }
            add_partial(m, r->uuid, r->uuid_len);
        }
        placed++;
    }
    publish_stored(m, nstored, has_anchor, anchor, out);
    publish_evictions(m, nev, out);
    out->has_value = 1;
    out->value = placed;
    out->status = status;
    return 0;
}

/* ---------------------------------------------------------------- Deref */

int g1_deref_op(g1_mgr *m, const g1_deref *op, g1_outcome *out) {
    memset(out, 0, sizeof *out);
    if (reserve(m, 0, 0, 0, op->nblocks)) {
        snprintf(out->message, sizeof out->message, "out of memory");
        return -1;
    }
    /* DEREF-UNKNOWN: count the owners each block would lose (scratch
     * counters on the blocks, cleared again below whatever happens) */
    size_t k = 0;
    int bad = 0;
    for (; k < op->nblocks; k++) {
        const g1_ref *r = &op->blocks[k];
        if (!r->partial) {
            int32_t b = find_seq(m, r->full);
            m->found[k] = b;
            uint64_t owners = b >= 0 ? m->blocks[b].owners : 0;
            uint64_t need = b >= 0 ? ++m->blocks[b].pending : 1;
            if (need > owners) {
                char state[48];
                if (b < 0)
                    snprintf(state, sizeof state, "unknown");
                else if (owners == 0)
                    snprintf(state, sizeof state, "inactive");
                else
                    snprintf(state, sizeof state, "held by %" PRIu64, owners);
                reject(out, "DEREF-UNKNOWN", "Deref of full block %" PRIu64 " (%s) drops more owners than it has",
                       r->full, state);
                bad = 1;
                k++;
                break;
            }
        } else {
            int32_t p = find_uuid(m, r->uuid, r->uuid_len);
            m->found[k] = p;
            if (p < 0 || m->parts[p].seen) {
                reject(out, "DEREF-UNKNOWN", "Deref of partial block %.*s that is not held", (int)r->uuid_len,
                       r->uuid);
                bad = 1;
                k++;
                break;
            }
            m->parts[p].seen = 1;
        }
    }
    for (size_t j = 0; j < k; j++) {
        if (m->found[j] < 0) continue;
        if (!op->blocks[j].partial)
            m->blocks[m->found[j]].pending = 0;
        else
            m->parts[m->found[j]].seen = 0;
    }
    if (bad) return 0;
    for (size_t j = 0; j < op->nblocks; j++) {
        int32_t i = m->found[j];
        if (!op->blocks[j].partial) {
            block *b = &m->blocks[i];
            b->owners--;
            m->refs--;
            if (b->owners == 0) {
                m->active_full--;
                lru_push_newest(m, i);
            }
        } else {
            drop_partial(m, i);
            m->free_slots++;
        }
    }
    out->status = "ok";
    return 0;
}

/* -------------------------------------------------------------- Promote */

int g1_promote_op(g1_mgr *m, const g1_promote *op, g1_outcome *out) {
    memset(out, 0, sizeof *out);
    int32_t p = find_uuid(m, op->uuid, op->uuid_len);
    if (p < 0) {
        reject(out, "PROMOTE-UNKNOWN", "Promote of partial block %.*s that is not held", (int)op->uuid_len, op->uuid);
        return 0;
    }
    if (op->has_tokens && op->ntokens != m->block_size) {
        reject(out, "USE-VALIDATE", "Promote token_ids has %zu tokens; a full block has %u", op->ntokens,
               m->block_size);
        return 0;
    }
    if (check_identity(m, op->seq_hash, &op->plh, out)) return 0;
    if (reserve(m, 1, op->has_tokens, 0, 1)) {
        snprintf(out->message, sizeof out->message, "out of memory");
        return -1;
    }
    out->status = "ok";
    drop_partial(m, p);
    int32_t b = find_seq(m, op->seq_hash);
    if (b >= 0) { /* PROMOTE-EXISTING: the partial slot goes back to free */
        m->free_slots++;
        hit(m, b);
        return 0;
    }
    m->stored[0] = register_block(m, op->seq_hash, &op->plh, op->local_hash, op->has_tokens ? op->tokens : NULL);
    publish_stored(m, 1, op->has_parent_hash, op->parent_hash, out);
    return 0;
}
