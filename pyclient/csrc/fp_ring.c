/* syncmgr._fastpath: the Queue ring's operations: the latch, room and
 * placement of records, reading the head, sleeping on the ring's seq, and
 * the put loop. Every op holds the ring's latch (our session slot id in one
 * word) while it reads or writes the ring, and commits with one store: a
 * put stores the tail word once its record is complete, a get stores the
 * head word once it has copied the record out. A process killed anywhere
 * in an op leaves either nothing done or the op done; the daemon lets go of
 * a dead session's latch. Nothing read from the ring is trusted: every
 * position and length is checked against the capacity we were given, and
 * anything impossible answers DAEMON (the daemon finds the damage and fails
 * the queue with an error). */
#include "fp_ring.h"

#include <sched.h>

#ifdef SYNCMGR_TEST_HOOKS
int ring_kill_step;
#endif

/* Writes the journal of a JoinableQueue op about to commit: the commit
 * stores proof (the head word for a get, the done word for task_done);
 * once committed, owed entry idx is to become after. The daemon, taking
 * over the latch of a holder that died, finishes that second store if the
 * commit happened (statemem.Ring.repair). The op word goes last: it makes
 * the journal valid. */
void journal(Ring *r, uint64_t kind, uint64_t proof, uint64_t idx, uint32_t after) {
    STORE(W64(r, R_JPROOF), proof);
    STORE(W64(r, R_JHOLDER), r->slot);
    STORE(W64(r, R_JOP), kind << 56 | idx << 32 | after);
}

/* The second store of a get on a JoinableQueue ring (committed): the slot
 * owes n more items; then the journal is done. */
void owe_got(Ring *r, uint64_t n) {
    if (!r->joinable)
        return;
    STORE(owed(r, r->slot), LOAD(owed(r, r->slot)) + (uint32_t)n);
    STORE(W64(r, R_JOP), 0);
}

/* Takes the latch. 0: taken; RES_DAEMON: the daemon is gone; -1: a signal
 * handler raised (Ctrl-C while another process holds the latch). A latch
 * held by a session that died is let go of by the daemon within
 * milliseconds; past the first spins the GIL is let go while we wait. */
int latch_take(Ring *r) {
    uint64_t *l = W64(r, R_LATCH);
    for (unsigned i = 0;; i++) {
        uint64_t x = 0;
        if (LOAD(l) == 0 && CAS(l, &x, r->slot))
            return 0;
        if (LOAD(&r->detached))
            return RES_DAEMON;
        if (i < 64)
            continue;
        if (i < 128) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, 20000};
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS
        if ((i & 63) == 0 && PyErr_CheckSignals() < 0)
            return -1;
    }
}

/* Lets go of the latch if it is still ours; changed: bump seq and wake the
 * sleepers. */
void latch_free(Ring *r, int changed) {
    if (changed)
        __atomic_add_fetch(W64(r, R_SEQ), 1, __ATOMIC_SEQ_CST);
    uint64_t mine = r->slot;
    CAS(W64(r, R_LATCH), &mine, 0);
    if (changed && LOAD(W32(r, R_WAITERS)) != 0)
        futex_wake_all(W64(r, R_SEQ));
}

/* items and used bytes, checked; -1 when impossible (under the latch). */
int ring_len(Ring *r, uint64_t *items, uint64_t *used) {
    uint64_t t = LOAD(W64(r, R_TAIL)), h = LOAD(W64(r, R_HEAD));
    uint64_t tp = t & POS_MASK, hp = h & POS_MASK;
    *used = (tp - hp) & POS_MASK;
    *items = ((t >> POS_BITS) - (h >> POS_BITS)) & COUNT_MASK;
    if (*used > r->cap || *items > *used / REC_HEADER || tp % REC_HEADER || hp % REC_HEADER)
        return -1;
    return 0;
}

/* 1: a record of n payload bytes fits; 0: the queue is at its maxsize;
 * 2: no room left in the ring (the daemon keeps what comes next); -1:
 * corrupt (latch held). */
