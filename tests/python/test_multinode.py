"""Two hosts on one machine: the daemon on "head", clients on "worker".

Two network namespaces joined by a veth pair (10.250.0.1 and 10.250.0.2,
addresses that exist only inside them) stand for two nodes of a Ray cluster.
The daemon listens on the head's address with ``--tcp`` and TLS. A head
process creates one object of every kind and pickles the proxies; a worker
process on the other "host" gets its address and key from the head's
``runtime_env()`` (as Ray's ``env_vars`` would give them: the address, a key
file's path and the TLS CA), a second one from ``SYNCMGR_ADDRESS``, a key file
named by ``SYNCMGR_AUTHKEY_FILE`` and ``SYNCMGR_TLS_CA``; both unpickle the
proxies, uses every kind, meets the head at a Barrier, and gets
``SharedMemoryHostError`` for a segment. The worker also has its own boot id
and its own ``/dev/shm`` (a private mount namespace), as another machine
would. This is the recipe of docs/ray.md, "Multi-node clusters".

The second test is a replay job's ingestion path: producers on the worker
put into one Queue over TCP+TLS while a consumer on the head, on the
daemon's Unix socket, gets from the queue's shared ring with no socket round
trip; every item arrives once and in each producer's order.

Needs root and iproute2 (``ip netns``); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from conftest import BIN

HEAD_IP, WORKER_IP, PORT = "10.250.0.1", "10.250.0.2", 7791
ADDRESS = f"tcp://{HEAD_IP}:{PORT}"
TIMEOUT = 90


def _why_no_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (run the suite as root to include the multi-node test)"
    for tool in ("ip", "unshare", "mount", "openssl"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2, util-linux and openssl are needed)"
    name = f"smprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return f"cannot create a network namespace here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    return None


_REASON = _why_no_namespaces() if sys.platform.startswith("linux") else "network namespaces are Linux-only"
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


@dataclass
class Hosts:
    head: str
    worker: str
    dir: str
    cert: str
    key: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def two_hosts(prefix: str, made: list[str]) -> tuple[str, str]:
    """Two network namespaces joined by a veth pair, HEAD_IP and WORKER_IP;
    their names are appended to made as they are made (the caller deletes
    them, which removes the veth pair too)."""
    tag = f"{os.getpid() % 100000}"
    head, worker = f"{prefix}{tag}h", f"{prefix}{tag}w"
    for ns in (head, worker):
        _ip("netns", "add", ns)
        made.append(ns)
    _ip("link", "add", f"{prefix}v{tag}h", "type", "veth", "peer", "name", f"{prefix}v{tag}w")
    for ns, dev, addr in ((head, f"{prefix}v{tag}h", HEAD_IP), (worker, f"{prefix}v{tag}w", WORKER_IP)):
        _ip("link", "set", dev, "netns", ns)
        _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
        _ip("-n", ns, "link", "set", dev, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
    return head, worker


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    d = tempfile.mkdtemp(prefix="smn", dir="/tmp")
    made: list[str] = []
    try:
        head, worker = two_hosts("smn", made)
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "1", "-subj", "/CN=head", "-addext", f"subjectAltName=IP:{HEAD_IP}",
                        "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
        yield Hosts(head, worker, d, cert, key)
    finally:
        for ns in made:  # deleting a namespace removes its end of the veth pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        shutil.rmtree(d, ignore_errors=True)


HEAD = r"""
import json, os, pickle, sys
import syncmgr

addr, key, cafile, out = sys.argv[1], bytes.fromhex(os.environ.pop("TEST_KEY")), sys.argv[2], sys.argv[3]
assert os.environ["SYNCMGR_TLS_CA"] == cafile   # TLS from the environment, as in docs/ray.md
m = syncmgr.connect(addr, key)
objs = {
    "lock": m.Lock(), "rlock": m.RLock(), "sem": m.Semaphore(2), "bsem": m.BoundedSemaphore(1),
    "event": m.Event(), "cond": m.Condition(), "barrier": m.Barrier(3), "value": m.Value("i", 10),
    "queue": m.Queue(), "jqueue": m.JoinableQueue(), "dict": m.dict(a=1), "list": m.list([1]),
    "ns": m.Namespace(x=1),
}
named = m.Event(name="multinode-go")
seg = m.SharedMemory(create=True, size=4096)
seg.buf[:4] = b"head"
objs["segment"] = seg.name
with open(out, "wb") as f:
    pickle.dump(objs, f)
