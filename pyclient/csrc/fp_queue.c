/* syncmgr._fastpath: Queue: the Ring type, the Python face of a queue's
 * records in the daemon's shared ring: encoding and decoding items, the
 * batches, and the module functions. The ring's protocol (the latch, room,
 * records, sleeps, one-store commits) is fp_ring.c's. */
#include "fp_ring.h"

/* The put loop for an encoded item in two pieces (a header and a body). */
static int put_core(Ring *r, const void *a, uint64_t na, const void *b, uint64_t nb, double timeout) {
    Part parts[2] = {{a, na}, {b, nb}};
    return put_corev(r, parts, 2, na + nb, timeout);
}

/* put(data, timeout) -> OK | BUSY (full at the deadline) | DAEMON */
static PyObject *ring_put(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "put");
    Py_buffer b;
    double timeout;
    if (get_timeout(args[1], &timeout) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0)
        return NULL;
    int res = put_core(r, b.buf, (uint64_t)b.len, NULL, 0, timeout);
    PyBuffer_Release(&b);
    return result(res);
}

/* put_parts(parts, timeout) -> OK | BUSY | DAEMON: one item whose encoding
 * is the concatenation of parts (objects with the buffer protocol, e.g. a
 * header and a pickle's out-of-band buffers), gathered straight into the
 * ring record under the latch: one copy, no joined bytes object. */
static PyObject *ring_put_parts(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "put_parts");
    double timeout;
    if (get_timeout(args[1], &timeout) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "put_parts takes a sequence of buffers");
    if (seq == NULL)
        return NULL;
    Py_ssize_t np = PySequence_Fast_GET_SIZE(seq);
    if (np < 1 || np > MAX_PARTS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "put_parts takes 1 to %d buffers", MAX_PARTS);
        return NULL;
    }
    Py_buffer *bufs = PyMem_Calloc((size_t)np, sizeof(Py_buffer));
    Part *parts = PyMem_Calloc((size_t)np, sizeof(Part));
    PyObject *out = NULL;
    Py_ssize_t got = 0;
    uint64_t n = 0;
    if (bufs == NULL || parts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < np; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &bufs[got], PyBUF_SIMPLE) < 0)
            goto done;
        parts[got].p = bufs[got].buf;
        parts[got].n = (uint64_t)bufs[got].len;
        n += parts[got].n;
    }
    int res = n > r->inline_max ? RES_DAEMON : put_corev(r, parts, (int)np, n, timeout);
    out = result(res);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    PyMem_Free(parts);
    Py_DECREF(seq);
    return out;
}

/* Py_NewRef, which Python 3.9 lacks. */
static inline PyObject *new_ref(PyObject *o) {
    Py_INCREF(o);
    return o;
}

/* Sentinels of put_item and get_item, whose results may be any item
 * (QEMPTY means full for put_item, empty for get_item). */
static PyObject *Q_ENCODE, *Q_NONE, *Q_DAEMON;

/* put_item(item, timeout) -> None (stored) | BUSY | DAEMON | ENCODE (not a
 * plain scalar: encode it in Python and call put) */
static PyObject *ring_put_item(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "put_item");
    double timeout;
    if (get_timeout(args[1], &timeout) < 0)
        return NULL;
    unsigned char hdr[16];
    uint64_t nh, nb;
    const void *body;
    int e = encode_scalar(args[0], hdr, &nh, &body, &nb);
    if (e < 0)
        return NULL;
    if (e == 0)
        return new_ref(Q_ENCODE);
    int res = put_core(r, hdr, nh, body, nb, timeout);
    if (res < 0)
        return NULL;
    if (res == RES_OK)
        Py_RETURN_NONE;
    return new_ref(res == RES_NONE ? Q_NONE : Q_DAEMON);
}

/* One put_many item's encoding: a bytearray Python encoded, a plain
 * scalar the extension encodes into hdr (its body stays in the object), or
 * a list of buffers to gather (an item with large buffers: parts). */
typedef struct {
    unsigned char hdr[16];
    const void *a, *b;
    uint64_t na, nb;
    Part *parts; /* non-NULL: the item is these nparts pieces, na bytes in all */
    int nparts;
} BatchItem;

/* The buffers of put_many's list items, exported for the whole call (their
 * owners cannot resize or free them meanwhile). */
