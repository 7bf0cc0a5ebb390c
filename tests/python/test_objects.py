"""Every proxy method against the real daemon, with threading/queue semantics."""

from __future__ import annotations

import ctypes
import queue
import threading
import time

import numpy as np
import pytest

import syncmgr
from conftest import object_count, wait_until


def test_lock_basics(m):
    lock = m.Lock()
    assert lock.acquire() is True
    assert lock.acquire(blocking=False) is False
    assert lock.acquire(timeout=0.05) is False
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()  # releasing an unlocked Lock
    with lock:
        assert lock.acquire(False) is False
    assert lock.acquire(timeout=-1) is True  # -1 means wait for ever, as threading
    lock.release()
    with pytest.raises(ValueError):
        lock.acquire(timeout=-2)
    with pytest.raises(ValueError):
        lock.acquire(False, 1.0)


def test_lock_timeout_is_measured(m):
    lock = m.Lock()
    lock.acquire()
    t0 = time.monotonic()
    assert lock.acquire(timeout=0.2) is False
    assert 0.15 <= time.monotonic() - t0 < 5
    lock.release()


def test_lock_released_by_another_thread_wakes_waiter(m):
    lock = m.Lock()
    lock.acquire()
    got = []
    t = threading.Thread(target=lambda: got.append(lock.acquire(timeout=10)))
    t.start()
    time.sleep(0.1)
    assert got == []
    lock.release()
    t.join(10)
    assert got == [True]
    lock.release()


def test_blocking_call_does_not_stall_other_threads(m):
    lock, ev = m.Lock(), m.Event()
    lock.acquire()
    t = threading.Thread(target=lambda: ev.wait(5))
    t.start()
    t0 = time.monotonic()
    for _ in range(50):
        assert lock.acquire(False) is False  # served while the other thread blocks
    assert time.monotonic() - t0 < 4
    ev.set()
    t.join(10)
    lock.release()


def test_rlock(m):
    r = m.RLock()
    assert r.acquire() and r.acquire()
    r.release()
    errors = []

    def other():
        try:
            assert r.acquire(timeout=0.05) is False
            r.release()
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert len(errors) == 1  # another thread cannot release it
    r.release()
    with pytest.raises(RuntimeError):
        r.release()


def test_semaphores(m):
    s = m.Semaphore(2)
    assert s.acquire() and s.acquire()
    assert s.acquire(timeout=0.05) is False
    s.release()
    s.release()
    s.release()  # a plain Semaphore may go above its initial value
    b = m.BoundedSemaphore(1)
    b.acquire()
    b.release()
    with pytest.raises(ValueError):
        b.release()
    with pytest.raises(ValueError):
        m.Semaphore(-1)


def test_event(m):
    e = m.Event()
    assert e.is_set() is False
    assert e.wait(0.05) is False
    assert e.wait(-1) is False  # a negative timeout does not wait
    threading.Timer(0.1, e.set).start()
    assert e.wait(10) is True
    assert e.is_set() is True
    e.clear()
    assert e.is_set() is False


def test_event_wakes_every_waiter(m):
    e = m.Event()
    results = []
    ts = [threading.Thread(target=lambda: results.append(e.wait(10))) for _ in range(4)]
    for t in ts:
        t.start()
    time.sleep(0.1)
    e.set()
    for t in ts:
        t.join(10)
    assert results == [True] * 4


@pytest.mark.parametrize("code,init,after_add", [
    ("i", 5, 8), ("b", 127, -126), ("B", 255, 2), ("q", 2**40, 2**40 + 3), ("d", 1.5, 4.5),
    (ctypes.c_size_t, 0, 3), (ctypes.c_double, 0.0, 3.0), (ctypes.c_int, -1, 2),
])
def test_value_numeric(m, code, init, after_add):
    v = m.Value(code, init)
    assert v.value == init
    assert v.add(3) == after_add  # integers wrap like C
    v.value = 7
    assert v.get() == 7
    assert v.compare_and_set(7, 9) is True
    assert v.compare_and_set(7, 10) is False
    assert v.value == 9


def test_value_errors(m):
    v = m.Value("b", 0)
    with pytest.raises(ValueError):
        v.value = 1000  # out of range for a signed byte
    with pytest.raises(TypeError):
        v.value = "x"
    with pytest.raises(TypeError):
        v.add(0.5)
    f = m.Value("f", 0.1)
    assert abs(f.value - 0.1) < 1e-6 and f.value != 0.1  # stored as float32
    b = m.Value("?", False)
    b.value = True
    assert b.value is True


def test_value_objects(m):
    o = m.Value("O", {"a": [1, 2]})
    assert o.value == {"a": [1, 2]}
    o.value = ("x", np.arange(3))
    got = o.value
    assert got[0] == "x" and list(got[1]) == [0, 1, 2]
    u = m.Value("u", "z")  # typecodes the daemon does not compute with are pickled
    assert u.value == "z"
    c = m.Value("c", b"a")
    assert c.value == b"a"


