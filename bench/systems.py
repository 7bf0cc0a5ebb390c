"""The systems under test, each started privately by the benchmark: the syncmgr daemon (through
the client's ``syncmgr._daemon.PrivateDaemon``), CPython's SyncManager, Redis (optional) and the echo
floor (a raw Unix-socket round trip to a tiny echo process).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import multiprocessing as mp
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from bench.common import REPO, log, on_cleanup, track

# --------------------------------------------------------------------------
# the systems


def find_syncmgr_bin() -> str:
    env = os.environ.get("SYNCMGR_BIN")
    if env and os.access(env, os.X_OK):
        return env
    cand = os.path.join(REPO, "bin", "syncmgr")
    if os.access(cand, os.X_OK):
        return cand
    found = shutil.which("syncmgr")
    if found:
        return found
    raise SystemExit("bench: no syncmgr daemon binary: run `make build` or set SYNCMGR_BIN")


class SyncmgrDaemon:
    """A syncmgr daemon on a private socket, started (and stopped) by the benchmark: the client's own
    ``PrivateDaemon``, registered with the benchmark's child list and clean-ups."""

    def __init__(self, binary: str, label: str = "main") -> None:
        from syncmgr._daemon import PrivateDaemon

        self._d = PrivateDaemon(binary, args=("--shm-dir", "none"), forward_log=False, key_file=False)
        on_cleanup(f"syncmgr daemon ({label})", self.stop)
        self._d.start()
        track(self._d.proc)
        self.address = self._d.address
        self.key = self._d.key

    @property
    def pid(self) -> int:
        assert self._d.proc is not None
        return self._d.proc.pid

    def log_tail(self) -> str:
        return self._d.log_tail()

    def stop(self) -> None:
        self._d.close()


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("peer closed")
        got += k
    return bytes(buf)


def raw_syncmgr_connect(address: str, key: bytes) -> socket.socket:
    """An authenticated connection made from docs/protocol.md alone (no client library)."""
    import msgpack

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(address)
        n = struct.unpack(">I", _read_exact(s, 4))[0]
        hello = msgpack.unpackb(_read_exact(s, n), raw=False)
        ns, nc = hello["nonce"], os.urandom(32)
        auth = {"t": "auth", "version": 1, "nonce": nc, "pid": os.getpid(), "label": "bench",
                "mac": hmac.new(key, b"syncmgr/1 client" + ns + nc, hashlib.sha256).digest()}
        s.sendall(_frame(msgpack.packb(auth, use_bin_type=True)))
        n = struct.unpack(">I", _read_exact(s, 4))[0]
        welcome = msgpack.unpackb(_read_exact(s, n), raw=False)
        if welcome.get("t") != "welcome":
            raise ConnectionError(f"handshake refused: {welcome}")
    except BaseException:
        s.close()
        raise
    s.settimeout(None)
    return s


def start_syncmanager(label: str) -> Any:
    """A SyncManager on a Unix socket. Its server process is started with
    spawn so that it does not inherit this process's memory (numpy, cpprb,
    redis-py): its footprint is the manager's own."""
    from multiprocessing.managers import SyncManager

    d = tempfile.mkdtemp(prefix="smgrbench-", dir="/tmp")
    sm = SyncManager(address=os.path.join(d, "sock"), authkey=os.urandom(32), ctx=mp.get_context("spawn"))
    sm.start()
    track(sm._process)

    def stop() -> None:
        with contextlib.suppress(Exception):
            sm.shutdown()
        shutil.rmtree(d, ignore_errors=True)

    on_cleanup(f"SyncManager ({label})", stop)
    sm.bench_stop = stop  # type: ignore[attr-defined]
    return sm


