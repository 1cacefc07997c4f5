"""The fused Dynamo reader against the reference path of ``kvspec check-log``.

``RouterReader`` applies clean events inline (the view's ``on_stored`` and
``on_removed`` and the Dynamo hash chain, fused with the decoding) and hands
any other event to the view's own methods. Both paths must leave the same
findings, counts, statistics, errors and view state. Streams are generated
(a few workers, dp ranks and tiers, each a prefix forest with chained
hashes, leaves removed first; tests/conftest.py) and then corrupted in the ways that touch each
fall-back branch: a parent not stored, a block stored twice or named twice
in one event, a wrong ``tokens_hash`` or ``block_hash``, a hash above 64
bits, an unknown block removed, a parent removed before its children, an
event id out of order, a Cleared, and an event dropped, repeated or moved.
Each stream runs with several option sets (default, no hash checks, device
anchoring only, copies counting, which never fuses)."""

from __future__ import annotations

import argparse
import json
import random
import re
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.reference.router_view import RECENT_REMOVALS
from kvspec.spec.hashing import SEED, chain
from kvspec.streams import fastview, formats
from kvspec.streams.check import Checker
from kvspec.streams.check_log import add_arguments
from kvspec.streams.formats import RouterReader

#: the conftest fixtures ``make_router_stream``, ``corrupt_stream`` and ``check_log_run``
MakeStream = Callable[..., list[dict[str, Any]]]
Corrupt = Callable[[random.Random, list[dict[str, Any]], str], list[dict[str, Any]]]
CheckLogRun = Callable[..., tuple[dict[str, Any], Checker, Any]]

CORRUPTIONS = [
    "none",
    "unknown_parent",
    "stored_twice",
    "dup_in_stored",
    "dup_in_removed",
    "bad_tokens_hash",
    "bad_block_hash",
    "huge_hash",
    "huge_parent",
    "huge_root",
    "unknown_removed",
    "orphan",
    "event_id",
    "cleared",
    "drop",
    "swap",
]
OPTIONS = [[], ["--hash-scheme", "none"], ["--anchor-tiers", "device"], ["--counting", "copies"]]


def run(
    check_log_run: CheckLogRun, path: Path, opts: list[str], fused: bool, native: bool = False, raw: bool = False
) -> dict[str, Any]:
    """Everything a run leaves behind: findings, counts, stats, error, view state."""
    outcome, checker, reader = check_log_run(
        path, "router", opts, lambda c: RouterReader(c.warn, fused=fused, native=native, raw=raw)
    )
    rs = reader.stats
    return {
        **outcome,
        "stats": (rs.records, rs.stored, rs.removed, rs.cleared),
        "hash_blocks": (checker.hashes.checked_blocks, checker.hashes.chain_blocks),
    }


#: the fused paths beside the reference: (name, native, raw)
PATHS = [("Python", False, False), ("C per decoded line", True, False), ("C reading the lines", True, True)]


def compare_file(check_log_run: CheckLogRun, path: Path, options: list[list[str]] = OPTIONS) -> None:
    for opts in options:
        reference = run(check_log_run, path, opts, False)
        for name, native, raw in PATHS:
            fused = run(check_log_run, path, opts, True, native, raw)
            for k in reference:
                assert fused[k] == reference[k], (opts, name, k)


def compare(
    check_log_run: CheckLogRun, tmp_path: Path, events: list[dict[str, Any]], options: list[list[str]] = OPTIONS
) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    compare_file(check_log_run, path, options)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), how=st.sampled_from(CORRUPTIONS), n=st.integers(2, 40))
def test_fused_reader_matches_the_reference_path(
    tmp_path: Path,
    check_log_run: CheckLogRun,
    make_router_stream: MakeStream,
    corrupt_stream: Corrupt,
    seed: int,
    how: str,
    n: int,
) -> None:
    rng = random.Random(seed)
    compare(check_log_run, tmp_path, corrupt_stream(rng, make_router_stream(rng, n), how))


