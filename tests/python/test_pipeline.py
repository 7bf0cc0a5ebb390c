"""Manager.pipeline(): proxy calls sent back to back and answered together,
against the real daemon. The whole suite runs with the fast path on and off;
a pipeline's calls are requests either way."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import syncmgr
from conftest import start_daemon, start_daemon_proc, wait_until
from syncmgr import _fast


def test_results_come_back_in_order_across_families(m):
    q, v, ev, lock, d = m.Queue(), m.Value("i", 5), m.Event(), m.Lock(), m.dict()
    p = m.pipeline()
    assert p(q).put(1) == 0
    p(q).put_many([2, 3])
    p(v).get()
    p(ev).is_set()
    p(lock).acquire()
    p(d).__setitem__("k", [9])
    p(d).get("k")
    assert p(q).get_many(10) == 7
    assert len(p) == 8
    assert p.execute() == [None, None, 5, False, True, None, [9], [1, 2, 3]]
    assert len(p) == 0  # emptied: the next execute sends nothing again
    assert p.execute() == []
    # The lock was taken in this process's name, and the proxy remembers it:
    assert lock.acquire(False) is False
    lock.release()
    assert lock.acquire(False) is True
    lock.release()


def test_one_round_trip_for_the_lot(m):
    q, v = m.Queue(), m.Value("i", 1)
    client = m._c()
    sent = []
    real = client.call_many

    def counting(reqs, *rest):
        sent.append([r.op for r in reqs])
        return real(reqs, *rest)

    client.call_many = counting  # type: ignore[method-assign]
    try:
        p = m.pipeline()
        for i in range(20):
            p(q).put(i)
        p(v).add(2)
        p(q).qsize()
        out = p.execute()
    finally:
        del client.call_many
    assert sent == [["put"] * 20 + ["add", "qsize"]]
    assert out[-2:] == [3, 20]
    assert q.get_many(100) == list(range(20))


def test_a_parked_get_is_answered_after_the_put_behind_it(m):
    # The daemon answers the put first; the replies are matched by id.
    q = m.Queue()
    p = m.pipeline()
    p(q).get(timeout=10)
    p(q).put("late")
    t0 = time.monotonic()
    assert p.execute() == ["late", None]
    assert time.monotonic() - t0 < 5


def test_errors_come_after_every_call_has_run(m):
    q, v = m.Queue(), m.Value("i", 0)
    p = m.pipeline()
    p(q).get_nowait()
    p(v).set(7)
    with pytest.raises(syncmgr.Empty):
        p.execute()
    assert v.get() == 7  # the call after the failed one ran
    p(q).get_nowait()
    p(v).get()
    out = p.execute(raise_on_error=False)
    assert isinstance(out[0], syncmgr.Empty) and out[1] == 7


def test_bad_input_is_refused_with_nothing_sent(m):
    q = m.Queue()
    p = m.pipeline()
    p(q).put("first")
    p(q).put(lambda: None)  # does not pickle
    with pytest.raises(Exception, match="pickle"):
        p.execute()
    assert q.qsize() == 0
    assert len(p) == 0


def test_a_request_over_the_frame_limit_is_refused_with_nothing_sent(m):
    q = m.Queue()
    limit = m._c().max_frame
    p = m.pipeline()
    p(q).put(b"x" * (limit + 1))
    with pytest.raises(syncmgr.FrameTooLargeError):
        p.execute()
    assert q.qsize() == 0


def test_requests_over_a_socket_buffer_are_refused_with_nothing_sent(m):
    # The client sends them all before it reads a reply, and the daemon
    # stops reading a connection whose replies wait: with more than a
    # socket buffer outstanding the two would wait on each other.
    q, big = m.Queue(), m.Queue()
    big.put(b"r" * (4 << 20))
    p = m.pipeline()
    p(q).put("first")
    p(big).get()
    p(q).put(b"x" * syncmgr.Pipeline.MAX_BYTES)
    with pytest.raises(ValueError, match="MAX_BYTES"):
        p.execute()
    assert q.qsize() == 0 and big.qsize() == 1
    p(q).put(b"x" * (4 << 20))  # one call alone may be of any size
    assert p.execute() == [None]
    assert len(q.get(timeout=5)) == 4 << 20


def test_a_put_many_that_cannot_fit_stores_nothing(m):
    q = m.Queue(maxsize=3)
    p = m.pipeline()
    p(q).put_many([1, 2], timeout=0.1)
    p(q).put_many([3, 4], timeout=0.1)  # only one more fits: all or nothing
    out = p.execute(raise_on_error=False)
    assert out[0] is None and isinstance(out[1], syncmgr.Full)
    assert q.get_many(10) == [1, 2]


def test_what_it_takes_and_what_it_refuses(m, daemon):
    p = m.pipeline()
    with pytest.raises(TypeError):
        p(object())
    other = syncmgr.Manager()
    try:
        with pytest.raises(ValueError, match="one daemon"):
            p(other.Queue())
    finally:
        other.shutdown()
    q = m.Queue()
    with pytest.raises(AttributeError):
        p(q)._call_blocking("get", 0.0)
    with pytest.raises(AttributeError):
        p(q).no_such_method()
    with pytest.raises(AttributeError):
        p(m.Lock()).__enter__()  # item access is recorded (__getitem__...), other special methods are not
    with m.pipeline() as p2:
        p2(q).put("dropped")
    assert q.qsize() == 0  # leaving the with block drops what was not executed


_CHILD = textwrap.dedent("""
    import sys, syncmgr
    m = syncmgr.connect()
    tag = sys.argv[1]
    q, held, full = m.Queue(name=tag + "-q"), m.Lock(name=tag + "-held"), m.Queue(name=tag + "-full")
    p = m.pipeline()
    p(full).get(timeout=30)      # answered at once: two items this process then holds
    p(full).get(timeout=30)
    p(held).acquire(timeout=30)  # waits: the parent holds it
    p(q).get(timeout=30)         # waits: empty
    print("ready", flush=True)
    try:
        p.execute()
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    print(full.qsize(), held.acquire(False), flush=True)
""")


def test_ctrl_c_gives_back_what_the_calls_got(m, daemon):
    tag = f"plint-{os.getpid()}"
    q, held, full = m.Queue(name=tag + "-q"), m.Lock(name=tag + "-held"), m.Queue(name=tag + "-full")
    full.put("kept-1")
    full.put("kept-2")
    held.acquire()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, tag], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=daemon.env)
    try:
        assert child.stdout.readline().strip() == b"ready"
        assert wait_until(lambda: full.qsize() == 0, 10)  # the pipeline's first gets took the items
        time.sleep(0.3)  # the other two wait on the daemon
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline().strip() == b"interrupted"
        # The item went back, and the lock was not taken in the child's name.
        assert child.stdout.readline().split() == [b"2", b"False"]
        assert child.wait(30) == 0, child.stderr.read().decode()
    finally:
        if child.poll() is None:
            child.kill()
    held.release()
    q.put("after")
    assert q.get(timeout=5) == "after"
    assert full.get_many(10) == ["kept-1", "kept-2"]  # back at the head, in their order


def _pipelined_waits(address, key, tag):
    m = syncmgr.connect(address, key)
    p = m.pipeline()
    p(m.Queue(name=tag + "-q")).get(timeout=60)
    p(m.Lock(name=tag + "-held")).acquire(timeout=60)
    p.execute()


def test_a_killed_process_with_calls_in_flight_takes_nothing(m, daemon):
    tag = f"plkill-{os.getpid()}"
    q, held = m.Queue(name=tag + "-q"), m.Lock(name=tag + "-held")
    held.acquire()
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=_pipelined_waits, args=(daemon.address, daemon.key, tag))
    child.start()
    def waiters():
        return {o["name"]: o["waiters"] for o in m.status()["objects"] if o["name"].startswith(tag)}

    try:
        # Both calls of the one pipeline wait on the daemon at once.
        assert wait_until(lambda: waiters() == {tag + "-q": 1, tag + "-held": 1}, 30), waiters()
        assert child.is_alive()
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    finally:
        if child.is_alive():
            child.kill()
    q.put("precious")
    held.release()
    assert q.get(timeout=5) == "precious"  # the killed get did not swallow it
    assert held.acquire(timeout=5)  # nor did the killed acquire keep the lock
    held.release()


def test_threads_each_with_a_pipeline(m):
    q = m.Queue()
    errors = []

    def work(k):
        try:
            p = m.pipeline()
            for i in range(50):
                p(q).put((k, i))
            p.execute()
        except Exception as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not errors
    got = q.get_many(1000)
    assert len(got) == 200
    for k in range(4):  # each thread's puts keep their order
        assert [i for kk, i in got if kk == k] == list(range(50))


def test_named_objects_lost_in_a_restart_are_made_again():
    d = start_daemon()
    try:
        m = syncmgr.connect(d.address, d.key)
        q, v = m.Queue(name="plr-q"), m.Value("i", 7, name="plr-v")
        q.put("before")
        d.kill()
        start_daemon_proc(d)
        p = m.pipeline()
        p(q).put("after")
        p(v).get()
        p(q).qsize()
        # Each call met "no such object" and made its object again (empty,
        # with its parameters) before it ran, as a call alone does.
        assert p.execute() == [None, 7, 1]
        if _fast.enabled_by_env():  # back on the fast path of the new run, as after a call alone
            assert _fast.active(q) and _fast.active(v)
        assert q.get(timeout=5) == "after"
    finally:
        d.close()


def test_an_anonymous_object_first_used_in_a_pipeline_keeps_its_reference():
    import gc
    import pickle

    d = start_daemon("--share-grace", "200ms")
    try:
        m = syncmgr.connect(d.address, d.key)
        q = m.Queue()
        q2 = pickle.loads(pickle.dumps(q))  # as a task gets it: no reference until first used
        p = m.pipeline()
        p(q2).put("x")
        p(q2).qsize()
        assert p.execute() == [None, 1]
        del q, p
        for _ in range(3):  # past the share grace, every queued decref sent
            gc.collect()
            m.status()
            time.sleep(0.3)
        assert q2.get(timeout=5) == "x"  # still there: q2 holds its reference
    finally:
        d.close()


def test_when_a_call_fails_what_the_others_got_is_given_back(m):
    q, lock, d = m.Queue(), m.Lock(), m.dict()
    q.put("a")
    q.put("b")
    p = m.pipeline()
    p(q).get()
    p(q).get()
    p(lock).acquire()
    p(q).put("c")  # a put stays stored
    p(d).__getitem__("missing")
    with pytest.raises(KeyError):
        p.execute()
    assert q.get_many(10) == ["a", "b", "c"]  # back at the head, in their order
    assert lock.acquire(False) is True  # not held in this process's name
    lock.release()


def test_methods_of_two_requests_are_refused_when_recorded(m):
    lst, cond, bar, d = m.list([3, 1, 2]), m.Condition(), m.Barrier(2), m.dict(k="v")
    p = m.pipeline()
    for call in (lambda: p(lst).sort(), lambda: p(lst).reverse(), lambda: p(lst).__setitem__(slice(0, 2), [9]),
                 lambda: p(lst).__delitem__(slice(0, 1)), lambda: p(cond).wait(1), lambda: p(cond).wait_for(bool),
                 lambda: p(bar).wait(1), lambda: p(lst).pop(), lambda: p(d).pop("k"), lambda: p(d).popitem()):
        with pytest.raises(ValueError, match="cannot go in a pipeline"):
            call()
    assert len(p) == 0
    p(lst).__setitem__(0, 7)  # an int index is one request
    p(lst).__delitem__(1)
    p(lst).__getitem__(slice(0, 5))
    assert p.execute() == [None, None, [7, 2]]


def test_a_generator_argument_is_read_once(m):
    q, lst = m.Queue(), m.list()
    p = m.pipeline()
    p(q).put_many(x for x in range(3))
    p(lst).extend(str(x) for x in range(2))
    assert p.execute() == [None, None]
    assert q.get_many(10) == [0, 1, 2]
    assert list(lst) == ["0", "1"]


def _slow_record() -> bytes:
    """A stored item whose unpickling sleeps 3 s (time.sleep(3))."""
    import pickle

    class Slow:
        def __reduce__(self):
            return (time.sleep, (3,))

    return pickle.dumps(Slow(), protocol=5)


_CHILD_REPLAY = textwrap.dedent("""
    import sys, syncmgr

    m = syncmgr.connect()
    q = m.Queue(name=sys.argv[1])
    p = m.pipeline()
    for _ in range(4):
        p(q).get(timeout=10)
    print("ready", flush=True)
    try:
        p.execute()  # the second item takes 3 s to decode: Ctrl-C lands there
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


