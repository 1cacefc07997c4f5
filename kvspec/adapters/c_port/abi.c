/*
 * abi.c -- spec/kvspec_abi.h over the kvbm manager of g1.c: decode the
 * ManagerConfig and Operation JSON (as strictly as kvspec's pydantic wire
 * models: unknown fields, wrong types and out-of-range integers are refused
 * with the field named), run the operation, encode the StepOutcome.
 *
 * Built with -DKVSPEC_TEST_CRASH, four extra operations exist for the
 * transport's robustness tests: {"op":"__crash__"} calls abort(),
 * {"op":"__hang__"} never returns, {"op":"__bad_reply__"} answers with a
 * reply that breaks the StepOutcome schema, {"op":"__print__"} writes junk
 * to stdout (which a host must keep off its protocol channel) and then
 * behaves like a reset.
 */
#include "kvspec_abi.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "g1.h"
#include "json.h"

#define HANDLE_MAGIC 0x6b767370u /* "kvsp" */
#define MAX_CAPACITY 1000000u
#define MAX_BLOCK_SIZE 4096u

enum { OP_USE, OP_DEREF, OP_DESTROY, OP_PROMOTE, OP_TICK, OP_SWAP_IN, OP_RESET, OP_CRASH, OP_HANG, OP_BAD_REPLY, OP_PRINT };

struct kvspec_handle {
    uint32_t magic;
    int poisoned;
    int held; /* `out` holds the reply of the last applied request */
    g1_mgr *m;
    jdoc doc;
    jbuf out;
    char err[400];
    /* decoded request (pointers into `doc` and the vectors below) */
    g1_ref *refs;
    size_t refs_cap;
    g1_plh *plhs;
    size_t plhs_cap;
    uint64_t *u64s;
    size_t u64s_cap;
    uint32_t *toks;
    size_t toks_cap;
    size_t *tok_off, *tok_len;
    size_t tok_off_cap, tok_len_cap;
    const uint32_t **tok_ptr;
    size_t tok_ptr_cap;
};

/* ------------------------------------------------------------- helpers */

static int bad(kvspec_handle *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(kvspec_handle *h, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->err, sizeof h->err, fmt, ap);
    va_end(ap);
    return -1;
}

#define GROW(ptr, cap, need)                                             \
    do {                                                                 \
        if ((need) > (cap)) {                                            \
            size_t nc_ = (cap) ? (cap) : 64;                             \
            while (nc_ < (need)) nc_ *= 2;                               \
            void *np_ = realloc((ptr), nc_ * sizeof *(ptr));             \
            if (!np_) return bad(h, "out of memory");                    \
            (ptr) = np_;                                                 \
            (cap) = nc_;                                                 \
        }                                                                \
    } while (0)

static const jnode *N(const kvspec_handle *h, int i) { return &h->doc.nodes[i]; }
static const char *S(const kvspec_handle *h, const jnode *x) { return jdoc_str(&h->doc, x->v.str); }
static int key_is(const kvspec_handle *h, const jnode *x, const char *k) {
    return strlen(k) == x->key_len && memcmp(jdoc_str(&h->doc, x->key), k, x->key_len) == 0;
}
static const char *key_of(const kvspec_handle *h, const jnode *x) { return jdoc_str(&h->doc, x->key); }

static const char *type_name(const jnode *x) {
    switch (x->type) {
    case JN_NULL: return "null";
    case JN_FALSE:
    case JN_TRUE: return "a boolean";
    case JN_UINT:
    case JN_NEGINT:
    case JN_BIGINT: return "an integer";
    case JN_FLOAT: return "a float";
    case JN_STRING: return "a string";
    case JN_ARRAY: return "an array";
    default: return "an object";
    }
}

/* NULL when x is an integer in [0, max], else why not. */
static const char *uint_problem(const jnode *x, uint64_t max) {
    if (x->type == JN_UINT) return x->v.u <= max ? NULL : "integer out of range";
    if (x->type == JN_NEGINT) return "integer must be >= 0";
    if (x->type == JN_BIGINT) return "integer does not fit in an unsigned 64-bit integer";
    return "expected an integer";
}

