/* syncmgr._fastpath: plain scalars (None, bool, int, float, str, bytes of
 * exact types) encoded and decoded as the socket path stores them (0xC1 +
 * one msgpack object, pyclient/syncmgr/_values.py), straight into and out
 * of a queue's ring (fp_queue.c), without Python's encoder. */
#include "fastpath.h"

#define TAG 0xC1

static void be(unsigned char *p, uint64_t v, int n) {
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

/* A msgpack str 8/16/32 or bin 8/16/32 length header: code8 is the 8-bit
 * form's code (0xd9 str, 0xc4 bin); the 16- and 32-bit forms follow it.
 * Returns the end of the header, or NULL for a length over 2^32-1. */
static unsigned char *len_header(unsigned char *h, uint64_t n, unsigned char code8) {
    int w = n <= 0xff ? 1 : n <= 0xffff ? 2 : n <= 0xffffffffULL ? 4 : 0;
    if (w == 0)
        return NULL;
    *h++ = (unsigned char)(code8 + (w == 1 ? 0 : w == 2 ? 1 : 2));
    be(h, n, w);
    return h + w;
}

static uint64_t rd_be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* Encodes o's header into hdr (at most 10 bytes) and points *body at its
 * bytes, if any. 1: done; 0: not a plain scalar (Python encodes it); -1:
 * an exception. */
int encode_scalar(PyObject *o, unsigned char *hdr, uint64_t *nh, const void **body, uint64_t *nb) {
    unsigned char *h = hdr;
    *h++ = TAG;
    *body = NULL;
    *nb = 0;
    if (o == Py_None) {
        *h++ = 0xc0;
    } else if (o == Py_False || o == Py_True) {
        *h++ = o == Py_True ? 0xc3 : 0xc2;
    } else if (PyLong_CheckExact(o)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(o);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0; /* past 2**64: Python pickles it */
            }
            *h++ = 0xcf;
            be(h, u, 8);
            h += 8;
        } else if (overflow < 0) {
            return 0;
        } else if (v == -1 && PyErr_Occurred()) {
            return -1;
        } else if (v >= 0 && v <= 127) {
            *h++ = (unsigned char)v;
        } else if (v < 0 && v >= -32) {
            *h++ = (unsigned char)(0xe0 | (v + 32));
        } else if (v > 0) {
            int n = v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffLL ? 4 : 8;
            *h++ = n == 1 ? 0xcc : n == 2 ? 0xcd : n == 4 ? 0xce : 0xcf;
            be(h, (uint64_t)v, n);
            h += n;
        } else {
            int n = v >= -128 ? 1 : v >= -32768 ? 2 : v >= -2147483648LL ? 4 : 8;
            *h++ = n == 1 ? 0xd0 : n == 2 ? 0xd1 : n == 4 ? 0xd2 : 0xd3;
            be(h, (uint64_t)v, n);
            h += n;
        }
    } else if (PyFloat_CheckExact(o)) {
        double d = PyFloat_AS_DOUBLE(o);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        *h++ = 0xcb;
        be(h, bits, 8);
        h += 8;
    } else if (PyUnicode_CheckExact(o)) {
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(o, &n);
        if (u == NULL) { /* lone surrogates: Python pickles it */
            PyErr_Clear();
            return 0;
        }
        if (n < 32)
            *h++ = (unsigned char)(0xa0 | n);
        else if ((h = len_header(h, (uint64_t)n, 0xd9)) == NULL)
            return 0;
        *body = u;
        *nb = (uint64_t)n;
    } else if (PyBytes_CheckExact(o)) {
        Py_ssize_t n = PyBytes_GET_SIZE(o);
        if ((h = len_header(h, (uint64_t)n, 0xc4)) == NULL)
            return 0;
        *body = PyBytes_AS_STRING(o);
        *nb = (uint64_t)n;
    } else {
        return 0;
    }
    *nh = (uint64_t)(h - hdr);
    return 1;
}

/* Decodes a record that is exactly 0xC1 + one plain scalar; NULL without an
 * exception when it is anything else (Python decodes it). */