typedef struct {
    Py_buffer *bufs;
    Part *parts;
    Py_ssize_t n;
} BatchBufs;

static void batch_bufs_release(BatchBufs *bb) {
    for (Py_ssize_t i = 0; i < bb->n; i++)
        PyBuffer_Release(&bb->bufs[i]);
    PyMem_Free(bb->bufs);
    PyMem_Free(bb->parts);
}

/* Exports the buffers of every list item and points its BatchItem at them.
 * -1: an error (what was exported is released by the caller). */
static int batch_bufs_get(PyObject **items, Py_ssize_t n, BatchItem *bi, BatchBufs *bb) {
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        bi[i].parts = NULL;
        bi[i].nparts = 0;
        if (PyList_CheckExact(items[i])) {
            Py_ssize_t np = PyList_GET_SIZE(items[i]);
            if (np < 1 || np > MAX_PARTS) {
                PyErr_Format(PyExc_ValueError, "a put_many item of pieces takes 1 to %d buffers", MAX_PARTS);
                return -1;
            }
            total += np;
        }
    }
    if (total == 0)
        return 0;
    bb->bufs = PyMem_Calloc((size_t)total, sizeof(Py_buffer));
    bb->parts = PyMem_Calloc((size_t)total, sizeof(Part));
    if (bb->bufs == NULL || bb->parts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyList_CheckExact(items[i]))
            continue;
        Py_ssize_t np = PyList_GET_SIZE(items[i]);
        bi[i].parts = &bb->parts[bb->n];
        bi[i].nparts = (int)np;
        bi[i].na = 0;
        for (Py_ssize_t j = 0; j < np; j++) {
            Py_buffer *b = &bb->bufs[bb->n];
            if (PyObject_GetBuffer(PyList_GET_ITEM(items[i], j), b, PyBUF_SIMPLE) < 0)
                return -1;
            bb->parts[bb->n].p = b->buf;
            bb->parts[bb->n].n = (uint64_t)b->len;
            bi[i].na += (uint64_t)b->len;
            bb->n++;
        }
        bi[i].nb = 0;
    }
    return 0;
}

/* Encodes items[0..n) into bi (under the latch: a bytearray's buffer is
 * read where it is now). 1: all encoded and each fits the ring's inline
 * limit; 0: one is too large or not encodable here (the daemon takes the
 * batch); -1: an encoding error. */
static int batch_encode(Ring *r, PyObject **items, Py_ssize_t n, BatchItem *bi) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = items[i];
        BatchItem *x = &bi[i];
        if (x->parts != NULL) { /* exported by batch_bufs_get */
        } else if (PyByteArray_CheckExact(it)) {
            x->a = PyByteArray_AS_STRING(it);
            x->na = (uint64_t)PyByteArray_GET_SIZE(it);
            x->b = NULL;
            x->nb = 0;
        } else {
            int e = encode_scalar(it, x->hdr, &x->na, &x->b, &x->nb);
            if (e <= 0)
                return e;
            x->a = x->hdr;
        }
        if (x->na + x->nb > r->inline_max)
            return 0;
    }
    return 1;
}

/* put_many(items, timeout) -> OK | BUSY (no room for all of them at the
 * deadline) | DAEMON: every item (a bytearray Python encoded, a plain
 * scalar, or a list of buffers to gather: an item with large buffers) goes in, adjacent and in order, under one latch and one commit,
 * or none does. DAEMON, with nothing stored: the daemon's flags, an item
 * over the inline limit or not encodable here, a batch of more than half
 * the ring's bytes or more items than maxsize (the daemon's put_many takes
 * those), the ring short of bytes for them (the daemon keeps what it has
 * no room for), or a corrupt ring. While the queue's count has no room for
 * all it waits, as put does. */
