"""The transport interface: what a proxy needs from whatever carries its calls.

Proxies (``_proxies.py``, ``_containers.py``, ``shared_memory.py``) hold a
:class:`Transport` and call nothing else: no proxy touches a socket. Two
implementations carry their ops:

* the socket client (``_connection.Client``), one per daemon address per
  process, serves every op: a proxy's methods, as its class defines them,
  are this path, and call it through :class:`Transport`;
* the same-host fast path (the ``_fast`` package) serves what it can in the
  daemon's shared memory (state words, Queue rings) and hands everything
  else (what the daemon arbitrates, every error, whatever a word cannot
  express) to the socket client, by calling the proxy class's own method.
  It is put on a proxy at the object's first fast op (``_fast.attach``
  gives a new or unpickled proxy its family's pending class, on which the
  first look-up of a fast method attaches it: ``_fast.resolve``): a handle
  per object, whose
  family declares once (its ``methods``) which proxy methods it serves,
  installed in the proxy's ``__dict__`` ahead of the class's, so a fast op
  goes through no layer of this interface (a Lock's acquire and release
  are C calls). It rides on the socket client: its session's connections
  and its own requests (``fastpath_attach``, ``fastpath_ref``,
  ``queue_attach``) are the client's, and a proxy on any other transport
  gets no fast path.

A pipeline (``_pipeline``) runs proxy methods, as their classes define
them, on two transports of its own: one records the request a method asks
for, the other answers it with the reply that ``Client.call_many`` got for
the whole batch in one round trip.

The contract below is the socket client's; the fast path keeps it by
answering only what it can answer exactly as the daemon would.

Contract of :meth:`Transport.call`:

* ``op`` and ``args`` are the wire op and its arguments (docs/protocol.md);
  the result is the reply's result, already decoded.
* An error reply raises the class ``exceptions.from_code`` gives for its
  code; an error means the op had **no effect** on the daemon.
* ``wait`` is how long the op may block on the daemon (``None``: for
  ever, ``0.0``: not at all). The transport keeps no timer of its own for
  it: the daemon bounds every wait, and a dead daemon fails the call at once.
* If the call is interrupted (``KeyboardInterrupt`` while waiting), the
  transport cancels the request on the daemon, passes any result that raced
  in to ``undo`` (which gives it back: releases the lock, puts the item back
  at the front), and re-raises, so nothing is taken in the caller's name.
* ``blob_key``/``blob`` name an argument that is a large buffer (a queue
  item, a pickled value): the transport may send it without copying it.
* A request larger than the daemon's frame limit raises
  ``FrameTooLargeError`` before anything is sent.

:meth:`Transport.notify` queues a request that needs no reply (``decref``
from a finalizer); it does no I/O and goes out with the next call.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple, Optional, Protocol

Undo = Callable[[Any], None]


def give_back(undo: Optional[Undo], answer: tuple[Any, Any]) -> None:
    """Give back what a request got, from its answer (error, result): its
    undo, when it succeeded. Best effort, for a caller whose own exception
    goes on: the connection or the daemon may be gone (and then the daemon
    has ended the session and what it held), so a failure is logged."""
    err, result = answer
    if err is None and undo is not None:
        try:
            undo(result)
        except Exception as e:  # noqa: BLE001 - reported; the caller's exception goes on
            logging.getLogger("syncmgr").warning("could not give back what a request got: %s", e)


class Request(NamedTuple):
    """One request of a batch sent back to back (``Client.call_many``): what
    :meth:`Transport.call` takes for one."""

    op: str
    args: dict[str, Any]
    blob_key: Optional[str] = None
    blob: Any = None
    undo: Optional[Undo] = None


class Transport(Protocol):
    """What proxies call: see the module docstring for the contract."""

    @property
    def address(self) -> str:
        """The daemon's address, as proxies pickle it."""
        ...

    @property
    def run_id(self) -> str:
        """The run id of the daemon last connected to ("" before the first
        call, or from a daemon that sends none). A proxy that took something
        (a lock) remembers it and names it when giving the thing back, so a
        restarted daemon refuses with ``ServerRestartedError``."""
        ...

    def call(self, op: str, args: dict[str, Any], *, blob_key: Optional[str] = None, blob: Any = None,
             wait: Optional[float] = 0.0, undo: Optional[Undo] = None) -> Any:
        """Send one request and return its result."""
        ...

    def notify(self, op: str, args: dict[str, Any]) -> None:
        """Queue a request that needs no reply; safe in a finalizer."""
        ...

    def flush(self) -> None:
        """Send queued notifications now."""
        ...

    def close(self) -> None:
        """Drop idle resources; a later call reconnects."""
        ...
