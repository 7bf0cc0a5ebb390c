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
* here: the table of families (``_FAMILIES``); ``attach``, which gives a
  new or unpickled proxy its family's pending class (the proxy's class, on
  which the first look-up of one of the family's methods attaches it); and
  ``resolve``, which at the first such op picks the proxy's handle from
  the table. Code that reads a proxy's handle takes it from ``handle``,
  which resolves first; a proxy's class for pickling and for pipelines is
  ``proxy_type``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, cast

from .handle import Handle
from .ring import JoinableQueueHandle, QueueHandle
from .segment import FastPath, _ext, _paths, enabled_by_env, path_for, reasons
from .words import EventHandle, LockHandle, RLockHandle, SemHandle, ValueHandle

if TYPE_CHECKING:
    from .._connection import Client
    from .._proxies import BaseProxy

__all__ = ["FastPath", "_ext", "active", "attach", "enabled_by_env", "handle", "path_for", "proxy_type", "reasons",
           "adopting", "reattach", "ref_path", "resolve"]

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


def ref_path(client: Client, kind: str) -> Optional[FastPath]:
    """The fast path a create of kind should ask the object's word for in
    its reply (the "fastpath" argument, then adopting), or None: this process
    has mapped client's daemon's segment already. (It does not map it here:
    the create comes first, so that a client short of connections still
    gets its object, on the socket path.) A forked child finds none of its
    parent's: the fork hook empties _paths and marks them not ok."""
    if kind not in _WORDS or not enabled_by_env():
        return None
    fp = _paths.get(id(client))
    return fp if fp is not None and fp.ok else None


def attach(proxy: BaseProxy, hint: Any = None) -> None:
    """Put proxy on the fast path at its first fast op, not now (hint: the
    create reply's "fp", the object's word, kept in the process's refs for
    that op): its class becomes the family's pending class (_pending), on
    which the first look-up of a fast method attaches it. A proxy made and
    never used in this process (made for other processes, passed through a
    task) costs no ring attach round trip and no handle; one made and used
    pays them at its first op instead of at its creation. (The process's
    segment is mapped at its first object, as before.)"""
    if hint is None and not enabled_by_env() or not _serves(proxy):  # (a hint: the create checked it)
        return
    cls = proxy_type(proxy)
    pending = _pending.get(cls) or _pending_class(cls)
    if pending is None:
        return
    # The process's mapping is made now, once (the next creates then ask
    # for their words: ref_path); the object's handle at its first op.
    fp = path_for(proxy._client)
    if fp is None or not fp.ok:
        return
    if hint is not None:
        fp.note(proxy._kind, proxy._name, hint)
    proxy.__class__ = pending


def adopting(cls: type, fp: FastPath, hint: Any) -> Optional[tuple[type, tuple[int, int, str]]]:
    """How to make a proxy of cls whose create asked fp for the object's
    word (ref_path) and got hint in the reply: the family's pending class,
    on which the proxy attaches at its first fast op, and the word to keep
    on the proxy (``_fp_hint``) until then or its pickling (note_hint), so
    that the process's table of words is not touched by a create. What
    ref_path checked is not checked again. None where attach must decide
    (a family with per-object serves, a daemon gone since, a word of
    another daemon run): make cls, then attach(proxy, hint).

    The proxy is made as the pending class, not changed to it: an instance
    whose class is assigned keeps its attributes in a dict of its own, not
    in the class's shared layout. The word kept is a tuple holding the
    mapping's own run string, not the reply's list and string: the
    collector stops tracking it, and it costs a proxy 120 bytes, not 200."""
    if (not fp.ok or cls._kind not in _ALWAYS  # type: ignore[attr-defined]
            or not isinstance(hint, list) or len(hint) != 3 or hint[2] != fp.run_id):
        return None
    pending = _pending.get(cls) or _pending_class(cls)
    return None if pending is None else (pending, (hint[0], hint[1], fp.run_id))


def note_hint(proxy: BaseProxy) -> None:
    """Put the word a proxy's create was told of (adopting) in its fast path's
    table, for any proxy of the object unpickled in this process."""
    hint = proxy.__dict__.pop("_fp_hint", None)
    if hint is not None:
        fp = _paths.get(id(proxy._client))
        if fp is not None and fp.ok:
            fp.note(proxy._kind, proxy._name, hint)


