"""Request-level adapter for the Dynamo mocker in the ``ai-dynamo-runtime`` wheel.

Each ``RustMocker`` is one child process (``worker.py``) running one mocker
engine with a vLLM-style pool of ``capacity`` blocks (and, when the setup has
one, the write-through host tier), publishing its KV events on Dynamo's ZMQ
event plane on loopback. The parent (this module) only speaks JSON lines
with the child through ``conformance.transport.process.ChildProcess``, and
validates everything that comes back into kvspec's wire models.

Start-up and shutdown leave nothing behind: the child leads its own process
group and ``close()`` ends the group (EOF, then SIGTERM, then SIGKILL), so
the runtime's tokio threads and the loopback listener it never closes go with
it. When ``unshare -rn`` works here, the child runs in a network namespace of
its own with only loopback up, so even the publishers' 0.0.0.0 binds are
unreachable from outside (``KVSPEC_RUST_MOCKER_NETNS``: ``auto`` (default),
``1`` to require it, ``0`` to never use it). Ports are the OS's choice (the
engine binds port 0 and advertises the port it got).

The wheel missing is ``ImplementationUnavailableError`` (the suite skips and
says so); the wheel present but the engine not starting is ``AdapterError``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kvspec.adapters.engine_worker import EngineWorker
from kvspec.api import (
    ChildProcess,
    ConcurrentRun,
    ImplementationUnavailableError,
    Manifest,
    PoolSetup,
    RequestImplementation,
    RequestOutcome,
    RequestSpec,
)
from kvspec.spec.codecs import from_router_event
from kvspec.spec.errors import AdapterError, ConfigError, WireError
from kvspec.spec.wire import KvEvent, Stored

WHEEL = "ai-dynamo-runtime"
TESTED_VERSION = "1.6.1"
#: the engine's own speed-up of its simulated step times (tests want it fast)
SPEEDUP = 10000.0
#: a request is over when no event arrived for this long after it completed
QUIESCE_MS = float(os.environ.get("KVSPEC_RUST_MOCKER_QUIESCE_MS", "25"))
#: a concurrent run whose open requests made no progress (no token, no
#: event) for this long has stalled: they are reported with finish "stalled"
#: (the engine runs at SPEEDUP: a live request makes progress in milliseconds)
STALL_S = float(os.environ.get("KVSPEC_RUST_MOCKER_STALL_S", "5"))
#: events that came after a quiet window closed: the run is repeated on a
#: fresh engine with a window this many times longer, at most LATE_RETRIES
#: times, then reported as the adapter's transport problem
LATE_FACTOR = 4.0
LATE_RETRIES = 2
#: host-tier transfers take bytes/bandwidth of simulated time: keep them tiny
KV_BYTES_PER_TOKEN = 2
MAX_REPLY_BYTES = 64 * 1024 * 1024
_LOOPBACK_ENV = {
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_EVENT_PLANE_HOST": "127.0.0.1",
    "DYN_SYSTEM_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    "DYN_SELF_HOST_METADATA": "0",
}


class _LateEvents(Exception):
    """Events arrived after the quiet window that was to hold them closed."""


_T = TypeVar("_T")


def wheel_version() -> str | None:
    """The installed ai-dynamo-runtime version, or None."""
    try:
        return importlib.metadata.version(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def netns_works() -> bool:
    """Can this user start a process in a fresh network namespace with lo up?"""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    try:
        r = subprocess.run(
            ["unshare", "-rn", "sh", "-c", "ip link set lo up"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def child_argv() -> list[str]:
    """The worker's command line, inside a loopback-only namespace when possible."""
    argv = [sys.executable, "-m", "kvspec.adapters.rust_mocker.worker"]
    mode = os.environ.get("KVSPEC_RUST_MOCKER_NETNS", "auto")
    if mode == "0":
        return argv
    if netns_works():
        return ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', *argv]
    if mode == "1":
        raise AdapterError("KVSPEC_RUST_MOCKER_NETNS=1 but 'unshare -rn' with 'ip link set lo up' does not work here")
    return argv


#: the mocker's vLLM-style engine backend (an engine, not the vllm profile)
VLLM_BACKEND = "vllm"
#: the mocker's selectable backends (its ``engine.backend``) by variant name:
#: no variant runs the vLLM-style one; ``kvbm`` is not compiled into the wheel
BACKENDS: dict[str | None, str] = {None: VLLM_BACKEND, "sglang": "sglang", "trtllm": "trtllm"}


