"""The word families: Lock, RLock and a Condition's lock, Semaphore and
BoundedSemaphore, Event and numeric Value, each object a state word in the
daemon's segment that the C extension changes with one compare-and-swap.

A contended Lock, RLock or Semaphore acquire, and an Event wait, sleep on
the word's futex for their whole timeout, each holding an entry of the
segment's waiter table (so `syncmgr status` shows them); a waiter that has
waited 1 ms becomes the heir a release hands the lock to (docs/protocol.md,
"Waits").
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, cast

from .handle import Handle
from .segment import BUSY, OK, FastPath, _ext

if TYPE_CHECKING:
    from .._proxies import AcquirerProxy, BaseProxy, ValueProxy

# The C handle's kinds.
_HANDLE_LOCK, _HANDLE_RLOCK, _HANDLE_SEMAPHORE = 0, 1, 2

# Value typecodes the words hold: (class, width) as the extension takes them.
_VALUE_CLASS = {
    "b": ord("i") | 8 << 8, "B": ord("u") | 8 << 8, "h": ord("i") | 16 << 8, "H": ord("u") | 16 << 8,
    "i": ord("i") | 32 << 8, "I": ord("u") | 32 << 8, "l": ord("i") | 64 << 8, "L": ord("u") | 64 << 8,
    "q": ord("i") | 64 << 8, "Q": ord("u") | 64 << 8, "f": ord("f"), "d": ord("d"), "?": ord("?"),
}

_get_ident = threading.get_ident


def _acquire_timeout(blocking: bool, timeout: Optional[float]) -> Optional[float]:
    """The extension's timeout (< 0: for ever) for threading-style arguments,
    or None when they are invalid (the socket path then raises as it does)."""
    if blocking is True and timeout is None:
        return -1.0
    if not blocking:
        return 0.0 if timeout is None or timeout == -1 else None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        return None
    if timeout == -1:
        return -1.0
    if timeout != timeout or timeout < 0 or timeout > 1e9:  # NaN, negative, or for the socket path's checks
        return None
    return float(timeout)


class LockHandle(Handle):
    # (with-statements call the type's __enter__, which calls self.acquire)
    methods = ("acquire", "release")
    handle_kind = _HANDLE_LOCK

    def bind(self, fp: FastPath) -> None:
        super().bind(fp)
        self.slot = fp.slot
        self.take = fp.seg.lock_acquire
        self.give = fp.seg.lock_release

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        t = _acquire_timeout(blocking, timeout)
        if t is None or not self.usable():
            return bool(self.slow("acquire", blocking, timeout))
        start = time.monotonic()
        r = self.take(self.off, self.slot, _get_ident(), t)
        if r == OK:
            return True
        if r == BUSY:
            return False
        # DAEMON (the daemon has waiters queued, or is gone): the socket path, for the rest of the timeout.
        if t > 0:
            timeout = max(0.0, t - (time.monotonic() - start))
        return bool(self.slow("acquire", blocking, timeout))

    chandle: Any = None  # the C handle: one per proxy for its whole life

    def served_by(self) -> Any:
        # The common calls run in C (no Python frame); this class's methods
        # are their slow paths. A forked child keeps the very same C handle,
        # pointed at its own mapping and slot (rebind), so that references
        # to proxy.acquire taken before the fork stay on the C path.
        h = self.chandle
        if h is None:
            h = self.chandle = _ext.LockHandle(self.seg, self.off, self.slot,  # type: ignore[union-attr]
                                               self.handle_kind, self.acquire, self.release)
        else:
            h.rebind(self.seg, self.off, self.slot)
        return h

    def release(self) -> None:
        if not (self.usable() and self.give(self.off) == OK):
            self.slow_release()

    def slow_release(self) -> None:
        """Release over the socket: DAEMON, or an error the daemon words. When
        the daemon that served this handle is gone, a lock taken by CAS was
        taken in its run: the release names that run, so that after a restart
        it raises ServerRestartedError as on the socket path (unless the lock
        was taken again over the socket since, in the new run)."""
        fp, p = self.fp, cast("Optional[AcquirerProxy]", self.proxy())
        if p is not None and not fp.ok and fp.pid == os.getpid():
            p._taken_in(fp.run_id)
        self.slow("release")


class RLockHandle(LockHandle):
    handle_kind = _HANDLE_RLOCK

    def bind(self, fp: FastPath) -> None:
        super().bind(fp)
        self.take = fp.seg.rlock_acquire
        self.give_r = fp.seg.rlock_release

    def release(self) -> None:
        if not (self.usable() and self.give_r(self.off, self.slot, _get_ident()) == OK):
            self.slow_release()


class SemHandle(LockHandle):
    """Semaphore and BoundedSemaphore: units taken by CAS are counted in the
    session's ledger entry, so the daemon gives them back when the session
    ends; a release of units taken through the daemon (or of none) goes to
    the daemon, which decides whose count it comes off."""

    handle_kind = _HANDLE_SEMAPHORE

    def bind(self, fp: FastPath) -> None:
        super().bind(fp)
        self.take = fp.seg.sem_acquire
        self.give_s = fp.seg.sem_release

    @classmethod
    def fits(cls, fp: FastPath, off: int) -> bool:
        """Whether fp's session slot has an entry in the ledger of the
        Semaphore at off (a slot id past its length takes units through the
        daemon)."""
        return fp.seg.sem_taken(off, fp.slot) is not None

    def release(self) -> None:
        if not (self.usable() and self.give_s(self.off, self.slot) == OK):
            self.slow_release()


class EventHandle(Handle):
    methods = ("is_set", "set", "clear", "wait")

    def is_set(self) -> bool:
        if self.usable():
            return self.seg.event_is_set(self.off)  # type: ignore[no-any-return]
        return bool(self.slow("is_set"))

    def set(self) -> None:
        if not (self.usable() and self.seg.event_set(self.off) == OK):
            self.slow("set")

    def clear(self) -> None:
        if not self.usable():
            self.slow("clear")
            return
        self.seg.event_clear(self.off)

    def wait(self, timeout: Optional[float] = None) -> bool:
        if timeout is None:
            t = -1.0
        elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout != timeout:
            return bool(self.slow("wait", timeout))
        else:
            t = max(0.0, float(timeout))
            if t > 1e9:
                return bool(self.slow("wait", timeout))
        if not self.usable():
            return bool(self.slow("wait", timeout))
        r = self.seg.event_wait_since(self.off, self.seg.event_gen(self.off), t, self.fp.slot)
        if r is None:  # the daemon went away during the wait
            return bool(self.slow("wait", timeout))
        return bool(r)


class ValueHandle(Handle):
    methods = ("get", "set", "add", "compare_and_set")

    @classmethod
    def serves(cls, proxy: BaseProxy) -> bool:
        return getattr(proxy, "typecode", "O") in _VALUE_CLASS  # numbers only: the word holds no pickle

    def __init__(self, proxy: BaseProxy, fp: FastPath, off: int, tag: int) -> None:
        super().__init__(proxy, fp, off, tag)
        code = cast("ValueProxy", proxy).typecode
        self.cls_code = _VALUE_CLASS[code]
        # The Python types the word takes as they are; anything else (numpy
        # scalars, wrong types, out-of-range ints) goes to the socket path,
        # which converts or refuses it exactly as before.
        if code in "fd":
            self.types: tuple[type, ...] = (int, float)
        elif code == "?":
            self.types = (bool,)
        else:
            self.types = (int,)
        self.delta_types: tuple[type, ...] = () if code == "?" else ((int, float) if code in "fd" else (int,))

    def get(self) -> Any:
        if self.usable():
            return self.seg.value_get(self.off, self.cls_code)
        return self.slow("get")

    def set(self, value: Any) -> None:
        if type(value) in self.types and self.usable():
            try:
                self.seg.value_set(self.off, self.cls_code, value)
                return
            except (OverflowError, TypeError, ValueError):
                pass  # the daemon refuses it with its own error
        self.slow("set", value)

    def add(self, delta: Any = 1) -> Any:
        if type(delta) in self.delta_types and self.usable():
            try:
                return self.seg.value_add(self.off, self.cls_code, delta)
            except (OverflowError, TypeError, ValueError):
                pass
        return self.slow("add", delta)

    def compare_and_set(self, expected: Any, new: Any) -> bool:
        if type(expected) in self.types and type(new) in self.types and self.usable():
            try:
                return bool(self.seg.value_cas(self.off, self.cls_code, expected, new))
            except (OverflowError, TypeError, ValueError):
                pass
        return bool(self.slow("compare_and_set", expected, new))
