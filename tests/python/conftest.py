"""Fixtures: the real syncmgr daemon on a private socket, and clients of it."""

from __future__ import annotations

import os
import signal
import struct
import sys
import time
from collections.abc import Iterator

import pytest

import syncmgr
from syncmgr._daemon import PrivateDaemon

# A shell runs a background job (`make test &` in a script) with SIGINT
# ignored, and children inherit that: the tests that Ctrl-C a child would
# then see no KeyboardInterrupt. A Python handler here is reset to the
# default in every child at exec, so they get Python's own again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("SYNCMGR_BIN") or os.path.join(REPO, "bin", "syncmgr")


class Daemon(PrivateDaemon):
    """A syncmgr daemon process started by a test (the client's own
    private-daemon starter, so tests start daemons as Manager() does)."""

    @property
    def env(self) -> dict:  # type: ignore[override]
        """A minimal environment for a fresh interpreter that should reach the daemon."""
        return {"PATH": os.environ.get("PATH", ""), "SYNCMGR_ADDRESS": self.address,
                "SYNCMGR_AUTHKEY": self.key.hex(), "PYTHONPATH": os.pathsep.join(sys.path)}

    def restart(self) -> None:
        self.stop()
        self.start()


def start_daemon_proc(d: Daemon) -> None:
    """Start d again (after kill or stop), on the same socket and key, and
    let this process's client notice (its pooled connections are stale)."""
    d.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            syncmgr.connect(d.address, d.key).status()
            return
        except syncmgr.SyncMgrError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def start_daemon(*args: str) -> Daemon:
    if not os.access(BIN, os.X_OK):
        raise RuntimeError(f"no daemon binary at {BIN}: run `make build`")
    return Daemon(BIN, args=tuple(args), exit_with_parent=False, forward_log=False,
                  key_file=False).start()


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    """One daemon per test module; its address and key are in os.environ so
    that child processes and unpickled proxies find it."""
    d = start_daemon()
    saved = {k: os.environ.get(k) for k in ("SYNCMGR_ADDRESS", "SYNCMGR_AUTHKEY", "SYNCMGR_BIN")}
    os.environ.update(SYNCMGR_ADDRESS=d.address, SYNCMGR_AUTHKEY=d.key.hex(), SYNCMGR_BIN=BIN)
    yield d
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    d.close()


@pytest.fixture
def m(daemon: Daemon) -> syncmgr.Manager:
    """A manager connected to the module's daemon."""
    return syncmgr.connect(daemon.address, daemon.key)


def wait_until(pred, timeout: float = 10.0, interval: float = 0.01) -> bool:
    """Poll pred until it is true or the timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def object_count(m: syncmgr.Manager) -> int:
    return int(m.status(limit=1)["server"]["objects"])


def hold_latch(fd: int, off: int, slot: int) -> int:
    """Write slot into the latch (bits 32-60) of the Semaphore word at off
    of the segment fd, as a process stopped inside an op has it, and return
    the word. A test can only store the word, not compare-and-swap it, and
    the daemon's sweeper claims and commits every free Semaphore latch once
    a second: a store that lands between its claim and its commit is
    cleared by the commit. So the latch is stored only while it reads free,
    and read back until it stays (the sweeper leaves a latch a live session
    holds alone)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        (word,) = struct.unpack("<Q", os.pread(fd, 8, off))
        latch = word >> 32 & ((1 << 29) - 1)
        if latch == slot:
            time.sleep(0.05)
            if struct.unpack("<Q", os.pread(fd, 8, off))[0] == word:
                return word
        elif latch == 0:
            os.pwrite(fd, struct.pack("<Q", word | slot << 32), off)
        else:
            time.sleep(0.001)  # the daemon's claim: it lets go within microseconds
    raise TimeoutError(f"could not hold the latch of the word at {off}")


def segment_fd(address: str, key: bytes) -> int:
    """A descriptor of the daemon's fast-path segment, got as any process of
    the user can: a connection of its own and fastpath_attach (the reply
    carries the descriptor). The caller closes it. Tests use it to write the
    segment as a buggy or hostile process would."""
    from syncmgr import _connection, _fast

    conn = _connection.Connection(address, key, os.urandom(16), None)
    try:
        _, fds = _fast.FastPath._attach(_Anchor(conn))  # type: ignore[arg-type]
    finally:
        conn.close()
    for fd in fds[1:]:
        os.close(fd)
    return fds[0]


class _Anchor:
    def __init__(self, conn: object) -> None:
        self.anchor = conn


class Counting:
    """Counts the requests a client sends (wraps its call), as a context
    manager: ``with Counting(m._c()) as c: ...; c.ops``."""

    def __init__(self, client) -> None:
        self.client, self.n, self.ops = client, 0, []
        self.inner = client.call

    def __enter__(self) -> Counting:
        def call(op, *a, **k):
            self.n += 1
            self.ops.append(op)
            return self.inner(op, *a, **k)
        self.client.call = call
        return self

    def __exit__(self, *exc_info) -> None:
        del self.client.call
