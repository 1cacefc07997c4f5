/* The per-block work of check-log's fused Dynamo reader, in C.
 *
 * Two functions with exactly the semantics of formats._fused_stored and
 * formats._fused_removed (the Python versions stay the reference and the
 * fall-back when no C compiler is available): they work on the router view's
 * own dicts (live: hash -> (copies, parent, event id, index); kids: parent ->
 * count; recent: hash -> (event id, index)), so the view's reference methods
 * see the same state whichever path applied an event. Each either applies a
 * clean event and returns true, or returns false with the dicts untouched,
 * for the reference path to apply and report the event.
 *
 * The raw reader (lines(), text()) also works on a tier held in the C block
 * tables below (LiveTable, KidsTable: the same contents as those dicts).
 *
 * Built by fastview.py with the machine's C compiler at first use (cached);
 * tests/test_check_log_fused.py runs it beside the reference path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

static PyObject *s_block_hash, *s_tokens_hash, *one;

/* A field read from its slot: msgspec structs and slotted dataclasses keep
 * each field in a member slot at a fixed offset, so after the first lookup
 * per call site (cached with a reference to the type) a read is one load
 * instead of a generic attribute lookup. Anything else, or an unset slot,
 * goes through PyObject_GetAttr. Returns a new reference, NULL on error. */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t offset;
} slot_cache;

static PyObject *getf(PyObject *obj, PyObject *name, slot_cache *c) {
    PyTypeObject *t = Py_TYPE(obj);
    if (c->type != t) {
        c->offset = -1;
        PyObject *d = _PyType_Lookup(t, name); /* borrowed */
        if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX || m->type == T_OBJECT) c->offset = m->offset;
        }
        Py_INCREF(t);
        Py_XDECREF(c->type);
        c->type = t;
    }
    if (c->offset >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + c->offset);
        if (v != NULL) return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, name);
}

#define GETF(obj, name)                      \
    ({                                       \
        static slot_cache cache_ = {NULL, -1}; \
        getf((obj), (name), &cache_);        \
    })

#ifdef __SIZEOF_INT128__
/* XXH3-64 of 16 bytes (two little-endian u64: a, b) with a seed: the
 * algorithm's 9-16 byte case. The two constants are words 3 ^ 4 and 5 ^ 6
 * of XXH3's default secret; tests compare it with the xxhash package. */
static uint64_t xxh3_16(uint64_t a, uint64_t b, uint64_t seed) {
    uint64_t lo = a ^ (0x6782737bea4239b9ULL + seed);
    uint64_t hi = b ^ (0xaf56bc3b0996523aULL - seed);
    unsigned __int128 p = (unsigned __int128)lo * hi;
    uint64_t acc = 16 + __builtin_bswap64(lo) + hi + ((uint64_t)p ^ (uint64_t)(p >> 64));
    acc ^= acc >> 37;
    acc *= 0x165667919E3779F9ULL;
    return acc ^ (acc >> 32);
}
#define HAVE_XXH3_16 1
#else
#define HAVE_XXH3_16 0
#endif

/* kids[key] += 1 */
static int kids_inc(PyObject *kids, PyObject *key) {
    PyObject *k = PyDict_GetItemWithError(kids, key);
    if (k == NULL) {
        if (PyErr_Occurred()) return -1;
        return PyDict_SetItem(kids, key, one);
    }
    PyObject *n = PyNumber_Add(k, one);
    if (n == NULL) return -1;
    int r = PyDict_SetItem(kids, key, n);
    Py_DECREF(n);
    return r;
}

/* kids[key] -= 1, deleting it at zero (a missing or zero count is left as the
 * reference leaves it: untouched) */
static int kids_dec(PyObject *kids, PyObject *key) {
    PyObject *k = PyDict_GetItemWithError(kids, key);
    if (k == NULL) return PyErr_Occurred() ? -1 : 0;
    long v = PyLong_AsLong(k);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v == 1) return PyDict_DelItem(kids, key);
    if (v == 0) return 0;
    PyObject *n = PyLong_FromLong(v - 1);
    if (n == NULL) return -1;
    int r = PyDict_SetItem(kids, key, n);
    Py_DECREF(n);
    return r;
}

/* value as u64; 0 with *ok = 0 when it is not an int in [0, 2**64) */
static uint64_t as_u64(PyObject *v, int *ok) {
    uint64_t x = PyLong_AsUnsignedLongLong(v);
    if (x == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
        return 0;
    }
    *ok = 1;
    return x;
}

/* stored(live, kids, parent, blocks, eid, index, anchored, chain, xxh, seed) -> bool
 * parent: int or None; blocks: list of StoredBlockMsg; anchored: the parent
 * must be stored in this tier; chain: check the Dynamo hash chain with
 * xxh(bytes, seed) (xxhash.xxh3_64_intdigest). */
static PyObject *stored_core(PyObject *live, PyObject *kids, PyObject *parent, PyObject *blocks, PyObject *eid,
                             PyObject *index, int anchored, int chain, PyObject *xxh, PyObject *seed) {
    if (!PyDict_CheckExact(live) || !PyDict_CheckExact(kids) || !PyList_CheckExact(blocks)) {
        PyErr_SetString(PyExc_TypeError, "stored(): live and kids must be dicts, blocks a list");
        return NULL;
    }
    int ok;
    uint64_t prev_u = 0;
    if (parent != Py_None) {
        prev_u = as_u64(parent, &ok);
        if (!ok) Py_RETURN_FALSE;
        if (anchored) {
            int c = PyDict_Contains(live, parent);
            if (c < 0) return NULL;
            if (!c) Py_RETURN_FALSE;
        }
    }
    Py_ssize_t n = PyList_GET_SIZE(blocks);
    if (n == 0) Py_RETURN_FALSE;
    int seed_ok = 0;
    uint64_t seed_u = chain && PyLong_CheckExact(seed) ? as_u64(seed, &seed_ok) : 0;
    Py_ssize_t done = 0;
    PyObject *prev = parent;
    int clean = 1;
    for (Py_ssize_t i = 0; i < n && clean; i++) {
        PyObject *b = PyList_GET_ITEM(blocks, i);
        PyObject *h = GETF(b, s_block_hash);
        if (h == NULL) goto error;
        PyObject *th = GETF(b, s_tokens_hash);
        if (th == NULL) {
            Py_DECREF(h);
            goto error;
        }
        int hok, thok;
        uint64_t hu = as_u64(h, &hok), thu = as_u64(th, &thok);
        if (!hok || !thok) {
            clean = 0;
        } else if (chain) {
            if (prev == Py_None) {
                clean = hu == thu;
            } else if (HAVE_XXH3_16 && seed_ok) {
#if HAVE_XXH3_16
                clean = xxh3_16(prev_u, thu, seed_u) == hu;
#endif
            } else {
                unsigned char buf[16];
                for (int k = 0; k < 8; k++) {
                    buf[k] = (unsigned char)(prev_u >> (8 * k));
                    buf[8 + k] = (unsigned char)(thu >> (8 * k));
                }
                PyObject *bytes = PyBytes_FromStringAndSize((const char *)buf, 16);
                if (bytes == NULL) {
                    Py_DECREF(h);
                    Py_DECREF(th);
                    goto error;
                }
                PyObject *cargs[2] = {bytes, seed};
                PyObject *want = PyObject_Vectorcall(xxh, cargs, 2, NULL);
                Py_DECREF(bytes);
                if (want == NULL) {
                    Py_DECREF(h);
                    Py_DECREF(th);
                    goto error;
                }
                int wok;
                uint64_t wu = as_u64(want, &wok);
                Py_DECREF(want);
                clean = wok && wu == hu;
            }
        }
        Py_DECREF(th);
        if (clean) {
            int c = PyDict_Contains(live, h);
            if (c < 0) {
                Py_DECREF(h);
                goto error;
            }
            clean = !c;
        }
        if (!clean) {
            Py_DECREF(h);
            break;
        }
        PyObject *rec = PyTuple_Pack(4, one, prev, eid, index);
        if (rec == NULL || PyDict_SetItem(live, h, rec) < 0 || (prev != Py_None && kids_inc(kids, prev) < 0)) {
            Py_XDECREF(rec);
            Py_DECREF(h);
            goto error;
        }
        Py_DECREF(rec);
        done++;
        prev = h; /* borrowed from here on: live holds a reference */
        Py_DECREF(h);
        prev_u = hu;
    }
    if (clean) Py_RETURN_TRUE;
    /* roll back the blocks inserted, in order, as the Python version does */
    prev = parent;
    int own = 0; /* whether prev is a reference this loop holds */
    for (Py_ssize_t i = 0; i < done; i++) {
        PyObject *b = PyList_GET_ITEM(blocks, i);
        PyObject *h = GETF(b, s_block_hash);
        if (h == NULL || PyDict_DelItem(live, h) < 0 || (prev != Py_None && kids_dec(kids, prev) < 0)) {
            Py_XDECREF(h);
            if (own) Py_DECREF(prev);
            return NULL;
        }
        if (own) Py_DECREF(prev);
        prev = h;
        own = 1;
    }
    if (own) Py_DECREF(prev);
    Py_RETURN_FALSE;
error:
    return NULL;
}

static PyObject *fv_stored(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "stored() takes 10 arguments");
        return NULL;
    }
    int anchored = PyObject_IsTrue(args[6]), chain = PyObject_IsTrue(args[7]);
    if (anchored < 0 || chain < 0) return NULL;
    if (!PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) Py_RETURN_FALSE; /* tables: the Python path */
    return stored_core(args[0], args[1], args[2], args[3], args[4], args[5], anchored, chain, args[8], args[9]);
}

/* removed(live, kids, recent, hashes, mark) -> int
 * 0: a block is not stored or is named twice (nothing changed); 1: applied;
 * 2: applied, and a removed block still has stored children (the caller
 * reports the orphans). */
static PyObject *removed_core(PyObject *live, PyObject *kids, PyObject *recent, PyObject *hs, PyObject *mark) {
    if (!PyDict_CheckExact(live) || !PyDict_CheckExact(kids) || !PyDict_CheckExact(recent) ||
        !PyList_CheckExact(hs)) {
        PyErr_SetString(PyExc_TypeError, "removed(): live, kids, recent must be dicts, hashes a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(hs);
    if (n == 0 || n > 64) return PyLong_FromLong(0);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = PyList_GET_ITEM(hs, i);
        int c = PyDict_Contains(live, h);
        if (c < 0) return NULL;
        if (!c) return PyLong_FromLong(0);
        for (Py_ssize_t j = 0; j < i; j++) {
            int eq = PyObject_RichCompareBool(PyList_GET_ITEM(hs, j), h, Py_EQ);
            if (eq < 0) return NULL;
            if (eq) return PyLong_FromLong(0);
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = PyList_GET_ITEM(hs, i);
        PyObject *rec = PyDict_GetItemWithError(live, h);
        if (rec == NULL) return NULL; /* checked above: cannot happen */
        Py_INCREF(rec);
        if (PyDict_DelItem(live, h) < 0 || PyDict_SetItem(recent, h, mark) < 0) {
            Py_DECREF(rec);
            return NULL;
        }
        PyObject *p = PyTuple_GET_ITEM(rec, 1);
        if (p != Py_None && kids_dec(kids, p) < 0) {
            Py_DECREF(rec);
            return NULL;
        }
        Py_DECREF(rec);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyDict_GetItemWithError(kids, PyList_GET_ITEM(hs, i));
        if (k == NULL && PyErr_Occurred()) return NULL;
        if (k != NULL && PyObject_IsTrue(k)) return PyLong_FromLong(2);
    }
    return PyLong_FromLong(1);
}

static PyObject *fv_removed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "removed() takes 5 arguments");
        return NULL;
    }
    if (!PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) return PyLong_FromLong(0); /* tables */
    return removed_core(args[0], args[1], args[2], args[3], args[4]);
}

static PyObject *S_worker_id, *S_event, *S_event_id, *S_dp_rank, *S_data, *S_storage_tier, *S_stored, *S_removed,
    *S_parent_hash, *S_blocks, *S_block_hashes, *S_next_id, *S_tiers, *S_live, *S_kids, *S_cur, *S_index,
    *S_full, *S_pending, *S_rotate, *S_cap;

/* blocks whose Dynamo chain line() checked since the last take_chain_blocks()
 * (the caller adds them to the hash check's counts: one update per run, not
 * two attribute writes per event) */
static Py_ssize_t chain_blocks = 0;

static PyObject *fv_take_chain_blocks(PyObject *self, PyObject *unused) {
    Py_ssize_t n = chain_blocks;
    chain_blocks = 0;
    return PyLong_FromSsize_t(n);
}

/* line(ctx, m) -> int: one decoded RouterEvent line, the whole fused path
 * (formats.RouterReader.run): 0 when it is not a clean Stored or Removed of a
 * known source and tier with the expected event id (nothing changed: the
 * caller takes its other paths); 1 a Stored applied; 2 a Removed applied;
 * 3 a Removed applied whose tail the caller runs (the hash check keeps
 * per-block state, or a removed block has stored children to report).
 * ctx: (sources, anchored_tiers or None, chain, hash check or None, view,
 * xxh, seed, EventDataMsg, strict). */
