"""Fixtures shared by the tests.

- For the end-to-end tests that run the suite as a port author would: an
  adapter written outside the tree (the reference, except that it never
  publishes a Removed, so every run has a failure to show) and child
  processes of pytest and of the ``kvspec`` command that import it.
- For the differential tests of ``kvspec check-log``: generated Dynamo
  router streams (prefix forests with Dynamo's hash chain) and named ways
  to corrupt them.

They are fixtures rather than an imported module because the tests are
collected with ``--import-mode=importlib`` and no package: a test module
cannot import a sibling, but every test sees this file's fixtures.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from kvspec.spec.hashing import chain

#: the module the adapter's manifest starts (``drops_removed_adapter:open_drops_removed``)
DROPS_REMOVED_MODULE = """
from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.spec.wire import StepOutcome


class DropsRemoved(ReferenceImplementation):
    def step(self, op):
        out = super().step(op)
        kept = [e for e in out.events if e.kind != "removed"]
        return StepOutcome.model_construct(**{**out.__dict__, "events": kept})


def open_drops_removed(config, manifest, adapter_dir):
    return DropsRemoved(config, manifest)
"""


def child_env(tmp: Path) -> dict[str, str]:
    """The environment of a child run: this run's own PYTEST_* variables
    removed (they would make the child believe it is a worker of this run)
    and ``tmp`` first on the import path, where the adapter's module is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(tmp) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(argv: list[str], cwd: Path, tmp: Path, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    full_env = {**child_env(tmp), **(env or {})}
    proc = subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def drops_removed_adapter(tmp_path: Path) -> Callable[[str], Path]:
    """Write the adapter to ``tmp_path/NAME`` (a kvbm-profile manifest with the
    lineage and lru policies) and its module next to it; return the folder."""

    def make(name: str) -> Path:
        (tmp_path / "drops_removed_adapter.py").write_text(DROPS_REMOVED_MODULE)
        folder = tmp_path / name
        folder.mkdir()
        (folder / "manifest.toml").write_text(
            textwrap.dedent(
                f"""
                name = "{name}"
                kind = "python"
                profile = "kvbm"
                [start]
                python = "drops_removed_adapter:open_drops_removed"
                [capabilities]
                profiles = ["kvbm"]
                policies = ["lineage", "lru"]
                """
            )
        )
        return folder

    return make


@pytest.fixture
def child_pytest(tmp_path: Path) -> Callable[..., tuple[int, str]]:
    """Run pytest in a child process from ``tmp_path`` with the given
    arguments and no cache; return its exit code and its output (stdout then
    stderr). The replay files go under ``tmp_path/replays`` unless
    ``replay_dir=False`` (then where the working dir says); ``env`` adds to
    the child's environment."""

    def run(*args: str, replay_dir: bool = True, env: dict[str, str] | None = None) -> tuple[int, str]:
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
        if replay_dir:
            argv.append(f"--kvspec-replay-dir={tmp_path / 'replays'}")
        return _run([*argv, *args], tmp_path, tmp_path, 300, env)

    return run


@pytest.fixture
def child_kvspec(tmp_path: Path) -> Callable[[list[str], Path], tuple[int, str]]:
    """Run a ``kvspec ...`` command line (as printed by a hint) in a child
    process from ``cwd``; return its exit code and its output."""

    def run(cmd: list[str], cwd: Path) -> tuple[int, str]:
        assert cmd[0] == "kvspec", cmd
        return _run([sys.executable, "-m", "kvspec", *cmd[1:]], cwd, tmp_path, 120)

    return run


#: the worker ids streams are drawn from (one above 2**63, as Dynamo's u64 ids can be)
WORKERS = [3, 11, 2**63 + 5]


def router_stream(
    rng: random.Random, n: int, *, tiers: Sequence[str] | None = None, one_source: bool = False
) -> list[dict[str, Any]]:
    """``n`` Dynamo router events of 1-2 workers x 1-2 dp ranks x the given
    storage ``tiers`` (None: 1-2 of device and host_pinned drawn from
    ``rng``; ``one_source``: one worker, rank and tier). Each source and tier
    is a forest of paths whose block hashes chain as Dynamo's do; a Removed
    takes 1 or more blocks off the end of one path, leaves first, so the
    stream is clean. Event ids count from 1 per worker and dp rank."""
    workers = rng.sample(WORKERS, 1 if one_source else rng.randint(1, 2))
    if tiers is None:
        tiers = rng.sample(["device", "host_pinned"], 1 if one_source else rng.randint(1, 2))
    keys = [(w, d, t) for w in workers for d in range(1 if one_source else rng.randint(1, 2)) for t in tiers]
    paths: dict[tuple[int, int, str], list[list[int]]] = {k: [] for k in keys}
    next_id: dict[tuple[int, int], int] = {}
    out = []
    for _ in range(n):
        key = rng.choice(keys)
        ps = paths[key]
        if ps and rng.random() < 0.45:
            i = rng.randrange(len(ps))
            k = rng.randint(1, len(ps[i]))
            gone = ps[i][-k:][::-1]
            del ps[i][-k:]
            if not ps[i]:
                ps.pop(i)
            data: Any = {"removed": {"block_hashes": gone}}
        else:
            if ps and rng.random() < 0.6:
                p = rng.choice(ps)
            else:
                p = []
                ps.append(p)
            parent = p[-1] if p else None
            blocks, prev = [], parent
            for _ in range(rng.randint(1, 4)):
                th = rng.getrandbits(64)
                prev = chain(prev, th)
                blocks.append({"block_hash": prev, "tokens_hash": th, "mm_extra_info": None})
                p.append(prev)
            data = {"stored": {"parent_hash": parent, "start_position": None, "blocks": blocks}}
        src = key[:2]
        eid = next_id.get(src, 1)
        next_id[src] = eid + 1
        ev = {"event_id": eid, "data": data, "dp_rank": key[1]}
        out.append({"worker_id": key[0], "storage_tier": key[2], "residency_domain": "worker", "event": ev})
    return out


