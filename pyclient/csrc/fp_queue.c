/* syncmgr._fastpath: Queue: the Ring type, a queue's records in the
 * daemon's shared ring (layout: statemem/ring.go, which this file must
 * match).
 *
 * Every op holds the ring's latch (our session slot id in one word) while
 * it reads or writes the ring, and commits with one store: a put stores
 * the tail word once its record is complete, a get stores the head word
 * once it has copied the record out. A process killed anywhere in an op
 * leaves either nothing done or the op done; the daemon lets go of a dead
 * session's latch. Nothing read from the ring is trusted: every position
 * and length is checked against the capacity we were given, and anything
 * impossible answers DAEMON (the daemon finds the damage and fails the
 * queue with an error). */
#include "fastpath.h"

#include <sched.h>
#include <signal.h>

#define RING_MAGIC 0x5152474d434e5953ULL /* "SYNCMGRQ" */
#define RING_VERSION 2u
#define RING_SLOTS 1024u
#define R_OWED (128u + 16u * RING_SLOTS)
#define RING_HEADER (R_OWED + 4u * RING_SLOTS)
#define WAIT_GET 1u
#define WAIT_PUT 2u
#define WAIT_JOIN 3u
#define R_CAP 16u
#define R_INLINE 32u
#define R_JPROOF 40u
#define R_JOP 48u
#define R_JHOLDER 56u
#define R_LATCH 64u
#define R_FLAGS 72u
#define R_TAIL 80u
#define R_HEAD 88u
#define R_SEQ 96u
#define R_WAITERS 104u
#define R_DONE 112u
#define R_SLOTS 128u
#define FLAG_DAEMON 1ULL
#define FLAG_OVER 2ULL
#define REC_ITEM 1u
#define REC_EXTERNAL 2u
#define REC_PAD 3u
#define POS_BITS 40
#define POS_MASK ((1ULL << POS_BITS) - 1)
#define COUNT_MASK ((1ULL << 24) - 1)
#define REC_HEADER 8u
/* The hot window: a put into an empty ring past it starts again at 0. */
#define RING_HOT (256u << 10)
#define RING_MAX_CAP (1ULL << 30)
/* Copies of at least this many bytes let go of the GIL. */
#define BIG_COPY (256u << 10)
/* Buffers put_parts takes at once. */
#define MAX_PARTS 1024
#define JOURNAL_GET 1ULL
#define JOURNAL_DONE 2ULL
/* A JoinableQueue's unfinished count is kept mod 2^24: a put past this
 * waits as on a full queue. */
#define MAX_UNFINISHED (COUNT_MASK - 1)
/* A sleep is at most this long between looks at the detached flag. */
#define SLEEP_SLICE 1.0

/* The result of an op that found the queue full (put) or empty (get). */
#define RES_NONE RES_BUSY

typedef struct {
    PyObject_HEAD
    unsigned char *base;
    size_t size;
    uint64_t cap;     /* from the daemon's reply, not from the ring */
    uint64_t inline_max;
    uint64_t maxsize; /* from queue_attach's reply: bounds our own puts */
    uint64_t slot;
    int joinable; /* from queue_attach's reply: task counts in the ring */
    int detached;
} Ring;

#ifdef SYNCMGR_TEST_HOOKS
/* Test hook (test builds only: SYNCMGR_TEST_HOOKS): the process kills
 * itself at this labelled step (0: never). */
static int kill_step;
#define STEP(n)                      \
    do {                             \
        if (kill_step == (n))        \
            raise(SIGKILL);          \
    } while (0)
#else
#define STEP(n) \
    do {        \
    } while (0)
#endif

#define W64(r, off) ((uint64_t *)((r)->base + (off)))
#define W32(r, off) ((uint32_t *)((r)->base + (off)))

static inline uint64_t pad8(uint64_t n) { return (n + 7) & ~7ULL; }

/* A JoinableQueue's unfinished tasks given the tail word: puts less the
 * done word, mod 2^24 (the daemon lowers done by one for each put it keeps
 * outside the ring, so this counts those too). Under the latch. */
static inline uint64_t unfinished(Ring *r, uint64_t tail) {
    return ((tail >> POS_BITS) - LOAD(W64(r, R_DONE))) & COUNT_MASK;
}

/* The owed-table entry idx (< RING_SLOTS): items that slot got and has not
 * marked done. */
