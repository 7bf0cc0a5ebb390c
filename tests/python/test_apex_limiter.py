"""The demo's rate limiter (examples/apex/limiter.py) on syncmgr objects, in real processes:
neither side runs ahead past its tolerance, and stop releases both sides."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from typing import Any

import pytest

from conftest import REPO, wait_until

sys.path.insert(0, os.path.join(REPO, "examples"))

from apex.limiter import RateLimiter  # noqa: E402

SPI, MIN_SIZE, EB = 4.0, 100, 200.0  # max_diff 600, min_diff 200


def make_limiter(m: Any) -> RateLimiter:
    return RateLimiter(m.Condition(), m.Value("q", 0), m.Value("q", 0), m.Value("q", 0), m.Value("q", 0),
                       samples_per_insert=SPI, min_size=MIN_SIZE, error_buffer=EB)


def _inserter(lim: RateLimiter, n: int, ops: int, result: Any) -> None:
    done = 0
    while done < ops and lim.insert(n):
        done += 1
    result.value = done


def _sampler(lim: RateLimiter, n: int, result: Any) -> None:
    done = 0
    while lim.sample(n):
        done += 1
    result.value = done


def invariant_ok(lim: RateLimiter, i: int, s: int) -> bool:
    diff = i * lim.spi - s
    return diff <= lim.max_diff and (i < lim.min_size or diff >= lim.min_diff) and (i >= lim.min_size or s == 0)


def test_the_rule_on_numbers() -> None:
    lim = RateLimiter.local(samples_per_insert=SPI, min_size=MIN_SIZE, error_buffer=EB)
    assert lim.can_insert(0, 0, MIN_SIZE) and not lim.can_sample(MIN_SIZE - 1, 0, 1)
    assert lim.can_insert(140, 0, 10) and not lim.can_insert(141, 0, 10)  # (i + n) * 4 <= 600
    assert lim.can_sample(100, 180, 20) and not lim.can_sample(100, 181, 20)  # 400 - (s + n) >= 200
    with pytest.raises(ValueError):
        lim.insert(101)  # 404 > 2 * 200: could never pass
    assert lim.insert(MIN_SIZE, timeout=0) and not lim.insert(60, timeout=0)  # 160 * 4 > 600
    assert lim.counts() == (MIN_SIZE, 0)  # a refused call counted nothing


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_an_inserter_alone_stops_at_its_tolerance_and_stop_releases_it(m, method) -> None:
    lim = make_limiter(m)
    ctx = mp.get_context(method)
    result = ctx.Value("q", -1)
    p = ctx.Process(target=_inserter, args=(lim, 10, 10_000, result))
    p.start()
    try:
        assert wait_until(lambda: lim.peek()[0] == 150, timeout=60)  # (150 + 10) * 4 > 600: the 16th blocks
        time.sleep(0.5)
        assert p.is_alive() and lim.counts() == (150, 0)
        lim.stop()
        p.join(60)
        assert p.exitcode == 0 and result.value == 15
        assert lim.counts() == (150, 0)  # the released call counted nothing
        assert not lim.insert(1) and not lim.sample(1)  # and every later call is refused at once
    finally:
        p.kill()


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_sampler_alone_waits_for_min_size_then_stops_at_its_tolerance(m, method) -> None:
    lim = make_limiter(m)
    ctx = mp.get_context(method)
    result = ctx.Value("q", -1)
    p = ctx.Process(target=_sampler, args=(lim, 20, result))
    p.start()
    try:
        time.sleep(0.5)
        assert p.is_alive() and lim.counts() == (0, 0)  # nothing to sample before min_size
        assert lim.insert(MIN_SIZE, timeout=10)
        assert wait_until(lambda: lim.peek()[1] == 200, timeout=60)  # 400 - 220 < 200: the 11th blocks
        time.sleep(0.5)
        assert p.is_alive() and lim.counts() == (MIN_SIZE, 200)
        lim.stop()
        p.join(60)
        assert p.exitcode == 0 and result.value == 10
        assert lim.counts() == (MIN_SIZE, 200)
    finally:
        p.kill()


def test_inserters_and_a_sampler_stay_within_the_tolerance(m) -> None:
    lim = make_limiter(m)
    ctx = mp.get_context("spawn")
    ops, n, batch = 400, 7, 16
    results = [ctx.Value("q", -1) for _ in range(3)]
    procs = [ctx.Process(target=_inserter, args=(lim, n, ops, results[i])) for i in range(2)]
    procs.append(ctx.Process(target=_sampler, args=(lim, batch, results[2])))
    for p in procs:
        p.start()
    snapshots = bad = 0
    try:
        deadline = time.monotonic() + 120
        while any(p.is_alive() for p in procs[:2]) and time.monotonic() < deadline:
            i, s = lim.counts()
            snapshots += 1
            bad += not invariant_ok(lim, i, s)
        for p in procs[:2]:
            p.join(30)
        assert [r.value for r in results[:2]] == [ops, ops]  # both inserters got through: no deadlock
        total = 2 * ops * n
        # The sampler drains down to the lower bound, then waits there.
        last = (total * SPI - lim.min_diff) // batch * batch
        assert wait_until(lambda: lim.peek()[1] == last, timeout=60), lim.counts()
        i, s = lim.counts()
        assert (i, s) == (total, last) and invariant_ok(lim, i, s)
        assert procs[2].is_alive()
        lim.stop()
        procs[2].join(60)
        assert procs[2].exitcode == 0 and results[2].value == last // batch
    finally:
        for p in procs:
            p.kill()
    assert snapshots > 10 and bad == 0, (snapshots, bad)
