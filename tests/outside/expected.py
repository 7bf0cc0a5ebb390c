"""The outside suites' expected failures under syncmgr, each with its reason.

A test listed here may fail (or error) under the start methods named; any
other failure is a regression and fails ``make test-outside``. Two kinds:

* ``difference``: syncmgr differs from SyncManager on purpose (documented in
  docs/python.md). If such a test starts passing, the run fails: the
  difference is gone and its entry must go too.
* ``fixed_on``: a client bug whose fix is on another branch, not yet merged
  into this one. When the fix arrives the test passes; the run then prints
  a note to remove the entry but does not fail, so branches merge in any order.

Test ids are ``Class.test_name`` as the suite module generates them; for the
CPython suite they depend on the interpreter's ``test/_test_multiprocessing.py``
(the ids below are from CPython 3.11).
"""

from __future__ import annotations

from dataclasses import dataclass

ALL = ("fork", "spawn", "forkserver")


@dataclass(frozen=True)
class Expected:
    reason: str
    methods: tuple[str, ...] = ALL
    difference: bool = False  # on purpose; else a bug with fixed_on
    fixed_on: str = ""  # the branch that fixes it
    # The outcome races with the daemon noticing a child's exit (the parent's
    # release may run before the child's holdings are given back): a pass is
    # accepted too, and does not mean the difference is gone.
    racy: bool = False


EXPECTED: dict[str, dict[str, Expected]] = {
    "cpython-manager": {
        "TestSyncManagerTypes.test_lock": Expected(
            "a child acquires the Lock and exits without releasing it; syncmgr releases a dead "
            "process's locks, so the parent's release() then raises RuntimeError (NotOwnerError), "
            "where SyncManager leaves the lock held for ever and lets any process release it",
            difference=True,
            racy=True,
        ),
        "TestSyncManagerTypes.test_bounded_semaphore": Expected(
            "a child acquires the BoundedSemaphore and exits; syncmgr gives a dead process's "
            "acquisitions back, so the parent's release() then exceeds the bound and raises "
            "ValueError, where SyncManager keeps the child's acquisition for ever",
            difference=True,
            racy=True,
        ),
    },
    "cpprb": {},
}
