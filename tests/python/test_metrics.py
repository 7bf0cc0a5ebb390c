"""`syncmgr serve --metrics`: Prometheus metrics that move while clients
work, a health endpoint that says nothing else, loopback unless allowed."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import syncmgr
from conftest import BIN, start_daemon


def _endpoint(d) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(d.log) as f:
            m = re.search(r'"metrics":"(http://127\.0\.0\.1:\d+)/metrics"', f.read())
        if m:
            return m.group(1)
        time.sleep(0.02)
    raise AssertionError("the daemon did not log its metrics address")


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def _value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def _metrics_once(base: str, series: str, want: float) -> str:
    """The metrics page once series reads want (asserted, within 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        _, _, text = _get(base + "/metrics")
        if _value(text, series) == want or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert _value(text, series) == want, text
    return text


@pytest.fixture
def daemon():
    d = start_daemon("--metrics", "127.0.0.1:0", "--log-format", "json", "--log-level", "info")
    yield d
    d.stop()


def test_metrics_move_during_a_run(daemon, monkeypatch):
    # Op counters count what the daemon serves: this test's clients use the
    # socket path (fast-path ops never reach the daemon; see the next tests).
    monkeypatch.setenv("SYNCMGR_FASTPATH", "0")
    base = _endpoint(daemon)
    status, ctype, before = _get(base + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert "process_resident_memory_bytes" in before and "go_goroutines" in before

    m = syncmgr.connect(daemon.address, daemon.key)
    locks = [m.Lock() for _ in range(3)]
    q = m.Queue()
    seg = m.SharedMemory(create=True, size=1 << 20)
    got: list = []
    t = threading.Thread(target=lambda: got.append(q.get(timeout=30)))
    t.start()
    deadline = time.monotonic() + 10
    while True:  # the blocked get shows as a waiter on a queue
        _, _, during = _get(base + "/metrics")
        if _value(during, 'syncmgr_waiters{kind="queue"}') == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert _value(during, 'syncmgr_waiters{kind="queue"}') == 1, during
    assert _value(during, 'syncmgr_objects{kind="lock"}') == 3
    assert _value(during, 'syncmgr_objects{kind="queue"}') == 1
    assert _value(during, "syncmgr_sessions") >= 1
    assert _value(during, "syncmgr_shm_bytes") >= 1 << 20
    assert _value(during, "syncmgr_shm_segments") == 1
    q.put("go")
    t.join(10)
    assert got == ["go"]
    for lk in locks:
        assert lk.acquire(timeout=5)
        lk.release()

    # Counters: ops by kind, op and result; connections; handshake failures;
    # a lock held by a client that dies is released, counted and logged.
    with pytest.raises(syncmgr.AuthenticationError):
        syncmgr.connect(daemon.address, b"wrong key").Event()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, syncmgr; m = syncmgr.connect(sys.argv[1], bytes.fromhex(sys.argv[2])); "
        "m.Lock(name='held-by-the-dead').acquire(); print('held', flush=True); sys.stdin.read()"),
        daemon.address, daemon.key.hex()], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    holder.kill()
    holder.wait(10)
    after = _metrics_once(base, 'syncmgr_dead_holder_releases_total{kind="lock"}', 1)
    assert _value(after, 'syncmgr_hold_seconds_count{kind="lock"}') >= 1
    assert _value(after, 'syncmgr_ops_total{kind="lock",op="acquire",result="ok"}') >= 3
    assert _value(after, 'syncmgr_ops_total{kind="queue",op="get",result="ok"}') >= 1
    assert _value(after, 'syncmgr_ops_total{kind="queue",op="put",result="ok"}') >= 1
    assert _value(after, 'syncmgr_ops_total{kind="server",op="create",result="ok"}') >= 5
    assert _value(after, 'syncmgr_connections_total{transport="unix"}') > _value(
        before, 'syncmgr_connections_total{transport="unix"}')
    assert _value(after, 'syncmgr_handshake_failures_total{reason="auth",transport="unix"}') >= 1
    with open(daemon.log) as f:
        log = f.read()
    assert '"message":"released a hold of a client that went away"' in log and '"name":"held-by-the-dead"' in log
    seg.close()
    seg.unlink()
    _, _, after = _get(base + "/metrics")
    assert _value(after, 'syncmgr_waiters{kind="queue"}') == 0
    assert _value(after, "syncmgr_shm_bytes") == 0


def test_health_endpoint_reveals_nothing(daemon):
    base = _endpoint(daemon)
    status, ctype, body = _get(base + "/healthz")
    assert (status, body) == (200, "ok\n") and ctype.startswith("text/plain")
    with pytest.raises(urllib.error.HTTPError) as e:
        _get(base + "/")
    assert e.value.code == 404


