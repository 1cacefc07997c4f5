"""``check-log`` and ``watch`` on SGLang's own KV event feed.

``tests/data/sglang-0.5.23-radix.zmq.jsonl`` was recorded from SGLang
0.5.23's real ``RadixCache`` published by SGLang's own ``ZmqEventPublisher``
(``tests/sglang_feed_driver.py record``): its block hashes are signed int64,
computed by SGLang's sha256 page chain. It must read as SGLang's (detected,
not named), clean, with every stored block's hash recomputed; each defect
put in by hand must come out once, under its rule, on its line. The live
test runs the same engine and publisher and ``kvspec watch`` against them
(the first batches only reachable through SGLang's replay socket)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kvspec.cli import main

DATA = Path(__file__).parent / "data"
SGLANG = DATA / "sglang-0.5.23-radix.zmq.jsonl"
DRIVER = Path(__file__).parent / "sglang_feed_driver.py"
U64 = (1 << 64) - 1


def messages() -> list[dict[str, Any]]:
    return [json.loads(x) for x in SGLANG.read_text().splitlines()]


def batches() -> list[list[Any]]:
    """Every message's decoded KVEventBatch ``[ts, events, dp_rank]``."""
    return [msgpack.unpackb(base64.b64decode(m["parts_b64"][2])) for m in messages()]


def write_capture(path: Path, bs: list[list[Any]]) -> Path:
    """A capture of ``bs``, sequence numbers 0.. in order, topic ``kv``."""
    with path.open("w") as f:
        for seq, b in enumerate(bs):
            parts = [b"kv", seq.to_bytes(8, "big"), msgpack.packb(b)]
            rec = {"msg_idx": seq, "n_parts": 3, "parts_b64": [base64.b64encode(p).decode() for p in parts]}
            f.write(json.dumps(rec) + "\n")
    return path


def check(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict, str]:
    res = tmp_path / f"{path.stem}.json"
    code = main(["check-log", str(path), "--json", str(res), *extra])
    _, err = capsys.readouterr()
    return code, json.loads(res.read_text()), err


def stored_blocks(bs: list[list[Any]]) -> int:
    return sum(len(e["block_hashes"]) for b in bs for e in b[1] if e["type"] == "BlockStored")


def test_the_real_capture_reads_as_sglang_with_every_hash_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = batches()
    hashes = [h for b in bs for e in b[1] for h in e.get("block_hashes", [])]
    assert min(hashes) < 0 < max(hashes)  # SGLang's signed int64: both signs on the wire
    code, doc, err = check(SGLANG, tmp_path, capsys)
    assert code == 0, err
    assert doc["status"] == "clean" and doc["findings_by_rule"] == {}
    assert doc["input"]["producer"] == "sglang" and doc["input"]["counting"] == "copies"
    assert doc["counts"]["events"] == sum(len(b[1]) for b in bs)
    assert doc["counts"]["hash_checked_blocks"] == stored_blocks(bs)  # all of them, SGLang's scheme
    assert "block hashes follow sglang" in err


