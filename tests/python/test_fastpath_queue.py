"""Queues and JoinableQueues on the same-host fast path against the real
daemon: items (and task counts) in the daemon's shared ring, put, got,
task_done and join without a round trip; stock queue.Queue semantics; fast
and socket clients on one FIFO, also while the daemon holds the overflow of
a full ring; processes SIGKILLed at each labelled step of put, get and
task_done (the extension's test hook) never wedge the queue, never double
an item, lose at most the one a killed consumer had got and leave the
unfinished count right; Ctrl-C in a blocked get or join takes nothing; bad
input stores nothing; a scribbled ring is an error, not a crash."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import pickle
import queue
import random
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import syncmgr
from conftest import start_daemon, wait_until
from syncmgr import _fast

pytestmark = pytest.mark.skipif(_fast._ext is None or os.environ.get("SYNCMGR_FASTPATH") == "0",
                                reason="fast path not built or disabled")
CTX = mp.get_context("fork")
# Kill-loop length: a bounded run by default; SYNCMGR_QUEUE_KILLS=1000 for the long one.
KILLS = int(os.environ.get("SYNCMGR_QUEUE_KILLS", "9"))  # x 12 tests: 108 kills


@pytest.fixture(autouse=True)
def fastpath_on(monkeypatch):
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")


def run_py(daemon, code: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                            env={**daemon.env, "SYNCMGR_FASTPATH": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def state(m, name: str) -> dict:
    for o in m.status()["objects"]:
        if o["name"] == name:
            return o
    raise KeyError(name)


def test_queue_is_on_the_ring(m):
    q = m.Queue()
    assert _fast.active(q), _fast.reasons
    assert "_fast" in q.__dict__ and q.__dict__["_fast"].ring is not None
    jq = m.JoinableQueue()
    assert _fast.active(jq), _fast.reasons  # its task counts are in the ring too
    assert "task_done" in jq.__dict__ and "join" in jq.__dict__
    assert "task_done" not in q.__dict__


def test_stock_queue_semantics(m):
    q = m.Queue(maxsize=3, name="fpq-stock")
    assert _fast.active(q)
    assert q.empty() and not q.full() and q.qsize() == 0
    items = [0, -1, 2**63 - 1, 1.5, "text", b"bytes", None, True, [1, 2], {"a": 1}, (1, 2), {1, 2}]
    got = []
    for x in items:
        q.put(x)
        got.append(q.get())
    assert got == items and [type(x) for x in got] == [type(x) for x in items]
    q.put(1)
    q.put_nowait(2)
    q.put(3, timeout=0.01)
    assert q.full() and q.qsize() == 3 and not q.empty()
    with pytest.raises(queue.Full):
        q.put_nowait(4)
    with pytest.raises(queue.Full):
        q.put(4, block=False)
    t0 = time.monotonic()
    with pytest.raises(queue.Full):
        q.put(4, timeout=0.1)
    assert time.monotonic() - t0 >= 0.09
    assert [q.get(), q.get_nowait(), q.get(timeout=1)] == [1, 2, 3]
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(block=False)
    t0 = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.1)
    assert time.monotonic() - t0 >= 0.09
    assert state(m, "fpq-stock")["waiters"] == 0


def test_blocked_get_is_woken_by_a_put_from_another_process(m):
    q = m.Queue(name="fpq-wake")
    got = []
    t = threading.Thread(target=lambda: got.append(q.get(timeout=30)))
    t.start()
    assert wait_until(lambda: state(m, "fpq-wake")["waiters"] == 1)
    p = CTX.Process(target=q.put, args=("hello",))
    p.start()
    p.join(30)
    t.join(30)
    assert got == ["hello"]
    assert state(m, "fpq-wake")["waiters"] == 0


def test_put_many_get_many(m):
    q = m.Queue(name="fpq-batch")
    q.put_many(range(200))
    assert q.qsize() == 200
    a = q.get_many(64)
    b = q.get_many(max_items=1000, timeout=1)
    assert a + b == list(range(200)) and len(a) == 64
    with pytest.raises(queue.Empty):
        q.get_many(10, timeout=0.05)
    small = m.Queue(maxsize=5)
    small.put_many(range(3))
    with pytest.raises(queue.Full):  # room for 2 of 3: none goes in
        small.put_many(range(3, 6), timeout=0.05)
    with pytest.raises(queue.Full):
        small.put_many(range(3, 6), block=False)
    assert small.qsize() == 3
    with pytest.raises(ValueError, match="can never fit a queue of maxsize 5"):
        small.put_many(range(6), timeout=0.05)
    small.put_many([3, 4])
    assert small.get_many(100) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("count, err", [(0, ValueError), (-3, ValueError), (1.5, TypeError), ("2", TypeError),
                                        (True, TypeError)])
def test_get_many_bad_count(m, count, err):
    q = m.Queue()
    q.put(1)
    with pytest.raises(err):
        q.get_many(count)
    assert q.qsize() == 1 and q.get_nowait() == 1


@pytest.mark.parametrize("timeout", [-1, -0.5, math.nan])
def test_bad_timeout_stores_and_takes_nothing(m, timeout):
    q = m.Queue()
    with pytest.raises(ValueError):
        q.put(1, timeout=timeout)
    assert q.qsize() == 0
    q.put(2)
    with pytest.raises(ValueError):
        q.get(timeout=timeout)
    with pytest.raises(ValueError):
        q.get_many(5, timeout=timeout)
    assert q.get_nowait() == 2


class Unpicklable:
    def __reduce__(self):
        raise pickle.PicklingError("no")


def test_unpicklable_item_is_refused_before_anything_is_stored(m):
    q = m.Queue()
    with pytest.raises(pickle.PicklingError):
        q.put(Unpicklable())
    with pytest.raises(pickle.PicklingError):
        q.put_many([1, 2, Unpicklable(), 4])
    assert q.qsize() == 0 and q.empty()


def test_large_items_keep_their_place():
    d = start_daemon("--max-object-bytes", "2000000", "--queue-ring-bytes", "1048576")
    try:
        m = syncmgr.connect(d.address, d.key)
        q = m.Queue(name="fpq-large")
        assert _fast.active(q)
        big = b"x" * 600_000  # over the ring's inline limit: the daemon keeps it
        q.put(1)
        q.put(big)
        q.put(2)
        assert q.qsize() == 3
        assert q.get() == 1 and q.get() == big and q.get() == 2
        with pytest.raises(syncmgr.SyncMgrError, match="max-object-bytes"):
            q.put(b"y" * 3_000_000)  # over the per-object limit: refused, nothing stored
        assert q.qsize() == 0
        # Puts past the ring's room (an unbounded queue) go to the daemon and keep the order.
        n = 1500  # ~1.5 MB: the ring's 1 MiB, the rest counted against the limit
        q.put_many([b"%06d" % i + b"." * 1000 for i in range(n)])
        got = q.get_many(10 * n)
        while len(got) < n:
            got += q.get_many(10 * n, timeout=5)
        assert [g[:6] for g in got] == [b"%06d" % i for i in range(n)]
    finally:
        d.close()


def test_put_many_past_the_rings_room_does_not_wait():
    """Batches that each fit the ring but together overflow it, on a queue
    with no maxsize: each goes to the daemon once the ring is short of
    bytes, as a put does, and none waits (with the wait the test gives,
    one that did would raise Full); the order is kept."""
    d = start_daemon("--queue-ring-bytes", "1048576")
    try:
        m = syncmgr.connect(d.address, d.key)
        q = m.Queue()
        assert _fast.active(q)
        batches = [[b"%02d%04d" % (k, i) + b"." * 1000 for i in range(300)] for k in range(6)]  # ~300 KB each
        for b in batches:
            q.put_many(b, timeout=5)
        assert q.qsize() == 1800
        got: list = []
        while len(got) < 1800:
            got += q.get_many(2000, timeout=5)
        assert got == [x for b in batches for x in b]
    finally:
        d.close()


def _flood(q, n, size, half):
    for i in range(n):
        q.put(b"%08d" % i + b"." * (size - 8))
        if i == n // 2:
            half.set()


def test_overflow_keeps_gets_on_the_ring():
    """A producer that outruns its consumer fills the ring; its later puts go
    to the daemon (behind the items it holds), but the consumer's gets stay
    on the ring: the daemon refills it from what it holds. Counted by the
    daemon's own op counters, not timed."""
    from test_metrics import _endpoint, _get, _value
    d = start_daemon("--metrics", "127.0.0.1:0", "--log-format", "json", "--log-level", "info")
    try:
        m = syncmgr.connect(d.address, d.key)
        q = m.Queue(name="fpq-flood")
        assert _fast.active(q)
        cap = _fast.handle(q).ring.capacity
        size = max(64, cap // 512)
        n = 4 * cap // size  # four rings' worth
        half = CTX.Event()
        p = CTX.Process(target=_flood, args=(q, n, size, half))
        p.start()
        assert half.wait(60)  # two rings' worth put: the ring overflowed
        got = [q.get(timeout=30) for _ in range(n)]
        p.join(60)
        assert p.exitcode == 0
        assert [g[:8] for g in got] == [b"%08d" % i for i in range(n)]  # in order, none lost or doubled
        assert q.empty()
        _, _, text = _get(_endpoint(d) + "/metrics")
        socket_puts = _value(text, 'syncmgr_ops_total{kind="queue",op="put",result="ok"}')
        socket_gets = _value(text, 'syncmgr_ops_total{kind="queue",op="get",result="ok"}')
        print(f"{n} items, {socket_puts:.0f} puts and {socket_gets:.0f} gets through the daemon")
        assert socket_puts > 0, "the ring never overflowed"
        assert socket_gets <= n // 10, f"{socket_gets:.0f} of {n} gets went to the daemon"
        assert _fast.handle(q).ring.word("flags") == 0
    finally:
        d.close()


def test_overflow_keeps_one_fifo_for_fast_and_socket_clients(daemon, m):
    """While the daemon holds the newest items (the ring is full), fast puts
    queue behind them as socket puts do, and fast and socket gets take the
    items in one order."""
    q = m.Queue(name="fpq-over-mixed")
    ring = _fast.handle(q).ring
    size = max(64, ring.capacity // 512)
    n = 3 * ring.capacity // size
    item = lambda i: b"%08d" % i + b"." * (size - 8)  # noqa: E731
    for i in range(n):  # past the ring's room
        q.put(item(i))
    assert ring.word("flags") == 2  # OVER: the daemon holds the newest items, gets stay on the ring
    assert q.qsize() == n and not q.empty() and not q.full()
    socket_put = run_py(daemon, """
        import syncmgr, os
        m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
        q = m.Queue(name="fpq-over-mixed")
        n, size = int(os.environ["N"]), int(os.environ["SIZE"])
        for i in range(n, n + 100):
            q.put(b"%08d" % i + b"." * (size - 8))
    """, SYNCMGR_FASTPATH="0", N=str(n), SIZE=str(size))
    assert socket_put.wait(60) == 0, socket_put.stderr.read()
    for i in range(n + 100, n + 200):
        q.put(item(i))  # fast client: behind the daemon's items
    k = n // 2
    socket_get = run_py(daemon, """
        import syncmgr, os
        m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
        q = m.Queue(name="fpq-over-mixed")
        print(" ".join(q.get(timeout=30)[:8].decode() for _ in range(int(os.environ["K"]))), flush=True)
    """, SYNCMGR_FASTPATH="0", K=str(k))
    out, err = socket_get.communicate(timeout=120)
    assert socket_get.returncode == 0, err
    first = [int(x) for x in out.split()]
    rest = q.get_many(10 * n, timeout=10)
    while len(first) + len(rest) < n + 200:
        rest += q.get_many(10 * n, timeout=10)
    assert first + [int(g[:8]) for g in rest] == list(range(n + 200))
    assert q.empty() and ring.word("flags") == 0


def test_fast_and_socket_clients_share_one_fifo(daemon, m):
    q = m.Queue(maxsize=50, name="fpq-mixed")
    n = 400
    producer = """
        import syncmgr, os
        m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
        q = m.Queue(maxsize=50, name="fpq-mixed")
        from syncmgr import _fast
        print(_fast.active(q), flush=True)
        for i in range({n}):
            q.put(("{who}", i), timeout=60)
    """
    socket_p = run_py(daemon, producer.format(n=n, who="socket"), SYNCMGR_FASTPATH="0")
    fast_p = run_py(daemon, producer.format(n=n, who="fast"))
    got: dict[str, list[int]] = {"socket": [], "fast": []}
    for _ in range(2 * n):
        who, i = q.get(timeout=60)
        got[who].append(i)
    assert socket_p.wait(60) == 0 and fast_p.wait(60) == 0
    assert socket_p.stdout.read().strip() == "False" and fast_p.stdout.read().strip() == "True"
    assert got == {"socket": list(range(n)), "fast": list(range(n))}
    # And the other way round: a socket consumer of fast puts.
    q.put_many(range(30))
    consumer = run_py(daemon, """
        import syncmgr, os
        m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
        q = m.Queue(maxsize=50, name="fpq-mixed")
        print([q.get(timeout=30) for _ in range(30)], flush=True)
    """, SYNCMGR_FASTPATH="0")
    out, err = consumer.communicate(timeout=60)
    assert consumer.returncode == 0, err
    assert out.strip() == str(list(range(30)))
    assert q.empty()


def _killed_producer(q, step, n, batch):
    from syncmgr import _fastpath
    for i in range(n):
        q.put(i)
    _fastpath._set_queue_kill_step(step)
    if batch:
        q.put_many([n])  # dies at the step (or, for a get step, after the put)
        q.get_many(1)  # a get step: dies inside the get
    else:
        q.put(n)
        q.get()
    os._exit(3)  # never reached


PUT_STEPS = (1, 2, 3)
GET_STEPS = (11, 12, 13)


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
@pytest.mark.parametrize("step", PUT_STEPS + GET_STEPS)
def test_killed_mid_op_never_wedges_or_doubles(m, step, batch):
    """A process SIGKILLed at a labelled step of put or get: others go on at
    once (the daemon lets go of its latch when its session ends), a put
    killed before its commit left nothing and after it the whole item, and a
    get killed before its commit left the item at the head."""
    name = f"fpq-kill-{step}-{batch}"
    q = m.Queue(name=name)
    assert _fast.active(q)
    recovery = []
    for k in range(KILLS):
        p = CTX.Process(target=_killed_producer, args=(q, step, 2, batch))
        p.start()
        p.join(60)
        assert p.exitcode == -signal.SIGKILL, p.exitcode
        t0 = time.monotonic()
        got = q.get_many(100, timeout=30)
        waited = time.monotonic() - t0
        assert waited < 10, "the queue stayed wedged"
        committed_put = step == 3 or step in GET_STEPS
        want = [0, 1] + ([2] if committed_put else [])
        if step == 13:
            want = [1, 2]  # the killed get had committed: item 0 went with it
        if step in (11, 12):
            want = [0, 1, 2]  # killed before its commit: the item is still at the head
        assert got == want, (k, got)
        assert q.empty()
        assert state(m, name)["waiters"] == 0
        recovery.append(waited)
    print(f"step {step}: median {statistics.median(recovery) * 1e3:.1f} ms from the death to the next get_many")


def _killed_waiter(q, ready):
    from syncmgr import _fastpath
    _fastpath._set_queue_kill_step(21)
    ready.set()
    q.get(timeout=60)  # dies as it leaves the sleep


def test_killed_sleeper_takes_nothing(m):
    q = m.Queue(name="fpq-kill-sleeper")
    ready = CTX.Event()
    p = CTX.Process(target=_killed_waiter, args=(q, ready))
    p.start()
    assert ready.wait(30)
    assert wait_until(lambda: state(m, "fpq-kill-sleeper")["waiters"] == 1)
    q.put("kept")
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    assert q.get(timeout=5) == "kept"
    # The daemon forgets the dead session's sleeper.
    assert wait_until(lambda: state(m, "fpq-kill-sleeper")["waiters"] == 0)


def test_ctrl_c_in_a_blocked_get_takes_nothing(daemon, m):
    q = m.Queue(name="fpq-sigint")
    p = run_py(daemon, """
        import syncmgr, os, sys
        m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
        q = m.Queue(name="fpq-sigint")
        from syncmgr import _fast
        assert _fast.active(q)
        print("ready", flush=True)
        try:
            q.get()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        import time
        time.sleep(60)
    """)
    assert p.stdout.readline().strip() == "ready"
    assert wait_until(lambda: state(m, "fpq-sigint")["waiters"] == 1)
    os.kill(p.pid, signal.SIGINT)
    assert p.stdout.readline().strip() == "interrupted"
    q.put("after")
    assert q.get(timeout=5) == "after"
    p.kill()
    p.wait(30)


def test_scribbled_ring_is_an_error_not_a_crash(m):
    q = m.Queue(name="fpq-scribbled")
    other = m.Queue(name="fpq-bystander")
    q.put(1)
    ring = _fast.handle(q).ring
    ring._poke(80, (1 << 39) + 3)  # the tail word: an impossible position
    with pytest.raises(syncmgr.SyncMgrError, match="corrupted"):
        q.get(timeout=1)
    with pytest.raises(syncmgr.SyncMgrError):
        q.put(2)
    # The daemon and its other objects carry on.
    other.put("fine")
    assert other.get() == "fine"


def test_status_and_metrics_show_depth_bytes_and_waiters():
    from test_metrics import _endpoint, _metrics_once
    d = start_daemon("--metrics", "127.0.0.1:0", "--log-format", "json", "--log-level", "info")
    try:
        m = syncmgr.connect(d.address, d.key)
        q = m.Queue(name="fpq-status")
        q.put_many([b"x" * 100] * 3)  # by the fast path: the daemon reads the ring
        st = state(m, "fpq-status")
        assert st["state"].startswith("3 items, ") and "shared ring" in st["state"]
        assert st["items"] == 3 and st["bytes"] >= 300 and st["waiters"] == 0
        base = _endpoint(d)
        _metrics_once(base, 'syncmgr_queue_items{kind="queue"}', 3)
        q.get_many(10)
        t = threading.Thread(target=lambda: pytest.raises(queue.Empty, q.get, timeout=5))
        t.start()
        assert wait_until(lambda: state(m, "fpq-status")["waiters"] == 1)
        text = _metrics_once(base, 'syncmgr_waiters{kind="queue"}', 1)
        assert 'syncmgr_queue_items{kind="queue"} 0' in text
        t.join(30)
    finally:
        d.close()


def test_forked_child_uses_its_own_session(m):
    q = m.Queue(name="fpq-fork")
    q.put("from parent")

    def child():
        assert q.get(timeout=10) == "from parent"
        q.put("from child")
        q.put("again")  # by now on the child's own ring mapping
        os._exit(0 if _fast.active(q) else 4)

    p = CTX.Process(target=child)
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert q.get_many(5, timeout=5) == ["from child", "again"]


def _consume_and_die(jq, ready):
    jq.get(timeout=10)
    jq.get(timeout=10)
    jq.task_done()  # one of two
    ready.set()
    time.sleep(600)


def test_joinable_queue_consumer_killed_with_unfinished_items_does_not_hang_join(m):
    jq = m.JoinableQueue(name="fpq-join-dead")
    assert _fast.active(jq)  # on the ring: the consumer's gets and task_done are its own
    jq.put("a")
    jq.put("b")
    ready = CTX.Event()
    p = CTX.Process(target=_consume_and_die, args=(jq, ready))
    p.start()
    assert ready.wait(30)
    assert jq.join(timeout=0.2) is False  # the consumer lives and owes one item
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert jq.join(timeout=10) is True  # its unfinished item was marked done when its session ended
    assert "1 marked done" in state(m, "fpq-join-dead")["state"]
    jq.put("c")  # the queue goes on as before
    assert jq.get(timeout=5) == "c"
    jq.task_done()
    assert jq.join(timeout=5) is True
    with pytest.raises(ValueError):
        jq.task_done()


def test_joinable_task_done_and_join_take_no_round_trip():
    """A JoinableQueue's put, get, task_done and join stay on its ring
    (counted by the daemon's op counters); task_done once too often raises
    ValueError and changes nothing; status shows the unfinished count."""
    from test_metrics import _endpoint, _get, _value
    d = start_daemon("--metrics", "127.0.0.1:0", "--log-format", "json", "--log-level", "info")
    try:
        m = syncmgr.connect(d.address, d.key)
        jq = m.JoinableQueue(name="fpq-jq-fast")
        assert _fast.active(jq)
        n = 200
        for i in range(n):
            jq.put(i)
        assert jq.join(timeout=0) is False and jq.join(timeout=0.05) is False
        assert "200 unfinished" in state(m, "fpq-jq-fast")["state"]
        assert [jq.get() for _ in range(n)] == list(range(n))
        for _ in range(n - 1):
            jq.task_done()
        assert jq.join(timeout=0.05) is False
        jq.task_done()
        assert jq.join() is True and jq.join(timeout=0) is True
        with pytest.raises(ValueError, match="too many"):
            jq.task_done()
        assert _fast.handle(jq).ring.word("done") % (1 << 24) == n  # the refused call stored nothing
        jq.put("x")
        assert jq.get() == "x" and jq.join(timeout=0) is False
        jq.task_done()
        assert jq.join(timeout=0) is True
        assert "0 unfinished" in state(m, "fpq-jq-fast")["state"]
        _, _, text = _get(_endpoint(d) + "/metrics")
        for op in ("put", "get", "task_done", "join"):
            series = f'syncmgr_ops_total{{kind="joinable_queue",op="{op}",result="ok"}}'
            assert _value(text, series) == 0, (op, _value(text, series))
    finally:
        d.close()


def test_joinable_overflow_counts_the_daemons_items(m):
    """Puts past a JoinableQueue ring's room wait in the daemon; they count
    as unfinished all the same, and join returns once each is done."""
    jq = m.JoinableQueue(name="fpq-jq-over")
    ring = _fast.handle(jq).ring
    size = max(64, ring.capacity // 512)
    n = 3 * ring.capacity // size
    for i in range(n):
        jq.put(b"%08d" % i + b"." * (size - 8))
    assert ring.word("flags") == 2 and jq.qsize() == n
    assert jq.join(timeout=0) is False
    for i in range(n):
        assert jq.get(timeout=30)[:8] == b"%08d" % i
        jq.task_done()
    assert jq.join(timeout=30) is True
    with pytest.raises(ValueError):
        jq.task_done()
    assert ring.word("flags") == 0

def _get_and_finish(jq, n):
    for _ in range(n):
        jq.get(timeout=30)
        jq.task_done()


def test_joinable_join_is_woken_by_task_done_in_other_processes(daemon, m):
    """A join asleep on the ring wakes when the last task_done lands, in
    whichever process and on whichever path (fast or socket) it is called;
    an item got by one process can be marked done by another."""
    jq = m.JoinableQueue(name="fpq-jq-wake")
    jq.put_many(range(20))
    done = []
    t = threading.Thread(target=lambda: done.append(jq.join(timeout=60)))
    t.start()
    assert wait_until(lambda: state(m, "fpq-jq-wake")["waiters"] == 1)
    p = CTX.Process(target=_get_and_finish, args=(jq, 10))
    p.start()
    p.join(60)
    assert p.exitcode == 0 and not done
    socket_c = """
        import syncmgr, os
        m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
        jq = m.JoinableQueue(name="fpq-jq-wake")
        for _ in range(5):
            if os.environ["GET"] == "1":
                jq.get(timeout=30)
            jq.task_done()
    """
    getter = run_py(daemon, socket_c, SYNCMGR_FASTPATH="0", GET="1")
    assert getter.wait(60) == 0, getter.stderr.read()
    assert [jq.get(timeout=30) for _ in range(5)] == list(range(15, 20))  # got here, finished there:
    assert jq.join(timeout=0.05) is False and not done
    finisher = run_py(daemon, socket_c, SYNCMGR_FASTPATH="0", GET="0")
    assert finisher.wait(60) == 0, finisher.stderr.read()
    t.join(30)
    assert done == [True]
    with pytest.raises(ValueError):
        jq.task_done()


GET_JQ_STEPS = (11, 12, 13)
DONE_STEPS = (31, 32, 33)


def _killed_consumer(jq, step, batch):
    from syncmgr import _fastpath
    assert jq.get(timeout=30) == 0  # owed: got, not marked done
    _fastpath._set_queue_kill_step(step)
    if step in PUT_STEPS:
        jq.put(2)
    elif step in DONE_STEPS:
        jq.task_done()
    elif batch:
        jq.get_many(1)
    else:
        jq.get()
    os._exit(3)  # never reached


@pytest.mark.parametrize("step, batch", [(s, False) for s in PUT_STEPS + GET_JQ_STEPS + DONE_STEPS] + [(13, True)])
def test_joinable_consumer_killed_mid_op_leaves_the_counts_right(m, step, batch):
    """A consumer SIGKILLed at a labelled step of put, get or task_done on a
    JoinableQueue's ring: whatever it got and had not marked done is marked
    done when its session ends (the daemon finishes the op from its journal
    when the kill came between its commit and its debt), so join never hangs
    and never returns early, no item is delivered twice, and the queue goes
    on."""
    name = f"fpq-jq-kill-{step}-{batch}"
    jq = m.JoinableQueue(name=name)
    assert _fast.active(jq)
    for k in range(KILLS):
        jq.put(0)
        jq.put(1)
        p = CTX.Process(target=_killed_consumer, args=(jq, step, batch))
        p.start()
        p.join(60)
        assert p.exitcode == -signal.SIGKILL, p.exitcode
        if step == 13:  # the second get committed: both items went with the consumer, both marked done
            assert jq.join(timeout=30) is True, "join hangs"
            assert jq.qsize() == 0
        else:  # item 1 (and a committed put's 2) still queued and unfinished; item 0 marked done (or done: 33)
            want = [1, 2] if step == 3 else [1]
            for x in want:
                assert jq.get(timeout=30) == x, k
                assert jq.join(timeout=0.05) is False  # never early: x is not done
                jq.task_done()
            assert jq.join(timeout=30) is True, "join hangs"
        with pytest.raises(ValueError):
            jq.task_done()  # the counts are exact: nothing left to mark done
        assert _fast.handle(jq).ring.word("journal") == 0 and _fast.handle(jq).ring.word("latch") == 0
        assert state(m, name)["waiters"] == 0


def test_ctrl_c_in_a_blocked_join_changes_nothing(daemon, m):
    jq = m.JoinableQueue(name="fpq-jq-sigint")
    jq.put("a")
    p = run_py(daemon, """
        import syncmgr, os
        m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
        jq = m.JoinableQueue(name="fpq-jq-sigint")
        from syncmgr import _fast
        assert _fast.active(jq)
        print("ready", flush=True)
        try:
            jq.join()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        import time
        time.sleep(60)
    """)
    assert p.stdout.readline().strip() == "ready"
    assert wait_until(lambda: state(m, "fpq-jq-sigint")["waiters"] == 1)
    os.kill(p.pid, signal.SIGINT)
    assert p.stdout.readline().strip() == "interrupted"
    assert "1 unfinished" in state(m, "fpq-jq-sigint")["state"]
    assert jq.get(timeout=5) == "a"
    jq.task_done()
    assert jq.join(timeout=5) is True
    p.kill()
    p.wait(30)

SCALARS = [0, 127, 128, -32, -33, 255, 256, -128, -129, 65535, 65536, -32768, -32769, 2**32, -2**31 - 1,
           2**63 - 1, 2**63, 2**64 - 1, -2**63, 2**64, -2**63 - 1, 0.0, -1.5, float("inf"), "", "é", "x" * 31,
           "x" * 32, "y" * 300, "z" * 70000, b"", b"b" * 255, b"b" * 256, b"c" * 70000, None, True, False,
           "\ud800"]


def test_scalars_encoded_by_the_extension_read_the_same_everywhere(daemon, m):
    """The extension encodes plain scalars into the ring itself; a socket
    client reads them as Python's encoder would have written them, and the
    other way round."""
    q = m.Queue(name="fpq-scalars")
    for x in SCALARS:
        q.put(x)
    out = [q.get() for _ in SCALARS]
    assert out == SCALARS and [type(x) for x in out] == [type(x) for x in SCALARS]
    q.put_many(SCALARS)
    reader = run_py(daemon, """
        import syncmgr, os, pickle, sys
        m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
        q = m.Queue(name="fpq-scalars")
        got = [q.get(timeout=30) for _ in range(int(os.environ["N"]))]
        for x in got:
            q.put(x)
        sys.stdout.write(pickle.dumps(got, protocol=0).decode("latin-1"))
    """, SYNCMGR_FASTPATH="0", N=str(len(SCALARS)))
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    got = pickle.loads(out.encode("latin-1"))
    assert got == SCALARS and [type(x) for x in got] == [type(x) for x in SCALARS]
    back = q.get_many(len(SCALARS), timeout=10)
    while len(back) < len(SCALARS):
        back += q.get_many(len(SCALARS), timeout=10)
    assert back == SCALARS and [type(x) for x in back] == [type(x) for x in SCALARS]


def test_ctrl_c_while_another_process_holds_the_latch(m):
    """A latch held by a live session (here: a scribble naming this very
    session, which the daemon must not take over) is waited out with the
    GIL let go, and Ctrl-C leaves the wait with nothing taken."""
    q = m.Queue(name="fpq-latch-held")
    q.put("kept")
    ring = _fast.handle(q).ring
    ring._poke(64, _fast.handle(q).fp.slot)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        q.get_nowait()
    assert time.monotonic() - t0 >= 0.25
    assert ring.word("latch") == _fast.handle(q).fp.slot  # never ours to take
    ring._poke(64, 0)
    assert q.get_nowait() == "kept"


def test_killed_socket_getters_of_a_ring_queue_double_nothing(daemon, monkeypatch):
    """Socket getters of a queue with a ring, parked in get, SIGKILLed while
    a socket producer's puts are handed straight to them (the daemon's
    hand-over): no item is got twice, and every item put is got by a getter
    that said so or by the final drain, except at most one per killed getter
    (an item whose reply reached a process that died before reading it)."""
    monkeypatch.setenv("SYNCMGR_FASTPATH", "0")
    m = syncmgr.connect(daemon.address, daemon.key)
    q = m.Queue(name="hand-kill")
    n, kills, got, pids = 400, 0, [], set()
    victim = """
        import syncmgr
        q = syncmgr.connect().Queue(name="hand-kill")
        print("ready", flush=True)
        while True:
            print(q.get(), flush=True)
    """
    i = 0
    while i < n:
        p = run_py(daemon, victim, SYNCMGR_FASTPATH="0")
        pids.add(p.pid)
        try:
            assert p.stdout.readline().strip() == "ready"
            time.sleep(0.01)  # parked in get
            # The kill lands somewhere in the stream of puts: before, during
            # or after a hand-over.
            killer = threading.Timer(random.uniform(0, 0.004), os.kill, (p.pid, signal.SIGKILL))
            killer.start()
            for _ in range(20):
                q.put(i)
                i += 1
            killer.join()
            kills += 1
        finally:
            p.kill()
            p.wait(30)
            # Read through the reader that read "ready": it may have read
            # ahead the items a getter printed at once (those the last one
            # left in the queue), which communicate(), reading the
            # descriptor, would never see.
            out = p.stdout.read()
            p.stdout.close()
            p.stderr.close()
        got += [int(x) for x in out.split() if x != "ready"]
    # The drain starts once the daemon has closed every getter's session
    # (a session ends after its parked requests have undone what they could
    # not deliver): an item on its way back to the queue is there by then,
    # however slow the machine.
    assert wait_until(lambda: not pids & {s["pid"] for s in m.status()["sessions"]}, timeout=60)
    while True:
        try:
            got.append(q.get(timeout=0.5))
        except queue.Empty:
            break
    assert len(got) == len(set(got)), "an item was got twice"
    assert set(got) <= set(range(n))
    lost = n - len(got)
    assert lost <= kills, f"{lost} items lost with {kills} getters killed"


def test_a_held_latch_holds_up_its_queue_and_nothing_else(monkeypatch):
    """A latch kept by a live session (a scribble naming this one, as a
    stopped process's would): a socket put on that queue waits it out and
    fails with LimitError, nothing stored, and meanwhile the daemon's event
    loop, which serves every connection here (--event-loop-min-conns 1),
    answers the other connections' calls at once; once the latch is let go
    the queue works."""
    d = start_daemon("--event-loop-min-conns", "1")
    try:
        m = syncmgr.connect(d.address, d.key)
        q = m.Queue(name="latched")
        v = m.Value("i", 7)
        assert _fast.active(q), _fast.reasons
        monkeypatch.setenv("SYNCMGR_FASTPATH", "0")
        q_sock = pickle.loads(pickle.dumps(q))  # the same Queue, on the socket path
        assert not _fast.active(q_sock)
        ring = _fast.handle(q).ring
        ring._poke(64, _fast.handle(q).fp.slot)
        failed: list = []

        def put() -> None:
            try:
                q_sock.put_nowait("x")
            except syncmgr.LimitError as e:
                failed.append(e)

        t = threading.Thread(target=put)
        t0 = time.monotonic()
        t.start()
        time.sleep(0.2)  # the put waits on the latch
        waits = []
        for _ in range(5):
            s = time.monotonic()
            assert v.get() == 7
            waits.append(time.monotonic() - s)
        assert max(waits) < 0.5, waits  # not behind the put's 2 s
        t.join(10)
        assert failed and "latch" in str(failed[0]), failed
        assert time.monotonic() - t0 >= 1.9
        ring._poke(64, 0)
        assert q_sock.qsize() == 0  # the refused put stored nothing
        q_sock.put("y")
        assert q.get(timeout=10) == "y"
    finally:
        d.close()