int ring_fits(Ring *r, uint64_t n) {
    uint64_t items, used;
    if (ring_len(r, &items, &used) < 0)
        return -1;
    if (r->maxsize && items >= r->maxsize)
        return 0;
    if (r->joinable && unfinished(r, LOAD(W64(r, R_TAIL))) >= MAX_UNFINISHED)
        return 0;
    uint64_t idx = (LOAD(W64(r, R_TAIL)) & POS_MASK) & (r->cap - 1);
    uint64_t need = REC_HEADER + pad8(n);
    if (idx + need > r->cap)
        need += r->cap - idx;
    return used + need <= r->cap ? 1 : 2;
}

void rec_header(Ring *r, uint64_t idx, uint32_t n, uint32_t kind) {
    uint32_t *p = (uint32_t *)(r->base + RING_HEADER + idx);
    p[0] = n;
    p[1] = kind;
}

/* Where a record of n payload bytes written at tail goes, by the rule
 * ring_writev's comment gives (hp: the head's position): *at its index (0
 * when *pad, a pad record filling the rest from the tail, comes first);
 * returns the tail word after it. ring_writev writes by it and
 * ring_next_tail plans a batch by it, so the two cannot disagree. */
static uint64_t place(Ring *r, uint64_t tail, uint64_t hp, uint64_t n, uint64_t *at, int *pad) {
    uint64_t tp = tail & POS_MASK, tn = tail >> POS_BITS;
    uint64_t idx = tp & (r->cap - 1), need = REC_HEADER + pad8(n), adv = need, used = (tp - hp) & POS_MASK;
    int padded = idx + need > r->cap || (idx >= RING_HOT && 2 * (used + need) <= idx);
    if (padded) {
        adv += r->cap - idx;
        idx = 0;
    }
    if (at != NULL)
        *at = idx;
    if (pad != NULL)
        *pad = padded;
    return ((tp + adv) & POS_MASK) | (((tn + 1) & COUNT_MASK) << POS_BITS);
}

/* Writes one record of n payload bytes gathered from parts (it fits) and
 * returns the tail word to commit; the caller stores it (one store commits
 * every record written before it). Placement: the record goes at the tail
 * unless it would cross the end (a pad record, then index 0), or the tail
 * is past the hot window and there is room before the live records for
 * them and this record again (2 * (used + need) <= idx: they lie in
 * [idx - used, idx), none wraps): a pad record, then index 0, so the ring's
 * footprint stays near RING_HOT plus twice what it holds (the room lets the
 * writer go on until the readers pass the pad; see statemem/ring.go). Either way the record fits when
 * ring_fits said so. */
uint64_t ring_writev(Ring *r, uint64_t tail, const Part *parts, int nparts, uint64_t n, int allow_threads) {
    uint64_t idx;
    int pad;
    uint64_t next = place(r, tail, LOAD(W64(r, R_HEAD)) & POS_MASK, n, &idx, &pad);
    if (pad)
        rec_header(r, (tail & POS_MASK) & (r->cap - 1), 0, REC_PAD);
    rec_header(r, idx, (uint32_t)n, REC_ITEM);
    unsigned char *dst = r->base + RING_HEADER + idx + REC_HEADER;
    /* A large copy lets other threads run when the caller allows it: it
     * holds exports of the buffers (nobody can resize or free them), and
     * the latch, held by our slot, keeps everyone else off the ring. */
    PyThreadState *ts = allow_threads && n >= BIG_COPY ? PyEval_SaveThread() : NULL;
    for (int i = 0; i < nparts; i++) {
        if (parts[i].n) {
            memcpy(dst, parts[i].p, parts[i].n);
            dst += parts[i].n;
        }
    }
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    return next;
}

