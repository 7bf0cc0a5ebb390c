/* syncmgr._fastpath: Semaphore and BoundedSemaphore: the latch and ledger protocol. */
#include "fastpath.h"

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

/* How long an op waits for a latch another process holds before it sends
 * the op to the daemon (statemem.LatchGrace, LatchGraceNow): a live holder
 * lets go within microseconds when it runs, but on a host with many more
 * processes than CPUs a holder preempted inside its op is off the CPU for
 * milliseconds, and an op sent to the daemon that finds no unit free queues
 * there and sets the daemon bit, which sends every op of every process to
 * the socket for as long as anyone is queued (32 processes on one
 * Semaphore(1) on 2 cores: 1,000x slower). 50 ms was not enough: with 32
 * processes on 2 CPUs a preempted holder can be off the CPU for longer. So
 * an acquire waits for the latch in shared memory as long as it would wait
 * for a unit: a blocking one for ever (a dead holder's latch is freed at its
 * session's end, a latch naming no live session by the daemon's sweeper
 * within a second), a timed one its timeout (then the daemon answers with
 * what is left: nothing), a non-blocking one 2 ms. A release waits 50 ms,
 * then goes to the daemon (a release never queues there). */
#define LATCH_GRACE 0.05
#define LATCH_GRACE_NOW 0.002

static double latch_grace(double timeout) {
    if (timeout < 0)
        return 1e18; /* for ever: the daemon frees a dead holder's latch at its session's end, the sweeper a stray one */
    return timeout < LATCH_GRACE_NOW ? LATCH_GRACE_NOW : timeout;
}

/* Waits for the latch seen in x to be let go: a few reads, then a futex
 * sleep of at most a millisecond. *since is when this op first slept on a
 * latch (0: not yet). Returns 1 to look again, 2 once the op has waited
 * grace (or the segment was detached): send it to the daemon; -1 with a
 * Python exception set. */
static int latch_wait(Segment *s, uint64_t *w, uint64_t x, double *since, double grace) {
    for (int i = 0; i < LATCH_SPIN; i++) {
        if (LOAD(w) != x)
            return 1;
    }
    double now = now_monotonic();
    if (*since == 0)
        *since = now;
    else if (now - *since >= grace)
        return 2;
    Wait wt = {.started = 1, .deadline = now + 0.001};
    int r = sleep_on(s, w, x, &wt);
    return r == 0 ? 1 : r;
}

/*
 * sem_wake is the wake-up a commit owes when the word has sleepers and units
 * are free: one sleeper (the heir's threads while there is an heir), not all
 * of them, so that hundreds of waiters do not stampede for one unit. The
 * sleepers bit stays set while anyone may still sleep, so the next commit
 * that frees a unit wakes the next one; a taker that leaves units free wakes
 * another, and a woken waiter that leaves without a unit passes its wake-up
 * on (wait_done). When the wake-up finds nobody asleep the bit is cleared
 * (by CAS on the word just committed): a thread about to sleep then sees the
 * word change and looks again.
 */
static void sem_wake(uint64_t *w, uint64_t committed) {
    long woke = LOAD(HEIR_OF(w)) != 0 ? futex_wake_heir(w) : 0;
    if (woke <= 0)
        woke = futex_wake_one(w);
    if (woke == 0) {
        uint64_t x = committed;
        CAS(w, &x, committed & ~BIT_WAITERS);
    }
}

/* Frees slot's latch adding delta to the free units; 0 when the latch is
 * not slot's any more (the daemon took it over: our session ended). */
static int sem_commit(uint64_t *w, uint64_t slot, int64_t delta) {
    for (;;) {
        uint64_t x = LOAD(w);
        if (latched(x) != slot)
            return 0;
        uint64_t n = (x & ~(MASK_LATCH | MASK_LOW)) | (uint64_t)((int64_t)(x & MASK_LOW) + delta);
        if (CAS(w, &x, n)) {
            if ((n & BIT_WAITERS) && (n & MASK_LOW) > 0)
                sem_wake(w, n);
            return 1;
        }
    }
}

/* The tid is not used (a unit is the session's): the signature is the
 * lock's, so that the handle's acquire loop serves all three. */
static int sem_acquire_in(Segment *s, uint64_t *w, uint64_t slot, uint32_t *e, double timeout, Wait *wt) {
    double latch_since = 0;
    int spun = 0;
    for (;;) {
        uint64_t x = LOAD(w);
        if (x & BIT_DAEMON)
            return RES_DAEMON;
        int r;
        if (latched(x)) {
            r = latch_wait(s, w, x, &latch_since, latch_grace(timeout));
        } else if (x & MASK_LOW) {
            /* The last free unit is kept for a starving waiter's slot (the heir). */
            uint32_t h = LOAD(HEIR_OF(w));
            if (h != 0 && h != (uint32_t)slot && (x & MASK_LOW) == 1) {
                r = heir_turn(s, w, x, timeout, wt, 1);
            } else {
                if (CAS(w, &x, x | (slot << LATCH_SHIFT))) {
                    STORE(e, LOAD(e) + 1);
                    if (!sem_commit(w, slot, -1))
                        return RES_DAEMON;
                    if (h == (uint32_t)slot) {
                        CAS(HEIR_OF(w), &h, 0);
                        wt->heir = 0;
                    }
                    return RES_OK;
                }
                continue;
            }
        } else {
            /* No unit free: spin a little first (units, latch or daemon bit changing). */
            if (timeout != 0 && !spun && !wt->slept) {
                spun = 1;
                if (spin_until(w, x, MASK_LOW | MASK_LATCH | BIT_DAEMON))
                    continue;
            }
            r = heir_turn(s, w, x, timeout, wt, 0);
        }
        if (r != 1)
            return turn_result(r);
    }
}

int sem_acquire_core(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout) {
    (void)tid;
    uint32_t *e = ledger_entry(s, w, slot);
    if (e == NULL)
        return RES_DAEMON;
    Wait wt = {.slot = slot}; /* holds a waiter-table entry while it waits */
    int r = sem_acquire_in(s, w, slot, e, timeout, &wt);
    wait_done(w, &wt, r);
    return r;
}

/* Gives back one unit this session took by CAS; anything else (no units of
 * our own, a full word, daemon waiters) answers DAEMON. */
int sem_release_core(Segment *s, uint64_t *w, uint64_t slot) {
    uint32_t *e = ledger_entry(s, w, slot);
    if (e == NULL)
        return RES_DAEMON;
    double latch_since = 0;
    for (;;) {
        uint64_t x = LOAD(w);
        if ((x & BIT_DAEMON) || LOAD(e) == 0 || (x & MASK_LOW) == MASK_LOW)
            return RES_DAEMON;
        if (latched(x)) {
            int r = latch_wait(s, w, x, &latch_since, LATCH_GRACE);
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


PyObject *seg_sem_acquire(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(4, "sem_acquire");
    return acquire_call(s, args, sem_acquire_core);
}

/* sem_release(off, slot) -> OK | DAEMON */
PyObject *seg_sem_release(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "sem_release");
    uint64_t *w = word_at(s, args[0], 0), slot;
    if (w == NULL || get_slot(args[1], &slot) < 0)
        return NULL;
    return result(sem_release_core(s, w, slot));
}

/* sem_taken(off, slot) -> the units slot took by CAS, or None (no ledger entry) */
PyObject *seg_sem_taken(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "sem_taken");
    uint64_t *w = word_at(s, args[0], 0), slot;
    if (w == NULL || get_slot(args[1], &slot) < 0)
        return NULL;
    uint32_t *e = ledger_entry(s, w, slot);
    if (e == NULL)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(LOAD(e));
}