def word_of(proxy: BaseProxy) -> Optional[tuple[int, int, str]]:
    """The word this process knows for proxy's object, for its pickle:
    (offset, tag, the daemon run whose word it is), from its handle or its
    fast path's table, or None. A process on this host that unpickles the
    proxy then needs no fastpath_ref round trip for it, and none of the
    pool connection such a call would open: the word is checked there as
    a create's is (the run against its mapping's, the tag at its use)."""
    if proxy._kind not in _WORDS:
        return None
    note_hint(proxy)
    fp = _paths.get(id(proxy._client))
    if fp is None or not fp.ok:
        return None
    h = proxy.__dict__.get("_fast")
    word = (h.off, h.tag) if h is not None and h.fp is fp else fp.refs.get((proxy._kind, proxy._name))
    return None if word is None else (word[0], word[1], fp.run_id)


def attach_unpickled(proxy: BaseProxy, word: Any) -> None:
    """attach for a proxy just unpickled, with the word its pickling
    process knew (word_of) noted as a create's is. A malformed one is
    ignored (the object's word is then asked for at the first op)."""
    hint = word if isinstance(word, tuple) and len(word) == 3 and enabled_by_env() else None
    attach(proxy, hint)  # (attach checks the environment only without a hint; note checks the word)


def _serves(proxy: BaseProxy) -> bool:
    kind = proxy._kind
    if kind in _ALWAYS:
        return True
    words = _WORDS.get(kind)
    return words is not None and all(c.serves(proxy) for c in words.values())


# The kinds every object of which a family serves (no serves of its own).
_ALWAYS = frozenset(_RINGS) | {k for k, ws in _WORDS.items()
                               if all(c.serves.__func__ is Handle.serves.__func__ for c in ws.values())}  # type: ignore[attr-defined]


_pending: dict[type, type] = {}  # proxy class -> its pending class


def _pending_class(cls: type) -> Optional[type]:
    """cls, but the first look-up of one of the family's fast methods on an
    instance attaches it (resolve: its class is cls again, the handle's
    methods in its __dict__) before the look-up goes on, so even a method
    taken before any call (``acquire = lock.acquire``, a hot loop's
    habit) is the handle's, a C call for a Lock. Other look-ups pass
    through. It pickles and prints as cls (BaseProxy uses proxy_type)."""
    kind = cast("str", cls._kind)  # type: ignore[attr-defined]
    families: list[type[Handle]] = [_RINGS[kind]] if kind in _RINGS else list(_WORDS.get(kind, {}).values())
    names = frozenset(m for h in families for m in h.methods)
    if not names:
        return None

    def __getattribute__(self: Any, name: str) -> Any:  # noqa: N807
        if name in names:
            resolve(self)
        return object.__getattribute__(self, name)

    ns: dict[str, Any] = {"__getattribute__": __getattribute__, "_fast_base": cls}
    ns["__module__"] = cls.__module__
    ns["__qualname__"] = cls.__qualname__
    pending = type(cls.__name__, (cls,), ns)
    _pending[cls] = pending
    return pending


def proxy_type(proxy: Any) -> type:
    """The proxy's class, whether or not it has attached yet."""
    t = type(proxy)
    return cast("type", t.__dict__.get("_fast_base", t))


def resolve(proxy: BaseProxy) -> None:
    """Attach a pending proxy now (its first fast op; active; handle)."""
    base = type(proxy).__dict__.get("_fast_base")
    if base is None:
        return
    proxy.__class__ = base
    _attach_now(proxy)


def handle(proxy: BaseProxy) -> Any:
    """The proxy's fast-path handle, attaching a pending proxy first; None
    on the socket path."""
    resolve(proxy)
    return proxy.__dict__.get("_fast")


def _attach_now(proxy: BaseProxy) -> None:
    """Give proxy fast methods when its object is on the fast path. Which
    handle serves it is the families' table (_FAMILIES)."""
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
    if words is None:
        return
    fp = path_for(proxy._client)
    if fp is None or not fp.ok:
        return
    note_hint(proxy)  # the create's word (adopting)
    ref = fp.ref(kind, proxy._name)  # (the word is in fp.refs when this process was told of it)
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
    """Whether proxy's ops take the fast path (attaching a pending proxy
    first)."""
    h = handle(proxy)
    return h is not None and bool(h.fp.ok)
