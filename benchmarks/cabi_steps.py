"""Steps per second through the C ABI (adapters/c_port), in-process and isolated.

A step is one operation through ``Implementation.step``: encode the request,
cross the boundary (a ctypes call, or a line to the host process and back),
and validate the reply as a ``StepOutcome``; exactly what the conformance
suite pays per operation. The in-process reference adapter is measured on
the same operations for comparison.

Two workloads, both requests over a tree of shared prefixes (real Dynamo
hashes) with reverse-order Derefs, recorded once on the reference model and
replayed on fresh implementations:

- ``small``: what the lockstep machine sends: 1 to 4 blocks per Use,
  capacity 12, 3 requests in flight;
- ``large``: engine-sized requests: 8 to 40 blocks per Use, capacity 384,
  24 requests in flight.

Prints the median of 5 runs per (workload, implementation); the last line is
the isolated rate on the small workload.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from kvspec.adapters.reference.adapter import outcome_of
from kvspec.conformance.run.manifest import load_manifest
from kvspec.conformance.transport.cabi import CAbiImplementation
from kvspec.reference import make_model
from kvspec.spec.config import ManagerConfig
from kvspec.spec.hashing import local_block_hash, sequence_hash
from kvspec.spec.wire import Deref, FullBlock, Plh, Use

PORT = Path(__file__).resolve().parent.parent / "adapters" / "c_port"
BLOCK_SIZE = 16
RUNS = 5
WORKLOADS = {
    # name: (capacity, blocks per request (min, max), in flight, requests)
    "small": (12, (1, 4), 3, 3000),
    "large": (384, (8, 40), 24, 1500),
}


def record(
    capacity: int, span: tuple[int, int], in_flight: int, requests: int, seed: int = 7
) -> tuple[ManagerConfig, list[Any]]:
    rng = random.Random(seed)
    config = ManagerConfig(capacity=capacity, block_size=BLOCK_SIZE, eviction="lru")
    paths = []
    for _ in range(24):
        trunk = [rng.randrange(50_000) for _ in range(rng.randint(0, span[1] // 2) * BLOCK_SIZE)]
        for _ in range(rng.randint(2, 5)):
            n = rng.randint(*span)
            tokens = trunk[: n * BLOCK_SIZE] + [
                rng.randrange(50_000) for _ in range(max(0, n * BLOCK_SIZE - len(trunk)))
            ]
            path, parent = [], None
            for i in range(n):
                toks = tokens[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]
                local = local_block_hash(toks)
                seq = sequence_hash(parent, local)
                path.append((seq, local, Plh(hash=seq, parent=parent, position=i), toks))
                parent = seq
            paths.append(path)
    model = make_model(config)
    ops: list[Any] = []
    running: list[list[int]] = []
    for _ in range(requests):
        path = rng.choice(paths)
        op = Use(
            blocks=[FullBlock(full=s) for s, _, _, _ in path],
            local_hashes=[loc for _, loc, _, _ in path],
            plhs=[p for _, _, p, _ in path],
            token_ids=[t for _, _, _, t in path],
        )
        placed = model.apply(op).result.value
        ops.append(op)
        running.append([s for s, _, _, _ in path[: int(placed or 0)]])
        if len(running) >= in_flight or placed == 0:
            held = running.pop(rng.randrange(len(running)))
            if held:
                d = Deref(blocks=[FullBlock(full=s) for s in reversed(held)])
                model.apply(d)
                ops.append(d)
    return config, ops


def time_reference(config: ManagerConfig, ops: list[Any]) -> float:
    model = make_model(config)
    t0 = time.perf_counter()
    for op in ops:
        outcome_of(model, op)
    return time.perf_counter() - t0


def time_cabi(config: ManagerConfig, ops: list[Any], isolation: str) -> float:
    impl = CAbiImplementation(load_manifest(PORT), PORT, config, isolation=isolation)
    ref = make_model(config)
    try:
        first = impl.step(ops[0])  # the host is up and warm before the clock starts
        assert first == outcome_of(ref, ops[0]), "the port disagrees with the reference"
        t0 = time.perf_counter()
        for op in ops[1:]:
            impl.step(op)
        return (time.perf_counter() - t0) * len(ops) / (len(ops) - 1)
    finally:
        impl.close()


def main() -> int:
    rates: dict[tuple[str, str], float] = {}
    for name, (capacity, span, in_flight, requests) in WORKLOADS.items():
        config, ops = record(capacity, span, in_flight, requests)
        blocks = sum(len(op.blocks) for op in ops)
        runners = {
            "reference (python, in-process)": lambda c=config, o=ops: time_reference(c, o),
            "c_port inprocess": lambda c=config, o=ops: time_cabi(c, o, "inprocess"),
            "c_port process": lambda c=config, o=ops: time_cabi(c, o, "process"),
        }
        for label, run in runners.items():
            times = [run() for _ in range(RUNS)]
            med = statistics.median(times)
            rates[(name, label)] = len(ops) / med
            print(
                f"{name:>5} {label:<31} {len(ops)} steps ({blocks / len(ops):.1f} blocks/step): "
                f"median {med * 1e3:7.1f} ms -> {len(ops) / med:9,.0f} steps/s"
            )
    print(f"cabi_steps: {rates[('small', 'c_port process')]:.0f} steps/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
