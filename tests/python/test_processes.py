"""Cross-process behaviour: fork, spawn, fresh interpreters, crashes, Ctrl-C,
wrong keys, a daemon that dies, and the embedded manager."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import signal
import subprocess
import sys
import textwrap
import time

import cloudpickle
import pytest

import syncmgr
from conftest import start_daemon, wait_until


def _locked_increments(lock, counter, n):
    for _ in range(n):
        with lock:
            counter.value = counter.value + 1  # not atomic: only the lock makes it exact


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_counter_under_lock_across_processes(m, method):
    ctx = mp.get_context(method)
    lock, counter = m.Lock(), m.Value("i", 0)
    procs = [ctx.Process(target=_locked_increments, args=(lock, counter, 50)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    assert counter.value == 200


def _run_child(daemon, code: str, payload: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], input=payload, capture_output=True,
                          env=daemon.env, timeout=timeout)


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
def test_pickled_proxies_work_in_a_fresh_interpreter(m, daemon, dumps):
    lock, ev, q, v = m.Lock(), m.Event(), m.Queue(), m.Value("d", 1.5)
    payload = dumps((lock, ev, q, v))
    assert daemon.key not in payload and daemon.key.hex().encode() not in payload
    out = _run_child(daemon, """
        import pickle, sys
        lock, ev, q, v = pickle.loads(sys.stdin.buffer.read())
        assert lock.acquire(timeout=5)
        lock.release()
        ev.set()
        q.put(("from child", v.add(1)))
        print("ok")
    """, payload)
    assert out.returncode == 0, out.stderr.decode()
    assert ev.is_set()
    assert q.get(timeout=5) == ("from child", 2.5)


def test_manager_pickles_to_a_connected_client(m, daemon):
    out = _run_child(daemon, """
        import pickle, sys
        m = pickle.loads(sys.stdin.buffer.read())
        assert m
        m.Event(name="made-by-child").set()
    """, pickle.dumps(m))
    assert out.returncode == 0, out.stderr.decode()
    assert m.Event(name="made-by-child").is_set()


def test_missing_key_is_a_clear_error(m, daemon):
    env = dict(daemon.env)
    del env["SYNCMGR_AUTHKEY"]
    out = subprocess.run([sys.executable, "-c", "import pickle,sys; pickle.loads(sys.stdin.buffer.read()).is_set()"],
                         input=pickle.dumps(m.Event()), capture_output=True, env=env, timeout=60)
    assert out.returncode != 0
    assert b"AuthenticationError" in out.stderr and b"SYNCMGR_AUTHKEY" in out.stderr


def test_wrong_key(daemon):
    with pytest.raises(syncmgr.AuthenticationError):
        syncmgr.connect(daemon.address, b"not the key").Lock()
    with pytest.raises(syncmgr.ConnectError) as ei:
        syncmgr.connect("/tmp/no-such-dir/no.sock", b"k").Lock()
    assert "/tmp/no-such-dir/no.sock" in str(ei.value)


def _hold_lock_then_hang(lock, ready):
    lock.acquire()
    ready.set()
    time.sleep(600)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_lock_of_a_killed_holder_is_released(m, method):
    ctx = mp.get_context(method)
    lock, sem, ready = m.Lock(), m.Semaphore(1), m.Event()
    p = ctx.Process(target=_hold_lock_then_hang, args=(lock, ready))
    p.start()
    assert ready.wait(30)
    assert lock.acquire(False) is False
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    t0 = time.monotonic()
    assert lock.acquire(timeout=5) is True
    assert time.monotonic() - t0 < 2
    lock.release()
    assert sem.acquire(False) is True


def _blocked_getter(q, ready):
    ready.set()
    q.get()  # blocks until killed


def test_killed_waiter_does_not_swallow_an_item(m):
    ctx = mp.get_context("fork")
    q, ready = m.Queue(), m.Event()
    p = ctx.Process(target=_blocked_getter, args=(q, ready))
    p.start()
    assert ready.wait(30)
    time.sleep(0.2)  # let it park in get
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    time.sleep(0.1)
    q.put("precious")
    assert q.get(timeout=5) == "precious"


def test_ctrl_c_during_a_blocking_call_leaves_the_client_usable(m, daemon):
    lock, q = m.Lock(name="ctrlc-lock"), m.Queue(name="ctrlc-q")
    lock.acquire()
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, syncmgr
        m = syncmgr.connect()
        lock, q = m.Lock(name="ctrlc-lock"), m.Queue(name="ctrlc-q")
        print("ready", flush=True)
        try:
            lock.acquire()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        assert lock.acquire(False) is False   # still usable, and nothing was taken
        try:
            q.get()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        q.put("after")
        print("usable", flush=True)
    """)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=daemon.env)
    try:
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline().strip() == b"interrupted"
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline().strip() == b"interrupted"
        assert child.stdout.readline().strip() == b"usable"
        assert child.wait(30) == 0, child.stderr.read().decode()
    finally:
        if child.poll() is None:
            child.kill()
    assert q.get(timeout=5) == "after"
    lock.release()


