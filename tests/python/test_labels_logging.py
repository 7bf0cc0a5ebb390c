"""Client labels in `syncmgr status` and the client's logging."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import syncmgr
from conftest import BIN, start_daemon


def _status_json(d) -> dict:
    r = subprocess.run([BIN, "status", "--json", "--address", d.address], capture_output=True, text=True,
                       env=dict(os.environ, SYNCMGR_AUTHKEY=d.key.hex()), timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _hold_in_child(d, code: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code + "\nprint('ready', flush=True)\nimport sys; sys.stdin.read()"],
                         env=d.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    return p


def test_labels_set_from_python_default_and_escaped(daemon):
    named = _hold_in_child(daemon, "import syncmgr; syncmgr.connect(label='trainer-7').Event(name='l1').set()")
    default = _hold_in_child(daemon, "import syncmgr; syncmgr.connect().Event(name='l2').set()")
    forged = _hold_in_child(daemon, "import syncmgr; syncmgr.connect(label='x\\n9  999  1  0  root\\x1b[2J')"
                                    ".Event(name='l3').set()")
    try:
        labels = {s["pid"]: s["label"] for s in _status_json(daemon)["sessions"]}
        assert labels[named.pid] == "trainer-7"
        assert labels[default.pid] == f"python[{default.pid}]"
        assert labels[forged.pid] == "x\n9  999  1  0  root\x1b[2J"  # exact in JSON
        r = subprocess.run([BIN, "status", "--address", daemon.address], capture_output=True, text=True,
                           env=dict(os.environ, SYNCMGR_AUTHKEY=daemon.key.hex()), timeout=30)
        assert "\x1b" not in r.stdout and not any(ln.startswith("9  999") for ln in r.stdout.splitlines())
        assert '"x\\n9  999  1  0  root\\x1b[2J"' in r.stdout
    finally:
        for p in (named, default, forged):
            p.kill()
            p.wait(10)


def test_label_in_a_multiprocessing_child_names_the_process():
    code = ("import multiprocessing as mp, syncmgr\n"
            "def f(q): q.put(syncmgr._handshake.current_label())\n"
            "if __name__ == '__main__':\n"
            "    ctx = mp.get_context('fork'); q = ctx.Queue()\n"
            "    p = ctx.Process(target=f, args=(q,), name='loader-2')\n"
            "    p.start(); print(q.get(timeout=60)); p.join(60)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("python[") and r.stdout.strip().endswith("] loader-2"), r.stdout


def test_client_logs_connects_and_reconnects(caplog):
    caplog.set_level(logging.DEBUG, logger="syncmgr")
    d = start_daemon()  # its readiness check is this process's first connection
    try:
        if True:
            m = syncmgr.connect(d.address, d.key)
            m.Event(name="e").set()
            assert any("connected to syncmgr at " + d.address in r.getMessage() for r in caplog.records)
            d.restart()
            time.sleep(0.6)  # past the client's idle check, so the stale connection is noticed before use
            m.Event(name="e").set()  # the idle connection is stale: reconnect
        msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert any("reconnect" in msg for msg in msgs), msgs
    finally:
        d.stop()


def test_embedded_daemon_warnings_reach_the_user(caplog):
    with caplog.at_level(logging.WARNING, logger="syncmgr.daemon"):
        with syncmgr.Manager(daemon_args=("--tcp", "127.0.0.1:0")) as m:
            m.Event().set()
    warnings = [r.getMessage() for r in caplog.records if r.name == "syncmgr.daemon"]
    assert any("plaintext TCP" in w for w in warnings), warnings
