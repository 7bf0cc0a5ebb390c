"""The exceptions of syncmgr.

Every error the client raises on its own account derives from
:class:`SyncMgrError`::

    SyncMgrError
    ├── ConnectError              cannot reach the daemon (names the address)
    ├── AuthenticationError       wrong or missing authkey, or an impostor server
    ├── ServerGoneError           the daemon died or closed the connection mid-call
    │   ├── ServerRestartedError  state this process held (a lock) was lost in a daemon restart
    │   └── ShuttingDownError     the daemon is stopping
    ├── ProtocolError             the daemon sent something this client cannot read
    │   └── FrameTooLargeError    a message over the daemon's frame limit
    ├── ObjectError
    │   ├── NoSuchObjectError     no object of that name (deleted, or daemon restarted)
    │   ├── KindMismatchError     the name belongs to an object of another kind
    │   └── BadNameError          (also ValueError)
    ├── NotOwnerError             (also RuntimeError) release of a lock not held
    ├── SyncMgrValueError         (also ValueError)
    ├── SyncMgrTypeError          (also TypeError)
    ├── LimitError                a daemon limit was reached
    ├── SegmentExistsError        (also FileExistsError) a segment of that name exists
    ├── SegmentNotFoundError      (also FileNotFoundError) no segment of that name
    ├── NoSpaceError              (also OSError) /dev/shm is full
    ├── CancelledError            a request was cancelled
    ├── DeletedError              the object was deleted while the call waited
    ├── BrokenBarrierError        (also threading.BrokenBarrierError)
    ├── KeyNotFoundError          (also KeyError) a dict key that is not there
    ├── IndexOutOfRangeError      (also IndexError) a list index out of range
    ├── Empty                     (also queue.Empty) get from an empty queue
    ├── Full                      (also queue.Full) put to a full queue
    ├── ManagerShutDownError      (also multiprocessing.ProcessError) use of a manager after shutdown()
    ├── RayClusterError           syncmgr.ray: no Ray, no such cluster or node, a daemon that cannot start
    ├── SharedMemoryHostError     (syncmgr.shared_memory) a segment of a daemon on another host
    ├── SharedMemoryFileError     (syncmgr.shared_memory; also PermissionError) a segment's file is not the daemon's own
    └── InternalError             a bug in the daemon

Every wire error code maps to one class in ``EXCEPTION_CLASSES``; the
transport raises ``from_code(code, message)`` and call sites catch classes,
never compare codes.

Where the standard library has an exception for the same condition the
client raises that one, as the proxies of ``multiprocessing`` do:
``queue.Empty``, ``queue.Full``, ``KeyError``, ``IndexError``,
``FileExistsError`` and ``FileNotFoundError`` (shared memory): each such
class here derives from both, so ``except KeyError`` and ``except
SyncMgrError`` both catch a missing dict key.
"""

from __future__ import annotations

import queue
import threading
from multiprocessing import ProcessError


class SyncMgrError(Exception):
    """Root of the syncmgr exception tree."""

    code: str = ""


class ConnectError(SyncMgrError, ConnectionError):
    """The daemon cannot be reached at the given address."""


class AuthenticationError(SyncMgrError):
    """The authkey is wrong or missing, or the server did not prove it knows it."""


class ServerGoneError(SyncMgrError, ConnectionError):
    """The daemon died or closed the connection while a call was in progress."""


class ServerRestartedError(ServerGoneError):
    """The op acts on state this process got from an earlier run of the
    daemon (a lock it acquired before the daemon restarted). That state was
    lost with the old daemon; the op did nothing."""


class ShuttingDownError(ServerGoneError):
    """The daemon is shutting down."""


class ProtocolError(SyncMgrError):
    """The daemon sent something this client cannot understand."""


class FrameTooLargeError(ProtocolError, ValueError):
    """A message is larger than the daemon's frame limit."""


class ObjectError(SyncMgrError):
    """An error about a named object."""


class NoSuchObjectError(ObjectError, LookupError):
    """No object has that name (it was deleted, or the daemon restarted)."""