def engine_config(setup: PoolSetup, backend: str = VLLM_BACKEND, token_ids: bool = False) -> dict[str, Any]:
    """The mocker's ``engine`` section; ``token_ids`` turns on the events'
    token ids (``emit_kv_token_ids``, which needs ``emit_kv_events``)."""
    engine: dict[str, Any] = {
        "backend": backend,
        "num_gpu_blocks": setup.manager.capacity,
        "block_size": setup.manager.block_size,
        "speedup_ratio": SPEEDUP,
        "decode_speedup_ratio": SPEEDUP,
    }
    if setup.host_blocks is not None:
        engine["kv_cache_bytes_per_token"] = KV_BYTES_PER_TOKEN
        engine["native_host_offload"] = {"num_host_blocks": setup.host_blocks}
    if token_ids:
        engine["emit_kv_events"] = True
        engine["emit_kv_token_ids"] = True
    return engine


def attach_token_ids(events: Sequence[KvEvent], raw: Any, block_size: int) -> list[KvEvent]:
    """The event plane's events with each Stored's token ids, taken block by
    block from the raw publisher's BlockStored events (the two streams carry
    the same events, batched differently: the event plane coalesces a run of
    them into one; the raw one names the tokens). A block hash names its
    tokens (it chains over them), so the join is by block hash. Raises
    WireError for a raw event that cannot be read or a stored block no raw
    event names."""
    if raw is None and not any(isinstance(ev.data, Stored) for ev in events):
        raw = []  # a request the worker never sent (after a stall) has no streams at all
    if not isinstance(raw, list):
        raise WireError("raw_events must be a list")
    tokens: dict[int, list[int]] = {}
    for r in raw:
        if not isinstance(r, dict) or r.get("type") != "BlockStored":
            continue
        hashes, toks = r.get("block_hashes"), r.get("token_ids")
        if not isinstance(hashes, list) or not isinstance(toks, list) or len(toks) != len(hashes) * block_size:
            raise WireError(f"raw BlockStored with {len(toks or [])} token ids for its blocks: {str(r)[:200]}")
        for i, h in enumerate(hashes):
            tokens[h] = toks[i * block_size : (i + 1) * block_size]
    out: list[KvEvent] = []
    for ev in events:
        if isinstance(ev.data, Stored):
            missing = [b.block_hash for b in ev.data.stored.blocks if b.block_hash not in tokens]
            if missing:
                raise WireError(f"no raw BlockStored names the tokens of blocks {missing} of {ev.brief()}")
            pages = [tokens[b.block_hash] for b in ev.data.stored.blocks]
            ev = KvEvent.model_validate({**ev.model_dump(), "block_token_ids": pages})
        out.append(ev)
    return out


def decode_event(raw: Any) -> tuple[int, KvEvent]:
    """One Dynamo router event (as the event plane carries it) into kvspec's
    model; fields kvspec does not model must be absent or null."""
    if not isinstance(raw, dict) or not isinstance(raw.get("event"), dict):
        raise WireError(f"router event must be an object with an 'event' object, got {str(raw)[:200]}")
    ev = dict(raw["event"])
    outer_rank = raw.get("dp_rank")
    if outer_rank is not None and ev.get("dp_rank", outer_rank) != outer_rank:
        raise WireError(f"router event dp_rank {outer_rank} disagrees with its event's {ev.get('dp_rank')}")
    data = ev.get("data")
    if isinstance(data, dict) and isinstance(data.get("stored"), dict):
        stored = dict(data["stored"])
        blocks = []
        for b in stored.get("blocks") or []:
            if isinstance(b, dict) and "mm_extra_info" in b:
                if b["mm_extra_info"] is not None:
                    raise WireError("stored block carries multimodal info, which kvspec does not model")
                b = {k: v for k, v in b.items() if k != "mm_extra_info"}
            blocks.append(b)
        stored["blocks"] = blocks
        ev["data"] = {"stored": stored}
    return from_router_event(
        {"worker_id": raw.get("worker_id", 0), "storage_tier": raw.get("storage_tier"), "event": ev}
    )