uint64_t ring_write2(Ring *r, uint64_t tail, const void *a, uint64_t na, const void *b, uint64_t nb) {
    Part parts[2] = {{a, na}, {b, nb}};
    return ring_writev(r, tail, parts, 2, na + nb, 0);
}

uint64_t ring_write(Ring *r, uint64_t tail, const void *data, uint64_t n) {
    return ring_write2(r, tail, data, n, NULL, 0);
}

/* Reads the head record: its payload and the head word after it. 0: an
 * item; RES_DAEMON: an external record (the daemon keeps that item) or a
 * corrupt ring; RES_NONE: empty. */
int ring_peek(Ring *r, uint64_t h, const unsigned char **data, uint64_t *n, uint64_t *next) {
    uint64_t t = LOAD(W64(r, R_TAIL)), tp = t & POS_MASK, hp = h & POS_MASK, hn = h >> POS_BITS;
    uint64_t used = (tp - hp) & POS_MASK, items = ((t >> POS_BITS) - hn) & COUNT_MASK;
    if (used > r->cap || items > used / REC_HEADER || tp % REC_HEADER || hp % REC_HEADER)
        return RES_DAEMON;
    if (items == 0)
        return RES_NONE;
    uint64_t idx = hp & (r->cap - 1), adv = 0;
    uint32_t *p = (uint32_t *)(r->base + RING_HEADER + idx);
    if (p[1] == REC_PAD) {
        adv = r->cap - idx;
        idx = 0;
        p = (uint32_t *)(r->base + RING_HEADER);
    }
    uint32_t len = p[0], kind = p[1];
    if (kind != REC_ITEM || (uint64_t)len > r->cap - idx - REC_HEADER)
        return RES_DAEMON; /* external (the daemon's), or damage the daemon will report */
    adv += REC_HEADER + pad8(len);
    if (adv > used)
        return RES_DAEMON;
    *data = (const unsigned char *)p + REC_HEADER;
    *n = len;
    *next = ((hp + adv) & POS_MASK) | (((hn + 1) & COUNT_MASK) << POS_BITS);
    return 0;
}

/* Takes one off a count that the daemon may have zeroed meanwhile (it
 * forgets a session's sleepers when the session ends). */
void dec_floor(uint32_t *p) {
    uint32_t x = LOAD(p);
    while (x != 0 && !CAS(p, &x, x - 1))
        ;
}

/* Sleeps until seq moves from seen (or the deadline, or a slice passes),
 * counted as a waiter. Results as sleep_on's: 1 again, 0 deadline, 2
 * detached, -1 exception (a signal handler raised). */
static int ring_sleep(Ring *r, uint32_t seen, Wait *wt) {
    double slice = SLEEP_SLICE;
    int expired = 0;
    if (!wt->forever) {
        double left = wt->deadline - now_monotonic();
        if (left <= 0)
            expired = 1;
        else if (left < slice)
            slice = left;
    }
    struct timespec ts;
    ts.tv_sec = (time_t)slice;
    ts.tv_nsec = (long)((slice - (double)ts.tv_sec) * 1e9);
    long rc;
    int err;
    uint32_t *mine = r->slot < RING_SLOTS ? W32(r, R_SLOTS + 16 * r->slot) : NULL;
    if (expired) {
        rc = 0;
        err = 0;
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = syscall(SYS_futex, (uint32_t *)W64(r, R_SEQ), FUTEX_WAIT, seen, &ts, NULL, 0);
        err = errno;
        Py_END_ALLOW_THREADS
    }
    /* The counts were raised under the latch (so that a changer sees
     * them); lower the table's first, the total last, so that a process
     * killed between the two leaves the total one too high (a wasted wake)
     * and never too low (a lost one). */
    if (mine)
        dec_floor(mine);
    STEP(21);
    dec_floor(W32(r, R_WAITERS));
    if (rc == -1 && err == EINTR && PyErr_CheckSignals() < 0)
        return -1;
    if (expired)
        return 0;
    return LOAD(&r->detached) ? 2 : 1;
}

