"""``kvspec check-log`` on real recordings and on streams made from them.

The Dynamo and vLLM recordings (tests/data/README.md) are checked as they
are, then with one defect put in by hand; each defect must come out as the
rule it breaks, at the line it is on, and nothing else may change."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import msgpack
import pytest

from kvspec.cli import main
from kvspec.spec.hashing import chain, local_block_hash

DATA = Path(__file__).parent / "data"
DYNAMO = DATA / "dynamo-1.6.1-mocker-device.router.jsonl"
VLLM = DATA / "vllm-0.32-cpu-engine.zmq.jsonl"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["check-log", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def dynamo_lines() -> list[dict]:
    return [json.loads(line) for line in DYNAMO.read_text().splitlines()]


def write_lines(path: Path, objs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def router(eid: int, data: object, *, tier: str = "device", worker: int = 7) -> dict:
    return {"worker_id": worker, "storage_tier": tier, "event": {"event_id": eid, "data": data, "dp_rank": 0}}


def stored(parent: int | None, locals_: list[int]) -> tuple[dict, list[int]]:
    """A Stored whose block hashes chain from ``parent`` (Dynamo's rule)."""
    blocks, hashes, prev = [], [], parent
    for t in locals_:
        prev = chain(prev, t)
        hashes.append(prev)
        blocks.append({"block_hash": prev, "tokens_hash": t, "mm_extra_info": None})
    return {"stored": {"parent_hash": parent, "start_position": None, "blocks": blocks}}, hashes


def removed(hashes: list[int]) -> dict:
    return {"removed": {"block_hashes": hashes}}


# ---------------------------------------------------------------- recordings


def test_dynamo_recording_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(DYNAMO))
    assert code == 0, out
    assert "checked 487 events (241 stored, 246 removed, 0 cleared)" in out
    assert "Dynamo chain from tokens_hash, 496 blocks" in out


