"""vLLM's real v1 KV cache manager, driven by a small scheduler loop.

Runs inside the worker process (``worker.py``): it imports vLLM. One
``VllmEngine`` is one ``vllm.v1.core.kv_cache_manager.KVCacheManager`` over
one ``BlockPool`` of ``capacity`` usable blocks (vLLM reserves block 0 as its
null block, so the pool is created with ``capacity + 1``), prefix caching
and KV events on, one full-attention KV cache group.

The loop schedules the way vLLM's v1 ``Scheduler.schedule`` does for plain
decoder-only text requests without chunked prefill: running requests first
(one decode token each, in admission order), preempting the most recently
admitted running request when ``allocate_slots`` finds no room (its blocks
are freed with ``KVCacheManager.free`` and it goes back to the front of the
waiting queue, to be recomputed from its prompt and outputs), then waiting
requests in arrival order, each with ``get_computed_blocks`` (the prefix
hit, capped by vLLM at ``num_tokens - 1``) and one ``allocate_slots`` for
the rest of its tokens. After the step every scheduled request has its
tokens computed; one that has computed all its known tokens samples the
next token (deterministic, drawn from its index and position, since no
model runs) and a request with ``max_tokens`` outputs finishes and is freed
(``KVCacheManager.free``: reverse order, vLLM's own free order).

Events are what ``KVCacheManager.take_events()`` returns after each step:
vLLM's own ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``
objects, wrapped in vLLM's ``KVEventBatch`` and encoded with the same
msgspec msgpack encoder vLLM's ``ZmqEventPublisher`` uses. With a
publisher (``publish_endpoint``), every batch also goes out through vLLM's
real ``ZmqEventPublisher``.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import xxhash

#: vLLM's hash algorithm for prefix caching (its CacheConfig default)
DEFAULT_HASH_ALGO = "sha256"


def decode_token(request: int, position: int) -> int:
    """The token a request 'samples' at ``position`` (no model runs)."""
    return 1 + xxhash.xxh3_64_intdigest(struct.pack("<QQ", request, position)) % 50_000


@dataclass(slots=True)
class Tracked:
    index: int
    request_id: str
    req: Any  # vllm.v1.request.Request
    max_tokens: int
    cached_tokens: int | None = None
    preemptions: int = 0
    finished: bool = False
    #: given up on: it could not be scheduled even with nothing else running
    stalled: bool = False


@dataclass(slots=True)
class StepOut:
    """One engine step: the encoded KVEventBatch payloads and the finished requests."""

    payloads: list[bytes] = field(default_factory=list)
    finished: list[Tracked] = field(default_factory=list)


class VllmEngine:
    def __init__(
        self,
        capacity: int,
        block_size: int,
        dp_rank: int = 0,
        hash_algo: str = DEFAULT_HASH_ALGO,
        publish_endpoint: str | None = None,
        replay_endpoint: str | None = None,
    ) -> None:
        import msgspec
        import torch
        from vllm.distributed.kv_events import KVEventBatch
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

        self.block_size = block_size
        self.dp_rank = dp_rank
        hash_fn = get_hash_fn_by_name(hash_algo)
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(block_size, hash_fn)
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float32)
        config = KVCacheConfig(
            num_blocks=capacity + 1,  # + vLLM's null block
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
        )
        max_model_len = (capacity + 1) * block_size
        self.manager = KVCacheManager(
            config,
            max_model_len=max_model_len,
            scheduler_block_size=block_size,
            hash_block_size=block_size,
            enable_caching=True,
            enable_kv_cache_events=True,
        )
        self._batch = KVEventBatch
        self._encoder = msgspec.msgpack.Encoder()
        self.publisher: Any = None
        if publish_endpoint is not None:
            from vllm.distributed.kv_events import ZmqEventPublisher

            self.publisher = ZmqEventPublisher(dp_rank, endpoint=publish_endpoint, replay_endpoint=replay_endpoint)
        self.waiting: deque[Tracked] = deque()
        self.running: list[Tracked] = []
        self.by_id: dict[str, Tracked] = {}
        self.count = 0

    # ------------------------------------------------------------ requests

    def add(self, request_id: str, prompt: list[int], max_tokens: int) -> Tracked:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        req = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt),
            sampling_params=SamplingParams(max_tokens=max_tokens),
            pooling_params=None,
            block_hasher=self.block_hasher,
        )
        t = Tracked(self.count, request_id, req, max_tokens)
        self.count += 1
        self.by_id[request_id] = t
        self.waiting.append(t)
        return t

    def _preempt(self) -> Tracked:
        from vllm.v1.request import RequestStatus

        victim = self.running.pop()
        self.manager.free(victim.req)
        victim.req.status = RequestStatus.PREEMPTED
        victim.req.num_computed_tokens = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def step(self) -> StepOut:
        """One scheduling step and its execution."""
        from vllm.v1.request import RequestStatus

        scheduled: list[tuple[Tracked, int]] = []
        preempted_now = 0
        # running requests: one token each (they have computed all but the last sampled one)
        i = 0
        while i < len(self.running):
            t = self.running[i]
            n = t.req.num_tokens - t.req.num_computed_tokens
            while True:
                if self.manager.allocate_slots(t.req, n) is not None:
                    scheduled.append((t, n))
                    i += 1
                    break
                victim = self._preempt()
                preempted_now += 1
                if victim is t:
                    break
        # waiting requests, in order, while they fit (none while one was preempted this step)
        while self.waiting and not preempted_now:
            t = self.waiting[0]
            blocks, hit, _ = self.manager.get_computed_blocks(t.req)
            n = t.req.num_tokens - hit
            if self.manager.allocate_slots(t.req, n, hit, blocks) is None:
                break
            self.waiting.popleft()
            if t.cached_tokens is None:
                t.cached_tokens = hit
            t.req.status = RequestStatus.RUNNING
            t.req.num_computed_tokens = hit
            self.running.append(t)
            scheduled.append((t, n))
        out = StepOut()
        if not scheduled and not preempted_now and self.waiting:
            # vLLM's KV cache manager refuses the slots of a request it should
            # hold (nothing else runs): reported as finishing 'stalled', which
            # the suite judges under USE-CAPACITY, instead of an error that
            # names no rule
            t = self.waiting.popleft()
            t.stalled = t.finished = True
            if t.cached_tokens is None:
                t.cached_tokens = 0
            out.finished.append(t)
        # execution: tokens computed, the next one sampled, finished requests freed
        for t, n in scheduled:
            t.req.num_computed_tokens += n
            if t.req.num_computed_tokens == t.req.num_tokens:
                t.req.append_output_token_ids(decode_token(t.index, t.req.num_tokens))
            if t.req.num_output_tokens >= t.max_tokens:
                t.finished = True
                t.req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                self.running.remove(t)
                self.manager.free(t.req)
                out.finished.append(t)
        self._flush(out)
        return out

    def reset_prefix_cache(self) -> tuple[bool, list[bytes]]:
        ok = bool(self.manager.reset_prefix_cache())
        out = StepOut()
        self._flush(out)
        return ok, out.payloads

    def _flush(self, out: StepOut) -> None:
        events = self.manager.take_events()
        if not events:
            return
        batch = self._batch(ts=time.time(), events=events, data_parallel_rank=self.dp_rank)
        out.payloads.append(self._encoder.encode(batch))
        if self.publisher is not None:
            self.publisher.publish(batch)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.shutdown()
            self.publisher = None


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "?"))
