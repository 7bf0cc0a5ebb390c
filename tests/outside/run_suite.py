"""Run one outside suite under one start method and write its outcomes as JSON.

    python tests/outside/run_suite.py cpython-manager fork --manager syncmgr --out result.json

Each test gets a time limit (``--test-timeout``): when it passes, SIGALRM
raises ``TestTimeout`` in the test, which then counts as an error, and the run
goes on. The outcome of every test (passed, failed, error, skipped,
xfail, xpass) is written with its message; ``run_outside.py`` compares them
with the expectations in ``expected.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
import unittest
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))

SUITES = {"cpython-manager": "cpython_manager", "cpprb": "cpprb_mp"}


class TestTimeout(Exception):
    """The test ran past its time limit."""


class Recorder(unittest.TestResult):
    """Keeps one outcome per test id, and bounds each test's time with SIGALRM."""

    def __init__(self, timeout: float, verbose: bool) -> None:
        super().__init__()
        self.timeout = timeout
        self.verbose = verbose
        self.outcomes: dict[str, dict[str, Any]] = {}
        self._t0 = 0.0

    @staticmethod
    def _id(test: Any) -> str:
        # "module.Class.test_x" -> "Class.test_x"; class fixtures ("setUpClass (module.Class)") keep their text.
        tid = test.id()
        parts = tid.split(".")
        return ".".join(parts[-2:]) if len(parts) >= 2 and " " not in tid else tid

    def _record(self, test: Any, outcome: str, detail: str = "") -> None:
        tid = self._id(test)
        prev = self.outcomes.get(tid)
        if prev is not None and prev["outcome"] in ("failed", "error"):
            return  # a failing subtest or teardown error keeps the first failure
        self.outcomes[tid] = {"outcome": outcome, "detail": detail[-3000:],
                              "seconds": round(time.monotonic() - self._t0, 3)}
        if self.verbose:
            print(f"{tid}: {outcome}", file=sys.stderr, flush=True)

    def startTest(self, test: Any) -> None:  # noqa: N802
        super().startTest(test)
        self._t0 = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, self.timeout)

    def stopTest(self, test: Any) -> None:  # noqa: N802
        signal.setitimer(signal.ITIMER_REAL, 0)
        super().stopTest(test)

    def addSuccess(self, test: Any) -> None:  # noqa: N802
        self._record(test, "passed")

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self._record(test, "xfail", self._exc_info_to_string(err, test))

    def addUnexpectedSuccess(self, test: Any) -> None:  # noqa: N802
        self._record(test, "xpass")

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        if err is not None:
            kind = "failed" if issubclass(err[0], test.failureException) else "error"
            self._record(test, kind, f"{subtest}: " + self._exc_info_to_string(err, test))


def _on_alarm(signum: int, frame: Any) -> None:
    raise TestTimeout("the test ran past its time limit")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("start_method", choices=["fork", "spawn", "forkserver"])
    ap.add_argument("--manager", choices=["syncmgr", "stock"], default="syncmgr")
    ap.add_argument("--test-timeout", type=float, default=60.0)
    ap.add_argument("--out", help="write the JSON result here (default: stdout)")
    ap.add_argument("-k", dest="pattern", action="append", help="only tests whose id contains this")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)

    # Children (spawn, forkserver) import the suite module by name: they
    # inherit this environment and sys.path.
    os.environ["SYNCMGR_OUTSIDE_START_METHOD"] = args.start_method
    os.environ["SYNCMGR_OUTSIDE_MANAGER"] = args.manager
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import importlib

    mod = importlib.import_module(SUITES[args.suite])
    result: dict[str, Any] = {"suite": args.suite, "start_method": args.start_method, "manager": args.manager,
                              "python": sys.version.split()[0], "unavailable": mod.UNAVAILABLE, "tests": {}}
    t0 = time.monotonic()
    if mod.UNAVAILABLE is None:
        loader = unittest.TestLoader()
        if args.pattern:
            loader.testNamePatterns = [f"*{p}*" for p in args.pattern]
        suite = loader.loadTestsFromModule(mod)
        rec = Recorder(args.test_timeout, args.verbose)
        signal.signal(signal.SIGALRM, _on_alarm)
        try:
            suite.run(rec)
        except BaseException:  # noqa: BLE001 - report what ran, and the crash
            result["crash"] = traceback.format_exc()
        result["tests"] = rec.outcomes
    result["seconds"] = round(time.monotonic() - t0, 1)
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
