"""syncmgr.ray on a real multi-node Ray cluster: ``ray.cluster_utils.Cluster``,
Ray's own multi-node test harness, runs a head and a worker node (each its
own raylet and object store) on this machine. One daemon per node, started
and supervised by Ray; each node's processes on their own daemon's fast
path; proxies carried between nodes over TCP+TLS pinned to each daemon's
self-made certificate; detached clusters; and what every wrong use gets.
"""

from __future__ import annotations

import asyncio
import glob
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

import syncmgr.ray as sray  # noqa: E402
from syncmgr import _connection  # noqa: E402
from syncmgr.exceptions import ConnectError, RayClusterError  # noqa: E402

NODE_ARGS = {"num_cpus": 2, "object_store_memory": 80 << 20}


def _pids_alive(pids) -> list[int]:
    out = []
    for p in pids:
        try:
            os.kill(p, 0)
            out.append(p)
        except ProcessLookupError:
            pass
    return out


def _wait(pred, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not met within {timeout} s")


@pytest.fixture(scope="module")
def rc():
    """A two-node Ray cluster on this machine, this process its driver."""
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False})
    c.add_node(**NODE_ARGS)
    c.wait_for_nodes()
    ray.init(address=c.address, configure_logging=False, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def _alive_nodes() -> list[str]:
    return [n["NodeID"] for n in ray.nodes() if n["Alive"]]


@ray.remote(num_cpus=0)
def _on_node_make(cluster, name):
    """On its node: the node's daemon through local(), with the fast path."""
    from syncmgr import _fast

    m = cluster.local()
    lock, q = m.Lock(name=f"{name}-lock"), m.Queue(name=name)
    assert lock.acquire(timeout=10)
    lock.release()
    q.put(("from", ray.get_runtime_context().get_node_id()))
    key = sray._known_for(cluster.name).key
    assert key is not None  # this worker got it, from the keeper
    # On the fast path exactly when this process may use it (not under SYNCMGR_FASTPATH=0).
    return {"node": ray.get_runtime_context().get_node_id(),
            "fast": (_fast.active(lock) and _fast.active(q)) == _fast.enabled_by_env(),
            "pid": m.status()["server"]["pid"], "address": m.address, "q": q,
            "env_has_key": any(k.startswith("SYNCMGR_AUTHKEY") or key.hex() in v.lower()
                               for k, v in os.environ.items()),
            "runtime_env": ray.get_runtime_context().runtime_env}


@ray.remote(num_cpus=0)
def _on_node_take(q):
    """On another node: a proxy made elsewhere, used here."""
    c = q._client
    return {"node": ray.get_runtime_context().get_node_id(), "item": q.get(timeout=30), "dial": c.dial,
            "pinned": c.route.pin is not None}


def _pinned(fn, node):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return fn.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))


def test_one_daemon_per_node_each_node_on_its_fast_path_proxies_cross_over_tls(rc):
    t0 = time.monotonic()
    cluster = sray.start()
    started = time.monotonic() - t0
    try:
        nodes = cluster.nodes()
        assert sorted(nodes) == sorted(_alive_nodes()), nodes
        assert len({n["pid"] for n in nodes.values()}) == 2
        assert all(n["tcp"].startswith("tcp://") for n in nodes.values())
        print(f"start() on 2 nodes: {started:.2f} s")
        got = {}
        for nid in nodes:
            r = ray.get(_pinned(_on_node_make, nid).remote(cluster, f"q-{nid[:8]}"), timeout=120)
            assert r["node"] == nid and r["fast"], r  # its own node's daemon, on the fast path
            assert r["pid"] == nodes[nid]["pid"] and r["address"] == nodes[nid]["socket"]
            assert not r["env_has_key"] and not r["runtime_env"]  # no key in the environment, no runtime_env
            got[nid] = r
        a, b = sorted(nodes)
        # A's Queue, used on B: over TCP+TLS, pinned, the same FIFO.
        r = ray.get(_pinned(_on_node_take, b).remote(got[a]["q"]), timeout=120)
        assert r["node"] == b and r["item"] == ("from", a)
        assert r["dial"] == nodes[a]["tcp"] and r["pinned"]
        # A second start() in the same job returns the running cluster.
        assert sray.start().name == cluster.name
        # on(): another node's daemon from the driver, over TCP+TLS.
        here = ray.get_runtime_context().get_node_id()
        other = b if here == a else a
        m = cluster.on(other)
        assert m._c().dial == nodes[other]["tcp"] and m.status()["server"]["pid"] == nodes[other]["pid"]
        # Nothing secret in a pickled proxy or the Cluster handle.
        key = sray._known_for(cluster.name).key
        assert key is not None
        for blob in (pickle.dumps(got[a]["q"]), pickle.dumps(cluster), pickle.dumps(m)):
            assert key not in blob and key.hex().encode() not in blob
        assert all(key.hex() not in v for v in os.environ.values())
    finally:
        pids = [n["pid"] for n in cluster.nodes().values()]
        dirs = [os.path.dirname(n["socket"]) for n in cluster.nodes().values()]
        cluster.shutdown()
    _wait(lambda: not _pids_alive(pids), 30, "every daemon exits after shutdown()")
    assert not [d for d in dirs if os.path.exists(d)]