def test_queue(m):
    q = m.Queue()
    for i in range(5):
        q.put(i)
    assert q.qsize() == 5 and not q.empty() and not q.full()
    assert [q.get() for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(ValueError):
        q.get(timeout=-1)


def test_bounded_queue(m):
    q = m.Queue(maxsize=2)
    q.put("a")
    q.put_nowait("b")
    assert q.full()
    with pytest.raises(queue.Full):
        q.put_nowait("c")
    with pytest.raises(queue.Full):
        q.put("c", timeout=0.05)
    threading.Timer(0.1, q.get).start()
    q.put("c", timeout=10)  # room is made by the getter
    assert [q.get(), q.get()] == ["b", "c"]


def test_queue_get_woken_by_put(m):
    q = m.Queue()
    threading.Timer(0.1, lambda: q.put("hi")).start()
    assert q.get(timeout=10) == "hi"


@pytest.mark.parametrize("size", [8, 64 << 10, 1 << 20])
def test_queue_numpy_items(m, size):
    q = m.Queue()
    a = np.arange(size // 8, dtype=np.int64)
    q.put(a)
    b = q.get(timeout=10)
    assert b.dtype == a.dtype and np.array_equal(a, b)


def test_too_large_item(m):
    q = m.Queue()
    with pytest.raises(syncmgr.FrameTooLargeError):
        q.put(b"x" * (65 << 20))
    q.put("still usable")
    assert q.get() == "still usable"


def test_named_objects_are_get_or_create(m, daemon):
    a = m.Lock(name="shared-lock")
    b = syncmgr.connect(daemon.address, daemon.key).Lock(name="shared-lock")
    a.acquire()
    assert b.acquire(False) is False
    a.release()
    with pytest.raises(syncmgr.KindMismatchError):
        m.Event(name="shared-lock")
    assert m.delete("shared-lock") is True
    with pytest.raises(syncmgr.NoSuchObjectError):
        a.acquire(False)


@pytest.mark.parametrize("bad", ["a/b", "..", "nul\x00", "x" * 10_000, "anon-lock-1", ""])
def test_bad_names(m, bad):
    with pytest.raises(ValueError):
        m.Lock(name=bad)


def test_anonymous_objects_do_not_leak(m):
    import gc

    gc.collect()
    before = object_count(m)
    for _ in range(300):
        lk = m.Lock()
        lk.acquire()
        lk.release()
        del lk
    gc.collect()
    m.status()  # flushes the queued decrefs
    assert wait_until(lambda: object_count(m) <= before + 1, timeout=5)


def test_status_lists_objects(m):
    m.Event(name="status-ev").set()
    st = m.status()
    names = {o["name"]: o for o in st["objects"]}
    assert names["status-ev"]["state"] == "set"
    assert st["server"]["sessions"] >= 1


def test_large_items_from_many_threads_arrive_intact(m):
    q = m.Queue()
    errors = []

    def worker(seed):
        try:
            for i in range(20):
                a = np.full(300_000 // 8, seed * 1000 + i, dtype=np.int64)
                q.put(a)
                b = q.get(timeout=30)
                assert b.shape == a.shape and len(set(b[::997].tolist())) == 1
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors


def test_replies_of_every_size_on_a_new_connection(m, daemon):
    """A connection's receive buffer starts small and grows once: replies
    under its first size, over it (the first of which grows it, with the
    bytes read ahead of it kept), and over its full size (read into a
    buffer of their own) come whole and in order on one new connection,
    one at a time and sent back to back."""
    from syncmgr import _conn, _connection
    from syncmgr._containers import canonical_key
    from syncmgr._framing import encode_request
    from syncmgr._values import loads

    sizes = [10, 20_000, 100, 200_000, 300_000, 50, 250_000, 70_000, 3]
    d = m.dict()
    for i, n in enumerate(sizes):
        d[i] = bytes([i]) * n
    conn = _conn.Connection(daemon.address, daemon.key, _connection._session_id)
    try:
        assert len(conn._rbuf) < 20_000  # (small at first)

        def get(rid: int, i: int) -> list:
            return encode_request(rid, "get", {"kind": "dict", "name": d.name, "key": canonical_key(i)})

        for rid, i in enumerate(range(len(sizes)), 1):
            conn.send_requests([get(rid, i)])
            got, err, result = conn.recv_reply()
            assert (got, err) == (rid, None) and loads(result) == bytes([i]) * sizes[i]
        fresh = _conn.Connection(daemon.address, daemon.key, _connection._session_id)
        try:
            fresh.send_requests([get(100 + i, i) for i in range(len(sizes))])  # replies read ahead of each other
            for i, n in enumerate(sizes):
                got, err, result = fresh.recv_reply()
                assert (got, err) == (100 + i, None) and loads(result) == bytes([i]) * n
        finally:
            fresh.close()
    finally:
        conn.close()
