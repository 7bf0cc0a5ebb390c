"""One round trip to make a fast-path object, and none to unpickle a proxy
this process has seen before (the words it was told of are kept per daemon
run, checked against the word's tag on every use)."""

from __future__ import annotations

import os
import pickle

import pytest

from conftest import Counting
from syncmgr import _fast

FAST = os.environ.get("SYNCMGR_FASTPATH", "1") != "0" and _fast._ext is not None
pytestmark = pytest.mark.skipif(not FAST, reason="fast path not built or disabled")


@pytest.mark.parametrize("factory", ["Lock", "RLock", "Event", "Semaphore", "Condition"])
def test_creating_a_fast_path_object_is_one_request(m, factory):
    getattr(m, factory)()  # the process's fast path is attached by now
    client = m._c()
    with Counting(client) as c:
        obj = getattr(m, factory)(name=f"one-trip-{factory}")
    assert _fast.active(obj)
    assert c.ops == ["create"]


def test_creating_a_value_is_one_request(m):
    m.Value("i", 0)
    with Counting(m._c()) as c:
        v = m.Value("i", 5, name="one-trip-value")
    assert _fast.active(v) and v.value == 5
    assert c.ops == ["create"]


def test_unpickling_a_seen_proxy_takes_no_round_trip(m):
    lock = m.Lock(name="seen-lock")
    blob = pickle.dumps(lock)
    with Counting(m._c()) as c:
        again = pickle.loads(blob)
        assert _fast.active(again)
        assert again.acquire(timeout=5)
        again.release()
    assert c.ops == []


def test_a_name_made_again_is_never_taken_for_the_old_one(m):
    """A cached word is used only while it carries the same tag: after a
    delete and a create of the same name the proxy asks again, and acts on
    the new object."""
    lock = m.Lock(name="remade-lock")
    blob = pickle.dumps(lock)
    assert m.delete("remade-lock")
    filler = [m.Lock() for _ in range(4)]  # the old word may be reused by another object
    # Made again as another process would (this process is not told of it).
    m._c().call("create", {"kind": "lock", "name": "remade-lock"})
    with Counting(m._c()) as c:
        p = pickle.loads(blob)
        assert _fast.active(p)  # (its first fast op attaches it)
    assert c.ops == ["fastpath_ref"]
    new = m.Lock(name="remade-lock")
    assert p.acquire(timeout=5)
    assert not new.acquire(timeout=0.05)  # the same object: held by p
    p.release()
    assert new.acquire(timeout=5)
    new.release()
    del filler


def test_a_created_proxy_is_pending_until_its_first_op_and_keeps_its_word(m):
    """A fast-path create's proxy is made as its pending class with the
    word on it; its first op attaches it with no further request, and it
    is its own class again."""
    from syncmgr._proxies import LockProxy

    m.Lock()
    lock = m.Lock(name="pending-lock")
    assert type(lock) is not LockProxy and _fast.proxy_type(lock) is LockProxy
    off, tag, run = lock._fp_hint
    assert run == _fast._paths[id(m._c())].run_id and isinstance(off, int) and isinstance(tag, int)
    with Counting(m._c()) as c:
        assert lock.acquire(timeout=5)
    lock.release()
    assert c.ops == [] and type(lock) is LockProxy and "_fp_hint" not in lock.__dict__


def test_a_create_reply_word_of_another_run_is_never_used(m):
    """A create reply whose word names another daemon run than the mapped
    segment's is not kept: the proxy asks for its word at its first op,
    and acts on its own object."""
    m.Lock()
    client = m._c()
    inner = client.call

    def call(op, *a, **k):
        res = inner(op, *a, **k)
        if op == "create":
            res["fp"][2] = "another-run"
        return res

    client.call = call
    try:
        lock = m.Lock(name="other-run-word")
    finally:
        del client.call
    assert "_fp_hint" not in vars(lock)
    with Counting(client) as c:
        assert lock.acquire(timeout=5)
    assert c.ops == ["fastpath_ref"] and _fast.active(lock)
    assert not m.Lock(name="other-run-word").acquire(timeout=0.05)  # held by lock: the same object
    lock.release()


def test_a_proxy_attaches_at_its_first_fast_op(m, monkeypatch):
    """A Queue made or unpickled in this process and not used maps no ring
    (no queue_attach); a pending proxy pickles as its own class; its first
    op attaches it, and the proxy's class is its own again."""
    from syncmgr._fast import ring as ring_mod
    from syncmgr._proxies import QueueProxy

    m.Lock().acquire()  # the process's segment is mapped by now
    opened: list[str] = []
    real = ring_mod.open_ring
    monkeypatch.setattr(ring_mod, "open_ring", lambda fp, kind, name: opened.append(name) or real(fp, kind, name))
    q = m.Queue(name="lazy-q")
    again = pickle.loads(pickle.dumps(q))
    assert opened == [] and "_fast" not in q.__dict__ and "_fast" not in again.__dict__
    assert isinstance(q, QueueProxy) and type(again).__name__ == "QueueProxy"
    assert _fast.proxy_type(q) is QueueProxy and type(q) is not QueueProxy  # pending
    q.put(1)
    assert opened == ["lazy-q"] and type(q) is QueueProxy and _fast.active(q)
    assert again.get(timeout=5) == 1 and opened == ["lazy-q", "lazy-q"]


