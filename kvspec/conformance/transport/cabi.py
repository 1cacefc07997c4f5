"""The C ABI transport: an implementation compiled from C sources, called through ctypes.

A ``kind = "c_abi"`` manifest names C sources that implement
spec/kvspec_abi.h. ``build_library`` compiles them with the machine's C
compiler into a shared library, cached under a key made of the sources, the
header, the flags and the compiler, so a second load is only a ``dlopen``.

``CAbiImplementation`` then runs the library in one of two ways
(``start.isolation``):

- ``"process"`` (default): in a small host process (``cabi_host.py``) that
  loads the library with ctypes and speaks the JSON-lines protocol of
  spec/PROTOCOL.md, driven by ``JsonlImplementation``. WHY: a bug in C code
  (a segfault, an abort, an endless loop) would otherwise take the whole
  pytest run with it; in a child it becomes an ``AdapterError`` with the exit
  status, within the manifest's timeout.
- ``"inprocess"``: ``CAbiSession`` calls the library directly (several times
  faster; for a port that is already trusted).

Either way every reply is validated against ``StepOutcome``; a reply that
does not validate is an ``AdapterError`` naming the field.

Opened with an ``EngineConfig`` (a request-level session, ABI and protocol
version 2), the library's ``kvspec_open_engine`` opens the handle and
``engine_call`` exchanges request-level operations for ``EngineOutcome``
replies (``conformance.transport.engine`` drives workloads with it).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.transport.cabi_host import ABI_VERSIONS, ENGINE_VERSION, declare_abi, has_engine
from kvspec.spec.config import ManagerConfig
from kvspec.spec.engine_wire import EngineConfig, EngineOp, EngineOutcome
from kvspec.spec.errors import AdapterError, ConfigError, WireError
from kvspec.spec.manifest import Manifest
from kvspec.spec.wire import Operation, StepOutcome, parse_operation

if TYPE_CHECKING:
    from kvspec.conformance.transport.jsonl import JsonlImplementation

#: the newest ABI version this module speaks (KVSPEC_ABI_VERSION of spec/kvspec_abi.h)
ABI_VERSION = max(ABI_VERSIONS)
#: return codes of kvspec_call (spec/kvspec_abi.h)
E_REQUEST, E_HANDLE, E_ARG, E_INTERNAL = -1, -2, -3, -4
_CODE_NAMES = {
    E_REQUEST: "KVSPEC_E_REQUEST",
    E_HANDLE: "KVSPEC_E_HANDLE",
    E_ARG: "KVSPEC_E_ARG",
    E_INTERNAL: "KVSPEC_E_INTERNAL",
}
#: flags every build gets on top of the manifest's cflags
SHARED_FLAGS = ("-fPIC", "-shared")
COMPILE_TIMEOUT_S = 300.0
_INITIAL_REPLY_CAP = 64 * 1024
_ERR_CAP = 1024


def header_dir() -> Path:
    """The folder holding kvspec_abi.h (spec/, installed as kvspec.spec)."""
    return Path(str(resources.files("kvspec.spec")))


def find_compiler() -> str:
    """The machine's C compiler: $CC, else ``cc``, else ``gcc``."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name:
            path = shutil.which(name)
            if path:
                return path
    raise ConfigError("no C compiler found (tried $CC, cc, gcc); a c_abi adapter is built from source at load time")


def build_dir() -> Path:
    """Where built libraries are cached: $KVSPEC_BUILD_DIR, else ``build/``
    under kvspec's working dir (``--kvspec-dir``, ``KVSPEC_HOME``, ``./.kvspec``:
    ``conformance/run/workdir.py``), else a per-user folder in the temp dir."""
    from kvspec.conformance.run.workdir import build_dir_candidates, current_root, ensure

    candidates = build_dir_candidates()
    for d in candidates:
        try:
            if d.parent == current_root():
                ensure(d.parent)  # the working dir gets its .gitignore
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            return d
    raise ConfigError(f"no writable build directory among {[str(c) for c in candidates]}")