PyObject *decode_scalar(const unsigned char *p, uint64_t n) {
    if (n < 2 || p[0] != TAG)
        return NULL;
    unsigned char c = p[1];
    const unsigned char *q = p + 2;
    uint64_t left = n - 2, len;
    if (c <= 0x7f)
        return left == 0 ? PyLong_FromLong(c) : NULL;
    if (c >= 0xe0)
        return left == 0 ? PyLong_FromLong((long)(signed char)c) : NULL;
    if ((c & 0xe0) == 0xa0) {
        len = c & 0x1f;
        goto str;
    }
    switch (c) {
    case 0xc0:
        if (left == 0)
            Py_RETURN_NONE;
        return NULL;
    case 0xc2:
    case 0xc3:
        if (left != 0)
            return NULL;
        return PyBool_FromLong(c == 0xc3);
    case 0xcc: case 0xcd: case 0xce: case 0xcf: {
        int k = 1 << (c - 0xcc);
        if (left != (uint64_t)k)
            return NULL;
        return PyLong_FromUnsignedLongLong(rd_be(q, k));
    }
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        int k = 1 << (c - 0xd0);
        if (left != (uint64_t)k)
            return NULL;
        uint64_t v = rd_be(q, k);
        int sh = 64 - 8 * k;
        return PyLong_FromLongLong((long long)(v << sh) >> sh);
    }
    case 0xcb: {
        if (left != 8)
            return NULL;
        uint64_t bits = rd_be(q, 8);
        double d;
        memcpy(&d, &bits, 8);
        return PyFloat_FromDouble(d);
    }
    case 0xc4: case 0xc5: case 0xc6: case 0xd9: case 0xda: case 0xdb: {
        int k = (c == 0xc4 || c == 0xd9) ? 1 : (c == 0xc5 || c == 0xda) ? 2 : 4;
        if (left < (uint64_t)k)
            return NULL;
        len = rd_be(q, k);
        q += k;
        left -= (uint64_t)k;
        if (c >= 0xd9)
            goto str;
        if (len != left)
            return NULL;
        return PyBytes_FromStringAndSize((const char *)q, (Py_ssize_t)len);
    }
    default:
        return NULL;
    }
str:
    if (len != left)
        return NULL;
    {
        PyObject *u = PyUnicode_DecodeUTF8((const char *)q, (Py_ssize_t)len, "strict");
        if (u == NULL)
            PyErr_Clear(); /* msgpack refuses it too: Python reports it */
        return u;
    }
}

/* pack_bins(items: list) -> bytes | None: the MessagePack array of bins
 * that a socket put_many sends as its items (each bin 0xC1 + the item's
 * msgpack, as _values.dumps stores a plain scalar), when every item is a
 * plain scalar; None when one is anything else (Python encodes the batch).
 * Two passes over the list, the first to size the result; no Python code
 * runs between them (exact types only), so the list cannot change. */
PyObject *pack_bins(PyObject *Py_UNUSED(m), PyObject *items) {
    if (!PyList_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "pack_bins takes a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    if ((uint64_t)n > 0xffffffffULL)
        Py_RETURN_NONE;
    unsigned char hdr[16];
    const void *body;
    uint64_t nh, nb, total = 5;
    for (Py_ssize_t i = 0; i < n; i++) {
        int e = encode_scalar(PyList_GET_ITEM(items, i), hdr, &nh, &body, &nb);
        if (e < 0)
            return NULL;
        if (e == 0 || nh + nb > 0xffffffffULL)
            Py_RETURN_NONE;
        total += 5 + nh + nb;
    }
    if (total > (uint64_t)PY_SSIZE_T_MAX)
        Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL)
        return NULL;
    unsigned char *start = (unsigned char *)PyBytes_AS_STRING(out), *p = start;
    if (n < 16) {
        *p++ = (unsigned char)(0x90 | n);
    } else if (n <= 0xffff) {
        *p++ = 0xdc;
        be(p, (uint64_t)n, 2);
        p += 2;
    } else {
        *p++ = 0xdd;
        be(p, (uint64_t)n, 4);
        p += 4;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (encode_scalar(PyList_GET_ITEM(items, i), hdr, &nh, &body, &nb) != 1) {
            Py_DECREF(out); /* cannot happen: the first pass encoded it */
            PyErr_SetString(PyExc_RuntimeError, "pack_bins: an item changed while it was encoded");
            return NULL;
        }
        p = len_header(p, nh + nb, 0xc4);
        memcpy(p, hdr, nh);
        p += nh;
        if (nb > 0)
            memcpy(p, body, nb);
        p += nb;
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)(p - start)) < 0)
        return NULL;
    return out;
}

/* loads_bins(datas: list, fallback) -> list: the values of a socket
 * get_many's reply (a list of stored records), each plain scalar decoded
 * here and any other record (a pickle, an out-of-band item, a record that
 * is not bytes) by fallback(record), Python's _values.loads. An exception
 * from fallback ends the call and is raised; nothing is half-returned. */
PyObject *loads_bins(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "loads_bins(datas: list, fallback: callable)");
        return NULL;
    }
    PyObject *datas = args[0], *fallback = args[1];
    Py_ssize_t n = PyList_GET_SIZE(datas);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* fallback may run Python code that changes datas: the list's size
         * is read again, and each record is held while it is decoded. */
        if (i >= PyList_GET_SIZE(datas)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_RuntimeError, "loads_bins: the list changed while it was decoded");
            return NULL;
        }
        PyObject *d = PyList_GET_ITEM(datas, i), *v = NULL;
        Py_INCREF(d);
        if (PyBytes_CheckExact(d))
            v = decode_scalar((const unsigned char *)PyBytes_AS_STRING(d), (uint64_t)PyBytes_GET_SIZE(d));
        if (v == NULL && !PyErr_Occurred())
            v = PyObject_CallOneArg(fallback, d);
        Py_DECREF(d);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}
