"""syncmgr against CPython's SyncManager (and Redis), side by side, in one run.

    .venv/bin/python -m bench                 # full run (~3-5 min on 2 cores), rewrites docs/benchmarks.md
    .venv/bin/python -m bench --smoke         # < 60 s, changes no file; exit status 0 if everything ran
    .venv/bin/python -m bench --quick --out /tmp/b.md
    make bench BENCH_ARGS="--install-redis"         # with Redis columns (apt-get installs redis-server)

Everything runs on this machine, in this run, on the same work:

* syncmgr: the Go daemon (``$SYNCMGR_BIN``, else ``bin/syncmgr``) on a private
  Unix socket, driven through the Python client ``syncmgr``;
* SyncManager: ``multiprocessing.managers.SyncManager`` on a Unix socket, same
  Python interpreter;
* Redis (optional): ``redis-server`` on a Unix socket, driven by redis-py;
* the floor: a raw round trip over a Unix socket to a tiny echo process.

Results go to stdout as tables with ratios and PASS/MISS lines for the targets
(a miss never fails the run). A full or ``--quick`` run with ``--out`` also
writes a Markdown report with PNG plots (matplotlib). ``bench/analysis.md``,
when present, is copied into the report as the explanation of the numbers.

The package, by role:

* ``systems``: the systems under test, started privately (syncmgr daemon,
  SyncManager, Redis, the echo floor);
* ``workloads``: what each system is asked to do (latency operations,
  throughput loops, the cpprb explorer);
* ``runner``: the interleaved rounds and ``run``, which measures everything;
* ``report`` and ``plots``: tables, PASS/MISS targets, PNGs and the
  docs/benchmarks.md writer;
* ``cli``: the command line (``python -m bench``);
* ``common``: bookkeeping shared by all of them.

Only the standard library is imported at module level: the SyncManager server
is started with the ``spawn`` method, and it should not carry numpy or
matplotlib in its footprint.
"""
