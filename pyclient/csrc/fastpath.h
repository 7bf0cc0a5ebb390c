/*
 * The same-host fast path's word operations: what the families of
 * syncmgr._fastpath share.
 *
 * The daemon keeps the state words of Locks, RLocks, Semaphores, Events and
 * numeric Values in a shared-memory segment (layout: docs/protocol.md,
 * "Same-host fast path", and statemem/layout.go, which these files must
 * match). A client on the daemon's host maps the segment and changes a word
 * with one compare-and-swap; contended waits sleep on a futex on the word's
 * low 32 bits. Every op that finds the daemon bit set changes nothing and
 * answers DAEMON: the caller then sends the op over the socket.
 *
 * One file per family, as on the daemon's side:
 *
 *   fp_wait.c         futex sleeps, deadlines, argument parsing
 *   fp_lock.c         Lock and RLock
 *   fp_semaphore.c    Semaphore and BoundedSemaphore (the latch protocol)
 *   fp_event_value.c  Event and numeric Value
 *   fp_queue.c        Queue: the Ring type (records in a shared ring)
 *   fp_itembuf.c      Queue: the memory large items are copied out into
 *   fp_module.c       the Segment and LockHandle types, the module
 *
 * CPython C API and the C library only. The GIL is released while a thread
 * sleeps on a futex; a signal (Ctrl-C) interrupts the sleep and its Python
 * handler runs, so KeyboardInterrupt leaves the wait with nothing taken.
 * Only PyInit__fastpath is exported (-fvisibility=hidden).
 */
#ifndef SYNCMGR_FASTPATH_H
#define SYNCMGR_FASTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <string.h>
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
#define VERSION 2u
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
/* A contended acquire's reads of the word before its first sleep (spin_until). */
#define SPIN_READS 100

/* Waits (fp_wait.c). The header's bytes 24 and 28: the waiter table's
 * offset and its number of entries (0: no table), a pool shared by every
 * session slot; byte 32: the count of waits asleep with no entry (the
 * table was full). An entry is ENTRY_SIZE bytes, one per thread asleep in a
 * wait: u32 object offset, u32 session slot (0: free), u64 since
 * (CLOCK_MONOTONIC ns). */
#define HDR_WAITERS 24u
#define HDR_WAITERS_LEN 28u
#define HDR_UNRECORDED 32u
#define ENTRY_SIZE 16u
/* A Lock's, RLock's or Semaphore's heir (u32 at slot offset 48): the
 * session slot a starving waiter reserved the next free turn (or unit) for
 * (0: none). */
#define OFF_HEIR 48u
/* A waiter starves once it has waited this long (Go's sync.Mutex: 1 ms). */
#define STARVE_AFTER 0.001
/* A waiter that finds a lock free but reserved for another slot's heir
 * looks again after at most this long. */
#define RESERVED_NAP 0.002
/* Futex bitsets: every sleeper matches WAKE_ANY; the heir's own sleep
 * also matches WAKE_HEIR, so that a release in starvation mode wakes only
 * it. */
#define WAKE_NORMAL 1u
#define WAKE_HEIR 2u

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

/* Sleep state shared by the waiting loops: a deadline (or none), and the
 * waiter's record in the segment's waiter table while it waits. */
typedef struct {
    int started; /* the deadline is set on the first sleep, not before */
    int forever;
    double deadline;
    uint64_t slot;  /* the waiter's session slot; 0: no record, never the heir */
    uint32_t *rec;  /* our entry of the waiter table, while we hold it */
    uint32_t *unrec; /* the header's unrecorded count, while it counts us */
    int slept;      /* slept on the word at least once */
    int heir;       /* this wait made its slot the heir */
    double start;   /* when the first contended turn began */
} Wait;

#define HEIR_OF(w) ((uint32_t *)((unsigned char *)(w) + OFF_HEIR))

