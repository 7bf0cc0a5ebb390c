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
import ssl
import threading
from typing import Optional

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


def check_pin(sock: ssl.SSLSocket, pin: str, address: str, peer: str = "") -> None:
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
