"""Hostile and unlucky conditions seen from Python: the key never leaks,
other users are refused, and resource exhaustion costs only the asker."""

from __future__ import annotations

import os
import pickle
import resource
import shutil
import socket
import subprocess
import tempfile

import pytest

import syncmgr
from conftest import BIN, start_daemon, start_daemon_proc, wait_until


def _leaks(key: bytes, blob: bytes) -> bool:
    return key in blob or key.hex().encode() in blob or key.hex().upper().encode() in blob


def test_key_never_appears_in_logs_status_errors_cmdline_or_pickles():
    d = start_daemon("--log-level", "debug")
    try:
        m = syncmgr.connect(d.address, d.key)
        lock = m.Lock()
        with pytest.raises(syncmgr.AuthenticationError) as ei:
            syncmgr.connect(d.address, bytes(b ^ 0xFF for b in d.key)).Lock()  # every byte differs
        assert not _leaks(d.key, str(ei.value).encode())
        assert not _leaks(d.key, repr(m.status()).encode())
        assert not _leaks(d.key, pickle.dumps((lock, m)))
        with open(f"/proc/{d.proc.pid}/cmdline", "rb") as f:
            assert not _leaks(d.key, f.read())
        out = subprocess.run([BIN, "status", "--address", d.address], capture_output=True, timeout=30, check=False,
                             env=dict(os.environ, SYNCMGR_AUTHKEY=d.key.hex()))
        assert out.returncode == 0 and not _leaks(d.key, out.stdout + out.stderr)
    finally:
        d.stop()
    with open(d.log, "rb") as f:
        log = f.read()
    assert b"authentication failed" in log  # the failure is logged ...
    assert not _leaks(d.key, log)  # ... without the key


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")


def _status_as_nobody(d) -> subprocess.CompletedProcess:
    """`syncmgr status` (a Go client) run as uid 65534 with the right key."""

    def demote():
        os.setgid(65534)
        os.setuid(65534)

    return subprocess.run([BIN, "status", "--address", d.address], capture_output=True, timeout=60, check=False,
                          env={"SYNCMGR_AUTHKEY": d.key.hex(), "PATH": "/usr/bin:/bin"}, preexec_fn=demote)


@needs_root
@pytest.mark.parametrize("allow", [False, True])
def test_other_users_are_refused_even_with_the_key(allow):
    d = start_daemon(*(["--allow-other-users"] if allow else []))
    try:
        os.chmod(os.path.dirname(d.address), 0o755)
        os.chmod(d.address, 0o666)  # as if a user loosened the permissions
        out = _status_as_nobody(d)
        if allow:
            assert out.returncode == 0, out.stderr.decode()
            assert b"SESSION" in out.stdout
        else:
            assert out.returncode != 0
            assert b"authentication failed" in out.stderr and b"another user" in out.stderr
    finally:
        d.stop()


def test_file_descriptor_limit_costs_only_new_connections():
    d = tempfile.mkdtemp(prefix="smfd", dir="/tmp")
    key = os.urandom(32)
    sock_path = os.path.join(d, "s.sock")

    def limit_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))

    proc = subprocess.Popen([BIN, "serve", "--socket", sock_path, "--log-level", "error", "--shm-dir", "none"],
                            env=dict(os.environ, SYNCMGR_AUTHKEY=key.hex()), preexec_fn=limit_fds,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    raw = []
    try:

        assert wait_until(lambda: os.path.exists(sock_path), timeout=15)
        m = syncmgr.connect(sock_path, key)
        q = m.Queue()
        q.put("before")
        for _ in range(80):  # far more than the daemon may open
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock_path)
            raw.append(s)
        q.put("during")  # an established client is still served
        assert q.get(timeout=10) == "before" and q.get(timeout=10) == "during"
        for s in raw:
            s.close()
        raw.clear()
        assert wait_until(lambda: _can_connect(sock_path, key), timeout=30)
    finally:
        for s in raw:
            s.close()
        proc.terminate()
        proc.wait(15)
        shutil.rmtree(d, ignore_errors=True)


def _can_connect(path: str, key: bytes) -> bool:
    try:
        syncmgr.connect(path, key)._c().call("ping", {})
        return True
    except syncmgr.SyncMgrError:
        return False


@pytest.fixture
def tiny_tmpfs():
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    d = tempfile.mkdtemp(prefix="smshm", dir="/tmp")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d], check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield d
    subprocess.run(["umount", d], check=False)
    os.rmdir(d)