static inline uint32_t *owed(Ring *r, uint64_t idx) { return W32(r, R_OWED + 4 * idx); }

/* Writes the journal of a JoinableQueue op about to commit: the commit
 * stores proof (the head word for a get, the done word for task_done);
 * once committed, owed entry idx is to become after. The daemon, taking
 * over the latch of a holder that died, finishes that second store if the
 * commit happened (statemem.Ring.repair). The op word goes last: it makes
 * the journal valid. */
static void journal(Ring *r, uint64_t kind, uint64_t proof, uint64_t idx, uint32_t after) {
    STORE(W64(r, R_JPROOF), proof);
    STORE(W64(r, R_JHOLDER), r->slot);
    STORE(W64(r, R_JOP), kind << 56 | idx << 32 | after);
}

/* The second store of a get on a JoinableQueue ring (committed): the slot
 * owes n more items; then the journal is done. */
static void owe_got(Ring *r, uint64_t n) {
    if (!r->joinable)
        return;
    STORE(owed(r, r->slot), LOAD(owed(r, r->slot)) + (uint32_t)n);
    STORE(W64(r, R_JOP), 0);
}

/* Takes the latch. 0: taken; RES_DAEMON: the daemon is gone; -1: a signal
 * handler raised (Ctrl-C while another process holds the latch). A latch
 * held by a session that died is let go of by the daemon within
 * milliseconds; past the first spins the GIL is let go while we wait. */
