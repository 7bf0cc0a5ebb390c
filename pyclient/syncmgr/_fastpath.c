/*
 * syncmgr._fastpath: the same-host fast path's word operations.
 *
 * The daemon keeps the state words of Locks, RLocks, Events and numeric
 * Values in a shared-memory segment (layout: docs/protocol.md, "Same-host
 * fast path", and statemem/layout.go, which this file must match). A client
 * on the daemon's host maps the segment and changes a word with one
 * compare-and-swap; contended waits sleep on a futex on the word's low 32
 * bits. Every op that finds the daemon bit set changes nothing and answers
 * DAEMON: the caller then sends the op over the socket.
 *
 * CPython C API and the C library only. The GIL is released while a thread
 * sleeps on a futex; a signal (Ctrl-C) interrupts the sleep and its Python
 * handler runs, so KeyboardInterrupt leaves the wait with nothing taken.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the fast path needs a little-endian host (the futex reads a word's first four bytes)"
#endif

/* Layout: keep in step with statemem/layout.go. */
#define MAGIC 0x5752474d434e5953ULL /* "SYNCMGRW" */
#define VERSION 1u
#define SLOT_SIZE 64u
#define OFF_AUX 8u
#define OFF_TAG 16u
#define OFF_SINCE 32u
#define MAX_SEGMENT ((uint64_t)SLOT_SIZE << 24)

#define MASK_LOW ((1ULL << 29) - 1)
#define BIT_WAITERS (1ULL << 29)
#define BIT_DAEMON (1ULL << 30)
#define DEPTH_SHIFT 32
#define DEPTH_ONE (1ULL << DEPTH_SHIFT)
#define EVENT_FLAG 1ULL
#define EVENT_GEN_ONE 2ULL
#define EVENT_GEN_MAX (MASK_LOW & ~EVENT_FLAG)
#define LATCH_SHIFT 32
#define MASK_LATCH (MASK_LOW << LATCH_SHIFT)
#define OFF_LEDGER 40u
#define OFF_LEDGER_LEN 44u
#define LATCH_SPIN 100

/* Results, as in statemem.Result. */
enum { RES_OK = 0, RES_BUSY = 1, RES_DAEMON = 2, RES_NOT_OWNER = 3 };

typedef struct {
    PyObject_HEAD
    unsigned char *base;
    size_t size;
    int detached; /* the daemon is gone: sleepers leave, answering DAEMON */
} Segment;

#define LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define CAS(p, oldp, v) \
    __atomic_compare_exchange_n((p), (oldp), (v), 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)

