"""``kvspec watch`` on the real Dynamo mocker's vLLM-style ZMQ feed.

tests/dynamo_feed_driver.py starts the ai-dynamo-runtime 1.6.1 mocker with
its ZMQ feed and replay socket, starts the watcher after the first request
(so the first batches can only come from the replay socket), sends requests
over a prefix tree and stops the watcher with SIGINT. The driver runs in a
network namespace with only loopback up when ``unshare -rn`` works, since
the mocker's sockets bind 0.0.0.0."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "dynamo._core", reason="the ai-dynamo-runtime wheel is not installed (pip install 'kvspec[dynamo]')"
)

DRIVER = Path(__file__).parent / "dynamo_feed_driver.py"


def loopback_only() -> list[str]:
    """The command prefix that runs a child in a loopback-only network namespace, if this host allows it."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return []
    r = subprocess.run(["unshare", "-rn", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=10)
    return ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"'] if r.returncode == 0 else []


def test_watch_follows_the_real_mocker_feed(tmp_path: Path) -> None:
    cmd = [*loopback_only(), sys.executable, str(DRIVER), str(tmp_path), "--requests", "30"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    assert lines, f"driver printed no report (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    report = json.loads(lines[-1])
    assert "error" not in report, report
    doc = report["results"]
    assert report["exit"] == 0, report["stdout"] + report["stderr"]
    assert doc["status"] == "clean" and doc["findings_by_rule"] == {}
    counts = doc["counts"]
    assert counts["events"] > 20 and counts["stored"] > 0 and counts["removed"] > 0
    assert counts["lost"] == 0 and counts["replayed"] >= 1  # the first request's batches, fetched by replay
    assert "block hashes follow dynamo" in report["stderr"]  # the feed's hashes were checked against its tokens
    assert "watch: subscribed to" in report["stderr"]
    # the recording reads back with check-log, to the same verdict
    record = Path(report["record"])
    c = subprocess.run([sys.executable, "-m", "kvspec.cli", "check-log", str(record)], capture_output=True, text=True)
    assert c.returncode == 0, c.stdout + c.stderr
    assert f"checked {counts['events']} events" in c.stdout
