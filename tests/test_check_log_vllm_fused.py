"""The C fast path for vLLM feeds against the Python path of ``kvspec check-log``.

``ZmqFeed`` hands each clean vLLM ``BlockStored``/``BlockRemoved`` to
``fastview.vllm_event`` (copies counting, vLLM's sha256 block hashes
recomputed in C: the pickle of ``(parent digest, tokens, None)`` written
byte for byte and digested with a C SHA-256) and any other event to the
Python path (``_stored``/``_removed`` -> ``RouterView`` -> ``HashCheck``),
which stays the reference. Both must leave the same findings, counts,
statistics, errors, view state and hash-check state, on clean captures and
on captures corrupted in the ways that touch each fall-back branch: a wrong
block hash or token, a parent not stored, a block removed that is not
stored or named twice, a parent removed before its children, a token count
off, extra keys, another KV cache group, hashes as bytes, a Cleared, and a
batch lost, repeated or moved."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import pickle
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.reference.router_view import RECENT_REMOVALS
from kvspec.spec.hashing import vllm_block_hash, vllm_external, vllm_hash_fn, vllm_none_hash
from kvspec.streams import fastview
from kvspec.streams.check import Checker
from kvspec.streams.check_log import add_arguments
from kvspec.streams.formats import CaptureReader
from kvspec.streams.zmqfeed import ZmqFeed

CORRUPTIONS = [
    "none",
    "bad_hash",
    "bad_token",
    "unknown_parent",
    "unknown_removed",
    "dup_in_removed",
    "orphan",
    "token_count",
    "extra_keys",
    "group",
    "bytes_hash",
    "cleared",
    "drop",
    "repeat_other",
    "swap",
]
OPTIONS: list[list[str]] = [[], ["--anchor-tiers", "device"], ["--hash-scheme", "none"], ["--counting", "set"]]
BS = 4
FN = vllm_hash_fn("sha256")
NONE = vllm_none_hash("sha256")
#: the conftest fixture ``check_log_run``
CheckLogRun = Callable[..., tuple[dict[str, Any], Checker, Any]]


def c_module() -> Any:
    mod = fastview.module()
    if mod is None:
        pytest.skip(f"the C extension is not built here: {fastview.status()}")
    return mod


def valid_batches(rng: random.Random, n: int) -> list[list[dict[str, Any]]]:
    """Batches (1-3 events each) of one or two tiers, each a forest of
    sha256-chained blocks, leaves removed first; some prefixes stored again
    (vLLM's copies: another physical block with the same hash)."""
    media = rng.sample(["GPU", "CPU"], rng.randint(1, 2))
    paths: dict[str, list[list[tuple[int, list[int]]]]] = {m: [] for m in media}
    events: list[dict[str, Any]] = []
    for _ in range(n):
        medium = rng.choice(media)
        ps = paths[medium]
        if ps and rng.random() < 0.4:
            i = rng.randrange(len(ps))
            k = rng.randint(1, len(ps[i]))
            gone = [h for h, _ in ps[i][-k:][::-1]]
            del ps[i][-k:]
            if not ps[i]:
                ps.pop(i)
            events.append({"type": "BlockRemoved", "block_hashes": gone, "medium": medium, "group_idx": 0})
            continue
        if ps and rng.random() < 0.15:  # a stored prefix again, from the root: copies counting
            copy = list(rng.choice(ps)[: rng.randint(1, 2)])
            ps.append(copy)
            events.append(stored_event(None, [h for h, _ in copy], [t for _, ts in copy for t in ts], medium))
            continue
        if ps and rng.random() < 0.6:
            p = rng.choice(ps)
        else:
            p = []
            ps.append(p)
        parent = p[-1][0] if p else None
        pfull = FULL[parent] if parent is not None else NONE
        hashes, toks = [], []
        for _ in range(rng.randint(1, 3)):
            t = [rng.choice([0, 7, 255, 256, 70_000, 2**31, 2**32 - 1, rng.randrange(32000)]) for _ in range(BS)]
            pfull = vllm_block_hash("sha256", pfull, t, None, fn=FN)
            h = vllm_external(pfull)
            FULL[h] = pfull
            p.append((h, t))
            hashes.append(h)
            toks += t
        events.append(stored_event(parent, hashes, toks, medium))
    out: list[list[dict[str, Any]]] = []
    while events:
        k = rng.randint(1, 3)
        out.append(events[:k])
        del events[:k]
    return out


#: every digest a generated block has (shared: a hash names one digest)
FULL: dict[int, bytes] = {}


def stored_event(parent: int | None, hashes: list[int], toks: list[int], medium: str) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": toks,
        "block_size": BS,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def corrupt(rng: random.Random, batches: list[list[dict[str, Any]]], how: str) -> list[list[dict[str, Any]]]:
    batches = json.loads(json.dumps(batches))
    evs = [e for b in batches for e in b]
    stored = [e for e in evs if e["type"] == "BlockStored"]
    removed = [e for e in evs if e["type"] == "BlockRemoved"]
    if how == "bad_hash" and stored:
        e = rng.choice(stored)
        e["block_hashes"][rng.randrange(len(e["block_hashes"]))] ^= 1 << rng.randrange(64)
    elif how == "bad_token" and stored:
        e = rng.choice(stored)
        e["token_ids"][rng.randrange(len(e["token_ids"]))] ^= 1
    elif how == "unknown_parent" and stored:
        rng.choice(stored)["parent_block_hash"] = rng.getrandbits(64)
    elif how == "unknown_removed" and removed:
        rng.choice(removed)["block_hashes"].insert(0, rng.getrandbits(64))
    elif how == "dup_in_removed" and removed:
        h = rng.choice(removed)["block_hashes"]
        h.append(h[0])
    elif how == "orphan" and any(len(r["block_hashes"]) > 1 for r in removed):
        rng.choice([r for r in removed if len(r["block_hashes"]) > 1])["block_hashes"].pop(0)  # keep the leaf
    elif how == "token_count" and stored:
        rng.choice(stored)["token_ids"].pop()
    elif how == "extra_keys" and stored:
        e = rng.choice(stored)
        e["extra_keys"][0] = ["lora-a"]
    elif how == "group" and evs:
        rng.choice(evs)["group_idx"] = 1
    elif how == "bytes_hash" and stored:
        e = rng.choice(stored)
        i = rng.randrange(len(e["block_hashes"]))
        e["block_hashes"][i] = {"bytes": FULL.get(e["block_hashes"][i], b"\x01" * 32).hex()}
    elif how == "cleared" and batches:
        rng.choice(batches).append({"type": "AllBlocksCleared"})
    return batches  # drop, repeat, swap: done to the frames (capture)


def capture(rng: random.Random, batches: list[list[dict[str, Any]]], how: str) -> str:
    msgs = []
    for seq, b in enumerate(batches):
        evs = [{**e, "block_hashes": [_h(h) for h in e["block_hashes"]]} if "block_hashes" in e else e for e in b]
        payload = msgpack.packb([0.5, evs, 0])
        msgs.append([b"kv", seq.to_bytes(8, "big"), payload])
    if how in ("drop", "repeat", "repeat_other", "swap") and len(msgs) > 1:
        i = rng.randrange(len(msgs))
        if how == "drop":
            del msgs[i]
        elif how == "repeat":  # at-least-once delivery: the same bytes again
            msgs.insert(i, msgs[i])
        elif how == "repeat_other":  # the same sequence with another batch's payload
            other = msgs[(i + 1) % len(msgs)][2]
            msgs.insert(i + 1, [*msgs[i][:2], other if other != msgs[i][2] else other + b"\x00"])
        else:
            j = rng.randrange(len(msgs))
            msgs[i], msgs[j] = msgs[j], msgs[i]
    lines = []
    for k, parts in enumerate(msgs):
        rec = {
            "msg_idx": k,
            "recv_time_s": 0.0,
            "n_parts": 3,
            "parts_b64": [base64.b64encode(p).decode() for p in parts],
        }
        lines.append(json.dumps(rec) + "\n")
    return "".join(lines)


def _h(h: Any) -> Any:
    return bytes.fromhex(h["bytes"]) if isinstance(h, dict) else h


def run(check_log_run: CheckLogRun, path: Path, opts: list[str], native: bool) -> dict[str, Any]:
    """Everything a run leaves behind: findings, counts, stats, error, view and hash-check state."""
    outcome, checker, reader = check_log_run(path, "zmq", opts, lambda c: CaptureReader(ZmqFeed(c.view, native=native)))
    feed, fs = reader.feed, reader.feed.stats
    return {
        **outcome,
        "stats": (reader.stats.records, fs.events, fs.stored, fs.removed, fs.cleared, fs.lost, fs.duplicates, fs.late),
        "hashes": (
            checker.hashes.checked_blocks,
            checker.hashes.learned,
            {str(k): v for k, v in checker.hashes.full.items()},
        ),
        "native_used": feed._ctx is not None,
    }


def compare(
    check_log_run: CheckLogRun, tmp_path: Path, text: str, options: list[list[str]] = OPTIONS
) -> dict[str, Any]:
    path = tmp_path / "c.zmq.jsonl"
    path.write_text(text)
    first: dict[str, Any] = {}
    for opts in options:
        reference = run(check_log_run, path, opts, False)
        fast = run(check_log_run, path, opts, True)
        for k in reference:
            if k != "native_used":
                assert fast[k] == reference[k], (opts, k)
        if not opts:
            first = fast
    return first


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), how=st.sampled_from(CORRUPTIONS), n=st.integers(2, 40))
def test_fast_path_matches_the_python_path(
    tmp_path: Path, check_log_run: CheckLogRun, seed: int, how: str, n: int
) -> None:
    c_module()
    rng = random.Random(seed)
    compare(check_log_run, tmp_path, capture(rng, corrupt(rng, valid_batches(rng, n), how), how))


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_every_corruption_is_found_by_both_paths(tmp_path: Path, check_log_run: CheckLogRun, how: str) -> None:
    """Each corruption gives findings or an error on some stream (so the
    comparison is not only between clean runs), the same on both paths; a
    clean stream gives none and runs on the fast path."""
    c_module()
    rng = random.Random(how)
    for _ in range(20):
        batches = corrupt(rng, valid_batches(rng, 30), how)
        res = compare(check_log_run, tmp_path, capture(rng, batches, how))
        if how == "none":
            assert res["error"] is None and not res["counts"], res
            assert res["native_used"]
        elif res["error"] is not None or res["counts"]:
            return
    assert how in ("none", "bytes_hash"), f"{how}: 20 corrupted streams all passed"  # bytes: a valid form