def build_library(manifest: Manifest, adapter_dir: Path, extra_cflags: tuple[str, ...] = ()) -> Path:
    """Compile the manifest's C sources into a shared library (cached) and return its path.

    A compiler failure is a ConfigError carrying the compiler's output."""
    adapter_dir = Path(adapter_dir)
    if not manifest.start.sources:
        raise ConfigError(
            f"{manifest.name}: kind 'c_abi' needs start.sources (C files, relative to the adapter folder)"
        )
    sources = [adapter_dir / s for s in manifest.start.sources]
    for s in sources:
        if not s.is_file():
            raise ConfigError(f"{manifest.name}: source {s} does not exist")
    cc = find_compiler()
    inc = header_dir()
    flags = [*manifest.start.cflags, *extra_cflags, *SHARED_FLAGS]
    key = hashlib.sha256()
    key.update(json.dumps([cc, flags, sys.platform]).encode())
    key.update((inc / "kvspec_abi.h").read_bytes())
    # headers next to the sources are part of the build too
    for f in sorted({*sources, *adapter_dir.glob("*.h")}):
        key.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    out_dir = build_dir()
    lib = out_dir / f"{manifest.name}-{key.hexdigest()[:20]}.so"
    if lib.is_file():
        return lib
    tmp = out_dir / f".{lib.name}.{os.getpid()}.tmp"
    objs = [out_dir / f".{lib.stem}.{os.getpid()}.{i}.o" for i in range(len(sources))]
    includes = ["-I", str(inc), "-I", str(adapter_dir)]
    # one compiler per source, in parallel, then one link (a cold build is on the test's clock)
    steps = [[cc, *flags, *includes, "-c", str(src), "-o", str(obj)] for src, obj in zip(sources, objs, strict=True)]
    try:
        failures = _run_parallel(steps)
        if not failures:
            failures = _run_parallel([[cc, *flags, *map(str, objs), "-o", str(tmp), "-lm"]])
    finally:
        for obj in objs:
            obj.unlink(missing_ok=True)
    if failures:
        tmp.unlink(missing_ok=True)
        report = "\n".join(f"$ {' '.join(cmd)}\n{out}" for cmd, out in failures)
        raise ConfigError(f"{manifest.name}: compiling the C sources failed:\n{report}")
    os.replace(tmp, lib)  # atomic: concurrent builds of the same key are harmless
    return lib