static PyObject *ring_put_many(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "put_many");
    double timeout;
    if (get_timeout(args[1], &timeout) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "put_many takes a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    BatchItem *bi = n > 0 ? PyMem_Malloc((size_t)n * sizeof(BatchItem)) : NULL;
    int res = RES_OK;
    Wait wt = {.started = 0};
    BatchBufs bb = {NULL, NULL, 0};
    if (n > 0 && bi == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    if (n > 0 && batch_bufs_get(items, n, bi, &bb) < 0)
        res = -1;
    if (res == RES_OK && r->maxsize && (uint64_t)n > r->maxsize)
        res = RES_DAEMON;
    while (n > 0 && res == RES_OK) {
        if ((res = op_begin(r)) != 0)
            break;
        STEP(1);
        int e = batch_encode(r, items, n, bi);
        if (e <= 0) {
            latch_free(r, 0);
            res = e < 0 ? -1 : RES_DAEMON;
            break;
        }
        uint64_t t0 = LOAD(W64(r, R_TAIL)), head = LOAD(W64(r, R_HEAD)), t = t0;
        uint64_t hp = head & POS_MASK, hn = head >> POS_BITS, tp0 = t0 & POS_MASK;
        uint64_t used0 = (tp0 - hp) & POS_MASK, cnt = ((t0 >> POS_BITS) - hn) & COUNT_MASK, need = 0;
        if (used0 > r->cap || tp0 % REC_HEADER || hp % REC_HEADER) {
            latch_free(r, 0);
            res = RES_DAEMON; /* the daemon finds the damage */
            break;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            need += REC_HEADER + pad8(bi[i].na + bi[i].nb);
            t = ring_next_tail(r, t, hp, bi[i].na + bi[i].nb);
        }
        if (need > r->cap / 2) { /* may never fit: the daemon's over takes it */
            latch_free(r, 0);
            res = RES_DAEMON;
            break;
        }
        /* As put's ring_fits: a full count (maxsize, a JoinableQueue's
         * unfinished tasks) waits; a ring short of bytes sends the batch to
         * the daemon, which keeps what the ring has no room for (its over):
         * a put onto a queue with no maxsize never waits. */
        int count_room = (!r->maxsize || cnt + (uint64_t)n <= r->maxsize) &&
                         (!r->joinable || unfinished(r, t0) + (uint64_t)n < MAX_UNFINISHED);
        if (count_room && (((t & POS_MASK) - hp) & POS_MASK) > r->cap) {
            latch_free(r, 0);
            res = RES_DAEMON;
            break;
        }
        if (count_room) {
            t = t0;
            for (Py_ssize_t i = 0; i < n; i++)
                t = bi[i].parts != NULL ? ring_writev(r, t, bi[i].parts, bi[i].nparts, bi[i].na, 0)
                                        : ring_write2(r, t, bi[i].a, bi[i].na, bi[i].b, bi[i].nb);
            STEP(2);
            if (!latch_ours(r)) {
                res = RES_DAEMON; /* taken over: nothing committed */
                break;
            }
            STORE(W64(r, R_TAIL), t);
            STEP(3);
            latch_free(r, 1);
            break; /* res is RES_OK */
        }
        if (timeout == 0) {
            latch_free(r, 0);
            res = RES_NONE;
            break;
        }
        int sl = ring_wait(r, WAIT_PUT, &wt, timeout);
        if (sl != 1)
            res = slept_result(sl, RES_NONE);
    }
    batch_bufs_release(&bb);
    PyMem_Free(bi);
    Py_DECREF(seq);
    return result(res);
}

/* The get loop: the head item, decoded when it is a plain scalar and
 * decode is set, else as bytes; NULL with *res a result code (no
 * exception) or with an exception (*res < 0). */
static PyObject *get_core(Ring *r, double timeout, int decode, int *res) {
    Wait wt = {.started = 0};
    for (;;) {
        int over = 0;
        *res = op_begin_for(r, 1, &over);
        if (*res != 0)
            return NULL;
        STEP(11);
        const unsigned char *data;
        uint64_t n, next;
        *res = ring_peek(r, LOAD(W64(r, R_HEAD)), &data, &n, &next);
        if (*res == 0) {
            PyObject *out;
            if (!decode)
                out = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)n);
            else if ((out = decode_scalar(data, n)) == NULL && !PyErr_Occurred())
                out = item_copy(data, n);
            if (out == NULL) { /* no memory: the item stays at the head */
                latch_free(r, 0);
                *res = -1;
                return NULL;
            }
            STEP(12);
            if (r->joinable)
                journal(r, JOURNAL_GET, next, r->slot, LOAD(owed(r, r->slot)) + 1);
            if (!latch_ours(r)) { /* taken over: the item stays at the head */
                Py_DECREF(out);
                *res = RES_DAEMON;
                return NULL;
            }
            STORE(W64(r, R_HEAD), next);
            STEP(13);
            owe_got(r, 1);
            latch_free(r, 1);
            return out;
        }
        if (*res == RES_NONE && over)
            *res = RES_DAEMON; /* the ring ran dry: the next items are the daemon's */
        if (*res != RES_NONE || timeout == 0) {
            latch_free(r, 0);
            return NULL;
        }
        int sl = ring_wait(r, WAIT_GET, &wt, timeout);
        if (sl != 1) {
            *res = slept_result(sl, RES_NONE);
            return NULL;
        }
    }
}

