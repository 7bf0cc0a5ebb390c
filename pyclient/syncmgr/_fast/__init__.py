"""The same-host fast path: Lock, RLock, Condition's lock, Semaphore,
BoundedSemaphore, Event and numeric Value ops on state words the daemon keeps
in shared memory, and Queue ops on a ring of records the daemon keeps in a
memory file of its own (see ring.py).

A client on the daemon's host (Unix socket, same boot id) maps the daemon's
state segment and does uncontended operations with one compare-and-swap in
the C extension ``syncmgr._fastpath``, without a system call; contended
waits sleep on a futex on the word. The daemon stays the arbiter: while it
has waiters of its own queued on an object it sets the word's daemon bit,
and every op the extension answers with ``DAEMON`` is sent over the socket
instead, as is every op that would be an error (so errors are the daemon's,
worded and typed as on the socket path). Layout and protocol:
docs/protocol.md, "Same-host fast path".

The fast path is used when all of these hold, and otherwise every op goes
over the socket as before:

* the extension was built (a C compiler at install time) and
  ``SYNCMGR_FASTPATH`` is not ``0``;
* the daemon is reached over a Unix socket and reports this host's boot id
  (``SYNCMGR_FASTPATH_BOOT_ID``, for tests only, replaces the local one);
* the daemon agrees (``fastpath_attach``, whose reply carries the segment's
  descriptor), the descriptor passes the owner, mode, size and seal checks,
  and the object has a word (``fastpath_ref``) in that daemon run's segment.

Each process keeps one extra connection of its session open while it uses
the fast path (the anchor): the session, and so the slot id written in the
words, lives as long as that connection; if the daemon goes away the anchor
sees it and every handle falls back to the socket path, which reports it.

A forked child inherits its parent's handles; the first op on any of them
moves them all to the child's own session (its own slot and anchor), keeping
the offsets, so a child's first ops are as fast as its parent's.

The package is the second implementation of the transport seam
(``_transport``): what a handle can serve from shared memory it serves, and
it hands every other op to the proxy class's own method, the socket path
(``_connection.Client``). Its modules:

* ``segment``: the mapping of a daemon's segment (``FastPath``,
  ``path_for``), its anchor, word lookup and fork handling;
* ``handle``: what every family's handle shares (``Handle``): installing
  its methods into the proxy and taking them out, the hand-off to the
  socket path, moving to a forked child's session;
* ``words``: the families whose objects are state words;
* ``ring``: the Queue families, whose objects are rings;
* here: the table of families (``_FAMILIES``), and ``attach``, which picks
  a proxy's handle from it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, cast

from .handle import Handle
from .ring import JoinableQueueHandle, QueueHandle
from .segment import FastPath, _ext, _paths, enabled_by_env, path_for, reasons
from .words import EventHandle, LockHandle, RLockHandle, SemHandle, ValueHandle

if TYPE_CHECKING:
    from .._connection import Client
    from .._proxies import BaseProxy

__all__ = ["FastPath", "_ext", "active", "attach", "enabled_by_env", "path_for", "reasons", "reattach", "wants_ref"]

# The fast path's families, one line each: a handle class and the proxy
# kinds it serves, each with the kind of word the daemon keeps for such an
# object (the low byte of the word's tag: statemem's Kind* numbers,
# docs/protocol.md section 11), or RING for a Queue's, whose items are in a
# ring of its own. attach picks the handle here; a new family is a handle
# class and a line.
RING = -1
_FAMILIES: tuple[tuple[type[Handle], dict[str, int]], ...] = (
    (LockHandle, {"lock": 1, "condition": 1}),
    (RLockHandle, {"rlock": 2, "condition": 2}),
    (SemHandle, {"semaphore": 3, "bounded_semaphore": 4}),
    (EventHandle, {"event": 5}),
    (ValueHandle, {"value": 6}),
    (QueueHandle, {"queue": RING}),
    (JoinableQueueHandle, {"joinable_queue": RING}),
)
_WORDS: dict[str, dict[int, type[Handle]]] = {}  # proxy kind -> word kind -> handle
_RINGS: dict[str, type[QueueHandle]] = {}  # proxy kind -> ring handle
for _cls, _kinds in _FAMILIES:
    for _kind, _word in _kinds.items():
        if _word == RING:
            _RINGS[_kind] = cast("type[QueueHandle]", _cls)
        else:
            _WORDS.setdefault(_kind, {})[_word] = _cls
del _cls, _kinds, _kind, _word


def wants_ref(client: Client, kind: str) -> bool:
    """Whether a create of kind should ask for the object's word in its
    reply (the "fastpath" argument): this process has mapped client's
    daemon's segment already. (It does not map it here: the create comes
    first, so that a client short of connections still gets its object,
    on the socket path.)"""
    if kind not in _WORDS or not enabled_by_env():
        return False
    fp = _paths.get(id(client))
    return fp is not None and fp.ok and fp.pid == os.getpid()


def attach(proxy: BaseProxy, hint: Any = None) -> None:
    """Give proxy fast methods when its object is on the fast path (hint:
    the create reply's "fp", the object's word). Which handle serves it is
    the families' table (_FAMILIES)."""
    if not enabled_by_env():
        return
    kind = proxy._kind
    ring = _RINGS.get(kind)
    if ring is not None:
        fp = path_for(proxy._client)
        if fp is not None and fp.ok:
            ring.open(proxy, fp)
        return
    words = _WORDS.get(kind)
    if words is None or not all(cls.serves(proxy) for cls in words.values()):
        return
    fp = path_for(proxy._client)
    if fp is None or not fp.ok:
        return
    ref = fp.ref(kind, proxy._name, hint)
    if ref is None:
        return
    off, tag = ref
    cls = words.get(tag & 0xFF)  # a Condition's word is its Lock's or its RLock's
    if cls is not None and cls.fits(fp, off):
        cls(proxy, fp, off, tag).install(proxy)


def reattach(proxy: BaseProxy) -> None:
    """Move proxy to the fast path of the daemon run its client reaches now
    (after its object was created again in a restarted daemon): the old
    handle's words and ring belong to the run that ended."""
    h = proxy.__dict__.get("_fast")
    if h is not None:
        h.fp.handles.discard(h)
        h.uninstall(proxy)
    attach(proxy)


def active(proxy: BaseProxy) -> bool:
    """Whether proxy's ops take the fast path now."""
    h = proxy.__dict__.get("_fast")
    return h is not None and h.fp.ok