# What Ray's runtime_env would carry to the worker: the address, the path of
# a key file (never the key) and the TLS settings.
print(json.dumps(m.runtime_env()), flush=True)
objs["barrier"].wait(timeout=60)            # both workers have done their part
o = objs
assert o["value"].get() == 20, o["value"].get()
for _ in range(2):
    assert o["queue"].get(timeout=10) == {"from": "worker", "n": [1, 2.5, None]}
assert o["queue"].empty()
o["jqueue"].join()                          # the workers called task_done
assert o["dict"].copy() == {"a": 1, "b": "worker"}, o["dict"].copy()
assert o["list"][:] == [1, "worker", "worker"], o["list"][:]
assert o["ns"].y == "worker" and o["ns"].x == 1
assert o["event"].is_set()
assert o["lock"].acquire(timeout=5) and o["sem"].acquire(timeout=5) and o["bsem"].acquire(timeout=5)
assert bytes(seg.buf[:4]) == b"head"        # the worker could not touch it
named.set()
print("head: every effect of the worker seen", flush=True)
"""

WORKER = r"""
import os, pickle, sys, threading
import syncmgr

cafile, blob = sys.argv[1], sys.argv[2]
assert os.environ["SYNCMGR_ADDRESS"].startswith("tcp://"), "address comes from the environment"
# Address, key file and TLS settings all come from the environment.
assert os.environ["SYNCMGR_TLS_CA"] == cafile and "SYNCMGR_AUTHKEY" not in os.environ
m = syncmgr.connect()
with open(blob, "rb") as f:
    o = pickle.load(f)
assert o["lock"].acquire(timeout=10); o["lock"].release()
with o["rlock"]:
    with o["rlock"]:
        pass
# Semaphore(2): one unit per worker. (Taking both units in each of two
# concurrent workers can deadlock: one unit each, both waiting for a second.)
assert o["sem"].acquire(timeout=10)
o["sem"].release()
with o["bsem"]:
    pass
with o["cond"]:
    o["cond"].notify_all()
    assert o["cond"].wait_for(lambda: o["value"].get() >= 10, timeout=5)
o["value"].add(5)
o["queue"].put({"from": "worker", "n": [1, 2.5, None]})
o["jqueue"].put("job")
assert o["jqueue"].get(timeout=10) == "job"
o["jqueue"].task_done()
o["dict"]["b"] = "worker"
o["list"].append("worker")
o["ns"].y = "worker"
o["event"].set()
# Named objects through the environment-configured manager.
go = m.Event(name="multinode-go")
try:
    m.SharedMemory(o["segment"])
    raise SystemExit("a segment on another host was attached")
except syncmgr.SharedMemoryHostError as e:
    print("worker: SharedMemoryHostError:", e, flush=True)