static PyObject *fv_line(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 9) {
        PyErr_SetString(PyExc_TypeError, "line(ctx, m): ctx a tuple of 9");
        return NULL;
    }
    PyObject *ctx = args[0], *m = args[1];
    PyObject *sources = PyTuple_GET_ITEM(ctx, 0), *anchored_tiers = PyTuple_GET_ITEM(ctx, 1);
    int chain = PyObject_IsTrue(PyTuple_GET_ITEM(ctx, 2));
    PyObject *hcheck = PyTuple_GET_ITEM(ctx, 3), *view = PyTuple_GET_ITEM(ctx, 4);
    PyObject *xxh = PyTuple_GET_ITEM(ctx, 5), *seed = PyTuple_GET_ITEM(ctx, 6);
    PyObject *data_type = PyTuple_GET_ITEM(ctx, 7);
    int strict = PyObject_IsTrue(PyTuple_GET_ITEM(ctx, 8));
    if (chain < 0 || strict < 0 || !PyDict_CheckExact(sources)) {
        PyErr_SetString(PyExc_TypeError, "line(): bad context");
        return NULL;
    }
    long code = 0;
    PyObject *w = NULL, *ev = NULL, *eid = NULL, *dp = NULL, *data = NULL, *key = NULL, *src = NULL, *tname = NULL;
    PyObject *tiers = NULL, *tier = NULL, *live = NULL, *kids = NULL, *index = NULL, *st = NULL, *rm = NULL;
    PyObject *res = NULL, *nid = NULL, *one_more = NULL, *nxt = NULL;
    int ok;
    w = GETF(m, S_worker_id);
    if (w == NULL) goto error;
    as_u64(w, &ok);
    if (!ok) goto done;
    ev = GETF(m, S_event);
    if (ev == NULL) goto error;
    eid = GETF(ev, S_event_id);
    if (eid == NULL) goto error;
    as_u64(eid, &ok);
    if (!ok) goto done;
    data = GETF(ev, S_data);
    if (data == NULL) goto error;
    if ((PyObject *)Py_TYPE(data) != data_type) goto done;
    dp = GETF(ev, S_dp_rank);
    if (dp == NULL) goto error;
    key = PyTuple_Pack(2, w, dp);
    if (key == NULL) goto error;
    src = PyDict_GetItemWithError(sources, key); /* borrowed */
    if (src == NULL) {
        if (PyErr_Occurred()) goto error;
        goto done;
    }
    Py_INCREF(src);
    nid = GETF(src, S_next_id);
    if (nid == NULL) goto error;
    int same = PyObject_RichCompareBool(nid, eid, Py_EQ);
    if (same < 0) goto error;
    if (!same) goto done;
    tname = GETF(m, S_storage_tier);
    if (tname == NULL) goto error;
    tiers = GETF(src, S_tiers);
    if (tiers == NULL) goto error;
    if (!PyDict_CheckExact(tiers)) goto done;
    tier = PyDict_GetItemWithError(tiers, tname); /* borrowed */
    if (tier == NULL) {
        if (PyErr_Occurred()) goto error;
        goto done;
    }
    Py_INCREF(tier);
    live = GETF(tier, S_live);
    if (live == NULL) goto error;
    kids = GETF(tier, S_kids);
    if (kids == NULL) goto error;
    if (!PyDict_CheckExact(live) || !PyDict_CheckExact(kids)) goto done; /* tables: the Python path */
    index = GETF(view, S_index);
    if (index == NULL) goto error;
    st = GETF(data, S_stored);
    if (st == NULL) goto error;
    rm = GETF(data, S_removed);
    if (rm == NULL) goto error;
    if (st != Py_None && rm == Py_None) {
        PyObject *parent = GETF(st, S_parent_hash);
        if (parent == NULL) goto error;
        PyObject *blocks = GETF(st, S_blocks);
        if (blocks == NULL) {
            Py_DECREF(parent);
            goto error;
        }
        int anchored = 1;
        if (anchored_tiers != Py_None) {
            anchored = PySequence_Contains(anchored_tiers, tname);
            if (anchored < 0) {
                Py_DECREF(parent);
                Py_DECREF(blocks);
                goto error;
            }
        }
        res = stored_core(live, kids, parent, blocks, eid, index, anchored, chain, xxh, seed);
        Py_DECREF(parent);
        Py_ssize_t n = PyList_Check(blocks) ? PyList_GET_SIZE(blocks) : 0;
        Py_DECREF(blocks);
        if (res == NULL) goto error;
        if (res != Py_True) goto done;
        if (chain && hcheck != Py_None) chain_blocks += n; /* handed over by take_chain_blocks() */
        code = 1;
    } else if (st == Py_None && rm != Py_None) {
        PyObject *hs = GETF(rm, S_block_hashes);
        if (hs == NULL) goto error;
        PyObject *removed = GETF(tier, S_removed);
        if (removed == NULL) {
            Py_DECREF(hs);
            goto error;
        }
        PyObject *cur = GETF(removed, S_cur);
        PyObject *mark = cur == NULL ? NULL : PyTuple_Pack(2, eid, index);
        if (mark == NULL) {
            Py_XDECREF(cur);
            Py_DECREF(removed);
            Py_DECREF(hs);
            goto error;
        }
        res = removed_core(live, kids, cur, hs, mark);
        Py_DECREF(mark);
        Py_DECREF(hs);
        long r = res == NULL ? -1 : PyLong_AsLong(res);
        if (r > 0) {
            /* the recent removals rotate when full, as on_removed leaves them */
            PyObject *cap = GETF(removed, S_cap);
            Py_ssize_t c = cap == NULL ? -1 : PyLong_AsSsize_t(cap);
            Py_XDECREF(cap);
            if (c < 0) {
                r = -1;
            } else if (PyDict_GET_SIZE(cur) >= c) {
                PyObject *x = PyObject_CallMethodNoArgs(removed, S_rotate);
                if (x == NULL)
                    r = -1;
                else
                    Py_DECREF(x);
            }
        }
        Py_DECREF(cur);
        Py_DECREF(removed);
        if (r < 0) goto error;
        if (r == 0) goto done;
        code = (strict && r == 2) ? 3 : 2;
        if (code == 2 && hcheck != Py_None) {
            for (int k = 0; k < 2 && code == 2; k++) {
                PyObject *d = PyObject_GetAttr(hcheck, k == 0 ? S_full : S_pending);
                if (d == NULL) goto error;
                int t = PyObject_IsTrue(d);
                Py_DECREF(d);
                if (t < 0) goto error;
                if (t) code = 3;
            }
        }
        if (code == 3) goto done; /* the caller reports, then moves the ids on */
    } else {
        goto done;
    }
    /* the source's next id and the view's index, as on_stored/on_removed leave them */
    one_more = PyLong_FromLong(1);
    if (one_more == NULL) goto error;
    nxt = PyNumber_Add(eid, one_more);
    if (nxt == NULL || PyObject_SetAttr(src, S_next_id, nxt) < 0) goto error;
    Py_DECREF(nxt);
    nxt = PyNumber_Add(index, one_more);
    if (nxt == NULL || PyObject_SetAttr(view, S_index, nxt) < 0) goto error;
done:
    Py_XDECREF(w);
    Py_XDECREF(ev);
    Py_XDECREF(eid);
    Py_XDECREF(dp);
    Py_XDECREF(data);
    Py_XDECREF(key);
    Py_XDECREF(src);
    Py_XDECREF(nid);
    Py_XDECREF(tname);
    Py_XDECREF(tiers);
    Py_XDECREF(tier);
    Py_XDECREF(live);
    Py_XDECREF(kids);
    Py_XDECREF(index);
    Py_XDECREF(st);
    Py_XDECREF(rm);
    Py_XDECREF(res);
    Py_XDECREF(one_more);
    Py_XDECREF(nxt);
    return code < 0 ? NULL : PyLong_FromLong(code);
error:
    code = -1; /* one exit for both: every reference above is released once */
    goto done;
}

/* ------------------------------------------------------------ vLLM feeds
 *
 * vllm_event(ctx, ev, worker, dp) applies one clean vLLM BlockStored or
 * BlockRemoved (a decoded codecs.VllmStored or VllmRemoved struct) in copies
 * mode with the exact effects of ZmqFeed._stored/_removed -> RouterView.
 * on_stored/on_removed -> HashCheck.stored/gone for the sha256 scheme, or
 * returns 0 with nothing changed for the Python path to apply and report.
 * The block hash is recomputed as vLLM computes it (sha256 of the pickle,
 * protocol 5, of (parent digest, tuple(token ids), None)); the pickle is
 * written here byte for byte as pickle.dumps writes it and digested here
 * (tests compare both with pickle and hashlib).
 */

static PyObject *S_pop, *S_parent_block_hash, *S_token_ids, *S_block_size, *S_extra_keys, *S_medium, *S_group_idx,
    *S_digest, *S_checked_blocks;

/* *out = v when v is an int in [0, 2**64); 0 otherwise (no error set) */
static int u64_of(PyObject *v, uint64_t *out) {
    if (!PyLong_CheckExact(v)) return 0;
    int ok;
    *out = as_u64(v, &ok);
    return ok;
}

/* one token id as pickle writes an int; -1 when it is not in [0, 2**32) */
static int pickle_int(unsigned char *o, uint64_t v) {
    if (v < 0x100) {
        o[0] = 'K';
        o[1] = (unsigned char)v;
        return 2;
    }
    if (v < 0x10000) {
        o[0] = 'M';
        o[1] = (unsigned char)v;
        o[2] = (unsigned char)(v >> 8);
        return 3;
    }
    if (v < 0x80000000ULL) {
        o[0] = 'J';
        for (int k = 0; k < 4; k++) o[1 + k] = (unsigned char)(v >> (8 * k));
        return 5;
    }
    if (v < 0x100000000ULL) { /* LONG1: 5 bytes, two's complement, the top one 0 */
        o[0] = 0x8a;
        o[1] = 5;
        for (int k = 0; k < 4; k++) o[2 + k] = (unsigned char)(v >> (8 * k));
        o[6] = 0;
        return 7;
    }
    return -1;
}

/* pickle.dumps((parent, tuple(toks[0:n]), None), protocol=5) written into
 * buf (at least vllm_pickle_cap(plen, n) bytes); its length, or -1 when a
 * token is not an int in [0, 2**32) or the parent is 256 bytes or longer */
static Py_ssize_t vllm_pickle_cap(Py_ssize_t plen, Py_ssize_t n) { return 11 + 2 + plen + 3 + 7 * n + 5; }

static Py_ssize_t vllm_pickle_into(unsigned char *buf, const char *parent, Py_ssize_t plen, PyObject **toks,
                                   Py_ssize_t n) {
    if (plen >= 256) return -1;
    unsigned char *o = buf + 11;
    *o++ = 'C'; /* SHORT_BINBYTES */
    *o++ = (unsigned char)plen;
    memcpy(o, parent, plen);
    o += plen;
    *o++ = 0x94; /* MEMOIZE */
    if (n == 0) {
        *o++ = ')'; /* EMPTY_TUPLE, not memoized */
    } else {
        if (n > 3) *o++ = '(';
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t v;
            int w = u64_of(toks[i], &v) ? pickle_int(o, v) : -1;
            if (w < 0) return -1;
            o += w;
        }
        *o++ = n == 1 ? 0x85 : n == 2 ? 0x86 : n == 3 ? 0x87 : 't';
        *o++ = 0x94;
    }
    *o++ = 'N';
    *o++ = 0x87; /* TUPLE3 */
    *o++ = 0x94;
    *o++ = '.';
    uint64_t frame = (uint64_t)(o - (buf + 11));
    buf[0] = 0x80; /* PROTO 5 */
    buf[1] = 5;
    buf[2] = 0x95; /* FRAME */
    for (int k = 0; k < 8; k++) buf[3 + k] = (unsigned char)(frame >> (8 * k));
    return o - buf;
}

/* SHA-256 (FIPS 180-4), for vLLM's block hashes: one call per block, so the
 * digest is taken here rather than through hashlib's objects; the tests
 * compare it with hashlib. The constants are the first 32 bits of the
 * fractional parts of the square roots (H) and cube roots (K) of the first
 * primes. */
static const uint32_t SHA_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t st[8], const unsigned char *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR32(w[i - 15], 7) ^ ROR32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR32(w[i - 2], 17) ^ ROR32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = st[0], b = st[1], c = st[2], d = st[3], e = st[4], f = st[5], g = st[6], h = st[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROR32(e, 6) ^ ROR32(e, 11) ^ ROR32(e, 25)) + ((e & f) ^ (~e & g)) + SHA_K[i] + w[i];
        uint32_t t2 = (ROR32(a, 2) ^ ROR32(a, 13) ^ ROR32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    st[0] += a;
    st[1] += b;
    st[2] += c;
    st[3] += d;
    st[4] += e;
    st[5] += f;
    st[6] += g;
    st[7] += h;
}

static void sha256(const unsigned char *data, size_t len, unsigned char out[32]) {
    uint32_t st[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    size_t whole = len / 64 * 64;
    for (size_t i = 0; i < whole; i += 64) sha256_block(st, data + i);
    unsigned char tail[128];
    size_t r = len - whole;
    memset(tail, 0, sizeof tail);
    memcpy(tail, data + whole, r);
    tail[r] = 0x80;
    size_t tl = r + 9 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)len * 8;
    for (int k = 0; k < 8; k++) tail[tl - 1 - k] = (unsigned char)(bits >> (8 * k));
    sha256_block(st, tail);
    if (tl == 128) sha256_block(st, tail + 64);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(st[i] >> 24);
        out[4 * i + 1] = (unsigned char)(st[i] >> 16);
        out[4 * i + 2] = (unsigned char)(st[i] >> 8);
        out[4 * i + 3] = (unsigned char)st[i];
    }
}