def _run_parallel(commands: list[list[str]]) -> list[tuple[list[str], str]]:
    """Run commands concurrently; return (command, output) of each that failed."""
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for cmd in commands]
    failures = []
    try:
        for cmd, proc in zip(commands, procs, strict=True):
            try:
                out, _ = proc.communicate(timeout=COMPILE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                out += f"\n(killed after {COMPILE_TIMEOUT_S:g} s)"
            if proc.returncode != 0:
                failures.append((cmd, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return failures


# --------------------------------------------------------------------------
# Direct (in-process) calls
# --------------------------------------------------------------------------


class CAbiError(AdapterError):
    """kvspec_call returned a negative code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"kvspec_call returned {_CODE_NAMES.get(code, code)}: {message}")
        self.code = code


class CAbiRequestError(CAbiError, WireError):
    """The library refused a request as malformed (KVSPEC_E_REQUEST); its state is unchanged."""


class CAbiLibrary:
    """A loaded library implementing spec/kvspec_abi.h, with its prototypes declared."""

    def __init__(self, path: Path) -> None:
        try:
            self.dll = ctypes.CDLL(str(path))
        except OSError as e:
            raise ConfigError(f"cannot load {path}: {e}") from e
        dll = self.dll
        try:
            declare_abi(dll)
        except AttributeError as e:
            raise ConfigError(f"{path} does not export the kvspec ABI: {e}") from e
        version = dll.kvspec_abi_version()
        if version not in ABI_VERSIONS:
            raise ConfigError(
                f"{path} implements kvspec ABI version {version}; this kvspec speaks {list(ABI_VERSIONS)}"
            )
        self.path = path
        self.version: int = version
        #: exports kvspec_open_engine (ABI version 2 with a request level)
        self.has_engine = version >= ENGINE_VERSION and has_engine(dll)


class CAbiSession:
    """One open handle: ``call(request) -> reply`` with a caller-owned buffer
    that grows when the library says the reply does not fit."""

    def __init__(
        self, lib: CAbiLibrary, config_json: str, reply_cap: int = _INITIAL_REPLY_CAP, *, engine_json: str | None = None
    ) -> None:
        self.lib = lib
        err = ctypes.create_string_buffer(_ERR_CAP)
        if engine_json is None:
            handle = lib.dll.kvspec_open(config_json.encode(), err, _ERR_CAP)
        elif not lib.has_engine:
            raise ConfigError(
                f"{lib.path} has no request level: a request-level session needs ABI version {ENGINE_VERSION} "
                f"and kvspec_open_engine (the library implements ABI version {lib.version}"
                f"{'' if lib.version < ENGINE_VERSION else ' without kvspec_open_engine'})"
            )
        else:
            handle = lib.dll.kvspec_open_engine(config_json.encode(), engine_json.encode(), err, _ERR_CAP)
        if not handle:
            raise ConfigError(f"kvspec_open refused the configuration: {err.value.decode(errors='replace')}")
        self.handle: int | None = handle
        self._buf = ctypes.create_string_buffer(reply_cap)
        self.grown = 0  # how many times the buffer had to grow (tests look)

    def call(self, request: bytes | None) -> bytes:
        """One kvspec_call. ``None`` fetches the held reply (ABI semantics)."""
        if self.handle is None:
            raise AdapterError("the C ABI session is closed")
        call = self.lib.dll.kvspec_call
        buf = self._buf
        n = call(self.handle, request, buf, len(buf))
        if n >= len(buf):  # too small: the op was applied; fetch its held reply
            self._buf = buf = ctypes.create_string_buffer(max(n + 1, 2 * len(buf)))
            self.grown += 1
            n = call(self.handle, None, buf, len(buf))
            if n >= len(buf):
                raise AdapterError(f"kvspec_call: held reply grew from the announced size to {n} bytes")
        if n < 0:
            raise (CAbiRequestError if n == E_REQUEST else CAbiError)(n, buf.value.decode(errors="replace"))
        return buf.raw[:n]

    def close(self) -> None:
        if self.handle is not None:
            self.lib.dll.kvspec_close(self.handle)
            self.handle = None


def summarize_validation(err: ValidationError, limit: int = 4) -> str:
    """``field.path: message`` of the first errors (the transport's wording)."""
    from kvspec.conformance.transport.jsonl import summarize_validation as summarize

    return summarize(err, limit)


def request_json(op: Operation | dict[str, Any]) -> bytes:
    """An operation (wire model or plain dict) as the request text of kvspec_call."""
    if isinstance(op, dict):
        op = parse_operation(op)
    if not isinstance(op, BaseModel):
        raise WireError(f"not an operation: {op!r}")
    return op.model_dump_json().encode()


def parse_reply(raw: bytes) -> StepOutcome:
    """Validate a kvspec_call reply; AdapterError naming the field if it is not a StepOutcome."""
    try:
        return StepOutcome.model_validate_json(raw)
    except ValidationError as e:
        text = raw[:200].decode(errors="replace")
        raise AdapterError(
            f"c_abi reply does not match StepOutcome: {summarize_validation(e)}; reply: {text!r}"
        ) from None


def parse_engine_reply(raw: bytes) -> EngineOutcome:
    """Validate a kvspec_call reply of a request-level session (an EngineOutcome)."""
    try:
        return EngineOutcome.model_validate_json(raw)
    except ValidationError as e:
        text = raw[:200].decode(errors="replace")
        raise AdapterError(
            f"c_abi reply does not match EngineOutcome: {summarize_validation(e)}; reply: {text!r}"
        ) from None


# --------------------------------------------------------------------------
# The Implementation
# --------------------------------------------------------------------------

HOST_SCRIPT = Path(__file__).with_name("cabi_host.py")


class CAbiImplementation(Implementation):
    """A C ABI library under test, isolated in a host process or loaded in-process."""

    def __init__(
        self,
        manifest: Manifest,
        adapter_dir: Path,
        config: ManagerConfig,
        *,
        isolation: str | None = None,
        extra_cflags: tuple[str, ...] = (),
        engine: EngineConfig | None = None,
    ) -> None:
        self.manifest = manifest
        self.config = config
        #: set for a request-level session (ABI and protocol version 2)
        self.engine = engine
        self.isolation = isolation or manifest.start.isolation
        self.library_path = build_library(manifest, adapter_dir, extra_cflags)
        self._session: CAbiSession | None = None
        self._host: JsonlImplementation | None = None
        self._dead: str | None = None
        if self.isolation == "inprocess":
            self._session = CAbiSession(
                CAbiLibrary(self.library_path),
                config.model_dump_json(),
                engine_json=engine.model_dump_json() if engine is not None else None,
            )
        elif self.isolation == "process":
            self._host = self._start_host(Path(adapter_dir))
        else:
            raise ConfigError(f"{manifest.name}: unknown start.isolation {self.isolation!r}")

    def _start_host(self, adapter_dir: Path) -> JsonlImplementation:
        from kvspec.conformance.transport.jsonl import AdapterProtocolError, JsonlImplementation

        command = [
            "{python}",
            "-S",  # the host needs only the standard library: skip site-packages, start fast
            str(HOST_SCRIPT),
            str(self.library_path),
            self.manifest.name,
            self.manifest.capabilities.model_dump_json(),
        ]
        host_manifest = self.manifest.model_copy(
            update={"kind": "subprocess", "start": self.manifest.start.model_copy(update={"command": command})}
        )
        try:
            return JsonlImplementation(host_manifest, adapter_dir, self.config, engine=self.engine)
        except AdapterProtocolError as e:
            if e.code != "unsupported_config":
                raise
            # the same error as in-process: kvspec_open refused the configuration
            raise ConfigError(f"kvspec_open refused the configuration: {e}") from None

    @property
    def host(self) -> JsonlImplementation | None:
        """The JSON-lines implementation driving the host process (isolation "process")."""
        return self._host

    def step(self, op: Operation) -> StepOutcome:
        if self._host is not None:
            return self._host.step(op)
        if self.engine is not None:
            raise ConfigError(f"adapter {self.manifest.name!r}: a request-level session takes no block operations")
        return parse_reply(self._call(request_json(op)))

    def engine_call(self, op: EngineOp) -> EngineOutcome:
        """One request-level operation (spec.engine_wire) of a request-level session."""
        if self._host is not None:
            return self._host.engine_call(op)
        if self.engine is None:
            raise ConfigError(
                f"adapter {self.manifest.name!r}: a block-level session takes no request-level operations"
            )
        return parse_engine_reply(self._call(op.model_dump_json().encode()))

    def _call(self, req: bytes) -> bytes:
        if self._dead is not None:
            raise AdapterError(f"not usable after an earlier failure: {self._dead}")
        assert self._session is not None
        try:
            return self._session.call(req)
        except CAbiError as e:
            self._dead = str(e)
            raise AdapterError(f"adapter {self.manifest.name!r}: {e} (request: {req[:200].decode()!r})") from None

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
        if self._session is not None:
            self._session.close()
