"""The front door (issue 22): a right key is never refused for others' wrong
keys, a ``limit`` answer is tried again within the connect timeout, a
failed fast-path attach is tried again later, ``runtime_env()`` carries no
key, and dead runs' private directories are swept."""

from __future__ import annotations

import base64
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import syncmgr
from conftest import BIN, start_daemon, wait_until
from syncmgr import _conn, _connection, _fast


def _waiting(d) -> int:
    """How many requests wait in the daemon (asked by another process)."""
    out = subprocess.run([BIN, "status", "--json", "--address", d.address], capture_output=True, timeout=60,
                         check=True, env=dict(os.environ, SYNCMGR_AUTHKEY=d.key.hex()))
    return len(json.loads(out.stdout).get("waiting") or [])


def _run_bg(fn, *args):
    box: dict[str, object] = {}

    def run():
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_right_key_is_never_refused_after_others_wrong_keys(monkeypatch):
    d = start_daemon()
    try:
        m = syncmgr.connect(d.address, d.key)
        q = m.Queue()
        wrong = bytes(b ^ 0xFF for b in d.key)
        monkeypatch.setattr(_conn, "CONNECT_TIMEOUT", 0.3)
        answered = slowed = 0
        for _ in range(12):  # past the back-off's start (5 failures)
            try:
                _connection.Connection(d.address, wrong, os.urandom(16)).close()
            except syncmgr.AuthenticationError:
                answered += 1
            except syncmgr.ConnectError:
                slowed += 1  # the answer waits out the back-off
        assert slowed > 0 and answered >= 4, (answered, slowed)
        monkeypatch.setattr(_conn, "CONNECT_TIMEOUT", 10.0)
        # A process connected before: a second connection while its first
        # waits in a get (old daemons: LimitError), and new processes' clients.
        t, box = _run_bg(q.get, True, 30)
        assert wait_until(lambda: _waiting(d) == 1, timeout=30)
        t0 = time.monotonic()
        q.put("x")
        t.join(30)
        assert box.get("result") == "x", box
        for _ in range(5):
            syncmgr.connect(d.address, d.key).status()
        code = "import syncmgr, sys; syncmgr.connect(sys.argv[1], bytes.fromhex(sys.argv[2])).status(); print('ok')"
        out = subprocess.run([sys.executable, "-c", code, d.address, d.key.hex()], capture_output=True, timeout=60)
        assert out.stdout.strip() == b"ok", out.stderr.decode()
        assert time.monotonic() - t0 < 30
    finally:
        d.close()


def _socket_path_queue(m, monkeypatch):
    """A JoinableQueue proxy without the fast path: its gets wait in the
    daemon and so hold a connection (a wait on a queue's ring holds none)."""
    with monkeypatch.context() as mp:
        mp.setenv("SYNCMGR_FASTPATH", "0")
        return m.JoinableQueue()


def test_limit_answer_is_retried_within_the_connect_timeout(monkeypatch):
    """Two gets hold this process's two connections (--max-conns-per-client
    2); a put needs a third: it is refused with limit and tried again until
    another process's put frees one of them. Queues on the socket path,
    whose gets wait in the daemon and so hold a connection."""
    d = start_daemon("--max-conns-per-client", "2")
    try:
        m = syncmgr.connect(d.address, d.key)
        qa, qb = _socket_path_queue(m, monkeypatch), _socket_path_queue(m, monkeypatch)
        qb_pickled = pickle.dumps(qb)  # (pickling asks the daemon: before the connections are taken)
        ta, box_a = _run_bg(qa.get, True, 60)
        tb, box_b = _run_bg(qb.get, True, 60)
        assert wait_until(lambda: _waiting(d) == 2, timeout=30)
        tm, box_m = _run_bg(qa.put, "from main")
        time.sleep(0.5)  # the put is refused and retrying (it cannot succeed before qb's get ends)
        assert "error" not in box_m, box_m  # old clients: LimitError at once
        code = "import pickle, sys; q = pickle.loads(sys.stdin.buffer.read()); q.put('from child'); print('ok')"
        out = subprocess.run([sys.executable, "-c", code], input=qb_pickled, capture_output=True, timeout=60,
                             env=dict(os.environ, SYNCMGR_AUTHKEY=d.key.hex(), SYNCMGR_ADDRESS=d.address))
        assert out.stdout.strip() == b"ok", out.stderr.decode()
        for t in (ta, tb, tm):
            t.join(30)
        assert box_b.get("result") == "from child", box_b
        assert "error" not in box_m, box_m
        assert box_a.get("result") == "from main", box_a
    finally:
        d.close()