static void futex_wake_all(uint64_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* The since field: when the owner took the lock, CLOCK_MONOTONIC ns (the
 * daemon reads it for status; every process on the host shares the clock).
 * The coarse clock (a few ms of resolution, plenty for "held for") costs a
 * few nanoseconds where the precise one costs some thirty. */
static void stamp_since(uint64_t *w) {
    struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    STORE(w + OFF_SINCE / 8, (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec);
}

static double now_monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sleep state shared by the waiting loops: a deadline (or none). */
typedef struct {
    int started; /* the deadline is set on the first sleep, not before */
    int forever;
    double deadline;
} Wait;

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
static int sleep_on(Segment *s, uint64_t *w, uint64_t x, Wait *wt) {
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
static int wait_turn(Segment *s, uint64_t *w, uint64_t x, double timeout, Wait *wt) {
    if (timeout == 0)
        return 0;
    if (!wt->started) {
        wait_init(wt, timeout);
        wt->started = 1;
    }
    return sleep_on(s, w, x, wt);
}

/* The result code of an acquire loop for a wait_turn that did not say "again". */
static int turn_result(int r) {
    return r < 0 ? -1 : r == 0 ? RES_BUSY : RES_DAEMON;
}

/* --- argument helpers ---------------------------------------------------- */

static uint64_t *word_at(Segment *s, PyObject *offobj, unsigned field) {
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

static int get_u64(PyObject *o, uint64_t *out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

/* Thread ids travel as Python ints that may be negative on the wire; the
 * word keeps their 64 bits. */
static int get_tid(PyObject *o, uint64_t *out) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return get_u64(o, out);
    }
    *out = (uint64_t)v;
    return 0;
}

static int get_slot(PyObject *o, uint64_t *out) {
    if (get_u64(o, out) < 0)
        return -1;
    if (*out == 0 || *out > MASK_LOW) {
        PyErr_SetString(PyExc_ValueError, "slot id out of range");
        return -1;
    }
    return 0;
}

static int get_timeout(PyObject *o, double *out) {
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

#define NARGS(n, name)                                                    \
    if (nargs != (n)) {                                                   \
        PyErr_Format(PyExc_TypeError, name "() takes %d arguments", (n)); \
        return NULL;                                                      \
    }

/* --- Lock and RLock: the word protocol ---------------------------------- */

/* Each returns a result code, or -1 with a Python exception set. */

static int lock_acquire_core(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout) {
    uint64_t *aux = w + 1;
    Wait wt = {0, 0, 0};
    for (;;) {
        uint64_t x = LOAD(w);
        if (x & BIT_DAEMON)
            return RES_DAEMON;
        if ((x & MASK_LOW) == 0) {
            if (CAS(w, &x, x | slot)) {
                STORE(aux, tid);
                stamp_since(w);
                return RES_OK;
            }
            continue;
        }
        int r = wait_turn(s, w, x, timeout, &wt);
        if (r != 1)
            return turn_result(r);
    }
}

/* Any session may release a Lock. */
static int lock_release_core(uint64_t *w) {
    uint64_t *aux = w + 1;
    for (;;) {
        uint64_t x = LOAD(w);
        if ((x & MASK_LOW) == 0)
            return RES_NOT_OWNER;
        if (x & BIT_DAEMON)
            return RES_DAEMON;
        uint64_t tid = LOAD(aux);
        STORE(aux, 0);
        if (CAS(w, &x, x & ~(MASK_LOW | BIT_WAITERS))) {
            if (x & BIT_WAITERS)
                futex_wake_all(w);
            return RES_OK;
        }
        uint64_t zero = 0;
        CAS(aux, &zero, tid);
    }
}

static int rlock_acquire_core(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout) {
    uint64_t *aux = w + 1;
    Wait wt = {0, 0, 0};
    for (;;) {
        uint64_t x = LOAD(w);
        uint64_t owner = x & MASK_LOW;
        if (owner == slot && LOAD(aux) == tid) {
            if ((x >> DEPTH_SHIFT) == 0xffffffffULL)
                return RES_DAEMON;
            if (CAS(w, &x, x + DEPTH_ONE))
                return RES_OK;
            continue;
        }
        if (x & BIT_DAEMON)
            return RES_DAEMON;
        if (owner == 0) {
            if (CAS(w, &x, (x & BIT_WAITERS) | slot | DEPTH_ONE)) {
                STORE(aux, tid);
                stamp_since(w);
                return RES_OK;
            }
            continue;
        }
        int r = wait_turn(s, w, x, timeout, &wt);
        if (r != 1)
            return turn_result(r);
    }
}

static int rlock_release_core(uint64_t *w, uint64_t slot, uint64_t tid) {
    uint64_t *aux = w + 1;
    for (;;) {
        uint64_t x = LOAD(w);
        if ((x & MASK_LOW) != slot || LOAD(aux) != tid)
            return RES_NOT_OWNER;
        if ((x >> DEPTH_SHIFT) > 1) {
            if (CAS(w, &x, x - DEPTH_ONE))
                return RES_OK;
            continue;
        }
        if (x & BIT_DAEMON)
            return RES_DAEMON;
        STORE(aux, 0);
        if (CAS(w, &x, 0)) {
            if (x & BIT_WAITERS)
                futex_wake_all(w);
            return RES_OK;
        }
        STORE(aux, tid); /* still the owner: put it back */
    }
}

/* --- Semaphore: the latch protocol (statemem.SemAcquire) ------------------ */

/*
 * A Semaphore's free units and its ledger (units per session slot taken by
 * CAS) change only under the latch, the word's bits 32-60: claim the latch
 * by CAS, write our ledger entry, then commit the units and free the latch
 * in one CAS. The daemon recounts a session that dies holding the latch.
 */

/* Our ledger entry, or NULL (no ledger, or a slot id past its length). */
static uint32_t *ledger_entry(Segment *s, uint64_t *w, uint64_t slot) {
    uint32_t lo = LOAD((uint32_t *)((unsigned char *)w + OFF_LEDGER));
    uint32_t n = LOAD((uint32_t *)((unsigned char *)w + OFF_LEDGER_LEN));
    if (lo == 0 || lo % SLOT_SIZE != 0 || slot >= n || (uint64_t)lo + (uint64_t)n * 4 > s->size)
        return NULL;
    return (uint32_t *)(s->base + lo) + slot;
}

static uint64_t latched(uint64_t x) { return (x >> LATCH_SHIFT) & MASK_LOW; }

/* Waits for the latch seen in x to be let go: a few reads, then a futex
 * sleep of at most a millisecond. Results as sleep_on's, 0 meaning again. */
static int latch_wait(Segment *s, uint64_t *w, uint64_t x) {
    for (int i = 0; i < LATCH_SPIN; i++) {
        if (LOAD(w) != x)
            return 1;
    }
    Wait wt = {1, 0, now_monotonic() + 0.001};
    int r = sleep_on(s, w, x, &wt);
    return r == 0 ? 1 : r;
}

/* Frees slot's latch adding delta to the free units; 0 when the latch is
 * not slot's any more (the daemon took it over: our session ended). */
static int sem_commit(uint64_t *w, uint64_t slot, int64_t delta) {
    for (;;) {
        uint64_t x = LOAD(w);
        if (latched(x) != slot)
            return 0;
        uint64_t n = (x & ~(MASK_LATCH | BIT_WAITERS | MASK_LOW)) | (uint64_t)((int64_t)(x & MASK_LOW) + delta);
        if (CAS(w, &x, n)) {
            if (x & BIT_WAITERS)
                futex_wake_all(w);
            return 1;
        }
    }
}

/* The tid is not used (a unit is the session's): the signature is the
 * lock's, so that the handle's acquire loop serves all three. */
static int sem_acquire_core(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout) {
    (void)tid;
    uint32_t *e = ledger_entry(s, w, slot);
    if (e == NULL)
        return RES_DAEMON;
    Wait wt = {0, 0, 0};
    for (;;) {
        uint64_t x = LOAD(w);
        if (x & BIT_DAEMON)
            return RES_DAEMON;
        int r;
        if (latched(x)) {
            r = latch_wait(s, w, x);
        } else if (x & MASK_LOW) {
            if (CAS(w, &x, x | (slot << LATCH_SHIFT))) {
                STORE(e, LOAD(e) + 1);
                return sem_commit(w, slot, -1) ? RES_OK : RES_DAEMON;
            }
            continue;
        } else {
            r = wait_turn(s, w, x, timeout, &wt);
        }
        if (r != 1)
            return turn_result(r);
    }
}

/* Gives back one unit this session took by CAS; anything else (no units of
 * our own, a full word, daemon waiters) answers DAEMON. */
static int sem_release_core(Segment *s, uint64_t *w, uint64_t slot) {
    uint32_t *e = ledger_entry(s, w, slot);
    if (e == NULL)
        return RES_DAEMON;
    for (;;) {
        uint64_t x = LOAD(w);
        if ((x & BIT_DAEMON) || LOAD(e) == 0 || (x & MASK_LOW) == MASK_LOW)
            return RES_DAEMON;
        if (latched(x)) {
            int r = latch_wait(s, w, x);
            if (r != 1)
                return r < 0 ? -1 : RES_DAEMON;
            continue;
        }
        if (CAS(w, &x, x | (slot << LATCH_SHIFT))) {
            uint32_t n = LOAD(e);
            if (n == 0) { /* the daemon moved our unit meanwhile */
                sem_commit(w, slot, 0);
                return RES_DAEMON;
            }
            STORE(e, n - 1);
            return sem_commit(w, slot, 1) ? RES_OK : RES_DAEMON;
        }
    }
}

static PyObject *result(int r) { return r < 0 ? NULL : PyLong_FromLong(r); }

/* The acquire loop of a Lock or an RLock. */
typedef int (*acquire_core)(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout);

/* Parses (off, slot, tid, timeout) and runs core on them. */
static PyObject *acquire_call(Segment *s, PyObject *const *args, acquire_core core) {
    uint64_t *w = word_at(s, args[0], 0), slot, tid;
    double timeout;
    if (w == NULL || get_slot(args[1], &slot) < 0 || get_tid(args[2], &tid) < 0 ||
        get_timeout(args[3], &timeout) < 0)
        return NULL;
    return result(core(s, w, slot, tid, timeout));
}

/* lock_acquire(off, slot, tid, timeout) -> OK | BUSY | DAEMON */
static PyObject *seg_lock_acquire(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(4, "lock_acquire");
    return acquire_call(s, args, lock_acquire_core);
}

/* lock_release(off) -> OK | DAEMON | NOT_OWNER; any session may release */
static PyObject *seg_lock_release(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "lock_release");
    uint64_t *w = word_at(s, args[0], 0);
    if (w == NULL)
        return NULL;
    return result(lock_release_core(w));
}

/* rlock_acquire(off, slot, tid, timeout) -> OK | BUSY | DAEMON */
static PyObject *seg_rlock_acquire(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(4, "rlock_acquire");
    return acquire_call(s, args, rlock_acquire_core);
}

/* rlock_release(off, slot, tid) -> OK | DAEMON | NOT_OWNER */
static PyObject *seg_rlock_release(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(3, "rlock_release");
    uint64_t *w = word_at(s, args[0], 0), slot, tid;
    if (w == NULL || get_slot(args[1], &slot) < 0 || get_tid(args[2], &tid) < 0)
        return NULL;
    return result(rlock_release_core(w, slot, tid));
}

/* sem_acquire(off, slot, tid, timeout) -> OK | BUSY | DAEMON (tid unused) */
static PyObject *seg_sem_acquire(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(4, "sem_acquire");
    return acquire_call(s, args, sem_acquire_core);
}

/* sem_release(off, slot) -> OK | DAEMON */
static PyObject *seg_sem_release(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "sem_release");
    uint64_t *w = word_at(s, args[0], 0), slot;
    if (w == NULL || get_slot(args[1], &slot) < 0)
        return NULL;
    return result(sem_release_core(s, w, slot));
}

/* sem_taken(off, slot) -> the units slot took by CAS, or None (no ledger entry) */
static PyObject *seg_sem_taken(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "sem_taken");
    uint64_t *w = word_at(s, args[0], 0), slot;
    if (w == NULL || get_slot(args[1], &slot) < 0)
        return NULL;
    uint32_t *e = ledger_entry(s, w, slot);
    if (e == NULL)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(LOAD(e));
}

/* --- Event --------------------------------------------------------------- */

static PyObject *seg_event_is_set(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "event_is_set");
    uint64_t *w = word_at(s, args[0], 0);
    if (w == NULL)
        return NULL;
    return PyBool_FromLong((long)(LOAD(w) & EVENT_FLAG));
}

