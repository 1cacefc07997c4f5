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
 * Built by fastview.py with the machine's C compiler at first use (cached);
 * tests/test_check_log_fused.py runs it beside the reference path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *s_block_hash, *s_tokens_hash, *one;

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
    Py_ssize_t done = 0;
    PyObject *prev = parent;
    int clean = 1;
    for (Py_ssize_t i = 0; i < n && clean; i++) {
        PyObject *b = PyList_GET_ITEM(blocks, i);
        PyObject *h = PyObject_GetAttr(b, s_block_hash);
        if (h == NULL) goto error;
        PyObject *th = PyObject_GetAttr(b, s_tokens_hash);
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
        PyObject *h = PyObject_GetAttr(b, s_block_hash);
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
    w = PyObject_GetAttr(m, S_worker_id);
    if (w == NULL) goto error;
    as_u64(w, &ok);
    if (!ok) goto done;
    ev = PyObject_GetAttr(m, S_event);
    if (ev == NULL) goto error;
    eid = PyObject_GetAttr(ev, S_event_id);
    if (eid == NULL) goto error;
    as_u64(eid, &ok);
    if (!ok) goto done;
    data = PyObject_GetAttr(ev, S_data);
    if (data == NULL) goto error;
    if ((PyObject *)Py_TYPE(data) != data_type) goto done;
    dp = PyObject_GetAttr(ev, S_dp_rank);
    if (dp == NULL) goto error;
    key = PyTuple_Pack(2, w, dp);
    if (key == NULL) goto error;
    src = PyDict_GetItemWithError(sources, key); /* borrowed */
    if (src == NULL) {
        if (PyErr_Occurred()) goto error;
        goto done;
    }
    Py_INCREF(src);
    nid = PyObject_GetAttr(src, S_next_id);
    if (nid == NULL) goto error;
    int same = PyObject_RichCompareBool(nid, eid, Py_EQ);
    if (same < 0) goto error;
    if (!same) goto done;
    tname = PyObject_GetAttr(m, S_storage_tier);
    if (tname == NULL) goto error;
    tiers = PyObject_GetAttr(src, S_tiers);
    if (tiers == NULL) goto error;
    if (!PyDict_CheckExact(tiers)) goto done;
    tier = PyDict_GetItemWithError(tiers, tname); /* borrowed */
    if (tier == NULL) {
        if (PyErr_Occurred()) goto error;
        goto done;
    }
    Py_INCREF(tier);
    live = PyObject_GetAttr(tier, S_live);
    if (live == NULL) goto error;
    kids = PyObject_GetAttr(tier, S_kids);
    if (kids == NULL) goto error;
    index = PyObject_GetAttr(view, S_index);
    if (index == NULL) goto error;
    st = PyObject_GetAttr(data, S_stored);
    if (st == NULL) goto error;
    rm = PyObject_GetAttr(data, S_removed);
    if (rm == NULL) goto error;
    if (st != Py_None && rm == Py_None) {
        PyObject *parent = PyObject_GetAttr(st, S_parent_hash);
        if (parent == NULL) goto error;
        PyObject *blocks = PyObject_GetAttr(st, S_blocks);
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
        PyObject *hs = PyObject_GetAttr(rm, S_block_hashes);
        if (hs == NULL) goto error;
        PyObject *removed = PyObject_GetAttr(tier, S_removed);
        if (removed == NULL) {
            Py_DECREF(hs);
            goto error;
        }
        PyObject *cur = PyObject_GetAttr(removed, S_cur);
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
            PyObject *cap = PyObject_GetAttr(removed, S_cap);
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
    return PyLong_FromLong(code);
error:
    code = -1;
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
    return NULL;
}

static PyMethodDef methods[] = {
    {"stored", (PyCFunction)(void (*)(void))fv_stored, METH_FASTCALL, "apply a clean Dynamo Stored (see fastview.py)"},
    {"removed", (PyCFunction)(void (*)(void))fv_removed, METH_FASTCALL, "apply a clean Removed (see fastview.py)"},
    {"line", (PyCFunction)(void (*)(void))fv_line, METH_FASTCALL, "apply a clean decoded RouterEvent line"},
    {"take_chain_blocks", fv_take_chain_blocks, METH_NOARGS, "blocks line() chain-checked since the last call"},
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
    return PyModule_Create(&module);
}
