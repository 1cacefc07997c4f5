"""Radix-profile adapter for SGLang's real ``RadixCache`` (sglang 0.5.23).

SGLang runs in a worker child process (``worker.py``; ``loader.py`` says
what its import needs on a CPU-only machine), started on first use and
shared by the sessions of a test run; every session is a fresh
``RadixCache`` with KV events on, driven through its public API
(``match_prefix``, ``insert``, ``inc_lock_ref``, ``dec_lock_ref``, ``evict``,
``reset``, ``evictable_size``, ``protected_size``) over a slot allocator the
worker provides. The events are the ones SGLang's ``KVCacheEventRecorder``
queued, taken after every operation.

What the adapter translates, and only this:

- **Hashes.** SGLang names a page by the first 8 bytes of a sha256 chain
  over its path (``spec.hashing.sglang_page_digests``: kvspec's own
  implementation of that scheme). For every Stored the adapter computes the
  chain from the parent's digest (known from the Stored that announced the
  parent; the root has none) and the page's token ids; a hash SGLang
  published is replaced by kvspec's sequence hash of the same page only when
  it is exactly the hash kvspec computes for SGLang's scheme. Anything else
  passes through (as an unsigned 64-bit number) and the lockstep reports it.
  A Removed's hashes are mapped through the same table.
- **Tokens hashes.** SGLang's events carry token ids, not a local hash: the
  adapter adds kvspec's local hash of each page's tokens.
- **Ids.** Events are numbered from 0 per cache, in queue order. The Cleared
  every new ``RadixCache`` queues from its constructor (``__init__`` calls
  ``reset``) is taken at open and checked to be exactly that one event; it is
  not part of the stream under test.

``KVSPEC_SGLANG_DYNAMO_FORMAT=1`` opens every cache with SGLang's
``dynamo_kv_event_format`` option (it changes only how namespaced keys are
hashed; the suite's keys have no namespace, so the stream must not change).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from kvspec.adapters.engine_worker import EngineWorker, SharedWorker
from kvspec.api import ImplementationUnavailableError, RadixImplementation
from kvspec.spec.errors import AdapterError
from kvspec.spec.hashing import local_block_hash, sequence_hash, sglang_event_hash, sglang_page_digests
from kvspec.spec.manager_wire import OpError
from kvspec.spec.manifest import Manifest
from kvspec.spec.radix_wire import RadixConfig, RadixOp, RadixOutcome, RadixSnapshot
from kvspec.spec.wire import KvEvent, make_cleared, make_removed, make_stored

DIST = "sglang"
TESTED_VERSION = "0.5.23"
INSTALL_HINT = (
    "make engines (installs sglang==0.5.23 without its declared dependencies, pinned in constraints-engines.txt)"
)
MAX_REPLY_BYTES = 64 * 1024 * 1024
U64 = (1 << 64) - 1


def require_sglang() -> str:
    """The installed sglang version, or ImplementationUnavailableError naming the install command."""
    try:
        version = importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is None or importlib.util.find_spec("sglang") is None:
        raise ImplementationUnavailableError(f"SGLang is not installed here ({DIST}); install it with: {INSTALL_HINT}")
    return version


def start_worker() -> EngineWorker:
    """The child process that imports SGLang (``worker.py``)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("SGLANG_LOGGING_LEVEL", "WARNING")
    return EngineWorker(
        [sys.executable, "-m", "kvspec.adapters.sglang.worker"],
        name="the SGLang worker",
        engine="SGLang",
        env=env,
        max_reply_bytes=MAX_REPLY_BYTES,
    )


_WORKER = SharedWorker(start_worker)


def shared_worker() -> EngineWorker:
    """The run's SGLang worker, started on first use (and again if it died)."""
    return _WORKER.get()


