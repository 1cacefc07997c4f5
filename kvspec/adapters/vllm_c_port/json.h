/*
 * json.h -- a small strict JSON reader and a JSON writer, enough for the
 * kvspec messages (spec/ABI.md, spec/PROTOCOL.md version 2).
 *
 * The reader parses a whole document (RFC 8259) into a tree allocated in
 * one arena: unknown escapes, trailing commas, duplicate keys, leading
 * zeros and trailing garbage are errors. Integers are kept exactly as u64
 * when they are non-negative and written without fraction or exponent
 * (a block hash uses the whole u64 range); any other number is marked as
 * not an integer, so the caller can refuse it by name.
 */
#ifndef VLLM_C_PORT_JSON_H
#define VLLM_C_PORT_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { JV_NULL, JV_BOOL, JV_NUM, JV_STR, JV_ARR, JV_OBJ } jv_kind;

typedef struct jv jv;
struct jv {
    jv_kind kind;
    int boolean;
    int is_uint;      /* JV_NUM: a non-negative integer that fits u64 */
    uint64_t uint;    /* its value */
    const char *str;  /* JV_STR: decoded UTF-8, NUL-terminated */
    size_t len;       /* JV_STR: bytes; JV_ARR / JV_OBJ: number of items */
    size_t chars;     /* JV_STR: code points */
    jv *items;        /* JV_ARR: the items; JV_OBJ: the member values */
    const char **keys; /* JV_OBJ: the member names, parallel to items */
};

typedef struct json_doc json_doc;

/* Parse text (NUL-terminated). NULL on error, with a message in err. */
json_doc *json_parse(const char *text, char *err, size_t err_len);
const jv *json_root(const json_doc *doc);
void json_free(json_doc *doc);

/* The member named key of an object, or NULL. */
const jv *json_get(const jv *obj, const char *key);

/* ---------------------------------------------------------------- writer */

typedef struct {
    char *data;
    size_t len, cap;
    int oom; /* an allocation failed: the content is incomplete */
} jbuf;

void jb_raw(jbuf *b, const char *s);
void jb_u64(jbuf *b, uint64_t v);
void jb_str(jbuf *b, const char *s); /* a JSON string, escaped */
void jb_reset(jbuf *b);
void jb_free(jbuf *b);

#endif
