"""What every fast-path family's handle shares: the proxy methods it
installs (its ``methods``, declared once per family), the hand-off of what
it cannot serve to the proxy's socket-path methods, and the move of a forked
child's handles to the child's own session.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any, Optional

from .. import exceptions as exc
from .segment import FastPath, path_for

if TYPE_CHECKING:
    from .._proxies import BaseProxy


class Handle:
    """A proxy's fast methods. It keeps the proxy only weakly (the proxy
    keeps the handle's bound methods), and calls the proxy class's own
    socket-path methods whenever the word cannot be used."""

    # The proxy methods the family serves: install puts them in the proxy's
    # __dict__, where they come before the class's socket-path methods, and
    # uninstall takes them out again. The one list of them.
    methods: tuple[str, ...] = ()

    @classmethod
    def serves(cls, proxy: BaseProxy) -> bool:
        """Whether this family can serve proxy at all (asked before its word
        is looked up)."""
        return True

    @classmethod
    def fits(cls, fp: FastPath, off: int) -> bool:
        """Whether fp's session can use the words of the object at off
        (asked at attach, and when a forked child moves the handle; the
        offset and tag are checked apart)."""
        return True

    def __init__(self, proxy: BaseProxy, fp: FastPath, off: int, tag: int) -> None:
        self.proxy = weakref.ref(proxy)
        self.cls = type(proxy)
        self.off = off
        self.tag = tag
        self.bind(fp)

    def bind(self, fp: FastPath) -> None:
        """Use fp's mapping and session (subclasses take what they need of it)."""
        self.fp = fp
        self.seg = fp.seg
        fp.handles.add(self)

    def served_by(self) -> Any:
        """What has the methods install puts in the proxy: the handle itself,
        unless the family's calls run in C (words.LockHandle)."""
        return self

    def install(self, proxy: BaseProxy) -> None:
        d = proxy.__dict__
        d["_fast"] = self
        impl = self.served_by()
        for m in self.methods:
            d[m] = getattr(impl, m)

    def uninstall(self, proxy: BaseProxy) -> None:
        d = proxy.__dict__
        for m in self.methods:
            d.pop(m, None)
        d.pop("_fast", None)

    def detach(self) -> None:
        """The daemon run has ended: let go of what the handle maps beside
        the segment (a Queue's ring)."""

    def slow(self, method: str, *args: Any) -> Any:
        """Hand method to the socket path: the proxy class's own method,
        which calls the socket transport, whatever is installed on the
        instance."""
        p = self.proxy()
        if p is None:
            raise exc.SyncMgrError("the proxy is gone")
        return getattr(self.cls, method)(p, *args)

    def usable(self) -> bool:
        """Whether the word may be used now: False once the daemon is gone.
        In a forked child the handle moves to the child's own fast path
        first (see rebind)."""
        return self.fp.ok or (self.fp.pid != os.getpid() and self.rebind())

    def rebind(self) -> bool:
        """In a forked child, on the first use of any inherited handle: move
        every handle of the parent's mapping to the child's own fast path
        (its own session, slot and anchor, set up once by path_for), keeping
        the objects' offsets. No object costs a request, and the child's
        first op on each object is as fast as its parent's: cpprb, for one,
        has a start-up race that only stays harmless while an explorer's
        first Event.wait is quick."""
        p = self.proxy()
        if p is None:
            return False
        old = self.fp
        fp = path_for(p._client)
        for h in list(old.handles):
            h.move(old, fp)
        return self.fp is fp and fp.ok

    def move(self, old: FastPath, fp: Optional[FastPath]) -> None:
        """Leave old for fp (a forked child's fast path). The offset is kept
        only in the very file old mapped and while its slot still carries
        the object's tag; otherwise the proxy goes back to the socket path."""
        old.handles.discard(self)
        p = self.proxy()
        if p is None:
            return
        if (fp is None or not fp.ok or fp.identity != old.identity or fp.seg.tag(self.off) != self.tag
                or not self.fits(fp, self.off)):
            self.uninstall(p)
            return
        self.bind(fp)
        self.install(p)