/* vllm_pickle(parent: bytes, tokens: list) -> bytes or None (tests: the
 * pickle is pickle.dumps's) */
static PyObject *fv_vllm_pickle(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "vllm_pickle(parent: bytes, tokens: list)");
        return NULL;
    }
    Py_ssize_t plen = PyBytes_GET_SIZE(args[0]), n = PyList_GET_SIZE(args[1]);
    unsigned char *buf = PyMem_Malloc(vllm_pickle_cap(plen, n));
    if (buf == NULL) return PyErr_NoMemory();
    Py_ssize_t len = vllm_pickle_into(buf, PyBytes_AS_STRING(args[0]), plen, PySequence_Fast_ITEMS(args[1]), n);
    PyObject *r = len < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)buf, len);
    PyMem_Free(buf);
    return r;
}

/* sha256(data: bytes) -> bytes (tests: hashlib's) */
static PyObject *fv_sha256(PyObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "sha256(data: bytes)");
        return NULL;
    }
    unsigned char out[32];
    sha256((const unsigned char *)PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg), out);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

/* the tier of a vLLM event (codecs.vllm_tier) for group 0; NULL (no error
 * set) for another group or an unknown medium: the Python path decides */
static PyObject *vllm_tier_of(PyObject *ev, PyObject *media) {
    PyObject *g = GETF(ev, S_group_idx);
    if (g == NULL) return NULL;
    int zero = g == Py_None || (PyLong_CheckExact(g) && PyLong_AsLong(g) == 0);
    Py_DECREF(g);
    if (!zero) return NULL;
    PyObject *m = GETF(ev, S_medium);
    if (m == NULL) return NULL;
    PyObject *t = PyDict_GetItemWithError(media, m);
    Py_DECREF(m);
    Py_XINCREF(t);
    return t;
}

/* a list of ints in [0, 2**64) with no hash named twice when `distinct` */
static int u64_list(PyObject *hs, int distinct) {
    if (!PyList_CheckExact(hs)) return 0;
    Py_ssize_t n = PyList_GET_SIZE(hs);
    if (n == 0 || (distinct && n > 64)) return 0;
    uint64_t seen[64];
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v;
        if (!u64_of(PyList_GET_ITEM(hs, i), &v)) return 0;
        if (distinct) {
            for (Py_ssize_t j = 0; j < i; j++)
                if (seen[j] == v) return 0;
            seen[i] = v;
        }
    }
    return 1;
}

/* borrowed tier object and hash-check key for (worker, dp, tier name), or NULL */
static PyObject *vllm_tier_obj(PyObject *sources, PyObject *w, PyObject *dp, PyObject *tname) {
    PyObject *key = PyTuple_Pack(2, w, dp);
    if (key == NULL) return NULL;
    PyObject *src = PyDict_GetItemWithError(sources, key);
    Py_DECREF(key);
    if (src == NULL) return NULL;
    PyObject *tiers = GETF(src, S_tiers);
    if (tiers == NULL) return NULL;
    PyObject *tier = PyDict_CheckExact(tiers) ? PyDict_GetItemWithError(tiers, tname) : NULL;
    Py_DECREF(tiers);
    return tier;
}

static int bump_index(PyObject *view, PyObject *index) {
    PyObject *nxt = PyNumber_Add(index, one);
    if (nxt == NULL) return -1;
    int r = PyObject_SetAttr(view, S_index, nxt);
    Py_DECREF(nxt);
    return r;
}

static long vllm_stored(PyObject *ctx, PyObject *ev, PyObject *tname, PyObject *tier, PyObject *fkey) {
    PyObject *view = PyTuple_GET_ITEM(ctx, 0), *full_all = PyTuple_GET_ITEM(ctx, 2);
    PyObject *anchored_tiers = PyTuple_GET_ITEM(ctx, 4), *none = PyTuple_GET_ITEM(ctx, 6);
    PyObject *hcheck = PyTuple_GET_ITEM(ctx, 7);
    long code = 0;
    PyObject *hs = NULL, *parent = NULL, *toks = NULL, *bs = NULL, *ek = NULL, *live = NULL, *kids = NULL;
    PyObject *index = NULL, *digests = NULL;
    hs = GETF(ev, S_block_hashes);
    if (hs == NULL) goto error;
    if (!u64_list(hs, 0)) goto done;
    parent = GETF(ev, S_parent_block_hash);
    if (parent == NULL) goto error;
    uint64_t pv;
    if (parent != Py_None && !u64_of(parent, &pv)) goto done;
    toks = GETF(ev, S_token_ids);
    bs = toks == NULL ? NULL : GETF(ev, S_block_size);
    ek = bs == NULL ? NULL : GETF(ev, S_extra_keys);
    if (ek == NULL) goto error;
    Py_ssize_t n = PyList_GET_SIZE(hs);
    long size = PyLong_CheckExact(bs) ? PyLong_AsLong(bs) : -1;
    if (size == -1 && PyErr_Occurred()) goto error;
    if (!PyList_CheckExact(toks) || size < 1 || PyList_GET_SIZE(toks) != size * n) goto done;
    if (ek != Py_None) { /* extra keys other than None: the Python path */
        if (!PyList_CheckExact(ek)) goto done;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ek); i++)
            if (PyList_GET_ITEM(ek, i) != Py_None) goto done;
    }
    live = GETF(tier, S_live);
    kids = live == NULL ? NULL : GETF(tier, S_kids);
    if (kids == NULL) goto error;
    if (!PyDict_CheckExact(live) || !PyDict_CheckExact(kids)) goto done;
    PyObject *full = PyDict_GetItemWithError(full_all, fkey); /* borrowed */
    if (full == NULL || !PyDict_CheckExact(full)) {
        if (PyErr_Occurred()) goto error;
        goto done;
    }
    PyObject *pfull = none; /* borrowed */
    if (parent != Py_None) {
        int anchored = 1;
        if (anchored_tiers != Py_None) {
            anchored = PySequence_Contains(anchored_tiers, tname);
            if (anchored < 0) goto error;
        }
        if (anchored) {
            int c = PyDict_Contains(live, parent);
            if (c < 0) goto error;
            if (!c) goto done;
        }
        pfull = PyDict_GetItemWithError(full, parent);
        if (pfull == NULL) {
            if (PyErr_Occurred()) goto error;
            goto done; /* the parent's digest is unknown: the Python path skips what it cannot check */
        }
    }
    /* every hash first: nothing changes unless all of them are right */
    digests = PyList_New(n);
    if (digests == NULL) goto error;
    PyObject **tv = PySequence_Fast_ITEMS(toks);
    unsigned char stackbuf[2048], *buf = stackbuf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(pfull)) goto done;
        Py_ssize_t plen = PyBytes_GET_SIZE(pfull), cap = vllm_pickle_cap(plen, size);
        if (cap > (Py_ssize_t)sizeof stackbuf && buf == stackbuf) {
            buf = PyMem_Malloc(cap); /* the same size for every block: allocated once */
            if (buf == NULL) {
                buf = stackbuf;
                PyErr_NoMemory();
                goto error;
            }
        }
        Py_ssize_t len = vllm_pickle_into(buf, PyBytes_AS_STRING(pfull), plen, tv + i * size, size);
        unsigned char dg[32];
        if (len >= 0) sha256(buf, (size_t)len, dg);
        uint64_t h = 0, low = 0;
        for (int k = 24; k < 32; k++) low = (low << 8) | dg[k];
        if (len < 0 || !u64_of(PyList_GET_ITEM(hs, i), &h) || low != h) {
            if (buf != stackbuf) PyMem_Free(buf);
            goto done;
        }
        PyObject *d = PyBytes_FromStringAndSize((const char *)dg, 32);
        if (d == NULL) {
            if (buf != stackbuf) PyMem_Free(buf);
            goto error;
        }
        PyList_SET_ITEM(digests, i, d);
        pfull = d;
    }
    if (buf != stackbuf) PyMem_Free(buf);
    index = GETF(view, S_index);
    if (index == NULL) goto error;
    /* HashCheck.stored's effects, then RouterView.on_stored's (copies mode) */
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyDict_SetItem(full, PyList_GET_ITEM(hs, i), PyList_GET_ITEM(digests, i)) < 0) goto error;
    PyObject *prev = parent;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = PyList_GET_ITEM(hs, i);
        PyObject *rec = PyDict_GetItemWithError(live, h);
        PyObject *nrec;
        if (rec == NULL) {
            if (PyErr_Occurred()) goto error;
            nrec = PyTuple_Pack(4, one, prev, index, index);
            if (nrec == NULL) goto error;
            if (PyDict_SetItem(live, h, nrec) < 0 || (prev != Py_None && kids_inc(kids, prev) < 0)) {
                Py_DECREF(nrec);
                goto error;
            }
        } else {
            if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 4) {
                PyErr_SetString(PyExc_TypeError, "vllm_event(): a live record is not a 4-tuple");
                goto error;
            }
            PyObject *c = PyNumber_Add(PyTuple_GET_ITEM(rec, 0), one);
            if (c == NULL) goto error;
            nrec = PyTuple_Pack(4, c, PyTuple_GET_ITEM(rec, 1), index, index);
            Py_DECREF(c);
            if (nrec == NULL || PyDict_SetItem(live, h, nrec) < 0) {
                Py_XDECREF(nrec);
                goto error;
            }
        }
        Py_DECREF(nrec);
        prev = h;
    }
    PyObject *cb = GETF(hcheck, S_checked_blocks);
    PyObject *ncb = NULL;
    if (cb != NULL) {
        PyObject *k = PyLong_FromSsize_t(n);
        ncb = k == NULL ? NULL : PyNumber_Add(cb, k);
        Py_XDECREF(k);
        Py_DECREF(cb);
    }
    if (ncb == NULL || PyObject_SetAttr(hcheck, S_checked_blocks, ncb) < 0) {
        Py_XDECREF(ncb);
        goto error;
    }
    Py_DECREF(ncb);
    if (bump_index(view, index) < 0) goto error;
    code = 1;
    goto done;
error:
    code = -1;
done:
    Py_XDECREF(hs);
    Py_XDECREF(parent);
    Py_XDECREF(toks);
    Py_XDECREF(bs);
    Py_XDECREF(ek);
    Py_XDECREF(live);
    Py_XDECREF(kids);
    Py_XDECREF(index);
    Py_XDECREF(digests);
    return code;
}

static long vllm_removed(PyObject *ctx, PyObject *ev, PyObject *tier, PyObject *fkey) {
    PyObject *view = PyTuple_GET_ITEM(ctx, 0), *full_all = PyTuple_GET_ITEM(ctx, 2);
    PyObject *pending = PyTuple_GET_ITEM(ctx, 3);
    int strict = PyObject_IsTrue(PyTuple_GET_ITEM(ctx, 8));
    long code = 0;
    PyObject *hs = NULL, *live = NULL, *kids = NULL, *removed = NULL, *recent = NULL, *index = NULL, *mark = NULL;
    if (strict < 0) goto error;
    hs = GETF(ev, S_block_hashes);
    if (hs == NULL) goto error;
    if (!u64_list(hs, 1)) goto done;
    live = GETF(tier, S_live);
    kids = live == NULL ? NULL : GETF(tier, S_kids);
    removed = kids == NULL ? NULL : GETF(tier, S_removed);
    recent = removed == NULL ? NULL : GETF(removed, S_cur);
    if (recent == NULL) goto error;
    if (!PyDict_CheckExact(live) || !PyDict_CheckExact(kids) || !PyDict_CheckExact(recent)) goto done;
    Py_ssize_t n = PyList_GET_SIZE(hs);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PyDict_GetItemWithError(live, PyList_GET_ITEM(hs, i));
        if (rec == NULL) {
            if (PyErr_Occurred()) goto error;
            goto done; /* not stored: the Python path reports it */
        }
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 4 || !PyLong_CheckExact(PyTuple_GET_ITEM(rec, 0)))
            goto done;
    }
    index = GETF(view, S_index);
    if (index == NULL) goto error;
    mark = PyTuple_Pack(2, index, index);
    if (mark == NULL) goto error;
    int orphans = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = PyList_GET_ITEM(hs, i);
        PyObject *rec = PyDict_GetItemWithError(live, h);
        if (rec == NULL) goto error; /* checked above */
        Py_INCREF(rec);
        long copies = PyLong_AsLong(PyTuple_GET_ITEM(rec, 0));
        if (copies == -1 && PyErr_Occurred()) {
            Py_DECREF(rec);
            goto error;
        }
        int r;
        if (copies == 1) {
            PyObject *p = PyTuple_GET_ITEM(rec, 1);
            r = PyDict_DelItem(live, h) < 0 || PyDict_SetItem(recent, h, mark) < 0 ||
                        (p != Py_None && kids_dec(kids, p) < 0)
                    ? -1
                    : 0;
        } else {
            PyObject *c = PyLong_FromLong(copies - 1);
            PyObject *nrec = c == NULL ? NULL
                                       : PyTuple_Pack(4, c, PyTuple_GET_ITEM(rec, 1), PyTuple_GET_ITEM(rec, 2),
                                                      PyTuple_GET_ITEM(rec, 3));
            Py_XDECREF(c);
            r = nrec == NULL || PyDict_SetItem(live, h, nrec) < 0 ? -1 : 0;
            Py_XDECREF(nrec);
        }
        Py_DECREF(rec);
        if (r < 0) goto error;
    }
    /* the recent removals rotate when full, as on_removed leaves them */
    PyObject *cap = GETF(removed, S_cap);
    Py_ssize_t c = cap == NULL ? -1 : PyLong_AsSsize_t(cap);
    Py_XDECREF(cap);
    if (c < 0) goto error;
    if (PyDict_GET_SIZE(recent) >= c) {
        PyObject *x = PyObject_CallMethodNoArgs(removed, S_rotate);
        if (x == NULL) goto error;
        Py_DECREF(x);
    }
    /* blocks gone (no longer live): orphans to report? */
    for (Py_ssize_t i = 0; i < n && strict && !orphans; i++) {
        PyObject *h = PyList_GET_ITEM(hs, i);
        int still = PyDict_Contains(live, h);
        if (still < 0) goto error;
        if (still) continue;
        PyObject *k = PyDict_GetItemWithError(kids, h);
        if (k == NULL && PyErr_Occurred()) goto error;
        if (k != NULL) {
            int t = PyObject_IsTrue(k);
            if (t < 0) goto error;
            orphans = t;
        }
    }
    if (orphans || PyObject_IsTrue(pending)) {
        code = 3; /* the caller tells the hash check, reports, moves the index on */
        goto done;
    }
    PyObject *full = PyDict_GetItemWithError(full_all, fkey);
    if (full == NULL && PyErr_Occurred()) goto error;
    if (full != NULL && PyDict_CheckExact(full) && PyDict_GET_SIZE(full)) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *h = PyList_GET_ITEM(hs, i);
            int still = PyDict_Contains(live, h);
            if (still < 0) goto error;
            if (still) continue;
            PyObject *x = PyObject_CallMethodObjArgs(full, S_pop, h, Py_None, NULL);
            if (x == NULL) goto error;
            Py_DECREF(x);
        }
    }
    if (bump_index(view, index) < 0) goto error;
    code = 2;
    goto done;
