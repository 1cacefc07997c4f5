"""Start the implementation once, before any test runs.

A conformance run against an adapter that cannot start (a binary that was
never built, a command that hangs before its handshake, a factory that does
not import) would otherwise fail every test the same way: one start-up
timeout per test, one chained traceback per test. The plugin calls
``probe`` once when the session has collected its tests; a failure stops the
run with one message and a hint (pytest's usage-error exit status), and a
working adapter costs one extra start.

An implementation that says it cannot run on this machine
(``ImplementationUnavailableError``: a wheel that is not installed) is not a
start-up failure: its tests skip with the install command, as before.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.conformance.requests.interface import ImplementationUnavailableError
from kvspec.spec import registry
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import KvSpecError
from kvspec.spec.manifest import Manifest
from kvspec.spec.profiles import VLLM
from kvspec.spec.profiles import profile as get_profile

#: profiles a block-level adapter can be started with (the manager and radix
#: profiles start through their own factories)
_BLOCK_PROFILES = registry.names("block")


def _hint(manifest: Manifest, adapter_dir: Path, error: str) -> str:
    """What to try, judged from the kind and the error text."""
    low = error.lower()
    if manifest.kind in ("subprocess", "c_abi") and (
        "no such file" in low or "not found" in low or "cannot load" in low or "not executable" in low
    ):
        return (
            f"did you build it? the manifest's start section names a program or library that is not there "
            f"(see {adapter_dir / 'manifest.toml'} and the adapter's README)"
        )
    if "handshake" in low and ("hangs" in low or "no reply" in low or "timed out" in low):
        return (
            "the adapter started but did not complete its handshake in start.startup_timeout_s; "
            "run its start command by hand and send it the handshake of spec/PROTOCOL.md"
        )
    if "no module named" in low or "importerror" in low or "modulenotfound" in low:
        return "the factory's module does not import: is it installed in this environment (pip install -e .)?"
    return f"check {adapter_dir / 'manifest.toml'} against spec/ADAPTERS.md"


def negotiated(impl: object) -> str | None:
    """What the started implementation and kvspec agreed on: the JSON-lines
    protocol version its handshake chose (``ready.protocol``; a C library in a
    host process speaks it through the host), or the C ABI version of a
    library loaded in process. None: nothing was negotiated (kind python)."""
    seen: set[int] = set()
    todo = [impl]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        ready = getattr(obj, "ready", None)
        version = getattr(ready, "protocol", None)
        if isinstance(version, int):
            return f"JSON lines protocol version {version} (chosen in the handshake)"
        lib = getattr(getattr(obj, "_session", None), "lib", None)
        abi = getattr(lib, "version", None)
        if isinstance(abi, int):
            return f"C ABI version {abi} (kvspec_abi_version of the library, loaded in process)"
        # wrappers (a C library's host process, request-level adapters) hold the session one level down
        todo += [v for k in ("_host", "_impl", "impl", "inner", "_inner") if (v := getattr(obj, k, None)) is not None]
    return None


def _start_and_close(manifest: Manifest, adapter_dir: Path) -> str | None:
    """Start the implementation as the tests will, close it; what was negotiated."""
    caps = manifest.capabilities
    profile = manifest.profile if manifest.profile in _BLOCK_PROFILES else None
    if caps.block_level and profile is not None and manifest.kind != "request":
        from kvspec.conformance.opener import open_adapter

        own = get_profile(profile).policies
        eviction = own[0] if len(own) == 1 else (caps.policies[0] if caps.policies else "lineage")
        config = ManagerConfig.model_validate({"profile": profile, "capacity": 8, "eviction": eviction})
        impl = open_adapter(manifest, adapter_dir, config)
        try:
            return negotiated(impl)
        finally:
            impl.close()
    if caps.request_level:
        from kvspec.conformance.opener import open_adapter
        from kvspec.reference.requests import PoolSetup

        setup = PoolSetup(manager=ManagerConfig(profile=VLLM.name, capacity=8, eviction="lru"))
        req = open_adapter(manifest, adapter_dir, setup)
        try:
            return negotiated(req)
        finally:
            req.close()
    return None


def start_once(manifest: Manifest, adapter_dir: Path) -> tuple[str | None, str | None]:
    """(problem, negotiated): problem is None when the implementation starts
    and closes (or says it cannot run here), else one message naming what
    failed, with a hint; negotiated is what ``negotiated`` found (None: no
    wire protocol, or the implementation did not start)."""
    try:
        return None, _start_and_close(manifest, adapter_dir)
    except ImplementationUnavailableError:
        return None, None
    except (KvSpecError, OSError, ImportError, ValueError, RuntimeError, TimeoutError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (
            f"kvspec: the implementation {manifest.name!r} ({manifest.kind}, {adapter_dir}) did not start: "
            f"{type(e).__name__}: {first}\n  hint: {_hint(manifest, adapter_dir, str(e))}"
        ), None


def probe(manifest: Manifest, adapter_dir: Path) -> str | None:
    """``start_once``'s problem alone."""
    return start_once(manifest, adapter_dir)[0]