def test_bad_uses_get_clear_errors(rc):
    with pytest.raises(RayClusterError, match="no syncmgr cluster named 'nope'"):
        sray.attach("nope")
    cluster = sray.start(name="errs")
    try:
        with pytest.raises(RayClusterError, match="is not a node of this Ray cluster"):
            cluster.on("ab" * 28)
        with pytest.raises(ValueError, match="hex"):
            cluster.on("not-a-node")
        with pytest.raises(TypeError, match="unknown daemon limits"):
            sray.start(name="typo", max_qeue=5)
        # A wrong pinned fingerprint: a TLS error naming the address, at once, nothing sent.
        nid, info = next(iter(cluster.nodes().items()))
        key = sray._known_for("errs").key or ray.get(sray._known_for("errs").keeper().secret.remote())
        route = sray.route(info["socket"])
        here = ray.get_runtime_context().get_node_id()
        if route.pin is None:  # the driver's own node: take the other one, reached over TCP
            nid, info = next((n, i) for n, i in cluster.nodes().items() if n != here)
            route = sray.route(info["socket"])
        assert route.pin == info["tls_sha256"] and route.dial == info["tcp"]
        wrong = _connection.Route(route.dial, key, route.key_source, route.ssl_context, "0" * 64, route.peer)
        t0 = time.monotonic()
        with pytest.raises(ConnectError, match="not the one pinned") as ei:
            wrong.connect(b"s" * 16, retry=False)
        assert time.monotonic() - t0 < 5 and info["tcp"] in str(ei.value) and nid in str(ei.value)
        # A client whose route went stale (the cluster started again under
        # its name: another key and certificate) asks the keeper once more;
        # the keeper's answer is what it trusts, so a pin the keeper does not
        # confirm is never accepted.
        stale = _connection.Route(route.dial, b"k" * 32, route.key_source, route.ssl_context, "0" * 64, route.peer)
        assert _connection.Client(info["socket"], stale).call("ping", {}) is None
    finally:
        cluster.shutdown()


def test_a_node_whose_daemon_cannot_start_is_named_and_the_others_are_stopped(rc):
    nodes = sorted(_alive_nodes())
    bad = nodes[1]
    blocker = sray.node_dir("half", bad)
    os.makedirs(os.path.dirname(blocker), mode=0o700, exist_ok=True)
    with open(blocker, "w") as f:  # a file where the node's directory must go
        f.write("in the way")
    try:
        before = set(glob.glob("/dev/shm/*"))
        with pytest.raises(RayClusterError) as ei:
            sray.start(name="half", nodes=nodes)
        assert bad in str(ei.value) and "stopped" in str(ei.value)
        with pytest.raises(RayClusterError):
            sray.attach("half")  # no keeper left behind
        good_dir = sray.node_dir("half", nodes[0])
        assert not os.path.exists(os.path.join(good_dir, "syncmgr.sock"))
        assert set(glob.glob("/dev/shm/*")) <= before
    finally:
        os.unlink(blocker)


DRIVER = textwrap.dedent("""
    import os, sys, time, ray, syncmgr, syncmgr.ray as sray
    ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False)
    mode = sys.argv[2]
    if mode == "detached":
        c = sray.start(name="rl-test", detached=True)
        m = c.local()
        m.Queue(name="handoff").put("kept")
        m.SharedMemory(name="seg-detached", create=True, size=4096)
        print("ready", flush=True)
    elif mode == "attach":
        c = sray.attach("rl-test")
        print(c.local().Queue(name="handoff").get(timeout=30), flush=True)
    elif mode == "killme":
        c = sray.start(name="killed")
        m = c.local()
        m.Queue(name="q").put(1)
        m.SharedMemory(name="seg-killed", create=True, size=4096)
        print("ready", " ".join(str(n["pid"]) for n in c.nodes().values()), flush=True)
        time.sleep(600)
    elif mode == "noray":
        import pickle
        c = pickle.loads(bytes.fromhex(sys.argv[3]))
        ray.shutdown()
        try:
            c.local()
        except syncmgr.RayClusterError as e:
            print("error:", e, flush=True)
""")


def _driver(rc, *args, timeout=180):
    return subprocess.run([sys.executable, "-c", DRIVER, rc.address, *args], capture_output=True, text=True,
                          timeout=timeout)


def _shm_files(name):
    return [f for f in glob.glob("/dev/shm/*") if f.endswith("-" + name)]