@pytest.mark.parametrize("how", ["none", "unknown_removed", "orphan"])
def test_long_streams_rotate_the_recent_removals_alike(
    tmp_path: Path, check_log_run: CheckLogRun, make_router_stream: MakeStream, corrupt_stream: Corrupt, how: str
) -> None:
    """Past RECENT_REMOVALS removals in a tier the view's memory of recent
    removals rotates; both paths rotate it at the same event."""
    rng = random.Random(how)
    events = corrupt_stream(rng, make_router_stream(rng, 12_000, one_source=True), how)
    removed = sum(len(e["event"]["data"]["removed"]["block_hashes"]) for e in events if "removed" in e["event"]["data"])
    assert removed > 2 * RECENT_REMOVALS
    compare(check_log_run, tmp_path, events, [[]])


def old_leaf_stream(rng: random.Random, n: int, cap: int) -> list[dict[str, Any]]:
    """``n`` events of one source from an LRU cache of ``cap`` blocks: a
    request extends a random cached block by 1-4 blocks (touching its
    prefix), and when the cache is full the least recently used leaves go,
    one Removed naming them, from different branches: the removed blocks are
    the oldest held (the pattern of benchmarks/check_log_throughput.py)."""
    parent: dict[int, int | None] = {}
    kids: dict[int, int] = {}
    last: dict[int, int] = {}
    clock = 0
    out: list[dict[str, Any]] = []

    def emit(data: dict[str, Any]) -> None:
        ev = {"event_id": len(out) + 1, "data": data, "dp_rank": 0}
        out.append({"worker_id": 7, "storage_tier": "device", "residency_domain": "worker", "event": ev})

    while len(out) < n:
        p = rng.choice(list(parent)) if parent and rng.random() < 0.8 else None
        x = p
        while x is not None:
            clock += 1
            last[x] = clock
            x = parent[x]
        k = rng.randint(1, 4)
        gone: list[int] = []
        while len(parent) + k > cap:
            leaf = min((h for h in parent if kids[h] == 0 and h != p), key=last.__getitem__)
            gone.append(leaf)
            q = parent.pop(leaf)
            del kids[leaf], last[leaf]
            if q is not None:
                kids[q] -= 1
        if gone:
            emit({"removed": {"block_hashes": gone}})
        blocks, prev = [], p
        for _ in range(k):
            th = rng.getrandbits(64)
            h = chain(prev, th)
            blocks.append({"block_hash": h, "tokens_hash": th, "mm_extra_info": None})
            parent[h], kids[h] = prev, 0
            if prev is not None:
                kids[prev] += 1
            clock += 1
            last[h] = clock
            prev = h
        emit({"stored": {"parent_hash": p, "start_position": None, "blocks": blocks}})
    return out[:n]


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_old_leaf_eviction_alike(tmp_path: Path, check_log_run: CheckLogRun, corrupt_stream: Corrupt, how: str) -> None:
    """The old-leaf eviction pattern (removals of the oldest blocks, from
    many branches; the C tables grow and move slots back on removal),
    clean and corrupted, leaves the same on every path."""
    rng = random.Random(f"old-leaf {how}")
    events = corrupt_stream(rng, old_leaf_stream(rng, 800, 120), how)
    assert sum("removed" in e["event"]["data"] for e in events) > 150
    compare(check_log_run, tmp_path, events, [[], ["--anchor-tiers", "device"]])


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_every_corruption_is_found_by_both_paths(
    tmp_path: Path, check_log_run: CheckLogRun, make_router_stream: MakeStream, corrupt_stream: Corrupt, how: str
) -> None:
    """Each corruption, on a stream long enough to carry it, gives findings
    or an error (so the comparison above is not only between clean runs),
    the same on both paths."""
    rng = random.Random(how)
    for _ in range(20):
        events = corrupt_stream(rng, make_router_stream(rng, 30), how)
        compare(check_log_run, tmp_path, events)
        path = tmp_path / "s.jsonl"
        res = run(check_log_run, path, [], True)
        if how == "none":
            assert res["error"] is None and not res["counts"], res
        elif res["error"] is not None or res["counts"]:
            return
    assert how == "none", f"{how}: 20 corrupted streams all passed"