@pytest.mark.skipif(not _fast.enabled_by_env(), reason="the fast path is off")
def test_failed_fast_path_attach_is_tried_again(monkeypatch):
    """The attach's extra connection is refused (--max-conns-per-client 2,
    both in use); once connections are free, a new object gets the fast
    path: the failure was not kept for the client's life. (A queue on the
    socket path, whose get waits in the daemon, holding a connection.)"""
    d = start_daemon("--max-conns-per-client", "2")
    try:
        m = syncmgr.connect(d.address, d.key)
        q = _socket_path_queue(m, monkeypatch)
        t, box = _run_bg(q.get, True, 60)
        assert wait_until(lambda: _waiting(d) == 1, timeout=30)
        t0 = time.monotonic()
        first = m.Lock()  # created on a second connection; the attach needs a third
        assert not _fast.active(first)
        assert "connections" in _fast.reasons.get(d.address, ""), _fast.reasons
        assert time.monotonic() - t0 < _connection.CONNECT_TIMEOUT  # the attach does not wait out the cap
        q.put(1)
        t.join(30)
        assert box.get("result") == 1, box
        m._client.close()  # idle connections go: room for the attach
        assert wait_until(lambda: _fast.active(m.Lock()), timeout=30, interval=0.1)
    finally:
        d.close()


def _forms(key: bytes) -> list[bytes]:
    return [key, key.hex().encode(), key.hex().upper().encode(), base64.b64encode(key),
            base64.urlsafe_b64encode(key), base64.b32encode(key)]


def test_runtime_env_carries_a_key_file_never_the_key(monkeypatch):
    # An embedded manager: the 0600 key file beside its socket.
    monkeypatch.delenv("SYNCMGR_AUTHKEY", raising=False)
    monkeypatch.delenv("SYNCMGR_AUTHKEY_FILE", raising=False)
    with syncmgr.Manager() as m:
        key = m._authkey
        assert key
        renv = m.runtime_env()
        blob = json.dumps(renv).encode() + repr(renv).encode() + pickle.dumps(renv)
        assert not any(f in blob for f in _forms(key)), renv
        env = renv["env_vars"]
        assert "SYNCMGR_AUTHKEY" not in env
        st = os.stat(env["SYNCMGR_AUTHKEY_FILE"])
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.getuid()
        # A worker with only these variables reaches the daemon.
        ev = m.Event()
        ev.set()
        code = "import pickle, sys; ev = pickle.loads(sys.stdin.buffer.read()); print(ev.is_set())"
        worker_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path), **env}
        out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(ev), capture_output=True,
                             env=worker_env, timeout=60)
        assert out.stdout.strip() == b"True", out.stderr.decode()
    # A manager connected with a key given in code (no file anywhere): it
    # writes one, private, and removes it at shutdown.
    d = start_daemon()
    try:
        m = syncmgr.connect(d.address, d.key)
        renv = m.runtime_env()
        blob = json.dumps(renv).encode() + pickle.dumps(renv)
        assert not any(f in blob for f in _forms(d.key)), renv
        path = renv["env_vars"]["SYNCMGR_AUTHKEY_FILE"]
        assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
        assert m.runtime_env() == renv  # one file per manager
        worker_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path),
                      **renv["env_vars"]}
        code = "import syncmgr; syncmgr.connect().status(); print('ok')"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, env=worker_env, timeout=60)
        assert out.stdout.strip() == b"ok", out.stderr.decode()
        m.shutdown()
        assert not os.path.exists(path)
    finally:
        d.close()


_EMBEDDED = """
import os, sys, syncmgr
m = syncmgr.Manager()
m.start()
q = m.Queue()
print(os.path.dirname(m.address), m.pid, flush=True)
sys.stdin.read()  # until killed
"""


