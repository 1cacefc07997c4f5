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
static PyObject *fv_stored(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "stored() takes 10 arguments");
        return NULL;
    }
    PyObject *live = args[0], *kids = args[1], *parent = args[2], *blocks = args[3];
    PyObject *eid = args[4], *index = args[5];
    int anchored = PyObject_IsTrue(args[6]), chain = PyObject_IsTrue(args[7]);
    PyObject *xxh = args[8], *seed = args[9];
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

/* removed(live, kids, recent, hashes, mark) -> int
 * 0: a block is not stored or is named twice (nothing changed); 1: applied;
 * 2: applied, and a removed block still has stored children (the caller
 * reports the orphans). */
static PyObject *fv_removed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "removed() takes 5 arguments");
        return NULL;
    }
    PyObject *live = args[0], *kids = args[1], *recent = args[2], *hs = args[3], *mark = args[4];
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

static PyMethodDef methods[] = {
    {"stored", (PyCFunction)(void (*)(void))fv_stored, METH_FASTCALL, "apply a clean Dynamo Stored (see fastview.py)"},
    {"removed", (PyCFunction)(void (*)(void))fv_removed, METH_FASTCALL, "apply a clean Removed (see fastview.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kvspec_fastview", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kvspec_fastview(void) {
    s_block_hash = PyUnicode_InternFromString("block_hash");
    s_tokens_hash = PyUnicode_InternFromString("tokens_hash");
    one = PyLong_FromLong(1);
    if (s_block_hash == NULL || s_tokens_hash == NULL || one == NULL) return NULL;
    return PyModule_Create(&module);
}