class RustMocker(RequestImplementation):
    """One Dynamo mocker engine in a child process."""

    def __init__(self, setup: PoolSetup, manifest: Manifest, backend: str = VLLM_BACKEND) -> None:
        self.setup = setup
        self.manifest = manifest
        self.backend = backend
        version = wheel_version()
        if version is None:
            raise ImplementationUnavailableError(
                f"the {WHEEL} wheel is not installed (pip install 'kvspec[dynamo]' installs {WHEEL}=={TESTED_VERSION})"
            )
        self.version = version
        self.worker_id: int | None = None
        #: join the raw publisher's token ids to the Stored events
        self.token_ids = manifest.capabilities.event_token_ids
        self._tmp = tempfile.mkdtemp(prefix="kvspec-rust-mocker-")
        self.worker: EngineWorker | None = None
        #: the quiet window in use (grows when events came late: ``_runs``)
        self.quiesce_ms = QUIESCE_MS
        #: the late-event notes of each attempt that was run again
        self.retried: list[str] = []
        self._start()

    def _start(self) -> None:
        """Start a fresh engine in a fresh child (the first one, or after late events)."""
        env = dict(os.environ)
        env.update(_LOOPBACK_ENV)
        env["DYN_FILE_KV"] = os.path.join(self._tmp, f"kv{len(self.retried)}")
        env.setdefault("DYN_LOG", "error")
        env["PYTHONUNBUFFERED"] = "1"
        setup, manifest = self.setup, self.manifest
        try:
            self.worker = EngineWorker(
                child_argv(),
                name="the mocker",
                engine="the mocker",
                env=env,
                max_reply_bytes=MAX_REPLY_BYTES,
                cwd=self._tmp,
                close_grace_s=1.0,
            )
            started = self._ask(
                {
                    "op": "start",
                    "engine": engine_config(setup, self.backend, token_ids=self.token_ids),
                    "token_ids": self.token_ids,
                    "namespace": f"kvspec{uuid.uuid4().hex[:12]}",
                    "block_size": setup.manager.block_size,
                    "num_gpu_blocks": setup.manager.capacity,
                    "timeout_s": manifest.start.startup_timeout_s,
                },
                manifest.start.startup_timeout_s + 5,
                "start",
            )
        except BaseException:
            self.close()
            raise
        if started.get("ok") != "started":
            self.close()
            raise AdapterError(f"the mocker did not start: {started}")
        self.startup_s = float(started.get("startup_s", 0.0))
        self.child_pid = self.worker.child.pid

    @property
    def child(self) -> ChildProcess | None:
        """The worker's process (None once closed)."""
        return self.worker.child if self.worker is not None else None

    # ------------------------------------------------------------ transport
    def _w(self) -> EngineWorker:
        if self.worker is None:
            raise AdapterError("the mocker is closed")
        return self.worker

    def _send(self, msg: dict[str, Any]) -> None:
        self._w().send(msg)

    def _recv(self, timeout_s: float, what: str) -> dict[str, Any]:
        return self._w().recv(timeout_s, what)

    def _ask(self, msg: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
        return self._w().ask(msg, timeout_s, what)

    def _failure(self, message: str) -> AdapterError:
        return self.worker.failure(message) if self.worker is not None else AdapterError(message)

    def _events(self, raws: Any, where: str, reply: dict[str, Any] | None = None) -> list[KvEvent]:
        out = self._plane_events(raws, where)
        if not self.token_ids or reply is None:
            return out
        try:
            return attach_token_ids(out, reply.get("raw_events"), self.setup.manager.block_size)
        except WireError as e:
            raise self._failure(f"{where}: the token ids of the raw event stream: {e}") from None

    def _plane_events(self, raws: Any, where: str) -> list[KvEvent]:
        if not isinstance(raws, list):
            raise self._failure(f"{where}: events must be a list")
        out: list[KvEvent] = []
        for raw in raws:
            try:
                worker, ev = decode_event(raw)
            except WireError as e:
                raise self._failure(f"{where}: the mocker published an event kvspec cannot read: {e}") from None
            if self.worker_id is None:
                self.worker_id = worker
            elif worker != self.worker_id:
                raise self._failure(f"{where}: events from two workers ({self.worker_id} and {worker}) in one engine")
            out.append(ev)
        return out

    def _check_problems(self, reply: dict[str, Any], where: str) -> None:
        problems = reply.get("problems") or []
        if problems:
            raise self._failure(f"{where}: the event plane lost or garbled events: {'; '.join(map(str, problems))}")

    def _run_message(self, mode: str, requests: Sequence[RequestSpec]) -> dict[str, Any]:
        for i, r in enumerate(requests):
            self.setup.check_fits(i, r)  # the mocker would stall: refuse clearly instead
        return {
            "op": "run",
            "mode": mode,
            "requests": [r.model_dump() for r in requests],
            "quiesce_ms": self.quiesce_ms,
            "request_timeout_s": self.manifest.start.timeout_s,
            "max_settle_s": 5.0,
            "stall_s": STALL_S,
        }

    def _outcome(self, reply: dict[str, Any], events: list[KvEvent]) -> RequestOutcome:
        try:
            return RequestOutcome(
                cached_tokens=reply.get("cached_tokens"),
                finish=str(reply.get("finish")),
                output_tokens=int(reply.get("output_tokens", 0)),
                events=events,
            )
        except (ValueError, TypeError) as e:
            raise self._failure(f"the mocker's request outcome is malformed: {e}") from None

    def _check_late(self, reply: dict[str, Any], where: str) -> None:
        late = reply.get("late") or []
        if not isinstance(late, list):
            raise self._failure(f"{where}: 'late' must be a list")
        if late:
            raise _LateEvents(f"{where}: {'; '.join(map(str, late))} (quiet window {self.quiesce_ms:g} ms)")

    def _runs(self, run: Callable[[], _T]) -> _T:
        """``run`` on this engine; when events came after a quiet window
        closed (the split of the stream into requests would depend on machine
        load), again on a fresh engine with a window LATE_FACTOR times longer,
        at most LATE_RETRIES times; then a transport problem of the adapter
        (AdapterError), never a verdict on the implementation."""
        while True:
            try:
                return run()
            except _LateEvents as e:
                self.retried.append(str(e))
                if len(self.retried) > LATE_RETRIES:
                    raise self._failure(
                        "the adapter could not tell which request the mocker's events belong to: events kept "
                        f"arriving after the quiet window closed ({' | '.join(self.retried)}); this is a transport "
                        "problem of the adapter (machine load?), not a finding about the mocker"
                    ) from None
                if self.worker is not None:
                    self.worker.close()
                    self.worker = None
                self.quiesce_ms *= LATE_FACTOR
                self._start()

    # ------------------------------------------------------------ runs
    def run_sequential(self, requests: Sequence[RequestSpec]) -> list[RequestOutcome]:
        return self._runs(lambda: self._run_sequential(requests))

    def run_concurrent(self, requests: Sequence[RequestSpec]) -> ConcurrentRun:
        return self._runs(lambda: self._run_concurrent(requests))

    def _run_sequential(self, requests: Sequence[RequestSpec]) -> list[RequestOutcome]:
        self._send(self._run_message("sequential", requests))
        per_request = self.manifest.start.timeout_s + 10
        out: list[RequestOutcome] = []
        for i in range(len(requests)):
            reply = self._recv(per_request, f"request {i}")
            if reply.get("ok") != "request" or reply.get("index") != i:
                raise self._failure(f"expected the outcome of request {i}, got {str(reply)[:200]}")
            self._check_problems(reply, f"request {i}")
            self._check_late(reply, f"request {i}")
            out.append(self._outcome(reply, self._events(reply.get("events"), f"request {i}", reply)))
        done = self._recv(per_request, "the end of the run")
        if done.get("ok") != "done":
            raise self._failure(f"expected the end of the run, got {str(done)[:200]}")
        self._check_late(done, "the end of the run")
        return out

    def _run_concurrent(self, requests: Sequence[RequestSpec]) -> ConcurrentRun:
        self._send(self._run_message("concurrent", requests))
        reply = self._recv(self.manifest.start.timeout_s * max(1, len(requests)) + 10, "a concurrent run")
        if reply.get("ok") != "concurrent" or not isinstance(reply.get("outcomes"), list):
            raise self._failure(f"expected a concurrent outcome, got {str(reply)[:200]}")
        self._check_problems(reply, "the concurrent run")
        self._check_late(reply, "the concurrent run")
        events = self._events(reply.get("events"), "the concurrent run", reply)
        return ConcurrentRun(outcomes=[self._outcome(o, []) for o in reply["outcomes"]], events=events)

    def close(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(self._tmp, ignore_errors=True)


def open_rust_mocker(setup: PoolSetup, manifest: Manifest, adapter_dir: Path, variant: str | None = None) -> RustMocker:
    """One mocker engine for ``setup``; ``variant`` picks the backend
    (``--impl=adapters/rust_mocker/sglang``; none: the vLLM-style one)."""
    if variant not in BACKENDS:
        known = ", ".join(k for k in BACKENDS if k)
        raise ConfigError(f"the mocker has no backend {variant!r} (known variants: {known})")
    backend = BACKENDS[variant]
    if setup.manager.capacity > manifest.capabilities.max_capacity:
        raise ConfigError(f"capacity {setup.manager.capacity} exceeds the adapter's max_capacity")
    if setup.manager.block_size < 2 and backend == VLLM_BACKEND:
        raise ConfigError("the mocker's vLLM backend needs block_size >= 2 (the engine refuses 1)")
    if setup.manager.dp_rank != 0:
        raise ConfigError("the adapter runs one mocker with one data-parallel rank (dp_rank 0)")
    return RustMocker(setup, manifest, backend)
