"""The request driver (reference/requests.py): requests as the vllm model's
operations. Expected streams are written out by hand from the pool facts
(SPEC.md "vLLM-style pool") and from what the Dynamo mocker was
seen to publish (notes of the wheel probe); block hashes come from
spec/hashing.py, which is verified against the wheel's own vectors."""

from __future__ import annotations

import pytest

from kvspec.reference.requests import (
    PoolSetup,
    RequestSpec,
    SyntheticDecode,
    interleave,
    run_sequential,
)
from kvspec.reference.router_view import RouterView
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.hashing import block_hashes, local_block_hash, sequence_hash
from kvspec.spec.wire import KvEvent


def setup(capacity: int, block_size: int = 4, host: int | None = None) -> PoolSetup:
    return PoolSetup(
        manager=ManagerConfig(profile="vllm", capacity=capacity, block_size=block_size, eviction="lru"),
        host_blocks=host,
    )


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def seqs(prompt: list[int], bs: int = 4) -> list[int]:
    return [s for s, _ in block_hashes(prompt, bs)]


def brief(events: list[KvEvent]) -> list[tuple[str, str, list[int], int | None]]:
    return [
        (e.storage_tier, e.kind, e.hashes(), e.data.stored.parent_hash if e.kind == "stored" else None)  # type: ignore[union-attr]
        for e in events
    ]


def test_block_aligned_repeat_recomputes_its_last_block_as_a_second_copy() -> None:
    a = toks(1, 8)
    h = seqs(a)
    r = run_sequential(
        setup(16), [RequestSpec(prompt=a, max_tokens=1)] * 2 + [RequestSpec(prompt=[*a, 9], max_tokens=1)]
    )
    assert [x.cached_tokens for x in r] == [0, 4, 8]  # at most num_tokens - 1, whole blocks
    assert brief(r[0].events) == [("device", "stored", h, None)]
    assert brief(r[1].events) == [("device", "stored", [h[1]], h[0])]  # STORE-COPY: the recomputed copy
    assert r[2].events == []  # a full hit publishes nothing
    assert [e.event_id for x in r for e in x.events] == [0, 1]


def test_prompt_shorter_than_a_block_never_hits() -> None:
    r = run_sequential(setup(8), [RequestSpec(prompt=[5, 6, 7], max_tokens=1)] * 2)
    assert [x.cached_tokens for x in r] == [0, 0]
    assert all(x.events == [] for x in r)


@pytest.mark.parametrize(("max_tokens", "decode_blocks"), [(2, 0), (3, 1), (7, 2)])
def test_decode_stores_a_block_when_the_token_after_it_is_computed(max_tokens: int, decode_blocks: int) -> None:
    # prompt 10 tokens, B=4: the KV holds 10 + max_tokens - 1 tokens; 12 tokens fill block 2 (pool facts, SPEC.md:
    # 10 + 2 leaves no third block, 10 + 3 stores it)
    prompt = toks(100, 10)
    h = seqs(prompt)
    decode = SyntheticDecode(4)
    r = run_sequential(setup(64), [RequestSpec(prompt=prompt, max_tokens=max_tokens)], decode=decode)[0]
    assert brief(r.events[:1]) == [("device", "stored", h, None)]
    stored = r.events[1:]
    assert len(stored) == decode_blocks
    parent = h[1]
    for k, ev in enumerate(stored):
        block = 2 + k
        known = prompt[block * 4 : 10]
        tokens = known + [decode.token(0, block * 4 + i) for i in range(len(known), 4)]
        local = local_block_hash(tokens)
        assert brief([ev]) == [("device", "stored", [sequence_hash(parent, local)], parent)]
        assert ev.data.stored.blocks[0].tokens_hash == local  # type: ignore[union-attr]
        parent = sequence_hash(parent, local)


def test_decode_allocation_after_an_aligned_prompt_evicts_after_the_prefill_events() -> None:
    # 4 blocks: R0 (2 blocks) cached and freed; R1 (8 tokens, 2 blocks) takes the 2 free blocks;
    # its first decode token starts block 2, which evicts R0's leaf (R0 freed its blocks in reverse)
    r0, r1 = toks(1000, 8), toks(2000, 8)
    h0, h1 = seqs(r0), seqs(r1)
    out = run_sequential(setup(4), [RequestSpec(prompt=r0, max_tokens=1), RequestSpec(prompt=r1, max_tokens=2)])
    assert brief(out[1].events) == [("device", "stored", h1, None), ("device", "removed", [h0[1]], None)]


