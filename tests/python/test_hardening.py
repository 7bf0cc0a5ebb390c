"""Hardening seen from the Python client: segment files are checked before mapping (issue 12);
the fast path's segment survives a process of the user that writes it (issue 22)."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import struct
import time

import pytest

from conftest import wait_until
from syncmgr.shared_memory import SharedMemoryFileError

CTX = mp.get_context("fork")


def _swap(path: str, make) -> None:
    """Replace path with what make(tmp) creates, through a rename (a new inode)."""
    tmp = path + ".swap"
    make(tmp)
    os.rename(tmp, path)


def test_attach_refuses_a_symlinked_segment(m, tmp_path):
    seg = m.SharedMemory(create=True, size=4096)
    path = m._c().call("shm_attach", {"name": seg.name})["path"]
    target = tmp_path / "elsewhere"
    target.write_bytes(b"\0" * 4096)
    _swap(path, lambda tmp: os.symlink(target, tmp))
    with pytest.raises(SharedMemoryFileError):
        m.SharedMemory(seg.name)
    with pytest.raises(PermissionError):  # it is a PermissionError too
        m.SharedMemory(seg.name)
    seg.close()


@pytest.mark.parametrize("problem", ["shrunk", "readable by others", "hard link"])
def test_attach_refuses_a_changed_segment_file(m, problem):
    seg = m.SharedMemory(create=True, size=8192)
    path = m._c().call("shm_attach", {"name": seg.name})["path"]
    if problem == "shrunk":  # mapping it would SIGBUS the reader past the end
        os.truncate(path, 100)
    elif problem == "readable by others":
        os.chmod(path, 0o644)
    else:
        os.link(path, path + ".extra")
    try:
        with pytest.raises(SharedMemoryFileError):
            m.SharedMemory(seg.name)
    finally:
        if os.path.exists(path + ".extra"):
            os.unlink(path + ".extra")
    seg.close()


# --- issue 12 item 14 (client side) and item 6 (client side) ---------------------


def test_default_address_follows_tmpdir_like_the_daemon(monkeypatch, tmp_path):
    from syncmgr._connection import default_address

    monkeypatch.delenv("SYNCMGR_ADDRESS", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert default_address() == os.path.join(str(tmp_path), f"syncmgr-{os.getuid()}", "syncmgr.sock")


def test_relative_and_host_port_addresses(daemon, tmp_path, monkeypatch):
    import subprocess
    import sys

    import syncmgr

    monkeypatch.chdir(os.path.dirname(daemon.address))
    m = syncmgr.connect(os.path.basename(daemon.address), daemon.key)
    assert m.address == daemon.address  # made absolute
    ev = m.Event()
    ev.set()
    import pickle

    blob = pickle.dumps(ev)
    # A child in another working directory unpickles the proxy and reaches the daemon.
    code = "import pickle, sys; ev = pickle.loads(sys.stdin.buffer.read()); print(ev.is_set())"
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, cwd=str(tmp_path),
                         env=daemon.env, timeout=30)
    assert out.stdout.strip() == b"True", out.stderr.decode()
    from syncmgr._connection import normalize_address

    assert normalize_address(("127.0.0.1", 7791)) == "tcp://127.0.0.1:7791"
    assert normalize_address(("::1", 7791)) == "tcp://[::1]:7791"
    assert syncmgr.Manager(("127.0.0.1", 7791)).address == "tcp://127.0.0.1:7791"


def test_daemon_not_running_says_how_to_start_one(tmp_path):
    import syncmgr

    with pytest.raises(syncmgr.ConnectError) as ei:
        syncmgr.connect(str(tmp_path / "none.sock"), os.urandom(32)).Lock()
    msg = str(ei.value)
    assert "no syncmgr daemon is running" in msg and "syncmgr serve" in msg and "SYNCMGR_ADDRESS" in msg


def test_socket_of_another_user_is_refused(monkeypatch):
    """A listener of another uid gets nothing from us, not even the handshake (root only)."""
    import subprocess

    import syncmgr

    if os.geteuid() != 0:
        pytest.skip("needs root: runs a listener as uid 64002 with setpriv")
    import shutil
    import tempfile

    shared = tempfile.mkdtemp(prefix="smx", dir="/tmp")
    os.chmod(shared, 0o777)
    path = os.path.join(shared, "evil.sock")
    code = ("import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(); "
            "print('ready', flush=True); c, _ = s.accept(); c.settimeout(5); "
            "print('got', len(c.recv(100)), flush=True)")
    python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"  # one the other user can run
    proc = subprocess.Popen(["setpriv", "--reuid=64002", "--regid=64002", "--clear-groups", "--",
                             python, "-c", code, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        monkeypatch.delenv("SYNCMGR_SERVER_UID", raising=False)
        with pytest.raises(syncmgr.ConnectError, match="uid 64002"):
            syncmgr.connect(path, os.urandom(32)).Lock()
        out, _ = proc.communicate(timeout=10)
        assert "got 0" in out  # we closed without sending a byte
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(shared, ignore_errors=True)


# --- issue 12 item 5: TLS settings from the environment ---------------------------


def test_tls_from_the_environment_reaches_ray_style_workers(tmp_path, monkeypatch):
    import re
    import shutil
    import subprocess
    import sys
    import time

    import syncmgr
    from conftest import start_daemon

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=syncmgr-test", "-addext", "subjectAltName=DNS:syncmgr-test",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    d = start_daemon("--tcp", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key), "--log-format", "json",
                     "--log-level", "info")
    try:
        with open(d.log) as f:
            port = re.search(r'"tcp":"127\.0\.0\.1:(\d+)"', f.read()).group(1)
        addr = f"tcp://127.0.0.1:{port}"
        # Without TLS settings: an error that says the port needs TLS, quickly.
        monkeypatch.delenv("SYNCMGR_TLS_CA", raising=False)
        t0 = time.monotonic()
        with pytest.raises(syncmgr.SyncMgrError, match="requires TLS"):
            syncmgr.connect(addr, d.key).Event()
        assert time.monotonic() - t0 < 5
        # With them (and a server name other than the address's host).
        monkeypatch.setenv("SYNCMGR_TLS_CA", str(cert))
        monkeypatch.setenv("SYNCMGR_TLS_SERVER_NAME", "syncmgr-test")
        m = syncmgr.connect(addr, d.key)
        ev = m.Event()
        ev.set()
        env = m.runtime_env()["env_vars"]
        assert env["SYNCMGR_TLS_CA"] == str(cert) and env["SYNCMGR_TLS_SERVER_NAME"] == "syncmgr-test"
        # A worker with only the runtime_env's variables unpickles a proxy and uses it.
        import pickle

        code = "import pickle, sys; ev = pickle.loads(sys.stdin.buffer.read()); print(ev.is_set())"
        worker_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path), **env}
        out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(ev), capture_output=True,
                             env=worker_env, timeout=30)
        assert out.stdout.strip() == b"True", out.stderr.decode()
        # `syncmgr status` takes the same settings (flags default to the variables).
        from conftest import BIN

        st = subprocess.run([BIN, "status", "--address", addr], capture_output=True, timeout=30,
                            env={**worker_env, "SYNCMGR_AUTHKEY": d.key.hex()})
        assert st.returncode == 0 and b"EVENT" in st.stdout.upper(), st.stderr.decode()
    finally:
        d.stop()


# --- issue 22: the fast path's segment, written by a buggy or hostile process of the user ---


def _fast_ext():
    from syncmgr import _fast

    if _fast._ext is None:
        pytest.skip("built without the C extension: no fast path")
    return _fast


def _latch_then_stop(sem, ready) -> None:
    # A session of its own, attached (one op by CAS), then its slot in the
    # latch as if stopped between the steps of an op: a live holder.
    from conftest import hold_latch, segment_fd

    sem.acquire()
    sem.release()
    h = _fast_ext().handle(sem)
    fd = segment_fd(sem._client.address, sem._client._key)
    hold_latch(fd, h.off, h.fp.slot)
    os.close(fd)
    ready.set()
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(600)


def _take_and_wait(sem, n, ready) -> None:
    for _ in range(n):
        sem.acquire()
    ready.set()
    time.sleep(600)


def test_stopped_latch_holder_keeps_timeouts_and_blocks_no_session_end(m, monkeypatch):
    _fast = _fast_ext()
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")
    stuck, other = m.Semaphore(3), m.BoundedSemaphore(5)
    assert _fast.active(stuck) and _fast.active(other), _fast.reasons
    monkeypatch.setenv("SYNCMGR_FASTPATH", "0")
    stuck_socket = pickle.loads(pickle.dumps(stuck))  # the same Semaphore, on the socket path
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")
    assert not _fast.active(stuck_socket)
    ready, taken = CTX.Event(), CTX.Event()
    holder = CTX.Process(target=_latch_then_stop, args=(stuck, ready))
    ender = CTX.Process(target=_take_and_wait, args=(other, 5, taken))
    holder.start()
    ender.start()
    try:
        assert ready.wait(30) and taken.wait(30)
        assert wait_until(lambda: open(f"/proc/{holder.pid}/stat").read().split(")")[1].split()[0] == "T")
        for sem in (stuck, stuck_socket):
            t0 = time.monotonic()
            assert sem.acquire(blocking=False) is False
            assert time.monotonic() - t0 < 2
            t0 = time.monotonic()
            assert sem.acquire(timeout=0.3) is False
            assert 0.25 < time.monotonic() - t0 < 3
        # Another session ends while the latch is held: its units in
        # every other semaphore come back now.
        os.kill(ender.pid, signal.SIGKILL)
        ender.join(30)
        t0 = time.monotonic()
        assert all(other.acquire(timeout=10) for _ in range(5))
        assert time.monotonic() - t0 < 10
        for _ in range(5):
            other.release()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
        if ender.is_alive():
            ender.kill()
    # The holder's session ended: the daemon takes its latch over.
    assert all(stuck.acquire(timeout=10) for _ in range(3))
    assert stuck.acquire(blocking=False) is False


@pytest.mark.parametrize("latch", ["no session's slot", "2**29-1"])
def test_stray_latch_is_taken_over_at_once(m, monkeypatch, latch):
    from conftest import segment_fd

    _fast = _fast_ext()
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")
    sem = m.Semaphore(2)
    assert _fast.active(sem), _fast.reasons
    h = _fast.handle(sem)
    fd = segment_fd(m._c().address, m._c()._key)
    try:
        (word,) = struct.unpack("<Q", os.pread(fd, 8, h.off))
        value = 54321 if latch == "no session's slot" else (1 << 29) - 1
        os.pwrite(fd, struct.pack("<Q", word | value << 32), h.off)
        t0 = time.monotonic()
        assert sem.acquire(timeout=0.3) is True
        assert sem.acquire(blocking=False) is True
        assert time.monotonic() - t0 < 2
        assert sem.acquire(blocking=False) is False
        sem.release()
        sem.release()
        (word,) = struct.unpack("<Q", os.pread(fd, 8, h.off))
        assert word >> 32 == 0 and word & ((1 << 29) - 1) == 2
    finally:
        os.close(fd)


def test_segment_cannot_be_resized(m, monkeypatch):
    from conftest import segment_fd

    _fast = _fast_ext()
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")
    lock = m.Lock()
    assert _fast.active(lock), _fast.reasons
    lock.acquire()
    fd = segment_fd(m._c().address, m._c()._key)
    try:
        size = os.fstat(fd).st_size
        for n in (0, 64, size * 2):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, n)
        assert os.fstat(fd).st_size == size
    finally:
        os.close(fd)
    assert lock.acquire(blocking=False) is False  # the daemon and the words are intact
    lock.release()
    assert lock.acquire(blocking=False) is True
    lock.release()


def test_client_of_one_daemon_never_maps_anothers_segment(monkeypatch):
    """A process connected to daemon A whose socket path now leads to daemon
    B (A's directory was emptied, B started there): its fast path, attached
    through the path, is B's, and A's offsets are never used in it."""
    import subprocess

    import syncmgr
    from conftest import BIN, start_daemon

    _fast = _fast_ext()
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")
    a = start_daemon()
    b = None
    moved = ""
    try:
        m = syncmgr.connect(a.address, a.key)
        m.dict()  # a pooled connection to A, and no fast path yet
        moved = os.path.join(os.path.dirname(os.path.dirname(a.address)), os.path.basename(a.dir) + ".moved")
        os.rename(a.address, moved)  # A still serves its connections; the path is free
        for f in os.listdir(a.dir):
            os.unlink(os.path.join(a.dir, f))
        env = dict(os.environ, SYNCMGR_AUTHKEY=a.key.hex())
        b = subprocess.Popen([BIN, "serve", "--socket", a.address, "--shm-dir", "none"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_until(lambda: os.path.exists(a.address))
        mb = syncmgr.connect(a.address, a.key)
        assert wait_until(lambda: _ping(mb))
        held_in_b = mb.Lock()  # B's first Lock: the very slot and tag of A's first Lock
        held_in_b.acquire()
        lock = m.Lock()  # A's first Lock, free
        assert not _fast.active(lock)
        assert lock.acquire(blocking=False) is True
        assert lock.acquire(blocking=False) is False
        lock.release()
        assert held_in_b.acquire(blocking=False) is False
    finally:
        if b is not None:
            b.kill()
            b.wait(10)
        a.close()
        if os.path.exists(moved):
            os.unlink(moved)


def _ping(m) -> bool:
    try:
        m.status(limit=1)
        return True
    except Exception:
        return False


def test_offsets_from_another_daemon_run_are_never_used(m, monkeypatch):
    """The check behind the test above, made certain: a fastpath_ref reply
    that names another daemon run than the one whose segment is mapped (the
    offset and tag of a live object there, as a daemon restarted on the path
    could answer) is not used."""
    _fast = _fast_ext()
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")
    lock = m.Lock()
    assert _fast.active(lock), _fast.reasons
    fp = _fast.path_for(m._c())
    real = fp.client.call("fastpath_ref", {"kind": "lock", "name": lock._name})
    assert real["run"] == fp.run_id and fp.ref("lock", lock._name) == (real["off"], real["tag"])
    # Nor does a create reply's copy of it (noted for the first op), nor a
    # word this process was told of before (the cache is per run: forget
    # it, and ask again).
    fp.refs.clear()
    fp.note("lock", lock._name, dict(real, run="another-run"))
    assert ("lock", lock._name) not in fp.refs
    monkeypatch.setattr(fp.client, "call", lambda op, args: dict(real, run="another-run"))
    assert fp.ref("lock", lock._name) is None
