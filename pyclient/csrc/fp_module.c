/* syncmgr._fastpath: the Segment and LockHandle types and the module's init. */
#include "fastpath.h"

#include <fcntl.h>

/* --- raw access, for status and tests ------------------------------------ */

/* state(off) -> the raw state word */
static PyObject *seg_state(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "state");
    uint64_t *w = word_at(s, args[0], 0);
    if (w == NULL)
        return NULL;
    return PyLong_FromUnsignedLongLong(LOAD(w));
}

/* tag(off) -> the slot's tag: kind | generation << 8 (0: free) */
static PyObject *seg_tag(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "tag");
    uint64_t *w = word_at(s, args[0], 0);
    if (w == NULL)
        return NULL;
    return PyLong_FromUnsignedLong(LOAD((uint32_t *)((unsigned char *)w + OFF_TAG)));
}

/* detach(): the daemon is gone. Sleepers in this process (and, spuriously,
 * in others) are woken and leave their waits answering DAEMON, so that the
 * caller goes to the socket path, which reports the daemon's loss. */
static PyObject *seg_detach(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    (void)args;
    NARGS(0, "detach");
    if (s->base == NULL)
        Py_RETURN_NONE;
    STORE(&s->detached, 1);
    for (size_t off = SLOT_SIZE; off < s->size; off += SLOT_SIZE) {
        uint64_t *w = (uint64_t *)(s->base + off);
        if (LOAD(w) & BIT_WAITERS)
            futex_wake_all(w);
    }
    Py_RETURN_NONE;
}

/* invalidate(): stop using the segment without waking anyone (a forked
 * child, whose session is not the parent's). */
static PyObject *seg_invalidate(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    (void)args;
    NARGS(0, "invalidate");
    STORE(&s->detached, 1);
    Py_RETURN_NONE;
}

/* --- the Segment type ---------------------------------------------------- */

/*
 * map_daemon_memory maps size bytes of fd, a descriptor the daemon passed
 * (its state segment or a Queue ring), read-write, after checking that it is
 * what the daemon makes: a regular file of this user, mode 0600, of exactly
 * size bytes, sealed against shrinking and growing (so nobody can truncate
 * it under the mapping: a SIGBUS). NULL with a Python exception otherwise;
 * what names the memory in the error.
 */
void *map_daemon_memory(int fd, Py_ssize_t size, const char *what) {
    struct stat st;
    if (fstat(fd, &st) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0 || st.st_size != size) {
        PyErr_Format(PyExc_PermissionError, "not a usable %s (type, owner, mode or size)", what);
        return NULL;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
        PyErr_Format(PyExc_PermissionError, "not a usable %s (not sealed against resizing)", what);
        return NULL;
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    return p;
}

static int seg_init(Segment *s, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"fd", "size", NULL};
    int fd;
    Py_ssize_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "in", kwlist, &fd, &size))
        return -1;
    if (s->base != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "segment already mapped");
        return -1;
    }
    if (size < 2 * (Py_ssize_t)SLOT_SIZE || size % SLOT_SIZE != 0 || (uint64_t)size > MAX_SEGMENT) {
        PyErr_Format(PyExc_ValueError, "bad segment size %zd", size);
        return -1;
    }
    void *p = map_daemon_memory(fd, size, "segment");
    if (p == NULL)
        return -1;
    unsigned char *b = p;
    uint32_t version, slot, cap;
    memcpy(&version, b + 8, 4);
    memcpy(&slot, b + 12, 4);
    memcpy(&cap, b + 16, 4);
    if (LOAD((uint64_t *)b) != MAGIC || version != VERSION || slot != SLOT_SIZE ||
        (uint64_t)cap * SLOT_SIZE != (uint64_t)size) {
        munmap(p, (size_t)size);
        PyErr_SetString(PyExc_ValueError, "bad segment header");
        return -1;
    }
    s->base = b;
    s->size = (size_t)size;
    return 0;
}

