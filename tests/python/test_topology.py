"""The fast path under real process topologies: forked children at the
parent's speed (no socket round trip and no Python frame per op, even
through bound methods taken before the fork), contended waits that stay on
the futex past the old 50 ms limit and show in `status`, bounded
unfairness (a process gets a Lock hammered by 30 others within a bound),
and killed waiters at each step of a wait."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from typing import Any

import pytest

from syncmgr import _connection, _fast

pytestmark = pytest.mark.skipif(_fast._ext is None or os.environ.get("SYNCMGR_FASTPATH") == "0",
                                reason="fast path not built or disabled")
FORK = mp.get_context("fork")
FAST_FILE = _fast.__file__


@pytest.fixture(autouse=True)
def fastpath_on(monkeypatch):
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")


class Counter:
    """Counts socket round trips (requests sent on any connection) and
    Python frames of the fast path's module, in this process."""

    def __init__(self) -> None:
        self.requests = 0
        self.frames = 0
        orig = _connection.Connection.send_requests
        counter = self

        def counting(conn: Any, *a: Any, **k: Any) -> Any:
            counter.requests += 1
            return orig(conn, *a, **k)

        _connection.Connection.send_requests = counting  # type: ignore[method-assign]

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == FAST_FILE:
            self.frames += 1


def _child_ops(objs, methods, conn, n):
    try:
        c = Counter()
        for o in objs:  # the first op moves the handles to this process's session
            o.acquire()
            o.release()
        before = c.requests
        sys.setprofile(c.profile)
        for acq, rel in methods:  # bound methods taken in the parent, before the fork
            for _ in range(n):
                acq()
                rel()
        for o in objs:
            for _ in range(n):
                with o:
                    pass
        sys.setprofile(None)
        conn.send({"requests": c.requests - before, "frames": c.frames, "active": [_fast.active(o) for o in objs]})
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send({"error": repr(e)})


def test_forked_child_ops_make_no_round_trip_and_no_python_frame(m):
    objs = [m.Lock(), m.RLock(), m.Semaphore(2), m.BoundedSemaphore(1)]
    assert all(_fast.active(o) for o in objs), _fast.reasons
    methods = [(o.acquire, o.release) for o in objs]
    rd, wr = FORK.Pipe(duplex=False)
    p = FORK.Process(target=_child_ops, args=(objs, methods, wr, 200))
    p.start()
    assert rd.poll(60)
    got = rd.recv()
    p.join(30)
    assert "error" not in got, got
    assert got["active"] == [True] * len(objs)
    assert got["requests"] == 0  # no socket round trip
    # Every op ran in C: no frame of the fast path's Python methods (before,
    # a bound method taken before the fork ran each op through them).
    assert got["frames"] == 0
