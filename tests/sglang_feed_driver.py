"""Run SGLang's real RadixCache behind SGLang's own KV event publisher.

Used by tests/test_sglang_feed.py (run as a script: importing SGLang binds
the placeholder modules of ``kvspec/adapters/sglang/loader.py``, so it never
happens in the test process) and to record ``tests/data/sglang-0.5.23-radix.zmq.jsonl``.
It opens a ``RadixCache`` with KV events on (page size 4, a small pool so
that it evicts), drives requests over a prefix tree the way SGLang's
scheduler does (``kvspec.adapters.sglang.worker.Session.request``: match,
lock, evict what is missing, insert, unlock) and after each request
publishes what the cache queued as one ``KVEventBatch`` through SGLang's
``ZmqEventPublisher`` (sglang/srt/disaggregation/kv_events.py: PUB and
replay ROUTER on 127.0.0.1), as the scheduler's ``publish_kv_events`` does.

    python tests/sglang_feed_driver.py record OUT.jsonl [--requests N]
        a plain SUB socket writes every message in the capture format
    python tests/sglang_feed_driver.py watch OUT_DIR [--requests N] [--early K]
        ``kvspec watch`` subscribes after K batches were published (they come
        from the replay socket), records, and is stopped with SIGINT; one JSON
        line reports its exit status, results file and recording
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Engine:
    """A RadixCache, its publisher, and a seeded request stream."""

    def __init__(self, page: int, capacity: int, seed: int) -> None:
        from kvspec.adapters.sglang.loader import load_radix_cache

        rc, _ = load_radix_cache()
        from sglang.srt.disaggregation.kv_events import KVEventBatch, ZmqEventPublisher

        from kvspec.adapters.sglang.worker import Session

        self.batch = KVEventBatch
        self.port, self.replay = free_port(), free_port()
        self.pub = ZmqEventPublisher(
            attn_dp_rank=0,
            endpoint=f"tcp://127.0.0.1:{self.port}",
            replay_endpoint=f"tcp://127.0.0.1:{self.replay}",
            topic="kv",
            bind=True,
        )
        self.session = Session(rc, page, capacity, False)
        self.rng = random.Random(seed)
        self.page = page
        self.prefixes = [[self.rng.randrange(1, 5000) for _ in range(page * self.rng.randint(2, 5))] for _ in range(6)]
        self.published = 0

    def request(self) -> None:
        from kvspec.spec.radix_wire import RadixRequest

        rng = self.rng
        prompt = rng.choice(self.prefixes) + [rng.randrange(1, 5000) for _ in range(rng.randrange(1, 14))]
        output = [rng.randrange(1, 5000) for _ in range(rng.randint(1, 9))]
        self.session.step(RadixRequest(prompt=prompt, output=output))
        events = self.session.cache.take_events()
        if events:
            self.pub.publish(self.batch(ts=time.time(), events=events))
            self.published += 1

    def close(self) -> None:
        self.pub.shutdown()


def record(out: Path, requests: int) -> dict[str, Any]:
    import zmq

    from kvspec.streams.capture import CaptureWriter

    eng = Engine(4, 96, 3)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    mon = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sub.connect(f"tcp://127.0.0.1:{eng.port}")
    if not mon.poll(10_000):
        return {"error": "could not connect to SGLang's publisher"}
    time.sleep(0.3)  # the subscription reaches the publisher
    eng.session.take()  # the constructor's AllBlocksCleared: before the capture, as a late subscriber sees it
    got = 0
    with out.open("w") as f:
        w = CaptureWriter(f)
        for _ in range(requests):
            eng.request()
            while sub.poll(0):
                w.write(sub.recv_multipart())
                got += 1
        deadline = time.monotonic() + 10
        while got < eng.published and time.monotonic() < deadline:
            if sub.poll(100):
                w.write(sub.recv_multipart())
                got += 1
    eng.close()
    return {"published": eng.published, "received": got, "record": str(out)}


def watch(out: Path, requests: int, early: int) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    eng = Engine(4, 96, 5)
    eng.session.take()
    while eng.published < early:
        eng.request()
    time.sleep(0.5)  # the publisher thread has sent (and buffered for replay) those batches
    results, rec = out / "watch.json", out / "sglang.zmq.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvspec.cli",
            "watch",
            f"tcp://127.0.0.1:{eng.port}",
            "--replay",
            f"tcp://127.0.0.1:{eng.replay}",
            "--record",
            str(rec),
            "--json",
            str(results),
            "--status-interval",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    early_err = []
    while True:
        line = proc.stderr.readline()
        early_err.append(line)
        if not line or "subscribed" in line:
            break
    if not line:
        return {"error": f"the watcher did not start: {early_err!r}"}
    for _ in range(requests):
        eng.request()
        time.sleep(0.005)
    time.sleep(1.5)  # the last batches arrive
    proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    eng.close()
    doc = json.loads(results.read_text()) if results.exists() else None
    return {
        "exit": proc.returncode,
        "stdout": stdout[-4000:],
        "stderr": ("".join(early_err) + stderr)[-4000:],
        "results": doc,
        "record": str(rec),
        "published": eng.published,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["record", "watch"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--early", type=int, default=5)
    args = ap.parse_args()
    real_out = sys.stdout
    sys.stdout = sys.stderr  # SGLang's prints stay off the report line
    report = record(args.out, args.requests) if args.mode == "record" else watch(args.out, args.requests, args.early)
    real_out.write(json.dumps(report) + "\n")
    real_out.flush()
    os._exit(0)  # SGLang's publisher thread and atexit hooks are not waited for


if __name__ == "__main__":
    main()