class KindMismatchError(ObjectError, TypeError):
    """The name belongs to an object of another kind."""


class BadNameError(ObjectError, ValueError):
    """The name breaks the naming rules."""


class NotOwnerError(SyncMgrError, RuntimeError):
    """Release of a lock that is not held (by the caller, for an RLock)."""


class SyncMgrValueError(SyncMgrError, ValueError):
    """An argument out of range."""


class SyncMgrTypeError(SyncMgrError, TypeError):
    """An argument of the wrong type for the object."""


class LimitError(SyncMgrError):
    """A limit configured on the daemon was reached."""


class CancelledError(SyncMgrError):
    """The request was cancelled."""


class DeletedError(ObjectError):
    """The object was deleted while the call waited on it."""


class BrokenBarrierError(SyncMgrError, threading.BrokenBarrierError):
    """The barrier is broken."""


class SegmentExistsError(SyncMgrError, FileExistsError):
    """A shared-memory segment of that name exists."""


class SegmentNotFoundError(SyncMgrError, FileNotFoundError):
    """No shared-memory segment has that name (never created, unlinked, or
    lost in a daemon restart): a FileNotFoundError, as
    ``multiprocessing.shared_memory.SharedMemory(name)`` raises."""

    def __str__(self) -> str:  # OSError's str would print "None" fields for a one-argument error
        return Exception.__str__(self)


class NoSpaceError(SyncMgrError, OSError):
    """The daemon's shared-memory filesystem is full."""


class KeyNotFoundError(SyncMgrError, KeyError):
    """A dict key that is not there: a KeyError whose argument is the key,
    as a dict (and SyncManager's DictProxy) raises."""


class IndexOutOfRangeError(SyncMgrError, IndexError):
    """A list index out of range (an IndexError, as a list raises)."""


class Empty(SyncMgrError, queue.Empty):
    """Get from an empty queue (a queue.Empty, as queue.Queue raises)."""


class Full(SyncMgrError, queue.Full):
    """Put to a full queue (a queue.Full, as queue.Queue raises)."""


class ManagerShutDownError(SyncMgrError, ProcessError):
    """The manager has been shut down (a multiprocessing.ProcessError, as SyncManager raises)."""


class RayClusterError(SyncMgrError):
    """A syncmgr cluster on Ray (syncmgr.ray) cannot do what was asked: the
    process is not connected to Ray, there is no cluster of that name, the
    node has no daemon or has left, or a node's daemon could not start
    (the message names the node)."""


class InternalError(SyncMgrError):
    """The daemon hit a bug; the request had no effect. Please report it."""


EXCEPTION_CLASSES: dict[str, type[SyncMgrError]] = {
    "no_such_object": NoSuchObjectError,
    "kind_mismatch": KindMismatchError,
    "bad_name": BadNameError,
    "not_owner": NotOwnerError,
    "value_error": SyncMgrValueError,
    "type_error": SyncMgrTypeError,
    "cancelled": CancelledError,
    "deleted": DeletedError,
    "shutting_down": ShuttingDownError,
    "too_large": FrameTooLargeError,
    "limit": LimitError,
    "server_restarted": ServerRestartedError,
    "auth_failed": AuthenticationError,
    "broken": BrokenBarrierError,
    "exists": SegmentExistsError,
    "no_space": NoSpaceError,
    "bad_request": ProtocolError,
    "unknown_op": ProtocolError,
    "version": ProtocolError,
    "key_error": KeyNotFoundError,
    "index_error": IndexOutOfRangeError,
    "empty": Empty,
    "full": Full,
    "internal": InternalError,
}


def from_code(code: str, message: str) -> SyncMgrError:
    """The exception for a wire error code (unknown codes give SyncMgrError)."""
    exc = EXCEPTION_CLASSES.get(code, SyncMgrError)(message)
    exc.code = code
    return exc


__all__ = [name for name, obj in list(globals().items())
           if isinstance(obj, type) and issubclass(obj, SyncMgrError)] + ["EXCEPTION_CLASSES", "from_code"]