static int get_u64(kvspec_handle *h, const jnode *x, uint64_t max, uint64_t *out, const char *path) {
    const char *why = uint_problem(x, max);
    if (why) return bad(h, "%s: %s, got %s", path, why, type_name(x));
    *out = x->v.u;
    return 0;
}

/* A partial block uuid: 1 to 64 characters (code points). */
static int get_uuid(kvspec_handle *h, const jnode *x, const char **s, uint32_t *n, const char *path) {
    if (x->type != JN_STRING) return bad(h, "%s: expected a string, got %s", path, type_name(x));
    size_t cps = 0;
    const unsigned char *p = (const unsigned char *)S(h, x);
    for (uint32_t i = 0; i < x->len; i++) cps += (p[i] & 0xc0) != 0x80;
    if (cps < 1 || cps > 64) return bad(h, "%s: a uuid has 1 to 64 characters, got %zu", path, cps);
    *s = S(h, x);
    *n = x->len;
    return 0;
}

/* {"full": u64} or {"partial": str} */
static int get_ref(kvspec_handle *h, const jnode *x, g1_ref *r, const char *path) {
    if (x->type != JN_OBJECT || x->len != 1)
        return bad(h, "%s: expected {\"full\": u64} or {\"partial\": uuid}, got %s", path,
                   x->type == JN_OBJECT ? "another object" : type_name(x));
    const jnode *c = N(h, x->first);
    char sub[96];
    memset(r, 0, sizeof *r);
    if (key_is(h, c, "full")) {
        snprintf(sub, sizeof sub, "%s.full", path);
        return get_u64(h, c, UINT64_MAX, &r->full, sub);
    }
    if (key_is(h, c, "partial")) {
        snprintf(sub, sizeof sub, "%s.partial", path);
        r->partial = 1;
        return get_uuid(h, c, &r->uuid, &r->uuid_len, sub);
    }
    return bad(h, "%s: unknown block kind '%s' (expected 'full' or 'partial')", path, key_of(h, c));
}

static int get_plh(kvspec_handle *h, const jnode *x, g1_plh *p, const char *path) {
    char sub[96];
    int has_hash = 0;
    memset(p, 0, sizeof *p);
    if (x->type != JN_OBJECT) return bad(h, "%s: expected an object, got %s", path, type_name(x));
    for (int i = x->first; i >= 0; i = N(h, i)->next) {
        const jnode *c = N(h, i);
        snprintf(sub, sizeof sub, "%s.%s", path, key_of(h, c));
        if (key_is(h, c, "hash")) {
            if (get_u64(h, c, UINT64_MAX, &p->hash, sub)) return -1;
            has_hash = 1;
        } else if (key_is(h, c, "parent")) {
            p->has_parent = c->type != JN_NULL;
            if (p->has_parent && get_u64(h, c, UINT64_MAX, &p->parent, sub)) return -1;
        } else if (key_is(h, c, "position")) {
            if (get_u64(h, c, UINT64_MAX, &p->position, sub)) return -1;
        } else {
            return bad(h, "%s: unknown field", sub);
        }
    }
    if (!has_hash) return bad(h, "%s.hash: field required", path);
    return 0;
}

static int get_refs(kvspec_handle *h, const jnode *x, size_t *n, const char *field) {
    if (x->type != JN_ARRAY) return bad(h, "%s: expected an array, got %s", field, type_name(x));
    GROW(h->refs, h->refs_cap, (size_t)x->len);
    size_t k = 0;
    char sub[64];
    for (int i = x->first; i >= 0; i = N(h, i)->next, k++) {
        snprintf(sub, sizeof sub, "%s[%zu]", field, k);
        if (get_ref(h, N(h, i), &h->refs[k], sub)) return -1;
    }
    *n = k;
    return 0;
}

