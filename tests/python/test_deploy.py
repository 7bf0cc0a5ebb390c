"""deploy/: the systemd unit and the container recipe start a working daemon.

There is no systemd (as PID 1) and no container engine in the test machine,
so each test runs the unit's (or the image's) command line by hand, with the
paths systemd or the image provide replaced by private ones, and
``systemd-analyze verify`` checks the unit file itself where it is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

import syncmgr
from conftest import BIN, REPO

UNIT = os.path.join(REPO, "deploy", "syncmgr.service")
DOCKERFILE = os.path.join(REPO, "deploy", "Dockerfile")


def unit_exec_start() -> list[str]:
    """ExecStart= of the unit as argv (continuation lines joined, comments dropped)."""
    lines, cur = [], ""
    with open(UNIT, encoding="utf-8") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not cur and line.lstrip().startswith(("#", ";")):
                continue
            if line.endswith("\\"):
                cur += line[:-1] + " "
                continue
            lines.append(cur + line)
            cur = ""
    starts = [ln.split("=", 1)[1] for ln in lines if ln.startswith("ExecStart=")]
    assert len(starts) == 1, starts
    return starts[0].split()


def dockerfile_cmd() -> list[str]:
    with open(DOCKERFILE, encoding="utf-8") as f:
        text = f.read()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    return entry + cmd


@pytest.fixture
def root() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="sdp", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run_and_stop(argv: list[str], key: bytes, sock: str) -> None:
    """Start argv, use the daemon from Python, stop it with SIGTERM as systemd and docker do."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCMGR_")}
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while not os.path.exists(sock):
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "daemon did not create its socket"
            time.sleep(0.02)
        m = syncmgr.connect(sock, key)
        lock = m.Lock(name="deploy")
        assert lock.acquire(timeout=5)
        lock.release()
        assert m.status()["server"]["objects"] >= 1
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0, out.decode()
    assert not os.path.exists(sock), "socket left after a graceful stop"
    # --log-format json: every line the daemon wrote is a JSON object.
    for line in out.decode().splitlines():
        json.loads(line)


def test_systemd_unit_command_line_serves_and_stops_cleanly(root):
    """ExecStart as systemd would run it: %d is the credentials directory
    holding the key (mode 0400), /run/syncmgr the RuntimeDirectory (0700)."""
    key = os.urandom(32)
    creds = os.path.join(root, "creds")
    os.mkdir(creds, 0o700)
    keyfile = os.path.join(creds, "authkey")
    with open(os.open(keyfile, os.O_WRONLY | os.O_CREAT, 0o400), "w") as f:
        f.write(key.hex() + "\n")
    run_dir = os.path.join(root, "run")
    os.mkdir(run_dir, 0o700)
    argv = unit_exec_start()
    assert argv[0] == "/usr/local/bin/syncmgr" and argv[1] == "serve"
    assert "%d/authkey" in argv, "the key must come from the credentials directory"
    argv = [BIN] + [a.replace("%d", creds).replace("/run/syncmgr", run_dir) for a in argv[1:]]
    run_and_stop(argv, key, os.path.join(run_dir, "syncmgr.sock"))


def test_container_command_line_serves_and_stops_cleanly(root):
    """ENTRYPOINT + CMD of deploy/Dockerfile, with the secret file and the
    socket volume at private paths."""
    key = os.urandom(32)
    secret = os.path.join(root, "syncmgr_authkey")
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o400), "w") as f:
        f.write(key.hex())
    argv = dockerfile_cmd()
    assert argv[:2] == ["/usr/local/bin/syncmgr", "serve"]
    argv = [BIN] + [a.replace("/run/secrets", root).replace("/run/syncmgr", os.path.join(root, "run"))
                    for a in argv[1:]]
    run_and_stop(argv, key, os.path.join(root, "run", "syncmgr.sock"))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_unit_verifies(root):
    """systemd-analyze verify accepts the unit (ExecStart pointed at the built
    binary, since verify checks that the executable exists)."""
    with open(UNIT, encoding="utf-8") as f:
        text = f.read().replace("/usr/local/bin/syncmgr", BIN)
    path = os.path.join(root, "syncmgr.service")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    r = subprocess.run(["systemd-analyze", "verify", path], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", path], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout)
    assert level and float(level.group(1)) <= 2.5, r.stdout[-500:]