def test_a_redelivered_event_is_skipped_alike(
    tmp_path: Path, check_log_run: CheckLogRun, make_router_stream: MakeStream, corrupt_stream: Corrupt
) -> None:
    """An event delivered twice ("repeat": at-least-once delivery) is no
    finding on either path: it is counted and skipped."""
    rng = random.Random("repeat")
    for _ in range(20):
        events = corrupt_stream(rng, make_router_stream(rng, 30), "repeat")
        compare(check_log_run, tmp_path, events)
        res = run(check_log_run, tmp_path / "s.jsonl", [], True)
        assert res["error"] is None and not res["counts"], res


def test_the_c_extension_is_built() -> None:
    """Where a C compiler is (CI has gcc), the fused reader's C part builds
    and loads, so the comparisons above cover it."""
    if fastview.module() is None and "could not be built" in fastview.status() and "compiler" in fastview.status():
        pytest.skip(f"no C compiler here: {fastview.status()}")
    assert fastview.module() is not None, fastview.status()
    assert fastview.status() == "C"


@pytest.mark.parametrize(("native", "raw"), [(False, False), (True, False), (True, True)])
def test_the_fused_path_is_taken(make_router_stream: MakeStream, native: bool, raw: bool) -> None:
    """A clean stream runs fused: the reference methods are not called."""
    rng = random.Random(5)
    events = make_router_stream(rng, 200)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "s.jsonl")
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        checker = Checker(parser.parse_args([str(path)]), "router")
        calls: list[str] = []
        view = checker.view
        on_stored, on_removed = view.on_stored, view.on_removed
        view.on_stored = lambda *a, **k: (calls.append("s"), on_stored(*a, **k))[1]  # type: ignore[method-assign,func-returns-value]
        view.on_removed = lambda *a, **k: (calls.append("r"), on_removed(*a, **k))[1]  # type: ignore[method-assign,func-returns-value]
        reader = RouterReader(checker.warn, native=native, raw=raw)
        decoded = []
        real = formats.ROUTER_DECODER

        class Counting:
            def decode(self, line: bytes) -> Any:
                decoded.append(line)
                return real.decode(line)

        formats.ROUTER_DECODER = Counting()  # type: ignore[assignment]
        try:
            with path.open("rb") as f:
                reader.run(f, view)
        finally:
            formats.ROUTER_DECODER = real
        assert not checker.counts
        if raw and fastview.module() is not None:  # the C reader took the lines: msgspec decoded only the first ones
            assert len(decoded) == len(calls), (len(decoded), len(calls))
        else:
            assert len(decoded) == 200
        # only each source's and tier's first event goes the reference way
        assert len(calls) <= len({(e["worker_id"], e["event"]["dp_rank"], e["storage_tier"]) for e in events})
        assert reader.stats.stored + reader.stats.removed == 200
        # the C reader holds the tiers in its C tables, so the comparisons above cover them
        tables = {
            type(t.live).__name__ + "/" + type(t.kids).__name__ for s in view.sources.values() for t in s.tiers.values()
        }
        native_tables = raw and fastview.module() is not None
        assert tables == ({"LiveTable/KidsTable"} if native_tables else {"dict/dict"}), tables


def test_an_unknown_corruption_is_refused(make_router_stream: MakeStream, corrupt_stream: Corrupt) -> None:
    """A typo in a test's list of corruptions fails instead of corrupting nothing."""
    rng = random.Random(0)
    with pytest.raises(ValueError, match="unknown corruption 'unknwon_parent'"):
        corrupt_stream(rng, make_router_stream(rng, 5), "unknwon_parent")


