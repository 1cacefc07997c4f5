"""Fuzz ``kvspec check-log`` with malformed recordings; count what goes wrong.

Each input is a real recording (the Dynamo RouterEvent lines, the vLLM ZMQ
capture and its raw msgpack payloads, kvspec event lines, all under
tests/data or made from them), cut to a few records and then broken in one
way whose effect on the wire format is known by construction:

- ``malformed``: a field of the wrong type, an integer out of its range, a
  required field removed, a variant name or tag that does not exist, bytes
  that are not JSON or msgpack at all, a file cut inside a record
  (``truncated``), or nested past any decoder's depth: ``check-log`` must
  exit 2 and say why;
- ``valid``: a well-typed value changed (a hash, an id, a token), a field a
  newer producer might add, records dropped, repeated or swapped: any of 0,
  1 is right, 2 is not;
- ``noise``: random bytes flipped: any exit status is right.

Inputs also come from the SGLang capture (signed hashes, SGLang's hash
scheme) and the Dynamo event-plane capture (four frames, a framed msgpack
envelope of RouterEvents, broken at the frame, envelope or event level), and
text is broken as operators meet it: invalid UTF-8 inside a JSON string, a
line re-encoded as Latin-1 or UTF-16 (malformed), a UTF-8 byte-order mark
before a valid file and non-ASCII UTF-8 in a free-text field (valid).

Every run must end with exit status 0, 1 or 2 within ``--time-limit``
seconds, with nothing on stderr that looks like a Python traceback. The
script prints the tally and exits 1 if any input crashed, hung, accepted a
malformed input, refused a valid one or let a truncation pass.

    python scripts/fuzz_check_log.py --inputs 100000 --seed 1
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import random
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"

# ------------------------------------------------------------------ seeds


def seeds() -> dict[str, list[Any]]:
    dyn = [json.loads(x) for x in (DATA / "dynamo-1.6.1-mocker-device.router.jsonl").read_text().splitlines()[:40]]
    cap = [json.loads(x) for x in (DATA / "vllm-0.32-cpu-engine.zmq.jsonl").read_text().splitlines()[:20]]
    payloads = [msgpack.unpackb(base64.b64decode(o["parts_b64"][2])) for o in cap]
    kv = []
    for o in dyn[:30]:
        ev = dict(o["event"])
        data = ev["data"]
        if isinstance(data, dict) and "stored" in data:
            st = dict(data["stored"])
            st["blocks"] = [{"block_hash": b["block_hash"], "tokens_hash": b["tokens_hash"]} for b in st["blocks"]]
            ev["data"] = {"stored": st}
        ev["event_id"] -= 1
        kv.append(ev)
    sgl = [json.loads(x) for x in (DATA / "sglang-0.5.23-radix.zmq.jsonl").read_text().splitlines()[:40]]
    plane = []
    for x in (DATA / "dynamo-1.6.1-mocker-eventplane.zmq.jsonl").read_text().splitlines()[:40]:
        frames = [base64.b64decode(p) for p in json.loads(x)["parts_b64"]]
        env = msgpack.unpackb(frames[3][5:])
        plane.append((frames, env, msgpack.unpackb(env["payload"])))
    return {"router": dyn, "zmq": cap, "vllm": payloads, "kvspec": kv, "sglang": sgl, "eventplane": plane}


# -------------------------------------------------------------- mutations

WRONG_TYPES: list[Any] = ["x", 1.5, True, None, [], {}, [1, "a"], -1, 2**64, 2**70, 10**400]


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _get(obj: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    parent = _get(obj, path[:-1])
    parent[path[-1]] = value


#: fields whose value may be null (a null there is still a valid record)
NULLABLE = {"parent_hash", "start_position", "mm_extra_info", "parent_block_hash", "lora_id", "medium", "lora_name",
            "extra_keys", "group_idx", "kv_cache_spec_kind", "data_parallel_rank", "residency_domain", "msg_idx",
            "recv_time_s", "n_parts", "block_token_ids"}  # fmt: skip
#: fields any JSON value fits (never typed by the decoders)
UNTYPED = {"extra_keys", "kv_cache_spec_kind", "lora_id"}
#: fields that may be left out
OPTIONAL = NULLABLE | {"dp_rank", "storage_tier", "residency_domain", "msg_idx", "recv_time_s", "n_parts", "type"}


def _fits(current: Any, v: Any, key: Any) -> bool:
    """Whether ``v`` is a value the field holding ``current`` accepts."""
    if v is None:
        return key in NULLABLE
    if isinstance(v, bool) or isinstance(current, bool):
        return isinstance(v, bool) and isinstance(current, bool)
    if isinstance(current, int):
        if key in ("recv_time_s", "ts"):
            return isinstance(v, int | float) and v >= 0
        return isinstance(v, int) and 0 <= v < 2**63
    if isinstance(current, float):
        return isinstance(v, int | float)
    if isinstance(current, str):
        return isinstance(v, str)
    if isinstance(current, list):
        return isinstance(v, list) and not v
    if isinstance(current, dict):
        return isinstance(v, dict)
    return True


def wrong_value(rng: random.Random, current: Any, key: Any) -> Any | None:
    """A value of a type or range the field does not take (None: none found)."""
    if current is None or isinstance(current, bool):
        return None
    for _ in range(10):
        v = rng.choice(WRONG_TYPES)
        if not _fits(current, v, key):
            return v
    return None


def mutate_json_record(rng: random.Random, rec: Any, kind: str) -> tuple[Any, str]:
    """(record, label): one change to one decoded record."""
    rec = json.loads(json.dumps(rec))
    paths = [p for p in _paths(rec) if p]
    what = rng.random()
    if what < 0.45:
        for _ in range(20):
            p = rng.choice(paths)
            key = p[-1]
            if isinstance(key, str) and key in UNTYPED:
                continue
            if kind == "zmq" and "parts_b64" in p and len(p) > 1:
                continue  # base64 text is handled by the payload mutations
            cur = _get(rec, p)
            v = wrong_value(rng, cur, key)
            if v is None:
                continue
            _set(rec, p, v)
            return rec, "malformed"
        return rec, "valid"
    if what < 0.6:
        keys = [p for p in paths if isinstance(p[-1], str) and p[-1] not in OPTIONAL and p[-1] not in UNTYPED]
        if kind == "zmq":
            keys = [p for p in keys if p[-1] == "parts_b64"]
        if keys:
            p = rng.choice(keys)
            del _get(rec, p[:-1])[p[-1]]
            return rec, "malformed"
        return rec, "valid"
    if what < 0.7:
        obj_paths = [p for p in [(), *paths] if isinstance(_get(rec, p), dict)]
        p = rng.choice(obj_paths)
        container = _get(rec, p)
        if kind in ("router", "kvspec") and p and p[-1] == "data":
            container["bogus_variant"] = {}
            return rec, "malformed"
        if kind == "zmq":
            return rec, "valid"
        container["added_by_a_newer_producer"] = rng.choice([1, "x", [1, 2], None])
        # Dynamo's format tolerates a newer producer's fields; kvspec's own schema does not
        return rec, "malformed" if kind == "kvspec" else "valid"
    # a well-typed value changed
    ints = [p for p in paths if isinstance(_get(rec, p), int) and not isinstance(_get(rec, p), bool)]
    ints = [p for p in ints if not (isinstance(p[-1], str) and p[-1] in ("dp_rank", "block_size", "n_parts"))]
    if ints and kind != "zmq":
        p = rng.choice(ints)
        _set(rec, p, rng.randrange(0, 2**64) if rng.random() < 0.5 else max(0, _get(rec, p) + rng.choice([-1, 1])))
    return rec, "valid"


def mutate_payload(rng: random.Random, batch: Any, signed: bool = False) -> tuple[Any, str]:
    """One change to a decoded vLLM batch (map-layout events); ``signed``:
    SGLang's, whose hashes are signed int64 (new ones are drawn the same way)."""
    batch = json.loads(json.dumps(batch))
    ev = rng.choice(batch[1]) if batch[1] else None
    what = rng.random()
    if ev is None or what < 0.15:
        return [batch[0], batch[1], 2**33] if rng.random() < 0.5 else [batch[0], "x"], "malformed"
    if what < 0.4:
        ev["type"] = rng.choice(["BlockMoved", "", 7])
        return batch, "malformed"
    if what < 0.7:
        keys = [k for k in ("block_hashes", "token_ids", "block_size") if k in ev]
        if not keys:  # an AllBlocksCleared: a field it does not have is tolerated
            ev["block_hashes"] = "x"
            return batch, "valid"
        key = rng.choice(keys)
        ev[key] = rng.choice(["x", [True], [-1], [1.5], 0, [None]])
        if key == "block_hashes" and ev[key] == [-1]:
            # a signed hash is SGLang's: valid, unless the stream already showed unsigned ones above 2**63
            return batch, "noise"
        return batch, "malformed"
    if what < 0.85 and ev.get("type") == "BlockStored":
        ev["token_ids"] = ev["token_ids"][:-1]  # tokens per block wrong: a finding, not unreadable
        return batch, "valid"
    if "block_hashes" in ev:
        lo, hi = (-(2**63), 2**63) if signed else (0, 2**64)
        ev["block_hashes"] = [rng.randrange(lo, hi) for _ in ev["block_hashes"]]
    return batch, "valid"


