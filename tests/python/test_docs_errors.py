"""The error classes the docs name are the ones the client has: every
exception class docs/python.md names exists in ``syncmgr``, and every wire
error code the daemon can send (wire/errors.go, mapped in server/errors.go)
maps to a Python exception class that docs/python.md names."""

from __future__ import annotations

import builtins
import os
import re

import syncmgr
from syncmgr import exceptions

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "python.md")
# A backticked exception name: ends in Error, or is one of the queue pair.
NAME = re.compile(r"`(?:syncmgr\.)?([A-Z][A-Za-z]*Error|Empty|Full)`")
# Names from the standard library the docs quote beside ours (as
# "also a ..."), qualified or builtin.
STDLIB_QUALIFIED = re.compile(r"`(?:queue|threading|multiprocessing)\.[A-Za-z]+`")


def doc_text() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def test_every_exception_the_docs_name_exists_in_syncmgr():
    text = STDLIB_QUALIFIED.sub("", doc_text())
    names = set(NAME.findall(text))
    ours = {n for n in names if not isinstance(getattr(builtins, n, None), type)}
    assert {"SyncMgrError", "ConnectError", "SegmentNotFoundError", "KeyNotFoundError"} <= ours  # the scan works
    missing = sorted(n for n in ours if not (isinstance(getattr(syncmgr, n, None), type)
                                             and issubclass(getattr(syncmgr, n), BaseException)))
    assert not missing, f"docs/python.md names exceptions syncmgr does not have: {missing}"
    not_exported = sorted(n for n in ours if n not in syncmgr.__all__)
    assert not not_exported, f"named in the docs but not in syncmgr.__all__: {not_exported}"


def wire_codes() -> dict[str, str]:
    """Go constant name -> code string, from wire/errors.go."""
    with open(os.path.join(REPO, "wire", "errors.go"), encoding="utf-8") as f:
        return dict(re.findall(r"\b(Code[A-Za-z]+)\s+Code\s*=\s*\"([a-z_]+)\"", f.read()))


def test_every_wire_error_code_maps_to_an_exception_the_docs_name():
    codes = wire_codes()
    assert len(codes) >= 20 and codes["CodeShutdown"] == "shutting_down"  # the scan works
    with open(os.path.join(REPO, "server", "errors.go"), encoding="utf-8") as f:
        used = set(re.findall(r"wire\.(Code[A-Za-z]+)", f.read()))
    assert used and used <= set(codes), f"server/errors.go uses codes wire/errors.go lacks: {used - set(codes)}"
    names = set(NAME.findall(doc_text()))
    for const, code in sorted(codes.items()):
        cls = exceptions.EXCEPTION_CLASSES.get(code)
        assert cls is not None, f"wire code {code!r} ({const}) has no Python exception class"
        assert cls.__name__ in names, f"wire code {code!r} maps to {cls.__name__}, which docs/python.md does not name"
        assert getattr(syncmgr, cls.__name__) is cls
        e = exceptions.from_code(code, "message")
        assert isinstance(e, syncmgr.SyncMgrError) and e.code == code