error:
    code = -1;
done:
    Py_XDECREF(hs);
    Py_XDECREF(live);
    Py_XDECREF(kids);
    Py_XDECREF(removed);
    Py_XDECREF(recent);
    Py_XDECREF(index);
    Py_XDECREF(mark);
    return code;
}

/* vllm_event(ctx, ev, worker, dp) -> int: 0 not applied (nothing changed),
 * 1 a Stored applied, 2 a Removed applied, 3 a Removed applied whose tail
 * (HashCheck.gone, the orphan reports, the index) the caller runs.
 * ctx: (view, sources, hash check's full, hash check's pending, anchored
 * tiers or None, MEDIUM_TO_TIER, root digest (sha256), hash check, strict,
 * stored types, removed types). */
static PyObject *fv_vllm_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 11) {
        PyErr_SetString(PyExc_TypeError, "vllm_event(ctx, ev, worker, dp): ctx a tuple of 11");
        return NULL;
    }
    PyObject *ctx = args[0], *ev = args[1], *w = args[2], *dp = args[3];
    PyObject *sources = PyTuple_GET_ITEM(ctx, 1), *full_all = PyTuple_GET_ITEM(ctx, 2);
    PyObject *media = PyTuple_GET_ITEM(ctx, 5);
    PyObject *stored_t = PyTuple_GET_ITEM(ctx, 9), *removed_t = PyTuple_GET_ITEM(ctx, 10);
    if (!PyDict_CheckExact(sources) || !PyDict_CheckExact(full_all) || !PyDict_CheckExact(media) ||
        !PyTuple_CheckExact(stored_t) || !PyTuple_CheckExact(removed_t)) {
        PyErr_SetString(PyExc_TypeError, "vllm_event(): bad context");
        return NULL;
    }
    int is_stored = PySequence_Contains(stored_t, (PyObject *)Py_TYPE(ev));
    int is_removed = is_stored ? 0 : PySequence_Contains(removed_t, (PyObject *)Py_TYPE(ev));
    if (is_stored < 0 || is_removed < 0) return NULL;
    if (!is_stored && !is_removed) return PyLong_FromLong(0);
    PyObject *tname = vllm_tier_of(ev, media);
    if (tname == NULL) return PyErr_Occurred() ? NULL : PyLong_FromLong(0);
    PyObject *tier = vllm_tier_obj(sources, w, dp, tname); /* borrowed */
    if (tier == NULL) {
        Py_DECREF(tname);
        return PyErr_Occurred() ? NULL : PyLong_FromLong(0);
    }
    Py_INCREF(tier);
    PyObject *fkey = PyTuple_Pack(3, w, dp, tname);
    long code = -1;
    if (fkey != NULL) code = is_stored ? vllm_stored(ctx, ev, tname, tier, fkey) : vllm_removed(ctx, ev, tier, fkey);
    Py_XDECREF(fkey);
    Py_DECREF(tier);
    Py_DECREF(tname);
    return code < 0 ? NULL : PyLong_FromLong(code);
}

/* ---------------------------------------------------------- block tables
 *
 * LiveTable and KidsTable: a tier's live blocks (hash -> (copies, parent,
 * event id, index)) and child counts (parent hash -> count) held in C, for
 * the raw reader (lines()/text()) to look up an old block with one or two
 * cache misses instead of the five to eight a dict of tuples of ints costs
 * (the dict's index, its entry, the key object, the record tuple, the
 * parent's int, then the same for the child counts): check-log on a stream
 * that evicts old leaves spent most of its time there. Both are mappings
 * with the dict methods the view's Python code uses (get, pop, setdefault,
 * items, keys, values, clear, in, len, [], del), so the reference path works
 * on them unchanged; a key or value they cannot hold natively (a key not an
 * int in [0, 2**64), a record not a 4-tuple of such ints) goes to a plain
 * dict beside them ("odd"), and the raw reader leaves any event of a tier
 * with odd entries to the Python path. Iteration order is not insertion
 * order (keys() is a list: the view only sorts, counts or copies them).
 * Open addressing with linear probing and backward-shift deletion (no
 * tombstones), at most half full; slots are placed by a 64-bit mix of the
 * hash, so hashes chosen to collide in their low bits do not pile up.
 */

#define SLOT_USED 1u
#define SLOT_PARENT 2u  /* the record has a parent (else None) */
#define SLOT_EID_NEG 4u /* the event id is -1 (PRESUMED), eid unused */

typedef struct {
    uint64_t key, parent, eid;
    int64_t index;
    int32_t copies;
    uint32_t flags;
} live_slot;

typedef struct {
    uint64_t key;
    int32_t count;
    uint32_t flags;
} kids_slot;

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* one table type per slot type: find, reserve room, insert a new key, remove */
#define DEFINE_TABLE(P, S)                                                                   \
    typedef struct {                                                                         \
        S *slots;                                                                            \
        size_t mask; /* capacity - 1 (capacity a power of two), 0 when no slots */           \
        Py_ssize_t used;                                                                     \
    } P##_tab;                                                                               \
    static inline S *P##_find(const P##_tab *t, uint64_t k) {                                \
        if (t->slots == NULL) return NULL;                                                   \
        size_t i = (size_t)mix64(k) & t->mask;                                               \
        for (;;) {                                                                           \
            S *s = &t->slots[i];                                                             \
            if (!(s->flags & SLOT_USED)) return NULL;                                        \
            if (s->key == k) return s;                                                       \
            i = (i + 1) & t->mask;                                                           \
        }                                                                                    \
    }                                                                                        \
    static int P##_resize(P##_tab *t, size_t cap) {                                          \
        S *old = t->slots;                                                                   \
        size_t oldcap = old == NULL ? 0 : t->mask + 1;                                       \
        S *fresh = PyMem_Calloc(cap, sizeof(S));                                             \
        if (fresh == NULL) {                                                                 \
            PyErr_NoMemory();                                                                \
            return -1;                                                                       \
        }                                                                                    \
        t->slots = fresh;                                                                    \
        t->mask = cap - 1;                                                                   \
        for (size_t j = 0; j < oldcap; j++) {                                                \
            if (!(old[j].flags & SLOT_USED)) continue;                                       \
            size_t i = (size_t)mix64(old[j].key) & t->mask;                                  \
            while (fresh[i].flags & SLOT_USED) i = (i + 1) & t->mask;                        \
            fresh[i] = old[j];                                                               \
        }                                                                                    \
        PyMem_Free(old);                                                                     \
        return 0;                                                                            \
    }                                                                                        \
    /* room for n more keys without a resize: 0, or -1 with MemoryError */                   \
    static int P##_reserve(P##_tab *t, Py_ssize_t n) {                                       \
        size_t cap = t->slots == NULL ? 0 : t->mask + 1;                                     \
        size_t need = (size_t)(t->used + n) * 2;                                             \
        if (need <= cap) return 0;                                                           \
        size_t c = cap < 16 ? 16 : cap;                                                      \
        while (c < need) c *= 2;                                                             \
        return P##_resize(t, c);                                                             \
    }                                                                                        \
    /* the slot of k, added (flags SLOT_USED, the rest zero) when missing; *fresh          \
     * says which. Needs room (reserve). */                                                  \
    static inline S *P##_put(P##_tab *t, uint64_t k, int *fresh) {                           \
        size_t i = (size_t)mix64(k) & t->mask;                                               \
        for (;;) {                                                                           \
            S *s = &t->slots[i];                                                             \
            if (!(s->flags & SLOT_USED)) {                                                   \
                memset(s, 0, sizeof(S));                                                     \
                s->key = k;                                                                  \
                s->flags = SLOT_USED;                                                        \
                t->used++;                                                                   \
                *fresh = 1;                                                                  \
                return s;                                                                    \
            }                                                                                \
            if (s->key == k) {                                                               \
                *fresh = 0;                                                                  \
                return s;                                                                    \
            }                                                                                \
            i = (i + 1) & t->mask;                                                           \
        }                                                                                    \
    }                                                                                        \
    /* remove the (used) slot s: the later slots of its run move back */                    \
    static void P##_remove(P##_tab *t, S *s) {                                               \
        size_t i = (size_t)(s - t->slots), j = i;                                            \
        for (;;) {                                                                           \
            j = (j + 1) & t->mask;                                                           \
            if (!(t->slots[j].flags & SLOT_USED)) break;                                     \
            size_t h = (size_t)mix64(t->slots[j].key) & t->mask;                             \
            if (i <= j ? (i < h && h <= j) : (i < h || h <= j)) continue;                    \
            t->slots[i] = t->slots[j];                                                       \
            i = j;                                                                           \
        }                                                                                    \
        memset(&t->slots[i], 0, sizeof(S));                                                  \
        t->used--;                                                                           \
    }                                                                                        \
    static void P##_clear(P##_tab *t) {                                                      \
        PyMem_Free(t->slots);                                                                \
        t->slots = NULL;                                                                     \
        t->mask = 0;                                                                         \
        t->used = 0;                                                                         \
    }

DEFINE_TABLE(live, live_slot)
DEFINE_TABLE(kids, kids_slot)

typedef struct {
    PyObject_HEAD live_tab t;
    PyObject *odd; /* dict of what the slots cannot hold, or NULL */
} LiveTable;

typedef struct {
    PyObject_HEAD kids_tab t;
    PyObject *odd;
} KidsTable;

static PyTypeObject LiveTable_Type, KidsTable_Type;

/* k as a u64 key: 1, or 0 (no error set) when it is not an int in [0, 2**64) */
static int key_u64(PyObject *k, uint64_t *out) {
    if (!PyLong_Check(k)) return 0;
    uint64_t x = PyLong_AsUnsignedLongLong(k);
    if (x == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return 1;
}

/* v as an int64: 1, or 0 (no error set) */
static int val_i64(PyObject *v, int64_t *out) {
    if (!PyLong_Check(v)) return 0;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)x;
    return 1;
}

/* a record (copies, parent, eid, index) into a slot's fields; 0 when it does not fit */
static int live_pack(PyObject *v, live_slot *s) {
    if (!PyTuple_CheckExact(v) || PyTuple_GET_SIZE(v) != 4) return 0;
    int64_t c, idx, e;
    PyObject *p = PyTuple_GET_ITEM(v, 1), *eo = PyTuple_GET_ITEM(v, 2);
    if (!val_i64(PyTuple_GET_ITEM(v, 0), &c) || c < INT32_MIN || c > INT32_MAX) return 0;
    if (!val_i64(PyTuple_GET_ITEM(v, 3), &idx)) return 0;
    uint32_t flags = SLOT_USED;
    s->parent = 0;
    if (p != Py_None) {
        if (!PyLong_CheckExact(p) || !key_u64(p, &s->parent)) return 0;
        flags |= SLOT_PARENT;
    }
    if (!PyLong_CheckExact(eo)) return 0;
    if (key_u64(eo, &s->eid)) {
    } else if (val_i64(eo, &e) && e == -1) {
        s->eid = 0;
        flags |= SLOT_EID_NEG;
    } else {
        return 0;
    }
    if (!PyLong_CheckExact(PyTuple_GET_ITEM(v, 0)) || !PyLong_CheckExact(PyTuple_GET_ITEM(v, 3))) return 0;
    s->copies = (int32_t)c;
    s->index = idx;
    s->flags = flags;
    return 1;
}

