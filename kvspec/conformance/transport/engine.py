"""Request-level implementations behind protocol version 2 (JSON lines or the C ABI).

A ``kind = "subprocess"`` or ``kind = "c_abi"`` adapter that declares
``request_level`` (and no ``start.requests`` factory of its own) runs the
request-level layer through the version-2 messages of ``spec.engine_wire``:
the session is opened with the pool's ``ManagerConfig`` and an
``EngineConfig`` (the host tier), then ``EngineImplementation`` turns a
workload into ``add_request`` and ``step`` calls:

- ``run_sequential``: one request at a time: add it, then step until the
  engine reports it finished; the events of those calls are its events.
- ``run_concurrent``: add every request, then step until all have finished;
  one stream.

The engine is untrusted like any adapter: a request reported finished that
was never added (or twice), an engine that goes idle with a request
unfinished, or one that needs more steps than any schedule could
(``step_budget``) is an ``AdapterError`` naming the request, never a hang.
Transport failures (crash, hang, garbage, oversized reply) are the
transports' own ``AdapterError``s, as for block-level sessions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from kvspec.conformance.requests.interface import ConcurrentRun, RequestImplementation, RequestOutcome
from kvspec.reference.requests import PoolSetup, RequestSpec
from kvspec.spec.engine_wire import (
    AddRequest,
    EngineConfig,
    EngineOp,
    EngineOutcome,
    EngineStep,
    FinishedRequest,
    ResetPrefixCache,
)
from kvspec.spec.errors import AdapterError, ConfigError
from kvspec.spec.manifest import Manifest
from kvspec.spec.wire import KvEvent

#: steps an engine may take beyond one per prompt token and generated token
#: (a chunked prefill of one token per step is the slowest sane schedule)
STEP_SLACK = 16


class EngineCaller(Protocol):
    """A request-level session of a transport (``JsonlImplementation``,
    ``CAbiImplementation`` opened with an engine)."""

    def engine_call(self, op: EngineOp) -> EngineOutcome: ...

    def close(self) -> None: ...


def step_budget(requests: Sequence[RequestSpec]) -> int:
    """Most engine steps a run of ``requests`` may take before it is a stall."""
    return sum(len(r.prompt) + r.max_tokens for r in requests) + STEP_SLACK


def engine_config(setup: PoolSetup) -> EngineConfig:
    return EngineConfig(host_blocks=setup.host_blocks)


class EngineImplementation(RequestImplementation):
    """A request-level implementation reached through protocol version 2."""

    def __init__(self, manifest: Manifest, setup: PoolSetup, caller: EngineCaller) -> None:
        self.manifest = manifest
        self.setup = setup
        self.caller = caller
        self._runs = 0
        #: what ``add`` got back, handed out by the next ``step``
        self._pending_events: list[KvEvent] = []
        self._pending_finished: list[FinishedRequest] = []

    def _finish(
        self, out: EngineOutcome, pending: dict[str, int], done: dict[str, FinishedRequest], during: str
    ) -> None:
        for f in out.finished:
            if f.request_id in done:
                raise AdapterError(f"adapter {self.manifest.name!r}: {during}: request {f.request_id!r} finished twice")
            if f.request_id not in pending:
                raise AdapterError(
                    f"adapter {self.manifest.name!r}: {during}: reports request {f.request_id!r} finished, "
                    f"which is not running (running: {sorted(pending)})"
                )
            del pending[f.request_id]
            done[f.request_id] = f

    def _run(self, requests: Sequence[RequestSpec], *, sequential: bool) -> tuple[list[RequestOutcome], list[KvEvent]]:
        self._runs += 1
        names = [f"w{self._runs}r{i}" for i in range(len(requests))]
        done: dict[str, FinishedRequest] = {}
        per_request: list[list[KvEvent]] = [[] for _ in requests]
        stream: list[KvEvent] = []
        batches = [[i] for i in range(len(requests))] if sequential else [list(range(len(requests)))]
        for batch in batches:
            pending: dict[str, int] = {}
            for i in batch:
                r = requests[i]
                pending[names[i]] = i
                out = self.caller.engine_call(
                    AddRequest(op="add_request", request_id=names[i], prompt=r.prompt, max_tokens=r.max_tokens)
                )
                self._finish(out, pending, done, f"add_request {names[i]!r}")
                per_request[i].extend(out.events)
                stream.extend(out.events)
            budget = step_budget([requests[i] for i in batch])
            steps = 0
            while pending:
                if steps >= budget:
                    raise AdapterError(
                        f"adapter {self.manifest.name!r}: requests {sorted(pending)} did not finish within "
                        f"{budget} engine steps (the prompts and max_tokens need far fewer): the engine stalls"
                    )
                out = self.caller.engine_call(EngineStep(op="step"))
                steps += 1
                self._finish(out, pending, done, f"step {steps}")
                if sequential:
                    per_request[batch[0]].extend(out.events)
                stream.extend(out.events)
                if pending and out.running == 0 and out.waiting == 0:
                    raise AdapterError(
                        f"adapter {self.manifest.name!r}: after step {steps} the engine reports nothing running "
                        f"or waiting, but requests {sorted(pending)} never finished"
                    )
        outcomes = [
            RequestOutcome(
                cached_tokens=done[n].cached_tokens,
                finish=done[n].finish_reason,
                output_tokens=done[n].output_tokens,
                events=per_request[i] if sequential else [],
            )
            for i, n in enumerate(names)
        ]
        return outcomes, stream

    def run_sequential(self, requests: Sequence[RequestSpec]) -> list[RequestOutcome]:
        return self._run(requests, sequential=True)[0]

    def run_concurrent(self, requests: Sequence[RequestSpec]) -> ConcurrentRun:
        outcomes, stream = self._run(requests, sequential=False)
        return ConcurrentRun(outcomes=outcomes, events=stream)

    # ------------------------------------------------ step by step (reset test)

    def add(self, request_id: str, spec: RequestSpec) -> None:
        out = self.caller.engine_call(
            AddRequest(op="add_request", request_id=request_id, prompt=spec.prompt, max_tokens=spec.max_tokens)
        )
        self._pending_events.extend(out.events)
        self._pending_finished.extend(out.finished)

    def step(self) -> tuple[list[KvEvent], list[dict[str, Any]], bool]:
        out = self.caller.engine_call(EngineStep(op="step"))
        events, self._pending_events = [*self._pending_events, *out.events], []
        finished, self._pending_finished = [*self._pending_finished, *out.finished], []
        done = [{"id": f.request_id, "cached_tokens": f.cached_tokens} for f in finished]
        return events, done, out.running == 0 and out.waiting == 0

    def reset_prefix_cache(self) -> tuple[bool, list[KvEvent]]:
        out = self.caller.engine_call(ResetPrefixCache(op="reset_prefix_cache"))
        if out.reset is None:
            raise AdapterError(
                f"adapter {self.manifest.name!r}: reset_prefix_cache: the reply has no 'reset' field (true or false)"
            )
        return out.reset, list(out.events)

    def close(self) -> None:
        self.caller.close()


def open_engine_implementation(manifest: Manifest, adapter_dir: Path, setup: PoolSetup) -> EngineImplementation:
    """A request-level session of a subprocess or C ABI adapter (protocol version 2)."""
    engine = engine_config(setup)
    caller: EngineCaller
    if manifest.kind == "subprocess":
        from kvspec.conformance.transport.jsonl import JsonlImplementation

        caller = JsonlImplementation(manifest, adapter_dir, setup.manager, engine=engine)
    elif manifest.kind == "c_abi":
        from kvspec.conformance.transport.cabi import CAbiImplementation

        caller = CAbiImplementation(manifest, adapter_dir, setup.manager, engine=engine)
    else:
        raise ConfigError(f"{manifest.name}: kind {manifest.kind!r} has no protocol-v2 request level")
    return EngineImplementation(manifest, setup, caller)


def open_engine_command(
    manifest: Manifest, adapter_dir: Path, setup: PoolSetup, command: list[str]
) -> EngineImplementation:
    """A request-level session of a JSON-lines child started with ``command``
    (argv with ``{python}`` / ``{adapter_dir}``), under ``manifest``'s name,
    timeouts and capabilities."""
    child = manifest.model_copy(
        update={"kind": "subprocess", "start": manifest.start.model_copy(update={"command": command})}
    )
    return open_engine_implementation(child, adapter_dir, setup)
