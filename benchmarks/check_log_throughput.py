"""Events per second of ``kvspec check-log``, beside what bounds it.

Three streams are generated (a seeded random prefix forest, every block's
hash chained from its parent as Dynamo does, leaves removed first so the
stream is clean, about 20k blocks live):

- Dynamo: RouterEvent JSON lines, 4 blocks per Stored (--events, default
  500k), checked with every check on (hash chain included); a random path
  loses its last blocks, so the removed blocks are mostly young;
- Dynamo, old-leaf eviction: the same lines from an LRU cache of 20k blocks
  (``lru_ops``): a request extends a cached prefix (touching it) by 4
  blocks, and when the cache is full the least recently used leaves go, one
  Removed per request naming them in eviction order, from different
  branches, so the removed blocks are the oldest the checker holds;
- vLLM: a ZMQ capture of ``KVEventBatch`` payloads (events as maps, one per
  batch, as vLLM 0.32 sends them), block hashes vLLM's sha256 chain with its
  default seed, checked with copy counting, the sequence checks and the
  hash recomputation on (--vllm-events, default 500k).

The streams are generated once and kept in a cache folder (--cache-dir,
default ``$TMPDIR/kvspec-bench-UID``), keyed by the generator's source and
the event counts, so later runs start at once.

For each, in the same run: the whole command (a fresh ``python -m kvspec.cli
check-log`` process, median of --repeat runs, peak memory), also with the C
fast paths off (``KVSPEC_FASTVIEW=0``: the pure Python path, for machines
without a C compiler) and for Dynamo with the C reader of whole lines off
(``KVSPEC_FASTVIEW_RAW=0``: msgspec decodes each line, C applies it), its
start-up alone (the same command on the stream's
first line; every command runs with its bytecode cached, as an installed
kvspec does), the decode floor
(msgspec's untyped decoder over every line, and for the capture the base64
and msgpack decoding of every payload), and for the Dynamo stream the wheel's
``RadixTree.apply_event`` over the same events (its first --radix-events,
bytes prepared beforehand: the indexer alone). Figures are given per wall
second and per CPU second (user + system of the process measured): the CPU
figure does not depend on what else the machine runs. The last line is the
command's Dynamo events per CPU second.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import heapq
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import msgspec

from kvspec.spec.hashing import chain, vllm_block_hash, vllm_external, vllm_hash_fn, vllm_none_hash

LIVE = 20_000
WORKER = 1823152252274311444


def forest_ops(n_events: int, blocks_per_stored: int, seed: int):  # type: ignore[no-untyped-def]
    """(kind, parent, n) steps of a clean stream: Stored extends a path,
    Removed takes a path's last blocks, leaf first."""
    rng = random.Random(seed)
    paths: list[list[int]] = []  # each a list of block ids (ints), root first
    live = 0
    next_id = 1
    for _ in range(n_events):
        if live > LIVE or (live > blocks_per_stored and rng.random() < 0.5 and paths):
            i = rng.randrange(len(paths))
            p = paths[i]
            k = min(len(p), blocks_per_stored)
            gone = p[-k:][::-1]
            del p[-k:]
            if not p:
                paths[i] = paths[-1]
                paths.pop()
            live -= k
            yield "removed", gone
        else:
            if paths and rng.random() < 0.7:
                p = paths[rng.randrange(len(paths))]
                parent = p[-1]
            else:
                p = []
                paths.append(p)
                parent = None
            new = list(range(next_id, next_id + blocks_per_stored))
            next_id += blocks_per_stored
            p.extend(new)
            live += blocks_per_stored
            yield "stored", (parent, new)