static PyObject *live_unpack(const live_slot *s) {
    PyObject *c = PyLong_FromLong(s->copies);
    PyObject *p = s->flags & SLOT_PARENT ? PyLong_FromUnsignedLongLong(s->parent) : Py_NewRef(Py_None);
    PyObject *e = s->flags & SLOT_EID_NEG ? PyLong_FromLong(-1) : PyLong_FromUnsignedLongLong(s->eid);
    PyObject *i = PyLong_FromLongLong(s->index);
    PyObject *r = (c && p && e && i) ? PyTuple_Pack(4, c, p, e, i) : NULL;
    Py_XDECREF(c);
    Py_XDECREF(p);
    Py_XDECREF(e);
    Py_XDECREF(i);
    return r;
}

static int kids_pack(PyObject *v, kids_slot *s) {
    int64_t c;
    if (!PyLong_CheckExact(v) || !val_i64(v, &c) || c < INT32_MIN || c > INT32_MAX) return 0;
    s->count = (int32_t)c;
    return 1;
}

static PyObject *kids_unpack(const kids_slot *s) { return PyLong_FromLong(s->count); }

static inline int odd_size(PyObject *odd) { return odd != NULL && PyDict_GET_SIZE(odd) > 0; }

/* The mapping methods, once per table type (P: live or kids, T: its object type) */
#define DEFINE_MAPPING(P, T)                                                                          \
    /* the value under k: a new reference; NULL with KeyError set (or another error) */              \
    static PyObject *P##_m_lookup(T *self, PyObject *k, int raise) {                                  \
        uint64_t u;                                                                                   \
        if (key_u64(k, &u)) {                                                                         \
            P##_slot *s = P##_find(&self->t, u);                                                      \
            if (s != NULL) return P##_unpack(s);                                                      \
        }                                                                                             \
        if (self->odd != NULL) {                                                                      \
            PyObject *v = PyDict_GetItemWithError(self->odd, k);                                      \
            if (v != NULL) return Py_NewRef(v);                                                       \
            if (PyErr_Occurred()) return NULL;                                                        \
        }                                                                                             \
        if (raise) PyErr_SetObject(PyExc_KeyError, k);                                                \
        return NULL;                                                                                  \
    }                                                                                                 \
    /* remove k: 1 removed, 0 missing, -1 error */                                                    \
    static int P##_m_discard(T *self, PyObject *k) {                                                  \
        uint64_t u;                                                                                   \
        if (key_u64(k, &u)) {                                                                         \
            P##_slot *s = P##_find(&self->t, u);                                                      \
            if (s != NULL) {                                                                          \
                P##_remove(&self->t, s);                                                              \
                return 1;                                                                             \
            }                                                                                         \
        }                                                                                             \
        if (self->odd != NULL) {                                                                      \
            int c = PyDict_Contains(self->odd, k);                                                    \
            if (c <= 0) return c;                                                                     \
            return PyDict_DelItem(self->odd, k) < 0 ? -1 : 1;                                         \
        }                                                                                             \
        return 0;                                                                                     \
    }                                                                                                 \
    static int P##_m_set(T *self, PyObject *k, PyObject *v) {                                         \
        uint64_t u;                                                                                   \
        P##_slot tmp;                                                                                 \
        memset(&tmp, 0, sizeof tmp);                                                                  \
        if (key_u64(k, &u) && P##_pack(v, &tmp)) {                                                    \
            if (odd_size(self->odd)) {                                                                \
                int c = PyDict_Contains(self->odd, k);                                                \
                if (c < 0 || (c && PyDict_DelItem(self->odd, k) < 0)) return -1;                      \
            }                                                                                         \
            if (P##_reserve(&self->t, 1) < 0) return -1;                                              \
            int fresh;                                                                                \
            P##_slot *s = P##_put(&self->t, u, &fresh);                                               \
            tmp.key = u;                                                                              \
            tmp.flags |= SLOT_USED;                                                                   \
            *s = tmp;                                                                                 \
            return 0;                                                                                 \
        }                                                                                             \
        if (key_u64(k, &u)) {                                                                         \
            P##_slot *s = P##_find(&self->t, u);                                                      \
            if (s != NULL) P##_remove(&self->t, s);                                                   \
        }                                                                                             \
        if (self->odd == NULL && (self->odd = PyDict_New()) == NULL) return -1;                       \
        return PyDict_SetItem(self->odd, k, v);                                                       \
    }                                                                                                 \
    static Py_ssize_t P##_m_len(T *self) {                                                            \
        return self->t.used + (self->odd == NULL ? 0 : PyDict_GET_SIZE(self->odd));                   \
    }                                                                                                 \
    static PyObject *P##_m_subscript(T *self, PyObject *k) { return P##_m_lookup(self, k, 1); }       \
    static int P##_m_ass(T *self, PyObject *k, PyObject *v) {                                         \
        if (v != NULL) return P##_m_set(self, k, v);                                                  \
        int r = P##_m_discard(self, k);                                                               \
        if (r == 0) PyErr_SetObject(PyExc_KeyError, k);                                               \
        return r > 0 ? 0 : -1;                                                                        \
    }                                                                                                 \
    static int P##_m_contains(T *self, PyObject *k) {                                                 \
        uint64_t u;                                                                                   \
        if (key_u64(k, &u) && P##_find(&self->t, u) != NULL) return 1;                                \
        return self->odd == NULL ? 0 : PyDict_Contains(self->odd, k);                                 \
    }                                                                                                 \
    /* kind 0 keys, 1 values, 2 items: a list (a snapshot) */                                         \
    static PyObject *P##_m_list(T *self, int kind) {                                                  \
        PyObject *out = PyList_New(0);                                                                \
        if (out == NULL) return NULL;                                                                 \
        size_t cap = self->t.slots == NULL ? 0 : self->t.mask + 1;                                    \
        for (size_t i = 0; i < cap; i++) {                                                            \
            P##_slot *s = &self->t.slots[i];                                                          \
            if (!(s->flags & SLOT_USED)) continue;                                                    \
            PyObject *k = kind != 1 ? PyLong_FromUnsignedLongLong(s->key) : NULL;                     \
            PyObject *v = kind != 0 ? P##_unpack(s) : NULL;                                           \
            PyObject *x = kind == 0 ? Py_XNewRef(k) : kind == 1 ? Py_XNewRef(v) : (k && v) ? PyTuple_Pack(2, k, v) : NULL; \
            Py_XDECREF(k);                                                                            \
            Py_XDECREF(v);                                                                            \
            if (x == NULL || PyList_Append(out, x) < 0) {                                             \
                Py_XDECREF(x);                                                                        \
                Py_DECREF(out);                                                                       \
                return NULL;                                                                          \
            }                                                                                         \
            Py_DECREF(x);                                                                             \
        }                                                                                             \
        if (self->odd != NULL) {                                                                      \
            PyObject *k, *v;                                                                          \
            Py_ssize_t pos = 0;                                                                       \
            while (PyDict_Next(self->odd, &pos, &k, &v)) {                                            \
                PyObject *x = kind == 0 ? Py_NewRef(k) : kind == 1 ? Py_NewRef(v) : PyTuple_Pack(2, k, v); \
                if (x == NULL || PyList_Append(out, x) < 0) {                                         \
                    Py_XDECREF(x);                                                                    \
                    Py_DECREF(out);                                                                   \
                    return NULL;                                                                      \
                }                                                                                     \
                Py_DECREF(x);                                                                         \
            }                                                                                         \
        }                                                                                             \
        return out;                                                                                   \
    }                                                                                                 \
    static PyObject *P##_keys(T *self, PyObject *unused) { return P##_m_list(self, 0); }              \
    static PyObject *P##_values(T *self, PyObject *unused) { return P##_m_list(self, 1); }            \
    static PyObject *P##_items(T *self, PyObject *unused) { return P##_m_list(self, 2); }             \
    static PyObject *P##_iter(T *self) {                                                              \
        PyObject *ks = P##_m_list(self, 0);                                                           \
        if (ks == NULL) return NULL;                                                                  \
        PyObject *it = PyObject_GetIter(ks);                                                          \
        Py_DECREF(ks);                                                                                \
        return it;                                                                                    \
    }                                                                                                 \
    static PyObject *P##_get(T *self, PyObject *const *args, Py_ssize_t nargs) {                      \
        if (nargs < 1 || nargs > 2) {                                                                 \
            PyErr_SetString(PyExc_TypeError, "get(key, default=None)");                               \
            return NULL;                                                                              \
        }                                                                                             \
        PyObject *v = P##_m_lookup(self, args[0], 0);                                                 \
        if (v != NULL || PyErr_Occurred()) return v;                                                  \
        return Py_NewRef(nargs == 2 ? args[1] : Py_None);                                             \
    }                                                                                                 \
    static PyObject *P##_pop(T *self, PyObject *const *args, Py_ssize_t nargs) {                      \
        if (nargs < 1 || nargs > 2) {                                                                 \
            PyErr_SetString(PyExc_TypeError, "pop(key[, default])");                                  \
            return NULL;                                                                              \
        }                                                                                             \
        PyObject *v = P##_m_lookup(self, args[0], 0);                                                 \
        if (v == NULL) {                                                                              \
            if (PyErr_Occurred()) return NULL;                                                        \
            if (nargs == 2) return Py_NewRef(args[1]);                                                \
            PyErr_SetObject(PyExc_KeyError, args[0]);                                                 \
            return NULL;                                                                              \
        }                                                                                             \
        if (P##_m_discard(self, args[0]) < 0) {                                                       \
            Py_DECREF(v);                                                                             \
            return NULL;                                                                              \
        }                                                                                             \
        return v;                                                                                     \
    }                                                                                                 \
    /* the value under k; when missing, default is stored and returned itself */                     \
    static PyObject *P##_setdefault(T *self, PyObject *const *args, Py_ssize_t nargs) {               \
        if (nargs < 1 || nargs > 2) {                                                                 \
            PyErr_SetString(PyExc_TypeError, "setdefault(key, default=None)");                        \
            return NULL;                                                                              \
        }                                                                                             \
        PyObject *v = P##_m_lookup(self, args[0], 0);                                                 \
        if (v != NULL || PyErr_Occurred()) return v;                                                  \
        PyObject *d = nargs == 2 ? args[1] : Py_None;                                                 \
        if (P##_m_set(self, args[0], d) < 0) return NULL;                                             \
        return Py_NewRef(d);                                                                          \
    }                                                                                                 \
    static PyObject *P##_clear_m(T *self, PyObject *unused) {                                         \
        P##_clear(&self->t);                                                                          \
        Py_CLEAR(self->odd);                                                                          \
        Py_RETURN_NONE;                                                                               \
    }                                                                                                 \
    static void P##_dealloc(T *self) {                                                                \
        P##_clear(&self->t);                                                                          \
        Py_CLEAR(self->odd);                                                                          \
        Py_TYPE(self)->tp_free((PyObject *)self);                                                     \
    }                                                                                                 \
    static PyObject *P##_new(PyTypeObject *type, PyObject *args, PyObject *kw) {                      \
        if (PyTuple_GET_SIZE(args) != 0 || (kw != NULL && PyDict_GET_SIZE(kw) != 0)) {                \
            PyErr_SetString(PyExc_TypeError, "the table takes no arguments");                         \
            return NULL;                                                                              \
        }                                                                                             \
        return type->tp_alloc(type, 0); /* zeroed: no slots, no odd dict */                          \
    }                                                                                                 \
    static PyMethodDef P##_methods[] = {                                                              \
        {"get", (PyCFunction)(void (*)(void))P##_get, METH_FASTCALL, NULL},                           \
        {"pop", (PyCFunction)(void (*)(void))P##_pop, METH_FASTCALL, NULL},                           \
        {"setdefault", (PyCFunction)(void (*)(void))P##_setdefault, METH_FASTCALL, NULL},             \
        {"keys", (PyCFunction)P##_keys, METH_NOARGS, "the keys, a list"},                            \
        {"values", (PyCFunction)P##_values, METH_NOARGS, "the values, a list"},                      \
        {"items", (PyCFunction)P##_items, METH_NOARGS, "the (key, value) pairs, a list"},            \
        {"clear", (PyCFunction)P##_clear_m, METH_NOARGS, NULL},                                       \
        {NULL, NULL, 0, NULL},                                                                        \
    };                                                                                                \
    static PyMappingMethods P##_as_mapping = {(lenfunc)P##_m_len, (binaryfunc)P##_m_subscript,        \
                                              (objobjargproc)P##_m_ass};                              \
    static PySequenceMethods P##_as_sequence = {.sq_contains = (objobjproc)P##_m_contains};

DEFINE_MAPPING(live, LiveTable)
DEFINE_MAPPING(kids, KidsTable)

static PyTypeObject LiveTable_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_kvspec_fastview.LiveTable",
    .tp_basicsize = sizeof(LiveTable),
    .tp_dealloc = (destructor)live_dealloc,
    .tp_as_mapping = &live_as_mapping,
    .tp_as_sequence = &live_as_sequence,
    .tp_iter = (getiterfunc)live_iter,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a tier's live blocks: hash -> (copies, parent, event id, index), held in C",
    .tp_methods = live_methods,
    .tp_new = live_new,
};

static PyTypeObject KidsTable_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_kvspec_fastview.KidsTable",
    .tp_basicsize = sizeof(KidsTable),
    .tp_dealloc = (destructor)kids_dealloc,
    .tp_as_mapping = &kids_as_mapping,
    .tp_as_sequence = &kids_as_sequence,
    .tp_iter = (getiterfunc)kids_iter,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a tier's child counts: parent hash -> stored blocks naming it, held in C",
    .tp_methods = kids_methods,
    .tp_new = kids_new,
};

/* kids[p] += 1 on a table with room (kids_reserve) */
static inline void kt_inc(KidsTable *K, uint64_t p) {
    int fresh;
    kids_slot *s = kids_put(&K->t, p, &fresh);
    s->count = fresh ? 1 : s->count + 1;
}

/* kids[p] -= 1 as kids_dec does it: at 1 the entry goes, a missing or zero count stays */
static inline void kt_dec(KidsTable *K, uint64_t p) {
    kids_slot *s = kids_find(&K->t, p);
    if (s == NULL || s->count == 0) return;
    if (s->count == 1)
        kids_remove(&K->t, s);
    else
        s->count--;
}

/* ------------------------------------------------------- raw Dynamo lines
 *
 * lines(ctx, lines, start) reads RouterEvent JSON lines itself, without
 * building a decoded object: lines[start:] are parsed here for the shape
 * Dynamo publishes (the fields of codecs.RouterEventMsg in any order, plain
 * unsigned integers, null or escape-free ASCII strings) and each clean Stored
 * or Removed is applied to the view's dicts exactly as line() applies its
 * decoded form. It stops at the first line it does not take whole - any other
 * shape or value (an unknown field, a duplicate key, a number with a sign,
 * fraction or exponent, an escape, non-ASCII text, a blank line, a Cleared),
 * or an event line() would not apply (an unknown source or tier, an event id
 * not due, a parent not stored, a hash off its chain, a block stored twice,
 * a block not stored, a Removed whose tail Python runs) - with that line
 * untouched, and returns (index of that line, Stored applied, Removed
 * applied); the caller runs its own path for that line and calls again
 * after it. So every line this function does not understand goes through
 * the reference path: it can only make lines faster, never judge one.
 * ctx: (sources, anchored_tiers or None, chain, hash check or None, view,
 * seed, strict).
 */

#define RAW_MAX_BLOCKS 256
#define RAW_MAX_REMOVED 64
#define N_TIERS 5
static const char *const tier_names[N_TIERS] = {"device", "host_pinned", "disk", "external", "remote"};
/* the same, measured, for r_name (declared after it) */
#define TIER_RNAMES {RN("device"), RN("host_pinned"), RN("disk"), RN("external"), RN("remote")}
static PyObject *tier_objs[N_TIERS];

typedef struct {
    const unsigned char *p, *end;
} rcur;

typedef struct {
    uint64_t w, eid, dp, parent;
    int tier, kind, has_parent; /* kind 1: Stored, 2: Removed */
    Py_ssize_t n;
    uint64_t h[RAW_MAX_BLOCKS], th[RAW_MAX_BLOCKS];
} rawev;

static inline void r_ws(rcur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n')) c->p++;
}

static inline int r_ch(rcur *c, unsigned char ch) {
    r_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
/* eight ASCII digits at once (the first in the lowest byte): whether all of
 * w's bytes are '0'..'9', and their value (the usual SWAR reduction: pairs,
 * then fours, then the eight) */
static inline int all8_digits(uint64_t w) {
    return ((w & 0xF0F0F0F0F0F0F0F0ULL) | (((w + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) >> 4)) ==
           0x3333333333333333ULL;
}

static inline uint64_t value8(uint64_t w) {
    w -= 0x3030303030303030ULL;
    w = (w * 10) + (w >> 8); /* each even byte: the value of a pair */
    w = (((w & 0x000000FF000000FFULL) * (100 + (1000000ULL << 32))) +
         (((w >> 16) & 0x000000FF000000FFULL) * (1 + (10000ULL << 32)))) >>
        32;
    return w & 0xFFFFFFFFULL;
}
#define SWAR_DIGITS 1
#else
#define SWAR_DIGITS 0
#endif

/* an unsigned JSON integer that fits in 64 bits: digits only, no leading zero,
 * not followed by a fraction or an exponent */
static int r_u64(rcur *c, uint64_t *out) {
    r_ws(c);
    const unsigned char *p = c->p, *end = c->end, *start = p;
    if (p >= end || (unsigned)(*p - '0') > 9) return 0;
    if (*p == '0' && p + 1 < end && (unsigned)(p[1] - '0') <= 9) return 0;
    uint64_t v = 0;
#if SWAR_DIGITS
    /* at most 16 digits this way: v stays below 10**16 */
    while (end - p >= 8 && p - start <= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        if (!all8_digits(w)) break;
        v = v * 100000000ULL + value8(w);
        p += 8;
    }
#endif
    const unsigned char *stop = end - start > 19 ? start + 19 : end; /* 19 digits cannot overflow */
    unsigned d;
    while (p < stop && (d = (unsigned)(*p - '0')) <= 9) {
        v = v * 10 + d;
        p++;
    }
    if (p < end && (d = (unsigned)(*p - '0')) <= 9) { /* a 20th digit */
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
        p++;
        if (p < end && (unsigned)(*p - '0') <= 9) return 0;
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return 0;
    c->p = p;
    *out = v;
    return 1;
}

/* parse_u64(text) -> int or None: r_u64 on bytes (tests: a number it takes
 * is the whole text read as msgspec reads it) - None when it does not take
 * the text, or takes only part of it */
static PyObject *fv_parse_u64(PyObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "parse_u64(bytes)");
        return NULL;
    }
    rcur c = {(const unsigned char *)PyBytes_AS_STRING(arg),
              (const unsigned char *)PyBytes_AS_STRING(arg) + PyBytes_GET_SIZE(arg)};
    uint64_t v;
    if (!r_u64(&c, &v) || c.p != c.end) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(v);
}

static int r_null(rcur *c) {
    r_ws(c);
    if (c->end - c->p >= 4 && memcmp(c->p, "null", 4) == 0) {
        c->p += 4;
        return 1;
    }
    return 0;
}

/* a string of printable ASCII without escapes; *s, *n: its text */
static int r_str(rcur *c, const unsigned char **s, Py_ssize_t *n) {
    if (!r_ch(c, '"')) return 0;
    const unsigned char *p = c->p;
    while (p < c->end && *p != '"') {
        if (*p < 0x20 || *p >= 0x7f || *p == '\\') return 0;
        p++;
    }
    if (p >= c->end) return 0;
    *s = c->p;
    *n = p - c->p;
    c->p = p + 1;
    return 1;
}

/* one of names, as a JSON string written without escapes (a name written
 * otherwise is not recognised: the line then goes the reference way); the
 * index of the name, -1 otherwise */
typedef struct {
    const char *s;
    Py_ssize_t n;
} rname;
#define RN(text) {text, sizeof(text) - 1}

static int r_name(rcur *c, const rname *names, int count) {
    if (!r_ch(c, '"')) return -1;
    const unsigned char *p = c->p;
    Py_ssize_t room = c->end - p;
    for (int i = 0; i < count; i++) {
        Py_ssize_t n = names[i].n; /* the closing quote and the first byte rule out most names at once */
        if (n < room && p[n] == '"' && p[0] == (unsigned char)names[i].s[0] && memcmp(p, names[i].s, n) == 0) {
            c->p = p + n + 1;
            return i;
        }
    }
    return -1;
}

/* a key and its colon; returns the index of the key in names, -1 otherwise */
static int r_key(rcur *c, const rname *names, int count) {
    int k = r_name(c, names, count);
    return k >= 0 && r_ch(c, ':') ? k : -1;
}

/* after a member: 1 another follows, 0 the object ends, -1 neither */
static int r_next(rcur *c, unsigned char close) {
    if (r_ch(c, ',')) return 1;
    if (r_ch(c, close)) return 0;
    return -1;
}

static const rname block_keys[] = {RN("block_hash"), RN("tokens_hash"), RN("mm_extra_info")};

static int r_block(rcur *c, rawev *e) {
    if (!r_ch(c, '{') || e->n >= RAW_MAX_BLOCKS) return 0;
    unsigned seen = 0;
    uint64_t h = 0, th = 0;
    for (;;) {
        int k = r_key(c, block_keys, 3);
        if (k < 0 || (seen & (1u << k))) return 0;
        seen |= 1u << k;
        if (k == 0 ? !r_u64(c, &h) : k == 1 ? !r_u64(c, &th) : !r_null(c)) return 0;
        int nx = r_next(c, '}');
        if (nx < 0) return 0;
        if (nx == 0) break;
    }
    if ((seen & 3u) != 3u) return 0;
    e->h[e->n] = h;
    e->th[e->n] = th;
    e->n++;
    return 1;
}

static const rname stored_keys[] = {RN("blocks"), RN("parent_hash"), RN("start_position")};

static int r_stored(rcur *c, rawev *e) {
    if (!r_ch(c, '{')) return 0;
    unsigned seen = 0;
    for (;;) {
        int k = r_key(c, stored_keys, 3);
        if (k < 0 || (seen & (1u << k))) return 0;
        seen |= 1u << k;
        if (k == 0) {
            if (!r_ch(c, '[')) return 0;
            if (r_ch(c, ']')) return 0; /* no blocks: the reference path reports it */
            for (;;) {
                if (!r_block(c, e)) return 0;
                int nx = r_next(c, ']');
                if (nx < 0) return 0;
                if (nx == 0) break;
            }
        } else if (k == 1) {
            if (r_null(c))
                e->has_parent = 0;
            else if (r_u64(c, &e->parent))
                e->has_parent = 1;
            else
                return 0;
        } else {
            uint64_t sp;
            if (!r_null(c) && !(r_u64(c, &sp) && sp <= 0xffffffffULL)) return 0;
        }
        int nx = r_next(c, '}');
        if (nx < 0) return 0;
        if (nx == 0) break;
    }
    return (seen & 1u) != 0;
}

static const rname removed_keys[] = {RN("block_hashes")};

static int r_removed(rcur *c, rawev *e) {
    if (!r_ch(c, '{') || r_key(c, removed_keys, 1) != 0 || !r_ch(c, '[') || r_ch(c, ']')) return 0;
    for (;;) {
        if (e->n >= RAW_MAX_REMOVED || !r_u64(c, &e->h[e->n])) return 0;
        e->n++;
        int nx = r_next(c, ']');
        if (nx < 0) return 0;
        if (nx == 0) break;
    }
    return r_ch(c, '}');
}

static const rname data_keys[] = {RN("stored"), RN("removed")};

static int r_data(rcur *c, rawev *e) {
    if (!r_ch(c, '{')) return 0; /* "cleared" and anything else: the reference path */
    int k = r_key(c, data_keys, 2);
    if (k < 0) return 0;
    e->kind = k + 1;
    if (k == 0 ? !r_stored(c, e) : !r_removed(c, e)) return 0;
    return r_ch(c, '}'); /* only one of stored and removed */
}

static const rname event_keys[] = {RN("event_id"), RN("data"), RN("dp_rank")};

static int r_event(rcur *c, rawev *e) {
    if (!r_ch(c, '{')) return 0;
    unsigned seen = 0;
    e->dp = 0;
    for (;;) {
        int k = r_key(c, event_keys, 3);
        if (k < 0 || (seen & (1u << k))) return 0;
        seen |= 1u << k;
        if (k == 0 ? !r_u64(c, &e->eid) : k == 1 ? !r_data(c, e) : !(r_u64(c, &e->dp) && e->dp <= 0xffffffffULL))
            return 0;
        int nx = r_next(c, '}');
        if (nx < 0) return 0;
        if (nx == 0) break;
    }
    return (seen & 3u) == 3u;
}

static const rname router_keys[] = {RN("worker_id"), RN("storage_tier"), RN("residency_domain"), RN("event")};

/* one RouterEvent line into e; 0 when it is not of the shape taken here */
static int r_line(const unsigned char *s, Py_ssize_t len, rawev *e) {
    rcur c = {s, s + len};
    e->n = 0;
    e->kind = 0;
    e->has_parent = 0;
    e->tier = 0; /* "device", the default */
    if (!r_ch(&c, '{')) return 0;
    unsigned seen = 0;
    for (;;) {
        int k = r_key(&c, router_keys, 4);
        if (k < 0 || (seen & (1u << k))) return 0;
        seen |= 1u << k;
        if (k == 0) {
            if (!r_u64(&c, &e->w)) return 0;
        } else if (k == 1) {
            static const rname tiers_rn[N_TIERS] = TIER_RNAMES;
            e->tier = r_name(&c, tiers_rn, N_TIERS);
            if (e->tier < 0) return 0;
        } else if (k == 2) {
            const unsigned char *t;
            Py_ssize_t n;
            if (!r_null(&c) && !r_str(&c, &t, &n)) return 0;
        } else if (!r_event(&c, e)) {
            return 0;
        }
        int nx = r_next(&c, '}');
        if (nx < 0) return 0;
        if (nx == 0) break;
    }
    r_ws(&c);
    return c.p == c.end && (seen & 9u) == 9u;
}

/* the objects an event of one (worker, dp rank, tier) works on, kept while
 * consecutive lines name the same one (nothing but this function runs
 * between them, and it never adds or replaces sources or tiers) */
typedef struct {
    int valid;
    uint64_t w, dp;
    int tier;
    PyObject *src, *live, *kids, *removed; /* new references */
    int anchored;
    int tables; /* live and kids are a LiveTable and a KidsTable (else dicts) */
} rawkey;

static void rawkey_clear(rawkey *k) {
    Py_CLEAR(k->src);
    Py_CLEAR(k->live);
    Py_CLEAR(k->kids);
    Py_CLEAR(k->removed);
    k->valid = 0;
}

/* 1 found, 0 no such source or tier (the reference path's business), -1 error */
static int rawkey_find(rawkey *k, const rawev *e, PyObject *sources, PyObject *anchored_tiers) {
    if (k->valid && k->w == e->w && k->dp == e->dp && k->tier == e->tier) return 1;
    rawkey_clear(k);
    PyObject *wo = PyLong_FromUnsignedLongLong(e->w), *dpo = PyLong_FromUnsignedLongLong(e->dp);
    PyObject *key = (wo && dpo) ? PyTuple_Pack(2, wo, dpo) : NULL;
    Py_XDECREF(wo);
    Py_XDECREF(dpo);
    if (key == NULL) return -1;
    PyObject *src = PyDict_GetItemWithError(sources, key); /* borrowed */
    Py_DECREF(key);
    if (src == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(src);
    k->src = src;
    PyObject *tiers = GETF(src, S_tiers);
    if (tiers == NULL) return -1;
    int r = 0;
    if (PyDict_CheckExact(tiers)) {
        PyObject *tname = tier_objs[e->tier];
        PyObject *tier = PyDict_GetItemWithError(tiers, tname); /* borrowed */
        if (tier == NULL) {
            r = PyErr_Occurred() ? -1 : 0;
        } else {
            Py_INCREF(tier);
            k->live = GETF(tier, S_live);
            k->kids = k->live ? GETF(tier, S_kids) : NULL;
            k->removed = k->kids ? GETF(tier, S_removed) : NULL;
            Py_DECREF(tier);
            if (k->removed == NULL) {
                r = -1;
            } else if (!(k->tables = Py_IS_TYPE(k->live, &LiveTable_Type) && Py_IS_TYPE(k->kids, &KidsTable_Type)) &&
                       (!PyDict_CheckExact(k->live) || !PyDict_CheckExact(k->kids))) {
                r = 0;
            } else {
                k->anchored = 1;
                if (anchored_tiers != Py_None) k->anchored = PySequence_Contains(anchored_tiers, tname);
                r = k->anchored < 0 ? -1 : 1;
            }
        }
    }
    Py_DECREF(tiers);
    if (r != 1) {
        rawkey_clear(k);
        return r;
    }
    k->valid = 1;
    k->w = e->w;
    k->dp = e->dp;
    k->tier = e->tier;
    return 1;
}

/* a clean Stored applied as stored_core applies it: 1 applied, 0 not clean
 * (nothing changed), -1 error. Every block is checked before any is stored,
 * which is stored_core's insert-then-roll-back without the roll-back. */
static int raw_stored(const rawev *e, rawkey *k, PyObject *eid, PyObject *index, int chain, uint64_t seed) {
    PyObject *live = k->live, *kids = k->kids;
    PyObject *hobj[RAW_MAX_BLOCKS];
    PyObject *parent = Py_None;
    Py_ssize_t made = 0;
    int r = 0;
    Py_INCREF(Py_None);
    if (e->has_parent) {
        Py_DECREF(Py_None);
        parent = PyLong_FromUnsignedLongLong(e->parent);
        if (parent == NULL) return -1;
        if (k->anchored) {
            int c = PyDict_Contains(live, parent);
            if (c <= 0) {
                r = c;
                goto out;
            }
        }
    }
    uint64_t prev = e->parent;
    for (Py_ssize_t i = 0; i < e->n; i++) {
        uint64_t h = e->h[i];
        if (chain) {
#if HAVE_XXH3_16
            if (i == 0 && !e->has_parent ? h != e->th[i] : xxh3_16(prev, e->th[i], seed) != h) goto out;
#else
            goto out;
#endif
        }
        for (Py_ssize_t j = 0; j < i; j++)
            if (e->h[j] == h) goto out; /* named twice: the reference reports it */
        PyObject *ho = PyLong_FromUnsignedLongLong(h);
        if (ho == NULL) {
            r = -1;
            goto out;
        }
        hobj[made++] = ho;
        int c = PyDict_Contains(live, ho);
        if (c != 0) {
            r = c < 0 ? -1 : 0;
            goto out;
        }
        prev = h;
    }
    PyObject *p = parent;
    for (Py_ssize_t i = 0; i < e->n; i++) {
        PyObject *rec = PyTuple_Pack(4, one, p, eid, index);
        if (rec != NULL) PyObject_GC_UnTrack(rec); /* ints and None only: the collector need not visit it */
        if (rec == NULL || PyDict_SetItem(live, hobj[i], rec) < 0 || (p != Py_None && kids_inc(kids, p) < 0)) {
            Py_XDECREF(rec);
            r = -1;
            goto out;
        }
        Py_DECREF(rec);
        p = hobj[i];
    }
    r = 1;
out:
    for (Py_ssize_t i = 0; i < made; i++) Py_DECREF(hobj[i]);
    Py_DECREF(parent);
    return r;
}

/* a clean Removed applied as removed_core applies it, when it would be code 2
 * in line() (no tail for Python to run: with strict, no removed block keeps a
 * stored child once the event's blocks are gone): 1 applied, 0 not taken
 * (nothing changed), -1 error */
static int raw_removed(const rawev *e, rawkey *k, PyObject *eid, PyObject *index, int strict) {
    PyObject *live = k->live, *kids = k->kids;
    PyObject *hobj[RAW_MAX_REMOVED];
    PyObject *recs[RAW_MAX_REMOVED]; /* borrowed from live: it does not change until the blocks go */
    uint64_t par[RAW_MAX_REMOVED];
    char has_par[RAW_MAX_REMOVED];
    Py_ssize_t made = 0;
    int r = 0;
    PyObject *cur = NULL, *mark = NULL;
    for (Py_ssize_t i = 0; i < e->n; i++) {
        for (Py_ssize_t j = 0; j < i; j++)
            if (e->h[j] == e->h[i]) goto out;
        PyObject *ho = PyLong_FromUnsignedLongLong(e->h[i]);
        if (ho == NULL) {
            r = -1;
            goto out;
        }
        hobj[made++] = ho;
    }
    /* the lookups first, then the records' fields: an old block's record is
     * rarely in the CPU's cache, and independent lookups let its misses
     * overlap instead of waiting for one block's before the next block's */
    for (Py_ssize_t i = 0; i < e->n; i++) {
        PyObject *rec = PyDict_GetItemWithError(live, hobj[i]); /* borrowed */
        if (rec == NULL) {
            r = PyErr_Occurred() ? -1 : 0;
            goto out;
        }
        __builtin_prefetch(rec);
        recs[i] = rec;
    }
    for (Py_ssize_t i = 0; i < e->n; i++) {
        if (!PyTuple_CheckExact(recs[i]) || PyTuple_GET_SIZE(recs[i]) < 2) goto out;
        __builtin_prefetch(PyTuple_GET_ITEM(recs[i], 1));
    }
    for (Py_ssize_t i = 0; i < e->n; i++) {
        PyObject *p = PyTuple_GET_ITEM(recs[i], 1);
        has_par[i] = p != Py_None;
        if (has_par[i] && !u64_of(p, &par[i])) goto out;
    }
    /* the parents' child counts are decremented below, one block after the
     * other: look them up together now, so that their misses overlap too */
    for (Py_ssize_t i = 0; i < e->n; i++) {
        if (has_par[i] && PyDict_GetItemWithError(kids, PyTuple_GET_ITEM(recs[i], 1)) == NULL && PyErr_Occurred()) {
            r = -1;
            goto out;
        }
    }
    if (strict) { /* a block left with stored children: Python reports the orphans */
        for (Py_ssize_t i = 0; i < e->n; i++) {
            PyObject *n = PyDict_GetItemWithError(kids, hobj[i]);
            if (n == NULL) {
                if (PyErr_Occurred()) {
                    r = -1;
                    goto out;
                }
                continue;
            }
            if (!PyLong_CheckExact(n)) goto out;
            long K = PyLong_AsLong(n);
            if (K == -1 && PyErr_Occurred()) {
                r = -1;
                goto out;
            }
            long gone = 0;
            for (Py_ssize_t j = 0; j < e->n; j++) gone += has_par[j] && par[j] == e->h[i];
            if (K > gone) goto out;
        }
    }
    cur = GETF(k->removed, S_cur);
    mark = cur ? PyTuple_Pack(2, eid, index) : NULL;
    if (mark != NULL) PyObject_GC_UnTrack(mark); /* two ints */
    if (mark == NULL || !PyDict_CheckExact(cur)) {
        r = mark == NULL ? -1 : 0;
        goto out;
    }
    for (Py_ssize_t i = 0; i < e->n; i++) {
        PyObject *rec = recs[i]; /* live has not changed but for the blocks before this one, all distinct */
        Py_INCREF(rec);
        if (PyDict_DelItem(live, hobj[i]) < 0 || PyDict_SetItem(cur, hobj[i], mark) < 0) {
            Py_DECREF(rec);
            r = -1;
            goto out;
        }
        PyObject *p = PyTuple_GET_ITEM(rec, 1);
        if (p != Py_None && kids_dec(kids, p) < 0) {
            Py_DECREF(rec);
            r = -1;
            goto out;
        }
        Py_DECREF(rec);
    }
    /* the recent removals rotate when full, as on_removed leaves them */
    PyObject *cap = GETF(k->removed, S_cap);
    Py_ssize_t cp = cap == NULL ? -1 : PyLong_AsSsize_t(cap);
    Py_XDECREF(cap);
    if (cp < 0) {
        r = -1;
        goto out;
    }
    if (PyDict_GET_SIZE(cur) >= cp) {
        PyObject *x = PyObject_CallMethodNoArgs(k->removed, S_rotate);
        if (x == NULL) {
            r = -1;
            goto out;
        }
        Py_DECREF(x);
    }
    r = 1;
out:
    for (Py_ssize_t i = 0; i < made; i++) Py_DECREF(hobj[i]);
    Py_XDECREF(cur);
    Py_XDECREF(mark);
    return r;
}

/* raw_stored on a tier held in LiveTable/KidsTable: the same checks and
 * effects on the slots (1 applied, 0 not taken with nothing changed, -1
 * error); a tier with odd entries is left to the Python path */
static int raw_stored_t(const rawev *e, rawkey *k, uint64_t eid, PyObject *index, int chain, uint64_t seed) {
    LiveTable *L = (LiveTable *)k->live;
    KidsTable *K = (KidsTable *)k->kids;
    if (odd_size(L->odd) || odd_size(K->odd)) return 0;
    int64_t idx;
    if (!PyLong_CheckExact(index) || !val_i64(index, &idx)) return 0;
    if (e->has_parent && k->anchored && live_find(&L->t, e->parent) == NULL) return 0;
    if (e->has_parent) { /* a child count one more would not fit its slot: the Python path */
        kids_slot *ps = kids_find(&K->t, e->parent);
        if (ps != NULL && ps->count == INT32_MAX) return 0;
    }
    uint64_t prev = e->parent;
    for (Py_ssize_t i = 0; i < e->n; i++) {
        uint64_t h = e->h[i];
        if (chain) {
#if HAVE_XXH3_16
            if (i == 0 && !e->has_parent ? h != e->th[i] : xxh3_16(prev, e->th[i], seed) != h) return 0;
#else
            return 0;
#endif
        }
        for (Py_ssize_t j = 0; j < i; j++)
            if (e->h[j] == h) return 0; /* named twice: the reference reports it */
        if (live_find(&L->t, h) != NULL) return 0;
        prev = h;
    }
    if (live_reserve(&L->t, e->n) < 0 || kids_reserve(&K->t, e->n) < 0) return -1;
    int has = e->has_parent;
    prev = e->parent;
    for (Py_ssize_t i = 0; i < e->n; i++) {
        int fresh;
        live_slot *s = live_put(&L->t, e->h[i], &fresh);
        s->parent = has ? prev : 0;
        s->eid = eid;
        s->index = idx;
        s->copies = 1;
        s->flags = SLOT_USED | (has ? SLOT_PARENT : 0u);
        if (has) kt_inc(K, prev);
        prev = e->h[i];
        has = 1;
    }
    return 1;
}

/* raw_removed on a tier held in LiveTable/KidsTable (see raw_stored_t) */
static int raw_removed_t(const rawev *e, rawkey *k, PyObject *eid, PyObject *index, int strict) {
    LiveTable *L = (LiveTable *)k->live;
    KidsTable *K = (KidsTable *)k->kids;
    if (odd_size(L->odd) || odd_size(K->odd)) return 0;
    uint64_t par[RAW_MAX_REMOVED];
    char has_par[RAW_MAX_REMOVED];
    for (Py_ssize_t i = 0; i < e->n; i++) {
        for (Py_ssize_t j = 0; j < i; j++)
            if (e->h[j] == e->h[i]) return 0;
        live_slot *s = live_find(&L->t, e->h[i]);
        if (s == NULL) return 0;
        has_par[i] = (s->flags & SLOT_PARENT) != 0;
        par[i] = s->parent;
        if (has_par[i]) { /* a count the decrements below could take out of its slot's range */
            kids_slot *ps = kids_find(&K->t, par[i]);
            if (ps != NULL && ps->count < INT32_MIN + RAW_MAX_REMOVED) return 0;
        }
    }
    if (strict) { /* a block left with stored children: Python reports the orphans */
        for (Py_ssize_t i = 0; i < e->n; i++) {
            kids_slot *s = kids_find(&K->t, e->h[i]);
            if (s == NULL) continue;
            long gone = 0;
            for (Py_ssize_t j = 0; j < e->n; j++) gone += has_par[j] && par[j] == e->h[i];
            if (s->count > gone) return 0;
        }
    }
    int r = 0;
    PyObject *cur = GETF(k->removed, S_cur);
    PyObject *mark = cur ? PyTuple_Pack(2, eid, index) : NULL;
    if (mark != NULL) PyObject_GC_UnTrack(mark); /* two ints */
    if (mark == NULL || !PyDict_CheckExact(cur)) {
        r = mark == NULL ? -1 : 0;
        goto out;
    }
    for (Py_ssize_t i = 0; i < e->n; i++) {
        PyObject *ho = PyLong_FromUnsignedLongLong(e->h[i]);
        if (ho == NULL || PyDict_SetItem(cur, ho, mark) < 0) {
            Py_XDECREF(ho);
            r = -1;
            goto out;
        }
        Py_DECREF(ho);
        live_remove(&L->t, live_find(&L->t, e->h[i])); /* found above; the blocks are distinct */
        if (has_par[i]) kt_dec(K, par[i]);
    }
    /* the recent removals rotate when full, as on_removed leaves them */
    PyObject *cap = GETF(k->removed, S_cap);
    Py_ssize_t cp = cap == NULL ? -1 : PyLong_AsSsize_t(cap);
    Py_XDECREF(cap);
    if (cp < 0) {
        r = -1;
        goto out;
    }
    if (PyDict_GET_SIZE(cur) >= cp) {
        PyObject *x = PyObject_CallMethodNoArgs(k->removed, S_rotate);
        if (x == NULL) {
            r = -1;
            goto out;
        }
        Py_DECREF(x);
    }
    r = 1;
out:
    Py_XDECREF(cur);
    Py_XDECREF(mark);
    return r;
}

/* the state lines() and text() share while they run: the context read
 * once per call, the cached source and tier, the view's index */
typedef struct {
    PyObject *sources, *anchored_tiers, *hcheck, *view, *index_o;
    int chain, strict, removals;
    uint64_t seed;
    long long n_stored, n_removed;
    Py_ssize_t chained;
    rawkey key;
} rawrun;

/* read ctx (see above); 0 ok, -1 error */
static int rawrun_open(rawrun *st, PyObject *ctx, const char *name) {
    memset(st, 0, sizeof *st);
    if (!PyTuple_CheckExact(ctx) || PyTuple_GET_SIZE(ctx) != 7) {
        PyErr_Format(PyExc_TypeError, "%s(): ctx must be a tuple of 7", name);
        return -1;
    }
    st->sources = PyTuple_GET_ITEM(ctx, 0);
    st->anchored_tiers = PyTuple_GET_ITEM(ctx, 1);
    st->chain = PyObject_IsTrue(PyTuple_GET_ITEM(ctx, 2));
    st->hcheck = PyTuple_GET_ITEM(ctx, 3);
    st->view = PyTuple_GET_ITEM(ctx, 4);
    int seed_ok;
    st->seed = as_u64(PyTuple_GET_ITEM(ctx, 5), &seed_ok);
    st->strict = PyObject_IsTrue(PyTuple_GET_ITEM(ctx, 6));
    if (st->chain < 0 || st->strict < 0 || !seed_ok || !PyDict_CheckExact(st->sources)) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "%s(): bad context", name);
        return -1;
    }
    /* line() hands a Removed to Python when the hash check keeps per-block
     * state; that does not change while only this function runs */
    st->removals = 1;
    if (st->hcheck != Py_None) {
        for (int k = 0; k < 2 && st->removals; k++) {
            PyObject *d = PyObject_GetAttr(st->hcheck, k == 0 ? S_full : S_pending);
            if (d == NULL) return -1;
            int t = PyObject_IsTrue(d);
            Py_DECREF(d);
            if (t < 0) return -1;
            if (t) st->removals = 0;
        }
    }
    st->index_o = PyObject_GetAttr(st->view, S_index);
    return st->index_o == NULL ? -1 : 0;
}

/* one line's text: 1 applied, 0 not taken (nothing changed), -1 error */
static int rawrun_line(rawrun *st, const unsigned char *s, Py_ssize_t len) {
    static rawev e; /* the GIL is held throughout: one at a time */
    if (!r_line(s, len, &e)) return 0;
    if (e.kind == 2 && !st->removals) return 0;
    int f = rawkey_find(&st->key, &e, st->sources, st->anchored_tiers);
    if (f <= 0) return f;
    PyObject *nid = GETF(st->key.src, S_next_id);
    if (nid == NULL) return -1;
    int ok;
    uint64_t due = PyLong_CheckExact(nid) ? as_u64(nid, &ok) : (ok = 0);
    Py_DECREF(nid);
    if (!ok || due != e.eid) return 0;
    PyObject *eid = PyLong_FromUnsignedLongLong(e.eid);
    if (eid == NULL) return -1;
    int r;
    if (st->key.tables)
        r = e.kind == 1 ? raw_stored_t(&e, &st->key, e.eid, st->index_o, st->chain, st->seed)
                        : raw_removed_t(&e, &st->key, eid, st->index_o, st->strict);
    else
        r = e.kind == 1 ? raw_stored(&e, &st->key, eid, st->index_o, st->chain, st->seed)
                        : raw_removed(&e, &st->key, eid, st->index_o, st->strict);
    if (r == 1) {
        /* the source's next id and the view's index, as on_stored/on_removed leave them */
        PyObject *nxt = PyNumber_Add(eid, one);
        if (nxt == NULL || PyObject_SetAttr(st->key.src, S_next_id, nxt) < 0) r = -1;
        Py_XDECREF(nxt);
        nxt = r == 1 ? PyNumber_Add(st->index_o, one) : NULL;
        if (nxt == NULL)
            r = -1;
        else
            Py_SETREF(st->index_o, nxt);
    }
    Py_DECREF(eid);
    if (r == 1) {
        if (e.kind == 1) {
            st->n_stored++;
            if (st->chain && st->hcheck != Py_None) st->chained += e.n;
        } else {
            st->n_removed++;
        }
    }
    return r;
}

/* hand back the view's index and the chain count; 0 ok, -1 error */
static int rawrun_close(rawrun *st) {
    rawkey_clear(&st->key);
    chain_blocks += st->chained; /* handed over by take_chain_blocks(), as line() does */
    int err = st->index_o != NULL && PyObject_SetAttr(st->view, S_index, st->index_o) < 0;
    Py_XDECREF(st->index_o);
    return err ? -1 : 0;
}

static PyObject *fv_lines(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "lines(ctx, lines, start): ctx a tuple of 7, lines a list");
        return NULL;
    }
    PyObject *lines = args[1];
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    rawrun st;
    if (rawrun_open(&st, args[0], "lines") < 0) {
        Py_XDECREF(st.index_o);
        return NULL;
    }
    Py_ssize_t n_lines = PyList_GET_SIZE(lines), i = start < 0 ? 0 : start;
    int err = 0;
    for (; i < n_lines; i++) {
        PyObject *line = PyList_GET_ITEM(lines, i);
        if (!PyBytes_CheckExact(line)) break;
        int r = rawrun_line(&st, (const unsigned char *)PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line));
        if (r <= 0) {
            err = r < 0;
            break;
        }
    }
    if (rawrun_close(&st) < 0) err = 1;
    if (err) return NULL;
    return Py_BuildValue("(nLL)", i, st.n_stored, st.n_removed);
}

/* text(ctx, buf, pos, end) -> (pos, lines, stored, removed): the lines of
 * buf[pos:end] read in place, without a bytes object per line (a line ends
 * at b"\n", which is not part of it, or at end), as lines() reads a list of
 * them: it stops at the first line it does not take whole and returns the
 * offset where that line starts (end: all were taken) and how many lines it
 * took. The caller splits off that one line, runs its own path for it and
 * calls again after it. */
static PyObject *fv_text(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "text(ctx, buf, pos, end): buf bytes");
        return NULL;
    }
    PyObject *buf = args[1];
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]), end = PyLong_AsSsize_t(args[3]);
    if ((pos == -1 || end == -1) && PyErr_Occurred()) return NULL;
    Py_ssize_t size = PyBytes_GET_SIZE(buf);
    if (pos < 0 || end > size || pos > end) {
        PyErr_SetString(PyExc_ValueError, "text(): need 0 <= pos <= end <= len(buf)");
        return NULL;
    }
    rawrun st;
    if (rawrun_open(&st, args[0], "text") < 0) {
        Py_XDECREF(st.index_o);
        return NULL;
    }
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(buf);
    Py_ssize_t taken = 0;
    int err = 0;
    while (pos < end) {
        const unsigned char *s = base + pos;
        const unsigned char *nl = memchr(s, '\n', (size_t)(end - pos));
        Py_ssize_t len = nl != NULL ? nl - s : end - pos;
        int r = rawrun_line(&st, s, len);
        if (r <= 0) {
            err = r < 0;
            break;
        }
        taken++;
        pos = nl != NULL ? pos + len + 1 : end;
    }
    if (rawrun_close(&st) < 0) err = 1;
    if (err) return NULL;
    return Py_BuildValue("(nnLL)", pos, taken, st.n_stored, st.n_removed);
}

