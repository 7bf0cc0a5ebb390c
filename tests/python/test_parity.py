"""SyncManager parity: Condition, Barrier, JoinableQueue, dict, list, Namespace."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
import time

import pytest

import syncmgr


def _notifier(cond, flag):
    time.sleep(0.2)
    with cond:
        flag.value = 1
        cond.notify()


def test_condition_notified_from_another_process(m):
    lock = m.Lock()
    cond, flag = m.Condition(lock), m.Value("i", 0)
    p = mp.get_context("spawn").Process(target=_notifier, args=(cond, flag))
    with cond:
        p.start()
        assert cond.wait_for(lambda: flag.value == 1, timeout=30)
    p.join(30)
    assert p.exitcode == 0


def test_condition_rules(m):
    cond = m.Condition()
    with pytest.raises(RuntimeError):
        cond.wait(0.01)  # not holding the lock
    with pytest.raises(RuntimeError):
        cond.notify()
    with cond:
        assert cond.wait(0.05) is False
        cond.notify_all()  # nobody waits: fine
    rl = m.RLock()
    c2 = m.Condition(rl)
    with c2, c2:  # an RLock condition nests
        assert c2.wait(0.01) is False  # releases both levels, then restores them
    with pytest.raises(TypeError):
        m.Condition(m.Semaphore())


def _party(barrier, out):
    out.put(barrier.wait(timeout=30))


def test_barrier_with_parties_in_three_processes(m):
    b = m.Barrier(3)
    out = m.Queue()
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=_party, args=(b, out)) for _ in range(3)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
    assert sorted(out.get(timeout=5) for _ in range(3)) == [0, 1, 2]
    assert b.parties == 3 and b.n_waiting == 0 and not b.broken


def test_barrier_action_timeout_abort_reset(m):
    hits = m.Value("i", 0)
    b = m.Barrier(2, action=None)
    with pytest.raises(threading.BrokenBarrierError):
        b.wait(timeout=0.05)  # nobody else came: the barrier breaks
    assert b.broken
    b.reset()
    assert not b.broken
    b2 = m.Barrier(1, action=hits.add)
    assert b2.wait() == 0 and hits.value == 1  # the action ran in this (last) party
    b.abort()
    with pytest.raises(syncmgr.BrokenBarrierError):
        b.wait(1)


def _worker(jq):
    while True:
        item = jq.get(timeout=30)
        if item is None:
            jq.task_done()
            return
        jq.task_done()


def test_joinable_queue_join_returns_when_workers_are_done(m):
    jq = m.JoinableQueue()
    for i in range(20):
        jq.put(i)
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=_worker, args=(jq,)) for _ in range(2)]
    for p in ps:
        p.start()
    for _ in ps:
        jq.put(None)
    assert jq.join(timeout=60) is True
    for p in ps:
        p.join(30)
    with pytest.raises(ValueError):
        jq.task_done()


def _updater(d, rank, n):
    for i in range(n):
        d[(rank, i)] = i
        d.update({f"u{rank}-{i}": rank})


def test_dict_concurrent_updates_lose_nothing(m):
    d = m.dict()
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=_updater, args=(d, r, 25)) for r in range(4)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
    assert len(d) == 4 * 25 * 2
    assert d[(3, 24)] == 24 and d["u2-0"] == 2


def test_dict_methods(m):
    d = m.dict({"a": 1}, b=2)
    d[1] = "one"
    assert d[1.0] == "one" and d[True] == "one"  # equal keys are one key, as in a dict
    assert set(d.keys()) == {"a", "b", 1} and d.get("zz", 5) == 5
    assert d.setdefault("c", 3) == 3 and d.setdefault("c", 4) == 3
    assert d.pop("c") == 3 and d.pop("c", None) is None
    with pytest.raises(KeyError):
        d["nope"]
    with pytest.raises(KeyError):
        del d["nope"]
    with pytest.raises(TypeError):
        d[[1, 2]] = 1  # unhashable
    assert "a" in d and "zz" not in d
    k, v = d.popitem()
    assert (k, v) == (1, "one")
    assert d.copy() == {"a": 1, "b": 2}
    d2 = pickle.loads(pickle.dumps(d))
    assert d2["b"] == 2
    d.clear()
    assert len(d) == 0


def test_list_methods(m):
    lst = m.list([3, 1, 2])
    lst.append(4)
    lst += [5]
    assert list(lst) == [3, 1, 2, 4, 5] and len(lst) == 5 and lst[-1] == 5
    lst.sort()
    assert lst[:] == [1, 2, 3, 4, 5]
    lst.reverse()
    assert lst[0] == 5
    lst[1:3] = ["x"]
    assert lst.copy() == [5, "x", 2, 1]
    del lst[0]
    lst.insert(0, "first")
    assert lst.index("x") == 1 and lst.count(2) == 1 and 2 in lst
    lst.remove(2)
    assert lst.pop() == 1 and lst.pop(0) == "first"
    with pytest.raises(IndexError):
        lst[10]
    with pytest.raises(ValueError):
        lst.remove("absent")
    lst *= 2
    assert lst.copy() == ["x", "x"]


def test_namespace(m):
    ns = m.Namespace(x=1)
    ns.y = "why"
    assert ns.x == 1 and ns.y == "why"
    del ns.x
    with pytest.raises(AttributeError):
        _ = ns.x
    ns2 = pickle.loads(pickle.dumps(ns))
    assert ns2.y == "why"
