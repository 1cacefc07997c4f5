"""Steps per second through the JSON-lines subprocess transport.

A Use/Deref loop (one full block per Use, hashes cycling over twice the
capacity so hits, reactivations and evictions all happen) against
``adapters/reference_jsonl`` and, for comparison, the in-process
``adapters/reference``. Prints the median of several runs; the last line is
``jsonl_steps: VALUE steps/s``.

    python benchmarks/jsonl_steps.py [--steps N] [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from kvspec.conformance.block.opener import Implementation, open_implementation
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.spec.config import ManagerConfig
from kvspec.spec.wire import Deref, FullBlock, Plh, Use

CONFIG = ManagerConfig(capacity=64, eviction="lru")


def workload(steps: int) -> list[Any]:
    """Alternating Use and Deref of one block; 128 distinct hashes over 64 slots."""
    ops: list[Any] = []
    for i in range(steps // 2):
        h = 1 + i % (2 * CONFIG.capacity)
        ops.append(Use(blocks=[FullBlock(full=h)], local_hashes=[h], plhs=[Plh(hash=h)]))
        ops.append(Deref(blocks=[FullBlock(full=h)]))
    return ops


def run_once(impl: Implementation, ops: list[Any]) -> float:
    start = time.perf_counter()
    for op in ops:
        out = impl.step(op)
        if out.error is not None:
            raise SystemExit(f"unexpected error: {out.error}")
    return len(ops) / (time.perf_counter() - start)


def measure(adapter: str, ops: list[Any], runs: int) -> tuple[float, float]:
    """(median steps/s, median open+close seconds) over ``runs`` fresh implementations."""
    d = resolve_adapter_dir(adapter)
    manifest = load_manifest(d)
    rates, lifetimes = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        impl = open_implementation(manifest, d, CONFIG)
        t1 = time.perf_counter()
        rates.append(run_once(impl, ops))
        t2 = time.perf_counter()
        impl.close()
        lifetimes.append((t1 - t0) + (time.perf_counter() - t2))
    return statistics.median(rates), statistics.median(lifetimes)


def session_cost(adapter: str, runs: int) -> float:
    """Median seconds to open and close a session in a reused child (PROTOCOL.md 3.8)."""
    from kvspec.conformance.transport.jsonl import reuse_children

    d = resolve_adapter_dir(adapter)
    manifest = load_manifest(d)
    times = []
    with reuse_children():
        open_implementation(manifest, d, CONFIG).close()  # the one process start
        for _ in range(runs):
            t0 = time.perf_counter()
            open_implementation(manifest, d, CONFIG).close()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ops = workload(args.steps)
    ref_rate, _ = measure("adapters/reference", ops, args.runs)
    rate, lifetime = measure("adapters/reference_jsonl", ops, args.runs)
    print(f"in-process reference: {ref_rate:,.0f} steps/s (median of {args.runs})")
    print(f"reference_jsonl child start + handshake + close: {lifetime * 1000:.0f} ms (median)")
    session = session_cost("adapters/reference_jsonl", 20)
    print(f"reference_jsonl new session in a reused child: {session * 1000:.1f} ms (median)")
    print(f"jsonl_steps: {rate:.0f} steps/s")


if __name__ == "__main__":
    main()