def lru_ops(n_events: int, blocks_per_stored: int, seed: int, max_depth: int = 32):  # type: ignore[no-untyped-def]
    """(kind, ...) steps of a clean stream from an LRU cache of LIVE blocks:
    each request touches a cached prefix (or none) and stores
    ``blocks_per_stored`` new blocks below it; before that, the least
    recently used leaves are evicted (one Removed), a parent becoming a leaf
    when its last child goes."""
    rng = random.Random(seed)
    parent: dict[int, int | None] = {}
    kids: dict[int, int] = {}
    last: dict[int, int] = {}
    depth: dict[int, int] = {}
    ids: list[int] = []  # live blocks, for drawing a prefix
    pos: dict[int, int] = {}
    heap: list[tuple[int, int]] = []  # (last use, block) of leaves, stale entries skipped
    clock = 0
    next_id = 1
    n = 0
    while n < n_events:
        p = ids[rng.randrange(len(ids))] if ids and rng.random() < 0.8 else None
        if p is not None and depth[p] + blocks_per_stored > max_depth:
            p = None
        x = p
        while x is not None:  # the prefix is used: newest
            clock += 1
            last[x] = clock
            if kids[x] == 0:
                heapq.heappush(heap, (clock, x))
            x = parent[x]
        need = len(ids) + blocks_per_stored - LIVE
        gone = []
        while need > 0:
            t, x = heapq.heappop(heap)
            if last.get(x) != t or kids[x] != 0 or x == p:
                continue
            gone.append(x)
            need -= 1
            q = parent.pop(x)
            del kids[x], last[x], depth[x]
            i = pos.pop(x)
            y = ids.pop()
            if y != x:
                ids[i] = y
                pos[y] = i
            if q is not None:
                kids[q] -= 1
                if kids[q] == 0:
                    heapq.heappush(heap, (last[q], q))
        if gone:
            yield "removed", gone
            n += 1
        new = list(range(next_id, next_id + blocks_per_stored))
        next_id += blocks_per_stored
        prev = p
        for x in new:
            parent[x] = prev
            kids[x] = 0
            depth[x] = depth[prev] + 1 if prev is not None else 1
            if prev is not None:
                kids[prev] += 1
            clock += 1
            last[x] = clock
            pos[x] = len(ids)
            ids.append(x)
            prev = x
        heapq.heappush(heap, (last[new[-1]], new[-1]))
        yield "stored", (p, new)
        n += 1


def write_dynamo(path: Path, n: int, ops=forest_ops) -> None:  # type: ignore[no-untyped-def]
    enc = msgspec.json.Encoder()
    rng = random.Random(7)
    seq: dict[int, int] = {}  # block id -> sequence hash
    with path.open("wb") as f:
        for eid, (kind, arg) in enumerate(ops(n, 4, 1), 1):
            if kind == "stored":
                parent, new = arg
                prev = None if parent is None else seq[parent]
                p0 = prev
                blocks = []
                for b in new:
                    th = rng.getrandbits(64)
                    prev = chain(prev, th)
                    seq[b] = prev
                    blocks.append({"block_hash": prev, "tokens_hash": th, "mm_extra_info": None})
                data: object = {"stored": {"parent_hash": p0, "start_position": None, "blocks": blocks}}
            else:
                data = {"removed": {"block_hashes": [seq.pop(b) for b in arg]}}
            ev = {"event_id": eid, "data": data, "dp_rank": 0}
            f.write(
                enc.encode({"worker_id": WORKER, "storage_tier": "device", "residency_domain": "worker", "event": ev})
            )
            f.write(b"\n")


def write_vllm(path: Path, n: int) -> None:
    fn = vllm_hash_fn("sha256")
    none = vllm_none_hash("sha256")
    rng = random.Random(11)
    full: dict[int, bytes] = {}
    ext: dict[int, int] = {}
    with path.open("w") as f:
        for seq, (kind, arg) in enumerate(forest_ops(n, 2, 2)):
            if kind == "stored":
                parent, new = arg
                pfull = none if parent is None else full[parent]
                hashes, tokens = [], []
                for b in new:
                    toks = [rng.randrange(32000) for _ in range(16)]
                    pfull = vllm_block_hash("sha256", pfull, toks, None, fn=fn)
                    full[b] = pfull
                    ext[b] = vllm_external(pfull)
                    hashes.append(ext[b])
                    tokens += toks
                ev: dict[str, object] = {
                    "type": "BlockStored",
                    "block_hashes": hashes,
                    "parent_block_hash": None if parent is None else ext[parent],
                    "token_ids": tokens,
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [None] * len(new),
                    "group_idx": 0,
                    "kv_cache_spec_kind": "full_attention",
                }
            else:
                ev = {
                    "type": "BlockRemoved",
                    "block_hashes": [ext.pop(b) for b in arg],
                    "medium": "GPU",
                    "group_idx": 0,
                }
                for b in arg:
                    full.pop(b)
            payload = msgpack.packb([time.time(), [ev], 0])
            parts = [b"kv", seq.to_bytes(8, "big"), payload]
            rec = {
                "msg_idx": seq,
                "recv_time_s": 0.0,
                "n_parts": 3,
                "parts_b64": [base64.b64encode(p).decode() for p in parts],
            }
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def write_dynamo_lru(path: Path, n: int) -> None:
    write_dynamo(path, n, lru_ops)


def cached(cache: Path, name: str, n: int, write) -> Path:  # type: ignore[no-untyped-def]
    """The stream ``name`` of ``n`` events, generated by ``write`` once per
    generator source (written to a temporary name, then renamed)."""
    src = "".join(inspect.getsource(f) for f in (forest_ops, lru_ops, write_dynamo, write, cached))
    key = hashlib.sha256(f"{src}{n}{LIVE}{WORKER}".encode()).hexdigest()[:12]
    path = cache / f"{name}-{n}-{key}.jsonl"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            write(tmp, n)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


