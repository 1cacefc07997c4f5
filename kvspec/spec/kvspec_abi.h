/*
 * kvspec_abi.h -- the C ABI a KV-cache block manager exposes to kvspec.
 *
 * ABI version 2 (version 1 plus request-level sessions). See spec/ABI.md
 * for the walkthrough.
 *
 * WHY JSON over a C ABI: the conformance suite drives the implementation with
 * the same wire messages it uses everywhere else (spec/wire.py, JSON Schemas
 * in spec/schema/), so a port needs exactly four functions and no struct
 * layouts that could drift between languages or compilers.
 *
 * Messages (all UTF-8 JSON text, NUL-terminated):
 *   - config  (kvspec_open):  a ManagerConfig   (spec/schema/manager_config.json)
 *   - request (kvspec_call):  one Operation     (spec/schema/operation.json),
 *                             e.g. {"op":"use","blocks":[{"full":7}],"plhs":[...]}
 *   - reply   (kvspec_call):  one StepOutcome   (spec/schema/step_outcome.json):
 *                             result or error (rule id + message), the
 *                             counters after the operation, the events it
 *                             published in order.
 *   Version 2, request-level sessions (a handle from kvspec_open_engine):
 *   - engine  (kvspec_open_engine): an EngineConfig (spec/schema/engine_config.json)
 *   - request (kvspec_call):  one request-level operation
 *                             (spec/schema/engine_operation.json), e.g.
 *                             {"op":"add_request","request_id":"r0","prompt":[1,2,3],"max_tokens":4}
 *                             or {"op":"step"}
 *   - reply   (kvspec_call):  one EngineOutcome (spec/schema/engine_outcome.json):
 *                             the requests that finished, how many are running
 *                             and waiting, the counters, the events published.
 *   Integers that are hashes are unsigned 64-bit and must round-trip exactly:
 *   parse them as u64, never through a double.
 *
 * Ownership: every buffer is owned by the caller. The library never keeps a
 * pointer to config_json, request_json, err or reply after the call returns,
 * and never returns memory the caller must free. The handle is owned by the
 * library; release it with kvspec_close exactly once.
 *
 * Thread safety: none. A handle must not be used from two threads at once
 * (the caller serialises calls). Distinct handles share no state and may be
 * used from distinct threads.
 *
 * Atomicity: an operation the spec rejects (a typed error in the reply, e.g.
 * rule "USE-VALIDATE") and a request that does not parse (KVSPEC_E_REQUEST)
 * leave the manager's state exactly as it was and publish no event.
 */
#ifndef KVSPEC_ABI_H
#define KVSPEC_ABI_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this header describes; kvspec_abi_version() must return
 * the version the library implements. Version 2 is version 1 plus the
 * optional kvspec_open_engine (a library without a request level may
 * return 2 and not export it). A library written for version 1 keeps
 * working unchanged; building it with -DKVSPEC_ABI_VERSION=1 pins it. */
#ifndef KVSPEC_ABI_VERSION
#define KVSPEC_ABI_VERSION 2
#endif

/* Return codes of kvspec_call (negative; a non-negative value is a length). */
#define KVSPEC_E_REQUEST (-1)  /* request is not JSON or not an Operation; state untouched;
                                  reply holds a message naming the field (truncated to fit) */
#define KVSPEC_E_HANDLE (-2)   /* handle is NULL (or, detected on a best-effort basis, closed) */
#define KVSPEC_E_ARG (-3)      /* bad arguments: reply NULL, or request NULL with no held reply */
#define KVSPEC_E_INTERNAL (-4) /* out of memory or an internal invariant broke; the handle is
                                  poisoned (every later call returns KVSPEC_E_INTERNAL) */

/* Opaque manager handle. */
typedef struct kvspec_handle kvspec_handle;

/* The ABI version the library implements (KVSPEC_ABI_VERSION of its build).
 * The caller refuses a library whose version it does not know. */
int kvspec_abi_version(void);

/* Open one manager configured by config_json (a ManagerConfig).
 * Returns a handle, or NULL when the configuration is not valid or not
 * supported by this implementation (e.g. a profile or eviction policy it does
 * not have); then err (if not NULL and err_len > 0) holds a NUL-terminated
 * message, truncated to err_len - 1 bytes. */
kvspec_handle *kvspec_open(const char *config_json, char *err, size_t err_len);

/* Version 2, optional (export it only if the library has a request level):
 * open one request-level engine. config_json is the ManagerConfig of its
 * device pool (profile "vllm"), engine_json an EngineConfig (the host tier:
 * {"host_blocks": N} or {"host_blocks": null}). kvspec_call on the handle
 * then takes request-level operations and writes EngineOutcome replies,
 * with the same return codes and the same "too small" protocol; a block
 * operation on it is KVSPEC_E_REQUEST. Returns NULL with a message in err,
 * as kvspec_open does, when the configuration is not valid or not supported. */
kvspec_handle *kvspec_open_engine(const char *config_json, const char *engine_json, char *err, size_t err_len);

/* Apply one operation and write its StepOutcome into reply.
 *
 * Return value, like snprintf:
 *   n >= 0 and n < reply_cap : success; reply holds the n-byte reply and a NUL.
 *   n >= reply_cap           : the operation WAS applied, but its reply (n bytes
 *                              plus NUL) does not fit; nothing useful is in
 *                              reply. The library holds the reply: call again
 *                              with request_json == NULL and a buffer of at
 *                              least n + 1 bytes to fetch it. Do NOT resend
 *                              the request (it would be applied twice).
 *   n < 0                    : one of the KVSPEC_E_* codes above.
 *
 * request_json == NULL fetches the held reply of the last call (and returns
 * KVSPEC_E_ARG when there is none). The held reply is kept until the next
 * call with a request. */
int kvspec_call(kvspec_handle *handle, const char *request_json, char *reply, size_t reply_cap);

/* Release the manager. NULL is a no-op. The handle is invalid afterwards. */
void kvspec_close(kvspec_handle *handle);

#ifdef __cplusplus
}
#endif

#endif /* KVSPEC_ABI_H */