static int latch_take(Ring *r) {
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

/* Whether the latch is still ours: the daemon takes over the latch of a
 * session that ended, so a process whose session ended under it (its
 * sockets closed while it lived) must neither commit nor let go of a latch
 * that is someone else's now. */
static inline int latch_ours(Ring *r) { return LOAD(W64(r, R_LATCH)) == r->slot; }

/* Lets go of the latch if it is still ours; changed: bump seq and wake the
 * sleepers. */
static void latch_free(Ring *r, int changed) {
    if (changed)
        __atomic_add_fetch(W64(r, R_SEQ), 1, __ATOMIC_SEQ_CST);
    uint64_t mine = r->slot;
    CAS(W64(r, R_LATCH), &mine, 0);
    if (changed && LOAD(W32(r, R_WAITERS)) != 0)
        futex_wake_all(W64(r, R_SEQ));
}

/* items and used bytes, checked; -1 when impossible (under the latch). */
static int ring_len(Ring *r, uint64_t *items, uint64_t *used) {
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
static int ring_fits(Ring *r, uint64_t n) {
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

static void rec_header(Ring *r, uint64_t idx, uint32_t n, uint32_t kind) {
    uint32_t *p = (uint32_t *)(r->base + RING_HEADER + idx);
    p[0] = n;
    p[1] = kind;
}

/* A piece of a record's payload (put_parts gathers many). */
typedef struct {
    const void *p;
    uint64_t n;
} Part;

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
static uint64_t ring_writev(Ring *r, uint64_t tail, const Part *parts, int nparts, uint64_t n, int allow_threads) {
    uint64_t tp = tail & POS_MASK, tn = tail >> POS_BITS, hp = LOAD(W64(r, R_HEAD)) & POS_MASK;
    uint64_t idx = tp & (r->cap - 1), need = REC_HEADER + pad8(n), adv = need, used = (tp - hp) & POS_MASK;
    if (idx + need > r->cap || (idx >= RING_HOT && 2 * (used + need) <= idx)) {
        rec_header(r, idx, 0, REC_PAD);
        adv += r->cap - idx;
        idx = 0;
    }
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
    return ((tp + adv) & POS_MASK) | (((tn + 1) & COUNT_MASK) << POS_BITS);
}

static uint64_t ring_write2(Ring *r, uint64_t tail, const void *a, uint64_t na, const void *b, uint64_t nb) {
    Part parts[2] = {{a, na}, {b, nb}};
    return ring_writev(r, tail, parts, 2, na + nb, 0);
}

static uint64_t ring_write(Ring *r, uint64_t tail, const void *data, uint64_t n) {
    return ring_write2(r, tail, data, n, NULL, 0);
}

/* Reads the head record: its payload and the head word after it. 0: an
 * item; RES_DAEMON: an external record (the daemon keeps that item) or a
 * corrupt ring; RES_NONE: empty. */
static int ring_peek(Ring *r, uint64_t h, const unsigned char **data, uint64_t *n, uint64_t *next) {
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

/* A new bytearray holding a copy of n bytes at data (a large copy lets
 * other threads run); NULL with an exception. */
static PyObject *bytearray_copy(const unsigned char *data, uint64_t n) {
    if (n < BIG_COPY)
        return PyByteArray_FromStringAndSize((const char *)data, (Py_ssize_t)n);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (out == NULL)
        return NULL;
    char *dst = PyByteArray_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    memcpy(dst, data, n);
    Py_END_ALLOW_THREADS
    return out;
}

/* Takes one off a count that the daemon may have zeroed meanwhile (it
 * forgets a session's sleepers when the session ends). */
static void dec_floor(uint32_t *p) {
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

/* The common start of an op: latch taken, and no flag that sends the op to
 * the daemon. A put goes to the daemon with any flag set (with OVER the
 * daemon holds the newest items: a put must queue behind them); a get only
 * with a flag other than OVER (the daemon holds items before the ring's),
 * and with OVER it gets from the ring while the ring holds records (*over
 * tells it to go to the daemon once the ring is empty). The flags change
 * only under the latch, so they hold for the whole op. */
static int op_begin_for(Ring *r, int get, int *over) {
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

static int op_begin(Ring *r) { return op_begin_for(r, 0, NULL); }

/* The put loop for an encoded item of n bytes in pieces. */
static int put_corev(Ring *r, const Part *parts, int nparts, uint64_t n, double timeout) {
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
        if (!wt.started)
            wait_start(&wt, timeout);
        uint32_t seen = register_wait(r, WAIT_PUT);
        int sl = ring_sleep(r, seen, &wt);
        if (sl != 1)
            return sl < 0 ? -1 : sl == 0 ? RES_NONE : RES_DAEMON;
    }
}

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

/* The tail word after a record of n payload bytes written at tail, placed
 * as ring_writev places it (hp: the head's position). */
static uint64_t ring_next_tail(Ring *r, uint64_t tail, uint64_t hp, uint64_t n) {
    uint64_t tp = tail & POS_MASK, tn = tail >> POS_BITS;
    uint64_t idx = tp & (r->cap - 1), need = REC_HEADER + pad8(n), adv = need, used = (tp - hp) & POS_MASK;
    if (idx + need > r->cap || (idx >= RING_HOT && 2 * (used + need) <= idx))
        adv += r->cap - idx;
    return ((tp + adv) & POS_MASK) | (((tn + 1) & COUNT_MASK) << POS_BITS);
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
 * those), or a corrupt ring. While there is no room for all it waits, as
 * put does. */
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
        int room = (((t & POS_MASK) - hp) & POS_MASK) <= r->cap && (!r->maxsize || cnt + (uint64_t)n <= r->maxsize) &&
                   (!r->joinable || unfinished(r, t0) + (uint64_t)n < MAX_UNFINISHED);
        if (room) {
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
        if (!wt.started)
            wait_start(&wt, timeout);
        uint32_t seen = register_wait(r, WAIT_PUT);
        int sl = ring_sleep(r, seen, &wt);
        if (sl != 1)
            res = sl < 0 ? -1 : sl == 0 ? RES_NONE : RES_DAEMON;
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
                out = bytearray_copy(data, n);
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
        if (!wt.started)
            wait_start(&wt, timeout);
        uint32_t seen = register_wait(r, WAIT_GET);
        int sl = ring_sleep(r, seen, &wt);
        if (sl != 1) {
            *res = sl < 0 ? -1 : sl == 0 ? RES_NONE : RES_DAEMON;
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
                b = bytearray_copy(data, n);
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
        if (!wt.started)
            wait_start(&wt, timeout);
        uint32_t seen = register_wait(r, WAIT_GET);
        int s = ring_sleep(r, seen, &wt);
        if (s != 1)
            return result(s < 0 ? -1 : s == 0 ? RES_NONE : RES_DAEMON);
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
        if (!wt.started)
            wait_start(&wt, timeout);
        uint32_t seen = register_wait(r, WAIT_JOIN);
        int sl = ring_sleep(r, seen, &wt);
        if (sl != 1)
            return result(sl < 0 ? -1 : sl == 0 ? RES_BUSY : RES_DAEMON);
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
    kill_step = (int)n;
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
    if (PyType_Ready(&RingType) < 0)
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
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        return -1;
    }
    return PyModule_AddFunctions(m, queue_module_methods);
}