def test_host_tier_onboards_an_evicted_prompt() -> None:
    # the wheel probe's host_onboard run: 8 device blocks, 16 host blocks, 16-token prompts
    a, f0, f1 = toks(1000, 16), toks(5000, 16), toks(6000, 16)
    ha, hf0, hf1 = seqs(a), seqs(f0), seqs(f1)
    out = run_sequential(setup(8, host=16), [RequestSpec(prompt=p, max_tokens=1) for p in (a, f0, f1, a)])
    assert brief(out[0].events) == [("device", "stored", ha, None), ("host_pinned", "stored", ha, None)]
    assert brief(out[2].events) == [
        ("device", "removed", list(reversed(ha)), None),  # A freed leaf first
        ("device", "stored", hf1, None),
        ("host_pinned", "stored", hf1, None),
    ]
    # A again: 3 blocks come from the host (the 4th is capped: num_tokens - 1), nothing new on the host
    assert out[3].cached_tokens == 12
    assert brief(out[3].events) == [("device", "removed", list(reversed(hf0)), None), ("device", "stored", ha, None)]
    assert [e.data.stored.start_position for e in out[0].events] == [None, 0]  # type: ignore[union-attr]


def test_request_larger_than_the_pool_is_refused_clearly() -> None:
    with pytest.raises(ConfigError, match=r"prompt \(10\) \+ max_tokens \(8\) - 1 = 17 tokens exceeds the pool"):
        run_sequential(setup(4), [RequestSpec(prompt=toks(1, 10), max_tokens=8)])
    run_sequential(setup(4), [RequestSpec(prompt=toks(1, 10), max_tokens=7)])  # exactly 16 fits


def test_interleaved_requests_all_finish_with_a_router_consistent_stream() -> None:
    shared = toks(1, 6)
    reqs = [RequestSpec(prompt=shared + toks(100 * i, 5), max_tokens=6) for i in range(1, 5)]
    reqs.append(RequestSpec(prompt=shared, max_tokens=3))
    results, stream = interleave(setup(20, block_size=2), reqs)
    assert len(results) == 5
    assert [e.event_id for e in stream] == list(range(len(stream)))
    view = RouterView(mode="copies")
    for e in stream:
        view.apply(e)
    assert view.violations == []
    for r, q in zip(results, reqs, strict=True):
        assert r.cached_tokens % 2 == 0 and r.cached_tokens <= len(q.prompt) - 1
    # one engine step per request in turn: the second request's prefill comes before the first one's last step
    ids0 = [e.event_id for e in results[0].events]
    ids1 = [e.event_id for e in results[1].events]
    assert ids1 and ids0 and min(ids1) < max(ids0)


def test_a_load_from_the_host_is_its_own_allocation_before_the_computed_rest() -> None:
    # seen on the wheel: blocks loaded from the host are allocated and Stored first, then the blocks
    # computed after them (and the partial tail) take their own allocation
    a, f0, f1 = toks(1000, 16), toks(5000, 16), toks(6000, 16)
    ha, hf0, hf1 = seqs(a), seqs(f0), seqs(f1)
    base = [RequestSpec(prompt=p, max_tokens=1) for p in (a, f0, f1)]
    new_tail = [*a[:12], *toks(8000, 4)]
    h3 = seqs(new_tail)[3]
    out = run_sequential(setup(8, host=16), [*base, RequestSpec(prompt=new_tail, max_tokens=1)])[-1]
    assert out.cached_tokens == 12
    assert brief(out.events) == [
        ("device", "removed", [hf0[3], hf0[2], hf0[1]], None),
        ("device", "stored", ha[:3], None),
        ("device", "removed", [hf0[0]], None),
        ("device", "stored", [h3], ha[2]),
        ("host_pinned", "stored", [h3], ha[2]),
    ]
    out = run_sequential(setup(8, host=16), [*base, RequestSpec(prompt=[*a, 1, 2], max_tokens=1)])[-1]
    assert out.cached_tokens == 16
    assert brief(out.events) == [
        ("device", "removed", list(reversed(hf0)), None),
        ("device", "stored", ha, None),
        ("device", "removed", [hf1[3]], None),  # the partial tail, computed after the load
    ]
