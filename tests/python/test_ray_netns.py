"""syncmgr.ray across two "hosts": a Ray head node in one network namespace
and a Ray worker node in another, joined over a veth pair (10.250.0.1 and
10.250.0.2, addresses that exist only inside them); the worker node also has
its own /dev/shm (a private mount namespace), as another machine would.

A driver in the head's namespace starts syncmgr.ray: each node gets its own
daemon; a task on each node reaches its node's daemon on the fast path and
makes a Queue and a segment there; the worker node's Queue, pickled to a
task on the head node, is used there over TCP+TLS to 10.250.0.2 (pinned);
the worker node's segment is in its own /dev/shm, not the head's; and
shutdown() leaves no daemon.

Needs root, iproute2 and util-linux (skipped with the reason otherwise).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

pytest.importorskip("ray")
from test_multinode import _REASON, HEAD_IP, WORKER_IP, two_hosts  # noqa: E402

pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

RAY = os.path.join(os.path.dirname(sys.executable), "ray")

DRIVER = textwrap.dedent(r"""
    import glob, json, os, sys, time, ray
    import syncmgr.ray as sray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False)
    head_ip, worker_ip = sys.argv[2], sys.argv[3]
    nodes = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert set(nodes) == {head_ip, worker_ip}, nodes
    cluster = sray.start()
    info = cluster.nodes()
    assert set(info) == set(nodes.values()), info

    @ray.remote(num_cpus=0)
    def make(cluster, name):
        from syncmgr import _fast
        m = cluster.local()
        q = m.Queue(name=name)
        q.put({"made on": ray.util.get_node_ip_address()})
        seg = m.SharedMemory(name=name + "-seg", create=True, size=4096)
        here = sorted(os.path.basename(f) for f in glob.glob("/dev/shm/*" + name + "-seg"))
        return {"fast": _fast.active(q) == _fast.enabled_by_env(), "q": q, "shm_here": here,
                "pid": m.status()["server"]["pid"]}

    @ray.remote(num_cpus=0)
    def take(q):
        c = q._client
        return {"item": q.get(timeout=30), "dial": c.dial, "pinned": c.route.pin is not None,
                "on": ray.util.get_node_ip_address()}

    on = lambda ip: NodeAffinitySchedulingStrategy(nodes[ip], soft=False)
    w = ray.get(make.options(scheduling_strategy=on(worker_ip)).remote(cluster, "netns-w"), timeout=120)
    h = ray.get(make.options(scheduling_strategy=on(head_ip)).remote(cluster, "netns-h"), timeout=120)
    assert w["fast"] and h["fast"], (w, h)
    assert w["pid"] == info[nodes[worker_ip]]["pid"] and h["pid"] == info[nodes[head_ip]]["pid"]
    assert w["shm_here"] and h["shm_here"]
    head_shm = glob.glob("/dev/shm/*netns-w-seg")   # the driver runs in the head's mount namespace
    assert not head_shm, head_shm                     # the worker node's segment is in its own /dev/shm
    t = ray.get(take.options(scheduling_strategy=on(head_ip)).remote(w["q"]), timeout=120)
    assert t["item"] == {"made on": worker_ip} and t["on"] == head_ip, t
    assert t["dial"] == f"tcp://{worker_ip}:" + info[nodes[worker_ip]]["tcp"].rsplit(":", 1)[1] and t["pinned"], t
    pids = [i["pid"] for i in info.values()]
    cluster.shutdown()
    deadline = time.monotonic() + 30
    def alive():
        out = []
        for p in pids:
            try:
                os.kill(p, 0); out.append(p)
            except ProcessLookupError:
                pass
        return out
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(), alive()
    print("netns: OK", json.dumps({"worker_dial": t["dial"]}), flush=True)
""")


def _netns(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


@pytest.mark.skipif(os.environ.get("SYNCMGR_FASTPATH") == "0",
                    reason="the subject is the topology (a node's own network and /dev/shm); the socket path "
                           "across nodes is covered in this pass by test_ray_cluster and test_multinode")
def test_a_ray_worker_node_in_another_namespace_gets_its_own_daemon() -> None:
    tmp = tempfile.mkdtemp(prefix="smr", dir="/tmp")
    made: list[str] = []
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    try:
        head, worker = two_hosts("smr", made)
        common = ["--num-cpus", "2", "--object-store-memory", str(80 << 20), "--disable-usage-stats"]
        r = subprocess.run(_netns(head, RAY, "start", "--head", "--node-ip-address", HEAD_IP, "--port", "6379",
                                  "--include-dashboard=false", "--temp-dir", os.path.join(tmp, "h"), *common),
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        # The worker node: its own network and its own /dev/shm.
        start_worker = (f"mount -t tmpfs -o size=256m tmpfs /dev/shm && exec {RAY} start --address {HEAD_IP}:6379 "
                        f"--node-ip-address {WORKER_IP} --temp-dir {os.path.join(tmp, 'w')} " + " ".join(common))
        r = subprocess.run(_netns(worker, "unshare", "-m", "--propagation", "private", "sh", "-c", start_worker),
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        r = subprocess.run(_netns(head, sys.executable, "-c", DRIVER, f"{HEAD_IP}:6379", HEAD_IP, WORKER_IP),
                           capture_output=True, text=True, timeout=170, env=env)
        assert r.returncode == 0 and "netns: OK" in r.stdout, r.stdout[-3000:] + r.stderr[-5000:]
    finally:
        # `ray stop` finds Ray's processes by name, in every namespace: this
        # test's two nodes (nothing else runs Ray while it does).
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120, env=env)
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
