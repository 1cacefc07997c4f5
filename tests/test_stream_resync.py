"""Streams as a live fleet delivers them: captures that start mid-stream,
lost events, publisher restarts, events delivered twice (spec/SPEC.md,
EVENT-ID, "Resynchronising"), on the real recordings of tests/data.

- cut anywhere: every clean recording, cut before each of its lines and
  checked with ``--mid-stream``, gives no finding; a defect put in after the
  cut is still found under its rule;
- a gap is one finding, whatever the lost events did;
- a restart (event ids back at the first) is a notice and every event after
  it is checked;
- an exact redelivery is counted and skipped, another payload under a
  passed id is a finding.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kvspec.cli import main

DATA = Path(__file__).parent / "data"
DYNAMO = DATA / "dynamo-1.6.1-mocker-device.router.jsonl"
HOST = DATA / "dynamo-1.6.1-mocker-host.router.jsonl"
VLLM = DATA / "vllm-0.32-cpu-engine.zmq.jsonl"


def check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, objs: list[dict[str, Any]], *opts: str
) -> tuple[int, str, dict[str, Any]]:
    log, res = tmp_path / "s.jsonl", tmp_path / "r.json"
    log.write_text("".join(json.dumps(o) + "\n" for o in objs))
    code = main(["check-log", str(log), "--json", str(res), "--max-report", "1000", *opts])
    out, _ = capsys.readouterr()
    return code, out, json.loads(res.read_text())


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def kind(o: dict[str, Any]) -> str:
    data = o["event"]["data"]
    return data if isinstance(data, str) else next(iter(data))


# ------------------------------------------------------------ cut anywhere


@pytest.mark.parametrize("path", [DYNAMO, VLLM], ids=["dynamo", "vllm"])
def test_a_clean_recording_cut_before_any_line_has_no_finding(
    path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = lines_of(path)
    unknown = 0
    for cut in range(len(lines)):
        code, out, doc = check(capsys, tmp_path, lines[cut:], "--mid-stream")
        assert code == 0, (cut, out)
        unknown += doc["counts"]["unknown_refs"]
    assert unknown > 0  # the cuts did leave references to blocks stored before them


def test_a_cut_without_mid_stream_is_one_finding(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = lines_of(DYNAMO)
    for cut in range(1, len(lines), 5):
        code, out, doc = check(capsys, tmp_path, lines[cut:])
        assert code == 1 and doc["findings_by_rule"] == {"EVENT-ID": 1}, (cut, out)
        assert f"event id {cut + 1} is a gap" in doc["findings"][0]["message"]


def test_the_host_recording_cut_anywhere_keeps_only_its_own_finding(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = lines_of(HOST)
    code, _, whole = check(capsys, tmp_path, lines)
    assert code == 1
    for cut in range(len(lines)):
        _, out, doc = check(capsys, tmp_path, lines[cut:], "--mid-stream")
        for rule, n in doc["findings_by_rule"].items():
            assert n <= whole["findings_by_rule"].get(rule, 0), (cut, out)


def later_removed_with_a_known_absent_hash(lines: list[dict[str, Any]]) -> tuple[int, int] | None:
    """(line of a Removed, a hash) where the hash was removed earlier in
    ``lines`` and not stored again before that line."""
    absent: dict[int, int] = {}
    for i, o in enumerate(lines):
        k = kind(o)
        if k == "stored":
            for b in o["event"]["data"]["stored"]["blocks"]:
                absent.pop(b["block_hash"], None)
        elif k == "removed":
            if absent:
                return i, next(iter(absent))
            for h in o["event"]["data"]["removed"]["block_hashes"]:
                absent[h] = i
    return None


def test_a_defect_after_the_cut_is_found(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = lines_of(DYNAMO)
    tried = 0
    for cut in range(0, len(lines) - 10, 3):
        part = json.loads(json.dumps(lines[cut:]))
        found = later_removed_with_a_known_absent_hash(part)
        if found is None:
            continue
        i, h = found
        part[i]["event"]["data"]["removed"]["block_hashes"].append(h)  # removed twice: REMOVE-EXACT
        code, out, doc = check(capsys, tmp_path, part, "--mid-stream")
        assert code == 1 and doc["findings_by_rule"] == {"REMOVE-EXACT": 1}, (cut, out)
        assert "already removed by event" in out
        tried += 1
    assert tried > 100


def test_a_parent_removed_after_the_cut_is_found(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = lines_of(DYNAMO)
    tried = 0
    for cut in range(0, len(lines) - 10, 7):
        part = json.loads(json.dumps(lines[cut:]))
        gone = next((o for o in part if kind(o) == "removed"), None)
        if gone is None:
            continue
        h = gone["event"]["data"]["removed"]["block_hashes"][0]
        later = [o for o in part[part.index(gone) + 1 :] if kind(o) == "stored"]
        restored = {b["block_hash"] for o in later for b in o["event"]["data"]["stored"]["blocks"]}
        if not later or h in restored:
            continue
        later[-1]["event"]["data"]["stored"]["parent_hash"] = h
        code, out, doc = check(capsys, tmp_path, part, "--mid-stream")
        assert code == 1 and "PARENT-ANCHOR" in doc["findings_by_rule"], (cut, out)
        assert f"parent {h} is not stored" in out
        tried += 1
    assert tried > 30


def vllm_batch(o: dict[str, Any]) -> list[Any]:
    return msgpack.unpackb(base64.b64decode(o["parts_b64"][2]))


def test_a_corrupted_root_block_after_any_vllm_cut_is_found(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = lines_of(VLLM)
    tried = 0
    for cut in range(len(lines)):
        part = json.loads(json.dumps(lines[cut:]))
        roots = [
            (o, batch, ev)
            for o in part
            for batch in [vllm_batch(o)]
            for ev in batch[1]
            if ev["type"] == "BlockStored" and ev["parent_block_hash"] is None
        ]
        if not roots:
            continue
        o, batch, ev = roots[-1]
        ev["token_ids"][0] += 1
        o["parts_b64"][2] = base64.b64encode(msgpack.packb(batch)).decode()
        # the scheme given: a stream this short may hold too few blocks to learn it from
        code, out, doc = check(capsys, tmp_path, part, "--mid-stream", "--hash-scheme", "vllm-sha256")
        assert code == 1 and "HASH-SEQUENCE" in doc["findings_by_rule"], (cut, out)
        tried += 1
    assert tried > 20


# ------------------------------------------------------------------ gaps


def test_lost_events_are_one_finding_whatever_they_did(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = lines_of(DYNAMO)
    for start in range(5, len(lines) - 20, 11):
        for lost in (1, 3, 10):
            part = lines[:start] + lines[start + lost :]
            code, out, doc = check(capsys, tmp_path, part)
            assert code == 1 and doc["findings_by_rule"] == {"EVENT-ID": 1}, (start, lost, out)
            assert doc["statistics"]["workers"][0]["gaps"] == 1


def test_after_a_gap_a_known_defect_is_still_found(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = lines_of(DYNAMO)
    part = json.loads(json.dumps(lines[:50] + lines[53:]))
    found = later_removed_with_a_known_absent_hash(part[50:])
    assert found is not None
    i, h = found
    part[50 + i]["event"]["data"]["removed"]["block_hashes"].append(h)
    code, out, doc = check(capsys, tmp_path, part)
    assert code == 1 and doc["findings_by_rule"] == {"EVENT-ID": 1, "REMOVE-EXACT": 1}, out


# -------------------------------------------------------------- restarts


def restarted(lines: list[dict[str, Any]], at: int) -> list[dict[str, Any]]:
    """The recording, then the publisher restarted after event ``at``: the
    whole recording again from event id 1 (a fresh cache)."""
    again = json.loads(json.dumps(lines))
    return lines[:at] + again


def test_a_restart_is_a_notice_and_every_event_after_it_is_checked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = lines_of(DYNAMO)
    at = 120
    code, out, doc = check(capsys, tmp_path, restarted(lines, at))
    assert code == 0, out
    assert doc["counts"]["restarts"] == 1 and doc["counts"]["events"] == at + len(lines)
    assert "note: restart worker" in out and "event id 1 after 120: the publisher restarted" in out
    assert doc["statistics"]["workers"][0]["events"] == at + len(lines)
    # every event after the restart is checked: a defect in any one of them is found
    n = len(lines)
    for i in range(n):
        part = restarted(lines, at)
        ev = part[at + i]
        if kind(ev) == "stored":
            ev["event"]["data"]["stored"]["blocks"][0]["tokens_hash"] ^= 1
            want = "HASH-SEQUENCE"
        elif kind(ev) == "removed":
            ev["event"]["data"]["removed"]["block_hashes"].append(12345)
            want = "REMOVE-EXACT"
        else:
            continue
        code, out, doc = check(capsys, tmp_path, part)
        assert code == 1 and want in doc["findings_by_rule"], (i, out)
        assert doc["counts"]["restarts"] == 1


# ------------------------------------------------------------ redelivery


def test_an_event_delivered_again_is_skipped(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = lines_of(DYNAMO)
    for i in range(3, len(lines), 13):
        for delay in (0, 1, 4):
            part = [*lines[: i + delay], lines[i - 1], *lines[i + delay :]]
            code, out, doc = check(capsys, tmp_path, part)
            if code == 0:
                # read, counted as redelivered, not applied: the worker's events (from its ids) are the recording's
                assert doc["counts"]["redelivered"] == 1 and doc["counts"]["events"] == len(part), out
                assert doc["statistics"]["workers"][0]["events"] == len(lines)
            else:  # the state no longer shows what the event did: only then a finding
                assert doc["findings_by_rule"] == {"EVENT-ID": 1} and delay > 0, (i, delay, out)
    part = [*lines[:10], lines[9], *lines[10:]]
    code, out, doc = check(capsys, tmp_path, part)
    assert code == 0 and doc["counts"]["redelivered"] == 1, out


def test_another_payload_under_a_passed_id_is_a_finding(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = lines_of(DYNAMO)
    i = next(k for k in range(10, len(lines)) if kind(lines[k]) == "removed")
    other = json.loads(json.dumps(lines[i]))
    other["event"]["data"]["removed"]["block_hashes"] = [99]
    code, out, doc = check(capsys, tmp_path, [*lines[: i + 1], other, *lines[i + 1 :]])
    assert code == 1 and doc["findings_by_rule"]["EVENT-ID"] == 1, out
    assert f"event id {i + 1} is a repeat or step back" in out


# -------------------------------------------------------- operator outputs


def test_sequential_orphans_flag_a_parent_listed_before_its_child(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = lines_of(DYNAMO)
    code, _, _ = check(capsys, tmp_path, lines)
    assert code == 0
    code, out, doc = check(capsys, tmp_path, lines, "--sequential-orphans")
    # Dynamo's mocker lists a Removed's blocks in eviction order, leaves first: none before its child
    assert code == 0, out
    # the same Removed with its blocks reversed: parents before children, fine at once, not one by one
    flipped = json.loads(json.dumps(lines))
    multi = [o for o in flipped if kind(o) == "removed" and len(o["event"]["data"]["removed"]["block_hashes"]) > 1]
    for o in multi:
        o["event"]["data"]["removed"]["block_hashes"].reverse()
    assert check(capsys, tmp_path, flipped)[0] == 0
    code, out, doc = check(capsys, tmp_path, flipped, "--sequential-orphans")
    assert code == 1 and set(doc["findings_by_rule"]) == {"REMOVE-NO-ORPHAN"}, out


def test_findings_stream_and_json_hold_every_finding(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = lines_of(DYNAMO)
    bad = json.loads(json.dumps(lines))
    for o in bad:  # each Stored's first block off its chain: more than 200 findings
        if kind(o) == "stored":
            o["event"]["data"]["stored"]["blocks"][0]["tokens_hash"] ^= 1
    many = bad * 6  # and the stream six times (restarts): more than 1,000 findings
    stream = tmp_path / "f.jsonl"
    code, _out, doc = check(capsys, tmp_path, many, "--findings", str(stream))
    assert code == 1
    total = sum(doc["findings_by_rule"].values())
    assert total > 1000 and len(doc["findings"]) == total
    got = [json.loads(line) for line in stream.read_text().splitlines()]
    assert got == doc["findings"]


def test_stats_per_worker_and_tier(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = lines_of(DYNAMO)
    other = json.loads(json.dumps(lines[:100]))
    for o in other:
        o["worker_id"] = 5
    code, out, doc = check(capsys, tmp_path, lines + other, "--stats")
    assert code == 0
    w = {e["worker_id"]: e for e in doc["statistics"]["workers"]}
    assert w[5]["events"] == 100 and w[lines[0]["worker_id"]]["events"] == len(lines)
    assert doc["statistics"]["tiers"]["device"]["sources"] == 2
    assert "per worker (worker dp: events" in out and "5 dp 0: 100 events, 0 gaps, 0 restarts" in out
    assert "per tier (tier: sources, live blocks, findings):" in out and "device: 2 source(s)" in out
