/*
 * engine.h -- a request-level engine over the vLLM-style pool: requests are
 * added with their token ids, then run by scheduler steps (protocol and C ABI
 * version 2, spec/PROTOCOL.md section 9, spec/ABI.md section 6).
 */
#ifndef VLLM_C_PORT_ENGINE_H
#define VLLM_C_PORT_ENGINE_H

#include <stddef.h>

#include "json.h"

typedef struct engine engine;

/* Open an engine from a ManagerConfig and an EngineConfig (JSON). NULL with a
 * message naming the field when the configuration is invalid or not one this
 * port runs. */
engine *engine_open(const char *config_json, const char *engine_json, char *err, size_t err_len);

/* Apply one request-level operation (JSON) and write its EngineOutcome into
 * reply. Returns 0 on success; -1 when the request is not valid (nothing
 * changed, message in err); -4 when the engine broke (out of memory or an
 * invariant; message in err): the caller poisons the handle. */
int engine_call(engine *e, const char *request_json, jbuf *reply, char *err, size_t err_len);

void engine_close(engine *e);

#endif
