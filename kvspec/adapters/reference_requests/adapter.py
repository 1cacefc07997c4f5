"""In-process request-level adapter over the reference model.

Sequential runs are the request driver itself (``reference.requests``);
concurrent runs interleave the requests one engine step at a time. Decode
blocks are hashed over synthetic hidden tokens, the way the Dynamo mocker
hashes its own random ones, so the suite's handling of unpredictable decode
hashes is exercised on the reference too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvspec.api import (
    ConcurrentRun,
    Finished,
    Manifest,
    PoolSetup,
    RequestEngine,
    RequestImplementation,
    RequestOutcome,
    RequestSpec,
    SyntheticDecode,
    interleave,
    make_engine,
    run_sequential,
)
from kvspec.spec.wire import KvEvent


class ReferenceRequests(RequestImplementation):
    def __init__(self, setup: PoolSetup, manifest: Manifest) -> None:
        self.setup = setup
        self.manifest = manifest
        self.runs = 0
        self.engine: RequestEngine | None = None
        self.pending: list[Finished] = []

    def _decode(self) -> SyntheticDecode:
        self.runs += 1  # a fresh salt per run: decode tokens differ between runs, as in the mocker
        return SyntheticDecode(self.setup.manager.block_size, salt=self.runs)

    def run_sequential(self, requests: Sequence[RequestSpec]) -> list[RequestOutcome]:
        results = run_sequential(self.setup, requests, decode=self._decode())
        return [RequestOutcome(cached_tokens=r.cached_tokens, events=r.events) for r in results]

    def run_concurrent(self, requests: Sequence[RequestSpec]) -> ConcurrentRun:
        results, stream = interleave(self.setup, requests, decode=self._decode())
        return ConcurrentRun(outcomes=[RequestOutcome(cached_tokens=r.cached_tokens) for r in results], events=stream)

    # step by step, on one engine kept across calls (the reset test)
    def _engine(self) -> RequestEngine:
        if self.engine is None:
            self.engine = make_engine(self.setup, decode=self._decode())
        return self.engine

    def add(self, request_id: str, spec: RequestSpec) -> None:
        self.pending.extend(self._engine().add(request_id, spec).finished)

    def step(self) -> tuple[list[KvEvent], list[dict[str, Any]], bool]:
        engine = self._engine()
        call = engine.step()
        finished, self.pending = [*self.pending, *call.finished], []
        return (
            call.events,
            [{"id": f.request_id, "cached_tokens": f.result.cached_tokens} for f in finished],
            engine.idle,
        )

    def reset_prefix_cache(self) -> tuple[bool, list[KvEvent]]:
        ok, call = self._engine().reset_prefix_cache()
        return ok, call.events


def open_reference_requests(setup: PoolSetup, manifest: Manifest, adapter_dir: Path) -> ReferenceRequests:
    return ReferenceRequests(setup, manifest)
