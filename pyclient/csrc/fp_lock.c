/* syncmgr._fastpath: Lock and RLock: the owner word protocol. */
#include "fastpath.h"

/* --- Lock and RLock: the word protocol ---------------------------------- */

/* Each returns a result code, or -1 with a Python exception set. */

int lock_acquire_core(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout) {
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
                futex_wake_all(w);
            return RES_OK;
        }
        uint64_t zero = 0;
        CAS(aux, &zero, tid);
    }
}

int rlock_acquire_core(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout) {
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
                futex_wake_all(w);
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