/* get(timeout) -> bytes | BUSY (empty at the deadline) | DAEMON */
static PyObject *ring_get(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "get");
    double timeout;
    if (get_timeout(args[0], &timeout) < 0)
        return NULL;
    int res;
    PyObject *out = get_core(r, timeout, 0, &res);
    return out != NULL ? out : result(res);
}

/* get_item(timeout) -> item | QEMPTY | QDAEMON: a plain scalar comes
 * decoded, anything else as a bytearray of its stored bytes for Python to
 * decode (no decoded item is ever a bytearray). */
static PyObject *ring_get_item(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "get_item");
    double timeout;
    if (get_timeout(args[0], &timeout) < 0)
        return NULL;
    int res;
    PyObject *out = get_core(r, timeout, 1, &res);
    if (out == NULL) {
        if (res < 0)
            return NULL;
        return new_ref(res == RES_NONE ? Q_NONE : Q_DAEMON);
    }
    return out;
}

/* get_many(max_items, timeout) -> list (at least one item, at most
 * max_items: what the ring holds up to the first record the daemon keeps;
 * plain scalars decoded, anything else a bytearray for Python to decode)
 * | BUSY | DAEMON. Waits only while the ring is empty. */
static PyObject *ring_get_many(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "get_many");
    Py_ssize_t max = PyLong_AsSsize_t(args[0]);
    if (max == -1 && PyErr_Occurred())
        return NULL;
    if (max < 1) {
        PyErr_SetString(PyExc_ValueError, "max_items must be at least 1");
        return NULL;
    }
    double timeout;
    if (get_timeout(args[1], &timeout) < 0)
        return NULL;
    Wait wt = {.started = 0};
    for (;;) {
        int over = 0;
        int res = op_begin_for(r, 1, &over);
        if (res != 0)
            return result(res);
        STEP(11);
        PyObject *list = PyList_New(0);
        if (list == NULL) {
            latch_free(r, 0);
            return NULL;
        }
        uint64_t head = LOAD(W64(r, R_HEAD));
        while (PyList_GET_SIZE(list) < max) {
            const unsigned char *data;
            uint64_t n, next;
            res = ring_peek(r, head, &data, &n, &next);
            if (res != 0)
                break;
            PyObject *b = decode_scalar(data, n);
            if (b == NULL && !PyErr_Occurred())
                b = item_copy(data, n);
            if (b == NULL || PyList_Append(list, b) < 0) {
                Py_XDECREF(b);
                Py_DECREF(list);
                latch_free(r, 0); /* nothing taken */
                return NULL;
            }
            Py_DECREF(b);
            head = next;
        }
        if (PyList_GET_SIZE(list) > 0) {
            STEP(12);
            uint64_t k = (uint64_t)PyList_GET_SIZE(list);
            if (r->joinable)
                journal(r, JOURNAL_GET, head, r->slot, LOAD(owed(r, r->slot)) + (uint32_t)k);
            if (!latch_ours(r)) { /* taken over: the items stay */
                Py_DECREF(list);
                return result(RES_DAEMON);
            }
            STORE(W64(r, R_HEAD), head); /* one commit for the batch */
            STEP(13);
            owe_got(r, k);
            latch_free(r, 1);
            return list;
        }
        Py_DECREF(list);
        if (res == RES_NONE && over)
            res = RES_DAEMON; /* none in the ring: the next items are the daemon's */
        if (res != RES_NONE || timeout == 0) {
            latch_free(r, 0);
            return result(res);
        }
        int sl = ring_wait(r, WAIT_GET, &wt, timeout);
        if (sl != 1)
            return result(slept_result(sl, RES_NONE));
    }
}