def test_full_shared_memory_is_a_clear_error(tiny_tmpfs):
    d = start_daemon("--shm-dir", tiny_tmpfs, "--shm-limit", "0")
    try:
        m = syncmgr.connect(d.address, d.key)
        other = syncmgr.connect(d.address, d.key)
        ev = other.Event(name="bystander")
        a = m.SharedMemory(create=True, size=600 << 10)
        with pytest.raises(syncmgr.SyncMgrError) as ei:
            m.SharedMemory(create=True, size=600 << 10)
        assert isinstance(ei.value, OSError) and ei.value.code == "no_space"
        ev.set()  # everyone else is still served
        assert ev.is_set()
        a.buf[-1] = 1  # the reserved pages are really there: no SIGBUS
        a.close()
        a.unlink()
        m.SharedMemory(create=True, size=600 << 10)
    finally:
        d.stop()


def test_restart_keeps_serving_named_objects_after_sigkill():
    d = start_daemon()
    try:
        m = syncmgr.connect(d.address, d.key)
        m.Value("i", 5, name="counter")
        d.kill()
        start_daemon_proc(d)
        v = m.Value("i", 0, name="counter")  # state is lost: documented
        assert v.value == 0 and v.add(1) == 1
    finally:
        d.stop()


def test_tls_over_tcp(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    import re
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    d = start_daemon("--tcp", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key), "--log-format", "json",
                     "--log-level", "info")
    try:
        def listening() -> re.Match[str] | None:
            with open(d.log) as f:
                return re.search(r'"tcp":"127\.0\.0\.1:(\d+)"', f.read())

        assert wait_until(lambda: listening() is not None), "the daemon never logged its TCP address"
        port = listening().group(1)  # type: ignore[union-attr]
        addr = f"tcp://127.0.0.1:{port}"
        ctx = ssl.create_default_context(cafile=str(cert))
        m = syncmgr.connect(addr, d.key, ssl_context=ctx)
        ev = m.Event()
        ev.set()
        assert ev.is_set()
        # Items of many records each way (a send is encrypted and written
        # 256 KiB at a time, a read takes what the socket has), batches,
        # and small calls in between, in order.
        q = m.Queue()
        big = [os.urandom(n) for n in (5 << 20, 1, 300 << 10, 0, (1 << 20) + 7)]
        for i, item in enumerate(big):
            q.put(item)
            assert q.qsize() == i + 1
        assert [q.get(timeout=10) for _ in big] == big
        q.put_many([b"x" * 100] * 64)
        assert q.get_many(64) == [b"x" * 100] * 64
        with pytest.raises(syncmgr.ConnectError):  # a client that does not trust the certificate
            syncmgr.connect(addr, d.key, ssl_context=ssl.create_default_context()).Event()
        d.kill()  # the peer gone mid-connection: the client says the daemon is gone, not a TLS error
        with pytest.raises(syncmgr.SyncMgrError) as ei:
            ev.is_set()
        assert not isinstance(ei.value, ssl.SSLError)
    finally:
        d.stop()


def test_tls_stream_reads_what_a_peer_sent_then_its_close(tmp_path):
    """The client's TLS stream against a plain TLS peer: records that came
    together are read without waiting on the socket, a close_notify reads
    as 0 bytes, and so does every read after it, at once, while the peer
    keeps its TCP side open."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    import ssl
    import threading

    from syncmgr._tls import TLSStream

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(str(cert), str(key))
    a, b = socket.socketpair()
    done = threading.Event()

    def serve() -> None:
        with server_ctx.wrap_socket(b, server_side=True) as s:
            s.sendall(b"hello")
            s.sendall(b" world")
            try:
                s.unwrap()  # close_notify, then a wait for the client's, which never comes
            except OSError:
                pass  # (the client's socket closed at the end of the test)
            done.wait(10)

    t = threading.Thread(target=serve)
    t.start()
    try:
        client_ctx = ssl.create_default_context(cafile=str(cert))
        client_ctx.check_hostname = False
        stream = TLSStream(a, client_ctx)
        stream.settimeout(5)
        buf, got = bytearray(64), b""
        while len(got) < 11:
            n = stream.recv_into(memoryview(buf))
            assert n > 0
            got += bytes(buf[:n])
        assert got == b"hello world"
        for _ in range(3):
            assert stream.recv_into(memoryview(buf)) == 0
    finally:
        done.set()
        a.close()  # (the peer's unwrap waits for it)
        t.join(10)
        assert not t.is_alive()