class RedisServer:
    def __init__(self, label: str = "main") -> None:
        self.dir = tempfile.mkdtemp(prefix="redisbench-", dir="/tmp")
        self.address = os.path.join(self.dir, "redis.sock")
        self.log_path = os.path.join(self.dir, "redis.log")
        with open(self.log_path, "wb") as logf:
            self.proc = track(subprocess.Popen(
                ["redis-server", "--port", "0", "--unixsocket", self.address, "--unixsocketperm", "700",
                 "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", self.dir,
                 "--maxclients", "4096", "--loglevel", "warning"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True))
        on_cleanup(f"redis-server ({label})", self.stop)
        deadline = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited at start")
            if os.path.exists(self.address):
                try:
                    s = socket.socket(socket.AF_UNIX)
                    s.settimeout(2)
                    s.connect(self.address)
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        s.close()
                        break
                    s.close()
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start in 15 s")
            time.sleep(0.01)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self) -> Any:
        import redis

        return redis.Redis(unix_socket_path=self.address, socket_timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


def redis_available(args: argparse.Namespace) -> tuple[bool, str]:
    """Whether Redis columns can be measured; installs with --install-redis."""
    if args.no_redis:
        return False, "Redis skipped (--no-redis)"
    have_server = shutil.which("redis-server") is not None
    try:
        import redis  # noqa: F401

        have_py = True
    except ImportError:
        have_py = False
    if args.install_redis and not have_server:
        log("--install-redis: apt-get install -y redis-server")
        ok = _run_quiet(["apt-get", "install", "-y", "-q", "redis-server"], 600)
        if not ok:
            log("apt-get install failed; running apt-get update first, then again")
            _run_quiet(["apt-get", "update", "-q"], 600)
            _run_quiet(["apt-get", "install", "-y", "-q", "redis-server"], 600)
        have_server = shutil.which("redis-server") is not None
        if have_server:
            # The Debian package starts a system service; this benchmark runs its own.
            _run_quiet(["service", "redis-server", "stop"], 60)
    if args.install_redis and not have_py:
        log(f"--install-redis: {sys.executable} -m pip install redis (the `bench` extra of pyclient lists it)")
        _run_quiet([sys.executable, "-m", "pip", "install", "-q", "redis>=4"], 600)
        try:
            import importlib

            importlib.invalidate_caches()
            import redis  # noqa: F401,F811

            have_py = True
        except ImportError:
            have_py = False
    if not have_server:
        return False, "Redis skipped: no redis-server on PATH (run with --install-redis to apt-get install it)"
    if not have_py:
        return False, "Redis skipped: redis-py is not installed (pip install redis, or --install-redis)"
    return True, ""


def _run_quiet(cmd: list[str], timeout: float) -> bool:
    try:
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"{' '.join(cmd)}: {e}")
        return False
    if r.returncode != 0:
        log(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.decode(errors='replace')[-500:]}")
    return r.returncode == 0


# --------------------------------------------------------------------------
# the floor: an echo process, no protocol

ECHO_SERVER = r"""
import socket, struct, sys, threading
def serve(c):
    hdr = c.recv(4, socket.MSG_WAITALL)
    if len(hdr) < 4:
        return
    (n,) = struct.unpack(">I", hdr)   # message size for this connection
    buf = bytearray(n); view = memoryview(buf)
    while True:
        got = 0
        while got < n:
            k = c.recv_into(view[got:])
            if k == 0:
                return
            got += k
        c.sendall(view)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


class EchoFloor:
    """Ping-pong of fixed-size messages with an echo process: the physical floor."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="echobench-", dir="/tmp")
        self.address = os.path.join(self.dir, "echo.sock")
        self.proc = track(subprocess.Popen([sys.executable, "-c", ECHO_SERVER, self.address],
                                           stdout=subprocess.PIPE, stdin=subprocess.DEVNULL))
        on_cleanup("echo server", self.stop)
        ready = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not ready.startswith(b"ready"):
            raise RuntimeError("echo server did not start")
        self.pid = self.proc.pid
        self._socks: dict[int, socket.socket] = {}

    def pinger(self, size: int) -> Callable[[], None]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(self.address)
        s.sendall(struct.pack(">I", size))
        self._socks[size] = s
        msg = b"\x01" * size
        buf = bytearray(size)
        view = memoryview(buf)

        def ping() -> None:
            s.sendall(msg)
            got = 0
            while got < size:
                got += s.recv_into(view[got:])

        return ping

    def stop(self) -> None:
        for s in self._socks.values():
            with contextlib.suppress(OSError):
                s.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)
