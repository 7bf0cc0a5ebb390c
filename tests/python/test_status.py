"""`syncmgr status`: who waits on what and for how long, how long locks
are held, as tables and as JSON, against the real daemon."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import syncmgr
from conftest import BIN


def _status(d, *args: str) -> str:
    env = dict(os.environ, SYNCMGR_AUTHKEY=d.key.hex())
    r = subprocess.run([BIN, "status", "--address", d.address, *args], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_status_shows_waiters_and_hold_times(daemon):
    m = syncmgr.connect(daemon.address, daemon.key)
    lock = m.Lock(name="ingest")
    q = m.Queue(name="jobs")
    assert lock.acquire(timeout=5)
    results: list = []
    waiters = [threading.Thread(target=lambda: results.append(lock.acquire(timeout=30))),
               threading.Thread(target=lambda: results.append(q.get(timeout=30)))]
    for t in waiters:
        t.start()
    deadline = time.monotonic() + 10
    while True:
        st = json.loads(_status(daemon, "--json"))
        if len(st["waiting"]) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(0.3)
    st = json.loads(_status(daemon, "--json"))
    waits = {(w["kind"], w["name"], w["op"]): w for w in st["waiting"]}
    assert set(waits) == {("lock", "ingest", "acquire"), ("queue", "jobs", "get")}, st["waiting"]
    assert all(w["for"] >= 0.3 for w in waits.values()), waits
    sessions = {s["id"] for s in st["sessions"]}
    assert all(w["session"] in sessions for w in waits.values())
    objs = {o["name"]: o for o in st["objects"]}
    assert objs["ingest"]["held_for"] >= 0.3 and objs["ingest"]["waiters"] == 1
    assert "held_for" not in objs["jobs"]

    table = _status(daemon)
    assert "WAITING" in table and "lock ingest" in table and "queue jobs" in table
    assert "HELD FOR" in table
    lock.release()
    q.put("job")
    for t in waiters:
        t.join(10)
    assert sorted(map(str, results)) == ["True", "job"]
    st = json.loads(_status(daemon, "--json"))
    assert st["waiting"] == []
