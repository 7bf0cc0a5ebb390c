"""TLS for the client: the settings the environment asks for, and the pin.

A ``tcp://`` address is reached over TLS when $SYNCMGR_TLS_CA is set
(tls_context_from_env: a CA-signed daemon certificate), or when the
process learnt the daemon's certificate fingerprint through a channel it
trusts (syncmgr.ray): then the certificate is checked by its SHA-256
(pinned_tls_context, check_pin) before a byte of the handshake is sent.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import ssl
import threading
from typing import Any, Optional, cast

from . import exceptions as exc

TLS_ENV = ("SYNCMGR_TLS_CA", "SYNCMGR_TLS_CERT", "SYNCMGR_TLS_KEY", "SYNCMGR_TLS_SERVER_NAME")
_env_tls: dict[tuple[str, ...], ssl.SSLContext] = {}
_env_tls_lock = threading.Lock()


def tls_context_from_env() -> Optional[ssl.SSLContext]:
    """TLS for tcp:// addresses from the environment, or None when
    $SYNCMGR_TLS_CA is not set: $SYNCMGR_TLS_CA (CA file to trust),
    $SYNCMGR_TLS_CERT and $SYNCMGR_TLS_KEY (optional client certificate),
    $SYNCMGR_TLS_SERVER_NAME (the name to check the certificate against;
    default: the address's host). ``Manager.runtime_env()`` carries them."""
    vals = tuple(os.environ.get(k, "") for k in TLS_ENV)
    if not vals[0]:
        return None
    with _env_tls_lock:
        ctx = _env_tls.get(vals)
        if ctx is None:
            try:
                ctx = ssl.create_default_context(cafile=vals[0])
                if vals[1]:
                    ctx.load_cert_chain(vals[1], vals[2] or None)
            except (OSError, ssl.SSLError) as e:
                raise exc.ConnectError(f"TLS settings from the environment ($SYNCMGR_TLS_*): {e}") from e
            _env_tls[vals] = ctx
        return ctx


def pinned_tls_context() -> ssl.SSLContext:
    """A TLS client context for a daemon whose certificate is checked by its
    pinned SHA-256 (check_pin) rather than by a CA: the daemon made the
    certificate itself, and the client learnt its fingerprint through a
    channel it trusts (Ray, for syncmgr.ray)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the pin is the check: see check_pin
    return ctx


def check_pin(sock: TLSStream, pin: str, address: str, peer: str = "") -> None:
    """Refuse a TLS peer whose certificate is not the pinned one, before a
    byte of the syncmgr handshake is sent."""
    der = sock.getpeercert(binary_form=True) or b""
    got = hashlib.sha256(der).hexdigest()
    if not hmac.compare_digest(got, pin.lower()):
        raise exc.ConnectError(
            f"the TLS certificate of syncmgr at {address}{f' ({peer})' if peer else ''} is not the one pinned for it "
            f"(sha256 {got[:16]}..., "
            f"expected {pin[:16]}...): another process answers at that address (a man in the middle, or the node's "
            "daemon was replaced); nothing was sent to it"
        )


# How much a TLSStream reads from its socket at once, and how much of a
# send it encrypts before writing it out: a few records, one system call.
_READ_CHUNK = 256 << 10
_WRITE_CHUNK = 256 << 10


class TLSStream:
    """A client's TLS connection whose records pass through memory
    (ssl.MemoryBIO) on their way to and from its socket, so that the client
    decides the system calls: what the socket holds is read at once (up to
    256 KiB), and a send is encrypted 256 KiB at a time and written in one
    call. Through OpenSSL's socket BIO, as ssl.SSLSocket does it, every
    record is a system call or two: a reply cost two reads (its record's
    header, then its body), and a 1 MiB item 64 writes, each of which woke
    the daemon's reader.

    It offers what Connection uses of a socket: sendall, recv_into,
    settimeout, close, and getpeercert for the pin. A peer that closes
    reads as 0 bytes, as an SSLSocket's ragged end does; other TLS errors
    raise ssl.SSLError (an OSError), timeouts TimeoutError."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, server_hostname: Optional[str] = None) -> None:
        self._sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = ctx.wrap_bio(self._in, self._out, server_side=False, server_hostname=server_hostname)
        self._buf = bytearray(_READ_CHUNK)
        self._view = memoryview(self._buf)
        self._eof = False  # the socket has ended (what it sent may still be decrypted)
        self._closed = False  # the TLS stream has ended: every read is 0 bytes
        while True:
            try:
                self._ssl.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._feed()
                if self._eof:
                    raise ConnectionResetError("the peer closed the connection during the TLS handshake") from None
        self._flush()

    def _flush(self) -> None:
        """Write out what the TLS object has produced (records of a send, a
        handshake's or a key update's answer)."""
        if self._out.pending:
            self._sock.sendall(self._out.read())

    def _feed(self) -> None:
        """Read what the socket has (at least one byte, waiting for it) into
        the TLS object, or mark the end of the stream."""
        k = self._sock.recv_into(self._buf)
        if k:
            self._in.write(self._view[:k])
        else:
            self._eof = True
            self._in.write_eof()

    def sendall(self, data: Any) -> None:
        if not len(data):
            return
        if type(data) is bytes and len(data) <= _WRITE_CHUNK:  # a request: its records, one call
            self._ssl.write(data)
            self._flush()
            return
        view = memoryview(data).cast("B")
        for start in range(0, len(view), _WRITE_CHUNK):
            self._ssl.write(view[start:start + _WRITE_CHUNK])
            self._flush()

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        """Up to nbytes (default: the buffer's length) of plaintext into
        buffer, waiting for at least one; 0 when the peer has closed."""
        n = nbytes or len(buffer)
        if n <= 0 or self._closed:
            return 0  # (as a socket's: nothing asked for, nothing waited for; or the end, again)
        while True:
            if not self._in.pending and not self._eof and not self._ssl.pending():
                self._feed()  # nothing to decrypt without more: read first, not after a failed read
            held = self._in.pending
            try:
                got = cast(int, self._ssl.read(n, buffer))  # (with a buffer: the count read into it)
            except ssl.SSLWantReadError:  # a record not yet whole, or only handshake messages
                self._flush()  # (what they asked for: a key update's or a renegotiation's answer)
                if self._eof:
                    self._closed = True
                    return 0
                if held and self._in.pending == held:  # nothing taken from what is there: it needs more
                    self._feed()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._closed = True  # and every later read says so at once, as a socket's does
                return 0
            self._flush()  # a key update read with the data is answered at once
            if not got:  # the peer's close_notify (Python reads it as 0 bytes, not an error)
                self._closed = True
            return got

    def settimeout(self, timeout: Optional[float]) -> None:
        self._sock.settimeout(timeout)

    def getpeercert(self, binary_form: bool = False) -> Any:
        return self._ssl.getpeercert(binary_form)

    def cipher(self) -> Optional[tuple[str, str, int]]:
        return self._ssl.cipher()

    def version(self) -> Optional[str]:
        return self._ssl.version()

    def fileno(self) -> int:
        return self._sock.fileno()

    def detach(self) -> int:
        """Let go of the socket without closing it (a forked child's copy)."""
        return self._sock.detach()

    def close(self) -> None:
        self._sock.close()