def test_daemon_killed_mid_call_then_restarted():
    d = start_daemon()
    try:
        m = syncmgr.connect(d.address, d.key)
        lock = m.Lock(name="survivor")
        lock.acquire()
        errors = []

        def blocked():
            try:
                lock.acquire()
            except syncmgr.ServerGoneError as e:
                errors.append(e)

        import threading

        t = threading.Thread(target=blocked)
        t.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        d.kill()
        t.join(10)
        assert errors and time.monotonic() - t0 < 5
        with pytest.raises(syncmgr.ServerGoneError):
            m.Lock(name="survivor").acquire(False)  # the stale pooled connection fails promptly
        from conftest import start_daemon_proc

        start_daemon_proc(d)
        lock2 = m.Lock(name="survivor")  # state was lost: the object is created anew
        assert lock2.acquire(False) is True
    finally:
        d.stop()


def test_daemon_shutdown_answers_blocked_clients():
    d = start_daemon()
    m = syncmgr.connect(d.address, d.key)
    ev = m.Event()
    import threading

    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(syncmgr.ServerGoneError, ev.wait)))
    t.start()
    time.sleep(0.2)
    assert d.stop() == 0
    t.join(10)
    assert errors
    assert not os.path.exists(d.address)


def test_embedded_manager():
    with syncmgr.Manager() as m:
        assert m  # (whether it exports SYNCMGR_ADDRESS depends on the environment: test_managers.py)
        env = m.runtime_env()["env_vars"]
        assert env["SYNCMGR_ADDRESS"] == m.address and "SYNCMGR_AUTHKEY" not in env
        key_hex = open(env["SYNCMGR_AUTHKEY_FILE"]).read().strip()
        assert bytes.fromhex(key_hex)
        pid = m.pid
        q = m.Queue()
        q.put(1)
        assert q.get() == 1
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        assert key_hex.encode() not in cmdline
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                      open(f"/proc/{pid}/stat").read().split()[2] == "Z", timeout=10)
    assert "SYNCMGR_ADDRESS" not in os.environ or os.environ["SYNCMGR_ADDRESS"] != m.address
    with pytest.raises(syncmgr.SyncMgrError):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        raise queue.Empty  # keep the import honest


def test_a_killed_parent_leaves_no_segment_of_its_embedded_daemon():
    """The daemon's log is a pipe to its parent: when the parent dies, the
    daemon's next log line must not kill it (SIGPIPE) before it has unlinked
    its segments."""
    import glob
    import uuid

    name = f"orphaned-{uuid.uuid4().hex[:8]}"
    code = f"""
        import os, sys, syncmgr
        m = syncmgr.Manager(log_level="debug"); m.start()
        m.SharedMemory(name={name!r}, create=True, size=4096)
        print(m.pid, flush=True)
        os.kill(os.getpid(), 9)
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, timeout=60,
                         env=dict(os.environ))
    pid = int(out.stdout.split()[0])
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                      open(f"/proc/{pid}/stat").read().split()[2] == "Z", timeout=10)
    assert wait_until(lambda: not glob.glob(f"/dev/shm/*-{name}"), timeout=10), glob.glob(f"/dev/shm/*-{name}")


def test_embedded_daemon_exits_with_its_parent(tmp_path):
    code = """
        import os, sys, syncmgr
        m = syncmgr.Manager(); m.start()
        print(m.pid, flush=True)
        os._exit(0)   # no atexit, no shutdown: the daemon must notice by itself
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, timeout=60,
                         env=dict(os.environ))
    pid = int(out.stdout.split()[0])
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                      open(f"/proc/{pid}/stat").read().split()[2] == "Z", timeout=10)
