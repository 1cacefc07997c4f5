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

from kvspec.conformance.requests.api import ConcurrentRun, RequestImplementation, RequestOutcome
from kvspec.conformance.run.manifest import Manifest
from kvspec.reference.requests import PoolSetup, RequestSpec, SyntheticDecode, interleave, run_sequential


class ReferenceRequests(RequestImplementation):
    def __init__(self, setup: PoolSetup, manifest: Manifest) -> None:
        self.setup = setup
        self.manifest = manifest
        self.runs = 0

    def _decode(self) -> SyntheticDecode:
        self.runs += 1  # a fresh salt per run: decode tokens differ between runs, as in the mocker
        return SyntheticDecode(self.setup.manager.block_size, salt=self.runs)

    def run_sequential(self, requests: Sequence[RequestSpec]) -> list[RequestOutcome]:
        results = run_sequential(self.setup, requests, decode=self._decode())
        return [RequestOutcome(cached_tokens=r.cached_tokens, events=r.events) for r in results]

    def run_concurrent(self, requests: Sequence[RequestSpec]) -> ConcurrentRun:
        results, stream = interleave(self.setup, requests, decode=self._decode())
        return ConcurrentRun(outcomes=[RequestOutcome(cached_tokens=r.cached_tokens) for r in results], events=stream)


def open_reference_requests(setup: PoolSetup, manifest: Manifest, adapter_dir: Path) -> ReferenceRequests:
    return ReferenceRequests(setup, manifest)
