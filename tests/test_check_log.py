"""``kvspec check-log`` on recorded streams: clean, broken, unreadable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.spec.codecs import to_router_event, to_vllm_batch
from kvspec.spec.wire import make_removed, make_stored


def write_router_log(path: Path, events: list) -> Path:
    path.write_text("".join(json.dumps(to_router_event(e, worker_id=3)) + "\n" for e in events))
    return path


def test_clean_log_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_router_log(tmp_path / "ok.jsonl", [make_stored(0, [1, 2], [0, 0], None), make_removed(1, [2])])
    assert main(["check-log", str(log)]) == 0
    assert "checked 2 events from 1 manager(s): no violations" in capsys.readouterr().out


def test_violations_are_reported_by_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = [make_stored(0, [1], [0], None), make_stored(2, [1], [0], None), make_removed(3, [9])]
    log = write_router_log(tmp_path / "bad.jsonl", events)
    assert main(["check-log", str(log)]) == 1
    out = capsys.readouterr().out
    assert "[EVENT-ID]" in out and "[STORE-NO-DUP]" in out and "[REMOVE-EXACT]" in out
    assert "EVENT-ID x1, REMOVE-EXACT x1, STORE-NO-DUP x1" in out


def test_vllm_profile_counts_copies(tmp_path: Path) -> None:
    events = [make_stored(0, [1], [0], None), make_stored(1, [1], [0], None), make_removed(2, [1])]
    log = write_router_log(tmp_path / "copies.jsonl", events)
    assert main(["check-log", str(log), "--profile", "vllm"]) == 0
    assert main(["check-log", str(log), "--profile", "kvbm"]) == 1


def test_vllm_msgpack_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toks = [[1, 2], [3, 4]]
    a = to_vllm_batch([make_stored(0, [10, 11], [0, 0], None, token_ids=toks)], block_size=2)
    b = to_vllm_batch([make_removed(1, [12])], block_size=2)
    log = tmp_path / "cap.msgpack"
    log.write_bytes(a + b)
    assert main(["check-log", str(log), "--format", "vllm", "--profile", "vllm"]) == 1
    assert "[REMOVE-COPY] block 12" in capsys.readouterr().out


def test_unreadable_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "junk.jsonl"
    log.write_text(json.dumps(to_router_event(make_removed(0, [1]))) + "\n{not json\n")
    assert main(["check-log", str(log)]) == 2
    assert "junk.jsonl:2: not valid JSON" in capsys.readouterr().err
    bad_tier = tmp_path / "tier.jsonl"
    bad_tier.write_text(json.dumps({"worker_id": 0, "storage_tier": "moon", "event": {}}) + "\n")
    assert main(["check-log", str(bad_tier)]) == 2
    assert "tier.jsonl:1: router event: unknown storage_tier 'moon'" in capsys.readouterr().err
