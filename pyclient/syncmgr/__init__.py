"""syncmgr: a coordination server for Python's multiprocessing and Ray users.

A drop-in for ``multiprocessing.Manager()`` whose proxies pickle by address
and name (plain pickle, cloudpickle, Ray), whose locks are released when
their holder dies, and whose shared memory is owned by the daemon::

    import syncmgr

    with syncmgr.Manager() as m:
        lock, stop, q = m.Lock(), m.Event(), m.Queue()
        ray.init(runtime_env=m.runtime_env())

Where things live (each module's docstring says more):

* ``_manager.py``: ``Manager``/``connect``, the object factories;
  ``_daemon.py``: starting a private daemon (the one place that does it).
* ``_proxies.py``, ``_containers.py``, ``shared_memory.py``: the proxies,
  i.e. each op's client-side semantics and, for consuming ops, the undo
  passed to the transport (release a lock, put an item back).
* ``_transport.py``: the interface proxies call (``call``/``notify``), with
  its contract: an error means no effect; an interrupted wait is cancelled
  and its grant given back.
* ``_connection.py``: the socket transport (the per-process client: its
  pool of connections, calls, batches of calls, routes and key lookup);
  ``_conn.py``: one connection (its socket, handshake and frames);
  ``_framing.py``: frame layout and the size check, no I/O;
  ``_pipeline.py``: several proxy calls in one round trip.
* ``exceptions.py``: the exception tree and the one table from wire error
  codes to classes.

An op's semantics and its undo on the daemon live in the daemon's
``manager`` package; its wire form in docs/protocol.md.
"""

from . import aio
from . import shared_memory as _shm
from ._connection import get_client as _get_client
from ._containers import DictProxy, ListProxy, NamespaceProxy
from ._manager import Manager, connect, find_binary
from ._pipeline import Pipeline
from ._proxies import (
    AcquirerProxy,
    BarrierProxy,
    BaseProxy,
    ConditionProxy,
    EventProxy,
    JoinableQueueProxy,
    QueueProxy,
    ValueProxy,
)
from .exceptions import (
    AuthenticationError,
    BadNameError,
    BrokenBarrierError,
    CancelledError,
    ConnectError,
    DeletedError,
    Empty,
    FrameTooLargeError,
    Full,
    IndexOutOfRangeError,
    InternalError,
    KeyNotFoundError,
    KindMismatchError,
    LimitError,
    ManagerShutDownError,
    NoSpaceError,
    NoSuchObjectError,
    NotOwnerError,
    ObjectError,
    ProtocolError,
    RayClusterError,
    SegmentExistsError,
    SegmentNotFoundError,
    ServerGoneError,
    ServerRestartedError,
    ShuttingDownError,
    SyncMgrError,
    SyncMgrTypeError,
    SyncMgrValueError,
)
from .shared_memory import SharedMemory, SharedMemoryFileError, SharedMemoryHostError

_shm.client_for = _get_client

__version__ = "0.1.0"

__all__ = [
    "Manager",
    "aio",
    "connect",
    "find_binary",
    "SharedMemory",
    "Pipeline",
    "BaseProxy",
    "AcquirerProxy",
    "EventProxy",
    "ValueProxy",
    "QueueProxy",
    "JoinableQueueProxy",
    "ConditionProxy",
    "BarrierProxy",
    "DictProxy",
    "ListProxy",
    "NamespaceProxy",
    "AuthenticationError",
    "BadNameError",
    "BrokenBarrierError",
    "CancelledError",
    "ConnectError",
    "DeletedError",
    "Empty",
    "FrameTooLargeError",
    "Full",
    "IndexOutOfRangeError",
    "InternalError",
    "KeyNotFoundError",
    "KindMismatchError",
    "LimitError",
    "ManagerShutDownError",
    "NoSpaceError",
    "NoSuchObjectError",
    "NotOwnerError",
    "ObjectError",
    "ProtocolError",
    "RayClusterError",
    "SegmentExistsError",
    "SegmentNotFoundError",
    "ServerGoneError",
    "ServerRestartedError",
    "ShuttingDownError",
    "SyncMgrError",
    "SyncMgrTypeError",
    "SyncMgrValueError",
    "SharedMemoryHostError",
    "SharedMemoryFileError",
]
