"""syncmgr with plain multiprocessing (no Ray): a drop-in for Manager().

    python examples/mp_basic.py
"""

from __future__ import annotations

import multiprocessing as mp
import sys

import syncmgr


def work(rank: int, lock, counter, q) -> None:
    for _ in range(200):
        with lock:
            counter.value += 1
    counter.add(1000)                   # atomic on the server, no lock needed
    q.put(f"worker {rank} done")


def main() -> int:
    ctx = mp.get_context("spawn")       # fork works too
    with syncmgr.Manager() as m:
        lock, counter, q = m.Lock(), m.Value("i", 0), m.Queue()
        procs = [ctx.Process(target=work, args=(r, lock, counter, q)) for r in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=60)
        msgs = [q.get(timeout=10) for _ in procs]
        print(*sorted(msgs), sep="\n")
        print("counter:", counter.value)
        return 0 if counter.value == 4 * 1200 else 1


if __name__ == "__main__":
    sys.exit(main())