/* Append a list of u32 token ids to h->toks at offset `fill`; *len = its length. */
static int get_tokens(kvspec_handle *h, const jnode *x, size_t fill, size_t *len, const char *path) {
    if (x->type != JN_ARRAY) return bad(h, "%s: expected an array, got %s", path, type_name(x));
    GROW(h->toks, h->toks_cap, fill + x->len);
    size_t k = 0;
    for (int i = x->first; i >= 0; i = N(h, i)->next, k++) {
        const jnode *c = N(h, i);
        const char *why = uint_problem(c, UINT32_MAX);
        if (why) return bad(h, "%s[%zu]: %s, got %s", path, k, why, type_name(c));
        h->toks[fill + k] = (uint32_t)c->v.u;
    }
    *len = k;
    return 0;
}

/* ------------------------------------------------------ request decoding */

typedef struct {
    int kind;
    g1_use use;
    g1_deref deref;
    g1_promote promote;
} request;

static int decode_use(kvspec_handle *h, const jnode *root, request *rq) {
    g1_use *u = &rq->use;
    int have_blocks = 0;
    const jnode *tok = NULL;
    for (int i = root->first; i >= 0; i = N(h, i)->next) {
        const jnode *c = N(h, i);
        if (key_is(h, c, "op")) continue;
        if (key_is(h, c, "blocks")) {
            if (get_refs(h, c, &u->nblocks, "blocks")) return -1;
            have_blocks = 1;
        } else if (key_is(h, c, "local_hashes")) {
            if (c->type != JN_ARRAY) return bad(h, "local_hashes: expected an array, got %s", type_name(c));
            GROW(h->u64s, h->u64s_cap, (size_t)c->len);
            size_t k = 0;
            char sub[48];
            for (int j = c->first; j >= 0; j = N(h, j)->next, k++) {
                snprintf(sub, sizeof sub, "local_hashes[%zu]", k);
                if (get_u64(h, N(h, j), UINT64_MAX, &h->u64s[k], sub)) return -1;
            }
            u->nlocal = k;
        } else if (key_is(h, c, "plhs")) {
            if (c->type != JN_ARRAY) return bad(h, "plhs: expected an array, got %s", type_name(c));
            GROW(h->plhs, h->plhs_cap, (size_t)c->len);
            size_t k = 0;
            char sub[48];
            for (int j = c->first; j >= 0; j = N(h, j)->next, k++) {
                snprintf(sub, sizeof sub, "plhs[%zu]", k);
                if (get_plh(h, N(h, j), &h->plhs[k], sub)) return -1;
            }
            u->nplhs = k;
        } else if (key_is(h, c, "token_ids")) {
            tok = c->type == JN_NULL ? NULL : c;
            if (tok && tok->type != JN_ARRAY) return bad(h, "token_ids: expected an array or null, got %s", type_name(c));
        } else if (key_is(h, c, "parent")) {
            u->has_parent = c->type != JN_NULL;
            if (u->has_parent && get_ref(h, c, &u->parent, "parent")) return -1;
        } else {
            return bad(h, "%s: unknown field of a use operation", key_of(h, c));
        }
    }
    if (!have_blocks) return bad(h, "blocks: field required");
    u->blocks = h->refs;
    u->local_hashes = h->u64s;
    u->plhs = h->plhs;
    if (tok) {
        size_t n = tok->len, k = 0, fill = 0;
        GROW(h->tok_off, h->tok_off_cap, n);
        GROW(h->tok_len, h->tok_len_cap, n);
        GROW(h->tok_ptr, h->tok_ptr_cap, n);
        char sub[48];
        for (int j = tok->first; j >= 0; j = N(h, j)->next, k++) {
            size_t len;
            snprintf(sub, sizeof sub, "token_ids[%zu]", k);
            if (get_tokens(h, N(h, j), fill, &len, sub)) return -1;
            h->tok_off[k] = fill;
            h->tok_len[k] = len;
            fill += len;
        }
        for (k = 0; k < n; k++) h->tok_ptr[k] = h->toks + h->tok_off[k];
        u->has_tokens = 1;
        u->tokens = h->tok_ptr;
        u->token_lens = h->tok_len;
        u->ntokens = n;
    }
    return 0;
}

