"""The C block tables (``fastview`` LiveTable, KidsTable) against a dict.

The raw Dynamo reader holds each tier's live blocks and child counts in
them (``RouterView.use_tables``), and the view's Python code works on them
as on the dicts it uses otherwise; so every operation the view uses must
give what a dict gives, for keys and values the tables hold in their slots
(ints in [0, 2**64), records of such ints) and for any other, which they
keep in a dict beside the slots. Random operation sequences run on a table
and a dict side by side, with keys drawn from a small range so that inserts,
overwrites and removals of the same keys meet (and slots move back on
removal), and sizes grow past several resizes."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.spec.hashing import chain
from kvspec.streams import fastview
from kvspec.streams.check import Checker
from kvspec.streams.check_log import add_arguments
from kvspec.streams.formats import RouterReader

U64 = 2**64 - 1


def module() -> Any:
    mod = fastview.module()
    if mod is None:
        pytest.skip(f"the C extension is not built here: {fastview.status()}")
    return mod


def live_key(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.9:
        return rng.randrange(64)
    return rng.choice([U64, U64 + 1, -1, -(2**70), "a", b"\x01", 2**63])


def live_value(rng: random.Random) -> Any:
    r = rng.random()
    parent = rng.choice([None, rng.randrange(64), U64])
    if r < 0.8:
        return (rng.randrange(1, 4), parent, rng.choice([rng.randrange(10), -1, U64]), rng.choice([0, 5, -1]))
    # what the slots cannot hold: the dict beside them
    return rng.choice(
        [
            (2**40, parent, 1, 1),
            (1, U64 + 1, 1, 1),
            (1, -5, 1, 1),
            (1, None, -2, 1),
            (1, None, U64 + 1, 1),
            (1, None, 1, 2**63),
            (1, None, 1),
            [1, None, 1, 1],
            (True, None, 1, 1),
            "x",
        ]
    )


def kids_value(rng: random.Random) -> Any:
    return rng.choice([rng.randrange(5), -1, 2**31, -(2**31) - 1, 2**31 - 1, "x", 1.5])


def run_ops(table: Any, rng: random.Random, n: int, key: Any, value: Any) -> None:
    ref: dict[Any, Any] = {}
    for step in range(n):
        k = key(rng)
        op = rng.randrange(9)
        if op == 0:
            v = value(rng)
            table[k] = v
            ref[k] = v
        elif op == 1:
            assert table.get(k) == ref.get(k)
            assert table.get(k, "d") == ref.get(k, "d")
        elif op == 2:
            assert table.pop(k, "d") == ref.pop(k, "d")
        elif op == 3:
            if k in ref:
                assert table.pop(k) == ref.pop(k)
            else:
                with pytest.raises(KeyError):
                    table.pop(k)
        elif op == 4:
            v = value(rng)
            got = table.setdefault(k, v)
            if k in ref:
                assert got == ref[k]
            else:
                assert got is v  # the default itself: the view tests ``rec is new``
                ref[k] = v
        elif op == 5:
            if k in ref:
                del table[k]
                del ref[k]
            else:
                with pytest.raises(KeyError):
                    del table[k]
        elif op == 6:
            assert (k in table) == (k in ref)
            if k in ref:
                assert table[k] == ref[k]
            else:
                with pytest.raises(KeyError):
                    table[k]
        elif op == 7 and rng.random() < 0.01:
            table.clear()
            ref.clear()
        elif op == 8 and rng.random() < 0.5:  # many live keys at once: resizes
            for _ in range(rng.randrange(50)):
                kk = rng.randrange(2**64)
                v = value(rng)
                table[kk] = v
                ref[kk] = v
        assert len(table) == len(ref), step
        if step % 97 == 0:
            assert dict(table) == ref
            assert sorted(map(repr, table.keys())) == sorted(map(repr, ref.keys()))
            assert sorted(map(repr, table.values())) == sorted(map(repr, ref.values()))
            assert sorted(map(repr, table.items())) == sorted(map(repr, ref.items()))
            assert sorted(map(repr, table)) == sorted(map(repr, ref))
            assert bool(table) == bool(ref)
    assert dict(table) == ref


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_live_table_is_a_dict(seed: int) -> None:
    run_ops(module().LiveTable(), random.Random(seed), 3000, live_key, live_value)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_kids_table_is_a_dict(seed: int) -> None:
    run_ops(module().KidsTable(), random.Random(seed), 3000, live_key, kids_value)


def test_records_come_back_as_stored() -> None:
    """A record the slots hold is handed back field for field (the
    PRESUMED event id and index, -1, included)."""
    t = module().LiveTable()
    recs = [(1, None, 0, 0), (3, U64, U64, 2**63 - 1), (1, 7, -1, -1), (-(2**31), 0, 5, -(2**63))]
    for i, r in enumerate(recs):
        t[i] = r
    assert [t[i] for i in range(len(recs))] == recs
    assert all(type(x) is int or x is None for r in t.values() for x in r)


def test_a_value_moves_between_slots_and_the_dict() -> None:
    """A key overwritten with a value the slots cannot hold (and back) is
    held once, in one place."""
    t = module().LiveTable()
    t[5] = (1, None, 1, 1)
    t[5] = (1, None, 1, 2**70)
    assert len(t) == 1 and t[5] == (1, None, 1, 2**70)
    t[5] = (2, None, 1, 1)
    assert len(t) == 1 and t[5] == (2, None, 1, 1) and dict(t) == {5: (2, None, 1, 1)}
    del t[5]
    assert len(t) == 0 and 5 not in t


def test_the_tables_take_no_arguments() -> None:
    mod = module()
    for make in (mod.LiveTable, mod.KidsTable):
        with pytest.raises(TypeError):
            make({1: 2})


def test_a_child_count_out_of_the_slots_range_goes_the_python_way(tmp_path: Path) -> None:
    """The C line reader leaves a Stored whose parent's child count would
    not fit a slot (2**31 - 1 already) to the Python path, which keeps the
    count exact (beside the slots), and likewise a Removed whose parent's
    count could fall below the slots' range."""
    module()
    root = chain(None, 11)
    leaf = chain(root, 12)
    blocks = [{"block_hash": h, "tokens_hash": th, "mm_extra_info": None} for h, th in ((root, 11), (leaf, 12))]
    more = {"block_hash": chain(leaf, 13), "tokens_hash": 13, "mm_extra_info": None}

    def line(eid: int, data: dict[str, Any]) -> str:
        ev = {"event_id": eid, "data": data, "dp_rank": 0}
        return json.dumps({"worker_id": 7, "storage_tier": "device", "event": ev}) + "\n"

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    first = tmp_path / "a.jsonl"
    first.write_text(line(1, {"stored": {"parent_hash": None, "start_position": None, "blocks": blocks}}))
    checker = Checker(parser.parse_args([str(first), "--quiet"]), "router")
    view = checker.view
    with first.open("rb") as f:
        RouterReader(checker.warn, native=True, raw=True).run(f, view)
    tier = view.sources[(7, 0)].tiers["device"]
    assert type(tier.kids).__name__ == "KidsTable"
    tier.kids[leaf] = 2**31 - 1
    second = tmp_path / "b.jsonl"
    second.write_text(line(2, {"stored": {"parent_hash": leaf, "start_position": None, "blocks": [more]}}))
    with second.open("rb") as f:
        RouterReader(checker.warn, native=True, raw=True).run(f, view)
    assert tier.kids[leaf] == 2**31
    tier.kids[leaf] = -(2**31)  # back in the slots
    third = tmp_path / "c.jsonl"
    third.write_text(line(3, {"removed": {"block_hashes": [more["block_hash"]]}}))
    with third.open("rb") as f:
        RouterReader(checker.warn, native=True, raw=True).run(f, view)
    assert tier.kids[leaf] == -(2**31) - 1
    assert not checker.counts
