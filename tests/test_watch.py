"""``kvspec watch`` end to end on loopback, against a publisher with injected
faults: the batches of the real vLLM recording (tests/data), sent the way
vLLM's ``ZmqEventPublisher`` sends them (topic, 8-byte sequence, payload),
with a replay socket that answers as vLLM's does, and a fault plan that
drops, repeats, reorders or corrupts messages."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

DATA = Path(__file__).parent / "data"
VLLM = DATA / "vllm-0.32-cpu-engine.zmq.jsonl"
TOTAL_EVENTS = 80


def recorded() -> list[list[bytes]]:
    return [[base64.b64decode(p) for p in json.loads(line)["parts_b64"]] for line in VLLM.read_text().splitlines()]


def events_in(frames: list[bytes]) -> int:
    import msgpack

    return len(msgpack.unpackb(frames[2])[1])


class Publisher:
    """An XPUB (so it can wait for the subscription, where vLLM's PUB would
    lose the first batches; the watcher must cope with both) and a ROUTER
    replay socket on 127.0.0.1, run by a thread."""

    def __init__(self, plan: dict[int, str], *, replay: bool = True, delay: float = 0.002) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.router = None
        self.replay_endpoint = None
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            rport = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{rport}"
        self.plan = plan
        self.delay = delay
        self.messages = recorded()
        self.stop = threading.Event()
        self.replay_requests = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.pub.close(0)
        if self.router is not None:
            self.router.close(0)
        self.ctx.term()

    def _serve_replay(self) -> None:
        assert self.router is not None
        while self.router.poll(0):
            ident, _, start = self.router.recv_multipart()
            self.replay_requests += 1
            first = int.from_bytes(start, "big")
            for frames in self.messages[first : self.sent]:
                self.router.send_multipart([ident, b"", frames[1], frames[2]])
            self.router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])

    def _run(self) -> None:
        self.sent = 0
        while not self.stop.is_set() and not self.pub.poll(20):
            if self.router is not None:
                self._serve_replay()  # answers the watcher's first request: nothing yet

        if self.stop.is_set():
            return
        self.pub.recv()
        held: list[bytes] | None = None
        for i, frames in enumerate(self.messages):
            action = self.plan.get(i, "send")
            if action == "drop":
                pass
            elif action == "repeat":
                self.pub.send_multipart(frames)
                self.pub.send_multipart(frames)
            elif action == "repeat-other":  # the same sequence again, with the next batch's payload
                self.pub.send_multipart(frames)
                self.pub.send_multipart([frames[0], frames[1], self.messages[i + 1][2]])
            elif action == "hold":  # sent after the next one
                held = frames
            elif action == "corrupt":
                self.pub.send_multipart([frames[0], frames[1], b"\xc1" + frames[2][1:]])
            else:
                self.pub.send_multipart(frames)
                if held is not None:
                    self.pub.send_multipart(held)
                    held = None
            self.sent = i + 1
            time.sleep(self.delay)
            if self.router is not None:
                self._serve_replay()
        while not self.stop.is_set():
            if self.router is not None:
                self._serve_replay()
            time.sleep(0.01)


def watch(
    pub: Publisher, tmp_path: Path, *extra: str, max_events: int | None = TOTAL_EVENTS, timeout: float = 20
) -> tuple[int, str, str, dict]:
    res = tmp_path / "watch.json"
    cmd = [sys.executable, "-m", "kvspec.cli", "watch", pub.endpoint, "--json", str(res), "--timeout", str(timeout)]
    if pub.replay_endpoint is not None:
        cmd += ["--replay", pub.replay_endpoint]
    if max_events is not None:
        cmd += ["--max-events", str(max_events)]
    cmd += list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30)
    return r.returncode, r.stdout, r.stderr, json.loads(res.read_text())


@pytest.fixture
def publisher(request: pytest.FixtureRequest):
    plan, replay = request.param
    pub = Publisher(plan, replay=replay)
    pub.start()
    yield pub
    pub.close()


@pytest.mark.parametrize("publisher", [({}, True)], indirect=True)
def test_clean_feed(publisher: Publisher, tmp_path: Path) -> None:
    record = tmp_path / "feed.jsonl"
    code, out, err, doc = watch(publisher, tmp_path, "--record", str(record))
    assert code == 0, out + err
    assert doc["counts"]["events"] == TOTAL_EVENTS and doc["counts"]["lost"] == 0
    assert doc["status"] == "clean"
    # the recording is a capture check-log reads, with the same verdict
    r = subprocess.run([sys.executable, "-m", "kvspec.cli", "check-log", str(record)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"checked {TOTAL_EVENTS} events" in r.stdout


@pytest.mark.parametrize("publisher", [({5: "drop", 9: "drop"}, True)], indirect=True)
def test_dropped_batches_are_filled_from_the_replay_socket(publisher: Publisher, tmp_path: Path) -> None:
    record = tmp_path / "feed.jsonl"
    code, out, err, doc = watch(publisher, tmp_path, "--record", str(record))
    assert code == 0, out + err
    assert doc["counts"]["lost"] == 0 and doc["counts"]["events"] == TOTAL_EVENTS
    # the dropped batches came from the replay socket (asked for at the start, or when a gap showed,
    # depending on how far the publisher got before the watcher subscribed)
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    replayed = {int.from_bytes(base64.b64decode(x["parts_b64"][-2]), "big") for x in lines if x.get("replayed")}
    assert {5, 9} <= replayed
    assert publisher.replay_requests >= 1
    r = subprocess.run([sys.executable, "-m", "kvspec.cli", "check-log", str(record)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("publisher", [({5: "drop"}, False)], indirect=True)
def test_dropped_batch_without_replay_is_reported_lost(publisher: Publisher, tmp_path: Path) -> None:
    lost = events_in(recorded()[5])
    code, out, _, doc = watch(publisher, tmp_path, max_events=TOTAL_EVENTS - lost)
    assert code == 1
    assert doc["counts"]["lost"] == 1
    assert doc["findings"][0]["rule"] == "EVENT-ID"
    assert "sequence 6 where 5 was due: 1 batch(es) lost" in doc["findings"][0]["message"]
    assert "message 5 event 0" not in out  # the finding is at the message that revealed it
    assert "EVENT-ID" in out


@pytest.mark.parametrize("publisher", [({7: "repeat"}, False)], indirect=True)
def test_repeated_batch_is_a_redelivery(publisher: Publisher, tmp_path: Path) -> None:
    # at-least-once delivery: the same sequence with the same payload is counted and skipped
    code, out, _, doc = watch(publisher, tmp_path)
    assert code == 0, out
    assert doc["counts"]["redelivered"] == 1 and doc["counts"]["duplicates"] == 0
    assert doc["counts"]["events"] == TOTAL_EVENTS
    assert doc["findings_by_rule"] == {}


@pytest.mark.parametrize("publisher", [({7: "repeat-other"}, False)], indirect=True)
def test_repeated_sequence_with_another_payload_is_a_duplicate(publisher: Publisher, tmp_path: Path) -> None:
    code, _, _, doc = watch(publisher, tmp_path)
    assert code == 1
    assert doc["counts"]["duplicates"] == 1 and doc["counts"]["events"] == TOTAL_EVENTS
    assert doc["findings_by_rule"] == {"EVENT-ID": 1}
    assert "already received with a different payload" in doc["findings"][0]["message"]


@pytest.mark.parametrize("publisher", [({5: "hold"}, False)], indirect=True)
def test_reordered_batches(publisher: Publisher, tmp_path: Path) -> None:
    code, _, _, doc = watch(publisher, tmp_path)
    assert code == 1
    messages = [f["message"] for f in doc["findings"] if f["rule"] == "EVENT-ID"]
    assert any("sequence 6 where 5 was due" in m for m in messages)
    assert any("sequence 5 arrived after 6: out of order" in m for m in messages)
    assert doc["counts"]["late"] == 1


@pytest.mark.parametrize("publisher", [({3: "corrupt"}, False)], indirect=True)
def test_corrupted_batch_is_unreadable(publisher: Publisher, tmp_path: Path) -> None:
    code, out, _, doc = watch(publisher, tmp_path, max_events=TOTAL_EVENTS - events_in(recorded()[3]))
    assert code == 2
    assert "message 3: unreadable: not valid msgpack" in out
    assert doc["status"] == "unreadable" and doc["counts"]["unreadable"] == 1


@pytest.mark.parametrize("publisher", [({}, True)], indirect=True)
def test_sigint_stops_cleanly(publisher: Publisher, tmp_path: Path) -> None:
    res = tmp_path / "w.json"
    cmd = [sys.executable, "-m", "kvspec.cli", "watch", publisher.endpoint, "--json", str(res)]
    cmd += ["--replay", str(publisher.replay_endpoint), "--status-interval", "0.2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        # SIGINT only once a status line shows every event received (on a
        # loaded machine the watcher's imports alone can take seconds)
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            line = proc.stderr.readline()
            seen.append(line)
            if f"watch: {TOTAL_EVENTS} events" in line and "live blocks" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=20)
        err = "".join(seen) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    assert "Traceback" not in err
    assert "watch: " in err and "live blocks w0/dp0/device=" in err  # the status line
    doc = json.loads(res.read_text())
    assert doc["counts"]["events"] == TOTAL_EVENTS


def test_nothing_received_before_the_timeout(tmp_path: Path) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUB)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    try:
        r = subprocess.run(
            [sys.executable, "-m", "kvspec.cli", "watch", f"tcp://127.0.0.1:{port}", "--timeout", "0.5"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        s.close(0)
        ctx.term()
    assert r.returncode == 2
    assert "no message received" in r.stdout


def test_watch_help_documents_every_option() -> None:
    r = subprocess.run([sys.executable, "-m", "kvspec.cli", "watch", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for opt in [
        "--replay",
        "--topic",
        "--record",
        "--timeout",
        "--max-events",
        "--status-interval",
        "--json",
        "--metrics-port",
        "--idle-timeout",
        "--subject",
        "--queue-group",
        "--members",
        "--member",
        "--reorder-wait",
        "--findings",
        "--stats",
    ]:
        assert opt in r.stdout, opt


def test_not_an_endpoint_is_a_usage_error() -> None:
    r = subprocess.run([sys.executable, "-m", "kvspec.cli", "watch", "localhost:5557"], capture_output=True, text=True)
    assert r.returncode == 2 and "is not a ZMQ endpoint (tcp://HOST:PORT) nor NATS" in r.stderr
    assert os.environ.get("KVSPEC_NEVER_SET") is None


def scrape(url: str) -> dict[str, float]:
    """The samples of a Prometheus text page: 'name{labels}' -> value."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in samples.items() if (k == name or k.startswith(name + "{")) and all(w in k for w in want))


def test_metrics_are_served_while_the_publisher_runs(tmp_path: Path) -> None:
    """--metrics-port: scraped while batches arrive (some, not all, counted) and after the last one
    (every event by kind and tier, the lost batch as a gap and its EVENT-ID finding, live blocks)."""
    pub = Publisher({5: "drop"}, replay=False, delay=0.08)
    pub.start()
    res = tmp_path / "w.json"
    cmd = [sys.executable, "-m", "kvspec.cli", "watch", pub.endpoint, "--metrics-port", "0", "--json", str(res)]
    cmd += ["--idle-timeout", "3", "--timeout", "40", "--status-interval", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 20
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if "metrics on http://" in line:
                url = line.split("metrics on ", 1)[1].strip()
        assert url is not None, "no metrics line on standard error"
        seen: list[float] = []
        last: dict[str, float] = {}
        lost = events_in(recorded()[5])
        while time.monotonic() < deadline + 20:
            try:
                last = scrape(url)
            except OSError:
                break  # the watch stopped (idle timeout)
            seen.append(total(last, "kvspec_watch_events_total"))
            if seen[-1] == TOTAL_EVENTS - lost and total(last, "kvspec_watch_gaps_total") == 1:
                break
            time.sleep(0.05)
        assert any(0 < n < TOTAL_EVENTS - lost for n in seen), seen  # scraped while the publisher ran
        assert total(last, "kvspec_watch_events_total") == TOTAL_EVENTS - lost
        assert total(last, "kvspec_watch_events_total", tier="device", kind="stored") > 0
        assert total(last, "kvspec_watch_events_total", kind="cleared") == 1
        assert total(last, "kvspec_watch_findings_total", rule="EVENT-ID", worker="0", dp_rank="0") == 1
        assert total(last, "kvspec_watch_gaps_total", worker="0") == 1
        assert total(last, "kvspec_watch_live_blocks", tier="device") > 0
        assert total(last, "kvspec_watch_messages_total") == len(recorded()) - 1
        assert 'kvspec_watch_lag_seconds{worker="0"}' in last
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        pub.close()
    assert proc.returncode == 1
    doc = json.loads(res.read_text())
    assert doc["counts"]["gaps"] == 1 and doc["findings_by_rule"] == {"EVENT-ID": 1}


LATE = 12  # the watcher joins after the publisher's first 12 batches


@pytest.mark.parametrize("publisher", [({i: "drop" for i in range(LATE)}, False)], indirect=True)
def test_joining_late_with_mid_stream_has_no_finding(publisher: Publisher, tmp_path: Path) -> None:
    """What was stored before the first batch seen is unknown, not wrong: a Removed or a parent naming it
    is no finding (the same feed without --mid-stream: the late start is one EVENT-ID finding)."""
    seen = TOTAL_EVENTS - sum(events_in(m) for m in recorded()[:LATE])
    code, out, _, doc = watch(publisher, tmp_path, "--mid-stream", max_events=seen)
    assert code == 0, out
    assert doc["counts"]["events"] == seen and doc["counts"]["unknown_refs"] > 0


@pytest.mark.parametrize("publisher", [({i: "drop" for i in range(LATE)}, False)], indirect=True)
def test_joining_late_without_mid_stream_is_one_finding(publisher: Publisher, tmp_path: Path) -> None:
    seen = TOTAL_EVENTS - sum(events_in(m) for m in recorded()[:LATE])
    code, out, _, doc = watch(publisher, tmp_path, max_events=seen)
    assert code == 1 and doc["findings_by_rule"] == {"EVENT-ID": 1}, out
    assert f"the feed starts at sequence {LATE}, not 0" in doc["findings"][0]["message"]
