"""Python and Go read each other's values (docs/protocol.md, section 10):
a Go program (tests/interop, reaching the daemon with proxy.DialEnv from the
same environment variables) reads what Python stored in a Queue, a Value,
a dict, a list and a Namespace, writes Go values back, and Python reads them."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator

import pytest

import syncmgr
from conftest import REPO
from syncmgr import _fast


@pytest.fixture(scope="module")
def interop(tmp_path_factory) -> Iterator[str]:
    go = os.environ.get("GO") or shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if go is None:
        pytest.skip("Go is not installed: the Go side of the interop test cannot be built")
    out = str(tmp_path_factory.mktemp("interop") / "interop")
    subprocess.run([go, "build", "-o", out, "./tests/interop"], cwd=REPO, check=True, timeout=300)
    yield out


def _go_env(daemon, **more: str) -> dict[str, str]:
    """The Go program's whole environment: the daemon's address and key."""
    return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"),
            "SYNCMGR_ADDRESS": daemon.address, "SYNCMGR_AUTHKEY": daemon.key.hex(), **more}


def _ring_env(daemon, q) -> tuple[bool, dict[str, str]]:
    """Whether this run's fast path is on (then q must be on its ring), and
    an environment that turns Go's on or off alike."""
    fast = _fast.enabled_by_env()
    if fast:
        assert _fast.active(q), _fast.reasons
    return fast, _go_env(daemon, SYNCMGR_FASTPATH=os.environ.get("SYNCMGR_FASTPATH", "1"))


