/* json.c -- strict JSON reader into an arena, and an appending writer (see json.h). */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

/* ------------------------------------------------------------------ arena */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

struct json_doc {
    chunk *chunks;
    jv root;
};

static void *arena_alloc(json_doc *d, size_t size) {
    size = (size + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    chunk *c = d->chunks;
    if (c == NULL || c->cap - c->used < size) {
        size_t cap = size > 65536 ? size : 65536;
        c = malloc(sizeof(chunk) + cap);
        if (c == NULL) return NULL;
        c->next = d->chunks;
        c->used = 0;
        c->cap = cap;
        d->chunks = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += size;
    return p;
}

void json_free(json_doc *doc) {
    if (doc == NULL) return;
    chunk *c = doc->chunks;
    while (c != NULL) {
        chunk *next = c->next;
        free(c);
        c = next;
    }
    free(doc);
}

const jv *json_root(const json_doc *doc) { return &doc->root; }

/* ----------------------------------------------------------------- parser */

typedef struct {
    const char *p;
    const char *start;
    json_doc *doc;
    char *err;
    size_t err_len;
    int failed;
} parser;

static void fail(parser *ps, const char *fmt, ...) {
    if (ps->failed) return;
    ps->failed = 1;
    if (ps->err == NULL || ps->err_len == 0) return;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(ps->err, ps->err_len, "not valid JSON: %s at offset %zu", msg, (size_t)(ps->p - ps->start));
}

static void skip_ws(parser *ps) {
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r') ps->p++;
}

static int parse_value(parser *ps, jv *out, int depth);

static int hex4(parser *ps, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = ps->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else {
            fail(ps, "bad \\u escape");
            return 0;
        }
    }
    ps->p += 4;
    *out = v;
    return 1;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string at ps->p (on the opening quote): decoded into the arena. */
static int parse_string(parser *ps, const char **out, size_t *len, size_t *chars) {
    ps->p++;
    const char *q = ps->p;
    size_t raw = 0;
    while (q[raw] != '"') { /* an upper bound of the decoded size */
        if (q[raw] == '\0') {
            fail(ps, "unterminated string");
            return 0;
        }
        if (q[raw] == '\\' && q[raw + 1] != '\0') raw++;
        raw++;
    }
    char *o = arena_alloc(ps->doc, raw + 1);
    if (o == NULL) {
        fail(ps, "out of memory");
        return 0;
    }
    size_t n = 0, cps = 0;
    while (*ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p;
        if (c < 0x20) {
            fail(ps, "control character in string");
            return 0;
        }
        if (c != '\\') {
            o[n++] = (char)c;
            if ((c & 0xC0) != 0x80) cps++;
            ps->p++;
            continue;
        }
        ps->p++;
        char e = *ps->p++;
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (!hex4(ps, &cp)) return 0;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
                unsigned lo;
                if (ps->p[0] != '\\' || ps->p[1] != 'u') {
                    fail(ps, "lone surrogate in \\u escape");
                    return 0;
                }
                ps->p += 2;
                if (!hex4(ps, &lo)) return 0;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    fail(ps, "bad surrogate pair in \\u escape");
                    return 0;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail(ps, "lone surrogate in \\u escape");
                return 0;
            } else if (cp == 0) {
                fail(ps, "NUL character in string");
                return 0;
            }
            n += put_utf8(o + n, cp);
            break;
        }
        default:
            fail(ps, "unknown escape");
            return 0;
        }
        cps++;
    }
    ps->p++;
    o[n] = '\0';
    *out = o;
    *len = n;
    *chars = cps;
    return 1;
}

static int parse_number(parser *ps, jv *out) {
    const char *s = ps->p;
    int neg = 0, integral = 1, overflow = 0;
    uint64_t v = 0;
    if (*s == '-') {
        neg = 1;
        s++;
    }
    if (*s == '0') {
        s++;
        if (*s >= '0' && *s <= '9') {
            fail(ps, "leading zero in number");
            return 0;
        }
    } else if (*s >= '1' && *s <= '9') {
        while (*s >= '0' && *s <= '9') {
            unsigned d = (unsigned)(*s - '0');
            if (v > (UINT64_MAX - d) / 10) overflow = 1;
            v = v * 10 + d;
            s++;
        }
    } else {
        fail(ps, "bad number");
        return 0;
    }
    if (*s == '.') {
        integral = 0;
        s++;
        if (!(*s >= '0' && *s <= '9')) {
            fail(ps, "bad fraction");
            return 0;
        }
        while (*s >= '0' && *s <= '9') s++;
    }
    if (*s == 'e' || *s == 'E') {
        integral = 0;
        s++;
        if (*s == '+' || *s == '-') s++;
        if (!(*s >= '0' && *s <= '9')) {
            fail(ps, "bad exponent");
            return 0;
        }
        while (*s >= '0' && *s <= '9') s++;
    }
    ps->p = s;
    out->kind = JV_NUM;
    out->is_uint = integral && !overflow && !(neg && v != 0);
    out->uint = out->is_uint ? v : 0;
    return 1;
}

static int literal(parser *ps, const char *word) {
    size_t n = strlen(word);
    if (strncmp(ps->p, word, n) != 0) {
        fail(ps, "unexpected character '%c'", *ps->p ? *ps->p : '?');
        return 0;
    }
    ps->p += n;
    return 1;
}

