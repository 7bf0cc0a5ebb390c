"""The client's half of the one contract: an error answer means no effect,
errors are classes from one table, several managers in one process, and the
stock proxies' behaviour where SyncManager users rely on it."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import subprocess
import sys
import textwrap
import threading

import pytest

import syncmgr
from conftest import start_daemon
from syncmgr import exceptions as exc


@pytest.fixture(scope="module")
def small():
    """A daemon with a 64 KiB frame limit."""
    d = start_daemon("--max-frame", "65536")
    yield d
    d.close()


def test_oversized_request_costs_nothing(small):
    m = syncmgr.connect(small.address, small.key)
    lock = m.Lock()
    d = m.dict()
    lst = m.list()
    assert lock.acquire(timeout=5)
    before = m.status()["server"]["objects"]
    for op in (lambda: d.__setitem__("k", b"a" * 70000),
               lambda: lst.append(b"a" * 70000),
               lambda: d.update({i: b"x" * 1000 for i in range(80)})):
        with pytest.raises(syncmgr.FrameTooLargeError):
            op()
    # Nothing was lost: the lock is still ours, the anonymous objects alive.
    assert m.status()["server"]["objects"] == before
    d["k"] = 1
    assert d["k"] == 1 and len(lst) == 0
    other = subprocess.run(
        [sys.executable, "-c", "import pickle,sys; print(pickle.loads(sys.stdin.buffer.read()).acquire(False))"],
        input=pickle.dumps(lock), capture_output=True, timeout=60,
        env=dict(os.environ, SYNCMGR_ADDRESS=small.address, SYNCMGR_AUTHKEY=small.key.hex()))
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == b"False"
    lock.release()


def test_error_classes_from_one_table(m):
    d, lst, q = m.dict(), m.list(), m.Queue(maxsize=1)
    with pytest.raises(KeyError):
        d["missing"]
    with pytest.raises(IndexError):
        lst[3]
    with pytest.raises(queue.Empty):
        q.get_nowait()
    q.put(1)
    with pytest.raises(queue.Full):
        q.put_nowait(2)
    for code, base in (("key_error", KeyError), ("index_error", IndexError), ("empty", queue.Empty),
                       ("full", queue.Full), ("limit", syncmgr.SyncMgrError)):
        e = exc.from_code(code, "x")
        assert isinstance(e, base) and isinstance(e, syncmgr.SyncMgrError) and e.code == code
    exported = set(syncmgr.__all__)
    for name in exc.__all__:
        if name.endswith("Error") or name in ("Empty", "Full"):
            assert name in exported, name


def test_value_accepts_bool_for_integer_typecodes(m):
    assert m.Value("i", False).value == 0
    v = m.Value("i", True)
    assert v.value == 1
    v.value = False
    assert v.value == 0
    assert m.Value("d", True).value == 1.0
    assert m.Value("?", 1).value is True


def test_huge_timeouts_overflow_like_the_stock_proxies(m):
    for p in (m.Lock(), m.RLock(), m.Condition()):
        with pytest.raises(OverflowError):
            p.acquire(timeout=1e100)
        assert p.acquire(timeout=threading.TIMEOUT_MAX)
        p.release()


def test_shut_down_manager_raises_process_error():
    mgr = syncmgr.Manager()
    mgr.start()
    mgr.shutdown()
    with pytest.raises(multiprocessing.ProcessError):
        mgr.Lock()
    with pytest.raises(multiprocessing.ProcessError):
        mgr.start()


def _child_touches(lock, ev, out):
    with lock:
        ev.set()
    out.put(os.getpid())


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_children_of_two_managers_find_their_keys(method, monkeypatch):
    """Whatever the order managers started and stopped, and whether the
    child inherited the environment (forkserver started before the
    managers did not), a child reaches the daemon its proxy names."""
    for k in ("SYNCMGR_ADDRESS", "SYNCMGR_AUTHKEY", "SYNCMGR_AUTHKEY_FILE"):
        monkeypatch.delenv(k, raising=False)
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        p = ctx.Process(target=int)  # start the fork server before any manager
        p.start()
        p.join(30)
    m1 = syncmgr.Manager()
    m1.start()
    assert os.environ["SYNCMGR_ADDRESS"] == m1.address
    m2 = syncmgr.Manager()
    m2.start()
    assert os.environ["SYNCMGR_ADDRESS"] == m1.address  # not clobbered
    try:
        for mgr in (m2, m1):
            lock, ev, out = mgr.Lock(), mgr.Event(), mgr.Queue()
            p = ctx.Process(target=_child_touches, args=(lock, ev, out))
            p.start()
            p.join(60)
            assert p.exitcode == 0
            assert ev.is_set() and out.get(timeout=10) == p.pid
        m2.shutdown()
        assert os.environ["SYNCMGR_ADDRESS"] == m1.address  # m2 removed nothing it did not set
        lock, ev, out = m1.Lock(), m1.Event(), m1.Queue()
        p = ctx.Process(target=_child_touches, args=(lock, ev, out))
        p.start()
        p.join(60)
        assert p.exitcode == 0 and ev.is_set()
    finally:
        m2.shutdown()
        m1.shutdown()
    assert "SYNCMGR_ADDRESS" not in os.environ and "SYNCMGR_AUTHKEY" not in os.environ


def test_key_file_is_private_and_checked(tmp_path, monkeypatch):
    for k in ("SYNCMGR_ADDRESS", "SYNCMGR_AUTHKEY", "SYNCMGR_AUTHKEY_FILE"):
        monkeypatch.delenv(k, raising=False)
    with syncmgr.Manager() as mgr:
        kf = os.path.join(os.path.dirname(mgr.address), "syncmgr.key")
        st = os.stat(kf)
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.getuid()
        assert os.stat(os.path.dirname(mgr.address)).st_mode & 0o777 == 0o700
    # A key file that others could read, or a symlink, is not trusted.
    sock = tmp_path / "s.sock"
    key = tmp_path / "syncmgr.key"
    key.write_text("00" * 32)
    os.chmod(key, 0o644)
    from syncmgr._keys import key_file_beside
    assert key_file_beside(str(sock)) is None
    os.chmod(key, 0o600)
    assert key_file_beside(str(sock)) == b"\x00" * 32
    real = tmp_path / "real.key"
    key.rename(real)
    key.symlink_to(real)
    assert key_file_beside(str(sock)) is None


def test_embedded_daemon_warnings_reach_logging(caplog):
    code = """
        import logging, syncmgr
        logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
        m = syncmgr.Manager(daemon_args=("--tcp", "127.0.0.1:0"))   # plaintext TCP: the daemon warns
        m.start()
        m.shutdown()
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if not k.startswith("SYNCMGR_ADDRESS")})
    assert out.returncode == 0, out.stderr
    assert b"syncmgr.daemon WARNING" in out.stderr, out.stderr


def test_repr_has_the_stock_form(m):
    # Code and CPython's own tests match on SyncManager's proxy repr.
    assert repr(m.Event()).startswith("<EventProxy object, typeid 'Event' at 0x")
    assert repr(m.Lock()).startswith("<LockProxy object, typeid 'Lock' at 0x")


def test_sigkilled_embedded_daemon_leaves_no_state_file(monkeypatch):
    """The fast path's state segment is an anonymous memory file: the daemon
    maps nothing from /dev/shm or its private directory, so nothing is left
    when it is SIGKILLed."""
    import signal

    from syncmgr import _fast

    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")
    mgr = syncmgr.Manager()
    mgr.start()
    lock = mgr.Lock()
    lock.acquire()
    if _fast._ext is not None:
        assert _fast.active(lock), _fast.reasons
    d = os.path.dirname(mgr.address)
    with open(f"/proc/{mgr.pid}/maps") as f:
        maps = f.read()
    assert "memfd:syncmgr-state" in maps
    assert "/dev/shm/" not in maps and d not in maps
    assert not [f for f in os.listdir(d) if "state" in f]
    os.kill(mgr.pid, signal.SIGKILL)
    mgr.shutdown()
    assert not os.path.exists(d)