@settings(max_examples=500, deadline=None)
@given(a=st.integers(0, 2**64 - 1), b=st.integers(0, 2**64 - 1), seed=st.sampled_from([SEED, 0, 1, 2**64 - 1]))
def test_the_c_chain_hash_is_xxhashs(a: int, b: int, seed: int) -> None:
    """The C part checks Dynamo's chain with its own XXH3-64 of the 16 bytes
    (parent, tokens_hash); it must be the xxhash package's."""
    mod = fastview.module()
    if mod is None:
        pytest.skip(f"the C extension is not built here: {fastview.status()}")
    got = mod.xxh3_16(a, b, seed)
    if got is None:
        pytest.skip("no 128-bit integers in this C compiler: the chain goes through the xxhash package")
    assert got == xxhash.xxh3_64_intdigest(struct.pack("<QQ", a, b), seed=seed)


#: changes to one line's text, each one the C line reader either does not
#: take (the line goes the reference way) or must read exactly as msgspec
#: does: (name, pattern, replacement), applied to the first match
TEXT_MUTATIONS: list[tuple[str, str, str]] = [
    ("spaces", r'":', '" :\t'),
    ("spaces_after_comma", r",", " ,  "),
    ("leading_space", r"^", "  "),
    ("crlf", r"$", "\r"),
    ("unknown_top", r"^\{", '{"extra": 1, '),
    ("unknown_block", r'\{"block_hash"', '{"lora_name": null, "block_hash"'),
    ("escaped_key", r'"worker_id"', r'"worker\\u005fid"'),
    ("escaped_block_key", r'"tokens_hash"', r'"tokens\\u005fhash"'),
    ("float", r'"event_id": (\d+)', r'"event_id": \1.0'),
    ("exponent", r'"tokens_hash": (\d+)', r'"tokens_hash": \1e0'),
    ("negative", r'"block_hash": (\d+)', r'"block_hash": -\1'),
    ("leading_zero", r'"event_id": (\d+)', r'"event_id": 0\1'),
    ("above_u64", r'"tokens_hash": \d+', '"tokens_hash": 18446744073709551616'),
    ("u64_max", r'"tokens_hash": \d+', '"tokens_hash": 18446744073709551615'),
    ("huge", r'"block_hash": \d+', '"block_hash": 123456789012345678901234567890'),
    ("string_number", r'"event_id": (\d+)', r'"event_id": "\1"'),
    ("bool_hash", r'"block_hash": \d+', '"block_hash": true'),
    ("dup_key", r'"event_id": (\d+)', r'"event_id": \1, "event_id": \1'),
    ("dup_tier", r'"storage_tier": ("\w+")', r'"storage_tier": \1, "storage_tier": "device"'),
    ("cleared", r'"data": \{.*\}, "dp_rank"', '"data": "cleared", "dp_rank"'),
    ("null_removed", r'"stored": \{', '"removed": null, "stored": {'),
    ("both", r'"stored": \{', '"removed": {"block_hashes": [1]}, "stored": {'),
    ("residency_null", r'"residency_domain": "worker"', '"residency_domain": null'),
    ("residency_text", r'"residency_domain": "worker"', '"residency_domain": "w\u00f6rker"'),
    ("residency_escape", r'"residency_domain": "worker"', r'"residency_domain": "wor\\nker"'),
    ("residency_bad_escape", r'"residency_domain": "worker"', r'"residency_domain": "wor\\xker"'),
    ("no_residency", r'"residency_domain": "worker", ', ""),
    ("no_tier", r'"storage_tier": "\w+", ', ""),
    ("unknown_tier", r'"storage_tier": "\w+"', '"storage_tier": "gpu"'),
    ("no_dp_rank", r', "dp_rank": 0', ""),
    ("dp_above_u32", r'"dp_rank": \d+', '"dp_rank": 4294967296'),
    ("mm_extra", r'"mm_extra_info": null', '"mm_extra_info": {"mm_objects": []}'),
    ("start_position", r'"start_position": null', '"start_position": 5'),
    ("start_above_u32", r'"start_position": null', '"start_position": 4294967296'),
    ("no_start", r', "start_position": null', ""),
    ("no_parent_key", r'"parent_hash": null, ', ""),
    ("empty_blocks", r'"blocks": \[.*\]', '"blocks": []'),
    ("empty_removed", r'"block_hashes": \[.*\]', '"block_hashes": []'),
    ("trailing", r"$", " x"),
    ("trailing_brace", r"$", "}"),
    ("truncated", r".{7}$", ""),
    ("missing_comma", r', "dp_rank"', ' "dp_rank"'),
    ("blank_line", r"^", "\n  \n"),
    ("not_utf8", r'"residency_domain": "worker"', '"residency_domain": "w\udcffrker"'),
]