/* Registers as a waiter for op (WAIT_GET, WAIT_PUT) and reads seq, under
 * the latch; then lets go. The slot's entry records what for and since
 * when (for status) when its count leaves 0. */
static uint32_t register_wait(Ring *r, uint32_t op) {
    __atomic_add_fetch(W32(r, R_WAITERS), 1, __ATOMIC_SEQ_CST);
    if (r->slot < RING_SLOTS) {
        unsigned char *e = r->base + R_SLOTS + 16 * r->slot;
        if (LOAD((uint32_t *)e) == 0) {
            STORE((uint32_t *)(e + 4), op);
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            STORE((uint64_t *)(e + 8), (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec);
        }
        __atomic_add_fetch((uint32_t *)e, 1, __ATOMIC_SEQ_CST);
    }
    uint32_t seen = (uint32_t)LOAD(W64(r, R_SEQ));
    latch_free(r, 0);
    return seen;
}

static int wait_start(Wait *wt, double timeout) {
    wt->started = 1;
    wt->forever = timeout < 0;
    wt->deadline = wt->forever ? 0 : now_monotonic() + timeout;
    return 0;
}

int ring_wait(Ring *r, uint32_t op, Wait *wt, double timeout) {
    if (!wt->started)
        wait_start(wt, timeout);
    uint32_t seen = register_wait(r, op);
    return ring_sleep(r, seen, wt);
}

/* The common start of an op: latch taken, and no flag that sends the op to
 * the daemon. A put goes to the daemon with any flag set (with OVER the
 * daemon holds the newest items: a put must queue behind them); a get only
 * with a flag other than OVER (the daemon holds items before the ring's),
 * and with OVER it gets from the ring while the ring holds records (*over
 * tells it to go to the daemon once the ring is empty). The flags change
 * only under the latch, so they hold for the whole op. */
int op_begin_for(Ring *r, int get, int *over) {
    if (r->base == NULL || LOAD(&r->detached))
        return RES_DAEMON;
    int l = latch_take(r);
    if (l != 0)
        return l;
    uint64_t f = LOAD(W64(r, R_FLAGS));
    if (f & ~(get ? FLAG_OVER : 0ULL)) {
        latch_free(r, 0);
        return RES_DAEMON;
    }
    if (over != NULL)
        *over = (f & FLAG_OVER) != 0;
    return 0;
}

int op_begin(Ring *r) { return op_begin_for(r, 0, NULL); }

/* The put loop for an encoded item of n bytes in pieces. */
int put_corev(Ring *r, const Part *parts, int nparts, uint64_t n, double timeout) {
    Wait wt = {.started = 0};
    if (n > r->inline_max)
        return RES_DAEMON;
    for (;;) {
        int res = op_begin(r);
        if (res != 0)
            return res;
        STEP(1);
        int fits = ring_fits(r, n);
        if (fits < 0 || fits == 2) { /* corrupt, or an item for the daemon to keep */
            latch_free(r, 0);
            return RES_DAEMON;
        }
        if (fits == 1) {
            uint64_t t = ring_writev(r, LOAD(W64(r, R_TAIL)), parts, nparts, n, 1);
            STEP(2);
            if (!latch_ours(r))
                return RES_DAEMON; /* taken over: nothing committed */
            STORE(W64(r, R_TAIL), t);
            STEP(3);
            latch_free(r, 1);
            return RES_OK;
        }
        if (timeout == 0) {
            latch_free(r, 0);
            return RES_NONE;
        }
        int sl = ring_wait(r, WAIT_PUT, &wt, timeout);
        if (sl != 1)
            return slept_result(sl, RES_NONE);
    }
}

/* The tail word after a record of n payload bytes written at tail, placed
 * as ring_writev places it (hp: the head's position). */
uint64_t ring_next_tail(Ring *r, uint64_t tail, uint64_t hp, uint64_t n) { return place(r, tail, hp, n, NULL, NULL); }