static int decode_deref(kvspec_handle *h, const jnode *root, request *rq, const char *what) {
    int have_blocks = 0;
    for (int i = root->first; i >= 0; i = N(h, i)->next) {
        const jnode *c = N(h, i);
        if (key_is(h, c, "op")) continue;
        if (key_is(h, c, "blocks")) {
            if (get_refs(h, c, &rq->deref.nblocks, "blocks")) return -1;
            have_blocks = 1;
        } else {
            return bad(h, "%s: unknown field of a %s operation", key_of(h, c), what);
        }
    }
    if (!have_blocks) return bad(h, "blocks: field required");
    rq->deref.blocks = h->refs;
    return 0;
}

static int decode_promote(kvspec_handle *h, const jnode *root, request *rq) {
    g1_promote *p = &rq->promote;
    int have_uuid = 0, have_seq = 0, have_plh = 0;
    for (int i = root->first; i >= 0; i = N(h, i)->next) {
        const jnode *c = N(h, i);
        if (key_is(h, c, "op")) continue;
        if (key_is(h, c, "uuid")) {
            if (get_uuid(h, c, &p->uuid, &p->uuid_len, "uuid")) return -1;
            have_uuid = 1;
        } else if (key_is(h, c, "seq_hash")) {
            if (get_u64(h, c, UINT64_MAX, &p->seq_hash, "seq_hash")) return -1;
            have_seq = 1;
        } else if (key_is(h, c, "parent_hash")) {
            p->has_parent_hash = c->type != JN_NULL;
            if (p->has_parent_hash && get_u64(h, c, UINT64_MAX, &p->parent_hash, "parent_hash")) return -1;
        } else if (key_is(h, c, "local_hash")) {
            if (get_u64(h, c, UINT64_MAX, &p->local_hash, "local_hash")) return -1;
        } else if (key_is(h, c, "plh")) {
            if (get_plh(h, c, &p->plh, "plh")) return -1;
            have_plh = 1;
        } else if (key_is(h, c, "token_ids")) {
            p->has_tokens = c->type != JN_NULL;
            if (p->has_tokens) {
                size_t len;
                if (get_tokens(h, c, 0, &len, "token_ids")) return -1;
                p->tokens = h->toks;
                p->ntokens = len;
            }
        } else {
            return bad(h, "%s: unknown field of a promote operation", key_of(h, c));
        }
    }
    if (!have_uuid) return bad(h, "uuid: field required");
    if (!have_seq) return bad(h, "seq_hash: field required");
    if (!have_plh) return bad(h, "plh: field required");
    return 0;
}

static int decode_tick(kvspec_handle *h, const jnode *root) {
    int have = 0;
    for (int i = root->first; i >= 0; i = N(h, i)->next) {
        const jnode *c = N(h, i);
        if (key_is(h, c, "op")) continue;
        if (!key_is(h, c, "now_ms")) return bad(h, "%s: unknown field of a tick operation", key_of(h, c));
        have = 1;
        if (c->type == JN_UINT) continue;
        if (c->type != JN_FLOAT || !isfinite(c->v.d) || c->v.d < 0)
            return bad(h, "now_ms: must be a finite, non-negative number, got %s", type_name(c));
    }
    return have ? 0 : bad(h, "now_ms: field required");
}