def _write(path: Path, lines: list[str]) -> None:
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape"))


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32 - 1),
    muts=st.lists(st.sampled_from(TEXT_MUTATIONS), min_size=1, max_size=3),
    compact=st.booleans(),
    n=st.integers(2, 30),
)
def test_the_c_line_reader_reads_every_text_as_msgspec_does(
    tmp_path: Path,
    check_log_run: CheckLogRun,
    make_router_stream: MakeStream,
    seed: int,
    muts: list[tuple[str, str, str]],
    compact: bool,
    n: int,
) -> None:
    """Lines written in other ways (Dynamo's compact form or with spaces,
    keys in any order) and lines changed in ways the C reader of whole lines
    must refuse or read right (escapes, numbers with a sign, fraction,
    exponent or leading zero, out of range, duplicate keys, unknown fields,
    a Cleared, other text, truncation): every path gives the reference's
    findings, counts, error and state."""
    rng = random.Random(seed)
    events = make_router_stream(rng, n)
    if rng.random() < 0.5:  # keys in another order
        events = [dict(rng.sample(list(e.items()), len(e))) for e in events]
    lines = [json.dumps(e) for e in events]
    for _name, pattern, repl in muts:
        i = rng.randrange(len(lines))
        lines[i] = re.sub(pattern, repl, lines[i], count=1)
    if compact:
        lines = [line.replace('", "', '","').replace(": ", ":").replace(", ", ",") for line in lines]
    path = tmp_path / "m.jsonl"
    _write(path, lines)
    compare_file(check_log_run, path, [[], ["--hash-scheme", "none"]])


@pytest.mark.parametrize(("name", "pattern", "repl"), TEXT_MUTATIONS, ids=[m[0] for m in TEXT_MUTATIONS])
def test_each_text_mutation_changes_a_line(
    tmp_path: Path, check_log_run: CheckLogRun, make_router_stream: MakeStream, name: str, pattern: str, repl: str
) -> None:
    """Each mutation above matches the generated lines (a pattern that never
    matches would test nothing), and every path agrees on the result."""
    rng = random.Random(name)
    events = make_router_stream(rng, 40, one_source=True)
    lines = [json.dumps(e) for e in events]
    # every third line from the third: a source's first line goes the
    # reference way whatever it holds; the lines after it test the C reader
    changed = [re.sub(pattern, repl, line, count=1) if i % 3 == 2 else line for i, line in enumerate(lines)]
    assert any(a != b for a, b in zip(lines, changed, strict=True)), name
    path = tmp_path / "m.jsonl"
    _write(path, changed)
    compare_file(check_log_run, path, [[]])


def _split_text(f: Any, limit: int) -> list[tuple[int, bytes, int]]:
    """TextChunks' lines as iter_chunks gives them: (line number, line, unterminated)."""
    out = []
    chunks = formats.TextChunks(f, limit)
    for buf, start, end, last in chunks:
        body = buf[start:end]
        lines = body.split(b"\n")
        if body.endswith(b"\n"):
            lines.pop()
        first = chunks.lineno
        out += [(first + i, line, first if last else 0) for i, line in enumerate(lines)]
        chunks.lineno += len(lines)
    return out


