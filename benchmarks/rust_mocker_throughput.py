"""Requests and KV events per second through the real Dynamo mocker.

One mocker (ai-dynamo-runtime wheel, adapters/rust_mocker) with a 1024-block
pool of 16 tokens serves a realistic workload:
prompts of 40 to 300 tokens that share system prompts and conversation
prefixes, 1 to 32 generated tokens, enough distinct text to evict. Every
event is captured from the event plane and decoded into kvspec's wire
models, so the figures are end to end: request in, response and events out.

- sequential: one request at a time, each waited for until its events have
  settled (the suite's sequential mode; bounded below by the quiesce window);
- concurrent: batches of 64 requests in flight at once (the suite's
  concurrent mode), one settle per batch.

No host tier: in 1.6.1 the host tier panics under concurrent load ("host
completions must be ticked before a later mutation") and the engine stops
(see adapters/rust_mocker/findings/engine_panic/). Medians of 5 rounds. The
last line is the concurrent figure.
Run from the repository root: ``python benchmarks/rust_mocker_throughput.py``.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

from kvspec.adapters.rust_mocker import adapter as rm
from kvspec.conformance.requests.workloads import setup_of
from kvspec.conformance.run.manifest import load_manifest
from kvspec.reference.requests import RequestSpec

ROUNDS = 5
BATCH = 64
SEQUENTIAL = 40


def workload(rng: random.Random, n: int) -> list[RequestSpec]:
    systems = [[rng.randrange(1, 50_000) for _ in range(rng.randrange(32, 96))] for _ in range(4)]
    convs = [s + [rng.randrange(1, 50_000) for _ in range(rng.randrange(8, 120))] for s in systems for _ in range(6)]
    out = []
    for _ in range(n):
        base = rng.choice(convs)
        follow = [rng.randrange(1, 50_000) for _ in range(rng.randrange(0, 80))]
        out.append(RequestSpec(prompt=base + follow, max_tokens=rng.randrange(1, 33)))
    return out


def main() -> int:
    if rm.wheel_version() is None:
        print("ai-dynamo-runtime is not installed: pip install 'kvspec[dynamo]'", file=sys.stderr)
        return 2
    adapter_dir = Path(rm.__file__).parent
    manifest = load_manifest(adapter_dir)
    rng = random.Random(1234)
    seq_rps: list[float] = []
    seq_eps: list[float] = []
    conc_rps: list[float] = []
    conc_eps: list[float] = []
    with rm.open_rust_mocker(setup_of(1024, 16), manifest, adapter_dir) as impl:
        print(f"mocker {impl.version}, start-up {impl.startup_s:.3f} s, quiesce window {rm.QUIESCE_MS:g} ms")
        for _ in range(ROUNDS):
            reqs = workload(rng, SEQUENTIAL)
            t0 = time.perf_counter()
            outs = impl.run_sequential(reqs)
            dt = time.perf_counter() - t0
            events = sum(len(o.events) for o in outs)
            seq_rps.append(len(reqs) / dt)
            seq_eps.append(events / dt)
        for _ in range(ROUNDS):
            reqs = workload(rng, BATCH)
            t0 = time.perf_counter()
            run = impl.run_concurrent(reqs)
            dt = time.perf_counter() - t0
            conc_rps.append(len(reqs) / dt)
            conc_eps.append(len(run.events) / dt)
    print(
        f"sequential: {statistics.median(seq_rps):.1f} requests/s, {statistics.median(seq_eps):.1f} events/s "
        f"({SEQUENTIAL} requests per round)"
    )
    print(
        f"concurrent: {statistics.median(conc_rps):.1f} requests/s, {statistics.median(conc_eps):.1f} events/s "
        f"(batches of {BATCH})"
    )
    print(f"rust_mocker_throughput: {statistics.median(conc_rps):.1f} requests/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