@pytest.mark.parametrize("addr", ["0.0.0.0:0", ":9464", "[::]:0"])
def test_metrics_refuse_non_loopback_without_the_flag(addr):
    r = subprocess.run([BIN, "serve", "--socket", "none", "--tcp", "127.0.0.1:0", "--metrics", addr],
                       env={"SYNCMGR_AUTHKEY": "00" * 32}, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert "not a loopback address" in r.stderr and "--metrics-allow-remote" in r.stderr


def test_connections_and_handshake_failures_by_transport():
    d = start_daemon("--metrics", "127.0.0.1:0", "--tcp", "127.0.0.1:0", "--log-format", "json",
                     "--log-level", "info")
    try:
        base = _endpoint(d)
        with open(d.log) as f:
            port = re.search(r'"tcp":"127\.0\.0\.1:(\d+)"', f.read()).group(1)
        tcp = f"tcp://127.0.0.1:{port}"
        m = syncmgr.connect(tcp, d.key)
        m.Event().set()
        with pytest.raises(syncmgr.AuthenticationError):
            syncmgr.connect(tcp, b"not the key").Event()
        # (The daemon counts the failure just after sending its answer.)
        text = _metrics_once(base, 'syncmgr_handshake_failures_total{reason="auth",transport="tcp"}', 1)
        assert _value(text, 'syncmgr_connections{transport="tcp"}') == 1
        assert _value(text, 'syncmgr_connections_total{transport="tcp"}') == 1
        assert _value(text, 'syncmgr_handshake_failures_total{reason="auth",transport="tcp"}') == 1
        assert _value(text, 'syncmgr_ops_total{kind="event",op="set",result="ok"}') == 1
    finally:
        d.stop()


def test_fast_path_attaches_are_counted(daemon, monkeypatch):
    """The daemon cannot see uncontended fast-path ops (that is the point);
    it counts what it does see: attaches and word references, and refusals
    (which send a client to the socket path) by result."""
    from syncmgr import _fast

    base = _endpoint(daemon)
    _, _, before = _get(base + "/metrics")
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")
    m = syncmgr.connect(daemon.address, daemon.key)
    lock = m.Lock()
    if not _fast.active(lock):
        pytest.skip(f"fast path not available here: {_fast.reasons.get(daemon.address, 'no extension')}")
    assert lock.acquire(timeout=5)
    lock.release()
    # An op is counted just after its reply is written: wait for the count.
    for op in ("fastpath_attach", "fastpath_ref"):
        series = f'syncmgr_ops_total{{kind="server",op="{op}",result="ok"}}'
        deadline = time.monotonic() + 10
        while True:
            _, _, after = _get(base + "/metrics")
            if _value(after, series) >= _value(before, series) + 1 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert _value(after, series) >= _value(before, series) + 1, series


def test_fast_path_dead_holder_is_counted_with_its_hold_time(daemon, monkeypatch):
    """A lock taken by compare-and-swap and held by a process that dies is
    released by the daemon, counted and logged, with the hold time the
    client stamped in the word's slot."""
    from syncmgr import _fast

    if _fast._ext is None:
        pytest.skip("fast path not built")
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")
    base = _endpoint(daemon)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, syncmgr; from syncmgr import _fast; "
        "m = syncmgr.connect(sys.argv[1], bytes.fromhex(sys.argv[2])); lk = m.Lock(name='fast-dead'); "
        "assert _fast.active(lk); lk.acquire(); print('held', flush=True); sys.stdin.read()"),
        daemon.address, daemon.key.hex()], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    time.sleep(0.2)
    holder.kill()
    holder.wait(10)
    after = _metrics_once(base, 'syncmgr_dead_holder_releases_total{kind="lock"}', 1)
    assert _value(after, 'syncmgr_hold_seconds_count{kind="lock"}') == 1
    assert _value(after, 'syncmgr_hold_seconds_sum{kind="lock"}') >= 0.2
    with open(daemon.log) as f:
        log = f.read()
    assert '"name":"fast-dead"' in log and '"held_seconds"' in log


def test_each_queue_shows_its_depth_bytes_and_waiters(daemon, monkeypatch):
    """Per-queue gauges: items and bytes put by a same-host client into the
    queue's ring, and a same-host getter asleep on another queue's ring (the
    daemon sees neither op; it reads the ring)."""
    from syncmgr import _fast

    base = _endpoint(daemon)
    monkeypatch.setenv("SYNCMGR_FASTPATH", "1")
    m = syncmgr.connect(daemon.address, daemon.key)
    full, empty = m.Queue(name="metrics-full"), m.Queue(name="metrics-empty")
    if not _fast.active(full):
        pytest.skip(f"fast path not available here: {_fast.reasons.get(daemon.address, 'no extension')}")
    for x in (b"x" * 1000, "two", 3):
        full.put(x)
    text = _metrics_once(base, 'syncmgr_queue_depth_items{kind="queue",name="metrics-full"}', 3)
    assert _value(text, 'syncmgr_queue_depth_bytes{kind="queue",name="metrics-full"}') >= 1000
    waiter = threading.Thread(target=lambda: empty.get(timeout=30), daemon=True)
    waiter.start()
    _metrics_once(base, 'syncmgr_queue_waiters{kind="queue",name="metrics-empty"}', 1)
    full.put("wake")  # another queue: the waiter stays
    empty.put("wake")
    waiter.join(10)
    assert not waiter.is_alive()
    _metrics_once(base, 'syncmgr_queue_waiters{kind="queue",name="metrics-empty"}', 0)
    _metrics_once(base, 'syncmgr_queue_depth_items{kind="queue",name="metrics-full"}', 4)