def test_a_redelivered_batch_is_skipped_alike(tmp_path: Path, check_log_run: CheckLogRun) -> None:
    """A batch delivered twice, byte for byte, is no finding on either path."""
    rng = random.Random("repeat")
    for _ in range(20):
        res = compare(check_log_run, tmp_path, capture(rng, valid_batches(rng, 30), "repeat"))
        assert res["error"] is None and not res["counts"], res


def test_the_fast_path_is_taken(tmp_path: Path) -> None:
    """A clean capture runs in C: the view's methods see only what comes
    before the hash scheme is learned and each tier's first events."""
    c_module()
    rng = random.Random(3)
    path = tmp_path / "c.zmq.jsonl"
    path.write_text(capture(rng, valid_batches(rng, 300), "none"))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    checker = Checker(parser.parse_args([str(path)]), "zmq")
    view = checker.view
    calls: list[str] = []
    on_stored, on_removed = view.on_stored, view.on_removed
    view.on_stored = lambda *a, **k: (calls.append("s"), on_stored(*a, **k))[1]  # type: ignore[method-assign,func-returns-value]
    view.on_removed = lambda *a, **k: (calls.append("r"), on_removed(*a, **k))[1]  # type: ignore[method-assign,func-returns-value]
    feed = ZmqFeed(view)
    reader = CaptureReader(feed)
    with path.open("rb") as f:
        reader.run(f, view)
    assert not checker.counts
    assert feed.stats.events == 300
    assert checker.hashes.checked_blocks > 300
    assert len(calls) < 30, len(calls)