def test_a_method_taken_before_the_first_op_is_the_handles(m):
    """``acquire = lock.acquire`` before any call (a hot loop's habit) gets
    the handle's method, the C call for a Lock, not one that would look the
    handle up again on every call."""
    lock, q = m.Lock(), m.Queue()
    acquire, put = lock.acquire, q.put
    assert type(acquire).__name__ == "builtin_function_or_method", acquire
    assert put.__self__ is _fast.handle(q), put
    assert acquire(timeout=5)
    lock.release()
    put(1)
    assert q.get(timeout=5) == 1


def test_first_ops_from_threads_at_once(m):
    """Threads whose first ops on one pending proxy race: each op is served
    (one that finds the class set back before the handle is in goes over
    the socket), and the proxy ends on the fast path."""
    import threading

    lock, total = m.Lock(), [0]
    start = threading.Barrier(8)

    def work() -> None:
        start.wait()
        for _ in range(200):
            with lock:
                total[0] += 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert total[0] == 1600 and _fast.active(lock)


def test_a_forked_child_attaches_a_proxy_its_parent_never_used(m):
    """A child forked while the parent's proxy is still pending attaches it
    on its own session at its first op, as it moves a handle it inherited."""
    import multiprocessing as mp

    ev = m.Event()
    ctx = mp.get_context("fork")
    out = ctx.Queue()

    def child() -> None:
        ev.set()
        out.put(_fast.active(ev))

    p = ctx.Process(target=child)
    p.start()
    assert out.get(timeout=30) is True
    p.join(30)
    assert p.exitcode == 0 and ev.wait(5) and _fast.active(ev)


def test_a_fresh_process_takes_no_round_trip_for_a_pickled_proxys_word(m, daemon):
    """A proxy pickled by a process that knows its object's word carries
    it: a fresh process on this host that unpickles it asks nothing for the
    word (no fastpath_ref, and no pool connection for one), and its first
    op acts on the very object."""
    import subprocess
    import sys
    import textwrap

    m.Lock()  # the process's segment is mapped: the next create's reply carries its word
    lock = m.Lock(name="pickled-word-lock")
    blob = pickle.dumps(lock)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import pickle, sys
        from syncmgr import _connection, _fast
        ops = []
        real = _connection.Client.call
        def call(self, op, *a, **k):
            ops.append(op)
            return real(self, op, *a, **k)
        _connection.Client.call = call
        lock = pickle.loads(bytes.fromhex(sys.argv[1]))
        assert lock.acquire(timeout=5)
        print(_fast.active(lock), ops, flush=True)
        sys.stdin.readline()
        lock.release()
        """), blob.hex()], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=daemon.env, text=True)
    try:
        line = child.stdout.readline()
        assert line.split(maxsplit=1) == ["True", "[]\n"], (line, child.stderr.read() if not line else "")
        assert not lock.acquire(timeout=0.05)  # the child's hold, on this object
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(30) == 0, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert lock.acquire(timeout=5)
    lock.release()
    # A process with the fast path off ignores the word and uses the socket.
    off = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import pickle, sys
        from syncmgr import _fast
        lock = pickle.loads(bytes.fromhex(sys.argv[1]))
        assert lock.acquire(timeout=5)
        lock.release()
        print(_fast.active(lock))
        """), blob.hex()], capture_output=True, text=True, env={**daemon.env, "SYNCMGR_FASTPATH": "0"}, timeout=60)
    assert (off.returncode, off.stdout.strip()) == (0, "False"), off.stderr


@pytest.mark.parametrize("bad", ["off_outside", "off_negative", "run", "malformed", "stale"])
def test_a_pickled_word_that_is_wrong_is_never_used(m, bad):
    """The word a pickle carries is checked as a create's is: an offset
    outside the segment, another daemon run's, a malformed one, or the word
    of an object since deleted and made again under its name (another
    generation: another tag) is not used, and the proxy's first op asks
    for the word and acts on its own object."""
    m.Lock()
    name = f"bad-word-{bad}"
    lock = m.Lock(name=name)
    fn, args = lock.__reduce__()
    assert len(args) == 7, "the word travels in the pickle"
    off, tag, run = args[6]
    word = {"off_outside": (1 << 40, tag, run), "off_negative": (-64, tag, run), "run": (off, tag, "another-run"),
            "malformed": ("x", None), "stale": (off, tag, run)}[bad]
    if bad == "stale":
        assert m.delete(name)
        filler = [m.Lock() for _ in range(4)]  # the old word may be another object's now
        lock = m.Lock(name=name)
    fp = _fast.path_for(m._c())
    fp.refs.clear()  # as in a process that has not seen the object
    with Counting(m._c()) as c:
        p = fn(*args[:6], word)
        assert _fast.active(p)
        assert p.acquire(timeout=5)
    assert c.ops == ["fastpath_ref"]
    assert not lock.acquire(timeout=0.05)  # p holds this very object
    p.release()
    assert lock.acquire(timeout=5)
    lock.release()
    if bad == "stale":
        assert all(f.acquire(timeout=5) for f in filler)  # and none of the others
