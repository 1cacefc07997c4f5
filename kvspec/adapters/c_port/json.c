/*
 * json.c -- see json.h. RFC 8259 JSON: strict about syntax (no trailing
 * commas, no comments, no NaN), strings must be valid UTF-8, escapes are
 * decoded (\uXXXX with surrogate pairs), nesting is limited so that a hostile
 * request cannot exhaust the stack.
 */
#include "json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

typedef struct {
    jdoc *d;
    const char *s;
    size_t i, n;
    int depth;
} parser;

static int fail(parser *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(p->d->err, sizeof p->d->err, "invalid JSON at byte %zu: ", p->i);
    if (k < 0 || (size_t)k >= sizeof p->d->err) k = 0;
    vsnprintf(p->d->err + k, sizeof p->d->err - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static int new_node(parser *p, uint8_t type) {
    jdoc *d = p->d;
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 256;
        if (nc > 0x7fffffff) return fail(p, "document too large");
        jnode *nn = realloc(d->nodes, nc * sizeof *nn);
        if (!nn) return fail(p, "out of memory");
        d->nodes = nn;
        d->cap = nc;
    }
    jnode *x = &d->nodes[d->n];
    memset(x, 0, sizeof *x);
    x->type = type;
    x->first = x->next = -1;
    return (int)d->n++;
}

static int str_reserve(parser *p, size_t extra) {
    jdoc *d = p->d;
    if (d->slen + extra <= d->scap) return 0;
    size_t nc = d->scap ? d->scap : 1024;
    while (nc < d->slen + extra) nc *= 2;
    if (nc > 0xffffffffu) return fail(p, "document too large");
    char *ns = realloc(d->strs, nc);
    if (!ns) return fail(p, "out of memory");
    d->strs = ns;
    d->scap = nc;
    return 0;
}

static void skip_ws(parser *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            p->i++;
        else
            break;
    }
}

static int hex4(parser *p, unsigned *out) {
    if (p->i + 4 > p->n) return fail(p, "truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i++];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return fail(p, "bad hex digit in \\u escape");
    }
    *out = v;
    return 0;
}

/* Length of the valid UTF-8 sequence starting at s[0] (0 if invalid). */
static size_t utf8_len(const unsigned char *s, size_t avail) {
    unsigned c = s[0];
    size_t n;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    if (avail < n) return 0;
    unsigned cp = c & (0xff >> (n + 1));
    for (size_t k = 1; k < n; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

static void put_utf8(char *o, size_t *k, unsigned cp) {
    if (cp < 0x80) {
        o[(*k)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*k)++] = (char)(0xc0 | (cp >> 6));
        o[(*k)++] = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xe0 | (cp >> 12));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[(*k)++] = (char)(0x80 | (cp & 0x3f));
    } else {
        o[(*k)++] = (char)(0xf0 | (cp >> 18));
        o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[(*k)++] = (char)(0x80 | (cp & 0x3f));
    }
}