def _outcome(fn: Callable[[], list[tuple[int, bytes, int]]]) -> tuple[list[tuple[int, bytes, int]], str | None]:
    try:
        return fn(), None
    except formats.StreamError as e:
        return [], str(e)


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r\n", b"  ", b"{}"]), max_size=60).map(b"".join),
    chunk=st.integers(1, 17),
    limit=st.integers(1, 12),
)
def test_text_chunks_give_iter_chunks_lines(data: bytes, chunk: int, limit: int) -> None:
    """The buffers the C reader walks in place hold exactly the lines,
    line numbers, unterminated last line and over-long-line errors of the
    list of lines the other paths read, whatever the chunk size."""
    import io

    old = formats.CHUNK
    formats.CHUNK = chunk
    try:
        want = _outcome(
            lambda: [
                (first + i, line, u)
                for first, lines, u in formats.iter_chunks(io.BytesIO(data), limit)
                for i, line in enumerate(lines)
            ]
        )
        got = _outcome(lambda: _split_text(io.BytesIO(data), limit))
    finally:
        formats.CHUNK = old
    assert got == want


@pytest.mark.parametrize("chunk", [1, 13, 97, 400, 1 << 20])
@pytest.mark.parametrize("ending", ["lf", "crlf", "no_final_newline", "blank_lines", "truncated_last"])
def test_chunk_boundaries_do_not_change_the_result(
    tmp_path: Path,
    check_log_run: CheckLogRun,
    make_router_stream: MakeStream,
    corrupt_stream: Corrupt,
    monkeypatch: pytest.MonkeyPatch,
    chunk: int,
    ending: str,
) -> None:
    """The C reader walks each read chunk in place: lines split across
    chunk boundaries (chunks of 1 byte to one whole file), CRLF line ends,
    a file ending without a newline or inside a line, and blank lines give
    every path the reference's findings, counts, error and state; and the
    same result whatever the chunk size. Two corruptions give findings
    (with their line numbers) after lines the C reader stopped at."""
    rng = random.Random(f"{ending}-boundaries")
    events = make_router_stream(rng, 30, one_source=True)
    for how in ("bad_tokens_hash", "unknown_removed", "unknown_parent"):
        events = corrupt_stream(rng, events, how)
    lines = [json.dumps(e) for e in events]
    if ending == "crlf":
        text = "".join(line + "\r\n" for line in lines)
    elif ending == "no_final_newline":
        text = "\n".join(lines)
    elif ending == "blank_lines":
        text = "".join(line + ("\n\n" if i % 4 == 1 else "\n") for i, line in enumerate(lines))
    elif ending == "truncated_last":
        text = "".join(line + "\n" for line in lines)[:-9]
    else:
        text = "".join(line + "\n" for line in lines)
    path = tmp_path / "b.jsonl"
    path.write_text(text)
    reference = run(check_log_run, path, [], False)
    monkeypatch.setattr(formats, "CHUNK", chunk)
    for opts in ([], ["--hash-scheme", "none"]):
        if opts:
            reference = run(check_log_run, path, opts, False)
        for name, native, raw in PATHS:
            got = run(check_log_run, path, opts, True, native, raw)
            for k in reference:
                assert got[k] == reference[k], (opts, name, k)


def _u64_of_json(text: bytes) -> int | None:
    """What the line reader must make of a JSON number's text: the value of
    an unsigned integer without leading zero below 2**64, else None."""
    if not re.fullmatch(rb"0|[1-9][0-9]*", text):
        return None
    v = int(text)
    return v if v < 2**64 else None


@settings(max_examples=2000, deadline=None)
@given(
    text=st.one_of(
        st.integers(0, 2**64 + 10**6).map(lambda v: str(v).encode()),
        st.text("0123456789", min_size=1, max_size=24).map(str.encode),
        st.text("0123456789.eE-+/:", min_size=1, max_size=24).map(str.encode),
    )
)
def test_the_c_number_parser_reads_what_json_means(text: bytes) -> None:
    """The line reader parses digits eight at a time; every length from 1 to
    24 digits, leading zeros, 2**64 - 1 and 2**64, and digits beside the
    characters just before '0' and after '9' read as the JSON text means."""
    mod = fastview.module()
    if mod is None:
        pytest.skip(f"the C extension is not built here: {fastview.status()}")
    assert mod.parse_u64(text) == _u64_of_json(text), text