_CHILD = """
import json, resource, sys
from kvspec.cli import main
code = main(sys.argv[1:])
ru = resource.getrusage(resource.RUSAGE_SELF)
hwm = next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM'))
print('BENCH ' + json.dumps({'code': code, 'cpu': ru.ru_utime + ru.ru_stime, 'hwm_kb': hwm}), file=sys.stderr)
"""


#: the children run as an installed kvspec does, with compiled bytecode
#: cached (in the cache folder: ``PYTHONDONTWRITEBYTECODE``, set on some
#: development machines, would otherwise make every run compile kvspec anew)
PYCACHE: Path | None = None


def run_command(path: Path, repeat: int, env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """Median wall seconds and CPU seconds of the whole command (a fresh
    process each run), and its peak resident memory in MB (VmHWM)."""
    walls, cpus, peak = [], [], 0.0
    child_env = {**os.environ, **(env or {})}
    if PYCACHE is not None:
        child_env.pop("PYTHONDONTWRITEBYTECODE", None)
        child_env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    for _ in range(repeat):
        t = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-c", _CHILD, "check-log", str(path), "--quiet"],
            capture_output=True,
            text=True,
            env=child_env,
        )
        walls.append(time.perf_counter() - t)
        line = next((x for x in r.stderr.splitlines() if x.startswith("BENCH ")), None)
        if r.returncode != 0 or line is None:
            raise SystemExit(f"check-log failed on a clean stream (exit {r.returncode}):\n{r.stdout}\n{r.stderr}")
        info = json.loads(line[6:])
        if info["code"] != 0:
            raise SystemExit(f"check-log found problems in a clean stream:\n{r.stdout}")
        cpus.append(info["cpu"])
        peak = max(peak, info["hwm_kb"] / 1024)
    return statistics.median(walls), statistics.median(cpus), peak


