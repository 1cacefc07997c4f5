"""Run the real Dynamo mocker with its vLLM-style ZMQ feed and watch it.

Used by tests/test_watch_dynamo.py (run as a script, in a loopback-only
network namespace where ``unshare -rn`` works, because the mocker's ZMQ
sockets bind 0.0.0.0): starts the ai-dynamo-runtime mocker with
``zmq_kv_events_port`` and ``zmq_replay_port`` (ai-dynamo/dynamo
lib/mocker/src/services/zmq_events.rs, ``ZmqKvEventSink``), starts ``kvspec
watch`` on those ports with ``--record``, sends requests over a prefix tree,
lets the events settle, stops the watcher with SIGINT and prints one JSON
line: the watcher's exit status, its results file and the recording's path.

    python tests/dynamo_feed_driver.py OUT_DIR [--requests N] [--blocks N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=4)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # the 1.6.1 mocker binds its feed when its engine starts (at the first request), on ports of the OS's
    # choosing whatever zmq_kv_events_port says, and logs them: the log is where the endpoints are read
    os.environ["DYN_LOG"] = "error,dynamo_mocker::services::zmq_events=info"
    log_path = args.out / f"mocker-{os.getpid()}.log"
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log_fd, 2)
    kv = args.out / f"kv-{os.getpid()}"  # a fresh discovery store: a stale one names dead instances
    os.environ["DYN_FILE_KV"] = str(kv)
    for k in ("DYN_TCP_RPC_HOST", "DYN_EVENT_PLANE_HOST", "DYN_SYSTEM_HOST", "DYN_TCP_RESPONSE_STREAM_HOST"):
        os.environ[k] = "127.0.0.1"

    from dynamo._core import _normalize_mocker_config
    from dynamo.llm import EngineType, EntrypointArgs, ModelRuntimeConfig, make_engine, run_input
    from dynamo.runtime import DistributedRuntime

    port, replay = free_port(), free_port()
    rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp", event_plane="zmq")
    engine_cfg = {
        "num_gpu_blocks": args.blocks,
        "block_size": args.block_size,
        "speedup_ratio": 1000.0,
        "emit_kv_events": True,
        "emit_kv_token_ids": True,  # the vLLM-style BlockStored carries the tokens
    }
    cfg = _normalize_mocker_config(
        {
            "engine": engine_cfg,
            "dynamo": {"enable_local_indexer": True, "zmq_kv_events_port": port, "zmq_replay_port": replay},
        }
    )
    rc = ModelRuntimeConfig()
    rc.total_kv_blocks = args.blocks
    rc.kv_event_publishing_enabled = True
    rc.enable_local_indexer = True
    endpoint = "dyn://kvspecwatch.mocker.generate"
    eargs = EntrypointArgs(
        EngineType.Mocker,
        model_path=None,
        model_name="kvspec-mock",
        endpoint_id=endpoint,
        mocker_engine_args=cfg,
        kv_cache_block_size=args.block_size,
        runtime_config=rc,
    )
    engine = await make_engine(rt, eargs)
    serve = asyncio.ensure_future(run_input(rt, endpoint, engine))
    client = await rt.endpoint("kvspecwatch.mocker.generate").client()
    await asyncio.wait_for(client.wait_for_instances(), 30)

    rng = random.Random(5)
    prefixes = [[rng.randrange(1, 500) for _ in range(args.block_size * 3)] for _ in range(4)]

    async def request() -> None:
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
        if serve.done():
            serve.result()

    await request()  # starts the engine, which binds the feed
    pub = rep = None
    deadline = time.monotonic() + 20
    while (pub is None or rep is None) and time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        m = re.search(r"ZmqKvEventSink bound to tcp://[^:]+:(\d+)", text)
        r = re.search(r"replay ROUTER bound to tcp://[^:]+:(\d+)", text)
        pub, rep = (m.group(1) if m else None), (r.group(1) if r else None)
        await asyncio.sleep(0.05)
    if pub is None or rep is None:
        print(json.dumps({"error": "the mocker never logged its ZMQ feed endpoints"}), flush=True)
        os._exit(1)

    results, record = args.out / "watch.json", args.out / "feed.jsonl"
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvspec.cli",
            "watch",
            f"tcp://127.0.0.1:{pub}",
            "--replay",
            f"tcp://127.0.0.1:{rep}",
            "--record",
            str(record),
            "--json",
            str(results),
            "--status-interval",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # the watcher says when it is subscribed (it fetches what it missed from the replay socket)
    assert watch.stderr is not None
    early = []
    while True:
        line = await asyncio.get_running_loop().run_in_executor(None, watch.stderr.readline)
        early.append(line)
        if not line or "subscribed" in line:
            break
    if not line:
        print(json.dumps({"error": f"the watcher did not start: {early!r}"}), flush=True)
        os._exit(1)
    for _ in range(args.requests - 1):
        await request()
    await asyncio.sleep(1.5)  # the last events settle
    watch.send_signal(signal.SIGINT)
    try:
        out, err = watch.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        watch.kill()
        out, err = watch.communicate()
    doc = json.loads(results.read_text()) if results.exists() else None
    err = "".join(early) + err
    report = {"exit": watch.returncode, "stdout": out, "stderr": err[-4000:], "results": doc, "record": str(record)}
    print(json.dumps(report), flush=True)
    os._exit(0)  # the runtime's shutdown is slow and can hang; nothing is left to flush


if __name__ == "__main__":
    t0 = time.monotonic()
    asyncio.run(main())
