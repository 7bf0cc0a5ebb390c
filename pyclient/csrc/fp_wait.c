/* syncmgr._fastpath: futex sleeps with deadlines, and argument parsing, shared by every family. */
#include "fastpath.h"

void futex_wake_all(uint64_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* One sleeper (the kernel wakes them in arrival order): a Lock's release.
 * Returns how many it woke (0 or 1; -1 on error). */
long futex_wake_one(uint64_t *w) {
    return syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* The heir's threads only: a release while a starving waiter is the heir.
 * Returns how many it woke (-1 on error). */
long futex_wake_heir(uint64_t *w) {
    return syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_BITSET, INT_MAX, NULL, NULL, WAKE_HEIR);
}

static uint64_t coarse_ns(void) {
    struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* --- the waiter table ----------------------------------------------------- */

/*
 * The segment's waiter table is a pool of entries shared by every session
 * slot: one per thread asleep in a wait, naming the object, the slot and
 * since when. A thread takes any free entry (so a process may have as many
 * waits recorded as there are free entries); one that finds none waits
 * unrecorded and counts itself in the header's unrecorded count while it
 * waits. `syncmgr status` lists the entries; when a session ends the daemon
 * frees its entries and wakes the sleepers of every word they name (of
 * every lock word while the unrecorded count is not 0), so that a killed
 * waiter who had been woken (and so took a release's one wake-up with it)
 * strands no one. Shared by every family that sleeps on a word.
 */
uint32_t *waiter_table(Segment *s, uint32_t *n) {
    uint32_t off = LOAD((uint32_t *)(s->base + HDR_WAITERS));
    *n = LOAD((uint32_t *)(s->base + HDR_WAITERS_LEN));
    if (off < SLOT_SIZE || off % SLOT_SIZE != 0 || *n == 0 ||
        (uint64_t)off + (uint64_t)*n * ENTRY_SIZE > s->size)
        return NULL;
    return (uint32_t *)(s->base + off);
}

/* Takes a free entry of the table for this wait (once per wait), looking
 * from a place that depends on the slot, so that processes seldom race for
 * one entry; with none free, counts the wait as unrecorded. */
static void wait_enter(Segment *s, uint64_t *w, Wait *wt) {
    if (wt->slot == 0 || wt->rec != NULL || wt->unrec != NULL)
        return;
    uint32_t n;
    uint32_t *t = waiter_table(s, &n);
    if (t == NULL)
        return;
    uint32_t at = (uint32_t)((wt->slot * 4) % n);
    for (uint32_t i = 0; i < n; i++, at = at + 1 == n ? 0 : at + 1) {
        uint32_t *e = t + at * (ENTRY_SIZE / 4), free = 0;
        if (LOAD(e + 1) == 0 && CAS(e + 1, &free, (uint32_t)wt->slot)) {
            STORE(e, (uint32_t)((unsigned char *)w - s->base));
            STORE((uint64_t *)(e + 2), coarse_ns());
            wt->rec = e;
            return;
        }
    }
    wt->unrec = (uint32_t *)(s->base + HDR_UNRECORDED);
    __atomic_add_fetch(wt->unrec, 1, __ATOMIC_SEQ_CST);
}

/*
 * wait_done ends a wait whose result is r: the waiter leaves its entry
 * (only while it is still its own: the daemon frees an ended session's
 * entries), gives up the heir's place it took, and, when it slept and
 * leaves without the lock (a timeout, a signal, the daemon's answer),
 * passes a wake-up on: a release wakes one sleeper, and the one it woke
 * may be this one.
 */
void wait_done(uint64_t *w, Wait *wt, int r) {
    if (wt->rec != NULL) {
        uint32_t me = (uint32_t)wt->slot;
        CAS(wt->rec + 1, &me, 0);
        wt->rec = NULL;
    }
    if (wt->unrec != NULL) {
        uint32_t v = LOAD(wt->unrec);
        while (v != 0 && !CAS(wt->unrec, &v, v - 1)) {
        }
        wt->unrec = NULL;
    }
    if (wt->heir) {
        uint32_t me = (uint32_t)wt->slot;
        __atomic_compare_exchange_n(HEIR_OF(w), &me, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        wt->heir = 0;
    }
    if (wt->slept && r != RES_OK)
        futex_wake_one(w);
}

/*
 * spin_until is the short spin of a contended acquire before its first
 * sleep: it reads the word up to SPIN_READS times, with a pause between
 * reads, and returns 1 as soon as the bits of mask differ from x's (the
 * lock was let go, a unit freed...): look again; 0: sleep. A lock is held,
 * and a latch kept, for a few hundred nanoseconds, while a futex sleep and
 * the wake-up it needs cost microseconds, and a waiter that sleeps sets the
 * sleepers bit, which costs its taker's release a wake-up too. On one CPU
 * the holder cannot run while we spin, so there we never do.
 */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

int spin_until(uint64_t *w, uint64_t x, uint64_t mask) {
    static int cpus = 0; /* a benign race: every thread computes the same */
    if (cpus == 0)
        cpus = sysconf(_SC_NPROCESSORS_ONLN) > 1 ? 2 : 1;
    if (cpus < 2)
        return 0;
    for (int i = 0; i < SPIN_READS; i++) {
        cpu_relax();
        if ((LOAD(w) & mask) != (x & mask))
            return 1;
    }
    return 0;
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
    wt->start = now_monotonic();
    wt->deadline = wt->forever ? 0 : wt->start + timeout;
}

/*
 * sleep_on_bits marks the word as having sleepers and sleeps while it
 * reads x, matching the futex wake bitset bits. Returns 1 to look at the
 * word again, 0 when the deadline has passed, 2 when the segment was
 * detached (the daemon is gone), -1 with a Python exception set (a signal
 * handler raised).
 */
int sleep_on_bits(Segment *s, uint64_t *w, uint64_t x, Wait *wt, uint32_t bits) {
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
        if (wt->deadline - now_monotonic() <= 0)
            return 0;
        ts.tv_sec = (time_t)wt->deadline; /* FUTEX_WAIT_BITSET: an absolute CLOCK_MONOTONIC time */
        ts.tv_nsec = (long)((wt->deadline - (double)ts.tv_sec) * 1e9);
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_nsec = 999999999L;
        tsp = &ts;
    }
    long rc;
    int err;
    Py_BEGIN_ALLOW_THREADS
    rc = syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_BITSET, (uint32_t)x, tsp, NULL, bits);
    err = errno;
    Py_END_ALLOW_THREADS
    /* EAGAIN: the word changed before the kernel queued us, so we never
     * slept and took no release's wake-up: nothing to keep (the sleepers
     * bit on taking the lock) or to pass on (wait_done). On a hot lock that
     * is most futex waits, and each would have cost a wake of nobody. */
    if (rc == 0 || err != EAGAIN)
        wt->slept = 1;
    if (rc == -1 && err == EINTR && PyErr_CheckSignals() < 0)
        return -1;
    return LOAD(&s->detached) ? 2 : 1;
}

int sleep_on(Segment *s, uint64_t *w, uint64_t x, Wait *wt) {
    return sleep_on_bits(s, w, x, wt, WAKE_NORMAL);
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
    wait_enter(s, w, wt);
    return sleep_on(s, w, x, wt);
}

/*
 * heir_turn is wait_turn for a Lock, an RLock or a Semaphore, with bounded
 * unfairness: a waiter that has waited STARVE_AFTER makes its slot the heir
 * (if no one is), which reserves the next free turn (unit) for it; the heir
 * then sleeps so that a Lock's release wakes it alone. reserved: what the
 * caller wants is there but kept for another slot's heir. Results as
 * wait_turn's.
 */
int heir_turn(Segment *s, uint64_t *w, uint64_t x, double timeout, Wait *wt, int reserved) {
    if (timeout == 0)
        return 0;
    if (!wt->started) {
        wait_init(wt, timeout);
        wt->started = 1;
    }
    wait_enter(s, w, wt);
    uint32_t bits = WAKE_NORMAL;
    if (wt->slot != 0) {
        uint32_t *heir = HEIR_OF(w), h = LOAD(heir);
        if (h == 0 && now_monotonic() - wt->start >= STARVE_AFTER) {
            if (CAS(heir, &h, (uint32_t)wt->slot)) {
                wt->heir = 1;
                return 1; /* look again: the lock may be free for us now */
            }
        }
        if (h == (uint32_t)wt->slot)
            bits = WAKE_NORMAL | WAKE_HEIR;
    }
    if (reserved) {
        /* Free but reserved for another slot's heir: its wake-up is not
         * ours to wait for (the heir may leave or die without one), so
         * look again within RESERVED_NAP. */
        Wait nap = *wt;
        double until = now_monotonic() + RESERVED_NAP;
        if (nap.forever || until < nap.deadline) {
            nap.forever = 0;
            nap.deadline = until;
        }
        int r = sleep_on_bits(s, w, x, &nap, bits);
        wt->slept = nap.slept;
        return r == 0 && (wt->forever || now_monotonic() < wt->deadline) ? 1 : r;
    }
    return sleep_on_bits(s, w, x, wt, bits);
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