static int decode_swap_in(kvspec_handle *h, const jnode *root) {
    int have = 0;
    char sub[64];
    for (int i = root->first; i >= 0; i = N(h, i)->next) {
        const jnode *c = N(h, i);
        if (key_is(h, c, "op")) continue;
        if (key_is(h, c, "parent")) {
            uint64_t v;
            if (c->type != JN_NULL && get_u64(h, c, UINT64_MAX, &v, "parent")) return -1;
        } else if (key_is(h, c, "blocks")) {
            if (c->type != JN_ARRAY || c->len == 0) return bad(h, "blocks: expected a non-empty array");
            size_t k = 0;
            for (int j = c->first; j >= 0; j = N(h, j)->next, k++) {
                const jnode *b = N(h, j);
                int hs = 0, hp = 0;
                if (b->type != JN_OBJECT) return bad(h, "blocks[%zu]: expected an object, got %s", k, type_name(b));
                for (int q = b->first; q >= 0; q = N(h, q)->next) {
                    const jnode *f = N(h, q);
                    snprintf(sub, sizeof sub, "blocks[%zu].%s", k, key_of(h, f));
                    if (key_is(h, f, "seq_hash")) {
                        uint64_t v;
                        if (get_u64(h, f, UINT64_MAX, &v, sub)) return -1;
                        hs = 1;
                    } else if (key_is(h, f, "plh")) {
                        g1_plh p;
                        if (get_plh(h, f, &p, sub)) return -1;
                        hp = 1;
                    } else {
                        return bad(h, "%s: unknown field", sub);
                    }
                }
                if (!hs || !hp) return bad(h, "blocks[%zu].%s: field required", k, hs ? "plh" : "seq_hash");
            }
            have = 1;
        } else {
            return bad(h, "%s: unknown field of a swap_in operation", key_of(h, c));
        }
    }
    return have ? 0 : bad(h, "blocks: field required");
}

static int decode_request(kvspec_handle *h, const char *text, request *rq) {
    memset(rq, 0, sizeof *rq);
    int root = jdoc_parse(&h->doc, text, strlen(text));
    if (root < 0) return bad(h, "%s", h->doc.err);
    const jnode *r = N(h, root);
    if (r->type != JN_OBJECT) return bad(h, "an operation is a JSON object, got %s", type_name(r));
    const jnode *op = NULL;
    for (int i = r->first; i >= 0; i = N(h, i)->next)
        if (key_is(h, N(h, i), "op")) op = N(h, i);
    if (!op) return bad(h, "op: field required");
    if (op->type != JN_STRING) return bad(h, "op: expected a string, got %s", type_name(op));
    const char *name = S(h, op);
    if (!strcmp(name, "use")) {
        rq->kind = OP_USE;
        return decode_use(h, r, rq);
    }
    if (!strcmp(name, "deref")) {
        rq->kind = OP_DEREF;
        return decode_deref(h, r, rq, "deref");
    }
    if (!strcmp(name, "destroy")) {
        rq->kind = OP_DESTROY;
        return decode_deref(h, r, rq, "destroy");
    }
    if (!strcmp(name, "promote")) {
        rq->kind = OP_PROMOTE;
        return decode_promote(h, r, rq);
    }
    if (!strcmp(name, "tick")) {
        rq->kind = OP_TICK;
        return decode_tick(h, r);
    }
    if (!strcmp(name, "swap_in")) {
        rq->kind = OP_SWAP_IN;
        return decode_swap_in(h, r);
    }
    if (!strcmp(name, "reset")) {
        rq->kind = OP_RESET;
        return r->len == 1 ? 0 : bad(h, "a reset operation has no other fields");
    }
#ifdef KVSPEC_TEST_CRASH
    if (!strcmp(name, "__crash__")) {
        rq->kind = OP_CRASH;
        return 0;
    }
    if (!strcmp(name, "__hang__")) {
        rq->kind = OP_HANG;
        return 0;
    }
    if (!strcmp(name, "__bad_reply__")) {
        rq->kind = OP_BAD_REPLY;
        return 0;
    }
    if (!strcmp(name, "__print__")) {
        rq->kind = OP_PRINT;
        return 0;
    }
#endif
    return bad(h, "op: unknown operation '%s' (expected use, deref, destroy, promote, tick, swap_in or reset)", name);
}