def test_named_producer_and_scheme(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = check(SGLANG, tmp_path, capsys, "--producer", "sglang")
    assert code == 0 and doc["counts"]["hash_checked_blocks"] == stored_blocks(batches())
    code, _, err = check(SGLANG, tmp_path, capsys, "--producer", "vllm")
    assert code == 2 and "cannot come from --producer vllm" in err
    # vLLM's scheme does not reproduce SGLang's hashes: every root block is a finding
    code, doc, _ = check(SGLANG, tmp_path, capsys, "--hash-scheme", "vllm-sha256")
    assert code == 1 and set(doc["findings_by_rule"]) == {"HASH-SEQUENCE"}


def _first(bs: list[list[Any]], pred: Any, start: int = 10) -> tuple[int, int]:
    for i in range(start, len(bs)):
        for j, e in enumerate(bs[i][1]):
            if pred(e):
                return i, j
    raise AssertionError("no such event in the capture")


def _end_state(bs: list[list[Any]]) -> dict[int, int | None]:
    """The blocks live at the end of the capture and their parents (copies ignored: SGLang stores a page once)."""
    live: dict[int, int | None] = {}
    for b in bs:
        for e in b[1]:
            if e["type"] == "BlockStored":
                p = e["parent_block_hash"]
                for h in e["block_hashes"]:
                    live[h] = p
                    p = h
            elif e["type"] == "BlockRemoved":
                for h in e["block_hashes"]:
                    live.pop(h, None)
            else:
                live.clear()
    return live


def defect(name: str, bs: list[list[Any]]) -> tuple[str, int]:
    """Put defect ``name`` in ``bs`` in place; (the rule, the 1-based line) it must come out as."""
    if name == "token":
        i, j = _first(bs, lambda e: e["type"] == "BlockStored")
        bs[i][1][j]["token_ids"][0] += 1
        return "HASH-SEQUENCE", i + 1
    if name == "parent":
        i, j = _first(bs, lambda e: e["type"] == "BlockStored" and e["parent_block_hash"] is not None)
        bs[i][1][j]["parent_block_hash"] = -12345
        return "PARENT-ANCHOR", i + 1
    if name == "unknown-removed":
        i, j = _first(bs, lambda e: e["type"] == "BlockRemoved")
        bs[i][1][j]["block_hashes"].append(-777)
        return "REMOVE-COPY", i + 1
    if name == "orphan":
        live = _end_state(bs)
        parents = {p for p in live.values() if p is not None}
        victim = sorted(parents)[0]
        bs.append([bs[-1][0], [{"type": "BlockRemoved", "block_hashes": [victim], "medium": "GPU"}], 0])
        return "REMOVE-NO-ORPHAN", len(bs)
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["token", "parent", "unknown-removed", "orphan"])
def test_one_defect_comes_out_once_under_its_rule(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = batches()
    rule, line = defect(name, bs)
    code, doc, _ = check(write_capture(tmp_path / f"{name}.zmq.jsonl", bs), tmp_path, capsys)
    assert code == 1
    assert doc["findings_by_rule"] == {rule: 1}
    assert doc["findings"][0]["at"].startswith(f"line {line} ")


def test_the_rebuilt_capture_is_still_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The defects above are measured against this: rebuilding alone changes nothing."""
    code, doc, _ = check(write_capture(tmp_path / "same.zmq.jsonl", batches()), tmp_path, capsys)
    assert code == 0 and doc["counts"]["hash_checked_blocks"] == stored_blocks(batches())


def test_signed_and_unsigned_hashes_in_one_stream_are_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = batches()
    i, j = _first(bs, lambda e: e["type"] == "BlockStored", start=40)
    bs[i][1][j]["block_hashes"][0] = (1 << 63) + 5  # an unsigned value only vLLM writes
    code, _, err = check(write_capture(tmp_path / "mixed.zmq.jsonl", bs), tmp_path, capsys)
    assert code == 2 and "not one producer's hashes" in err and f":{i + 1}:" in err


def test_a_salted_request_chains_from_its_salt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang chains a salted request's pages from sha256 of its salt; the
    hashes here are computed the way SGLang's mem_cache/utils.py does it,
    written out independently of kvspec's hashing module."""
    import hashlib
    import struct

    def page_digest(prior: bytes, toks: list[int]) -> bytes:
        return hashlib.sha256(prior + struct.pack(f"<{len(toks)}I", *toks)).digest()

    def signed(d: bytes) -> int:
        return int.from_bytes(d[:8], "big", signed=True)

    salt = "tenant-a"
    root = hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode()).digest()
    pages = [[1, 2, 3, 4], [5, 6, 7, 8]]
    d1 = page_digest(root, pages[0])
    d2 = page_digest(d1, pages[1])
    ev = {
        "type": "BlockStored",
        "block_hashes": [signed(d1), signed(d2)],
        "parent_block_hash": None,
        "token_ids": pages[0] + pages[1],
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "cache_salt": salt,
    }
    good = write_capture(tmp_path / "salted.zmq.jsonl", [[0.0, [ev], 0]])
    code, doc, _ = check(good, tmp_path, capsys, "--producer", "sglang")
    assert code == 0 and doc["counts"]["hash_checked_blocks"] == 2
    ev["cache_salt"] = "tenant-b"
    bad = write_capture(tmp_path / "salted-wrong.zmq.jsonl", [[0.0, [ev], 0]])
    code, doc, _ = check(bad, tmp_path, capsys, "--producer", "sglang")
    assert code == 1 and doc["findings_by_rule"] == {"HASH-SEQUENCE": 1}


def _sglang_installed() -> None:
    from kvspec.adapters.sglang.adapter import require_sglang
    from kvspec.conformance.requests.interface import ImplementationUnavailableError

    try:
        require_sglang()
    except ImplementationUnavailableError as e:
        pytest.skip(f"the live test needs SGLang itself: {e}")


def test_watch_reads_sglangs_live_publisher(tmp_path: Path) -> None:
    _sglang_installed()
    r = subprocess.run(
        [sys.executable, str(DRIVER), "watch", str(tmp_path), "--requests", "60", "--early", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    assert lines, f"driver printed no report (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    report = json.loads(lines[-1])
    assert "error" not in report, report
    doc = report["results"]
    assert report["exit"] == 0, report["stdout"] + report["stderr"]
    assert doc["status"] == "clean" and doc["input"]["producer"] == "sglang"
    counts = doc["counts"]
    assert counts["messages"] == report["published"] and counts["lost"] == 0
    assert counts["replayed"] >= 4  # the batches published before the watcher subscribed
    assert "hashes: sglang from tokens" in report["stdout"]  # recomputed by SGLang's scheme
    c = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "check-log", report["record"]], capture_output=True, text=True
    )
    assert c.returncode == 0, c.stdout + c.stderr
    assert f"checked {counts['events']} events" in c.stdout and "producer sglang" in c.stdout
