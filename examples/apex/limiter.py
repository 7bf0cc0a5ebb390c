"""A two-sided rate limiter: Reverb's ``SampleToInsertRatio`` on shared primitives.

Inserts (transitions added by explorers) and samples (transitions drawn by the
learner) are two counters. With ``spi`` the target samples per insert and
``diff = inserts * spi - samples``:

* below ``min_size`` inserts, inserting is always allowed and sampling never;
* after that, an insert of ``n`` is allowed only if ``diff + n * spi <= max_diff``
  and a sample of ``n`` only if ``diff - n >= min_diff``, where
  ``min_diff = min_size * spi - error_buffer`` and ``max_diff = min_size * spi + error_buffer``.

So whichever side runs ahead blocks until the other catches up, and the
measured ratio never strays further from ``spi`` than ``error_buffer``
samples' worth. ``stop()`` releases every waiter on both sides (their call
returns False) and refuses every later call.

The counters, the stop flag and a count of waiters live in shared Values,
guarded by one Condition; any Condition and Values with ``.value`` serve
(a syncmgr manager's, a ``SyncManager``'s, ``multiprocessing``'s, or
``threading.Condition`` with :class:`LocalValue` in one process). A side that
goes through notifies only when someone waits, so an unblocked call costs the
Condition's lock and a few Value reads (on syncmgr's fast path, no daemon
round trip at all).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional


class LocalValue:
    """A ``.value`` holder for a limiter that lives in one process."""

    def __init__(self, value: int = 0) -> None:
        self.value = value


class RateLimiter:
    """Blocks inserts and samples so that samples / inserts stays near ``samples_per_insert``."""

    def __init__(self, cond: Any, inserts: Any, samples: Any, waiting: Any, stopped: Any, *,
                 samples_per_insert: float, min_size: int, error_buffer: float) -> None:
        if samples_per_insert <= 0:
            raise ValueError("samples_per_insert must be > 0")
        if error_buffer < samples_per_insert:
            raise ValueError("error_buffer must be at least samples_per_insert")
        self.cond, self.inserts, self.samples = cond, inserts, samples
        self.waiting, self.stopped = waiting, stopped
        self.spi, self.min_size, self.error_buffer = float(samples_per_insert), int(min_size), float(error_buffer)
        self.min_diff = self.min_size * self.spi - self.error_buffer
        self.max_diff = self.min_size * self.spi + self.error_buffer

    @classmethod
    def local(cls, **kw: Any) -> RateLimiter:
        """A limiter for threads of one process."""
        return cls(threading.Condition(), LocalValue(), LocalValue(), LocalValue(), LocalValue(), **kw)

    # The rule, on plain numbers.

    def can_insert(self, inserts: int, samples: int, n: int) -> bool:
        if inserts + n <= self.min_size:
            return True
        return (inserts + n) * self.spi - samples <= self.max_diff

    def can_sample(self, inserts: int, samples: int, n: int) -> bool:
        if inserts < self.min_size:
            return False
        return inserts * self.spi - (samples + n) >= self.min_diff

    # The blocking calls.

    def insert(self, n: int, timeout: Optional[float] = None) -> bool:
        """Wait until n inserts are allowed and count them; False on timeout or stop (nothing counted)."""
        if n * self.spi > 2 * self.error_buffer:
            raise ValueError(f"an insert of {n} moves the ratio by {n * self.spi:.0f} samples, more than "
                             f"twice the error buffer ({self.error_buffer:.0f}): it could never pass")
        return self._acquire(n, True, timeout)

    def sample(self, n: int, timeout: Optional[float] = None) -> bool:
        """Wait until n samples are allowed and count them; False on timeout or stop (nothing counted)."""
        if n > 2 * self.error_buffer:
            raise ValueError(f"a sample of {n} is more than twice the error buffer ({self.error_buffer:.0f})")
        return self._acquire(n, False, timeout)

    def _acquire(self, n: int, insert: bool, timeout: Optional[float]) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                if self.stopped.value:
                    return False
                i, s = self.inserts.value, self.samples.value
                if self.can_insert(i, s, n) if insert else self.can_sample(i, s, n):
                    if insert:
                        self.inserts.value = i + n
                    else:
                        self.samples.value = s + n
                    if self.waiting.value:
                        self.cond.notify_all()
                    return True
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    return False
                self.waiting.value += 1
                try:
                    self.cond.wait(wait)
                finally:
                    self.waiting.value -= 1

    def stop(self) -> None:
        """Release every waiter on both sides; every later call returns False at once."""
        with self.cond:
            self.stopped.value = 1
            self.cond.notify_all()

    def is_stopped(self) -> bool:
        return bool(self.stopped.value)

    def counts(self) -> tuple[int, int]:
        """(inserts, samples), read together under the lock."""
        with self.cond:
            return self.inserts.value, self.samples.value

    def peek(self) -> tuple[int, int]:
        """(inserts, samples) without the lock: for progress displays."""
        return self.inserts.value, self.samples.value
