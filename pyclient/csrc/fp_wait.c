/* syncmgr._fastpath: futex sleeps with deadlines, and argument parsing, shared by every family. */
#include "fastpath.h"

void futex_wake_all(uint64_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* The since field: when the owner took the lock, CLOCK_MONOTONIC ns (the
 * daemon reads it for status; every process on the host shares the clock).
 * The coarse clock (a few ms of resolution, plenty for "held for") costs a
 * few nanoseconds where the precise one costs some thirty. */
void stamp_since(uint64_t *w) {
    struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    STORE(w + OFF_SINCE / 8, (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec);
}

double now_monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void wait_init(Wait *wt, double timeout) {
    wt->forever = timeout < 0;
    wt->deadline = wt->forever ? 0 : now_monotonic() + timeout;
}

/*
 * sleep_on marks the word as having sleepers and sleeps while it reads x.
 * Returns 1 to look at the word again, 0 when the deadline has passed, 2
 * when the segment was detached (the daemon is gone), -1 with a Python
 * exception set (a signal handler raised).
 */
int sleep_on(Segment *s, uint64_t *w, uint64_t x, Wait *wt) {
    if (LOAD(&s->detached))
        return 2;
    if (!(x & BIT_WAITERS)) {
        uint64_t expect = x;
        if (!CAS(w, &expect, x | BIT_WAITERS))
            return 1; /* changed meanwhile */
        x |= BIT_WAITERS;
    }
    struct timespec ts, *tsp = NULL;
    if (!wt->forever) {
        double left = wt->deadline - now_monotonic();
        if (left <= 0)
            return 0;
        ts.tv_sec = (time_t)left;
        ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
        tsp = &ts;
    }
    long rc;
    int err;
    Py_BEGIN_ALLOW_THREADS
    rc = syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, (uint32_t)x, tsp, NULL, 0);
    err = errno;
    Py_END_ALLOW_THREADS
    if (rc == -1 && err == EINTR && PyErr_CheckSignals() < 0)
        return -1;
    return LOAD(&s->detached) ? 2 : 1;
}

/*
 * wait_turn is one contended turn of an acquire or wait loop: 0 at once for
 * a call that must not wait, else it sets the deadline on the first turn and
 * sleeps on the word (results as sleep_on's).
 */
int wait_turn(Segment *s, uint64_t *w, uint64_t x, double timeout, Wait *wt) {
    if (timeout == 0)
        return 0;
    if (!wt->started) {
        wait_init(wt, timeout);
        wt->started = 1;
    }
    return sleep_on(s, w, x, wt);
}

/* The result code of an acquire loop for a wait_turn that did not say "again". */
int turn_result(int r) {
    return r < 0 ? -1 : r == 0 ? RES_BUSY : RES_DAEMON;
}

/* --- argument helpers ---------------------------------------------------- */

uint64_t *word_at(Segment *s, PyObject *offobj, unsigned field) {
    if (s->base == NULL) {
        PyErr_SetString(PyExc_ValueError, "segment is closed");
        return NULL;
    }
    unsigned long long off = PyLong_AsUnsignedLongLong(offobj);
    if (off == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (off < SLOT_SIZE || off % SLOT_SIZE != 0 || off >= s->size) {
        PyErr_Format(PyExc_ValueError, "bad object offset %llu", off);
        return NULL;
    }
    return (uint64_t *)(s->base + off + field);
}

int get_u64(PyObject *o, uint64_t *out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

/* Thread ids travel as Python ints that may be negative on the wire; the
 * word keeps their 64 bits. */
int get_tid(PyObject *o, uint64_t *out) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return get_u64(o, out);
    }
    *out = (uint64_t)v;
    return 0;
}

int get_slot(PyObject *o, uint64_t *out) {
    if (get_u64(o, out) < 0)
        return -1;
    if (*out == 0 || *out > MASK_LOW) {
        PyErr_SetString(PyExc_ValueError, "slot id out of range");
        return -1;
    }
    return 0;
}

int get_timeout(PyObject *o, double *out) {
    double t = PyFloat_AsDouble(o);
    if (t == -1.0 && PyErr_Occurred())
        return -1;
    if (t != t) {
        PyErr_SetString(PyExc_ValueError, "timeout is NaN");
        return -1;
    }
    *out = t; /* < 0: forever; 0: do not wait */
    return 0;
}




/* Parses (off, slot, tid, timeout) and runs core on them. */
PyObject *acquire_call(Segment *s, PyObject *const *args, acquire_core core) {
    uint64_t *w = word_at(s, args[0], 0), slot, tid;
    double timeout;
    if (w == NULL || get_slot(args[1], &slot) < 0 || get_tid(args[2], &tid) < 0 ||
        get_timeout(args[3], &timeout) < 0)
        return NULL;
    return result(core(s, w, slot, tid, timeout));
}