@pytest.mark.parametrize("path", [DYNAMO, VLLM])
def test_a_missing_c_extension_is_said_and_changes_no_verdict(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the C fast paths cannot be built, check-log says so once (on
    stderr) and gives the same output from the Python path; turned off on
    purpose (KVSPEC_FASTVIEW=0) it says nothing."""
    from kvspec.streams import check_log, fastview

    with_c = run(capsys, str(path), "--json", "-")
    why = "Python (the C extension could not be built: RuntimeError: cc: not found)"
    monkeypatch.setattr(fastview, "_tried", True)
    monkeypatch.setattr(fastview, "_module", None)
    monkeypatch.setattr(fastview, "_status", why)
    monkeypatch.setattr(check_log, "_slow_path_noted", False)
    code, out, err = run(capsys, str(path), "--json", "-")
    assert err.count("kvspec: note: C fast paths unavailable") == 1, err
    assert why in err
    strip = lambda text: [ln for ln in text.splitlines() if "elapsed" not in ln and '_s"' not in ln]  # noqa: E731
    assert (code, strip(out)) == (with_c[0], strip(with_c[1]))
    monkeypatch.setattr(fastview, "_status", "off (KVSPEC_FASTVIEW=0)")
    monkeypatch.setattr(check_log, "_slow_path_noted", False)
    _, _, err = run(capsys, str(path))
    assert "note: C fast paths" not in err


def test_vllm_recording_is_clean_with_copy_counting_and_its_hashes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run(capsys, str(VLLM))
    assert code == 0, out
    assert "checked 80 events (32 stored, 47 removed, 1 cleared)" in out
    assert "vllm-sha256 (seed 'vllm-none-hash') from tokens, 60 blocks" in out
    # the same stream counted as a set: vLLM's real duplicate copies are findings
    code, out, _ = run(capsys, str(VLLM), "--counting", "set")
    assert code == 1 and "STORE-NO-DUP" in out


def test_dynamo_without_its_first_event_is_flagged_unless_mid_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = dynamo_lines()
    # the first event stored blocks later events hang under; keep only what follows them
    log = write_lines(tmp_path / "mid.jsonl", lines[1:])
    code, out, _ = run(capsys, str(log), "--ignore", "PARENT-ANCHOR", "--ignore", "REMOVE-EXACT")
    assert code == 1 and ":1: EVENT-ID" in out and "event id 2 is a gap (expected id 1)" in out
    code, out, _ = run(capsys, str(log), "--mid-stream", "--ignore", "PARENT-ANCHOR", "--ignore", "REMOVE-EXACT")
    assert code == 0, out


@pytest.mark.parametrize(
    ("edit", "rule", "line"),
    [
        ("tokens_hash", "HASH-SEQUENCE", 5),
        ("block_hash", "HASH-SEQUENCE", 5),
        ("drop", "EVENT-ID", 5),
        ("repeat", "STORE-NO-DUP", 7),
    ],
)
def test_one_defect_in_the_dynamo_recording(
    edit: str, rule: str, line: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = dynamo_lines()
    target = lines[line - 2] if edit == "repeat" else lines[line - 1]  # a repeat follows its original
    assert "stored" in target["event"]["data"]
    if edit == "tokens_hash":
        target["event"]["data"]["stored"]["blocks"][0]["tokens_hash"] ^= 1
    elif edit == "block_hash":
        target["event"]["data"]["stored"]["blocks"][-1]["block_hash"] ^= 1 << 63
    elif edit == "drop":
        del lines[line - 1]
    else:
        lines.insert(line - 1, json.loads(json.dumps(target)))
        for i, o in enumerate(lines, 1):
            o["event"]["event_id"] = i
    code, out, _ = run(capsys, str(write_lines(tmp_path / "x.jsonl", lines)), "--max-report", "100")
    assert code == 1
    first = out.splitlines()[0]
    assert f"x.jsonl:{line}: {rule} worker 1823152252274311444 dp 0 device:" in first


# ------------------------------------------------------ tiers and orphans


def test_host_tier_parent_evicted_from_the_host_tier_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, (_h1, h2) = stored(None, [11, 12])
    b, (_h3,) = stored(h2, [13])
    events = [
        router(1, a),
        router(2, a, tier="host_pinned"),
        router(3, removed([h2]), tier="host_pinned"),
        router(4, b),
        router(5, b, tier="host_pinned"),
    ]
    code, out, _ = run(capsys, str(write_lines(tmp_path / "host.jsonl", events)))
    assert code == 1
    assert (
        f"host.jsonl:5: PARENT-ANCHOR worker 7 dp 0 host_pinned: parent {h2} is not stored "
        f"(parent {h2}, parent removed by event 3)"
    ) in out
    assert "device" not in out.split("checked")[0].replace("tiers: device", "")  # the device tier is fine


def test_real_host_tier_orphaning_names_tier_and_cause(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(DATA / "dynamo-1.6.1-mocker-host.router.jsonl"))
    assert code == 1
    first = out.splitlines()[0]
    assert ":4: REMOVE-NO-ORPHAN worker 7375963995128891518 dp 0 host_pinned: removing 1813654816074459860" in first
    assert "(children stored by events [2])" in first
    assert "REMOVE-NO-ORPHAN         1" in out and "tiers: device, host_pinned" in out


def test_orphaning_is_reported_by_default_with_its_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, (_h1, h2) = stored(None, [21, 22])
    b, (h3,) = stored(h2, [23])
    events = [
        router(1, a, tier="host_pinned"),
        router(2, b, tier="host_pinned"),
        router(3, removed([h2]), tier="host_pinned"),
    ]
    code, out, _ = run(capsys, str(write_lines(tmp_path / "orphan.jsonl", events)))
    assert code == 1
    assert (
        f"orphan.jsonl:3: REMOVE-NO-ORPHAN worker 7 dp 0 host_pinned: removing {h2} leaves its stored children "
        f"[{h3}] without a parent in tier host_pinned (children stored by events [2])"
    ) in out
    assert "known break" not in out  # no profile named: the stream's facts only
    code, out, _ = run(capsys, str(write_lines(tmp_path / "orphan.jsonl", events)), "--profile", "kvbm")
    assert "[known break of profile kvbm: LRU-style policies" in out
    code, _, _ = run(capsys, str(tmp_path / "orphan.jsonl"), "--ignore", "REMOVE-NO-ORPHAN")
    assert code == 0


# ------------------------------------------------------------- ZMQ captures


def capture_lines() -> list[dict]:
    return [json.loads(line) for line in VLLM.read_text().splitlines()]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("drop", "sequence 6 where 5 was due: 1 batch(es) lost"),
        ("repeat-other", "sequence 4 was already received with a different payload: duplicate batch (not applied)"),
        ("swap", "sequence 5 arrived after 6: out of order"),
    ],
)
def test_capture_sequence_defects(edit: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = capture_lines()
    if edit == "drop":
        del lines[5]
    elif edit == "repeat-other":  # sequence 4 again, carrying batch 6's payload
        lines.insert(5, {**lines[4], "parts_b64": [*lines[4]["parts_b64"][:2], lines[6]["parts_b64"][2]]})
    else:
        lines[5], lines[6] = lines[6], lines[5]
    code, out, _ = run(capsys, str(write_lines(tmp_path / "c.jsonl", lines)), "--max-report", "100")
    assert code == 1
    assert message in out and "EVENT-ID" in out


def test_capture_redelivery_is_counted_not_a_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # at-least-once delivery: batch 4 again, byte for byte, right after it and ten batches later
    lines = capture_lines()
    lines.insert(5, lines[4])
    lines.insert(15, lines[4])
    res = tmp_path / "r.json"
    code, out, _ = run(capsys, str(write_lines(tmp_path / "c.jsonl", lines)), "--json", str(res))
    assert code == 0, out
    doc = json.loads(res.read_text())
    assert doc["counts"]["redelivered"] == 2 and doc["counts"]["duplicates"] == 0
    assert doc["counts"]["events"] == 80  # each batch applied once
    assert "sequence 4 delivered again (skipped)" in out


def events_in(o: dict) -> int:
    return len(msgpack.unpackb(base64.b64decode(o["parts_b64"][2]))[1])


def test_capture_sequence_reset_is_a_restart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the publisher restarts after batch 19: its sequence starts at 0 again with an empty cache (the
    # engine's batches from its prefix-cache reset on, renumbered), and every batch after it is checked
    lines = capture_lines()
    cut = next(i for i, o in enumerate(lines) if b"AllBlocksCleared" in base64.b64decode(o["parts_b64"][2]))
    restart = [dict(o) for o in lines[cut:]]
    for i, o in enumerate(restart):
        o["parts_b64"] = [o["parts_b64"][0], base64.b64encode(i.to_bytes(8, "big")).decode(), o["parts_b64"][2]]
    res = tmp_path / "r.json"
    code, out, _ = run(capsys, str(write_lines(tmp_path / "c.jsonl", lines[:20] + restart)), "--json", str(res))
    assert code == 0, out
    doc = json.loads(res.read_text())
    assert doc["counts"]["restarts"] == 1
    assert doc["counts"]["events"] == sum(events_in(o) for o in lines[:20] + restart)
    assert "sequence 0 after 19: the publisher restarted" in out
    # a defect in the last batch after the restart is found: its first Removed names a block never stored
    for k in range(len(restart)):
        edited = [dict(o) for o in restart]
        batch = msgpack.unpackb(base64.b64decode(edited[k]["parts_b64"][2]))
        removed = [e for e in batch[1] if e["type"] == "BlockRemoved"]
        if not removed:
            continue
        removed[0]["block_hashes"] = [*removed[0]["block_hashes"], 12345]
        edited[k]["parts_b64"] = [*edited[k]["parts_b64"][:2], base64.b64encode(msgpack.packb(batch)).decode()]
        code, out, _ = run(capsys, str(write_lines(tmp_path / "c2.jsonl", lines[:20] + edited)))
        assert code == 1 and "REMOVE-COPY" in out and "block 12345 is not stored" in out, (k, out)


def test_capture_that_starts_mid_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the engine was reset before message 15 (AllBlocksCleared): what follows stands alone
    lines = capture_lines()
    cut = next(i for i, o in enumerate(lines) if b"AllBlocksCleared" in base64.b64decode(o["parts_b64"][2]))
    log = write_lines(tmp_path / "late.jsonl", lines[cut:])
    code, out, _ = run(capsys, str(log))
    assert code == 1 and f"the feed starts at sequence {cut}, not 0" in out
    code, out, _ = run(capsys, str(log), "--mid-stream")
    assert code == 0, out


def test_corrupted_token_in_a_vllm_capture_breaks_its_hash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = capture_lines()
    batch = msgpack.unpackb(base64.b64decode(lines[3]["parts_b64"][2]))
    batch[1][0]["token_ids"][0] += 1
    lines[3]["parts_b64"][2] = base64.b64encode(msgpack.packb(batch)).decode()
    code, out, _ = run(capsys, str(write_lines(tmp_path / "t.jsonl", lines)))
    assert code == 1
    assert "t.jsonl:4 event 0: HASH-SEQUENCE worker 0 dp 0 device: block_hash" in out
    assert "is not vLLM's sha256 hash of its tokens" in out


# ---------------------------------------------------------- msgpack payloads


def payloads() -> list[bytes]:
    return [base64.b64decode(o["parts_b64"][2]) for o in capture_lines()]


def test_raw_payloads_in_both_layouts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    maps = tmp_path / "maps.msgpack"
    maps.write_bytes(b"".join(payloads()))
    assert run(capsys, str(maps))[0] == 0
    # the same batches in the older array layout (each event a tagged array)
    fields = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"]
    arrays = []
    for p in payloads():
        ts, events, dp = msgpack.unpackb(p)
        tagged = []
        for e in events:
            if e["type"] == "BlockStored":
                tagged.append(["BlockStored", *(e[f] for f in fields)])
            elif e["type"] == "BlockRemoved":
                tagged.append(["BlockRemoved", e["block_hashes"], e["medium"]])
            else:
                tagged.append(["AllBlocksCleared"])
        arrays.append(msgpack.packb([ts, tagged, dp]))
    arr = tmp_path / "arrays.msgpack"
    arr.write_bytes(b"".join(arrays))
    code, out, _ = run(capsys, str(arr))
    assert code == 0, out
    assert "checked 80 events" in out


def test_truncated_payload_file_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = b"".join(payloads())
    log = tmp_path / "cut.msgpack"
    log.write_bytes(data[:-3])
    code, _out, err = run(capsys, str(log))
    assert code == 2
    assert "batch 33" in err and "the file ends inside a batch" in err


# ------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "the input is empty"),
        ("\n\n", "the input is empty"),
        ('{"worker_id": 1, "event": {"event_id": 1, "data": "cleared", "dp_rank": true}}\n', "$.event.dp_rank"),
        ('{"worker_id": 1, "event": {"event_id": 1, "data": "cleared", "dp_rank": 4294967296}}\n', "dp_rank"),
        (
            '{"worker_id": 1, "event": {"event_id": 1, "data": {"removed": {"block_hashes": [18446744073709551616]}}}}'
            "\n",
            "does not fit in 64 bits",
        ),
        ('{"worker_id": 1, "event": {"event_id": 1, "data": {"removed": {"block_hashes": [true]}}}}\n', "got `bool`"),
        ('{"worker_id": 1, "event": {"event_id": 1, "data": {"moved": {}}}}\n', "unknown field `moved`"),
        ('{"worker_id": 1, "storage_tier": "moon", "event": {"event_id": 1, "data": "cleared"}}\n', "'moon'"),
        ('{"worker_id": 1, "event": {"event_id": 1, "data": {}}}\n', "names no variant"),
        ('{"worker_id": 1, "event": {"event_id": 1, "data": "cleared"}}\n{"worker_id": 1, "ev', "truncated"),
        ("\x00\x01", "cannot tell the format"),
        ('{"a": 1}\n', "no known format"),
    ],
)
def test_unreadable_input_exits_2_naming_the_problem(
    content: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "bad.jsonl"
    log.write_text(content)
    code, _, err = run(capsys, str(log))
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_a_field_a_newer_dynamo_adds_is_tolerated_with_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = dynamo_lines()
    for o in lines[:3]:
        o["event"]["priority"] = 5
    code, out, err = run(capsys, str(write_lines(tmp_path / "new.jsonl", lines)))
    assert code == 0, out
    assert err.count("field(s) this version does not know: event.priority") == 1


def test_overlong_line_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "long.jsonl"
    log.write_text(DYNAMO.read_text().splitlines()[0] + "\n" + " " * 5000 + "\n")
    code, _, err = run(capsys, str(log), "--max-record-bytes", "4096")
    assert code == 2 and "long.jsonl:2: longer than 4096 bytes" in err


# ---------------------------------------------------------------- outputs


def test_results_json_and_junit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = dynamo_lines()
    del lines[4]
    log = write_lines(tmp_path / "gap.jsonl", lines)
    res, junit = tmp_path / "r.json", tmp_path / "j.xml"
    code, _, _ = run(capsys, str(log), "--json", str(res), "--junit", str(junit))
    assert code == 1
    doc = json.loads(res.read_text())
    assert doc["format"] == 3 and doc["tool"] == "kvspec check-log"
    assert doc["status"] == "findings" and doc["exit_code"] == 1
    assert doc["input"]["format"] == "router" and doc["input"]["producer"] == "dynamo"
    assert doc["findings_by_rule"]["EVENT-ID"] == 1
    assert doc["counts"]["events"] == 486
    first = doc["findings"][0]
    assert first["rule"] == "EVENT-ID" and first["at"] == "line 5" and first["tier"] == "device"
    suite = ET.parse(junit).getroot()
    failed = {c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None}
    assert "EVENT-ID" in failed and "STORE-TOKENS-HASH" not in failed
    assert int(suite.get("failures") or 0) == len(failed)


def test_results_json_of_an_unreadable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    res = tmp_path / "r.json"
    assert run(capsys, str(log), "--json", str(res))[0] == 2
    doc = json.loads(res.read_text())
    assert doc["status"] == "unreadable" and "empty" in doc["error"]


def test_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["check-log", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for opt in [
        "--format",
        "--producer",
        "--profile",
        "--counting",
        "--first-event-id",
        "--mid-stream",
        "--anchor-tiers",
        "--ignore",
        "--worker-id",
        "--hash-scheme",
        "--vllm-hash-seed",
        "--lora-name",
        "--cache-namespace",
        "--eagle",
        "--max-report",
        "--json",
        "--junit",
        "--quiet",
        "--max-record-bytes",
        "--findings",
        "--stats",
        "--sequential-orphans",
        "exit status",
    ]:
        assert opt in text, opt


def test_unknown_rule_to_ignore_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, str(DYNAMO), "--ignore", "NOPE")
    assert code == 2 and "unknown rule id 'NOPE'" in err


def test_kvspec_event_lines_check_token_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toks = [1, 2, 3, 4]
    ev = {
        "event_id": 0,
        "data": {"stored": {"parent_hash": None, "blocks": [{"block_hash": 5, "tokens_hash": local_block_hash(toks)}]}},
        "block_token_ids": [toks],
    }
    bad = json.loads(json.dumps(ev))
    bad["event_id"] = 1
    bad["data"]["stored"]["blocks"][0] = {"block_hash": 6, "tokens_hash": 99}
    code, out, _ = run(capsys, str(write_lines(tmp_path / "k.jsonl", [ev, bad])))
    assert code == 1
    assert "k.jsonl:2: STORE-TOKENS-HASH worker 0 dp 0 device: block 6: tokens_hash 99" in out