@settings(max_examples=300, deadline=None)
@given(
    parent=st.binary(max_size=300),
    tokens=st.lists(
        st.one_of(
            st.integers(0, 2**32 - 1),
            st.sampled_from([0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1]),
            st.integers(-5, -1),
            st.integers(2**32, 2**70),
        ),
        max_size=40,
    ),
)
def test_the_c_pickle_is_pickles(parent: bytes, tokens: list[int]) -> None:
    """vLLM hashes the pickle (protocol 5) of (parent, tuple(tokens), None):
    the C writer gives pickle's bytes, or None where it does not apply (then
    the Python path hashes)."""
    mod = c_module()
    got = mod.vllm_pickle(parent, tokens)
    if len(parent) >= 256 or any(not 0 <= t < 2**32 for t in tokens):
        assert got is None
    else:
        assert got == pickle.dumps((parent, tuple(tokens), None), protocol=5)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=600))
def test_the_c_sha256_is_hashlibs(data: bytes) -> None:
    assert c_module().sha256(data) == hashlib.sha256(data).digest()


@pytest.mark.parametrize("how", ["none", "unknown_removed"])
def test_long_captures_rotate_the_recent_removals_alike(tmp_path: Path, check_log_run: CheckLogRun, how: str) -> None:
    """Past RECENT_REMOVALS removals in a tier the view's memory of recent
    removals rotates; both paths rotate it at the same event."""
    c_module()
    rng = random.Random(how)
    batches = corrupt(rng, valid_batches(rng, 14_000), how)
    removed = sum(len(e["block_hashes"]) for b in batches for e in b if e["type"] == "BlockRemoved")
    assert removed > 2 * RECENT_REMOVALS
    compare(check_log_run, tmp_path, capture(rng, batches, how), [[]])
