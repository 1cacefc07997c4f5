/*
 * json.h -- a small, dependency-free JSON reader (into a flat node array)
 * and writer (into a growable buffer) for the kvspec C port.
 *
 * WHY hand-written: the port is the model of "a KV manager in another
 * language" and must build with nothing but a C11 compiler. WHY integers are
 * kept as unsigned 64-bit: block hashes use the whole u64 range and a double
 * would silently round them.
 */
#ifndef KVSPEC_PORT_JSON_H
#define KVSPEC_PORT_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    JN_NULL,
    JN_FALSE,
    JN_TRUE,
    JN_UINT,   /* non-negative integer that fits in u64: v.u */
    JN_NEGINT, /* negative integer (magnitude not kept) */
    JN_BIGINT, /* integer beyond u64 */
    JN_FLOAT,  /* number with a fraction or exponent: v.d */
    JN_STRING, /* v.str = offset into jdoc.strs, len = bytes (NUL-terminated too) */
    JN_ARRAY,  /* len = number of children */
    JN_OBJECT  /* len = number of members; each child has key/key_len */
} jtype;

typedef struct {
    uint8_t type;
    uint32_t len;
    uint32_t key;     /* object member: offset of its key in jdoc.strs */
    uint32_t key_len;
    int32_t first;    /* first child, -1 if none */
    int32_t next;     /* next sibling, -1 if none */
    union {
        uint64_t u;
        double d;
        uint32_t str;
    } v;
} jnode;

typedef struct {
    jnode *nodes;
    size_t n, cap;
    char *strs; /* decoded strings and keys, each NUL-terminated */
    size_t slen, scap;
    char err[200];
} jdoc;

/* Parse text[0..len) into d (reusing its buffers). Returns the root node
 * index (0), or -1 with a message in d->err. */
int jdoc_parse(jdoc *d, const char *text, size_t len);
void jdoc_free(jdoc *d);

static inline const char *jdoc_str(const jdoc *d, uint32_t off) { return d->strs + off; }

/* A growable output buffer. On allocation failure `oom` is set and further
 * writes are dropped. */
typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} jbuf;

void jb_reset(jbuf *b);
void jb_free(jbuf *b);
void jb_raw(jbuf *b, const char *s, size_t n);
void jb_lit(jbuf *b, const char *s); /* NUL-terminated literal, unescaped */
void jb_u64(jbuf *b, uint64_t v);
void jb_str(jbuf *b, const char *s, size_t n); /* quoted and escaped */
/* NUL-terminate without counting the NUL in len. */
void jb_finish(jbuf *b);

#endif