/* event_set(off) -> OK | DAEMON */
static PyObject *seg_event_set(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "event_set");
    uint64_t *w = word_at(s, args[0], 0);
    if (w == NULL)
        return NULL;
    for (;;) {
        uint64_t x = LOAD(w);
        if (x & EVENT_FLAG)
            return PyLong_FromLong(RES_OK);
        if (x & BIT_DAEMON)
            return PyLong_FromLong(RES_DAEMON);
        uint64_t gen = ((x & EVENT_GEN_MAX) + EVENT_GEN_ONE) & EVENT_GEN_MAX;
        if (CAS(w, &x, (x & ~(BIT_WAITERS | EVENT_GEN_MAX)) | gen | EVENT_FLAG)) {
            if (x & BIT_WAITERS)
                futex_wake_all(w);
            return PyLong_FromLong(RES_OK);
        }
    }
}

static PyObject *seg_event_clear(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "event_clear");
    uint64_t *w = word_at(s, args[0], 0);
    if (w == NULL)
        return NULL;
    for (;;) {
        uint64_t x = LOAD(w);
        if (!(x & EVENT_FLAG) || CAS(w, &x, x & ~EVENT_FLAG))
            Py_RETURN_NONE;
    }
}

/* Waits until the flag is set or the generation is no longer gen. */
static PyObject *event_wait_core(Segment *s, uint64_t *w, uint64_t gen, double timeout) {
    Wait wt = {0, 0, 0};
    for (;;) {
        uint64_t x = LOAD(w);
        if ((x & EVENT_FLAG) || (x & EVENT_GEN_MAX) != gen)
            Py_RETURN_TRUE;
        int r = wait_turn(s, w, x, timeout, &wt);
        if (r < 0)
            return NULL;
        if (r == 0)
            Py_RETURN_FALSE;
        if (r == 2)
            Py_RETURN_NONE; /* the daemon is gone: ask the socket path */
    }
}

