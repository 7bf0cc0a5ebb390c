"""Where a process's authkey comes from, and the forms it takes.

For an address with no key given: the environment's ($SYNCMGR_AUTHKEY, hex,
else the file $SYNCMGR_AUTHKEY_FILE names), or the 0600 ``syncmgr.key``
beside an embedded daemon's socket (key_and_source_for). A key given to
connect() or Manager() is bytes, or a str of hex as ``syncmgr keygen``
prints it (coerce_key). Each key travels with words for where it came
from, which an AuthenticationError repeats.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Any, Optional

from . import exceptions as exc

_log = logging.getLogger("syncmgr")


def key_from_env() -> bytes:
    """The authkey from $SYNCMGR_AUTHKEY (hex), else the file named by $SYNCMGR_AUTHKEY_FILE."""
    return key_and_source_from_env()[0]


def key_and_source_from_env() -> tuple[bytes, str]:
    """key_from_env, with words for where the key came from (for errors)."""
    hexkey = os.environ.get("SYNCMGR_AUTHKEY")
    kfile = os.environ.get("SYNCMGR_AUTHKEY_FILE")
    if hexkey is not None:
        source = "$SYNCMGR_AUTHKEY"
        if kfile:
            source += f" ($SYNCMGR_AUTHKEY_FILE={kfile} is set too, and ignored while $SYNCMGR_AUTHKEY is set)"
    elif kfile:
        source = f"the file {kfile} named by $SYNCMGR_AUTHKEY_FILE"
        try:
            with open(kfile) as f:
                hexkey = f.read()
        except OSError as e:
            raise exc.AuthenticationError(f"cannot read the authkey file named by SYNCMGR_AUTHKEY_FILE: {e}") from None
    else:
        raise exc.AuthenticationError(
            "no syncmgr authkey: set SYNCMGR_AUTHKEY (hex) or SYNCMGR_AUTHKEY_FILE in this process's environment "
            "(with Ray: ray.init(runtime_env=manager.runtime_env()))"
        )
    try:
        key = bytes.fromhex(hexkey.strip())
    except ValueError:
        raise exc.AuthenticationError(
            f"the syncmgr authkey in {source} is not hex (make one with `syncmgr keygen`)") from None
    if not key:
        raise exc.AuthenticationError(f"the syncmgr authkey in {source} is empty")
    return key, source


_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


def coerce_key(key: Any) -> bytes:
    """An authkey as given to connect() or Manager(): bytes are the key
    itself; a str is the key in hex, as ``syncmgr keygen`` prints it and
    $SYNCMGR_AUTHKEY holds it."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        b = bytes(key)
    elif isinstance(key, str):
        try:
            b = bytes.fromhex(key.strip())
        except ValueError:
            raise ValueError(
                "an authkey given as a str must be hex, as `syncmgr keygen` prints it; pass raw key bytes as bytes"
            ) from None
    else:
        raise TypeError(
            "an authkey is bytes (the key itself) or a str of hex (as `syncmgr keygen` prints it), "
            f"not {type(key).__name__}"
        )
    if not b:
        raise ValueError("the syncmgr authkey is empty")
    return b


def looks_like_hex_text(key: bytes) -> bool:
    """Whether key is hex digits as text (b"3fa9..."): most likely the
    output of `syncmgr keygen` passed as bytes, where the key's own bytes
    (bytes.fromhex) or the str were meant."""
    return len(key) >= 32 and len(key) % 2 == 0 and all(c in _HEX_DIGITS for c in key)


def _same_address(a: str, b: str) -> bool:
    def norm(x: str) -> str:
        x = x[len("unix://"):] if x.startswith("unix://") else x
        return x if x.startswith("tcp://") else os.path.abspath(x)
    return norm(a) == norm(b)


def key_file_beside(address: str) -> Optional[bytes]:
    """The key in the 0600 ``syncmgr.key`` beside a Unix socket (written by an
    embedded daemon's manager), or None (see read_key_file)."""
    if address.startswith("tcp://"):
        return None
    path = address[len("unix://"):] if address.startswith("unix://") else address
    return read_key_file(os.path.join(os.path.dirname(os.path.abspath(path)), "syncmgr.key"))


def read_key_file(kpath: str) -> Optional[bytes]:
    """The hex key in the file kpath, or None. The file must be a regular
    file of this uid, readable by nobody else, and is opened without
    following a symlink."""
    try:
        fd = os.open(kpath, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            _log.warning("ignoring %s: not a regular file of this user with mode 0600", kpath)
            return None
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(data.decode().strip())
    except ValueError:
        return None
    return key or None


def key_for(address: str) -> bytes:
    """The authkey for the daemon at address, when none was given (see
    key_and_source_for)."""
    return key_and_source_for(address)[0]


def key_and_source_for(address: str) -> tuple[bytes, str]:
    """The authkey for the daemon at address, when none was given, and
    words for where it came from.

    In order: the environment's key ($SYNCMGR_AUTHKEY or
    $SYNCMGR_AUTHKEY_FILE) when $SYNCMGR_ADDRESS is unset or names this
    address; the key file beside the socket of an embedded daemon; the
    environment's key anyway; else, when no daemon answers at the address,
    the ConnectError that says so (the missing daemon is the first thing to
    fix), and otherwise an AuthenticationError that names the variables to
    set. So a child finds the key of the daemon its proxy names, whichever
    manager started first, and whether or not its environment was inherited
    (forkserver).
    """
    env_addr = os.environ.get("SYNCMGR_ADDRESS")
    have_env = "SYNCMGR_AUTHKEY" in os.environ or "SYNCMGR_AUTHKEY_FILE" in os.environ
    if have_env and (not env_addr or _same_address(env_addr, address)):
        return key_and_source_from_env()
    key = key_file_beside(address)
    if key is not None:
        return key, "the syncmgr.key file beside the socket"
    if have_env:
        return key_and_source_from_env()
    from ._conn import _connect  # noqa: PLC0415 - _conn imports this module

    _connect(address, None).close()  # no daemon there: say that first
    raise exc.AuthenticationError(
        f"no syncmgr authkey for {address}: set SYNCMGR_AUTHKEY (hex) or SYNCMGR_AUTHKEY_FILE in this process's "
        "environment, or pass the key to connect() (with Ray: ray.init(runtime_env=manager.runtime_env()))"
    )