def corrupt_router_stream(rng: random.Random, events: list[dict[str, Any]], how: str) -> list[dict[str, Any]]:
    """A copy of ``events`` corrupted once in the way ``how`` names, at a
    place drawn from ``rng``; unchanged for "none" and where the stream has
    nothing to corrupt that way (fewer than 2 events, no Stored, ...). An
    unknown name is an error (on any stream of 2 or more events), so a
    test's list of corruptions cannot hold a typo that corrupts nothing."""
    events = json.loads(json.dumps(events))
    if how == "none" or len(events) < 2:
        return events
    i = rng.randrange(len(events))
    stored = [e["event"]["data"]["stored"] for e in events if "stored" in e["event"]["data"]]
    removed = [e["event"]["data"]["removed"] for e in events if "removed" in e["event"]["data"]]
    if how == "unknown_parent":
        if stored:
            rng.choice(stored)["parent_hash"] = rng.getrandbits(64)
    elif how == "stored_twice":
        j = rng.randrange(len(events))
        events.insert(j, json.loads(json.dumps(events[i])))
    elif how == "dup_in_stored":
        if stored:
            b = rng.choice(stored)["blocks"]
            b.append(dict(b[0]))
    elif how == "dup_in_removed":
        if removed:
            h = rng.choice(removed)["block_hashes"]
            h.append(h[0])
    elif how == "bad_tokens_hash":
        if stored:
            b = rng.choice(rng.choice(stored)["blocks"])
            b["tokens_hash"] ^= 1
    elif how == "bad_block_hash":
        if stored:
            b = rng.choice(rng.choice(stored)["blocks"])
            b["block_hash"] ^= 1 << rng.randrange(64)
    elif how == "huge_hash":
        if stored:
            b = rng.choice(rng.choice(stored)["blocks"])
            b[rng.choice(["block_hash", "tokens_hash"])] += 2**64
    elif how == "huge_parent":
        if stored:
            rng.choice(stored)["parent_hash"] = 2**64 + rng.getrandbits(8)
    elif how == "huge_root":
        if any(x["parent_hash"] is None for x in stored):
            b = rng.choice([x for x in stored if x["parent_hash"] is None])["blocks"]
            del b[1:]  # a root block alone: its hash is its tokens_hash, on no chain
            b[0]["block_hash"] = b[0]["tokens_hash"] = 2**64 + rng.getrandbits(8)
    elif how == "unknown_removed":
        if removed:
            rng.choice(removed)["block_hashes"].insert(0, rng.getrandbits(64))
    elif how == "orphan":
        if any(len(r["block_hashes"]) > 1 for r in removed):
            rng.choice([r for r in removed if len(r["block_hashes"]) > 1])["block_hashes"].pop(0)  # keep the leaf
    elif how == "event_id":
        events[i]["event"]["event_id"] += rng.choice([-1, 1, 5])
    elif how == "cleared":
        events[i]["event"]["data"] = "cleared"
    elif how == "drop":
        del events[i]
    elif how == "repeat":
        events.insert(i, json.loads(json.dumps(events[i])))
    elif how == "swap":
        j = rng.randrange(len(events))
        events[i], events[j] = events[j], events[i]
    elif how == "wrong_worker":
        events[i]["worker_id"] = 9
    else:
        raise ValueError(f"unknown corruption {how!r}")
    return events


@pytest.fixture(scope="session")
def make_router_stream() -> Callable[..., list[dict[str, Any]]]:
    """``router_stream`` (session-scoped, so Hypothesis tests may take it)."""
    return router_stream


@pytest.fixture(scope="session")
def corrupt_stream() -> Callable[[random.Random, list[dict[str, Any]], str], list[dict[str, Any]]]:
    """``corrupt_router_stream`` (session-scoped, so Hypothesis tests may take it)."""
    return corrupt_router_stream