/* event_wait(off, timeout) -> bool: set (or set and cleared since the call);
 * None when the segment was detached meanwhile */
static PyObject *seg_event_wait(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "event_wait");
    uint64_t *w = word_at(s, args[0], 0);
    double timeout;
    if (w == NULL || get_timeout(args[1], &timeout) < 0)
        return NULL;
    return event_wait_core(s, w, LOAD(w) & EVENT_GEN_MAX, timeout);
}

/* event_gen(off) -> the Event's generation, for event_wait_since and the
 * daemon's wait `since` */
static PyObject *seg_event_gen(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "event_gen");
    uint64_t *w = word_at(s, args[0], 0);
    if (w == NULL)
        return NULL;
    return PyLong_FromUnsignedLongLong(LOAD(w) & EVENT_GEN_MAX);
}

/* event_wait_since(off, gen, timeout) -> bool: as event_wait, counting any
 * set after generation gen (read earlier from the state word) */
static PyObject *seg_event_wait_since(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(3, "event_wait_since");
    uint64_t *w = word_at(s, args[0], 0), gen;
    double timeout;
    if (w == NULL || get_u64(args[1], &gen) < 0 || get_timeout(args[2], &timeout) < 0)
        return NULL;
    return event_wait_core(s, w, gen & EVENT_GEN_MAX, timeout);
}

