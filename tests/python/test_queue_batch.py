"""Queue batches, put_many and get_many, on both paths (the suite runs
with the fast path on and off): a put_many is all or nothing, each batch is
one request on the socket path, fast and socket clients share one FIFO, and
an item no socket client could be handed is refused at put."""

from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import syncmgr
from conftest import Counting, start_daemon
from syncmgr import _fast
from syncmgr import exceptions as exc

FAST = os.environ.get("SYNCMGR_FASTPATH", "1") != "0"


def run_py(daemon, code: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env={**daemon.env, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_batch_that_can_never_fit_is_a_value_error(m):
    """The first-contact case: a batch of more items than maxsize raises
    ValueError at once (retrying could never help) and stores nothing."""
    q = m.Queue(maxsize=3)
    with pytest.raises(ValueError, match=r"batch of 4 items can never fit a queue of maxsize 3"):
        q.put_many([1, 2, 3, 4], timeout=0.2)
    assert q.qsize() == 0
    q.put_many([1, 2, 3])
    assert q.get_many(10) == [1, 2, 3]


@pytest.mark.parametrize("kind", ["Queue", "JoinableQueue"])
def test_put_many_is_all_or_nothing_on_full(m, kind):
    q = getattr(m, kind)(maxsize=5)
    q.put_many(["a", "b", "c"])
    t0 = time.monotonic()
    with pytest.raises(queue.Full):
        q.put_many([1, 2, 3], timeout=0.1)
    assert time.monotonic() - t0 >= 0.09
    with pytest.raises(queue.Full):
        q.put_many([1, 2, 3], block=False)
    with pytest.raises(queue.Full):
        q.put_many([b"x" * 100_000, 2, 3], block=False)  # a large item: the daemon's put_many, as atomic
    assert q.qsize() == 3
    q.put_many([1, 2])
    assert q.qsize() == 5 and q.full()
    assert q.get_many(10) == ["a", "b", "c", 1, 2]


def test_put_many_waits_for_room_for_the_whole_batch(m):
    q = m.Queue(maxsize=4)
    q.put_many([0, 1, 2])
    out = {}

    def producer() -> None:
        q.put_many([3, 4, 5], timeout=10)
        out["done"] = time.monotonic()

    t = threading.Thread(target=producer)
    t.start()
    time.sleep(0.1)
    assert q.get() == 0  # room for 2 of 3
    time.sleep(0.1)
    assert "done" not in out and q.qsize() == 2
    assert q.get() == 1
    t.join(10)
    assert "done" in out
    assert q.get_many(10) == [2, 3, 4, 5]


def test_each_batch_is_one_request_on_the_socket_path(daemon):
    """put_many(64) and get_many are one request each on the socket; on the
    fast path a batch of small items sends none."""
    m = syncmgr.connect(daemon.address, daemon.key)
    q = m.Queue()
    with Counting(q._client) as c:
        q.put_many([b"%08d" % i for i in range(64)])
        got = q.get_many(64)
    assert got == [b"%08d" % i for i in range(64)]
    if _fast.active(q):
        assert c.n == 0, c.ops
    else:
        assert c.ops == ["put_many", "get_many"]


def test_get_many_takes_what_is_there_up_to_its_count(m):
    q = m.Queue()
    q.put_many(list(range(100)))
    assert q.get_many(30) == list(range(30))
    assert q.get_many(1000) == list(range(30, 100))
    with pytest.raises(queue.Empty):
        q.get_many(5, timeout=0.05)
    with pytest.raises(queue.Empty):
        q.get_many(5, block=False)
    for bad, err in ((0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(err):
            q.get_many(bad)


def test_fast_and_socket_clients_keep_one_fifo(daemon, m):
    """Batches from a fast client and a socket-only client, interleaved on
    one queue, come out in the order they went in, whole and adjacent."""
    q = m.Queue(name="batch-mixed")
    q.put_many(list(range(0, 10)))
    other = run_py(daemon, """
        import os, syncmgr
        m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
        q = m.Queue(name="batch-mixed")
        q.put_many(list(range(10, 20)))
        print(q.get_many(3), flush=True)
    """, SYNCMGR_FASTPATH="0")
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    assert out.strip() == "[0, 1, 2]"
    q.put_many(list(range(20, 30)))
    got = q.get_many(100)
    while len(got) < 27:
        got += q.get_many(100, timeout=5)
    assert got == list(range(3, 30))


def test_a_killed_batch_putter_stores_nothing(daemon, m):
    """A process killed while its put_many waits for room (on the ring or
    parked in the daemon) leaves none of its batch behind."""
    q = m.Queue(maxsize=3, name="batch-killed")
    q.put_many([0, 1])
    p = run_py(daemon, """
        import os, syncmgr
        m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
        q = m.Queue(maxsize=3, name="batch-killed")
        print("waiting", flush=True)
        q.put_many(["x", "y"], timeout=60)
        print("stored", flush=True)
    """, SYNCMGR_FASTPATH="1" if FAST else "0")
    assert p.stdout is not None and p.stdout.readline().strip() == "waiting"
    time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    p.wait(30)
    assert q.get() == 0  # room for the whole batch now, had it survived
    time.sleep(0.2)
    assert q.qsize() == 1 and q.get_many(10) == [1]


def test_an_unpicklable_item_stores_nothing(m):
    q = m.Queue()
    with pytest.raises((pickle.PicklingError, AttributeError)):
        q.put_many([1, lambda: 0, 3])
    assert q.qsize() == 0


@pytest.fixture(scope="module")
def small_frames():
    """A daemon whose frame limit (1 MiB) is below a ring's inline limit."""
    d = start_daemon("--max-frame", "1048576")
    yield d
    d.close()


def test_an_item_over_the_frame_limit_is_refused_at_put(small_frames):
    """On every path a put of an item no socket client could be handed
    fails at put with nothing stored, and the queue keeps serving socket
    consumers: no item wedges its head."""
    m = syncmgr.connect(small_frames.address, small_frames.key)
    q = m.Queue(name="frames")
    big = b"x" * 2_000_000
    for put in (lambda: q.put(big), lambda: q.put_many([1, big]), lambda: q.put_many([big])):
        with pytest.raises(exc.FrameTooLargeError, match="frame limit"):
            put()
    assert q.qsize() == 0
    q.put(b"y" * 900_000)  # under the limit: fine on either path
    p = run_py(small_frames, """
        import os, syncmgr
        m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
        print(len(m.Queue(name="frames").get(timeout=10)), flush=True)
    """, SYNCMGR_FASTPATH="0")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out.strip() == "900000"