/* Parse a string (p->s[p->i] == '"'); store it, return its offset. */
static int parse_string(parser *p, uint32_t *off, uint32_t *len) {
    p->i++; /* opening quote */
    size_t start = p->i;
    /* decoded text is never longer than the raw text */
    size_t end = start;
    while (end < p->n && p->s[end] != '"') end += (p->s[end] == '\\') ? 2 : 1;
    if (end >= p->n) return fail(p, "unterminated string");
    if (str_reserve(p, end - start + 1)) return -1;
    char *o = p->d->strs + p->d->slen;
    size_t k = 0;
    while (p->i < p->n) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->i++;
            o[k] = '\0';
            *off = (uint32_t)p->d->slen;
            *len = (uint32_t)k;
            p->d->slen += k + 1;
            return 0;
        }
        if (c < 0x20) return fail(p, "control character in string");
        if (c == '\\') {
            p->i++;
            if (p->i >= p->n) return fail(p, "unterminated string");
            char e = p->s[p->i++];
            switch (e) {
            case '"': o[k++] = '"'; break;
            case '\\': o[k++] = '\\'; break;
            case '/': o[k++] = '/'; break;
            case 'b': o[k++] = '\b'; break;
            case 'f': o[k++] = '\f'; break;
            case 'n': o[k++] = '\n'; break;
            case 'r': o[k++] = '\r'; break;
            case 't': o[k++] = '\t'; break;
            case 'u': {
                unsigned cp;
                if (hex4(p, &cp)) return -1;
                if (cp >= 0xdc00 && cp <= 0xdfff) return fail(p, "lone low surrogate in \\u escape");
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    unsigned lo;
                    if (p->i + 2 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
                        return fail(p, "lone high surrogate in \\u escape");
                    p->i += 2;
                    if (hex4(p, &lo)) return -1;
                    if (lo < 0xdc00 || lo > 0xdfff) return fail(p, "bad surrogate pair in \\u escape");
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                put_utf8(o, &k, cp); /* at most 4 bytes for >= 6 raw bytes */
                break;
            }
            default:
                return fail(p, "bad escape \\%c", e);
            }
            continue;
        }
        size_t u = utf8_len((const unsigned char *)p->s + p->i, p->n - p->i);
        if (u == 0) return fail(p, "invalid UTF-8 in string");
        memcpy(o + k, p->s + p->i, u);
        k += u;
        p->i += u;
    }
    return fail(p, "unterminated string");
}

static int parse_number(parser *p, int node) {
    size_t start = p->i;
    int neg = 0, is_float = 0, big = 0;
    uint64_t u = 0;
    if (p->s[p->i] == '-') {
        neg = 1;
        p->i++;
    }
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return fail(p, "bad number");
    if (p->s[p->i] == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
        return fail(p, "leading zero in number");
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        unsigned dgt = (unsigned)(p->s[p->i] - '0');
        if (u > (UINT64_MAX - dgt) / 10) big = 1;
        u = u * 10 + dgt;
        p->i++;
    }
    if (p->i < p->n && p->s[p->i] == '.') {
        is_float = 1;
        p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return fail(p, "bad fraction");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        is_float = 1;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return fail(p, "bad exponent");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    jnode *x = &p->d->nodes[node];
    if (is_float) {
        char tmp[64];
        size_t L = p->i - start;
        char *heap = NULL, *buf = tmp;
        if (L >= sizeof tmp) {
            heap = malloc(L + 1);
            if (!heap) return fail(p, "out of memory");
            buf = heap;
        }
        memcpy(buf, p->s + start, L);
        buf[L] = '\0';
        errno = 0;
        x->type = JN_FLOAT;
        x->v.d = strtod(buf, NULL);
        free(heap);
    } else if (neg) {
        x->type = JN_NEGINT;
    } else if (big) {
        x->type = JN_BIGINT;
    } else {
        x->type = JN_UINT;
        x->v.u = u;
    }
    return 0;
}

static int parse_value(parser *p, int *out);

static int parse_container(parser *p, int node, int is_obj) {
    char close = is_obj ? '}' : ']';
    p->i++;
    if (++p->depth > JSON_MAX_DEPTH) return fail(p, "nesting deeper than %d", JSON_MAX_DEPTH);
    skip_ws(p);
    int last = -1;
    uint32_t count = 0;
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        p->depth--;
        return 0;
    }
    for (;;) {
        uint32_t koff = 0, klen = 0;
        skip_ws(p);
        if (is_obj) {
            if (p->i >= p->n || p->s[p->i] != '"') return fail(p, "expected a member name");
            if (parse_string(p, &koff, &klen)) return -1;
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') return fail(p, "expected ':'");
            p->i++;
        }
        int child;
        if (parse_value(p, &child)) return -1;
        jnode *c = &p->d->nodes[child];
        c->key = koff;
        c->key_len = klen;
        if (last < 0)
            p->d->nodes[node].first = child;
        else
            p->d->nodes[last].next = child;
        last = child;
        count++;
        skip_ws(p);
        if (p->i >= p->n) return fail(p, "unterminated %s", is_obj ? "object" : "array");
        if (p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->s[p->i] == close) {
            p->i++;
            break;
        }
        return fail(p, "expected ',' or '%c'", close);
    }
    p->d->nodes[node].len = count;
    p->depth--;
    return 0;
}