def _go(interop: str, daemon, *args: str) -> list[str]:
    r = subprocess.run([interop, *args], env=_go_env(daemon), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


# Every plain type, and what Go decodes it to.
PLAIN = [
    (None, "<nil>"), (True, "bool"), (-5, "int64"), (2**64 - 1, "uint64"), (2.5, "float64"), ("héllo", "string"),
    (b"\x00\xff", "[]uint8"), ([1, "a", None, [b"x"]], "[]interface {}"), ({"k": [1, 2.5], "n": None},
     "map[string]interface {}"), ({1: "one", b"b": 2}, "map[interface {}]interface {}"),
]


def test_queue_items_cross_both_ways(daemon, interop):
    m = syncmgr.connect(daemon.address, daemon.key)
    qin, qout = m.Queue(name="interop-in"), m.Queue(name="interop-out")
    if _fast.enabled_by_env():  # Python on the queues' rings, Go through the daemon: one FIFO
        assert _fast.active(qin) and _fast.active(qout), _fast.reasons
    values = [v for v, _ in PLAIN] + [(1, 2), {1, 2}]  # the last two are pickles: Go passes them on untouched
    for v in values:
        qin.put(v)
    types = _go(interop, daemon, "echo", "interop-in", "interop-out", str(len(values)))
    assert types == [t for _, t in PLAIN] + ["proxy.Pickle", "proxy.Pickle"]
    for v in values:
        back = qout.get(timeout=10)
        assert back == v and type(back) is type(v)
        if isinstance(v, dict):  # same keys of the same types (a Go map does not keep their order)
            assert {k: type(k) for k in back} == {k: type(k) for k in v}


def test_value_dict_list_namespace_cross_both_ways(daemon, interop):
    m = syncmgr.connect(daemon.address, daemon.key)
    v = m.Value("O", {"from": "python", "n": [1, 2]}, name="ix-value")
    d = m.dict({"py-key": {"x": [1, 2]}, 1.0: "one", (1, "a"): "tuple"}, name="ix-dict")
    lst = m.list([1, "two", None, (3,)], name="ix-list")
    ns = m.Namespace(name="ix-ns")
    ns.from_py = "hello"

    out = _go(interop, daemon, "objects", "ix")
    assert "value map[string]interface {} map[from:python n:[1 2]]" in out
    assert "dict[py-key] map[string]interface {} map[x:[1 2]]" in out
    assert "dict[1] string one" in out            # Go's 1 is Python's 1.0
    assert "dict[[1 a]] string tuple" in out      # a Go slice finds a Python tuple key
    assert "list[0] int64 1" in out and "list[1] string two" in out and "list[2] <nil> <nil>" in out
    assert any(line.startswith("list[3] proxy.Pickle") for line in out)
    assert "ns.from_py string hello" in out
    items = [line for line in out if line.startswith("item ")]
    assert items[:2] == ["item string map[string]interface {}", "item float64 string"]
    assert items[2] == "item proxy.Pickle string"  # a tuple key's pickle, passed through

    assert v.get() == {"from": "go", "n": [1, 2.5, None], "raw": b"\x00\x01"}
    assert d["go-key"] == ["from", "go"] and d[3] == "three" and d[3.0] == "three"
    assert list(d.keys()) == ["py-key", 1.0, (1, "a"), "go-key", 3]  # no UnpicklingError
    assert lst[-1] == {"go": True} and len(lst) == 5
    assert ns.from_go == 42 and ns.from_py == "hello"


def test_queue_ring_python_and_go_fast_paths(daemon, interop):
    """Python and Go on one Queue's ring, each with its own fast path (both
    off with SYNCMGR_FASTPATH=0): Go's blocking gets take what Python puts
    while it puts it, Python's take what Go puts, and both see one FIFO."""
    m = syncmgr.connect(daemon.address, daemon.key)
    q = m.Queue(name="ring-mixed")
    fast, env = _ring_env(daemon, q)
    n = 200
    sent = [i if i % 2 == 0 else f"py-{i}" for i in range(n)] + [(1, "pickled")]
    q.put(-1)  # one item there before Go starts, the rest while it waits
    go = subprocess.Popen([interop, "ring", "ring-mixed", str(n + 2), str(n)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert go.stdout is not None
        first = go.stdout.readline().strip()
        assert first == f"fast={str(fast).lower()} ring={str(fast).lower()}", first
        for v in sent:
            q.put(v)
        # Go has got every item once it has printed it (Python's gets would
        # race with its gets for them before that).
        lines = [go.stdout.readline().rstrip("\n") for _ in range(n + 2)]
        back = [q.get(timeout=60) for _ in range(n + 1)]
        go.wait(timeout=120)
        err = go.stderr.read() if go.stderr else ""
    finally:
        if go.poll() is None:
            go.kill()
            go.wait()
    assert go.returncode == 0, err
    want = ["int64 -1"] + [f"int64 {v}" if isinstance(v, int) else f"string {v}" for v in sent[:-1]]
    assert lines[:-1] == want
    assert lines[-1].startswith("proxy.Pickle ")
    assert back[:-1] == [f"go-{i}" if i % 2 == 0 else i for i in range(n)]
    assert back[-1] == (1, "pickled")  # Go put back the pickle it got, untouched
    assert q.empty()


def test_joinable_queue_python_and_go_fast_paths(daemon, interop):
    """Python and Go on one JoinableQueue's ring, each with its own fast path
    (both off with SYNCMGR_FASTPATH=0): Go gets and Python marks the tasks
    done, then Python gets and Go marks them done; join returns exactly when
    the last is done, on either side, and one task_done too many is refused
    on either side."""
    m = syncmgr.connect(daemon.address, daemon.key)
    jq = m.JoinableQueue(name="jring-mixed")
    fast, env = _ring_env(daemon, jq)
    n = 50
    for i in range(n):
        jq.put(i)
    go = subprocess.Popen([interop, "jring", "jring-mixed", str(n)], env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    joined: list[bool] = []
    try:
        assert go.stdout is not None and go.stdin is not None
        first = go.stdout.readline().strip()
        assert first == f"fast={str(fast).lower()} ring={str(fast).lower()}", first
        lines = [go.stdout.readline().rstrip("\n") for _ in range(n + 1)]
        assert lines == [f"int64 {i}" for i in range(n)] + ["got"]
        # Go got every item; Python owes nothing, so its task_done pays Go's debts.
        assert jq.join(timeout=0.05) is False
        for i in range(n):
            if i == n - 1:
                assert jq.join(timeout=0.05) is False  # never early
            jq.task_done()
        assert jq.join(timeout=30) is True
        # The other way: Python gets, Go marks done, a Python join waits for it.
        sent = [f"py-{i}" for i in range(n)]
        for v in sent:
            jq.put(v)
        assert [jq.get(timeout=30) for _ in range(n)] == sent
        t = threading.Thread(target=lambda: joined.append(jq.join(timeout=60)))
        t.start()
        go.stdin.write("go\n")
        go.stdin.flush()
        assert go.stdout.readline().strip() == "pending"  # Go waits before its last task_done
        assert jq.join(timeout=0.05) is False and joined == []  # one task still unfinished
        go.stdin.write("last\n")
        go.stdin.flush()
        assert go.stdout.readline().strip() == "joined"
        t.join(30)
        assert joined == [True]
        assert go.stdout.readline().strip() == "too-many"
        go.wait(timeout=60)
        err = go.stderr.read() if go.stderr else ""
    finally:
        if go.poll() is None:
            go.kill()
            go.wait()
    assert go.returncode == 0, err
    with pytest.raises(ValueError):
        jq.task_done()
    assert jq.empty()
