"""Host process for a C ABI library: loads it with ctypes and speaks spec/PROTOCOL.md on stdio.

Started by ``conformance.transport.cabi.CAbiImplementation`` (isolation
"process") as::

    python -S cabi_host.py LIBRARY NAME CAPABILITIES_JSON

so that a crash of the C code kills this small process, not the test run;
the parent's ``JsonlImplementation`` turns that into an ``AdapterError`` with
the exit status. WHY standard library only (and ``-S``): the host starts once
per opened implementation, and importing pydantic would cost more than the
whole test step; the parent validates every reply anyway.

The host forwards each request's ``op`` to ``kvspec_call`` and each reply
(already StepOutcome JSON, or EngineOutcome JSON in a request-level session)
back verbatim inside ``{"id":N,"outcome":...}``. It speaks protocol versions
1 and 2, as far as the library's ABI version allows: a ``hello`` carrying
``engine`` (a request-level session, version 2) opens the library with
``kvspec_open_engine``, which ABI version 2 libraries with a request level
export. It announces ``multi_session``: a later ``hello`` closes the handle
and opens a new one in the same process (the ABI promises that handles
share nothing), so the suite can reuse a host instead of starting one per
test (PROTOCOL.md 3.8).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from typing import Any

#: protocol versions the host speaks; the library's ABI version caps them
PROTOCOL_VERSIONS = (1, 2)
#: ABI versions the host loads (spec/kvspec_abi.h)
ABI_VERSIONS = (1, 2)
#: the first protocol and ABI version with request-level sessions
ENGINE_VERSION = 2
E_REQUEST = -1
_ERR_CAP = 1024
#: ``{"id":N,"op":{...}}`` exactly as JsonlImplementation writes it; the op's
#: text goes to the library as is (it parses strictly and refuses anything
#: else with KVSPEC_E_REQUEST), which saves a JSON round trip per step
_REQUEST_LINE = re.compile(rb'\{"id":([1-9][0-9]{0,15}),"op":(\{.*\})\}\r?\n?\Z', re.DOTALL)


def declare_abi(dll: Any) -> Any:
    """Declare the prototypes of spec/kvspec_abi.h on a loaded library (also
    used by the in-process loader, ``cabi.CAbiLibrary``); AttributeError names
    a missing symbol."""
    dll.kvspec_abi_version.argtypes = []
    dll.kvspec_abi_version.restype = ctypes.c_int
    dll.kvspec_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    dll.kvspec_open.restype = ctypes.c_void_p
    dll.kvspec_call.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    dll.kvspec_call.restype = ctypes.c_int
    dll.kvspec_close.argtypes = [ctypes.c_void_p]
    dll.kvspec_close.restype = None
    if has_engine(dll):  # ABI version 2, optional: request-level sessions
        dll.kvspec_open_engine.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        dll.kvspec_open_engine.restype = ctypes.c_void_p
    return dll


def has_engine(dll: Any) -> bool:
    """Does the library export ``kvspec_open_engine`` (a request level)?"""
    try:
        getattr(dll, "kvspec_open_engine")  # noqa: B009 - ctypes resolves symbols on attribute access
    except AttributeError:
        return False
    return True


def _load(path: str) -> Any:
    return declare_abi(ctypes.CDLL(path))


def _send(out: Any, obj: dict[str, Any] | bytes) -> None:
    out.write(obj if isinstance(obj, bytes) else json.dumps(obj).encode() + b"\n")
    out.flush()


def _error(rid: Any, code: str, message: str) -> dict[str, Any]:
    return {"id": rid if isinstance(rid, int) and rid >= 1 else None, "error": {"code": code, "message": message}}


def _refuse(out: Any, code: str, message: str) -> int:
    _send(out, {"type": "refused", "error": {"code": code, "message": message}})
    return 1


def _open(out: Any, dll: Any, lib_path: str, name: str, caps_json: str, line: bytes) -> Any:
    """Answer one hello line: the opened handle after ``ready``, or None after ``refused``."""
    try:
        hello = json.loads(line)
        versions, config = hello["versions"], hello["config"]
    except (ValueError, KeyError, TypeError) as e:
        _refuse(out, "internal_error", f"bad hello: {e}")
        return None
    engine = hello.get("engine")
    abi = dll.kvspec_abi_version()
    lowest = ENGINE_VERSION if engine is not None else 1
    serves = [v for v in PROTOCOL_VERSIONS if lowest <= v <= abi]
    common = [v for v in serves if v in versions]
    if not common:
        what = "request-level sessions in protocol versions" if engine is not None else "protocol versions"
        _refuse(
            out,
            "unsupported_version",
            f"the C ABI host serves {what} {serves} for this library (ABI version {abi}), not {versions}",
        )
        return None
    err = ctypes.create_string_buffer(_ERR_CAP)
    if engine is None:
        handle = dll.kvspec_open(json.dumps(config).encode(), err, _ERR_CAP)
    elif has_engine(dll):
        handle = dll.kvspec_open_engine(json.dumps(config).encode(), json.dumps(engine).encode(), err, _ERR_CAP)
    else:
        err.value = b"the library has no request level (it does not export kvspec_open_engine)"
        handle = None
    if not handle:
        _refuse(out, "unsupported_config", err.value.decode(errors="replace"))
        return None
    ready = {
        "type": "ready",
        "name": name,
        "protocol": max(common),
        "profile": config.get("profile", "kvbm"),
        "capabilities": json.loads(caps_json),
        # a fresh handle per session: the ABI promises that handles share nothing
        "multi_session": True,
    }
    _send(out, ready)
    return handle


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: cabi_host.py LIBRARY NAME CAPABILITIES_JSON", file=sys.stderr)
        return 2
    lib_path, name, caps_json = argv
    # stdout is the protocol channel: keep a private copy of it and point file
    # descriptor 1 at stderr, so that a library that prints cannot corrupt it
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    line = inp.readline()
    if not line:
        return 0
    try:
        dll = _load(lib_path)
    except (OSError, AttributeError) as e:
        return _refuse(out, "internal_error", f"cannot load {lib_path}: {e}")
    abi = dll.kvspec_abi_version()
    if abi not in ABI_VERSIONS:
        return _refuse(
            out, "internal_error", f"{lib_path} implements ABI version {abi}, the host speaks {list(ABI_VERSIONS)}"
        )
    handle = _open(out, dll, lib_path, name, caps_json, line)
    if handle is None:
        return 1
    call = dll.kvspec_call
    buf = ctypes.create_string_buffer(64 * 1024)
    try:
        for line in inp:
            fast = _REQUEST_LINE.match(line)
            if fast is not None:  # the parent's own layout: pass the op text through untouched
                rid, req = int(fast[1]), fast[2]
            else:
                try:
                    msg = json.loads(line)
                    if msg.get("type") == "bye":
                        return 0
                    if msg.get("type") == "hello":  # a new session (we announced multi_session)
                        dll.kvspec_close(handle)
                        handle = _open(out, dll, lib_path, name, caps_json, line)
                        if handle is None:
                            return 1
                        continue
                    rid, op = msg["id"], msg["op"]
                    if type(rid) is not int or rid < 1:
                        raise TypeError(f"id must be a positive integer, got {rid!r}")
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    _send(out, _error(None, "malformed_request", f"cannot read the request: {e}"))
                    continue
                req = json.dumps(op, separators=(",", ":")).encode()
            n = call(handle, req, buf, len(buf))
            if n >= len(buf):  # the op was applied; fetch its held reply into a bigger buffer
                buf = ctypes.create_string_buffer(max(n + 1, 2 * len(buf)))
                n = call(handle, None, buf, len(buf))
            if n == E_REQUEST:
                _send(out, _error(rid, "malformed_request", buf.value.decode(errors="replace")))
            elif n < 0 or n >= len(buf):
                _send(
                    out,
                    _error(rid, "internal_error", f"kvspec_call returned {n}: {buf.value.decode(errors='replace')}"),
                )
                return 1
            else:
                _send(out, b'{"id":%d,"outcome":%s}\n' % (rid, buf.raw[:n]))
    finally:
        if handle is not None:
            dll.kvspec_close(handle)
    return 0  # EOF on stdin: the parent is gone


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
