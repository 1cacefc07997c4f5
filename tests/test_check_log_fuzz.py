"""Structured fuzzing of ``kvspec check-log`` with Hypothesis, on real frames.

Inputs are the real recordings (tests/data) with one part replaced: a field
of a Dynamo RouterEvent line given a value of the wrong type or range, a
file cut at any byte, a vLLM payload with bytes changed. Whatever the input,
the command ends with 0, 1 or 2 and never raises; a value the wire format
does not allow (known by construction) must give 2, and so must a file cut
inside a record, with the word "truncated" in the message.

The script scripts/fuzz_check_log.py runs the same idea over 100k inputs."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import tempfile
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.cli import main

DATA = Path(__file__).parent / "data"
DYNAMO_LINES = (DATA / "dynamo-1.6.1-mocker-device.router.jsonl").read_text().splitlines()[:12]
CAPTURE_LINES = (DATA / "vllm-0.32-cpu-engine.zmq.jsonl").read_text().splitlines()[:8]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(data: bytes, *args: str) -> tuple[int, str]:
    """Run the command in-process on ``data``; (exit code, stderr)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "input")
        path.write_bytes(data)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["check-log", str(path), "--quiet", *args])
    text = err.getvalue()
    assert code in (0, 1, 2)
    assert "Traceback" not in text and "internal error" not in text, text
    return code, text


#: (path in a router event, what the field accepts) for every typed field of a stored or removed event
STORED_FIELDS = [
    ("worker_id",),
    ("event", "event_id"),
    ("event", "dp_rank"),
    ("event", "data", "stored", "blocks", 0, "block_hash"),
    ("event", "data", "stored", "blocks", 0, "tokens_hash"),
    ("event", "data", "stored", "blocks"),
    ("event", "data", "stored"),
    ("storage_tier",),
]
U64_FIELDS = {"worker_id", "event_id", "block_hash", "tokens_hash"}

wrong_for_int = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**64, max_value=10**500),
    st.booleans(),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.none(),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
wrong_for_container = st.one_of(
    st.integers(), st.booleans(), st.text(max_size=5), st.none(), st.floats(allow_nan=False)
)
wrong_for_tier = st.one_of(
    st.text(max_size=8).filter(lambda s: s not in ("device", "host_pinned", "disk", "external", "remote")),
    st.integers(),
    st.none(),
    st.lists(st.text(max_size=2), max_size=2),
)


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = value


@SETTINGS
@given(
    line=st.integers(0, len(DYNAMO_LINES) - 1),
    field=st.sampled_from(STORED_FIELDS),
    data=st.data(),
)
def test_a_field_of_the_wrong_type_or_range_is_refused(line: int, field: tuple[Any, ...], data: st.DataObject) -> None:
    objs = [json.loads(x) for x in DYNAMO_LINES]
    target = objs[line]
    if "stored" in field and "stored" not in target["event"]["data"]:
        field = ("event", "event_id")
    last = field[-1]
    value: Any
    if last == "storage_tier":
        value = data.draw(wrong_for_tier)
    elif last in ("blocks", "stored"):
        value = data.draw(wrong_for_container)
    else:
        value = data.draw(wrong_for_int)
        if last == "dp_rank" and isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32:
            value = 2**32  # in range for u64, not for dp_rank's u32
    _set(target, field, value)
    code, err = check(b"".join(json.dumps(o).encode() + b"\n" for o in objs))
    assert code == 2, (field, value)
    assert f":{line + 1}:" in err  # the line is named


@SETTINGS
@given(cut=st.integers(1, sum(len(x) + 1 for x in DYNAMO_LINES) - 1))
def test_a_cut_file_is_reported_as_truncated(cut: int) -> None:
    full = "".join(x + "\n" for x in DYNAMO_LINES).encode()
    data = full[:cut]
    code, err = check(data)
    if data.endswith(b"\n") or full[cut : cut + 1] == b"\n":  # only whole records remain
        assert code in (0, 1)
    else:
        assert code == 2
        assert "truncated" in err


@SETTINGS
@given(
    index=st.integers(0, len(CAPTURE_LINES) - 1),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_damaged_vllm_payload_never_crashes(index: int, flips: list[tuple[int, int]]) -> None:
    objs = [json.loads(x) for x in CAPTURE_LINES]
    payload = bytearray(base64.b64decode(objs[index]["parts_b64"][2]))
    for pos, byte in flips:
        payload[pos % len(payload)] = byte
    objs[index]["parts_b64"][2] = base64.b64encode(bytes(payload)).decode()
    check(b"".join(json.dumps(o).encode() + b"\n" for o in objs))


@SETTINGS
@given(
    index=st.integers(0, len(CAPTURE_LINES) - 1),
    key=st.sampled_from(["block_hashes", "token_ids", "block_size", "type"]),
    value=st.one_of(
        st.text(max_size=4), st.booleans(), st.floats(allow_nan=False), st.lists(st.booleans(), min_size=1)
    ),
)
def test_vllm_event_field_of_the_wrong_type_is_refused(index: int, key: str, value: Any) -> None:
    objs = [json.loads(x) for x in CAPTURE_LINES]
    batch = msgpack.unpackb(base64.b64decode(objs[index]["parts_b64"][2]))
    ev = batch[1][0]
    if key not in ev and key != "type":
        key = "type"
    if key == "type" and isinstance(value, str) and value in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        value = value + "X"
    if key == "block_size" and isinstance(value, float) and value.is_integer() and value >= 1:
        value = "x"  # msgpack keeps floats floats: 32.0 is not an int, but keep it obviously wrong
    ev[key] = value
    objs[index]["parts_b64"][2] = base64.b64encode(msgpack.packb(batch)).decode()
    code, err = check(b"".join(json.dumps(o).encode() + b"\n" for o in objs))
    assert code == 2, (key, value, err)
    assert f":{index + 1}:" in err
