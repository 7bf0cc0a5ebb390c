/* syncmgr._fastpath: the memory a large item is copied into out of a
 * Queue's ring (or read into from a socket: item_buffer), kept for the
 * next large item once nothing uses it.
 *
 * A large item (BIG_COPY and over: a numpy array's bytes) is copied out of
 * the ring into memory of its own, which its arrays then use. Fresh memory
 * from malloc is fresh pages more often than not (the C library gives a
 * freed megabyte back to the system once its heap's top grows past twice
 * it, which a batch of arrays does), and each page's first write is a
 * fault: for a consumer of 1 MiB arrays the faults cost more than the copy.
 * So the memory is mapped here, and when the last view of it goes, the
 * mapping waits in a small cache for an item of about its size (LIFO, up
 * to CACHE_SLOTS mappings and CACHE_BYTES in all; past that the oldest is
 * unmapped). A mapping is reused only once its object is gone, and an
 * object lives while any memoryview (and so any array) of it does.
 *
 * Every call here holds the GIL, which guards the cache. */
#include "fp_ring.h"

#define CACHE_SLOTS 64
#define CACHE_BYTES ((size_t)64 << 20)

typedef struct {
    PyObject_HEAD
    unsigned char *mem;
    size_t len; /* the item's bytes */
    size_t cap; /* the mapping's (whole pages) */
} ItemBuf;

static struct {
    unsigned char *mem;
    size_t cap;
} cache[CACHE_SLOTS];
static int cached;        /* entries, oldest first */
static size_t cached_cap; /* their bytes */

static size_t page_size(void) {
    static size_t page;
    if (page == 0) {
        long p = sysconf(_SC_PAGESIZE);
        page = p > 0 ? (size_t)p : 4096;
    }
    return page;
}

/* Entry i, out of the cache (its mapping now the caller's); *cap its size. */
static unsigned char *cache_take(int i, size_t *cap) {
    unsigned char *mem = cache[i].mem;
    *cap = cache[i].cap;
    cached_cap -= cache[i].cap;
    memmove(&cache[i], &cache[i + 1], (size_t)(cached - i - 1) * sizeof cache[0]);
    cached--;
    return mem;
}

/* A mapping of at least n bytes: the newest cached one of n to n + n/4
 * bytes (rounded to pages), else a new one, its pages faulted in at once
 * (MAP_POPULATE: one trip into the kernel, not one per page). NULL with
 * errno when the system has no memory. */
static unsigned char *mem_take(size_t n, size_t *cap) {
    size_t page = page_size();
    size_t want = (n + page - 1) / page * page;
    if (want == 0)
        want = page;
    for (int i = cached - 1; i >= 0; i--)
        if (cache[i].cap >= want && cache[i].cap - want <= want / 4)
            return cache_take(i, cap);
    void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    *cap = want;
    return (unsigned char *)p;
}

/* Back into the cache (the oldest leaving to make room), or unmapped when
 * it alone is over the cache's bytes. */
static void mem_give(unsigned char *mem, size_t cap) {
    if (cap > CACHE_BYTES) {
        munmap(mem, cap);
        return;
    }
    while (cached > 0 && (cached == CACHE_SLOTS || cached_cap + cap > CACHE_BYTES)) {
        size_t old;
        unsigned char *oldest = cache_take(0, &old);
        munmap(oldest, old);
    }
    cache[cached].mem = mem;
    cache[cached].cap = cap;
    cached++;
    cached_cap += cap;
}

static void itembuf_dealloc(ItemBuf *b) {
    if (b->mem != NULL)
        mem_give(b->mem, b->cap);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static int itembuf_getbuffer(ItemBuf *b, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)b, b->mem, (Py_ssize_t)b->len, 0, flags);
}

static PyBufferProcs itembuf_as_buffer = {
    .bf_getbuffer = (getbufferproc)itembuf_getbuffer,
};

static PyTypeObject ItemBufType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "syncmgr._fastpath.ItemBuffer",
    .tp_basicsize = sizeof(ItemBuf),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "the writable memory of a large item copied out of a ring (read it through a memoryview)",
    .tp_dealloc = (destructor)itembuf_dealloc,
    .tp_as_buffer = &itembuf_as_buffer,
};

/* A writable memoryview of a new ItemBuffer of n bytes: a copy of the n
 * bytes at data (made with the GIL let go), or, with data NULL, whatever
 * the memory held. NULL with an exception. */
static PyObject *itembuf_view(const unsigned char *data, size_t n) {
    ItemBuf *b = PyObject_New(ItemBuf, &ItemBufType);
    if (b == NULL)
        return NULL;
    b->len = n;
    b->mem = mem_take(n, &b->cap);
    if (b->mem == NULL) {
        Py_DECREF(b);
        return PyErr_NoMemory();
    }
    if (data != NULL) {
        unsigned char *dst = b->mem;
        Py_BEGIN_ALLOW_THREADS
        memcpy(dst, data, n);
        Py_END_ALLOW_THREADS
    }
    PyObject *view = PyMemoryView_FromObject((PyObject *)b);
    Py_DECREF(b);
    return view;
}

/* A copy of the n bytes at data, for Python to decode: a bytearray, or
 * from BIG_COPY bytes an ItemBuffer's memoryview. NULL with an exception. */
PyObject *item_copy(const unsigned char *data, uint64_t n) {
    if (n < BIG_COPY)
        return PyByteArray_FromStringAndSize((const char *)data, (Py_ssize_t)n);
    return itembuf_view(data, (size_t)n);
}

/* item_buffer(n) -> memoryview: n writable bytes of the memory large items
 * use, for a large reply read from a socket (the caller fills them all:
 * they hold whatever an earlier item of this process left). */
static PyObject *item_buffer(PyObject *Py_UNUSED(m), PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "item_buffer: the size must be positive");
        return NULL;
    }
    return itembuf_view(NULL, (size_t)n);
}

/* _item_cache() -> (mappings, bytes): what the cache holds now (tests). */
static PyObject *item_cache(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a)) {
    return Py_BuildValue("(in)", cached, (Py_ssize_t)cached_cap);
}

static PyMethodDef itembuf_module_methods[] = {
    {"item_buffer", item_buffer, METH_O, "item_buffer(n) -> memoryview: n writable bytes for a large reply (contents unset)"},
    {"_item_cache", item_cache, METH_NOARGS, "_item_cache() -> (mappings, bytes) of large items' memory kept for reuse"},
    {NULL, NULL, 0, NULL},
};

int itembuf_add_types(PyObject *m) {
    if (PyModule_AddType(m, &ItemBufType) < 0)
        return -1;
    return PyModule_AddFunctions(m, itembuf_module_methods);
}
