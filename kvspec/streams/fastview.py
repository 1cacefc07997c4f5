"""The C version of the fused reader's per-block work, built at first use.

``_fastview.c`` applies a clean Dynamo Stored or Removed to the router
view's dicts several times faster than the Python loops of
``formats._fused_stored``/``_fused_removed`` (``line``; ``lines`` also
reads the RouterEvent JSON text itself, skipping the decoded object, for the
lines of the shape Dynamo writes), and a clean vLLM
BlockStored or BlockRemoved with its sha256 block hashes recomputed faster
than ``ZmqFeed._stored``/``_removed`` and ``HashCheck`` (``vllm_event``),
with the same semantics (the Python code remains the reference and the
fall-back). ``LiveTable`` and ``KidsTable`` hold a tier's live blocks and
child counts in C for ``lines``/``text`` (``RouterView.use_tables``): a
removal of an old block then costs one or two cache misses, not the five to
eight of a dict of tuples of ints, which made check-log on a stream that
evicts old leaves 1.7 times slower than on young removals. They are mappings
with the dict methods the view uses, so the Python paths work on them
unchanged (tests/test_fastview_tables.py runs them beside a dict). It is a CPython extension compiled
with the machine's C compiler (``$CC``, ``cc`` or ``gcc``, as the C
adapters are) into kvspec's build directory, keyed by the source, the
interpreter and the compiler flags, so it is built once per machine and
Python; a missing compiler or a failed build leaves the Python path, and
``status()`` says why.

``KVSPEC_FASTVIEW=0`` in the environment turns it off (the tests compare
both paths).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("_fastview.c")
NAME = "_kvspec_fastview"
CFLAGS = ("-O2", "-fPIC", "-shared", "-Wall")
COMPILE_TIMEOUT_S = 120.0

_module: ModuleType | None = None
_status = "not loaded"
_tried = False


def _key() -> str:
    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    h.update(repr((sys.version, sys.platform, CFLAGS, sysconfig.get_paths()["include"])).encode())
    return h.hexdigest()[:20]


def _candidates() -> list[Path]:
    """Where a built module may be cached: the C adapters' build folders
    (``workdir.build_dir_candidates``, which ``transport.cabi.build_dir`` also
    uses), looked up without importing the C transport."""
    from kvspec.conformance.run.workdir import build_dir_candidates

    return build_dir_candidates()


def _filename() -> str:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return f"{NAME}-{_key()}{suffix}"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _build() -> Path:
    from kvspec.conformance.transport.cabi import build_dir, find_compiler

    cc = find_compiler()
    out = build_dir() / _filename()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = [cc, *CFLAGS, "-I", sysconfig.get_paths()["include"], str(SOURCE), "-o", str(tmp)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()[:2000]}")
        os.replace(tmp, out)  # atomic: concurrent builds of the same key are harmless
    finally:
        tmp.unlink(missing_ok=True)
    return out


def module() -> ModuleType | None:
    """The built extension, or None (the Python path is used; ``status()`` says why)."""
    global _module, _status, _tried
    if _tried:
        return _module
    _tried = True
    if os.environ.get("KVSPEC_FASTVIEW", "1") == "0":
        _status = "off (KVSPEC_FASTVIEW=0)"
        return None
    try:
        name = _filename()
        path = next((d / name for d in _candidates() if (d / name).is_file()), None)
        if path is None:
            path = _build()
        _module = _load(path)
        _status = "C"
    except Exception as e:  # no compiler, no headers, a read-only disk: the Python path still works
        _status = f"Python (the C extension could not be built: {type(e).__name__}: {e})"
        _module = None
    return _module


def status() -> str:
    """Which path the fused reader uses, and why."""
    return _status
