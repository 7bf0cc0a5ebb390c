"""syncmgr: a coordination server for Python's multiprocessing and Ray users.

A drop-in for ``multiprocessing.Manager()`` whose proxies pickle by address
and name (plain pickle, cloudpickle, Ray), whose locks are released when
their holder dies, and whose shared memory is owned by the daemon::

    import syncmgr

    with syncmgr.Manager() as m:
        lock, stop, q = m.Lock(), m.Event(), m.Queue()
        ray.init(runtime_env=m.runtime_env())
"""

from . import shared_memory as _shm
from ._connection import get_client as _get_client
from ._containers import DictProxy, ListProxy, NamespaceProxy
from ._manager import Manager, connect, find_binary
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
    BrokenBarrierError,
    ConnectError,
    FrameTooLargeError,
    KindMismatchError,
    LimitError,
    NoSuchObjectError,
    NotOwnerError,
    ProtocolError,
    ServerGoneError,
    ShuttingDownError,
    SyncMgrError,
)
from .shared_memory import SharedMemory, SharedMemoryHostError

_shm.client_for = _get_client

__version__ = "0.1.0"

__all__ = [
    "Manager",
    "connect",
    "find_binary",
    "SharedMemory",
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
    "SyncMgrError",
    "ConnectError",
    "AuthenticationError",
    "ServerGoneError",
    "ShuttingDownError",
    "ProtocolError",
    "FrameTooLargeError",
    "NoSuchObjectError",
    "KindMismatchError",
    "NotOwnerError",
    "LimitError",
    "BrokenBarrierError",
    "SharedMemoryHostError",
]