/* task_done() -> OK | BUSY (called more times than items were put: no
 * effect) | DAEMON. Under the latch: the done word goes up by one (the
 * commit), then one debt is paid: the caller's own entry if it owes
 * anything, else the first entry that does (an item got by one process and
 * finished by another). Steps: 31 latch taken, 32 journal written, 33
 * committed. */
static PyObject *ring_task_done(Ring *r, PyObject *Py_UNUSED(ignored)) {
    if (!r->joinable)
        return result(RES_DAEMON);
    int res = op_begin_for(r, 1, NULL);
    if (res != 0)
        return result(res);
    STEP(31);
    if (unfinished(r, LOAD(W64(r, R_TAIL))) == 0) {
        latch_free(r, 0);
        return result(RES_BUSY);
    }
    uint64_t idx = r->slot;
    if (LOAD(owed(r, idx)) == 0) {
        idx = RING_SLOTS; /* none */
        for (uint64_t i = 0; i < RING_SLOTS; i++)
            if (LOAD(owed(r, i)) != 0) {
                idx = i;
                break;
            }
    }
    uint64_t done = LOAD(W64(r, R_DONE)) + 1;
    if (idx < RING_SLOTS)
        journal(r, JOURNAL_DONE, done, idx, LOAD(owed(r, idx)) - 1);
    STEP(32);
    if (!latch_ours(r))
        return result(RES_DAEMON); /* taken over: nothing committed */
    STORE(W64(r, R_DONE), done);
    STEP(33);
    if (idx < RING_SLOTS) {
        STORE(owed(r, idx), LOAD(owed(r, idx)) - 1);
        STORE(W64(r, R_JOP), 0);
    }
    latch_free(r, 1);
    return result(RES_OK);
}

/* join(timeout) -> OK (nothing unfinished) | BUSY (still some at the
 * deadline) | DAEMON. Sleeps on seq, which every task_done bumps; a
 * signal handler that raises ends the wait with its exception (nothing
 * taken). */
static PyObject *ring_join(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "join");
    double timeout;
    if (get_timeout(args[0], &timeout) < 0)
        return NULL;
    if (!r->joinable)
        return result(RES_DAEMON);
    Wait wt = {.started = 0};
    for (;;) {
        int res = op_begin_for(r, 1, NULL);
        if (res != 0)
            return result(res);
        if (unfinished(r, LOAD(W64(r, R_TAIL))) == 0) {
            latch_free(r, 0);
            return result(RES_OK);
        }
        if (timeout == 0) {
            latch_free(r, 0);
            return result(RES_BUSY);
        }
        int sl = ring_wait(r, WAIT_JOIN, &wt, timeout);
        if (sl != 1)
            return result(slept_result(sl, RES_BUSY));
    }
}

/* qsize() -> items in the ring, or -1 when the daemon may hold items too
 * (any flag set) */
static PyObject *ring_qsize(Ring *r, PyObject *Py_UNUSED(ignored)) {
    if (r->base == NULL || LOAD(&r->detached) || LOAD(W64(r, R_FLAGS)) != 0)
        return PyLong_FromLong(-1);
    uint64_t t = LOAD(W64(r, R_TAIL)), h = LOAD(W64(r, R_HEAD));
    uint64_t items = ((t >> POS_BITS) - (h >> POS_BITS)) & COUNT_MASK;
    if (items > r->cap / REC_HEADER)
        return PyLong_FromLong(-1);
    return PyLong_FromUnsignedLongLong(items);
}

/* detach(): the daemon is gone; sleepers leave answering DAEMON. */
static PyObject *ring_detach(Ring *r, PyObject *Py_UNUSED(ignored)) {
    STORE(&r->detached, 1);
    if (r->base != NULL)
        futex_wake_all(W64(r, R_SEQ));
    Py_RETURN_NONE;
}

/* invalidate(): stop using the ring without waking anyone (a forked child). */
static PyObject *ring_invalidate(Ring *r, PyObject *Py_UNUSED(ignored)) {
    STORE(&r->detached, 1);
    Py_RETURN_NONE;
}

/* word(name) -> a header word, for tests ("latch", "tail", "head", "seq",
 * "waiters", "flags"). */
