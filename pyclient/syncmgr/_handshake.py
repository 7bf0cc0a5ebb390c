"""The client's side of the handshake (docs/protocol.md section 3), without
I/O, and the label a process presents in it: the blocking connection
(_conn.py) and the asyncio one (aio.py) drive the same steps."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import sys
from typing import Any, Optional

from . import exceptions as exc
from ._framing import packb

PROTOCOL_VERSION = 1
_HANDSHAKE_MAX = 4 << 10
_CLIENT_LABEL = b"syncmgr/1 client"
_SERVER_LABEL = b"syncmgr/1 server"

_label: Optional[str] = None
MAX_LABEL = 128


def set_label(label: Optional[str]) -> None:
    """Name this process in ``syncmgr status`` (None: the default label).
    It applies to the connections this process opens from now on; the
    daemon shows the label of a session's latest connection."""
    global _label
    if label is not None and not isinstance(label, str):
        raise TypeError("a label is a str")
    _label = label[:MAX_LABEL] if label is not None else None


def current_label() -> str:
    """The label the next connection presents: the one set with
    ``set_label`` (or ``connect(label=...)``), else the program's name, its
    pid, the multiprocessing process name when it is not the main process,
    and the Ray worker id when running in a Ray worker."""
    if _label is not None:
        return _label
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    parts = [f"{prog if prog not in ('', '-c', '-') else 'python'}[{os.getpid()}]"]
    mp = sys.modules.get("multiprocessing")
    if mp is not None:
        name = mp.current_process().name
        if name != "MainProcess":
            parts.append(name)
    ray = sys.modules.get("ray")
    if ray is not None:
        try:
            if ray.is_initialized():
                ctx = ray.get_runtime_context()
                if ctx.worker.mode == ray.WORKER_MODE:
                    parts.append(f"ray worker {ctx.get_worker_id()[:16]}")
        except Exception:  # noqa: BLE001 - a label must never break a connection
            pass
    return " ".join(parts)[:MAX_LABEL]


class Handshake:
    """The client's side of the handshake (docs/protocol.md section 3),
    without I/O: each step checks the daemon's message and says what to
    send, so the blocking connection and the asyncio one (syncmgr.aio)
    speak it alike. Errors are those of a refused or failed handshake."""

    def __init__(self, address: str, key: bytes, session: bytes, key_hint: str = "") -> None:
        self.address = address
        self.key = key
        self.session = session
        self.key_hint = key_hint  # appended to an authentication error
        self.max_frame = 64 << 20
        self._ns = self._nc = b""

    def refused(self, msg: dict[str, Any]) -> exc.SyncMgrError:
        """The error of an error frame the daemon answered the handshake with."""
        code, message = msg.get("code", ""), msg.get("message", "")
        if code == "auth_failed":
            return exc.AuthenticationError(f"syncmgr at {self.address} refused this client: {message}{self.key_hint}")
        e = exc.from_code(code, f"syncmgr at {self.address}: {message}")
        e.retry_after = _retry_hint(msg)  # type: ignore[attr-defined]
        return e

    def hello(self, hello: Any, ready: bool) -> bytes:
        """Check the daemon's hello (ready: the client spoke first) and
        return its nonce."""
        if isinstance(hello, dict) and hello.get("t") == "error":
            raise self.refused(hello)
        if not isinstance(hello, dict) or hello.get("t") != "hello" or len(hello.get("nonce", b"")) != 32:
            raise exc.ProtocolError(f"{self.address} does not speak the syncmgr protocol")
        if PROTOCOL_VERSION not in hello.get("versions", []):
            raise exc.ProtocolError(
                f"syncmgr at {self.address} speaks protocol versions {hello.get('versions')}, "
                f"this client {PROTOCOL_VERSION}"
            )
        if ready and not hello.get("ready"):
            raise _NoReady()
        self.max_frame = int(hello.get("max_frame", self.max_frame))
        return bytes(hello["nonce"])

    def auth(self, ns: bytes) -> bytes:
        """The auth message's body, proving the key over the daemon's nonce."""
        self._ns, self._nc = ns, os.urandom(32)
        return packb({"t": "auth", "version": PROTOCOL_VERSION, "nonce": self._nc,
                      "mac": hmac.new(self.key, _CLIENT_LABEL + ns + self._nc, hashlib.sha256).digest(),
                      "session": self.session, "pid": os.getpid(), "label": current_label()})

    def welcome(self, welcome: Any) -> tuple[str, str]:
        """Check the daemon's proof of the key; return its boot id and run id."""
        if isinstance(welcome, dict) and welcome.get("t") == "error":
            raise self.refused(welcome)
        if not isinstance(welcome, dict) or welcome.get("t") != "welcome":
            raise exc.ProtocolError(f"unexpected handshake reply from {self.address}")
        expect = hmac.new(self.key, _SERVER_LABEL + self._nc + self._ns, hashlib.sha256).digest()
        if not hmac.compare_digest(welcome.get("mac", b""), expect):
            raise exc.AuthenticationError(
                f"the server at {self.address} did not prove it knows the authkey{self.key_hint}")
        return welcome.get("boot_id", ""), str(welcome.get("run", ""))


class _NoReady(Exception):
    """The daemon does not read a ready frame (it is older than it)."""


class _HandshakeDropped(exc.ConnectError):
    """The daemon closed the connection during the handshake."""


_no_ready: set[str] = set()  # addresses of daemons that do not read a ready frame
_RETRY_IN = re.compile(r"retry in ([0-9.]+)(ms|s)\b")


def _retry_hint(msg: dict[str, Any]) -> float:
    """The daemon's retry hint in seconds (capped at 5 s): the error frame's
    retry_after, else a "retry in 54ms" in an older daemon's message."""
    try:
        hint = float(msg.get("retry_after") or 0.0)
    except (TypeError, ValueError):
        hint = 0.0
    if hint <= 0:
        m = _RETRY_IN.search(str(msg.get("message", "")))
        if m:
            hint = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
    return min(max(hint, 0.0), 5.0)
