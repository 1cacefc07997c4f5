"""Run the real Dynamo mocker and take its KV events off Dynamo's event plane (ZMQ).

Used by tests/test_eventplane.py (run as a script, in a loopback-only network
namespace where ``unshare -rn`` works: the runtime's publishers bind 0.0.0.0)
and to record ``tests/data/dynamo-1.6.1-mocker-eventplane.zmq.jsonl``. It
starts the ai-dynamo-runtime 1.6.1 mocker with ``event_plane="zmq"`` and a
file discovery store, reads the ``kv-events`` channel's endpoint from the
store (``v1/event_channels``), subscribes, and sends requests over a prefix
tree. Every message is the runtime's own four frames (topic, publisher id,
sequence, framed envelope).

    python tests/eventplane_driver.py record OUT.jsonl [--requests N] [--host-blocks N]
        a plain SUB socket writes every message in the capture format
    python tests/eventplane_driver.py watch OUT_DIR [--requests N] [--host-blocks N]
        ``kvspec watch tcp://...`` (no options naming the format) subscribes before
        the first request, records, and is stopped with SIGINT; one JSON line
        reports its exit status, results file and recording
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


async def start(out: Path, blocks: int, bs: int, host_blocks: int) -> tuple[Any, Any, str]:
    os.environ["DYN_LOG"] = "error"
    kv = out / f"kv-{os.getpid()}"  # a fresh discovery store: a stale one names dead instances
    os.environ["DYN_FILE_KV"] = str(kv)
    for k in ("DYN_TCP_RPC_HOST", "DYN_EVENT_PLANE_HOST", "DYN_SYSTEM_HOST", "DYN_TCP_RESPONSE_STREAM_HOST"):
        os.environ[k] = "127.0.0.1"
    from dynamo._core import _normalize_mocker_config
    from dynamo.llm import EngineType, EntrypointArgs, ModelRuntimeConfig, make_engine, run_input
    from dynamo.runtime import DistributedRuntime

    rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp", event_plane="zmq")
    engine: dict[str, Any] = {"num_gpu_blocks": blocks, "block_size": bs, "speedup_ratio": 1000.0}
    if host_blocks:
        engine["kv_cache_bytes_per_token"] = 2
        engine["native_host_offload"] = {"num_host_blocks": host_blocks}
    cfg = _normalize_mocker_config({"engine": engine, "dynamo": {"enable_local_indexer": True}})
    rc = ModelRuntimeConfig()
    rc.total_kv_blocks = blocks
    rc.kv_event_publishing_enabled = True
    rc.enable_local_indexer = True
    endpoint = "dyn://kvspecep.mocker.generate"
    eargs = EntrypointArgs(
        EngineType.Mocker,
        model_path=None,
        model_name="kvspec-mock",
        endpoint_id=endpoint,
        mocker_engine_args=cfg,
        kv_cache_block_size=bs,
        runtime_config=rc,
    )
    eng = await make_engine(rt, eargs)
    serve = asyncio.ensure_future(run_input(rt, endpoint, eng))
    client = await rt.endpoint("kvspecep.mocker.generate").client()
    await asyncio.wait_for(client.wait_for_instances(), 30)
    pattern = os.path.join(str(kv), "v1", "event_channels", "*kv%2Devents*")
    deadline = time.monotonic() + 30
    while not (files := glob.glob(pattern)):
        if serve.done():
            serve.result()
        if time.monotonic() > deadline:
            raise TimeoutError("the kv-events channel was never registered")
        await asyncio.sleep(0.01)
    with open(files[0]) as f:
        addr = json.load(f)["transport"]["config"]["endpoint"]
    return client, serve, addr


async def requests(client: Any, n: int, bs: int) -> None:
    rng = random.Random(5)
    prefixes = [[rng.randrange(1, 500) for _ in range(bs * 3)] for _ in range(4)]
    for _ in range(n):
        prompt = rng.choice(prefixes) + [rng.randrange(1, 500) for _ in range(rng.randrange(0, 12))]
        body = {
            "token_ids": prompt,
            "stop_conditions": {"max_tokens": rng.randint(1, 6), "ignore_eos": True},
            "sampling_options": {},
            "output_options": {},
            "eos_token_ids": [],
        }
        async for _ in await client.generate(body):
            pass


async def record(out: Path, n: int, host_blocks: int) -> dict[str, Any]:
    import zmq

    from kvspec.streams.capture import CaptureWriter

    client, _, addr = await start(Path(tempfile.mkdtemp(prefix="kvspec-ep-")), 16, 4, host_blocks)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    mon = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sub.connect(addr)
    if not mon.poll(10_000):
        return {"error": f"could not connect to the event plane at {addr}"}
    await asyncio.sleep(0.3)
    stop = threading.Event()
    with out.open("w") as f:
        w = CaptureWriter(f)

        def pump() -> None:
            while not stop.is_set():
                if sub.poll(50):
                    w.write(sub.recv_multipart())

        th = threading.Thread(target=pump)
        th.start()
        await requests(client, n, 4)
        await asyncio.sleep(1.5)  # the last events arrive
        stop.set()
        th.join()
    return {"endpoint": addr, "messages": w.count, "record": str(out)}


async def watch(out: Path, n: int, host_blocks: int) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    client, _, addr = await start(out, 16, 4, host_blocks)
    results, rec = out / "watch.json", out / "eventplane.zmq.jsonl"
    cmd = [sys.executable, "-m", "kvspec.cli", "watch", addr, "--record", str(rec), "--json", str(results)]
    proc = subprocess.Popen([*cmd, "--status-interval", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    early = []
    while True:
        line = await asyncio.get_running_loop().run_in_executor(None, proc.stderr.readline)
        early.append(line)
        if not line or "subscribed" in line:
            break
    if not line:
        return {"error": f"the watcher did not start: {early!r}"}
    await requests(client, n, 4)
    await asyncio.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    doc = json.loads(results.read_text()) if results.exists() else None
    return {
        "exit": proc.returncode,
        "stdout": stdout[-4000:],
        "stderr": ("".join(early) + stderr)[-4000:],
        "results": doc,
        "record": str(rec),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["record", "watch"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--host-blocks", type=int, default=0)
    args = ap.parse_args()
    real_out = sys.stdout
    sys.stdout = sys.stderr
    fn = record if args.mode == "record" else watch
    report = asyncio.run(fn(args.out, args.requests, args.host_blocks))
    real_out.write(json.dumps(report) + "\n")
    real_out.flush()
    os._exit(0)  # the runtime's shutdown is slow and can hang; nothing is left to flush


if __name__ == "__main__":
    main()
