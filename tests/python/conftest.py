"""Fixtures: the real syncmgr daemon on a private socket, and clients of it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import syncmgr

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("SYNCMGR_BIN") or os.path.join(REPO, "bin", "syncmgr")


@dataclass
class Daemon:
    """A syncmgr daemon process started by a test."""

    address: str
    key: bytes
    proc: subprocess.Popen
    args: list
    log: str

    @property
    def env(self) -> dict:
        """A minimal environment for a fresh interpreter that should reach the daemon."""
        return {"PATH": os.environ.get("PATH", ""), "SYNCMGR_ADDRESS": self.address,
                "SYNCMGR_AUTHKEY": self.key.hex(), "PYTHONPATH": os.pathsep.join(sys.path)}

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return self.proc.returncode

    def restart(self) -> None:
        self.stop()
        start_daemon_proc(self)


def start_daemon_proc(d: Daemon) -> None:
    env = dict(os.environ, SYNCMGR_AUTHKEY=d.key.hex())
    with open(d.log, "ab") as log:
        d.proc = subprocess.Popen([BIN, "serve", "--socket", d.address, "--log-level", "warn", *d.args],
                                  env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if d.proc.poll() is not None:
            raise RuntimeError(f"daemon exited: {open(d.log).read()[-2000:]}")
        try:
            syncmgr.connect(d.address, d.key).status()
            return
        except syncmgr.SyncMgrError:
            time.sleep(0.01)
    raise RuntimeError("daemon did not start")


def start_daemon(*args: str) -> Daemon:
    if not os.access(BIN, os.X_OK):
        raise RuntimeError(f"no daemon binary at {BIN}: run `make build`")
    d = tempfile.mkdtemp(prefix="smt", dir="/tmp")
    daemon = Daemon(os.path.join(d, "s.sock"), os.urandom(32), None, list(args), os.path.join(d, "daemon.log"))
    start_daemon_proc(daemon)
    return daemon


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
    d.stop()
    shutil.rmtree(os.path.dirname(d.address), ignore_errors=True)


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
