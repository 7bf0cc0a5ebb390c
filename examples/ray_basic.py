"""Plain Lock / Event / Queue / ndarray across Ray tasks, without cpprb.

Four tasks add to a counter under a Lock, write their rank into a shared
numpy array, wait for a start Event and report through a Queue.

    python examples/ray_basic.py
"""

from __future__ import annotations

import sys

import numpy as np
import ray

import syncmgr


@ray.remote
def worker(rank: int, lock, start, results, counter, arr) -> None:
    if not start.wait(timeout=60):
        raise TimeoutError("start event never set")
    for _ in range(100):
        with lock:
            counter.value += 1          # a read-modify-write made safe by the lock
    arr[rank] = rank + 1                # zero-copy: the driver sees this write
    results.put((rank, np.full(3, rank)))


def main() -> int:
    with syncmgr.Manager() as m:
        ray.init(num_cpus=2, include_dashboard=False, runtime_env=m.runtime_env())
        try:
            lock, start, results = m.Lock(), m.Event(), m.Queue()
            counter = m.Value("i", 0)
            arr = m.ndarray((4,), np.int64)
            tasks = [worker.remote(r, lock, start, results, counter, arr) for r in range(4)]
            start.set()
            ray.get(tasks, timeout=120)
            got = sorted(results.get(timeout=10)[0] for _ in range(4))
            print("counter:", counter.value, "array:", arr.tolist(), "ranks:", got)
            return 0 if counter.value == 400 and arr.tolist() == [1, 2, 3, 4] and got == [0, 1, 2, 3] else 1
        finally:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