def render_lines(recs: list[Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in recs)


def capture_line(frames: list[bytes]) -> dict[str, Any]:
    return {"n_parts": len(frames), "parts_b64": [base64.b64encode(f).decode() for f in frames]}


def plane_frames(frames: list[bytes], env: dict[str, Any], events: list[Any]) -> list[bytes]:
    body = msgpack.packb(dict(env, payload=msgpack.packb(events)))
    return [frames[0], frames[1], frames[2], b"\x01" + len(body).to_bytes(4, "big") + body]


def make_eventplane(rng: random.Random, msgs: list[Any]) -> tuple[str, bytes, str]:
    """An event-plane capture, broken at the frame, envelope or event level."""
    n = rng.randint(1, min(12, len(msgs)))
    start = rng.randrange(0, len(msgs) - n + 1)
    recs = [(list(f), dict(e), json.loads(json.dumps(evs))) for f, e, evs in msgs[start : start + n]]
    lines = [plane_frames(*r) for r in recs]
    i = rng.randrange(n)
    frames, env, events = recs[i]
    how = rng.random()
    label = "valid"
    if how < 0.35 and events:
        j = rng.randrange(len(events))
        for _ in range(5):
            ev, label = mutate_json_record(rng, events[j], "router")
            try:
                lines[i] = plane_frames(frames, env, [*events[:j], ev, *events[j + 1 :]])
                break
            except (OverflowError, TypeError, ValueError):  # a value msgpack cannot hold: try another
                label = "valid"
                continue
    elif how < 0.5:
        f = list(lines[i])
        what = rng.choice(["length", "version", "short", "pid", "sequence", "parts"])
        if what == "length":
            f[3] = f[3][:1] + (len(f[3]) - 5 + rng.choice([-1, 1, 100])).to_bytes(4, "big") + f[3][5:]
        elif what == "version":
            f[3] = bytes([rng.choice([0, 2, 255])]) + f[3][1:]
        elif what == "short":
            f[3] = f[3][: rng.randrange(0, 5)]
        elif what == "pid":
            f[1] = f[1][:7]
        elif what == "sequence":  # the frame and the envelope disagree
            f[2] = (int.from_bytes(f[2], "big") + 1).to_bytes(8, "big")
        else:
            f = f[:3]
        lines[i] = f
        label = "malformed"
    elif how < 0.6:
        env2 = dict(env, payload=rng.choice([b"\xc1", b"\x92\x01", msgpack.packb({"a": 1}), b""]))
        body = msgpack.packb(env2)
        lines[i] = [frames[0], frames[1], frames[2], b"\x01" + len(body).to_bytes(4, "big") + body]
        label = "malformed"
    elif how < 0.7:
        env2 = dict(env)
        del env2[rng.choice(["publisher_id", "sequence", "payload"])]
        body = msgpack.packb(env2)
        lines[i] = [frames[0], frames[1], frames[2], b"\x01" + len(body).to_bytes(4, "big") + body]
        label = "malformed"
    elif how < 0.8:
        data = bytearray(render_lines([capture_line(f) for f in lines]))
        for _ in range(rng.randint(1, 5)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return "eventplane", bytes(data), "noise"
    elif how < 0.9:  # whole messages dropped, repeated or swapped: a valid stream with findings
        op = rng.choice(["drop", "repeat", "swap"])
        j = rng.randrange(n)
        if op == "drop" and n > 1:
            del lines[i]
        elif op == "repeat":
            lines.insert(i, lines[i])
        else:
            lines[i], lines[j] = lines[j], lines[i]
    return "eventplane", render_lines([capture_line(f) for f in lines]), label


def break_text(rng: random.Random, data: bytes, label: str, kind: str) -> tuple[bytes, str]:
    """Text as operators meet it (module docstring): (bytes, label)."""
    lines = data.split(b"\n")
    body = [k for k, x in enumerate(lines) if x.strip()]
    if not body:
        return data, label
    k = rng.choice(body)
    how = rng.random()
    if how < 0.2 and label == "valid":
        return b"\xef\xbb\xbf" + data, label  # a UTF-8 byte-order mark before a valid file
    if how < 0.5:  # invalid UTF-8 inside a JSON string
        starts = [m for m in range(len(lines[k]) - 1) if lines[k][m : m + 1] == b'"']
        if not starts:
            return data, label
        at = rng.choice(starts) + 1
        bad = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xe9", b"\xc0\xaf"])
        lines[k] = lines[k][:at] + bad + lines[k][at:]
        return b"\n".join(lines), "malformed"
    if how < 0.65:
        lines[k] = lines[k].decode("latin-1").encode("utf-16")  # one line in another encoding
        return b"\n".join(lines), "malformed"
    if how < 0.8 and kind == "router" and b'"worker"' in lines[k]:
        # a free-text field with non-ASCII text: valid in UTF-8, malformed in Latin-1
        if rng.random() < 0.5:
            lines[k] = lines[k].replace(b'"worker"', '"w\u00f6rker"'.encode())
            return b"\n".join(lines), label
        lines[k] = lines[k].replace(b'"worker"', '"w\u00f6rker"'.encode("latin-1"))
        return b"\n".join(lines), "malformed"
    if label == "valid":  # the whole file in UTF-16, with its byte-order mark
        return data.decode("latin-1").encode("utf-16"), "malformed"
    return data, label


def make_input(rng: random.Random, s: dict[str, list[Any]]) -> tuple[str, bytes, str]:
    """(format, bytes, label)."""
    fmt, data, label = _make_input(rng, s)
    if fmt != "vllm" and label in ("valid", "malformed") and rng.random() < 0.15:
        data, label = break_text(rng, data, label, fmt)
    return fmt, data, label


def _make_input(rng: random.Random, s: dict[str, list[Any]]) -> tuple[str, bytes, str]:
    kind = rng.choice(["router", "router", "zmq", "vllm", "kvspec", "sglang", "eventplane"])
    if kind == "eventplane":
        return make_eventplane(rng, s["eventplane"])
    fmt = "zmq" if kind == "sglang" else kind
    n = rng.randint(1, min(12, len(s[kind])))
    start = rng.randrange(0, len(s[kind]) - n + 1)
    recs = list(s[kind][start : start + n])
    how = rng.random()
    label = "valid"
    if kind == "vllm":
        payloads = [msgpack.packb(b) for b in recs]
        if how < 0.5:
            i = rng.randrange(n)
            b, label = mutate_payload(rng, recs[i])
            payloads[i] = msgpack.packb(b)
        elif how < 0.65:
            data = b"".join(payloads)
            cut = rng.randrange(1, len(data))
            ends = set()
            pos = 0
            for p in payloads:
                pos += len(p)
                ends.add(pos)
            return kind, data[:cut], "valid" if cut in ends else "truncated"
        elif how < 0.75:
            depth = rng.choice([100, 5000, 200000])
            payloads.append(b"\x91" * depth + b"\xc0")
            return kind, b"".join(payloads), "malformed"
        elif how < 0.85:
            payloads.append(bytes([0xC1]) + bytes(rng.randrange(256) for _ in range(rng.randint(0, 20))))
            return kind, b"".join(payloads), "malformed"
        else:
            data = bytearray(b"".join(payloads))
            for _ in range(rng.randint(1, 5)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            return kind, bytes(data), "noise"
        return kind, b"".join(payloads), label
    if kind in ("zmq", "sglang") and how < 0.35:
        i = rng.randrange(n)
        rec = json.loads(json.dumps(recs[i]))
        batch, label = mutate_payload(rng, msgpack.unpackb(base64.b64decode(rec["parts_b64"][2])), kind == "sglang")
        rec["parts_b64"][2] = base64.b64encode(msgpack.packb(batch)).decode()
        recs[i] = rec
        return fmt, render_lines(recs), label
    if how < 0.55:
        i = rng.randrange(n)
        recs[i], label = mutate_json_record(rng, recs[i], fmt)
        return fmt, render_lines(recs), label
    if how < 0.7:
        data = render_lines(recs)
        cut = rng.randrange(1, len(data))
        # a cut just before a newline leaves whole records: only then may the run succeed
        whole = data[cut - 1 : cut] == b"\n" or data[cut : cut + 1] == b"\n"
        return fmt, data[:cut], "valid" if whole else "truncated"
    if how < 0.78:
        depth = rng.choice([200, 3000, 100000])
        bad = b'{"worker_id": 1, "event": ' + b"[" * depth + b"]" * depth + b"}"
        return fmt, render_lines(recs) + bad + b"\n", "malformed"
    if how < 0.84:
        junk = rng.choice([b"\xff\xfe\x00garbage", b"{not json", b'{"a": "\xc3\x28"}', b"[1,2", b"null", b"123"])
        return fmt, render_lines(recs) + junk + b"\n", "malformed"
    if how < 0.92:
        data = bytearray(render_lines(recs))
        for _ in range(rng.randint(1, 5)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return fmt, bytes(data), "noise"
    # records dropped, repeated or swapped: a valid stream with findings
    i, j = rng.randrange(n), rng.randrange(n)
    op = rng.choice(["drop", "repeat", "swap"])
    if op == "drop" and n > 1:
        del recs[i]
    elif op == "repeat":
        recs.insert(i, recs[i])
    else:
        recs[i], recs[j] = recs[j], recs[i]
    return fmt, render_lines(recs), "valid"


# ------------------------------------------------------------------ runner


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def run_one(path: Path, fmt: str, main: Callable[[list[str]], int], time_limit: float) -> tuple[str, int | None, str]:
    """(outcome, exit code, stderr): outcome is ok, traceback or hang."""
    out, err = io.StringIO(), io.StringIO()
    signal.setitimer(signal.ITIMER_REAL, time_limit)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["check-log", str(path), "--format", fmt, "--quiet"])
    except Hang:
        return "hang", None, err.getvalue()
    except SystemExit as e:
        return "traceback", None, f"SystemExit({e.code})\n{err.getvalue()}"
    except BaseException:
        return "traceback", None, traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    text = err.getvalue()
    if "Traceback" in text or "internal error" in text or code not in (0, 1, 2):
        return "traceback", code, text
    return "ok", code, text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=5.0, help="seconds one input may take")
    ap.add_argument("--show", type=int, default=5, help="failures to print")
    ap.add_argument("--keep", default=None, metavar="DIR", help="write each failing input to DIR")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from kvspec.cli import main as kvspec_main

    signal.signal(signal.SIGALRM, _alarm)
    rng = random.Random(args.seed)
    s = seeds()
    tally: Counter[str] = Counter()
    failures: list[str] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "input")
        for i in range(args.inputs):
            fmt, data, label = make_input(rng, s)
            path.write_bytes(data)
            outcome, code, err = run_one(path, fmt, kvspec_main, args.time_limit)
            tally[f"{label}:exit{code}"] += 1
            bad = None
            if outcome != "ok":
                bad = outcome
            elif label in ("malformed", "truncated") and code != 2:
                bad = f"{label} input accepted (exit {code})"
            elif label == "truncated" and "truncated" not in err and "ends inside" not in err:
                bad = "truncation not reported as such"
            elif label == "valid" and code == 2:
                bad = "valid input refused"
            if bad is not None:
                tally[f"FAIL {bad.split(' (')[0]}"] += 1
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    Path(args.keep, f"fail-{i}-{fmt}-{label}").write_bytes(data)
                if len(failures) < args.show:
                    failures.append(f"input {i} ({fmt}, {label}): {bad}\n  data: {data[:300]!r}\n  {err[-600:]}")
            if (i + 1) % 10000 == 0:
                print(f"  {i + 1} inputs, {time.monotonic() - t0:.0f} s", file=sys.stderr)
    print(f"fuzzed {args.inputs} inputs in {time.monotonic() - t0:.0f} s (seed {args.seed})")
    for k, v in sorted(tally.items()):
        print(f"  {k:<40} {v}")
    for f in failures:
        print(f)
    fails = sum(v for k, v in tally.items() if k.startswith("FAIL"))
    print(f"fuzz_check_log: {fails} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
