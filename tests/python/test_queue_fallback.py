"""Queues for a client whose C extension is missing (built without a
compiler, or its import failed): every op goes over the socket, on the same
queue, the same FIFO and the same limits as same-host clients that put and
get in the queue's shared ring.

The client without the extension is a fresh interpreter in which importing
``syncmgr._fastpath`` fails; it asks for the fast path
(``SYNCMGR_FASTPATH=1``) and must fall back without an error."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest

from syncmgr import _fast

NO_EXT = """
import sys
sys.modules["syncmgr._fastpath"] = None   # import syncmgr._fastpath raises ImportError
import json, os, queue
import syncmgr
from syncmgr import _fast
assert _fast._ext is None
m = syncmgr.connect(os.environ["SYNCMGR_ADDRESS"], bytes.fromhex(os.environ["SYNCMGR_AUTHKEY"]))
"""


def no_ext(daemon, code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", NO_EXT + textwrap.dedent(code)],
                       env={**daemon.env, "SYNCMGR_FASTPATH": "1"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return ast.literal_eval(r.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def fastpath_on(monkeypatch):
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")


def test_a_client_without_the_extension_shares_the_ring_queue(daemon, m):
    if _fast._ext is None:
        pytest.skip("this interpreter has no extension either: nothing to mix")
    q = m.Queue(maxsize=6, name="fallback-mixed")
    assert _fast.active(q), _fast.reasons
    for x in (1, "two", b"three", [4]):
        q.put(x)  # into the ring
    got = no_ext(daemon, """
        q = m.Queue(maxsize=6, name="fallback-mixed")
        out = {"active": _fast.active(q), "qsize": q.qsize()}
        out["got"] = [q.get(timeout=10), q.get_nowait()]
        out["many"] = q.get_many(10, timeout=10)
        q.put_many([5, 6, 7, 8, 9, 10])
        try:
            q.put_nowait(11)
            out["full"] = False
        except queue.Full:
            out["full"] = True
        out["after"] = q.qsize()
        for bad in (-1, float("nan")):
            try:
                q.get(timeout=bad)
                out["bad"] = "accepted"
            except ValueError:
                out["bad"] = "ValueError"
        print(repr(out))
    """)
    assert got["active"] is False
    assert got["qsize"] == 4
    assert got["got"] == [1, "two"]
    assert got["many"] == [b"three", [4]]
    assert got["full"] is True and got["after"] == 6
    assert got["bad"] == "ValueError"
    # What the socket client put is in the ring's FIFO, in order, for this
    # same-host client, and the queue is at its maxsize for it too.
    assert q.full() and q.qsize() == 6
    assert [q.get(timeout=5) for _ in range(6)] == [5, 6, 7, 8, 9, 10]
    assert q.empty()


def test_a_client_without_the_extension_waits_for_a_ring_put(daemon, m):
    if _fast._ext is None:
        pytest.skip("this interpreter has no extension either: nothing to mix")
    q = m.Queue(name="fallback-wait")
    assert _fast.active(q)
    p = subprocess.Popen([sys.executable, "-c", NO_EXT + textwrap.dedent("""
        q = m.Queue(name="fallback-wait")
        print("ready", flush=True)
        print(json.dumps({"got": q.get(timeout=60)}), flush=True)
    """)], env={**daemon.env, "SYNCMGR_FASTPATH": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        q.put({"from": "ring"})  # a ring put wakes a socket client's blocked get
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {"got": {"from": "ring"}}
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert q.empty()


def test_the_extension_missing_is_a_reason_not_an_error(daemon):
    got = no_ext(daemon, """
        q = m.Queue()
        q.put(1)
        print(repr({"got": q.get(timeout=5), "active": _fast.active(q)}))
    """)
    assert got["got"] == 1 and got["active"] is False
