/* syncmgr._fastpath: the Queue ring's protocol, shared by the ring's
 * Python type (fp_queue.c) and its operations (fp_ring.c): the layout
 * (statemem/ring.go, which this must match; statemem/layout_c_test.go
 * compares every constant), the latch, records, sleeps and commits. */
#ifndef SYNCMGR_FP_RING_H
#define SYNCMGR_FP_RING_H

#include "fastpath.h"

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
/* fp_itembuf.c: a copy of an item out of the ring for Python to decode
 * (a bytearray, or a memoryview of reused memory for a large one). */
PyObject *item_copy(const unsigned char *data, uint64_t n);
int itembuf_add_types(PyObject *m);
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
#include <signal.h>
extern int ring_kill_step;
#define STEP(n)                      \
    do {                             \
        if (ring_kill_step == (n))   \
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

/* Whether the latch is still ours: the daemon takes over the latch of a
 * session that ended, so a process whose session ended under it (its
 * sockets closed while it lived) must neither commit nor let go of a latch
 * that is someone else's now. */
static inline int latch_ours(Ring *r) { return LOAD(W64(r, R_LATCH)) == r->slot; }

/* A piece of a record's payload (put_parts gathers many). */
typedef struct {
    const void *p;
    uint64_t n;
} Part;

void journal(Ring *r, uint64_t kind, uint64_t proof, uint64_t idx, uint32_t after);
void owe_got(Ring *r, uint64_t n);
int latch_take(Ring *r);
void latch_free(Ring *r, int changed);
int ring_len(Ring *r, uint64_t *items, uint64_t *used);
int ring_fits(Ring *r, uint64_t n);
void rec_header(Ring *r, uint64_t idx, uint32_t n, uint32_t kind);
uint64_t ring_writev(Ring *r, uint64_t tail, const Part *parts, int nparts, uint64_t n, int allow_threads);
uint64_t ring_write2(Ring *r, uint64_t tail, const void *a, uint64_t na, const void *b, uint64_t nb);
uint64_t ring_write(Ring *r, uint64_t tail, const void *data, uint64_t n);
int ring_peek(Ring *r, uint64_t h, const unsigned char **data, uint64_t *n, uint64_t *next);
void dec_floor(uint32_t *p);
/* Waits once for the ring to change, as a waiter for op (WAIT_GET,
 * WAIT_PUT, WAIT_JOIN): registers under the latch, lets go of it and
 * sleeps on seq, the wait's deadline set at the first call. 1: look again;
 * otherwise slept_result gives the op's answer. */
int ring_wait(Ring *r, uint32_t op, Wait *wt, double timeout);
/* An op's result for a ring_wait other than 1: -1 an exception, expired
 * (the op's answer at its deadline), RES_DAEMON when detached. */
static inline int slept_result(int sl, int expired) {
    return sl < 0 ? -1 : sl == 0 ? expired : RES_DAEMON;
}
int op_begin_for(Ring *r, int get, int *over);
int op_begin(Ring *r);
int put_corev(Ring *r, const Part *parts, int nparts, uint64_t n, double timeout);
uint64_t ring_next_tail(Ring *r, uint64_t tail, uint64_t hp, uint64_t n);

#endif