/* ------------------------------------------------------- reply encoding */

static void put_counters(jbuf *b, g1_counters c) {
    jb_lit(b, "\"counters\":{\"active_blocks\":");
    jb_u64(b, c.active_blocks);
    jb_lit(b, ",\"active_refs\":");
    jb_u64(b, c.active_refs);
    jb_lit(b, ",\"inactive_blocks\":");
    jb_u64(b, c.inactive_blocks);
    jb_lit(b, ",\"free_blocks\":");
    jb_u64(b, c.free_blocks);
    jb_lit(b, ",\"quarantined_blocks\":0}");
}

static void put_event_tail(jbuf *b, const g1_mgr *m) {
    jb_lit(b, ",\"dp_rank\":");
    jb_u64(b, g1_dp_rank(m));
    jb_lit(b, ",\"storage_tier\":\"device\"");
}

static void put_stored(jbuf *b, const g1_mgr *m, const g1_outcome *o) {
    jb_lit(b, "{\"event_id\":");
    jb_u64(b, o->stored_event_id);
    jb_lit(b, ",\"data\":{\"stored\":{\"parent_hash\":");
    if (o->stored_has_parent)
        jb_u64(b, o->stored_parent);
    else
        jb_lit(b, "null");
    jb_lit(b, ",\"blocks\":[");
    int all_tokens = 1;
    for (size_t i = 0; i < o->stored_n; i++) {
        uint64_t seq, local;
        const uint32_t *toks;
        g1_block_meta(m, o->stored[i], &seq, &local, &toks);
        all_tokens &= toks != NULL;
        jb_lit(b, i ? ",{\"block_hash\":" : "{\"block_hash\":");
        jb_u64(b, seq);
        jb_lit(b, ",\"tokens_hash\":");
        jb_u64(b, local);
        jb_lit(b, "}");
    }
    jb_lit(b, "]}}");
    put_event_tail(b, m);
    if (all_tokens) {
        uint32_t bs = g1_block_size(m);
        jb_lit(b, ",\"block_token_ids\":[");
        for (size_t i = 0; i < o->stored_n; i++) {
            uint64_t seq, local;
            const uint32_t *toks;
            g1_block_meta(m, o->stored[i], &seq, &local, &toks);
            jb_lit(b, i ? ",[" : "[");
            for (uint32_t t = 0; t < bs; t++) {
                if (t) jb_raw(b, ",", 1);
                jb_u64(b, toks[t]);
            }
            jb_lit(b, "]");
        }
        jb_lit(b, "]");
    }
    jb_lit(b, "}");
}

static void put_removed(jbuf *b, const g1_mgr *m, const g1_outcome *o) {
    jb_lit(b, "{\"event_id\":");
    jb_u64(b, o->removed_event_id);
    jb_lit(b, ",\"data\":{\"removed\":{\"block_hashes\":[");
    for (size_t i = 0; i < o->removed_n; i++) {
        if (i) jb_raw(b, ",", 1);
        jb_u64(b, o->removed[i]);
    }
    jb_lit(b, "]}}");
    put_event_tail(b, m);
    jb_lit(b, "}");
}

static void encode(kvspec_handle *h, const g1_outcome *o) {
    jbuf *b = &h->out;
    jb_reset(b);
    if (o->rule) {
        jb_lit(b, "{\"result\":null,\"error\":{\"rule\":");
        jb_str(b, o->rule, strlen(o->rule));
        jb_lit(b, ",\"message\":");
        jb_str(b, o->message, strlen(o->message));
        jb_lit(b, "},");
    } else {
        jb_lit(b, "{\"result\":{\"value\":");
        if (o->has_value)
            jb_u64(b, o->value);
        else
            jb_lit(b, "null");
        jb_lit(b, ",\"status\":");
        jb_str(b, o->status, strlen(o->status));
        jb_lit(b, "},\"error\":null,");
    }
    put_counters(b, g1_get_counters(h->m));
    jb_lit(b, ",\"events\":[");
    if (o->stored_n) put_stored(b, h->m, o);
    if (o->removed_n) {
        if (o->stored_n) jb_raw(b, ",", 1);
        put_removed(b, h->m, o);
    }
    jb_lit(b, "],\"earliest_deadline_ms\":null}");
    jb_finish(b);
}