#define NARGS(n, name)                                                    \
    if (nargs != (n)) {                                                   \
        PyErr_Format(PyExc_TypeError, name "() takes %d arguments", (n)); \
        return NULL;                                                      \
    }

/* The acquire loop of a Lock or an RLock. */
typedef int (*acquire_core)(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout);

static inline PyObject *result(int r) { return r < 0 ? NULL : PyLong_FromLong(r); }

/* fp_module.c */
void *map_daemon_memory(int fd, Py_ssize_t size, const char *what);
/* fp_wait.c */
void futex_wake_all(uint64_t *w);
long futex_wake_one(uint64_t *w);
long futex_wake_heir(uint64_t *w);
uint32_t *waiter_table(Segment *s, uint32_t *n);
void wait_done(uint64_t *w, Wait *wt, int r);
int sleep_on_bits(Segment *s, uint64_t *w, uint64_t x, Wait *wt, uint32_t bits);
void stamp_since(uint64_t *w);
double now_monotonic(void);
int sleep_on(Segment *s, uint64_t *w, uint64_t x, Wait *wt);
int spin_until(uint64_t *w, uint64_t x, uint64_t mask);
int wait_turn(Segment *s, uint64_t *w, uint64_t x, double timeout, Wait *wt);
int heir_turn(Segment *s, uint64_t *w, uint64_t x, double timeout, Wait *wt, int reserved);
int turn_result(int r);
uint64_t *word_at(Segment *s, PyObject *offobj, unsigned field);
int get_u64(PyObject *o, uint64_t *out);
int get_tid(PyObject *o, uint64_t *out);
int get_slot(PyObject *o, uint64_t *out);
int get_timeout(PyObject *o, double *out);
PyObject *acquire_call(Segment *s, PyObject *const *args, acquire_core core);
/* fp_lock.c */
int lock_acquire_core(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout);
int lock_release_core(uint64_t *w);
int rlock_acquire_core(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout);
int rlock_release_core(uint64_t *w, uint64_t slot, uint64_t tid);
/* fp_semaphore.c */
int sem_acquire_core(Segment *s, uint64_t *w, uint64_t slot, uint64_t tid, double timeout);
int sem_release_core(Segment *s, uint64_t *w, uint64_t slot);

/* fp_queue.c: the Ring type and the module functions of queues */
int queue_add_types(PyObject *m);

/* fp_scalar.c: plain scalars as the socket path stores them (0xC1 + msgpack).
 * encode_scalar: o's header into hdr (at most 10 bytes) and *body at its
 * bytes; 1 done, 0 not a plain scalar (Python encodes it), -1 an exception.
 * decode_scalar: NULL without an exception when p is anything else. */
int encode_scalar(PyObject *o, unsigned char *hdr, uint64_t *nh, const void **body, uint64_t *nb);
PyObject *decode_scalar(const unsigned char *p, uint64_t n);
/* pack_bins(items) -> bytes | None: a socket put_many's items argument for a
 * list of plain scalars (module function). */
PyObject *pack_bins(PyObject *m, PyObject *items);
/* loads_bins(datas, fallback) -> list: a socket get_many's records decoded,
 * plain scalars here and the rest by fallback (module function). */
PyObject *loads_bins(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

/* Segment methods, by family (the table is in fp_module.c). */
/* fp_lock.c */
PyObject *seg_lock_acquire(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_lock_release(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_rlock_acquire(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_rlock_release(Segment *s, PyObject *const *args, Py_ssize_t nargs);
/* fp_semaphore.c */
PyObject *seg_sem_acquire(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_sem_release(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_sem_taken(Segment *s, PyObject *const *args, Py_ssize_t nargs);
/* fp_event_value.c */
PyObject *seg_event_is_set(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_event_set(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_event_clear(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_event_wait(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_event_gen(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_event_wait_since(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_value_get(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_value_set(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_value_add(Segment *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *seg_value_cas(Segment *s, PyObject *const *args, Py_ssize_t nargs);

#endif
