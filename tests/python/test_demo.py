"""The main job: the Ray + cpprb replay demo, in short settings, with its output checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("ray")
pytest.importorskip("gymnasium")


def test_demo_runs_and_reports():
    env = dict(os.environ)
    for k in ("SYNCMGR_ADDRESS", "SYNCMGR_AUTHKEY"):
        env.pop(k, None)  # the demo starts its own embedded daemon
    before = {f for f in os.listdir("/dev/shm") if f.startswith("syncmgr-")}
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", "ray_replay_demo.py"),
                          "--explorers", "2", "--steps", "1500", "--buffer-size", "5000", "--quiet"],
                         capture_output=True, text=True, env=env, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "demo finished OK" in out.stdout
    added = int(re.search(r"transitions added\s+(\d+)", out.stdout).group(1))
    stored = int(re.search(r"stored in buffer\s+(\d+)", out.stdout).group(1))
    assert added == stored == 3000
    assert int(re.search(r"samples drawn\s+(\d+)", out.stdout).group(1)) > 0
    after = {f for f in os.listdir("/dev/shm") if f.startswith("syncmgr-")}
    assert not (after - before)