/* --------------------------------------------------------------- config */

static int decode_config(kvspec_handle *h, const char *text, uint64_t *cap, uint64_t *bs, uint64_t *dp) {
    int root = jdoc_parse(&h->doc, text, strlen(text));
    if (root < 0) return bad(h, "config: %s", h->doc.err);
    const jnode *r = N(h, root);
    if (r->type != JN_OBJECT) return bad(h, "config: expected a ManagerConfig object, got %s", type_name(r));
    int have_cap = 0;
    const char *eviction = "lineage"; /* ManagerConfig's default */
    *bs = 16;
    *dp = 0;
    char sub[64];
    for (int i = r->first; i >= 0; i = N(h, i)->next) {
        const jnode *c = N(h, i);
        snprintf(sub, sizeof sub, "config.%s", key_of(h, c));
        if (key_is(h, c, "profile")) {
            if (c->type != JN_STRING) return bad(h, "%s: expected a string, got %s", sub, type_name(c));
            if (strcmp(S(h, c), "kvbm") != 0)
                return bad(h, "%s: the c_port implements the 'kvbm' profile only, not '%s'", sub, S(h, c));
        } else if (key_is(h, c, "capacity")) {
            if (get_u64(h, c, MAX_CAPACITY, cap, sub)) return -1;
            if (*cap < 1) return bad(h, "%s: must be >= 1", sub);
            have_cap = 1;
        } else if (key_is(h, c, "block_size")) {
            if (get_u64(h, c, MAX_BLOCK_SIZE, bs, sub)) return -1;
            if (*bs < 1) return bad(h, "%s: must be >= 1", sub);
        } else if (key_is(h, c, "dp_rank")) {
            if (get_u64(h, c, UINT64_MAX, dp, sub)) return -1;
        } else if (key_is(h, c, "eviction")) {
            if (c->type != JN_STRING) return bad(h, "%s: expected a string, got %s", sub, type_name(c));
            eviction = S(h, c);
        } else if (key_is(h, c, "offload")) {
            if (c->type != JN_NULL) return bad(h, "%s: the c_port has no offload tier", sub);
        } else {
            return bad(h, "%s: unknown field", sub);
        }
    }
    if (!have_cap) return bad(h, "config.capacity: field required");
    if (strcmp(eviction, "lru") != 0)
        return bad(h, "config.eviction: the c_port evicts by 'lru' only, not '%s'", eviction);
    return 0;
}

/* ------------------------------------------------------------------ ABI */

int kvspec_abi_version(void) { return KVSPEC_ABI_VERSION; }

static void copy_msg(char *dst, size_t cap, const char *msg) {
    if (!dst || cap == 0) return;
    size_t n = strlen(msg);
    if (n >= cap) n = cap - 1;
    memcpy(dst, msg, n);
    dst[n] = '\0';
}

kvspec_handle *kvspec_open(const char *config_json, char *err, size_t err_len) {
    kvspec_handle *h = calloc(1, sizeof *h);
    if (!h) {
        copy_msg(err, err_len, "out of memory");
        return NULL;
    }
    uint64_t cap = 0, bs = 0, dp = 0;
    if (!config_json) {
        bad(h, "config: NULL");
    } else if (decode_config(h, config_json, &cap, &bs, &dp) == 0) {
        h->m = g1_new(cap, (uint32_t)bs, dp);
        if (h->m) {
            h->magic = HANDLE_MAGIC;
            return h;
        }
        bad(h, "out of memory");
    }
    copy_msg(err, err_len, h->err);
    jdoc_free(&h->doc);
    free(h);
    return NULL;
}

