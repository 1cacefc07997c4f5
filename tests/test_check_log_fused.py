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
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.conformance.check_log import add_arguments
from kvspec.conformance.streams import fastview
from kvspec.conformance.streams.check import Checker
from kvspec.conformance.streams.formats import RouterReader
from kvspec.reference.router_view import RECENT_REMOVALS
from kvspec.spec.hashing import SEED

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
    "repeat",
    "swap",
]
OPTIONS = [[], ["--hash-scheme", "none"], ["--anchor-tiers", "device"], ["--counting", "copies"]]


def run(check_log_run: CheckLogRun, path: Path, opts: list[str], fused: bool, native: bool = False) -> dict[str, Any]:
    """Everything a run leaves behind: findings, counts, stats, error, view state."""
    outcome, checker, reader = check_log_run(
        path, "router", opts, lambda c: RouterReader(c.warn, fused=fused, native=native)
    )
    rs = reader.stats
    return {
        **outcome,
        "stats": (rs.records, rs.stored, rs.removed, rs.cleared),
        "hash_blocks": (checker.hashes.checked_blocks, checker.hashes.chain_blocks),
    }


def compare(
    check_log_run: CheckLogRun, tmp_path: Path, events: list[dict[str, Any]], options: list[list[str]] = OPTIONS
) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    for opts in options:
        reference = run(check_log_run, path, opts, False)
        for native in (False, True):
            fused = run(check_log_run, path, opts, True, native)
            for k in reference:
                assert fused[k] == reference[k], (opts, "C" if native else "Python", k)


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


def test_the_c_extension_is_built() -> None:
    """Where a C compiler is (CI has gcc), the fused reader's C part builds
    and loads, so the comparisons above cover it."""
    if fastview.module() is None and "could not be built" in fastview.status() and "compiler" in fastview.status():
        pytest.skip(f"no C compiler here: {fastview.status()}")
    assert fastview.module() is not None, fastview.status()
    assert fastview.status() == "C"


@pytest.mark.parametrize("native", [False, True])
def test_the_fused_path_is_taken(make_router_stream: MakeStream, native: bool) -> None:
    """A clean stream runs fused: the reference methods are not called."""
    rng = random.Random(5)
    events = make_router_stream(rng, 200)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "s.jsonl")
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        checker = Checker(parser.parse_args([str(path)]), "router")
        calls = []
        view = checker.view
        on_stored, on_removed = view.on_stored, view.on_removed
        view.on_stored = lambda *a, **k: (calls.append("s"), on_stored(*a, **k))[1]  # type: ignore[method-assign]
        view.on_removed = lambda *a, **k: (calls.append("r"), on_removed(*a, **k))[1]  # type: ignore[method-assign]
        reader = RouterReader(checker.warn, native=native)
        with path.open("rb") as f:
            reader.run(f, view)
        assert not checker.counts
        # only each source's and tier's first event goes the reference way
        assert len(calls) <= len({(e["worker_id"], e["event"]["dp_rank"], e["storage_tier"]) for e in events})
        assert reader.stats.stored + reader.stats.removed == 200


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