static PyObject *ring_word(Ring *r, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    if (r->base == NULL) {
        PyErr_SetString(PyExc_ValueError, "ring is closed");
        return NULL;
    }
    static const struct { const char *name; unsigned off; } words[] = {
        {"latch", R_LATCH}, {"flags", R_FLAGS}, {"tail", R_TAIL}, {"head", R_HEAD}, {"seq", R_SEQ},
    {"done", R_DONE}, {"journal", R_JOP}};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strcmp(name, words[i].name) == 0)
            return PyLong_FromUnsignedLongLong(LOAD(W64(r, words[i].off)));
    if (strcmp(name, "waiters") == 0)
        return PyLong_FromUnsignedLong(LOAD(W32(r, R_WAITERS)));
    if (strcmp(name, "owed") == 0)
        return PyLong_FromUnsignedLong(LOAD(owed(r, r->slot)));
    PyErr_Format(PyExc_ValueError, "no ring word %s", name);
    return NULL;
}

/* _poke(off, value): tests only: store a u64 at a header or data offset,
 * as a process scribbling on the ring would. */
static PyObject *ring_poke(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "_poke");
    uint64_t off, v;
    if (get_u64(args[0], &off) < 0 || get_u64(args[1], &v) < 0)
        return NULL;
    if (r->base == NULL || off % 8 != 0 || off + 8 > r->size) {
        PyErr_SetString(PyExc_ValueError, "bad ring offset");
        return NULL;
    }
    STORE(W64(r, off), v);
    Py_RETURN_NONE;
}

static int ring_init(Ring *r, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"fd", "size", "capacity", "inline", "slot", "maxsize", "joinable", NULL};
    int fd, joinable = 0;
    Py_ssize_t size;
    unsigned long long cap, inl, slot, maxsize;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "inKKKK|p", kwlist, &fd, &size, &cap, &inl, &slot, &maxsize,
                                     &joinable))
        return -1;
    if (r->base != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ring already mapped");
        return -1;
    }
    if (cap < 4096 || (cap & (cap - 1)) != 0 || cap > RING_MAX_CAP || (uint64_t)size != RING_HEADER + cap ||
        inl > cap / 4 || slot == 0 || slot >= RING_SLOTS) {
        PyErr_SetString(PyExc_ValueError, "bad ring layout");
        return -1;
    }
    void *p = map_daemon_memory(fd, size, "ring");
    if (p == NULL)
        return -1;
    if (LOAD((uint64_t *)p) != RING_MAGIC || ((uint32_t *)p)[2] != RING_VERSION ||
        ((uint32_t *)p)[3] != RING_HEADER || LOAD((uint64_t *)((unsigned char *)p + R_CAP)) != cap) {
        munmap(p, (size_t)size);
        PyErr_SetString(PyExc_ValueError, "not a syncmgr queue ring (bad header)");
        return -1;
    }
    r->base = p;
    r->size = (size_t)size;
    r->cap = cap;
    r->inline_max = inl;
    r->maxsize = maxsize; /* from the daemon's reply: nothing read from the ring is trusted */
    r->slot = slot;
    r->joinable = joinable;
    return 0;
}

