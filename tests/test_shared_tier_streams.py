"""TIER-DEDUP in the router view and check-log: a tier the workers of one process share.

Dynamo's kvbm mocker shares G3 (disk) and G4 (external) among the workers of a
process (SPEC.md, "Lower tiers"). Under ``lower_tier_events = "owner"`` a
block lands there once and only its owner announces it, so a stream where a
second worker Stores a block another worker holds in the shared tier breaks
TIER-DEDUP, and a Removed from a worker that never stored the block breaks
REMOVE-EXACT (the per-worker rule: a G3 eviction published by the wrong worker).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.reference.router_view import RouterView
from kvspec.spec.hashing import chain


def _stored_disk(view: RouterView, worker: int, eid: int, h: int, tier: str = "disk") -> None:
    view.on_stored(worker, 0, tier, eid, None, [h])


def test_a_second_worker_storing_a_shared_block_breaks_tier_dedup() -> None:
    view = RouterView(keep=None, shared_tiers=("disk",))
    _stored_disk(view, 0, 0, 11)
    _stored_disk(view, 1, 0, 11)
    assert [str(v.rule) for v in view.violations] == ["TIER-DEDUP"]
    assert "Stored by worker 0" in view.violations[0].message


def test_without_shared_tiers_each_worker_has_its_own_disk() -> None:
    view = RouterView(keep=None)
    _stored_disk(view, 0, 0, 11)
    _stored_disk(view, 1, 0, 11)
    assert view.violations == []


def test_after_the_owner_removes_it_another_worker_may_store_it() -> None:
    view = RouterView(keep=None, shared_tiers=("disk", "external"))
    _stored_disk(view, 0, 0, 11)
    view.on_removed(0, 0, "disk", 1, [11])
    _stored_disk(view, 1, 0, 11)
    _stored_disk(view, 1, 1, 12, tier="external")
    _stored_disk(view, 0, 2, 12, tier="host_pinned")  # not a shared tier
    assert view.violations == []


def test_an_eviction_published_by_the_wrong_worker_breaks_remove_exact() -> None:
    view = RouterView(keep=None, shared_tiers=("disk",))
    _stored_disk(view, 0, 0, 11)
    view.on_removed(1, 0, "disk", 0, [11])
    assert [str(v.rule) for v in view.violations] == ["REMOVE-EXACT"]
    _stored_disk(view, 1, 1, 11)  # worker 0 still holds it
    assert [str(v.rule) for v in view.violations][-1] == "TIER-DEDUP"


def _line(worker: int, eid: int, data: object, tier: str) -> str:
    return json.dumps(
        {"worker_id": worker, "storage_tier": tier, "event": {"event_id": eid, "data": data, "dp_rank": 0}}
    )


def test_check_log_applies_tier_dedup_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h = chain(None, 5)
    block = {"block_hash": h, "tokens_hash": 5, "mm_extra_info": None}
    stored = {"stored": {"parent_hash": None, "start_position": None, "blocks": [block]}}
    path = tmp_path / "two-workers.jsonl"
    path.write_text(_line(3, 1, stored, "disk") + "\n" + _line(4, 1, stored, "disk") + "\n")
    assert main(["check-log", str(path)]) == 0
    capsys.readouterr()
    assert main(["check-log", str(path), "--shared-tier", "disk"]) == 1
    out = capsys.readouterr().out
    assert "TIER-DEDUP" in out