static void seg_dealloc(Segment *s) {
    /* Only here: a method running in another thread holds a reference, so
     * the mapping cannot vanish under a sleeping waiter. */
    if (s->base != NULL)
        munmap(s->base, s->size);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *seg_get_size(Segment *s, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(s->size);
}

#define M(name, doc) {#name, (PyCFunction)(void (*)(void))seg_##name, METH_FASTCALL, doc}
static PyMethodDef seg_methods[] = {
    M(lock_acquire, "lock_acquire(off, slot, tid, timeout) -> OK, BUSY or DAEMON; timeout < 0 waits for ever"),
    M(lock_release, "lock_release(off) -> OK, DAEMON or NOT_OWNER"),
    M(rlock_acquire, "rlock_acquire(off, slot, tid, timeout) -> OK, BUSY or DAEMON"),
    M(rlock_release, "rlock_release(off, slot, tid) -> OK, DAEMON or NOT_OWNER"),
    M(sem_acquire, "sem_acquire(off, slot, tid, timeout) -> OK, BUSY or DAEMON (tid is not used)"),
    M(sem_release, "sem_release(off, slot) -> OK or DAEMON"),
    M(sem_taken, "sem_taken(off, slot) -> units slot took by compare-and-swap, or None"),
    M(event_is_set, "event_is_set(off) -> bool"),
    M(event_set, "event_set(off) -> OK or DAEMON"),
    M(event_clear, "event_clear(off)"),
    M(event_wait, "event_wait(off, timeout) -> bool"),
    M(event_gen, "event_gen(off) -> the generation (bumped by every set)"),
    M(event_wait_since, "event_wait_since(off, gen, timeout) -> bool: any set after generation gen counts"),
    M(value_get, "value_get(off, cls) -> value"),
    M(value_set, "value_set(off, cls, value)"),
    M(value_add, "value_add(off, cls, delta) -> new value"),
    M(value_cas, "value_cas(off, cls, expected, new) -> bool"),
    M(state, "state(off) -> the raw state word"),
    M(detach, "detach(): wake this process's sleepers, which then answer DAEMON"),
    M(invalidate, "invalidate(): every later wait answers DAEMON at once (after a fork)"),
    M(tag, "tag(off) -> the object slot's tag"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef seg_getset[] = {
    {"size", (getter)seg_get_size, NULL, "mapped size in bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SegmentType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "syncmgr._fastpath.Segment",
    .tp_basicsize = sizeof(Segment),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Segment(fd, size): a state segment mapped read-write from fd "
              "(a regular file of this user, mode 0600, of exactly size bytes)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)seg_init,
    .tp_dealloc = (destructor)seg_dealloc,
    .tp_methods = seg_methods,
    .tp_getset = seg_getset,
};

/* --- LockHandle: a proxy's acquire and release in C ---------------------- */

/*
 * LockHandle(seg, off, slot, kind, slow_acquire, slow_release): bound
 * methods acquire and release for one Lock (kind 0), RLock (1) or Semaphore
 * (2) proxy. The common calls (acquire() with no arguments, release()) run
 * here with no Python frame; acquire() sleeps on the futex for as long as
 * it waits, holding an entry of the waiter table (status shows it).
 * Anything else (arguments, a DAEMON answer, an error, a detached segment)
 * goes to slow_acquire(*args, **kw) or slow_release(), the Python methods
 * that handle every case.
 */
enum { HANDLE_LOCK = 0, HANDLE_RLOCK = 1, HANDLE_SEMAPHORE = 2 };

typedef struct {
    PyObject_HEAD
    Segment *seg;
    uint64_t *w;
    uint64_t slot;
    int kind;
    acquire_core acquire;
    PyObject *slow_acquire;
    PyObject *slow_release;
} Handle;

static int handle_init(Handle *h, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"seg", "off", "slot", "kind", "slow_acquire", "slow_release", NULL};
    PyObject *seg, *off, *slot, *sa, *sr;
    int kind;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOiOO", kwlist, &SegmentType, &seg, &off, &slot, &kind, &sa,
                                     &sr))
        return -1;
    if (kind < HANDLE_LOCK || kind > HANDLE_SEMAPHORE) {
        PyErr_SetString(PyExc_ValueError, "kind must be 0 (Lock), 1 (RLock) or 2 (Semaphore)");
        return -1;
    }
    if (h->seg != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "handle already initialised");
        return -1;
    }
    uint64_t *w = word_at((Segment *)seg, off, 0), sl;
    if (w == NULL || get_slot(slot, &sl) < 0)
        return -1;
    if (!PyCallable_Check(sa) || !PyCallable_Check(sr)) {
        PyErr_SetString(PyExc_TypeError, "slow paths must be callable");
        return -1;
    }
    Py_INCREF(seg);
    Py_INCREF(sa);
    Py_INCREF(sr);
    h->seg = (Segment *)seg;
    h->w = w;
    h->slot = sl;
    h->kind = kind;
    h->acquire = kind == HANDLE_RLOCK ? rlock_acquire_core : kind == HANDLE_SEMAPHORE ? sem_acquire_core : lock_acquire_core;
    h->slow_acquire = sa;
    h->slow_release = sr;
    return 0;
}