o["barrier"].wait(timeout=60)
assert go.wait(timeout=60), "head never set the named event"
print("worker: every kind used across hosts", flush=True)
"""


def _netns(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def test_two_hosts_over_tcp_and_tls(hosts: Hosts) -> None:
    key = os.urandom(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCMGR_")}
    pypath = os.pathsep.join(p for p in sys.path if p)
    log = open(os.path.join(hosts.dir, "daemon.log"), "wb")
    daemon = subprocess.Popen(
        _netns(hosts.head, BIN, "serve", "--socket", "none", "--tcp", f"{HEAD_IP}:{PORT}",
               "--tls-cert", hosts.cert, "--tls-key", hosts.key, "--log-format", "json"),
        env=dict(env, SYNCMGR_AUTHKEY=key.hex()), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    procs = [daemon]
    try:
        _wait_ready(daemon, os.path.join(hosts.dir, "daemon.log"))
        blob = os.path.join(hosts.dir, "proxies.pickle")
        head = subprocess.Popen(
            _netns(hosts.head, sys.executable, "-c", HEAD, ADDRESS, hosts.cert, blob),
            env=dict(env, TEST_KEY=key.hex(), PYTHONPATH=pypath, SYNCMGR_TLS_CA=hosts.cert), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True)
        procs.append(head)
        first = _readline_or_fail(head, daemon, hosts)
        runtime_env = json.loads(first)
        assert runtime_env["env_vars"]["SYNCMGR_ADDRESS"] == ADDRESS
        assert runtime_env["env_vars"]["SYNCMGR_TLS_CA"] == hosts.cert
        assert "SYNCMGR_AUTHKEY" not in runtime_env["env_vars"] and key.hex() not in first

        # Another "host": its own network namespace, boot id and /dev/shm.
        boot = os.path.join(hosts.dir, "boot_id")
        with open(boot, "w") as f:
            f.write(f"{uuid.uuid4()}\n")
        other_host = ("mount --bind \"$0\" /proc/sys/kernel/random/boot_id && "
                      "mount -t tmpfs -o size=1m,mode=1777 tmpfs /dev/shm && exec \"$@\"")
        base = {"PATH": env.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": pypath}
        # Worker 1: the runtime_env's variables as they are (address, key file, CA).
        # Worker 2: the recipe of docs/ray.md, the key in a 0400 file on the node.
        keyfile = os.path.join(hosts.dir, "authkey")
        with open(os.open(keyfile, os.O_WRONLY | os.O_CREAT, 0o400), "w") as f:
            f.write(key.hex() + "\n")
        envs = [{**base, **runtime_env["env_vars"]},
                {**base, "SYNCMGR_ADDRESS": runtime_env["env_vars"]["SYNCMGR_ADDRESS"],
                 "SYNCMGR_AUTHKEY_FILE": keyfile, "SYNCMGR_TLS_CA": hosts.cert}]
        workers = [subprocess.Popen(
            _netns(hosts.worker, "unshare", "--mount", "--propagation", "private", "sh", "-c", other_host, boot,
                   sys.executable, "-c", WORKER, hosts.cert, blob),
            env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for e in envs]
        procs.extend(workers)
        for w in workers:
            wout, werr = w.communicate(timeout=TIMEOUT)
            assert w.returncode == 0, f"worker failed:\n{wout}\n{werr}"
            assert "SharedMemoryHostError" in wout and "not on this host" in wout
            assert "every kind used across hosts" in wout
        out, _ = head.communicate(timeout=TIMEOUT)
        assert head.returncode == 0, f"head failed:\n{first}{out}"
        assert "every effect of the worker seen" in out
    finally:
        _stop(procs)
        log.close()
    assert daemon.returncode == 0, open(os.path.join(hosts.dir, "daemon.log")).read()[-2000:]


def _stop(procs: list[subprocess.Popen]) -> None:
    """Terminate what still runs, newest first (the daemon last)."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def _wait_ready(daemon: subprocess.Popen, log: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        with open(log) as f:
            text = f.read()
        if "syncmgr ready" in text:
            return
        if daemon.poll() is not None:
            pytest.fail(f"the daemon exited: {text[-2000:]}")
        time.sleep(0.02)
    pytest.fail("the daemon did not get ready in time")


def _readline_or_fail(head: subprocess.Popen, daemon: subprocess.Popen, hosts: Hosts, expect: str = "{") -> str:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(head.stdout, selectors.EVENT_READ)
    if not sel.select(timeout=TIMEOUT):
        pytest.fail("the head process did not get ready in time")
    line = head.stdout.readline()
    if not line.startswith(expect):
        rest = head.stdout.read() if head.poll() is not None else ""
        with open(os.path.join(hosts.dir, "daemon.log")) as f:
            pytest.fail(f"head failed: {line}{rest}\ndaemon log:\n{f.read()[-2000:]}")
    return line



