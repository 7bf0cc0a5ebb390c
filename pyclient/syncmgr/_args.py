"""Argument checks shared by the socket path (_proxies.py) and the fast
path (_fast/): timeouts in threading's and queue's styles, and
get_many's count. Both paths raise the same errors for the same bad
arguments, before anything is sent or stored."""

from __future__ import annotations

import math
from typing import Any, Optional


def timeout_arg(blocking: bool, timeout: Optional[float], *, minus_one_forever: bool) -> Optional[float]:
    """Validate a threading/queue style timeout; None means wait for ever."""
    if timeout is None:
        return None
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
        raise TypeError("timeout must be a number or None")
    if minus_one_forever and timeout == -1:
        return None
    if math.isnan(timeout) or timeout < 0:
        raise ValueError("timeout value must be a non-negative number" if minus_one_forever
                         else "'timeout' must be a non-negative number")
    if math.isinf(timeout):
        return None
    return float(timeout)


def queue_timeout(block: bool, timeout: Optional[float]) -> float:
    """The ring's timeout (< 0: for ever) for queue-style arguments; invalid
    ones raise as queue.Queue does."""
    if not block:
        return 0.0
    if timeout is None:
        return -1.0
    if type(timeout) is float and 0.0 <= timeout < 1e9:
        return timeout
    t = timeout_arg(True, timeout, minus_one_forever=False)
    return -1.0 if t is None else t


def check_count(max_items: Any) -> None:
    """get_many's count: an int of at least 1."""
    if isinstance(max_items, bool) or not isinstance(max_items, int):
        raise TypeError("max_items must be an int")
    if max_items < 1:
        raise ValueError("max_items must be at least 1")