static void ring_dealloc(Ring *r) {
    if (r->base != NULL)
        munmap(r->base, r->size);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *ring_get_inline(Ring *r, void *Py_UNUSED(c)) {
    return PyLong_FromUnsignedLongLong(r->inline_max);
}

static PyMethodDef ring_methods[] = {
    {"put", (PyCFunction)(void (*)(void))ring_put, METH_FASTCALL, "put(data, timeout) -> OK | BUSY | DAEMON"},
    {"put_parts", (PyCFunction)(void (*)(void))ring_put_parts, METH_FASTCALL,
     "put_parts(buffers, timeout) -> OK | BUSY | DAEMON: one item, gathered from buffers"},
    {"put_many", (PyCFunction)(void (*)(void))ring_put_many, METH_FASTCALL,
     "put_many(items: plain scalars or bytearrays of encoded items, timeout) -> OK | BUSY | DAEMON (all or none)"},
    {"get", (PyCFunction)(void (*)(void))ring_get, METH_FASTCALL, "get(timeout) -> bytes | BUSY | DAEMON"},
    {"put_item", (PyCFunction)(void (*)(void))ring_put_item, METH_FASTCALL,
     "put_item(item, timeout) -> None | QEMPTY (full) | QDAEMON | QENCODE"},
    {"get_item", (PyCFunction)(void (*)(void))ring_get_item, METH_FASTCALL,
     "get_item(timeout) -> item | bytearray (for Python to decode) | QEMPTY | QDAEMON"},
    {"get_many", (PyCFunction)(void (*)(void))ring_get_many, METH_FASTCALL,
     "get_many(max_items, timeout) -> list (scalars decoded, bytearrays to decode) | BUSY | DAEMON"},
    {"qsize", (PyCFunction)ring_qsize, METH_NOARGS, "items in the ring, or -1 (ask the daemon)"},
    {"task_done", (PyCFunction)ring_task_done, METH_NOARGS, "task_done() -> OK | BUSY (too many) | DAEMON"},
    {"join", (PyCFunction)(void (*)(void))ring_join, METH_FASTCALL,
     "join(timeout) -> OK | BUSY (unfinished at the deadline) | DAEMON"},
    {"detach", (PyCFunction)ring_detach, METH_NOARGS, "the daemon is gone"},
    {"invalidate", (PyCFunction)ring_invalidate, METH_NOARGS, "stop using the ring (forked child)"},
    {"word", (PyCFunction)ring_word, METH_O, "a header word (tests)"},
    {"_poke", (PyCFunction)(void (*)(void))ring_poke, METH_FASTCALL, "tests only: scribble a u64"},
    {NULL, NULL, 0, NULL},
};

static PyObject *ring_get_maxsize(Ring *r, void *Py_UNUSED(c)) {
    return PyLong_FromUnsignedLongLong(r->maxsize);
}

static PyObject *ring_get_capacity(Ring *r, void *Py_UNUSED(c)) {
    return PyLong_FromUnsignedLongLong(r->cap);
}

static PyGetSetDef ring_getset[] = {
    {"capacity", (getter)ring_get_capacity, NULL, "bytes of the ring's data area", NULL},
    {"maxsize", (getter)ring_get_maxsize, NULL, "items the ring holds at most (0: no limit)", NULL},
    {"inline", (getter)ring_get_inline, NULL, "largest item written into the ring", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "syncmgr._fastpath.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ring(fd, size, capacity, inline, slot, maxsize): a Queue's shared ring",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ring_init,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
};

/* _set_queue_kill_step(n): tests only: SIGKILL this process at step n of
 * a queue op (put: 1 latch taken, 2 record written, 3 committed; get: 11
 * latch taken, 12 copied out, 13 committed (on a JoinableQueue: its debt
 * not yet recorded); 21 leaving a sleep; task_done: 31 latch taken, 32
 * journal written, 33 committed, its debt not yet paid). */
#ifdef SYNCMGR_TEST_HOOKS
static PyObject *set_kill_step(PyObject *Py_UNUSED(m), PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    ring_kill_step = (int)n;
    Py_RETURN_NONE;
}
#endif

PyMethodDef queue_module_methods[] = {
#ifdef SYNCMGR_TEST_HOOKS
    {"_set_queue_kill_step", set_kill_step, METH_O, "tests only: SIGKILL at a labelled step of a queue op"},
#endif
    {NULL, NULL, 0, NULL},
};

int queue_add_types(PyObject *m) {
    if (PyModule_AddType(m, &RingType) < 0 || itembuf_add_types(m) < 0)
        return -1;
    Q_ENCODE = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    Q_NONE = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    Q_DAEMON = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (Q_ENCODE == NULL || Q_NONE == NULL || Q_DAEMON == NULL)
        return -1;
    /* The module takes a reference of its own; ours stay for the C code. */
    const char *names[] = {"QENCODE", "QEMPTY", "QDAEMON"};
    PyObject *objs[] = {Q_ENCODE, Q_NONE, Q_DAEMON};
    for (int i = 0; i < 3; i++) {
        Py_INCREF(objs[i]);
        if (PyModule_AddObject(m, names[i], objs[i]) < 0) {
            Py_DECREF(objs[i]);
            return -1;
        }
    }
    return PyModule_AddFunctions(m, queue_module_methods);
}