static int deliver(kvspec_handle *h, char *reply, size_t cap) {
    size_t n = h->out.len;
    if (n > (size_t)INT_MAX - 1) {
        h->poisoned = 1;
        return KVSPEC_E_INTERNAL;
    }
    if (n < cap) {
        memcpy(reply, h->out.p, n + 1);
    } else if (cap > 0) {
        reply[0] = '\0';
    }
    return (int)n;
}

int kvspec_call(kvspec_handle *h, const char *request_json, char *reply, size_t reply_cap) {
    if (!h || h->magic != HANDLE_MAGIC) return KVSPEC_E_HANDLE;
    if (h->poisoned) return KVSPEC_E_INTERNAL;
    if (!reply && reply_cap > 0) return KVSPEC_E_ARG;
    if (!request_json) return h->held ? deliver(h, reply, reply_cap) : KVSPEC_E_ARG;
    h->held = 0;
    request rq;
    if (decode_request(h, request_json, &rq)) {
        char msg[sizeof h->err + 16];
        snprintf(msg, sizeof msg, "request: %s", h->err);
        copy_msg(reply, reply_cap, msg);
        return KVSPEC_E_REQUEST;
    }
    g1_outcome o;
    int rc = 0;
    memset(&o, 0, sizeof o);
    switch (rq.kind) {
    case OP_USE: rc = g1_use_op(h->m, &rq.use, &o); break;
    case OP_DEREF: rc = g1_deref_op(h->m, &rq.deref, &o); break;
    case OP_PROMOTE: rc = g1_promote_op(h->m, &rq.promote, &o); break;
    case OP_DESTROY:
        o.rule = "DESTROY-ACTIVE";
        snprintf(o.message, sizeof o.message, "Destroy is an operation of the legacy profile only");
        break;
    case OP_PRINT:
        fputs("junk a port should not print\n", stdout);
        fflush(stdout);
        /* fall through: then answer as a reset */
    case OP_RESET:
        o.rule = "CLEAR-ALL";
        snprintf(o.message, sizeof o.message, "a prefix-cache reset is an operation of the vllm profile only");
        break;
    case OP_TICK: /* no offload tier: nothing is pending, nothing completes */
        o.has_value = 1;
        o.status = "ok";
        break;
    case OP_SWAP_IN: /* no G2 tier: nothing to swap in */
        o.has_value = 1;
        o.status = "no_hits";
        break;
    case OP_CRASH: abort();
    case OP_HANG:
        for (;;) {
        }
    case OP_BAD_REPLY:
        jb_reset(&h->out);
        jb_lit(&h->out, "{\"result\":{\"value\":1,\"status\":\"ok\"},\"counters\":{\"active_blocks\":-1,"
                        "\"active_refs\":0,\"inactive_blocks\":0,\"free_blocks\":0},\"events\":[]}");
        jb_finish(&h->out);
        h->held = 1;
        return deliver(h, reply, reply_cap);
    }
    if (rc) {
        h->poisoned = 1;
        copy_msg(reply, reply_cap, o.message);
        return KVSPEC_E_INTERNAL;
    }
    encode(h, &o);
    if (h->out.oom) {
        h->poisoned = 1;
        copy_msg(reply, reply_cap, "out of memory while encoding the reply");
        return KVSPEC_E_INTERNAL;
    }
    h->held = 1;
    return deliver(h, reply, reply_cap);
}

void kvspec_close(kvspec_handle *h) {
    if (!h || h->magic != HANDLE_MAGIC) return;
    h->magic = 0;
    g1_free(h->m);
    jdoc_free(&h->doc);
    jb_free(&h->out);
    free(h->refs);
    free(h->plhs);
    free(h->u64s);
    free(h->toks);
    free(h->tok_off);
    free(h->tok_len);
    free(h->tok_ptr);
    free(h);
}
