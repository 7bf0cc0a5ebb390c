"""syncmgr proxies in real Ray tasks and actors, on one small local cluster per module."""

from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import wait_until

ray = pytest.importorskip("ray")
cpprb = pytest.importorskip("cpprb")


@pytest.fixture(scope="module")
def cluster(daemon):
    """One local Ray cluster for the module; workers get the daemon through runtime_env only."""
    env = {"env_vars": {"SYNCMGR_ADDRESS": daemon.address, "SYNCMGR_AUTHKEY": daemon.key.hex()}}
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=env, configure_logging=False,
             log_to_driver=False, object_store_memory=200 << 20)
    yield
    ray.shutdown()


@ray.remote(num_cpus=0.25)
def add_under_lock(bundle, n):
    lock, counter = bundle["lock"], bundle["counter"]
    for _ in range(n):
        with lock:
            counter.value = counter.value + 1
    return True


def test_lock_keeps_a_counter_exact_across_tasks(cluster, m):
    bundle = {"lock": m.Lock(), "counter": m.Value("i", 0)}  # proxies inside another object
    assert all(ray.get([add_under_lock.remote(bundle, 50) for _ in range(4)], timeout=120))
    assert bundle["counter"].value == 200


@ray.remote(num_cpus=0.25)
class Waiter:
    def __init__(self, ev, q):
        self.ev, self.q = ev, q

    def wait_and_report(self, rank):
        ok = self.ev.wait(60)
        self.q.put((rank, ok, np.full(4, rank)))
        return ok


def test_event_wakes_actors_and_queue_carries_numpy(cluster, m):
    ev, q = m.Event(), m.Queue()
    actors = [Waiter.remote(ev, q) for _ in range(3)]
    refs = [a.wait_and_report.remote(i) for i, a in enumerate(actors)]
    time.sleep(0.5)
    assert q.empty()
    ev.set()
    assert ray.get(refs, timeout=120) == [True] * 3
    got = sorted((q.get(timeout=30) for _ in range(3)), key=lambda t: t[0])
    assert [g[0] for g in got] == [0, 1, 2]
    assert all(np.array_equal(g[2], np.full(4, g[0])) for g in got)
    for a in actors:
        ray.kill(a)


@ray.remote(num_cpus=0.25)
def write_slot(arr, i):
    arr[i] = i * 10
    return arr.shape


def test_ndarray_written_by_tasks_is_seen_by_the_driver(cluster, m):
    arr = m.ndarray((4,), np.int64)
    assert ray.get([write_slot.remote(arr, i) for i in range(4)], timeout=120) == [(4,)] * 4
    assert arr.tolist() == [0, 10, 20, 30]


@ray.remote(num_cpus=0.25)
class Explorer:
    def __init__(self, rb):
        self.rb = rb

    def run(self, n):
        for i in range(n):
            self.rb.add(obs=np.full((4, 3), i), done=np.zeros((4, 1)))
        return n * 4


@pytest.mark.parametrize("backend", ["SharedMemory", "sharedctypes"])
@pytest.mark.parametrize("cls", ["MPReplayBuffer", "MPPrioritizedReplayBuffer"])
def test_cpprb_buffers_from_ray_actors(cluster, m, cls, backend):
    # "sharedctypes" is cpprb's default backend: its arrays come from m.Array,
    # i.e. daemon-owned segments that Ray pickles by name.
    rb = getattr(cpprb, cls)(1000, {"obs": {"shape": 3}, "done": {}}, ctx=m, backend=backend)
    explorers = [Explorer.remote(rb) for _ in range(2)]
    added = sum(ray.get([e.run.remote(10) for e in explorers], timeout=120))
    assert rb.get_stored_size() == added == 80
    s = rb.sample(8)
    assert s["obs"].shape == (8, 3) and s["done"].shape == (8, 1)
    for e in explorers:
        ray.kill(e)


@ray.remote(num_cpus=0.25)
class Holder:
    def hold(self, lock):
        self.lock = lock
        return lock.acquire(timeout=30)


def test_killing_an_actor_frees_its_lock(cluster, m):
    lock = m.Lock()
    h = Holder.remote()
    assert ray.get(h.hold.remote(lock), timeout=120) is True
    assert lock.acquire(False) is False
    ray.kill(h)
    assert wait_until(lambda: lock.acquire(False), timeout=30)
    lock.release()


@ray.remote(num_cpus=0.25)
def label_seen_by_daemon(ev):
    import os

    ev.set()  # connects, presenting this worker's default label
    return os.getpid(), ray.get_runtime_context().get_worker_id()


def test_ray_workers_are_labelled_with_their_worker_id(cluster, m, daemon):
    pid, worker_id = ray.get(label_seen_by_daemon.remote(m.Event()), timeout=120)
    labels = {s["pid"]: s["label"] for s in m.status()["sessions"]}
    assert labels[pid].endswith(f"ray worker {worker_id[:16]}"), labels[pid]


@ray.remote(num_cpus=0.25)
def _set_event_with_the_key_file(pickled_ev):
    import os
    import pickle

    # The module's cluster also passes the fixture daemon's key in
    # SYNCMGR_AUTHKEY (it would win over the file): this task goes without.
    saved = os.environ.pop("SYNCMGR_AUTHKEY", None)
    try:
        assert os.environ.get("SYNCMGR_AUTHKEY_FILE"), "no SYNCMGR_AUTHKEY_FILE in the worker"
        pickle.loads(pickled_ev).set()  # (unpickled here: the proxy's client takes its key now)
        return os.environ["SYNCMGR_ADDRESS"]
    finally:
        if saved is not None:
            os.environ["SYNCMGR_AUTHKEY"] = saved


def test_runtime_env_gives_workers_a_key_file_not_the_key(cluster):
    """Issue 22, finding 4: runtime_env() names the 0600 key file; a real Ray
    worker reads it and reaches the daemon; no form of the key is in what
    Ray keeps and shows (the runtime_env)."""
    import base64
    import json
    import pickle

    import syncmgr

    with syncmgr.Manager() as m2:
        env = m2.runtime_env()
        key = m2._authkey
        assert key
        blob = json.dumps(env).encode()
        assert not any(f in blob for f in (key, key.hex().encode(), key.hex().upper().encode(), base64.b64encode(key)))
        assert set(env["env_vars"]) >= {"SYNCMGR_ADDRESS", "SYNCMGR_AUTHKEY_FILE"}
        ev = m2.Event()
        addr = ray.get(_set_event_with_the_key_file.options(runtime_env=env).remote(pickle.dumps(ev)), timeout=120)
        assert addr == m2.address
        assert ev.is_set()
