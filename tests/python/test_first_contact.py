"""What a new user meets first: named proxies across a daemon restart, the
errors of a graceful stop, of containers, queues and segments, the key's
forms, and an error that names the fix for each common mistake. The suite
runs on the fast path and again with it off (make test-py-socket): each
test here holds on both."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time

import pytest

import syncmgr
from conftest import start_daemon, start_daemon_proc, wait_until
from syncmgr import _fast

FAST = _fast.enabled_by_env()


@pytest.fixture
def fresh():
    """A daemon of its own (tests here kill, restart and stop it)."""
    d = start_daemon()
    yield d
    d.close()


def test_named_proxies_work_again_after_a_restart_and_start_empty(fresh):
    m = syncmgr.connect(fresh.address, fresh.key)
    lock, q = m.Lock(name="nl"), m.Queue(maxsize=2, name="nq")
    ev, val, d = m.Event(name="ne"), m.Value("i", 7, name="nv"), m.dict(name="nd")
    sem, jq = m.Semaphore(2, name="ns"), m.JoinableQueue(name="njq")
    q.put("before")
    ev.set()
    val.value = 99
    d["k"] = 1
    assert sem.acquire(timeout=5)
    fresh.kill()
    start_daemon_proc(fresh)
    # Every proxy works at once, with the object created again, empty, with
    # the parameters it was made with.
    assert lock.acquire(timeout=5)
    lock.release()
    assert q.empty() and q.qsize() == 0
    q.put(1)
    q.put(2)
    with pytest.raises(syncmgr.Full):  # maxsize=2 came back with it
        q.put(3, timeout=0.05)
    assert [q.get(timeout=5), q.get(timeout=5)] == [1, 2]
    assert ev.is_set() is False
    assert val.value == 7  # the value it was created with
    assert d.get("k") is None and len(d) == 0
    assert sem.acquire(timeout=5) and sem.acquire(timeout=5)  # value 2, and nothing held from before
    assert sem.acquire(False) is False
    jq.put("x")
    jq.get(timeout=5)
    jq.task_done()
    assert jq.join(timeout=5)
    if FAST:  # back on the restarted daemon's fast path
        assert _fast.active(lock) and _fast.active(q) and _fast.active(ev) and _fast.active(val)


def test_conditions_barriers_and_object_values_come_back_after_a_restart(fresh):
    m = syncmgr.connect(fresh.address, fresh.key)
    lock = m.RLock(name="cond-lock")
    cond, own = m.Condition(lock, name="cond"), m.Condition(name="cond-own")
    barrier, obj = m.Barrier(2, name="bar"), m.Value("O", {"a": 1}, name="obj")
    anon_lock_cond = m.Condition(m.Lock(), name="cond-anon-lock")
    fresh.kill()
    start_daemon_proc(fresh)
    with cond:  # its RLock is created again first, as an RLock
        cond.notify_all()
        with lock:  # the same RLock, re-entered
            pass
    with own:
        own.notify_all()
    assert barrier.parties == 2
    done = []
    t = threading.Thread(target=lambda: done.append(barrier.wait(10)))
    t.start()
    barrier.wait(10)
    t.join(10)
    assert len(done) == 1
    assert obj.value is None  # created again, empty
    obj.value = [1, 2]
    assert obj.value == [1, 2]
    with pytest.raises(syncmgr.ServerRestartedError, match="anonymous lock"):
        anon_lock_cond.acquire(timeout=1)


def test_an_object_value_made_without_a_value_reads_none(m):
    assert m.Value("O").value is None


def test_a_pickled_named_proxy_works_in_another_process_after_a_restart(fresh):
    m = syncmgr.connect(fresh.address, fresh.key)
    q = m.Queue(name="carried")
    blob = pickle.dumps(q)
    fresh.kill()
    start_daemon_proc(fresh)
    code = ("import pickle, sys; q = pickle.loads(bytes.fromhex(sys.argv[1])); q.put('from child'); "
            "print(q.qsize())")
    out = subprocess.run([sys.executable, "-c", code, blob.hex()], env=fresh.env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
    assert q.get(timeout=5) == "from child"


def test_an_anonymous_proxy_after_a_restart_says_to_call_the_factory_again(fresh):
    m = syncmgr.connect(fresh.address, fresh.key)
    q, lock = m.Queue(), m.Lock()
    fresh.kill()
    start_daemon_proc(fresh)
    for op in (lambda: q.put(1), lambda: lock.acquire(timeout=1)):
        with pytest.raises(syncmgr.ServerRestartedError) as ei:
            op()
        msg = str(ei.value)
        assert "restarted" in msg and "anonymous" in msg and "factory" in msg
    assert m.Queue().qsize() == 0  # the factory works


def test_a_named_object_deleted_in_the_same_run_is_not_created_again(fresh):
    m = syncmgr.connect(fresh.address, fresh.key)
    q = m.Queue(name="gone")
    assert m.delete("gone")
    with pytest.raises(syncmgr.NoSuchObjectError):
        q.put(1)
    with pytest.raises(syncmgr.NoSuchObjectError):
        q.qsize()
    assert "gone" not in {o["name"] for o in m.status()["objects"]}


def test_containers_raise_keyerror_and_indexerror_that_are_syncmgr_errors(m):
    d, lst = m.dict(), m.list([1])
    with pytest.raises(syncmgr.KeyNotFoundError) as ei:
        d["missing"]
    assert isinstance(ei.value, KeyError) and isinstance(ei.value, syncmgr.SyncMgrError)
    assert ei.value.args == ("missing",) and str(ei.value) == "'missing'"  # as a dict's KeyError
    for op in (lambda: d.pop("missing"), lambda: d.__delitem__("missing"), d.popitem):
        with pytest.raises(KeyError):
            op()
        with pytest.raises(syncmgr.SyncMgrError):
            op()
    for op in (lambda: lst[5], lambda: lst.__setitem__(5, 0), lambda: lst.__delitem__(5), lambda: lst.pop(5)):
        with pytest.raises(syncmgr.IndexOutOfRangeError) as ei:
            op()
        assert isinstance(ei.value, IndexError) and "out of range" in str(ei.value)
    assert d.get("missing", 3) == 3 and d.pop("missing", 4) == 4  # defaults still work


def test_queue_full_and_empty_say_so_on_both_paths(m):
    q = m.Queue(maxsize=1)
    q.put(1)
    for op in (lambda: q.put_nowait(2), lambda: q.put(2, timeout=0.01), lambda: q.put_many([2], timeout=0.01)):
        with pytest.raises(syncmgr.Full) as ei:
            op()
        assert str(ei.value) == "queue full"
    q.get()
    for op in (q.get_nowait, lambda: q.get(timeout=0.01), lambda: q.get_many(3, timeout=0.01)):
        with pytest.raises(syncmgr.Empty) as ei:
            op()
        assert str(ei.value) == "queue empty"


def test_a_graceful_stop_fails_every_waiter_with_shutting_down(fresh):
    m = syncmgr.connect(fresh.address, fresh.key)
    lock, q, ev = m.Lock(), m.Queue(), m.Event()
    assert lock.acquire(timeout=5)
    got: dict[str, BaseException] = {}

    def wait(name, fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - recorded and checked below
            got[name] = e

    threads = [threading.Thread(target=wait, args=("lock", lambda: lock.acquire(timeout=60))),
               threading.Thread(target=wait, args=("get", lambda: q.get(timeout=60))),
               threading.Thread(target=wait, args=("event", lambda: ev.wait(60)))]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert fresh.stop() == 0
    for t in threads:
        t.join(20)
        assert not t.is_alive()
    for name in ("lock", "get"):
        assert isinstance(got.get(name), syncmgr.ShuttingDownError), (name, got.get(name))
        assert "shut" in str(got[name])
    # The next call says the daemon shut down, with what to do.
    with pytest.raises(syncmgr.ShuttingDownError) as ei:
        q.put(1)
    assert "syncmgr serve" in str(ei.value) or "shutting down" in str(ei.value)


def test_a_missing_segment_is_a_segment_not_found_error(m):
    with pytest.raises(syncmgr.SegmentNotFoundError) as ei:
        m.SharedMemory("no-such-segment")
    assert isinstance(ei.value, FileNotFoundError) and isinstance(ei.value, syncmgr.SyncMgrError)
    assert "no-such-segment" in str(ei.value) and "create=True" in str(ei.value)


def test_the_key_as_keygen_prints_it_works(fresh):
    hexkey = subprocess.run([os.environ.get("SYNCMGR_BIN") or "bin/syncmgr", "keygen"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert len(hexkey) == 64
    assert fresh.key.hex() != hexkey
    assert syncmgr.connect(fresh.address, fresh.key.hex()).Event().is_set() is False  # the str, as printed
    assert syncmgr.connect(fresh.address, fresh.key.hex().upper() + "\n").Event().is_set() is False
    assert syncmgr.connect(fresh.address, fresh.key).Event().is_set() is False  # the bytes


def test_hex_text_as_bytes_is_refused_with_the_fix(fresh):
    with pytest.raises(syncmgr.AuthenticationError) as ei:
        syncmgr.connect(fresh.address, fresh.key.hex().encode()).Event()
    msg = str(ei.value)
    assert "bytes.fromhex" in msg and "str" in msg and "passed to connect()" in msg
    with pytest.raises(ValueError, match="hex"):
        syncmgr.connect(fresh.address, "not hex at all")
    with pytest.raises(TypeError, match="bytes .* or a str of hex"):
        syncmgr.connect(fresh.address, 12345)  # type: ignore[arg-type]


def test_no_daemon_and_no_key_reports_the_missing_daemon(tmp_path, monkeypatch):
    for k in ("SYNCMGR_AUTHKEY", "SYNCMGR_AUTHKEY_FILE", "SYNCMGR_ADDRESS"):
        monkeypatch.delenv(k, raising=False)
    sock = str(tmp_path / "nobody.sock")
    with pytest.raises(syncmgr.ConnectError) as ei:
        syncmgr.connect(sock)
    msg = str(ei.value)
    assert "no syncmgr daemon is running" in msg and "syncmgr serve" in msg


def test_no_key_with_a_daemon_reports_the_missing_key(fresh, monkeypatch):
    for k in ("SYNCMGR_AUTHKEY", "SYNCMGR_AUTHKEY_FILE", "SYNCMGR_ADDRESS"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(syncmgr.AuthenticationError, match="SYNCMGR_AUTHKEY"):
        syncmgr.connect(fresh.address)


def test_a_wrong_key_with_both_variables_set_names_the_one_used(fresh, tmp_path, monkeypatch):
    good = tmp_path / "good.key"
    good.write_text(fresh.key.hex())
    good.chmod(0o600)
    monkeypatch.setenv("SYNCMGR_ADDRESS", fresh.address)
    monkeypatch.setenv("SYNCMGR_AUTHKEY", os.urandom(32).hex())
    monkeypatch.setenv("SYNCMGR_AUTHKEY_FILE", str(good))
    from syncmgr import _connection

    _connection._clients.pop(fresh.address, None)
    with pytest.raises(syncmgr.AuthenticationError) as ei:
        syncmgr.connect().Event()
    msg = str(ei.value)
    assert "$SYNCMGR_AUTHKEY" in msg and f"SYNCMGR_AUTHKEY_FILE={good} is set too, and ignored" in msg
    monkeypatch.delenv("SYNCMGR_AUTHKEY")
    _connection._clients.pop(fresh.address, None)
    assert syncmgr.connect().Event().is_set() is False  # the file alone is used, and right


def test_a_pooled_tls_connection_of_a_stopped_daemon_is_not_the_answer(tmp_path):
    """Over TLS (where an idle connection cannot be peeked), a daemon that
    stopped gracefully while the client's connection sat in its pool left a
    shutdown notice in it; the next call reaches the daemon now at the
    address instead of raising that old notice."""
    import json
    import socket as _socket

    from syncmgr import _connection

    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    info = tmp_path / "info.json"
    d = start_daemon("--tcp", f"127.0.0.1:{port}", "--tls-self-signed", "--info-file", str(info))
    try:
        def run_of() -> str:
            try:
                return str(json.loads(info.read_text())["run"])
            except (OSError, ValueError, KeyError):
                return ""

        assert wait_until(lambda: run_of() != "", timeout=20)  # written once the daemon listens
        def client() -> _connection.Client:
            pin = json.loads(info.read_text())["tls_sha256"]
            route = _connection.Route(f"tcp://127.0.0.1:{port}", d.key, "the test's key", None, pin)
            return _connection.Client(f"tcp://127.0.0.1:{port}", route)

        c = client()
        c.call("create", {"kind": "value", "name": "survivor", "typecode": "i", "value": 7})
        assert c.call("get", {"kind": "value", "name": "survivor"}) == 7
        first = run_of()
        d.restart()  # a graceful stop (its notice goes to every connection), then a new run on the same port
        assert wait_until(lambda: run_of() not in ("", first), timeout=20)  # the new run's info file
        time.sleep(0.6)  # past the pool's quick-reuse window
        c.route = client().route  # the new run's certificate (the pin is the caller's to know)
        assert c.call("ping", {}) is None
    finally:
        d.close()
