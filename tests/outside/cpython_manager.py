"""CPython's own SyncManager tests, with syncmgr's manager in place of the stock one.

The tests are the interpreter's ``test/_test_multiprocessing.py`` (the stdlib
``test`` package), located at run time; the classes are generated as CPython's
``test_multiprocessing_<method>/test_manager.py`` generates them, with
``install_tests_in_module_dict(..., only_type='manager')``. Two families are
left out because they test ``SyncManager`` itself rather than the objects a
manager serves: the Pool tests and the ``BaseManager.register`` tests (custom
manager classes, remote managers, manager restart).

To these the module adds ``TestSyncManagerTypes``, the file's one plain
TestCase about managers (CPython runs it among the "misc" tests, so
``only_type='manager'`` leaves it out): each object type is handed to a child
process that uses it. It makes its manager with ``manager_class()``, set to
syncmgr's here; its ``test_pool`` is left out.

The manager is substituted at the one point ``ManagerMixin.setUpClass``
creates it (``cls.manager = multiprocessing.Manager()``): while that method
runs, ``multiprocessing.Manager`` returns a started ``syncmgr.Manager``.

This module is imported again by spawned and forkserver children (they
unpickle test methods by module and class name), so it reads its settings
from the environment, which children inherit:

* ``SYNCMGR_OUTSIDE_START_METHOD``: fork, spawn or forkserver;
* ``SYNCMGR_OUTSIDE_MANAGER``: ``syncmgr`` (default) or ``stock``.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.managers
import os
import unittest
from collections.abc import Iterator
from typing import Any, Optional

START_METHOD = os.environ.get("SYNCMGR_OUTSIDE_START_METHOD", "fork")
MANAGER = os.environ.get("SYNCMGR_OUTSIDE_MANAGER", "syncmgr")

# Generated classes (With<Type><Name>) that are not run, and why.
EXCLUDED = {
    "WithManagerTestPool": "Pool: syncmgr serves objects, not process pools",
    "WithManagerTestMyManager": "BaseManager.register: custom SyncManager subclasses",
    "WithManagerTestRemoteManager": "BaseManager.register: a remote BaseManager server",
    "WithManagerTestManagerRestart": "BaseManager.register: restarting a BaseManager server",
}

# Single tests that are not run, and why.
EXCLUDED_TESTS = {
    "TestSyncManagerTypes.test_pool": "Pool: syncmgr serves objects, not process pools",
}

# Why the suite cannot run here, or None.
UNAVAILABLE: Optional[str] = None

try:
    from test import _test_multiprocessing as cpy  # type: ignore[import-not-found]
except ImportError as e:  # the stdlib test package is optional (Debian: libpython3.X-testsuite)
    cpy = None
    UNAVAILABLE = f"the interpreter's stdlib `test` package is missing ({e})"
except Exception as e:  # noqa: BLE001 - the module raises unittest.SkipTest on broken platforms
    cpy = None
    UNAVAILABLE = f"test._test_multiprocessing cannot run here: {type(e).__name__}: {e}"


def _syncmgr_manager_class() -> type:
    import syncmgr

    class TestedManager(syncmgr.Manager):
        """syncmgr.Manager plus the three SyncManager methods that
        ManagerMixin.tearDownClass calls on the manager it made."""

        def _objects(self) -> list[dict[str, Any]]:
            return list(self.status().get("objects", []))

        def _number_of_objects(self) -> int:
            return len(self._objects())

        def _debug_info(self) -> str:
            return "\n".join(f"  {o['kind']} {o['name']}: {o.get('state', '')}" for o in self._objects())

        def join(self, timeout: Optional[float] = None) -> None:
            """shutdown() has already waited for the embedded daemon."""

    return TestedManager


def _install(globs: dict[str, Any]) -> None:
    assert cpy is not None
    cpy.install_tests_in_module_dict(globs, START_METHOD, only_type="manager")
    for name in EXCLUDED:
        globs.pop(name, None)
    if MANAGER not in ("syncmgr", "stock"):
        raise ValueError(f"SYNCMGR_OUTSIDE_MANAGER={MANAGER!r}: want syncmgr or stock")
    tested = _syncmgr_manager_class() if MANAGER == "syncmgr" else multiprocessing.managers.SyncManager

    class TestSyncManagerTypes(cpy.TestSyncManagerTypes):  # type: ignore[name-defined,misc]
        manager_class = tested

    TestSyncManagerTypes.__module__ = globs["__name__"]
    TestSyncManagerTypes.__qualname__ = "TestSyncManagerTypes"
    globs["TestSyncManagerTypes"] = TestSyncManagerTypes
    if MANAGER == "stock":
        return
    stock_setup = cpy.ManagerMixin.setUpClass.__func__

    def manager() -> Any:
        return tested().start()

    def setUpClass(cls: Any) -> None:  # noqa: N802 - unittest's name
        saved = multiprocessing.Manager
        multiprocessing.Manager = manager  # type: ignore[assignment]
        try:
            stock_setup(cls)
        finally:
            multiprocessing.Manager = saved  # type: ignore[assignment]

    cpy.ManagerMixin.setUpClass = classmethod(setUpClass)


def load_tests(loader: unittest.TestLoader, tests: unittest.TestSuite, pattern: Any) -> unittest.TestSuite:
    """unittest's hook: the module's tests without EXCLUDED_TESTS."""

    def keep(suite: unittest.TestSuite) -> Iterator[unittest.TestCase]:
        for t in suite:
            if isinstance(t, unittest.TestSuite):
                yield from keep(t)
            elif ".".join(t.id().split(".")[-2:]) not in EXCLUDED_TESTS:
                yield t

    return unittest.TestSuite(keep(tests))


if cpy is not None:
    _install(globals())