static void handle_dealloc(Handle *h) {
    Py_XDECREF(h->seg);
    Py_XDECREF(h->slow_acquire);
    Py_XDECREF(h->slow_release);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *handle_acquire(Handle *h, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (h->seg == NULL) {
        PyErr_SetString(PyExc_ValueError, "uninitialised handle");
        return NULL;
    }
    if (nargs == 0 && kwnames == NULL && !LOAD(&h->seg->detached)) {
        uint64_t tid = (uint64_t)PyThread_get_thread_ident();
        int r = h->acquire(h->seg, h->w, h->slot, tid, -1.0);
        if (r < 0)
            return NULL;
        if (r == RES_OK)
            Py_RETURN_TRUE;
    }
    return PyObject_Vectorcall(h->slow_acquire, args, (size_t)nargs, kwnames);
}

/* try_acquire() -> True (acquired) | False (held: no wait) | None (the
 * word says the daemon serves it now: ask the daemon). A non-blocking
 * acquire without a Python frame, for callers that must not block (an
 * asyncio event loop), whichever the handle's kind. */
static PyObject *handle_try_acquire(Handle *h, PyObject *const *args, Py_ssize_t nargs) {
    (void)args;
    NARGS(0, "try_acquire");
    if (h->seg == NULL) {
        PyErr_SetString(PyExc_ValueError, "uninitialised handle");
        return NULL;
    }
    if (LOAD(&h->seg->detached))
        Py_RETURN_NONE;
    int r = h->acquire(h->seg, h->w, h->slot, (uint64_t)PyThread_get_thread_ident(), 0.0);
    if (r < 0)
        return NULL;
    if (r == RES_OK)
        Py_RETURN_TRUE;
    if (r == RES_BUSY)
        Py_RETURN_FALSE;
    Py_RETURN_NONE;
}

static PyObject *handle_release(Handle *h, PyObject *const *args, Py_ssize_t nargs) {
    (void)args;
    NARGS(0, "release");
    if (h->seg == NULL) {
        PyErr_SetString(PyExc_ValueError, "uninitialised handle");
        return NULL;
    }
    if (!LOAD(&h->seg->detached)) {
        int r;
        switch (h->kind) {
        case HANDLE_RLOCK:
            r = rlock_release_core(h->w, h->slot, (uint64_t)PyThread_get_thread_ident());
            break;
        case HANDLE_SEMAPHORE:
            r = sem_release_core(h->seg, h->w, h->slot);
            break;
        default:
            r = lock_release_core(h->w);
        }
        if (r < 0)
            return NULL;
        if (r == RES_OK)
            Py_RETURN_NONE;
    }
    return PyObject_CallNoArgs(h->slow_release);
}

/*
 * rebind(seg, off, slot): point the handle at another mapping and session
 * slot (a forked child moves its inherited handles to its own session).
 * References to the bound methods taken before the fork (acq =
 * lock.acquire) then run in C again, at the parent's speed.
 */
static PyObject *handle_rebind(Handle *h, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(3, "rebind");
    if (h->seg == NULL) {
        PyErr_SetString(PyExc_ValueError, "uninitialised handle");
        return NULL;
    }
    if (!PyObject_TypeCheck(args[0], &SegmentType)) {
        PyErr_SetString(PyExc_TypeError, "rebind() needs a Segment");
        return NULL;
    }
    Segment *seg = (Segment *)args[0];
    uint64_t *w = word_at(seg, args[1], 0), sl;
    if (w == NULL || get_slot(args[2], &sl) < 0)
        return NULL;
    Py_INCREF(seg);
    Py_SETREF(h->seg, seg);
    h->w = w;
    h->slot = sl;
    Py_RETURN_NONE;
}

static PyMethodDef handle_methods[] = {
    {"rebind", (PyCFunction)(void (*)(void))handle_rebind, METH_FASTCALL,
     "rebind(seg, off, slot): use another mapping and session slot (after a fork)"},
    {"acquire", (PyCFunction)(void (*)(void))handle_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=None) -> bool"},
    {"release", (PyCFunction)(void (*)(void))handle_release, METH_FASTCALL, "release()"},
    {"try_acquire", (PyCFunction)(void (*)(void))handle_try_acquire, METH_FASTCALL,
     "try_acquire() -> True, False (held) or None (ask the daemon); never waits"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "syncmgr._fastpath.LockHandle",
    .tp_basicsize = sizeof(Handle),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LockHandle(seg, off, slot, kind, slow_acquire, slow_release): "
              "kind 0 Lock, 1 RLock, 2 Semaphore",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)handle_init,
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_methods = handle_methods,
};

static PyMethodDef module_methods[] = {
    {"pack_bins", pack_bins, METH_O,
     "pack_bins(items: list) -> bytes | None: a socket put_many's items (a msgpack array of bins) when every "
     "item is a plain scalar, else None"},
    {"loads_bins", (PyCFunction)(void (*)(void))loads_bins, METH_FASTCALL,
     "loads_bins(datas: list, fallback) -> list: a socket get_many's records decoded, each plain scalar in C "
     "and any other record by fallback(record)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "syncmgr._fastpath",
    .m_doc = "The same-host fast path's word operations (see docs/protocol.md).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddType(m, &SegmentType) < 0 || PyModule_AddType(m, &HandleType) < 0 ||
        PyModule_AddIntConstant(m, "OK", RES_OK) < 0 || PyModule_AddIntConstant(m, "BUSY", RES_BUSY) < 0 ||
        PyModule_AddIntConstant(m, "DAEMON", RES_DAEMON) < 0 ||
        PyModule_AddIntConstant(m, "NOT_OWNER", RES_NOT_OWNER) < 0 ||
        PyModule_AddIntConstant(m, "SLOT_SIZE", SLOT_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "MAX_SLOT", (long)MASK_LOW) < 0 || queue_add_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
