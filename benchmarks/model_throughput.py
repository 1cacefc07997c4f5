"""Reference-model throughput on a realistic workload, in block operations/s.

Workload: requests drawn from a tree of shared prefixes (48 system prompts,
each with branching conversations, 8..40 blocks per request, real Dynamo
hashes), 24 requests in flight, each finishing with a reverse-order Deref;
capacity (384 blocks) well below the working set, so eviction runs all the
time. The operation list is recorded once (the model decides how many blocks
each Use places) and then replayed on fresh models; a block operation is one
block named in a Use or a Deref. Prints the median of 7 runs per policy.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from typing import Any

from kvspec.reference import make_model
from kvspec.spec.config import ManagerConfig
from kvspec.spec.hashing import local_block_hash, sequence_hash
from kvspec.spec.wire import Deref, FullBlock, Plh, Use

BLOCK_SIZE = 16
CAPACITY = 384
IN_FLIGHT = 24
REQUESTS = 3000
RUNS = 7


def build_tree(rng: random.Random) -> list[list[tuple[int, int, Plh]]]:
    """Request paths: lists of (seq hash, local hash, plh)."""
    paths: list[list[tuple[int, int, Plh]]] = []
    for prompt in range(48):
        trunk_len = rng.randint(4, 16)
        base = [rng.randrange(50_000) for _ in range(trunk_len * BLOCK_SIZE)]
        for _branch in range(rng.randint(2, 6)):
            extra = rng.randint(4, 24)
            tokens = base + [rng.randrange(50_000) for _ in range(extra * BLOCK_SIZE)]
            path, parent = [], None
            for i in range(len(tokens) // BLOCK_SIZE):
                local = local_block_hash(tokens[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
                seq = sequence_hash(parent, local)
                path.append((seq, local, Plh(hash=seq, parent=parent, position=i)))
                parent = seq
            paths.append(path)
        del prompt
    return paths


def record(policy: str, seed: int = 7) -> tuple[list[Any], int]:
    rng = random.Random(seed)
    paths = build_tree(rng)
    model = make_model(ManagerConfig(capacity=CAPACITY, block_size=BLOCK_SIZE, eviction=policy))  # type: ignore[arg-type]
    ops: list[Any] = []
    block_ops = 0
    running: list[list[int]] = []
    for _ in range(REQUESTS):
        path = rng.choice(paths)
        op = Use(
            blocks=[FullBlock(full=s) for s, _, _ in path],
            local_hashes=[loc for _, loc, _ in path],
            plhs=[p for _, _, p in path],
        )
        placed = model.apply(op).result.value
        ops.append(op)
        block_ops += len(path)
        running.append([s for s, _, _ in path[: int(placed or 0)]])
        if len(running) >= IN_FLIGHT or placed == 0:
            held = running.pop(rng.randrange(len(running)))
            if held:
                d = Deref(blocks=[FullBlock(full=s) for s in reversed(held)])
                model.apply(d)
                ops.append(d)
                block_ops += len(held)
    return ops, block_ops


def replay(policy: str, ops: list[Any]) -> float:
    model = make_model(ManagerConfig(capacity=CAPACITY, block_size=BLOCK_SIZE, eviction=policy))  # type: ignore[arg-type]
    apply = model.apply
    # CPU time of this single-threaded loop: the figure does not depend on
    # what else the machine runs (wall time is within a few % when it is idle)
    t0 = time.process_time()
    for op in ops:
        apply(op)
    return time.process_time() - t0


def main() -> int:
    results = {}
    for policy in ("lineage", "lru", "multi_lru"):
        ops, block_ops = record(policy)
        times = [replay(policy, ops) for _ in range(RUNS)]
        rate = block_ops / statistics.median(times)
        results[policy] = rate
        evicting = make_model(ManagerConfig(capacity=CAPACITY, block_size=BLOCK_SIZE, eviction=policy))  # type: ignore[arg-type]
        removed = sum(len(e.hashes()) for op in ops for e in evicting.apply(op).events if e.kind == "removed")
        print(
            f"{policy:>10}: {len(ops)} ops, {block_ops} block ops, {removed} evictions, "
            f"median {statistics.median(times) * 1e3:.1f} ms -> {rate:,.0f} block-ops/s"
        )
    print(f"model_throughput: {results['lineage']:.0f} block-ops/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
