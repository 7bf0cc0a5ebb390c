"""Limits one client cannot get round, and state lost in a daemon restart,
against the real daemon binary."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import syncmgr
from conftest import start_daemon, start_daemon_proc
from syncmgr.exceptions import LimitError, ServerRestartedError

HOLDER = textwrap.dedent("""
    import sys, syncmgr
    m = syncmgr.connect(sys.argv[1], bytes.fromhex(sys.argv[2]))
    lock = m.Lock(name="L")
    print("held" if lock.acquire(timeout=10) else "not held", flush=True)
    sys.stdin.readline()
""")


def test_stale_holder_release_after_restart_raises():
    """A held L; the daemon is SIGKILLed and restarted on the same socket;
    B (another process) acquires L. A's release raises ServerRestartedError
    and B still holds L."""
    d = start_daemon()
    try:
        m = syncmgr.connect(d.address, d.key)
        a = m.Lock(name="L")
        assert a.acquire(timeout=5)
        d.kill()
        start_daemon_proc(d)
        b = subprocess.Popen([sys.executable, "-c", HOLDER, d.address, d.key.hex()],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=d.env)
        try:
            assert b.stdout is not None and b.stdin is not None
            assert b.stdout.readline().strip() == "held"
            with pytest.raises(ServerRestartedError):
                a.release()
            assert isinstance(ServerRestartedError("x"), syncmgr.ServerGoneError)
            assert m.Lock(name="L").acquire(False) is False  # still B's
            b.stdin.write("\n")
            b.stdin.flush()
            assert b.wait(10) == 0
        finally:
            if b.poll() is None:
                b.kill()
                b.wait(10)
        # Once acquired in this run, the lock is released as usual.
        assert a.acquire(timeout=5)
        a.release()
    finally:
        d.stop()


def test_extend_over_the_object_limit_is_a_limit_error_with_no_effect():
    d = start_daemon("--max-object-bytes", "2000000")
    try:
        m = syncmgr.connect(d.address, d.key)
        lst = m.list([1, 2])
        with pytest.raises(LimitError):
            lst.extend(range(100_000))  # 100k items count 64 bytes each at least
        assert lst[:] == [1, 2]
        q = m.Queue()
        q.put(b"x" * 1_000_000)
        with pytest.raises(LimitError):
            q.put(b"y" * 1_000_000)
        assert q.qsize() == 1
    finally:
        d.stop()