class PageHashes:
    """SGLang's page hash -> (its full digest, kvspec's sequence hash), learnt from Stored events."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[bytes, int]] = {}
        self.verified = 0

    def stored(self, parent: int | None, pages: list[list[int]], published: list[int]) -> tuple[int | None, list[int]]:
        """kvspec's parent and block hashes for one Stored (see module docstring)."""
        if parent is None:
            prior, kv_parent = None, None
        elif parent in self.known:
            prior, kv_parent = self.known[parent]
        else:
            return parent & U64, [h & U64 for h in published]
        out: list[int] = []
        kv = kv_parent
        for page, h in zip(pages, published, strict=True):
            [digest] = sglang_page_digests(page, len(page), prior)
            kv = sequence_hash(kv, local_block_hash(page))
            if sglang_event_hash(digest) == h:
                self.known[h] = (digest, kv)
                self.verified += 1
                out.append(kv)
            else:
                out.append(h & U64)
            prior = digest
        return kv_parent, out

    def removed(self, h: int) -> int:
        k = self.known.get(h)
        return k[1] if k is not None else h & U64


class SglangRadix(RadixImplementation):
    """One SGLang RadixCache in the shared worker."""

    def __init__(self, config: RadixConfig, manifest: Manifest) -> None:
        self.config = config
        self.timeout_s = manifest.start.timeout_s
        self.worker = shared_worker()
        self.hashes = PageHashes()
        self.next_id = 0
        dynamo = os.environ.get("KVSPEC_SGLANG_DYNAMO_FORMAT") == "1"
        reply = self.worker.ask(
            {"op": "open", "page_size": config.page_size, "capacity": config.capacity, "dynamo_format": dynamo},
            manifest.start.startup_timeout_s,
            "open",
        )
        opened = reply.get("opened")
        if opened != [{"type": "AllBlocksCleared"}]:
            raise AdapterError(f"a new SGLang RadixCache queued {opened!r}, not the one AllBlocksCleared of its reset")
        self.absent: list[str] = list(reply.get("absent", []))

    def step(self, op: RadixOp) -> RadixOutcome:
        reply = self.worker.ask({"op": "step", "step": op.model_dump(mode="json")}, self.timeout_s, op.op)
        events = [self._event(e) for e in reply.get("events", [])]
        state = RadixSnapshot.model_validate(reply["state"])
        if "refused" in reply:
            rule, message = reply["refused"]
            return RadixOutcome(error=OpError(rule=rule, message=message), events=events, state=state)
        return RadixOutcome(value=int(reply["value"]), events=events, state=state)

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _event(self, e: dict[str, Any]) -> KvEvent:
        kind = e.get("type")
        if e.get("medium") not in (None, "GPU"):
            raise AdapterError(
                f"SGLang published an event on medium {e.get('medium')!r}; only the device tier is driven"
            )
        if kind == "BlockStored":
            size = int(e["block_size"])
            toks = [int(t) for t in e["token_ids"]]
            pages = [toks[i : i + size] for i in range(0, len(toks), size)]
            if len(pages) != len(e["block_hashes"]):
                raise AdapterError(
                    f"SGLang Stored with {len(pages)} pages of tokens and {len(e['block_hashes'])} hashes"
                )
            parent, hashes = self.hashes.stored(e.get("parent_block_hash"), pages, list(e["block_hashes"]))
            return make_stored(self._id(), hashes, [local_block_hash(p) for p in pages], parent, token_ids=pages)
        if kind == "BlockRemoved":
            return make_removed(self._id(), [self.hashes.removed(h) for h in e["block_hashes"]])
        if kind == "AllBlocksCleared":
            return make_cleared(self._id())
        raise AdapterError(f"SGLang published an event kvspec does not know: {kind!r}")

    def unexpected_reads(self) -> list[str]:
        """Placeholder-module reads beyond import time (loader.py); must stay empty."""
        return list(self.worker.ask({"op": "reads"}, self.timeout_s, "reads")["unexpected"])

    def close(self) -> None:
        if self.worker.alive:
            reads = self.unexpected_reads()
            self.worker.ask({"op": "close"}, self.timeout_s, "close")
            if reads:
                raise AdapterError(f"SGLang used the torchvision placeholder (loader.py) while running: {reads}")


def open_sglang(
    config: RadixConfig, manifest: Manifest, adapter_dir: Path, variant: str | None = None
) -> RadixImplementation:
    """The manifest's ``start.radix`` factory."""
    del adapter_dir, variant
    require_sglang()
    return SglangRadix(config, manifest)