static int lit(parser *p, const char *word) {
    size_t L = strlen(word);
    if (p->i + L > p->n || memcmp(p->s + p->i, word, L) != 0) return fail(p, "unexpected character");
    p->i += L;
    return 0;
}

static int parse_value(parser *p, int *out) {
    skip_ws(p);
    if (p->i >= p->n) return fail(p, "unexpected end of input");
    char c = p->s[p->i];
    int node;
    switch (c) {
    case '{':
    case '[':
        if ((node = new_node(p, c == '{' ? JN_OBJECT : JN_ARRAY)) < 0) return -1;
        *out = node;
        return parse_container(p, node, c == '{');
    case '"': {
        uint32_t off, len;
        if ((node = new_node(p, JN_STRING)) < 0) return -1;
        if (parse_string(p, &off, &len)) return -1;
        p->d->nodes[node].v.str = off;
        p->d->nodes[node].len = len;
        *out = node;
        return 0;
    }
    case 't':
        if ((node = new_node(p, JN_TRUE)) < 0) return -1;
        *out = node;
        return lit(p, "true");
    case 'f':
        if ((node = new_node(p, JN_FALSE)) < 0) return -1;
        *out = node;
        return lit(p, "false");
    case 'n':
        if ((node = new_node(p, JN_NULL)) < 0) return -1;
        *out = node;
        return lit(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            if ((node = new_node(p, JN_UINT)) < 0) return -1;
            *out = node;
            return parse_number(p, node);
        }
        return fail(p, "unexpected character '%c'", (c >= 0x20 && c < 0x7f) ? c : '?');
    }
}

int jdoc_parse(jdoc *d, const char *text, size_t len) {
    parser p = {d, text, 0, len, 0};
    d->n = 0;
    d->slen = 0;
    d->err[0] = '\0';
    int root;
    if (parse_value(&p, &root)) return -1;
    skip_ws(&p);
    if (p.i != p.n) return fail(&p, "trailing characters after the value");
    return root;
}

void jdoc_free(jdoc *d) {
    free(d->nodes);
    free(d->strs);
    memset(d, 0, sizeof *d);
}

/* ------------------------------------------------------------------ writer */

static int jb_grow(jbuf *b, size_t extra) {
    if (b->oom) return -1;
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < b->len + extra + 1) nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) {
        b->oom = 1;
        return -1;
    }
    b->p = np;
    b->cap = nc;
    return 0;
}

void jb_reset(jbuf *b) {
    b->len = 0;
    b->oom = 0;
}

void jb_free(jbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void jb_raw(jbuf *b, const char *s, size_t n) {
    if (jb_grow(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

void jb_lit(jbuf *b, const char *s) { jb_raw(b, s, strlen(s)); }

void jb_u64(jbuf *b, uint64_t v) {
    char tmp[24];
    int k = sizeof tmp;
    do {
        tmp[--k] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    jb_raw(b, tmp + k, sizeof tmp - (size_t)k);
}

void jb_str(jbuf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    if (jb_grow(b, n + 2)) return;
    b->p[b->len++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            jb_raw(b, e, 2);
        } else if (c < 0x20) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            jb_raw(b, e, 6);
        } else if (c >= 0x80) {
            /* pass valid UTF-8 through, replace anything else with U+FFFD */
            size_t u = utf8_len((const unsigned char *)s + i, n - i);
            if (u == 0) {
                jb_raw(b, "\\ufffd", 6);
            } else {
                jb_raw(b, s + i, u);
                i += u - 1;
            }
        } else {
            jb_raw(b, (const char *)&c, 1);
        }
    }
    jb_raw(b, "\"", 1);
}

void jb_finish(jbuf *b) {
    if (jb_grow(b, 0)) return;
    b->p[b->len] = '\0';
}