/* xxh3_16(a, b, seed) -> int: XXH3-64 of a and b as little-endian u64
 * (Dynamo's chain step), or None where the compiler has no 128-bit ints
 * (the chain then goes through the xxhash package); tests compare it */
static PyObject *fv_xxh3_16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "xxh3_16(a, b, seed)");
        return NULL;
    }
    uint64_t v[3];
    for (int i = 0; i < 3; i++) {
        int ok;
        v[i] = as_u64(args[i], &ok);
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "xxh3_16(): arguments are u64");
            return NULL;
        }
    }
#if HAVE_XXH3_16
    return PyLong_FromUnsignedLongLong(xxh3_16(v[0], v[1], v[2]));
#else
    Py_RETURN_NONE;
#endif
}

static PyMethodDef methods[] = {
    {"stored", (PyCFunction)(void (*)(void))fv_stored, METH_FASTCALL, "apply a clean Dynamo Stored (see fastview.py)"},
    {"removed", (PyCFunction)(void (*)(void))fv_removed, METH_FASTCALL, "apply a clean Removed (see fastview.py)"},
    {"line", (PyCFunction)(void (*)(void))fv_line, METH_FASTCALL, "apply a clean decoded RouterEvent line"},
    {"lines", (PyCFunction)(void (*)(void))fv_lines, METH_FASTCALL, "apply clean RouterEvent JSON lines read here"},
    {"text", (PyCFunction)(void (*)(void))fv_text, METH_FASTCALL, "apply clean RouterEvent JSON lines of a buffer"},
    {"take_chain_blocks", fv_take_chain_blocks, METH_NOARGS, "blocks line() chain-checked since the last call"},
    {"vllm_event", (PyCFunction)(void (*)(void))fv_vllm_event, METH_FASTCALL, "apply a clean vLLM event"},
    {"sha256", fv_sha256, METH_O, "SHA-256 digest of bytes"},
    {"parse_u64", fv_parse_u64, METH_O, "the line reader's unsigned integer parser, or None"},
    {"xxh3_16", (PyCFunction)(void (*)(void))fv_xxh3_16, METH_FASTCALL, "XXH3-64 of two u64 with a seed"},
    {"vllm_pickle", (PyCFunction)(void (*)(void))fv_vllm_pickle, METH_FASTCALL,
     "pickle.dumps((parent, tuple(tokens), None), protocol=5), or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kvspec_fastview", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kvspec_fastview(void) {
    s_block_hash = PyUnicode_InternFromString("block_hash");
    s_tokens_hash = PyUnicode_InternFromString("tokens_hash");
    one = PyLong_FromLong(1);
    if (s_block_hash == NULL || s_tokens_hash == NULL || one == NULL) return NULL;
#define INTERN(v, text)                               \
    if ((v = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;
    INTERN(S_worker_id, "worker_id")
    INTERN(S_event, "event")
    INTERN(S_event_id, "event_id")
    INTERN(S_dp_rank, "dp_rank")
    INTERN(S_data, "data")
    INTERN(S_storage_tier, "storage_tier")
    INTERN(S_stored, "stored")
    INTERN(S_removed, "removed")
    INTERN(S_parent_hash, "parent_hash")
    INTERN(S_blocks, "blocks")
    INTERN(S_block_hashes, "block_hashes")
    INTERN(S_next_id, "next_id")
    INTERN(S_tiers, "tiers")
    INTERN(S_live, "live")
    INTERN(S_kids, "kids")
    INTERN(S_cur, "cur")
    INTERN(S_index, "index")
    INTERN(S_full, "full")
    INTERN(S_pending, "pending")
    INTERN(S_rotate, "rotate")
    INTERN(S_cap, "cap")
    INTERN(S_parent_block_hash, "parent_block_hash")
    INTERN(S_token_ids, "token_ids")
    INTERN(S_block_size, "block_size")
    INTERN(S_extra_keys, "extra_keys")
    INTERN(S_medium, "medium")
    INTERN(S_group_idx, "group_idx")
    INTERN(S_digest, "digest")
    INTERN(S_checked_blocks, "checked_blocks")
    INTERN(S_pop, "pop")
    for (int i = 0; i < N_TIERS; i++) INTERN(tier_objs[i], tier_names[i])
    if (PyType_Ready(&LiveTable_Type) < 0 || PyType_Ready(&KidsTable_Type) < 0) return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) return NULL;
    if (PyModule_AddObjectRef(mod, "LiveTable", (PyObject *)&LiveTable_Type) < 0 ||
        PyModule_AddObjectRef(mod, "KidsTable", (PyObject *)&KidsTable_Type) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