/* Items are collected in a growing heap array, then moved into the arena. */
static int parse_container(parser *ps, jv *out, int depth, int is_obj) {
    if (depth > MAX_DEPTH) {
        fail(ps, "nesting deeper than %d", MAX_DEPTH);
        return 0;
    }
    char close = is_obj ? '}' : ']';
    ps->p++;
    size_t n = 0, cap = 0;
    jv *items = NULL;
    const char **keys = NULL;
    int ok = 1;
    skip_ws(ps);
    if (*ps->p == close) {
        ps->p++;
    } else {
        for (;;) {
            if (n == cap) {
                cap = cap ? 2 * cap : 8;
                jv *ni = realloc(items, cap * sizeof *ni);
                const char **nk = is_obj ? realloc(keys, cap * sizeof *nk) : NULL;
                if (ni != NULL) items = ni;
                if (nk != NULL) keys = nk;
                if (ni == NULL || (is_obj && nk == NULL)) {
                    fail(ps, "out of memory");
                    ok = 0;
                    break;
                }
            }
            skip_ws(ps);
            if (is_obj) {
                size_t klen, kchars;
                if (*ps->p != '"') {
                    fail(ps, "expected a member name");
                    ok = 0;
                    break;
                }
                if (!parse_string(ps, &keys[n], &klen, &kchars)) {
                    ok = 0;
                    break;
                }
                for (size_t i = 0; i < n; i++) {
                    if (strcmp(keys[i], keys[n]) == 0) {
                        fail(ps, "duplicate member \"%s\"", keys[n]);
                        ok = 0;
                        break;
                    }
                }
                if (!ok) break;
                skip_ws(ps);
                if (*ps->p != ':') {
                    fail(ps, "expected ':'");
                    ok = 0;
                    break;
                }
                ps->p++;
            }
            memset(&items[n], 0, sizeof items[n]);
            if (!parse_value(ps, &items[n], depth + 1)) {
                ok = 0;
                break;
            }
            n++;
            skip_ws(ps);
            if (*ps->p == ',') {
                ps->p++;
                continue;
            }
            if (*ps->p == close) {
                ps->p++;
                break;
            }
            fail(ps, "expected ',' or '%c'", close);
            ok = 0;
            break;
        }
    }
    if (ok) {
        out->kind = is_obj ? JV_OBJ : JV_ARR;
        out->len = n;
        out->items = n ? arena_alloc(ps->doc, n * sizeof *items) : NULL;
        out->keys = (is_obj && n) ? arena_alloc(ps->doc, n * sizeof *keys) : NULL;
        if (n && (out->items == NULL || (is_obj && out->keys == NULL))) {
            fail(ps, "out of memory");
            ok = 0;
        } else if (n) {
            memcpy(out->items, items, n * sizeof *items);
            if (is_obj) memcpy(out->keys, keys, n * sizeof *keys);
        }
    }
    free(items);
    free(keys);
    return ok;
}

static int parse_value(parser *ps, jv *out, int depth) {
    skip_ws(ps);
    switch (*ps->p) {
    case '{': return parse_container(ps, out, depth, 1);
    case '[': return parse_container(ps, out, depth, 0);
    case '"':
        out->kind = JV_STR;
        return parse_string(ps, &out->str, &out->len, &out->chars);
    case 't':
        out->kind = JV_BOOL;
        out->boolean = 1;
        return literal(ps, "true");
    case 'f':
        out->kind = JV_BOOL;
        out->boolean = 0;
        return literal(ps, "false");
    case 'n':
        out->kind = JV_NULL;
        return literal(ps, "null");
    case '\0': fail(ps, "unexpected end of input"); return 0;
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) return parse_number(ps, out);
        fail(ps, "unexpected character '%c'", *ps->p);
        return 0;
    }
}

json_doc *json_parse(const char *text, char *err, size_t err_len) {
    json_doc *doc = calloc(1, sizeof *doc);
    if (doc == NULL) {
        if (err && err_len) snprintf(err, err_len, "out of memory");
        return NULL;
    }
    parser ps = {text, text, doc, err, err_len, 0};
    if (parse_value(&ps, &doc->root, 0)) {
        skip_ws(&ps);
        if (*ps.p != '\0') fail(&ps, "trailing characters after the document");
    }
    if (ps.failed) {
        json_free(doc);
        return NULL;
    }
    return doc;
}

const jv *json_get(const jv *obj, const char *key) {
    if (obj == NULL || obj->kind != JV_OBJ) return NULL;
    for (size_t i = 0; i < obj->len; i++)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

/* ----------------------------------------------------------------- writer */

static int jb_grow(jbuf *b, size_t extra) {
    if (b->oom) return 0;
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (d == NULL) {
        b->oom = 1;
        return 0;
    }
    b->data = d;
    b->cap = cap;
    return 1;
}

static void jb_bytes(jbuf *b, const char *s, size_t n) {
    if (!jb_grow(b, n)) return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void jb_raw(jbuf *b, const char *s) { jb_bytes(b, s, strlen(s)); }

void jb_u64(jbuf *b, uint64_t v) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    jb_bytes(b, tmp, (size_t)n);
}

void jb_str(jbuf *b, const char *s) {
    jb_bytes(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char tmp[8];
        if (*p == '"' || *p == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)*p;
            jb_bytes(b, tmp, 2);
        } else if (*p < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", *p);
            jb_bytes(b, tmp, 6);
        } else {
            jb_bytes(b, (const char *)p, 1);
        }
    }
    jb_bytes(b, "\"", 1);
}

void jb_reset(jbuf *b) {
    b->len = 0;
    b->oom = 0;
    if (b->data) b->data[0] = '\0';
}

void jb_free(jbuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
