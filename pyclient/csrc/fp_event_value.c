/* syncmgr._fastpath: Event (flag and generation) and numeric Value (an 8-byte cell). */
#include "fastpath.h"

/* --- Event --------------------------------------------------------------- */

PyObject *seg_event_is_set(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "event_is_set");
    uint64_t *w = word_at(s, args[0], 0);
    if (w == NULL)
        return NULL;
    return PyBool_FromLong((long)(LOAD(w) & EVENT_FLAG));
}

/* event_set(off) -> OK | DAEMON */
PyObject *seg_event_set(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *seg_event_clear(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
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
static int event_wait_in(Segment *s, uint64_t *w, uint64_t gen, double timeout, Wait *wt) {
    for (;;) {
        uint64_t x = LOAD(w);
        if ((x & EVENT_FLAG) || (x & EVENT_GEN_MAX) != gen)
            return 1;
        int r = wait_turn(s, w, x, timeout, wt);
        if (r != 1)
            return r == 2 ? 2 : r < 0 ? -1 : 0;
    }
}

/* slot 0: no waiter-table entry. A set wakes every sleeper (one FUTEX_WAKE), so
 * a waiter leaving passes no wake-up on. */
static PyObject *event_wait_core(Segment *s, uint64_t *w, uint64_t gen, double timeout, uint64_t slot) {
    Wait wt = {.slot = slot};
    int r = event_wait_in(s, w, gen, timeout, &wt);
    wait_done(w, &wt, RES_OK);
    if (r < 0)
        return NULL;
    if (r == 2)
        Py_RETURN_NONE; /* the daemon is gone: ask the socket path */
    return PyBool_FromLong(r);
}

/* event_wait(off, timeout) -> bool: set (or set and cleared since the call);
 * None when the segment was detached meanwhile */
PyObject *seg_event_wait(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "event_wait");
    uint64_t *w = word_at(s, args[0], 0);
    double timeout;
    if (w == NULL || get_timeout(args[1], &timeout) < 0)
        return NULL;
    return event_wait_core(s, w, LOAD(w) & EVENT_GEN_MAX, timeout, 0);
}

/* event_gen(off) -> the Event's generation, for event_wait_since and the
 * daemon's wait `since` */
PyObject *seg_event_gen(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(1, "event_gen");
    uint64_t *w = word_at(s, args[0], 0);
    if (w == NULL)
        return NULL;
    return PyLong_FromUnsignedLongLong(LOAD(w) & EVENT_GEN_MAX);
}

/* event_wait_since(off, gen, timeout[, slot]) -> bool: as event_wait,
 * counting any set after generation gen (read earlier from the state word);
 * with slot, the wait holds an entry of the waiter table */
PyObject *seg_event_wait_since(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "event_wait_since() takes 3 or 4 arguments");
        return NULL;
    }
    uint64_t *w = word_at(s, args[0], 0), gen, slot = 0;
    double timeout;
    if (w == NULL || get_u64(args[1], &gen) < 0 || get_timeout(args[2], &timeout) < 0 ||
        (nargs == 4 && get_slot(args[3], &slot) < 0))
        return NULL;
    return event_wait_core(s, w, gen & EVENT_GEN_MAX, timeout, slot);
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
PyObject *seg_value_get(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
    NARGS(2, "value_get");
    uint64_t *aux = word_at(s, args[0], OFF_AUX);
    int cls;
    unsigned width;
    if (aux == NULL || get_class(args[1], &cls, &width) < 0)
        return NULL;
    return decode(cls, LOAD(aux));
}

/* value_set(off, cls, value) */
PyObject *seg_value_set(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
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
PyObject *seg_value_add(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
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
PyObject *seg_value_cas(Segment *s, PyObject *const *args, Py_ssize_t nargs) {
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