# The ingestion path of a multi-node replay job: producers on the worker
# "host" put over TCP+TLS; the consumer on the daemon's host gets through the
# same-host fast path (the queue's shared ring). One queue, one FIFO.
CONSUMER = r"""
import os, sys
import numpy as np
import syncmgr
from syncmgr import _connection, _fast

sock, key = sys.argv[1], bytes.fromhex(os.environ.pop("TEST_KEY"))
n_each, producers = int(sys.argv[2]), int(sys.argv[3])
m = syncmgr.connect(sock, key)
q = m.Queue(name="ingest")
assert _fast.active(q), f"the consumer is not on the fast path: {_fast.reasons}"
requests = 0
orig = _connection.Connection.send_requests
def counting(conn, *a, **k):
    global requests
    requests += 1
    return orig(conn, *a, **k)
_connection.Connection.send_requests = counting
print("ready", flush=True)
seen = {w: -1 for w in range(producers)}
arrays = 0
for _ in range(n_each * producers):
    item = q.get(timeout=60)
    w, k = item["w"], item["k"]
    assert k == seen[w] + 1, f"producer {w}: got {k} after {seen[w]} (lost, doubled or out of order)"
    seen[w] = k
    if "a" in item:
        assert isinstance(item["a"], np.ndarray) and item["a"][0] == k and item["a"].shape == (4096,)
        arrays += 1
assert q.empty()
assert seen == {w: n_each - 1 for w in range(producers)}, seen
print(f"consumer: {n_each * producers} items in order, {arrays} arrays, {requests} socket round trips", flush=True)
"""

PRODUCER = r"""
import os, sys
import numpy as np
import syncmgr

w, n_each = int(sys.argv[1]), int(sys.argv[2])
assert os.environ["SYNCMGR_ADDRESS"].startswith("tcp://")
m = syncmgr.connect()          # TCP + TLS from the environment
q = m.Queue(name="ingest")
for k in range(n_each):
    item = {"w": w, "k": k}
    if k % 50 == 0:
        item["a"] = np.full(4096, k, dtype=np.float64)   # 32 KiB: kept in the ring
    q.put(item)
print(f"producer {w}: {n_each} put", flush=True)
"""


def test_remote_producers_over_tls_feed_a_fast_path_consumer(hosts: Hosts) -> None:
    pytest.importorskip("numpy")
    key = os.urandom(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCMGR_")}
    pypath = os.pathsep.join(p for p in sys.path if p)
    sock = os.path.join(hosts.dir, "syncmgr.sock")
    logpath = os.path.join(hosts.dir, "daemon.log")
    log = open(logpath, "wb")
    daemon = subprocess.Popen(
        _netns(hosts.head, BIN, "serve", "--socket", sock, "--tcp", f"{HEAD_IP}:{PORT}",
               "--tls-cert", hosts.cert, "--tls-key", hosts.key, "--log-format", "json"),
        env=dict(env, SYNCMGR_AUTHKEY=key.hex()), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    procs = [daemon]
    n_each, producers = 1500, 2
    try:
        _wait_ready(daemon, logpath)
        consumer = subprocess.Popen(
            _netns(hosts.head, sys.executable, "-c", CONSUMER, sock, str(n_each), str(producers)),
            env=dict(env, TEST_KEY=key.hex(), PYTHONPATH=pypath, SYNCMGR_FASTPATH="1"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(consumer)
        first = _readline_or_fail(consumer, daemon, hosts, expect="ready")
        assert first.strip() == "ready", first
        keyfile = os.path.join(hosts.dir, "authkey")
        with open(os.open(keyfile, os.O_WRONLY | os.O_CREAT, 0o400), "w") as f:
            f.write(key.hex() + "\n")
        penv = {"PATH": env.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": pypath, "SYNCMGR_ADDRESS": ADDRESS,
                "SYNCMGR_AUTHKEY_FILE": keyfile, "SYNCMGR_TLS_CA": hosts.cert}
        workers = [subprocess.Popen(_netns(hosts.worker, sys.executable, "-c", PRODUCER, str(w), str(n_each)),
                                    env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for w in range(producers)]
        procs.extend(workers)
        for w in workers:
            wout, werr = w.communicate(timeout=TIMEOUT)
            assert w.returncode == 0, f"producer failed:\n{wout}\n{werr}"
        out, _ = consumer.communicate(timeout=TIMEOUT)
        assert consumer.returncode == 0, f"consumer failed:\n{out}"
        line = [x for x in out.splitlines() if x.startswith("consumer:")]
        assert line, out
        requests = int(line[0].split(",")[-1].split()[0])
        print(line[0])
        # The consumer's gets come from the ring: a few round trips at most
        # (a latch wait past its bound goes to the daemon), never one per item.
        assert requests <= n_each * producers // 10, line[0]
    finally:
        _stop(procs)
        log.close()
    assert daemon.returncode == 0, open(logpath).read()[-2000:]