def test_dead_runs_private_directories_are_swept():
    """A process with an embedded daemon is SIGKILLed: its daemon exits
    with it and its directory (socket, key, log) is left. The next
    embedded manager of the user removes it, and never a live run's."""
    tmp = tempfile.mkdtemp(prefix="smsw", dir="/tmp")
    env = dict(os.environ, TMPDIR=tmp, SYNCMGR_BIN=BIN)
    for k in ("SYNCMGR_ADDRESS", "SYNCMGR_AUTHKEY", "SYNCMGR_AUTHKEY_FILE"):
        env.pop(k, None)
    procs = []
    try:
        dirs = []
        for _ in range(2):
            p = subprocess.Popen([sys.executable, "-c", _EMBEDDED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 env=env)
            procs.append(p)
            assert p.stdout is not None
            line = p.stdout.readline().split()
            dirs.append((line[0].decode(), int(line[1])))
        (dead_dir, dead_daemon), (live_dir, _) = dirs
        assert os.path.exists(os.path.join(dead_dir, "syncmgr.key"))
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(30)
        # Its daemon exits with its parent (--exit-with-parent).
        assert wait_until(lambda: not os.path.exists(f"/proc/{dead_daemon}") or
                          open(f"/proc/{dead_daemon}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", timeout=30)
        assert os.path.isdir(dead_dir)  # nobody removed it
        # Never swept: a directory without an owner record, and (as root) one
        # of another uid whose recorded owner is just as dead.
        no_record = os.path.join(tmp, "syncmgr-norecord")
        os.mkdir(no_record, 0o700)
        others = os.path.join(tmp, "syncmgr-otheruser")
        if os.geteuid() == 0:
            os.mkdir(others, 0o700)
            with open(os.path.join(others, "owner"), "w") as f:
                f.write(open(os.path.join(dead_dir, "owner")).read())
            os.chown(os.path.join(others, "owner"), 64002, 64002)
            os.chown(others, 64002, 64002)
        code = "import syncmgr\nwith syncmgr.Manager() as m: m.Lock()\nprint('ok')"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=60)
        assert out.stdout.strip() == b"ok", out.stderr.decode()
        assert not os.path.exists(dead_dir)
        assert os.path.exists(os.path.join(live_dir, "syncmgr.key"))  # a live run's stays
        assert os.path.exists(os.path.join(live_dir, "syncmgr.sock"))
        assert os.path.isdir(no_record)
        assert os.geteuid() != 0 or os.path.isdir(others)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        subprocess.run(["rm", "-rf", tmp], check=False)


def test_client_falls_back_for_daemons_without_ready(tmp_path):
    """A daemon older than the ready frame (its hello does not say it reads
    one, and it takes the first frame for the auth): the client drops the
    first connection and connects again without ready, once per address."""
    import hashlib
    import hmac
    import socket
    import struct

    import msgpack

    key = os.urandom(32)
    path = str(tmp_path / "old.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    seen: list[str] = []

    def frame_of(obj) -> bytes:
        b = msgpack.packb(obj, use_bin_type=True)
        return struct.pack(">I", len(b)) + b

    def read_frame(c):
        head = c.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return None
        (n,) = struct.unpack(">I", head)
        return msgpack.unpackb(c.recv(n, socket.MSG_WAITALL), raw=False)

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            try:
                answer(c)
            except OSError:
                pass  # the client went first (it drops the connection after a hello without ready)
            finally:
                c.close()

    def answer(c):
        ns = os.urandom(32)
        c.sendall(frame_of({"t": "hello", "versions": [1], "nonce": ns, "max_frame": 1 << 20, "server": "old"}))
        a = read_frame(c)
        seen.append(a.get("t", "") if isinstance(a, dict) else "?")
        if not isinstance(a, dict) or a.get("t") != "auth":
            c.sendall(frame_of({"t": "error", "code": "bad_request", "message": "expected an auth message"}))
            return
        mac = hmac.new(key, b"syncmgr/1 client" + ns + a["nonce"], hashlib.sha256).digest()
        assert hmac.compare_digest(mac, a["mac"])
        smac = hmac.new(key, b"syncmgr/1 server" + a["nonce"] + ns, hashlib.sha256).digest()
        c.sendall(frame_of({"t": "welcome", "mac": smac, "session": a["session"], "conn": 1}))
        read_frame(c)  # until the client goes

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        for _ in range(2):
            _connection.Connection(path, key, os.urandom(16)).close()
        assert seen == ["ready", "auth", "auth"], seen
    finally:
        srv.close()