def test_ctrl_c_while_replaying_gives_back_the_other_calls_items_in_order(m, daemon):
    tag = f"plreplay-{os.getpid()}"
    q = m.Queue(name=tag)
    q.put("one")
    q._call_blocking("put", 0.0, blob_key="item", blob=_slow_record(), block=False, timeout=0.0)
    q.put("three")
    q.put("four")
    child = subprocess.Popen([sys.executable, "-c", _CHILD_REPLAY, tag], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=daemon.env)
    try:
        assert child.stdout.readline().strip() == b"ready"
        assert wait_until(lambda: q.qsize() == 0, 10)  # all four taken: now replaying
        q.put("after")
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline().strip() == b"interrupted"
        assert child.wait(30) == 0, child.stderr.read().decode()
    finally:
        if child.poll() is None:
            child.kill()
    # The calls that were not being replayed gave their items back at the
    # head, in their order; the one being decoded when Ctrl-C came is lost
    # with it, as a get made alone would be.
    assert q.get_many(10) == ["one", "three", "four", "after"]


@pytest.mark.parametrize("where", ["get_nowait", "acquire"])
def test_ctrl_c_before_a_replayed_call_took_its_answer_gives_it_back(m, monkeypatch, where):
    """Ctrl-C at the start of a call's replay, before it took its answer:
    nothing has that grant but the reply, so it is given back with the
    others'."""
    from syncmgr import _pipeline, _proxies

    q, lock = m.Queue(), m.Lock()
    q.put("a")
    q.put("b")
    cls = _proxies.QueueProxy if where == "get_nowait" else _proxies.AcquirerProxy
    orig = getattr(cls, where)

    def interrupted(self, *args, **kwargs):
        if isinstance(self.__dict__.get("_client"), _pipeline._Replay):
            raise KeyboardInterrupt
        return orig(self, *args, **kwargs)

    monkeypatch.setattr(cls, where, interrupted)
    p = m.pipeline()
    p(q).get_nowait()
    p(lock).acquire(timeout=1)
    with pytest.raises(KeyboardInterrupt):
        p.execute()
    monkeypatch.undo()
    assert q.get_many(10) == ["a", "b"]
    assert lock.acquire(False) is True
    lock.release()