def test_a_detached_cluster_outlives_its_driver_and_ray_stop_leaves_nothing(rc):
    r = _driver(rc, "detached")
    assert r.returncode == 0 and "ready" in r.stdout, r.stderr[-3000:]
    c = sray.attach("rl-test")
    pids = [n["pid"] for n in c.nodes().values()]
    assert len(_pids_alive(pids)) == 2  # the driver has exited; the daemons run on
    r = _driver(rc, "attach")
    assert r.returncode == 0 and r.stdout.strip() == "kept", r.stderr[-3000:]
    stop = subprocess.run([sys.executable, "-m", "syncmgr", "ray-stop", "--name", "rl-test", "--address",
                           rc.address], capture_output=True, text=True, timeout=180)
    assert stop.returncode == 0, stop.stderr[-3000:]
    _wait(lambda: not _pids_alive(pids), 30, "the detached daemons exit after ray-stop")
    assert not _shm_files("seg-detached")
    with pytest.raises(RayClusterError):
        sray.attach("rl-test")


def test_a_driver_sigkill_leaves_no_daemon_and_no_segment(rc):
    p = subprocess.Popen([sys.executable, "-c", DRIVER, rc.address, "killme"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline().split()
        assert line and line[0] == "ready", p.stderr.read()[-3000:] if p.poll() is not None else line
        pids = [int(x) for x in line[1:]]
        assert len(_pids_alive(pids)) == 2 and _shm_files("seg-killed")
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        _wait(lambda: not _pids_alive(pids), 90, "the daemons exit after their driver's SIGKILL")
        _wait(lambda: not _shm_files("seg-killed"), 30, "the segment is unlinked")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_local_in_a_process_not_connected_to_ray_is_a_clear_error(rc):
    cluster = sray.start(name="noray")
    try:
        r = _driver(rc, "noray", pickle.dumps(cluster).hex())
        ok = r.returncode == 0 and "not connected to Ray" in r.stdout and "ray.init()" in r.stdout
        assert ok, (r.stdout, r.stderr[-2000:])
    finally:
        cluster.shutdown()
    code = "import syncmgr.ray as s\ntry:\n s.start()\nexcept Exception as e:\n print(type(e).__name__, e)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "RayClusterError" in r.stdout and "ray.init()" in r.stdout, r.stdout + r.stderr


def test_a_late_node_gets_its_daemon_on_first_local_and_a_left_node_is_named(rc):
    cluster = sray.start(name="late")
    try:
        before = set(cluster.nodes())
        node = rc.add_node(**NODE_ARGS)
        rc.wait_for_nodes()
        new = [n for n in _alive_nodes() if n not in before]
        assert len(new) == 1
        r = ray.get(_pinned(_on_node_make, new[0]).remote(cluster, "late-q"), timeout=180)
        assert r["node"] == new[0] and r["fast"]
        assert new[0] in cluster.nodes()
        pid = cluster.nodes()[new[0]]["pid"]
        rc.remove_node(node)
        _wait(lambda: new[0] not in _alive_nodes(), 60, "the node leaves")
        with pytest.raises(RayClusterError, match="has left the Ray cluster"):
            cluster.on(new[0])
        _wait(lambda: not _pids_alive([pid]), 60, "the left node's daemon exits with its actor")
    finally:
        cluster.shutdown()


@ray.remote(num_cpus=0)
class _AsyncTaker:
    """A Ray async actor: awaits syncmgr ops on its event loop."""

    async def take(self, here_q, there_q, there_lock, waiting):
        from syncmgr import _fast

        got_here = await here_q.aio.get(timeout=30)  # its own node's daemon: the fast path
        async with there_lock.aio:  # another node's daemon: over TCP+TLS
            got_there = await there_q.aio.get(timeout=30)
        waits = [asyncio.ensure_future(there_q.aio.get(timeout=30)) for _ in range(50)]
        await asyncio.sleep(0.2)
        cancelled = waits.pop()
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)  # settled on the daemon
        waiting.set()  # only now are the items put: the cancelled get can have taken none
        return {"here": got_here, "there": got_there, "fast_here": _fast.active(here_q) == _fast.enabled_by_env(),
                "dial_there": there_q._client.dial, "rest": await asyncio.gather(*waits)}


def test_an_async_actor_awaits_on_its_node_and_over_tls(rc):
    cluster = sray.start()
    try:
        nodes = cluster.nodes()
        a, b = sorted(nodes)
        made = {nid: ray.get(_pinned(_on_node_make, nid).remote(cluster, f"aq-{nid[:8]}"), timeout=120)
                for nid in (a, b)}
        there_lock = cluster.on(a).Lock(name=f"aq-{a[:8]}-lock")
        waiting = cluster.on(a).Event()
        actor = _pinned(_AsyncTaker, b).remote()
        job = actor.take.remote(made[b]["q"], made[a]["q"], there_lock, waiting)
        assert waiting.wait(120), "the actor did not start its gets"
        feeder = cluster.on(a).Queue(name=f"aq-{a[:8]}")
        for i in range(49):
            feeder.put(i)
        r = ray.get(job, timeout=120)
        assert r["here"] == ("from", b) and r["there"] == ("from", a)
        assert r["fast_here"] and r["dial_there"] == nodes[a]["tcp"]
        assert sorted(r["rest"]) == list(range(49))  # the cancelled get took nothing
        assert feeder.qsize() == 0
        ray.kill(actor)
    finally:
        cluster.shutdown()