/* --- Value --------------------------------------------------------------- */

/* Type classes, as in statemem: 'i' signed, 'u' unsigned (both with a width
 * in bits), 'd' double, 'f' float rounded to float32, '?' bool. */
static int get_class(PyObject *o, int *cls, unsigned *width) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *cls = (int)(v & 0xff);
    *width = (unsigned)((v >> 8) & 0xff);
    switch (*cls) {
    case 'i':
    case 'u':
        if (*width == 8 || *width == 16 || *width == 32 || *width == 64)
            return 0;
        break;
    case 'd':
    case 'f':
    case '?':
        return 0;
    }
    PyErr_SetString(PyExc_ValueError, "bad value class");
    return -1;
}

static uint64_t wrap(int cls, unsigned width, uint64_t x) {
    if (width >= 64)
        return x;
    x &= (1ULL << width) - 1;
    if (cls == 'i' && (x & (1ULL << (width - 1))))
        x |= ~0ULL << width;
    return x;
}

static double bits_to_double(uint64_t b) {
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static uint64_t double_to_bits(double d) {
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

static PyObject *decode(int cls, uint64_t b) {
    switch (cls) {
    case 'i':
        return PyLong_FromLongLong((long long)b);
    case 'u':
        return PyLong_FromUnsignedLongLong(b);
    case '?':
        return PyBool_FromLong(b != 0);
    default:
        return PyFloat_FromDouble(bits_to_double(b));
    }
}

/* encode checks range: the caller has already checked the Python type. */
static int encode(int cls, unsigned width, PyObject *o, uint64_t *out) {
    switch (cls) {
    case 'i': {
        long long v = PyLong_AsLongLong(o);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (width < 64 && (v < -(1LL << (width - 1)) || v >= (1LL << (width - 1))))
            goto range;
        *out = (uint64_t)v;
        return 0;
    }
    case 'u': {
        unsigned long long v = PyLong_AsUnsignedLongLong(o);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        if (width < 64 && v >> width)
            goto range;
        *out = v;
        return 0;
    }
    case '?': {
        int t = PyObject_IsTrue(o);
        if (t < 0)
            return -1;
        *out = (uint64_t)t;
        return 0;
    }
    default: {
        double d = PyFloat_AsDouble(o);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
        if (cls == 'f')
            d = (double)(float)d;
        *out = double_to_bits(d);
        return 0;
    }
    }
range:
    PyErr_SetString(PyExc_OverflowError, "value out of range for the typecode");
    return -1;
}

/* value_get(off, cls) -> the value */
static PyObject *seg_value_get(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "value_get");
    uint64_t *aux = word_at(s, args[0], OFF_AUX);
    int cls;
    unsigned width;
    if (aux == NULL || get_class(args[1], &cls, &width) < 0)
        return NULL;
    return decode(cls, LOAD(aux));
}

/* value_set(off, cls, value) */
static PyObject *seg_value_set(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(3, "value_set");
    uint64_t *aux = word_at(s, args[0], OFF_AUX), b;
    int cls;
    unsigned width;
    if (aux == NULL || get_class(args[1], &cls, &width) < 0 || encode(cls, width, args[2], &b) < 0)
        return NULL;
    STORE(aux, b);
    Py_RETURN_NONE;
}

/* value_add(off, cls, delta) -> the new value; integers wrap at the width */
static PyObject *seg_value_add(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(3, "value_add");
    uint64_t *aux = word_at(s, args[0], OFF_AUX);
    int cls;
    unsigned width;
    if (aux == NULL || get_class(args[1], &cls, &width) < 0)
        return NULL;
    if (cls == 'i' || cls == 'u') {
        uint64_t d;
        long long v = PyLong_AsLongLong(args[2]);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            if (get_u64(args[2], &d) < 0)
                return NULL;
        } else {
            d = (uint64_t)v;
        }
        uint64_t old = LOAD(aux), n;
        do {
            n = wrap(cls, width, old + d);
        } while (!CAS(aux, &old, n));
        return decode(cls, n);
    }
    if (cls == '?') {
        PyErr_SetString(PyExc_TypeError, "add on a bool value");
        return NULL;
    }
    double d = PyFloat_AsDouble(args[2]);
    if (d == -1.0 && PyErr_Occurred())
        return NULL;
    uint64_t old = LOAD(aux), n;
    do {
        double v = bits_to_double(old) + d;
        if (cls == 'f')
            v = (double)(float)v;
        n = double_to_bits(v);
    } while (!CAS(aux, &old, n));
    return decode(cls, n);
}

