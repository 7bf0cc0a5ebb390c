"""Run the outside test suites with syncmgr (and the stock manager, to compare)
and check the outcomes against expected.py. ``make test-outside`` runs this.

For each suite and start method it prints one line, e.g.::

    cpython-manager[fork]: 39 passed, 1 failed (expected), 4 skipped | stock: 40 passed, 4 skipped

and exits 1 if, under syncmgr, a test fails that expected.py does not list
for that start method, a listed difference passes, a test that passes with
the stock manager is skipped or missing, or a run crashes or times out. A
test that fails unexpectedly is run once more on its own, in a fresh
process, before it counts (timing tests on a loaded machine); a pass on that
retry is reported as such.

Each suite and start method runs in its own process (``run_suite.py``) with
its own private daemon, so runs are independent and ``-j`` of them run at once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from expected import EXPECTED  # noqa: E402

RUNS = [("cpython-manager", "fork"), ("cpython-manager", "spawn"), ("cpython-manager", "forkserver"),
        ("cpprb", "fork"), ("cpprb", "spawn"), ("cpprb", "forkserver")]
FAILED = ("failed", "error")


def run_suite(suite: str, method: str, manager: str, outdir: str, timeout: float, test_timeout: float,
              only: Optional[str] = None) -> dict[str, Any]:
    """One run_suite.py process; its JSON result, or a crash record."""
    tag = f"{suite}-{method}-{manager}" + (f"-retry-{only.replace('.', '-')}" if only else "")
    out, log = os.path.join(outdir, tag + ".json"), os.path.join(outdir, tag + ".log")
    cmd = [sys.executable, os.path.join(HERE, "run_suite.py"), suite, method, "--manager", manager,
           "--out", out, "--test-timeout", str(test_timeout)]
    if only:
        cmd += ["-k", only]
    t0 = time.monotonic()
    with open(log, "w") as lf:
        p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return {"crash": f"timed out after {timeout:.0f} s (log: {log})", "tests": {}, "log": log,
                    "seconds": round(time.monotonic() - t0, 1)}
    try:
        with open(out) as f:
            res: dict[str, Any] = json.load(f)
    except (OSError, ValueError) as e:
        return {"crash": f"exit code {rc}, no result ({e}; log: {log})", "tests": {}, "log": log,
                "seconds": round(time.monotonic() - t0, 1)}
    res["log"] = log
    return res


def counts(tests: dict[str, Any], expected: Optional[dict[str, Any]] = None) -> str:
    c = Counter(t["outcome"] for t in tests.values())
    parts = [f"{c['passed']} passed"]
    if expected is not None:
        exp = sum(1 for k, t in tests.items() if t["outcome"] in FAILED and k in expected)
        bad = c["failed"] + c["error"] - exp
        if exp:
            parts.append(f"{exp} failed (expected)")
        if bad:
            parts.append(f"{bad} FAILED")
    else:
        for k in FAILED:
            if c[k]:
                parts.append(f"{c[k]} {k}")
    for k in ("skipped", "xfail", "xpass", "retried"):
        if c[k]:
            parts.append(f"{c[k]} {k}")
    return ", ".join(parts)


def judge(suite: str, method: str, res: dict[str, Any], stock: Optional[dict[str, Any]],
          retry: Any) -> tuple[list[str], list[str]]:
    """Problems (fail the run) and notes (printed) for one syncmgr run."""
    problems: list[str] = []
    notes: list[str] = []
    exp = {k: e for k, e in EXPECTED.get(suite, {}).items() if method in e.methods}
    if res.get("unavailable"):
        return problems, notes
    if res.get("crash"):
        problems.append(f"the run crashed: {res['crash'].strip().splitlines()[-1]}")
    tests = res["tests"]
    for tid, t in sorted(tests.items()):
        e = exp.get(tid)
        if t["outcome"] in FAILED and e is None:
            again = retry(tid)
            if again is not None and again.get("outcome") == "passed":
                notes.append(f"{tid} failed, then passed when run alone (retried): "
                             f"{t['detail'].strip().splitlines()[-1] if t['detail'] else ''}")
                t["outcome"] = "retried"
                continue
            problems.append(f"{tid} {t['outcome']} (not in expected.py):\n{_indent(t['detail'])}")
        elif t["outcome"] == "passed" and e is not None:
            if e.difference and not e.racy:
                problems.append(f"{tid} passes: the documented difference is gone; remove it from expected.py")
            elif e.racy:
                notes.append(f"{tid} passed this time: the daemon had not yet seen the child's exit")
            else:
                notes.append(f"{tid} passes now (fixed on branch {e.fixed_on}): remove it from expected.py")
    for tid in sorted(set(exp) - set(tests)):
        notes.append(f"{tid} is in expected.py but did not run (another Python version?)")
    if stock is not None and not stock.get("crash"):
        for tid, t in sorted(stock["tests"].items()):
            mine = tests.get(tid, {}).get("outcome")
            if t["outcome"] == "passed" and mine in (None, "skipped"):
                problems.append(f"{tid} passes with the stock manager but was {mine or 'not run'} with syncmgr")
            elif t["outcome"] in FAILED:
                notes.append(f"{tid} {t['outcome']} with the stock manager too")
    return problems, notes


def _indent(text: str, n: int = 25) -> str:
    lines = text.strip().splitlines()[-n:]
    return "\n".join("      " + ln for ln in lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-j", "--jobs", type=int, default=2, help="runs at once (default 2)")
    ap.add_argument("--no-stock", action="store_true", help="skip the stock-manager comparison runs")
    ap.add_argument("--run-timeout", type=float, default=420.0, help="seconds per suite run")
    ap.add_argument("--test-timeout", type=float, default=60.0, help="seconds per test")
    ap.add_argument("--only", action="append", help="only these suite[method] runs, e.g. cpprb[spawn]")
    args = ap.parse_args(argv)

    runs = [r for r in RUNS if not args.only or f"{r[0]}[{r[1]}]" in args.only]
    managers = ["syncmgr"] if args.no_stock else ["syncmgr", "stock"]
    outdir = tempfile.mkdtemp(prefix="syncmgr-outside-")
    t0 = time.monotonic()
    jobs = [(s, m, mgr) for s, m in runs for mgr in managers]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futs = {j: pool.submit(run_suite, *j, outdir, args.run_timeout, args.test_timeout) for j in jobs}
        results = {j: f.result() for j, f in futs.items()}

    failed = False
    for suite, method in runs:
        res = results[(suite, method, "syncmgr")]
        stock = results.get((suite, method, "stock"))
        label = f"{suite}[{method}]"
        if res.get("unavailable"):
            print(f"{label}: not run: {res['unavailable']}")
            continue

        def retry(tid: str, suite: str = suite, method: str = method) -> Optional[dict[str, Any]]:
            again = run_suite(suite, method, "syncmgr", outdir, args.run_timeout, args.test_timeout, only=tid)
            return again.get("tests", {}).get(tid)

        problems, notes = judge(suite, method, res, stock, retry)
        exp = {k for k, e in EXPECTED.get(suite, {}).items() if method in e.methods}
        line = f"{label}: {counts(res['tests'], exp)}"
        if stock is not None:
            line += f" | stock: {counts(stock['tests'])}" + (" (crashed)" if stock.get("crash") else "")
        print(f"{line}  [{res.get('seconds', 0):.0f} s]")
        for n in notes:
            print(f"  note: {n}")
        for p in problems:
            print(f"  FAIL: {p}")
        if problems:
            print(f"  log: {res.get('log')}")
            failed = True
    where = f"; results and logs in {outdir}" if failed else ""
    print(f"outside suites: {'FAILED' if failed else 'ok'} in {time.monotonic() - t0:.0f} s "
          f"(python {sys.version.split()[0]}, {args.jobs} at once{where})")
    if not failed:
        shutil.rmtree(outdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
