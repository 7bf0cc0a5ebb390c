/* syncmgr._fastpath: Lock and RLock: the owner word protocol. */
#include "fastpath.h"

/* --- Lock and RLock: the word protocol ---------------------------------- */

/*
 * Barging with bounded unfairness (docs/protocol.md, "Waits"): a free lock
 * goes to whoever CASes it first, unless a starving waiter made its slot the
 * heir, in which case only the heir's slot may take it. A release wakes one
 * sleeper (the heir alone while there is one); whoever takes the lock after
 * sleeping keeps the sleepers bit set, so that its own release wakes the
 * next.
 */

/* Whether slot may take a free lock whose heir field reads h. */
static int may_take(uint32_t h, uint64_t slot) { return h == 0 || h == (uint32_t)slot; }

/* The heir took its turn: the reservation is spent. */
static void heir_served(uint64_t *w, uint32_t h, Wait *wt) {
    if (h != 0) {
        CAS(HEIR_OF(w), &h, 0);
        wt->heir = 0;
    }
}

/* The wake-up a release owes when the word had sleepers: the heir's
 * threads while there is an heir, else (or when none of them was asleep:
 * the heir may be between two looks, its futex wait having found the word
 * changed) one sleeper, so that a release that cleared the sleepers bit
 * never leaves a sleeper without a wake-up. */
static void release_wake(uint64_t *w) {
    if (LOAD(HEIR_OF(w)) != 0 && futex_wake_heir(w) > 0)
        return;
    futex_wake_one(w);
}

/* Each returns a result code, or -1 with a Python exception set. */

static int lock_acquire_in(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout, Wait *wt) {
    uint64_t *aux = w + 1;
    int spun = 0;
    for (;;) {
        uint64_t x = LOAD(w);
        if (x & BIT_DAEMON)
            return RES_DAEMON;
        if ((x & MASK_LOW) == 0) {
            uint32_t h = LOAD(HEIR_OF(w));
            if (may_take(h, slot)) {
                if (CAS(w, &x, x | slot | (wt->slept ? BIT_WAITERS : 0))) {
                    heir_served(w, h, wt);
                    STORE(aux, tid);
                    stamp_since(w);
                    return RES_OK;
                }
                continue;
            }
        }
        if ((x & MASK_LOW) != 0 && timeout != 0 && !spun && !wt->slept) {
            spun = 1;
            if (spin_until(w, x, MASK_LOW | BIT_DAEMON))
                continue;
        }
        int r = heir_turn(s, w, x, timeout, wt, (x & MASK_LOW) == 0);
        if (r != 1)
            return turn_result(r);
    }
}

int lock_acquire_core(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout) {
    Wait wt = {.slot = slot};
    int r = lock_acquire_in(s, w, slot, tid, timeout, &wt);
    wait_done(w, &wt, r);
    return r;
}

/* Any session may release a Lock. */
int lock_release_core(uint64_t *w) {
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
                release_wake(w);
            return RES_OK;
        }
        uint64_t zero = 0;
        CAS(aux, &zero, tid);
    }
}

static int rlock_acquire_in(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout, Wait *wt) {
    uint64_t *aux = w + 1;
    int spun = 0;
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
            uint32_t h = LOAD(HEIR_OF(w));
            if (may_take(h, slot)) {
                if (CAS(w, &x, (x & BIT_WAITERS) | slot | DEPTH_ONE | (wt->slept ? BIT_WAITERS : 0))) {
                    heir_served(w, h, wt);
                    STORE(aux, tid);
                    stamp_since(w);
                    return RES_OK;
                }
                continue;
            }
        }
        if (owner != 0 && timeout != 0 && !spun && !wt->slept) {
            spun = 1;
            if (spin_until(w, x, MASK_LOW | BIT_DAEMON))
                continue;
        }
        int r = heir_turn(s, w, x, timeout, wt, owner == 0);
        if (r != 1)
            return turn_result(r);
    }
}

int rlock_acquire_core(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout) {
    Wait wt = {.slot = slot};
    int r = rlock_acquire_in(s, w, slot, tid, timeout, &wt);
    wait_done(w, &wt, r);
    return r;
}

int rlock_release_core(uint64_t *w, uint64_t slot, uint64_t tid) {
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
                release_wake(w);
            return RES_OK;
        }
        STORE(aux, tid); /* still the owner: put it back */
    }
}

/* lock_acquire(off, slot, tid, timeout) -> OK | BUSY | DAEMON */
PyObject *seg_lock_acquire(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(4, "lock_acquire");
    return acquire_call(s, args, lock_acquire_core);
}

/* lock_release(off) -> OK | DAEMON | NOT_OWNER; any session may release */
PyObject *seg_lock_release(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "lock_release");
    uint64_t *w = word_at(s, args[0], 0);
    if (w == NULL)
        return NULL;
    return result(lock_release_core(w));
}

/* rlock_acquire(off, slot, tid, timeout) -> OK | BUSY | DAEMON */
PyObject *seg_rlock_acquire(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(4, "rlock_acquire");
    return acquire_call(s, args, rlock_acquire_core);
}

/* rlock_release(off, slot, tid) -> OK | DAEMON | NOT_OWNER */
PyObject *seg_rlock_release(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(3, "rlock_release");
    uint64_t *w = word_at(s, args[0], 0), slot, tid;
    if (w == NULL || get_slot(args[1], &slot) < 0 || get_tid(args[2], &tid) < 0)
        return NULL;
    return result(rlock_release_core(w, slot, tid));
}

/* sem_acquire(off, slot, tid, timeout) -> OK | BUSY | DAEMON (tid unused) */