/* value_cas(off, cls, expected, new) -> bool; floats compare by value */
static PyObject *seg_value_cas(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(4, "value_cas");
    uint64_t *aux = word_at(s, args[0], OFF_AUX), n;
    int cls;
    unsigned width;
    if (aux == NULL || get_class(args[1], &cls, &width) < 0 || encode(cls, width, args[3], &n) < 0)
        return NULL;
    if (cls == 'd' || cls == 'f') {
        double e = PyFloat_AsDouble(args[2]);
        if (e == -1.0 && PyErr_Occurred())
            return NULL;
        uint64_t old = LOAD(aux);
        for (;;) {
            if (bits_to_double(old) != e)
                Py_RETURN_FALSE;
            if (CAS(aux, &old, n))
                Py_RETURN_TRUE;
        }
    }
    uint64_t e;
    if (encode(cls, width, args[2], &e) < 0) {
        /* an expected value the typecode cannot hold never matches */
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    return PyBool_FromLong(CAS(aux, &e, n));
}

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
    struct stat st;
    if (fstat(fd, &st) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0 || st.st_size != size) {
        PyErr_SetString(PyExc_PermissionError,
                        "not a usable segment (type, owner, mode or size)");
        return -1;
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
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
 * LockHandle(seg, off, slot, kind, slow_acquire, slow_release, futex_wait,
 * queue_acquire): bound methods acquire and release for one Lock (kind 0),
 * RLock (1) or Semaphore (2) proxy. The common calls (acquire() with no arguments, release()) run here
 * with no Python frame. An acquire() that is still waiting after futex_wait
 * seconds calls queue_acquire(), which waits in the daemon's queue instead
 * (where status shows it, in FIFO order). Anything else (arguments, a
 * DAEMON answer, an error, a detached segment) goes to slow_acquire(*args,
 * **kw) or slow_release(), the Python methods that handle every case.
 */
enum { HANDLE_LOCK = 0, HANDLE_RLOCK = 1, HANDLE_SEMAPHORE = 2 };

typedef struct {
    PyObject_HEAD
    Segment *seg;
    uint64_t *w;
    uint64_t slot;
    int kind;
    acquire_core acquire;
    double futex_wait;
    PyObject *slow_acquire;
    PyObject *slow_release;
    PyObject *queue_acquire;
} Handle;

static int handle_init(Handle *h, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"seg", "off", "slot", "kind", "slow_acquire", "slow_release", "futex_wait",
                             "queue_acquire", NULL};
    PyObject *seg, *off, *slot, *sa, *sr, *qa;
    int kind;
    double fw;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOiOOdO", kwlist, &SegmentType, &seg, &off, &slot, &kind, &sa,
                                     &sr, &fw, &qa))
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
    if (!PyCallable_Check(sa) || !PyCallable_Check(sr) || !PyCallable_Check(qa)) {
        PyErr_SetString(PyExc_TypeError, "slow paths must be callable");
        return -1;
    }
    if (!(fw > 0)) {
        PyErr_SetString(PyExc_ValueError, "futex_wait must be > 0");
        return -1;
    }
    Py_INCREF(seg);
    Py_INCREF(sa);
    Py_INCREF(sr);
    Py_INCREF(qa);
    h->seg = (Segment *)seg;
    h->w = w;
    h->slot = sl;
    h->kind = kind;
    h->acquire = kind == HANDLE_RLOCK ? rlock_acquire_core : kind == HANDLE_SEMAPHORE ? sem_acquire_core : lock_acquire_core;
    h->futex_wait = fw;
    h->slow_acquire = sa;
    h->slow_release = sr;
    h->queue_acquire = qa;
    return 0;
}

