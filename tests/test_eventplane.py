"""``check-log`` and ``watch`` on Dynamo's event plane (ZMQ).

``tests/data/dynamo-1.6.1-mocker-eventplane.zmq.jsonl`` was recorded from the
ai-dynamo-runtime 1.6.1 mocker's own event plane (``tests/eventplane_driver.py
record``: four frames per message, RouterEvents in a msgpack envelope); the
``-host`` one with an 8-block host tier, whose real host-tier orphaning is
the only finding it may give. Each must be detected as the event plane and
read with Dynamo's semantics; each defect put in by hand comes out under its
rule on its line; broken framing is an input error. The live test runs
``kvspec watch tcp://...`` with no format option against the real mocker."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kvspec.cli import main

DATA = Path(__file__).parent / "data"
PLANE = DATA / "dynamo-1.6.1-mocker-eventplane.zmq.jsonl"
HOST = DATA / "dynamo-1.6.1-mocker-eventplane-host.zmq.jsonl"
DRIVER = Path(__file__).parent / "eventplane_driver.py"


def decode(path: Path) -> list[tuple[list[bytes], dict[str, Any], list[dict[str, Any]]]]:
    """(frames, envelope, RouterEvents) of every message, read here from the frame layout."""
    out = []
    for line in path.read_text().splitlines():
        frames = [base64.b64decode(p) for p in json.loads(line)["parts_b64"]]
        body = frames[3]
        assert body[0] == 1 and int.from_bytes(body[1:5], "big") == len(body) - 5
        env = msgpack.unpackb(body[5:])
        out.append((frames, env, msgpack.unpackb(env["payload"])))
    return out


def encode(path: Path, msgs: list[tuple[list[bytes], dict[str, Any], list[dict[str, Any]]]]) -> Path:
    with path.open("w") as f:
        for frames, env, events in msgs:
            env = dict(env, payload=msgpack.packb(events))
            body = msgpack.packb(env)
            parts = [frames[0], frames[1], frames[2], b"\x01" + len(body).to_bytes(4, "big") + body]
            f.write(json.dumps({"n_parts": 4, "parts_b64": [base64.b64encode(p).decode() for p in parts]}) + "\n")
    return path


def check(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:
    res = tmp_path / f"{path.stem}.json"
    code = main(["check-log", str(path), "--json", str(res)])
    _, err = capsys.readouterr()
    return code, json.loads(res.read_text()), err


def test_the_real_event_plane_capture_is_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    msgs = decode(PLANE)
    events = [e for _, _, evs in msgs for e in evs]
    blocks = sum(len(e["event"]["data"]["stored"]["blocks"]) for e in events if "stored" in e["event"]["data"])
    assert {env["publisher_id"] for _, env, _ in msgs} == {int.from_bytes(msgs[0][0][1], "big")}
    code, doc, err = check(PLANE, tmp_path, capsys)
    assert code == 0, err
    assert doc["input"]["format"] == "eventplane" and doc["input"]["producer"] == "dynamo"
    assert doc["input"]["counting"] == "set" and doc["input"]["first_event_id"] == 1
    assert doc["counts"]["events"] == len(events) and doc["counts"]["messages"] == len(msgs)
    assert doc["counts"]["hash_checked_blocks"] == blocks and doc["counts"]["publishers"] == 1


def test_the_host_tier_capture_gives_only_its_real_host_orphaning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiers = {e["storage_tier"] for _, _, evs in decode(HOST) for e in evs}
    assert tiers == {"device", "host_pinned"}
    code, doc, _ = check(HOST, tmp_path, capsys)
    assert code == 1 and set(doc["findings_by_rule"]) == {"REMOVE-NO-ORPHAN"}
    assert {f["tier"] for f in doc["findings"]} == {"host_pinned"}


def _find(msgs: list, pred: Any, start: int = 20) -> tuple[int, int]:
    for i in range(start, len(msgs)):
        for j, e in enumerate(msgs[i][2]):
            if pred(e["event"]["data"]):
                return i, j
    raise AssertionError("no such event in the capture")


def _stored(d: Any) -> bool:
    return isinstance(d, dict) and "stored" in d


def defect(name: str, msgs: list) -> tuple[dict[str, int], int]:
    """Put defect ``name`` in ``msgs``; (the findings by rule, the 1-based line) it must give."""
    if name == "tokens-hash":
        i, j = _find(msgs, _stored)
        msgs[i][2][j]["event"]["data"]["stored"]["blocks"][-1]["tokens_hash"] ^= 1
        return {"HASH-SEQUENCE": 1}, i + 1
    if name == "unknown-removed":
        i, j = _find(msgs, lambda d: isinstance(d, dict) and "removed" in d)
        msgs[i][2][j]["event"]["data"]["removed"]["block_hashes"].append(12345)
        return {"REMOVE-EXACT": 1}, i + 1
    if name == "parent":
        i, j = _find(msgs, lambda d: _stored(d) and d["stored"]["parent_hash"] is not None)
        msgs[i][2][j]["event"]["data"]["stored"]["parent_hash"] = 999
        return {"PARENT-ANCHOR": 1, "HASH-SEQUENCE": 1}, i + 1  # the chain's first block, from the wrong parent
    if name == "event-id":
        i, j = _find(msgs, lambda d: True)
        msgs[i][2][j]["event"]["event_id"] += 1000  # ids jump ahead: the next event's id is then off too
        return {"EVENT-ID": 2}, i + 1
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["tokens-hash", "unknown-removed", "parent", "event-id"])
def test_one_defect_comes_out_under_its_rule(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    msgs = decode(PLANE)
    want, line = defect(name, msgs)
    code, doc, _ = check(encode(tmp_path / f"{name}.zmq.jsonl", msgs), tmp_path, capsys)
    assert code == 1
    assert doc["findings_by_rule"] == want
    assert doc["findings"][0]["at"].startswith(f"line {line} ")


def test_the_rebuilt_capture_is_still_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check(encode(tmp_path / "same.zmq.jsonl", decode(PLANE)), tmp_path, capsys)
    assert code == 0, err


def _frame_defect(kind: str, frames: list[bytes]) -> list[bytes]:
    f = list(frames)
    if kind == "length":
        f[3] = f[3][:1] + (len(f[3]) - 4).to_bytes(4, "big") + f[3][5:]
    elif kind == "version":
        f[3] = b"\x02" + f[3][1:]
    elif kind == "sequence":
        f[2] = (int.from_bytes(f[2], "big") + 1).to_bytes(8, "big")
    elif kind == "payload":
        body = msgpack.packb(dict(msgpack.unpackb(f[3][5:]), payload=b"\xc1"))
        f[3] = b"\x01" + len(body).to_bytes(4, "big") + body
    return f


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("length", "header says"),
        ("version", "version 2"),
        ("sequence", "its frames publisher"),
        ("payload", "not msgpack"),
    ],
)
def test_broken_framing_is_an_input_error(
    kind: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = PLANE.read_text().splitlines()
    rec = json.loads(lines[30])
    frames = _frame_defect(kind, [base64.b64decode(p) for p in rec["parts_b64"]])
    rec["parts_b64"] = [base64.b64encode(p).decode() for p in frames]
    lines[30] = json.dumps(rec)
    bad = tmp_path / "bad.zmq.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    code, _, err = check(bad, tmp_path, capsys)
    assert code == 2 and f"{bad}:31:" in err and message in err, err
    assert "internal error" not in err


def loopback_only() -> list[str]:
    """The command prefix that runs a child in a loopback-only network namespace, if this host allows it."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return []
    r = subprocess.run(["unshare", "-rn", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=10)
    return ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"'] if r.returncode == 0 else []


def test_watch_detects_the_live_event_plane(tmp_path: Path) -> None:
    pytest.importorskip(
        "dynamo._core", reason="the ai-dynamo-runtime wheel is not installed (pip install 'kvspec[dynamo]')"
    )
    cmd = [*loopback_only(), sys.executable, str(DRIVER), "watch", str(tmp_path), "--requests", "40"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    assert lines, f"driver printed no report (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    report = json.loads(lines[-1])
    assert "error" not in report, report
    doc = report["results"]
    assert report["exit"] == 0, report["stdout"] + report["stderr"]
    assert doc["status"] == "clean" and doc["findings_by_rule"] == {}
    assert doc["input"]["format"] == "eventplane" and doc["input"]["producer"] == "dynamo"
    assert doc["input"]["counting"] == "set"
    counts = doc["counts"]
    assert counts["events"] > 20 and counts["stored"] > 0 and counts["removed"] > 0
    assert "Dynamo's event plane" in report["stderr"]
    c = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "check-log", report["record"]], capture_output=True, text=True
    )
    assert c.returncode == 0, c.stdout + c.stderr
    assert f"checked {counts['events']} events" in c.stdout and "event plane" in c.stdout
