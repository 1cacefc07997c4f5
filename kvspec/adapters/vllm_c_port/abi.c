/*
 * abi.c -- the kvspec C ABI (spec/kvspec_abi.h, version 2) of the vllm_c_port.
 *
 * This port has a request level only: kvspec_open refuses (there are no
 * block operations), kvspec_open_engine opens an engine, and kvspec_call
 * takes the request-level operations of spec/ABI.md section 6. Replies are
 * kept in the handle, so a reply that does not fit the caller's buffer is
 * handed out by the next call with request_json == NULL.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kvspec_abi.h"

#define MAGIC 0x766c6c6d70727431ull /* "vllmprt1": catches (best effort) a closed handle */

struct kvspec_handle {
    uint64_t magic;
    engine *engine;
    jbuf reply;
    int held;     /* reply holds the last call's reply */
    int poisoned; /* an internal error: every later call fails */
};

static void put_err(char *err, size_t err_len, const char *msg) {
    if (err != NULL && err_len > 0) snprintf(err, err_len, "%s", msg);
}

int kvspec_abi_version(void) { return KVSPEC_ABI_VERSION; }

kvspec_handle *kvspec_open(const char *config_json, char *err, size_t err_len) {
    (void)config_json;
    put_err(err, err_len,
            "the vllm_c_port has a request level only (no block operations): open it with kvspec_open_engine "
            "(ABI version 2)");
    return NULL;
}

kvspec_handle *kvspec_open_engine(const char *config_json, const char *engine_json, char *err, size_t err_len) {
    char msg[512];
    if (config_json == NULL || engine_json == NULL) {
        put_err(err, err_len, "config_json and engine_json must not be NULL");
        return NULL;
    }
    engine *e = engine_open(config_json, engine_json, msg, sizeof msg);
    if (e == NULL) {
        put_err(err, err_len, msg);
        return NULL;
    }
    kvspec_handle *h = calloc(1, sizeof *h);
    if (h == NULL) {
        engine_close(e);
        put_err(err, err_len, "out of memory");
        return NULL;
    }
    h->magic = MAGIC;
    h->engine = e;
    return h;
}

static int deliver(kvspec_handle *h, char *reply, size_t reply_cap) {
    size_t n = h->reply.len;
    if (n > 0x7fffffff) return KVSPEC_E_INTERNAL;
    if (reply != NULL && n < reply_cap) memcpy(reply, h->reply.data, n + 1);
    return (int)n;
}

int kvspec_call(kvspec_handle *h, const char *request_json, char *reply, size_t reply_cap) {
    char err[512];
    if (h == NULL || h->magic != MAGIC) return KVSPEC_E_HANDLE;
    if (reply == NULL && reply_cap > 0) return KVSPEC_E_ARG;
    if (h->poisoned) return KVSPEC_E_INTERNAL;
    if (request_json == NULL) return h->held ? deliver(h, reply, reply_cap) : KVSPEC_E_ARG;
    h->held = 0;
    int rc = engine_call(h->engine, request_json, &h->reply, err, sizeof err);
    if (rc == -1) {
        if (reply != NULL && reply_cap > 0) snprintf(reply, reply_cap, "%s", err);
        return KVSPEC_E_REQUEST;
    }
    if (rc != 0) {
        h->poisoned = 1;
        if (reply != NULL && reply_cap > 0) snprintf(reply, reply_cap, "%s", err);
        return KVSPEC_E_INTERNAL;
    }
    h->held = 1;
    return deliver(h, reply, reply_cap);
}

void kvspec_close(kvspec_handle *h) {
    if (h == NULL || h->magic != MAGIC) return;
    h->magic = 0;
    engine_close(h->engine);
    jb_free(&h->reply);
    free(h);
}