def decode_floor(path: Path, capture: bool, repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds of decoding every record untyped (lines in memory)."""
    dec = msgspec.json.Decoder()
    mp = msgspec.msgpack.Decoder()
    data = path.read_bytes().splitlines()
    times, cpus = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        c = time.process_time()
        if capture:
            for line in data:
                rec = dec.decode(line)
                for p in rec["parts_b64"]:
                    raw = base64.b64decode(p)
                mp.decode(raw)
        else:
            for line in data:
                dec.decode(line)
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    del data
    return statistics.median(times), statistics.median(cpus)


def radix(path: Path, limit: int) -> tuple[float, float, int] | None:
    try:
        from dynamo._core import RadixTree
    except ImportError:
        return None
    events = []
    with path.open("rb") as f:
        for i, line in enumerate(f):
            if i >= limit:
                break
            obj = json.loads(line)
            events.append(json.dumps(obj["event"]).encode())
    tree = RadixTree()
    t = time.perf_counter()
    c = time.process_time()
    for ev in events:
        tree.apply_event(WORKER, ev)
    return time.perf_counter() - t, time.process_time() - c, len(events)


def first_line(path: Path, out: Path) -> Path:
    with path.open("rb") as f:
        out.write_bytes(f.readline())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=500_000)
    ap.add_argument("--vllm-events", type=int, default=500_000)
    ap.add_argument("--radix-events", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / f"kvspec-bench-{os.getuid()}")
    args = ap.parse_args()
    t = time.perf_counter()
    dyn = cached(args.cache_dir, "dynamo", args.events, write_dynamo)
    old = cached(args.cache_dir, "dynamo-lru", args.events, write_dynamo_lru)
    vll = cached(args.cache_dir, "vllm.zmq", args.vllm_events, write_vllm)
    print(f"streams ready in {time.perf_counter() - t:.1f} s (cache {args.cache_dir})")
    print(
        f"  Dynamo stream {dyn.stat().st_size / 1e6:.0f} MB, old-leaf eviction {old.stat().st_size / 1e6:.0f} MB, "
        f"vLLM capture {vll.stat().st_size / 1e6:.0f} MB"
    )
    # the C part of the fused reader is built once, before any timing
    from kvspec.streams import fastview

    fastview.module()
    print(f"C fast paths: {fastview.status()}")
    off = {"KVSPEC_FASTVIEW": "0"}
    n, vn = args.events, args.vllm_events
    global PYCACHE
    PYCACHE = args.cache_dir / "pycache"
    with tempfile.TemporaryDirectory() as tmp:
        # the commands first, while this process is small; one run first to
        # fill the bytecode cache
        run_command(first_line(dyn, Path(tmp, "warm.jsonl")), 1)
        _, start_cpu, _ = run_command(first_line(dyn, Path(tmp, "one.jsonl")), args.repeat)
        _, vstart_cpu, _ = run_command(first_line(vll, Path(tmp, "one.zmq.jsonl")), args.repeat)
    # the two Dynamo patterns side by side: command and floor interleaved, so that both see the same load
    cmd_s, cmd_cpu, peak = run_command(dyn, args.repeat)
    old_s, old_cpu, old_peak = run_command(old, args.repeat)
    floor_s, floor_cpu = decode_floor(dyn, False, args.repeat)
    ofloor_s, ofloor_cpu = decode_floor(old, False, args.repeat)
    py_s, py_cpu, _ = run_command(dyn, args.repeat, off)
    dl_s, dl_cpu, _ = run_command(dyn, args.repeat, {"KVSPEC_FASTVIEW_RAW": "0"})
    vcmd_s, vcmd_cpu, vpeak = run_command(vll, args.repeat)
    vpy_s, vpy_cpu, _ = run_command(vll, args.repeat, off)
    vfloor_s, vfloor_cpu = decode_floor(vll, True, args.repeat)
    rt = radix(dyn, args.radix_events)
    rows = [
        ("dynamo", "check-log, whole command (every check on)", n / cmd_s, n / cmd_cpu),
        ("dynamo", "check-log, C per decoded line (..._RAW=0)", n / dl_s, n / dl_cpu),
        ("dynamo", "check-log, pure Python path (KVSPEC_FASTVIEW=0)", n / py_s, n / py_cpu),
        ("dynamo", "decode floor: msgspec untyped, every line", n / floor_s, n / floor_cpu),
        ("old-leaf", "check-log, whole command (every check on)", n / old_s, n / old_cpu),
        ("old-leaf", "decode floor: msgspec untyped, every line", n / ofloor_s, n / ofloor_cpu),
    ]
    if rt is not None:
        rs, rc, rn = rt
        rows.append(("dynamo", f"RadixTree.apply_event (wheel, first {rn})", rn / rs, rn / rc))
    rows += [
        ("vllm", "check-log, whole command (every check on)", vn / vcmd_s, vn / vcmd_cpu),
        ("vllm", "check-log, pure Python path (KVSPEC_FASTVIEW=0)", vn / vpy_s, vn / vpy_cpu),
        ("vllm", "decode floor: JSON + base64 + msgpack", vn / vfloor_s, vn / vfloor_cpu),
    ]
    print(f"{'stream':<8} {'measure':<48} {'events/s wall':>14} {'events/s CPU':>14}")
    for stream, what, wall, cpu in rows:
        print(f"{stream:<8} {what:<48} {wall:>14,.0f} {cpu:>14,.0f}")
    print(f"start-up (the command on one line): dynamo {start_cpu:.2f} CPU s, vllm {vstart_cpu:.2f} CPU s")
    print(
        f"both Dynamo patterns, check-log / decode floor, CPU: benchmark stream {cmd_cpu / floor_cpu:.2f}x, "
        f"old-leaf eviction {old_cpu / ofloor_cpu:.2f}x (without start-up {(cmd_cpu - start_cpu) / floor_cpu:.2f}x, "
        f"{(old_cpu - start_cpu) / ofloor_cpu:.2f}x)"
    )
    for name, c, p, fl, s0 in (
        ("dynamo", cmd_cpu, py_cpu, floor_cpu, start_cpu),
        ("vllm", vcmd_cpu, vpy_cpu, vfloor_cpu, vstart_cpu),
    ):
        print(
            f"{name:<8} check-log / decode floor, CPU: {c / fl:.2f}x ({(c - s0) / fl:.2f}x without start-up); "
            f"pure Python path {p / fl:.2f}x"
        )
    print(f"dynamo   check-log / decode floor, wall: {cmd_s / floor_s:.2f}x; vllm {vcmd_s / vfloor_s:.2f}x")
    if rt is None:
        print("dynamo   RadixTree.apply_event: the ai-dynamo-runtime wheel is not installed")
    print(f"peak memory of check-log: dynamo {peak:.0f} MB, old-leaf {old_peak:.0f} MB, vllm {vpeak:.0f} MB")
    print(f"host: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"vllm: {vn / vcmd_cpu:.0f} events/s (CPU time)")
    print(f"check_log_throughput: {n / cmd_cpu:.0f} events/s (CPU time)")


if __name__ == "__main__":
    main()