static void handle_dealloc(Handle *h) {
    Py_XDECREF(h->seg);
    Py_XDECREF(h->slow_acquire);
    Py_XDECREF(h->slow_release);
    Py_XDECREF(h->queue_acquire);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *handle_acquire(Handle *h, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (h->seg == NULL) {
        PyErr_SetString(PyExc_ValueError, "uninitialised handle");
        return NULL;
    }
    if (nargs == 0 && kwnames == NULL && !LOAD(&h->seg->detached)) {
        uint64_t tid = (uint64_t)PyThread_get_thread_ident();
        int r = h->acquire(h->seg, h->w, h->slot, tid, h->futex_wait);
        if (r < 0)
            return NULL;
        if (r == RES_OK)
            Py_RETURN_TRUE;
        if (r == RES_BUSY)
            return PyObject_CallNoArgs(h->queue_acquire);
    }
    return PyObject_Vectorcall(h->slow_acquire, args, (size_t)nargs, kwnames);
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

static PyMethodDef handle_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))handle_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=None) -> bool"},
    {"release", (PyCFunction)(void (*)(void))handle_release, METH_FASTCALL, "release()"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "syncmgr._fastpath.LockHandle",
    .tp_basicsize = sizeof(Handle),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LockHandle(seg, off, slot, kind, slow_acquire, slow_release, futex_wait, queue_acquire): "
              "kind 0 Lock, 1 RLock, 2 Semaphore",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)handle_init,
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_methods = handle_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "syncmgr._fastpath",
    .m_doc = "The same-host fast path's word operations (see docs/protocol.md).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    if (PyType_Ready(&SegmentType) < 0 || PyType_Ready(&HandleType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SegmentType);
    Py_INCREF(&HandleType);
    if (PyModule_AddObject(m, "Segment", (PyObject *)&SegmentType) < 0 ||
        PyModule_AddObject(m, "LockHandle", (PyObject *)&HandleType) < 0 ||
        PyModule_AddIntConstant(m, "OK", RES_OK) < 0 || PyModule_AddIntConstant(m, "BUSY", RES_BUSY) < 0 ||
        PyModule_AddIntConstant(m, "DAEMON", RES_DAEMON) < 0 ||
        PyModule_AddIntConstant(m, "NOT_OWNER", RES_NOT_OWNER) < 0 ||
        PyModule_AddIntConstant(m, "SLOT_SIZE", SLOT_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "MAX_SLOT", (long)MASK_LOW) < 0) {
        Py_DECREF(&SegmentType);
        Py_DECREF(&HandleType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
