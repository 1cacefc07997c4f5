"""Request workloads: the file format and the Hypothesis strategies.

A workload is a pool setup (device blocks, block size, optional host tier)
and a list of requests, run one after another or all at once. Generated
workloads look the way traffic does, because that is where the interesting
block-pool behaviour lives:

- prompts are paths in a small tree of shared prefixes (a system prompt, a
  conversation, its follow-ups), so requests hit each other's blocks;
- prompt lengths fall on and off block boundaries (a block-aligned prompt
  recomputes its last block; an unaligned one leaves a partial tail that
  decode fills);
- requests repeat;
- ``max_tokens`` often makes decode fill one or more new blocks;
- the device pool is small enough to evict, and so is the host tier.

Every request fits the pool alone (``prompt + max_tokens - 1 <= capacity *
block_size``): a vLLM-style engine cannot run a larger one (the Dynamo mocker
stalls on it).

File format (JSON lines; a replay file and a finding are the same thing): a
header ``{"kvspec": "request-workload", "version": 1, "setup": {...},
"concurrent": false, "note": "..."}`` then one ``{"prompt": [...],
"max_tokens": N}`` per request. Version 2 adds ``"run"`` to the header: the
implementation and versions of the run that wrote the file (what a block-level
replay header records: ``verdicts/replay_file.recorded_header``) and the
finding's ``"rule"``, so that ``kvspec replay FILE`` runs it against the
implementation that failed. A workload without it (a seed, an adapter's
finding file, a file of an older kvspec) is still a workload; ``kvspec
replay`` needs ``--impl`` to run one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from hypothesis import strategies as st
from pydantic import Field, ValidationError

from kvspec.reference.requests import PoolSetup, RequestSpec
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.profiles import VLLM
from kvspec.spec.wire import Wire

FORMAT: Literal["request-workload"] = "request-workload"
#: the version of a file without a ``run`` (1) and with one (2)
VERSION: Literal[1] = 1
RECORDED_VERSION: Literal[2] = 2


class WorkloadHeader(Wire):
    kvspec: Literal["request-workload"] = FORMAT
    version: Literal[1, 2] = VERSION
    setup: PoolSetup
    concurrent: bool = False
    note: str = ""
    #: the run that wrote the file (version 2): implementation, versions, rule
    run: dict[str, Any] | None = None


class Workload(Wire):
    """A pool setup and the requests to run on it."""

    setup: PoolSetup
    requests: list[RequestSpec] = Field(min_length=1)
    concurrent: bool = False
    note: str = ""
    #: the run that wrote the file (a replay written by the suite), else None
    run: dict[str, Any] | None = None

    def to_jsonl(self) -> str:
        head = WorkloadHeader(
            version=VERSION if self.run is None else RECORDED_VERSION,
            setup=self.setup,
            concurrent=self.concurrent,
            note=self.note,
            run=self.run,
        )
        lines = [head.model_dump_json(exclude_none=True)]
        lines += [json.dumps({"prompt": r.prompt, "max_tokens": r.max_tokens}) for r in self.requests]
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        s = self.setup
        host = f", host tier {s.host_blocks} blocks" if s.host_blocks else ""
        mode = "concurrent" if self.concurrent else "sequential"
        lines = [f"{mode} workload: {s.manager.capacity} device blocks of {s.manager.block_size} tokens{host}"]
        for i, r in enumerate(self.requests):
            toks = r.prompt if len(r.prompt) <= 24 else [*r.prompt[:12], "...", *r.prompt[-6:]]
            lines.append(f"  request {i}: {len(r.prompt)} prompt tokens {toks}, max_tokens={r.max_tokens}")
        return "\n".join(lines)


def parse_workload(text: str, where: str = "workload") -> Workload:
    """Read the JSON-lines form; errors name the line and the field."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ConfigError(f"{where}: empty workload file")
    try:
        head = WorkloadHeader.model_validate_json(lines[0])
    except ValidationError as e:
        raise ConfigError(f"{where}: line 1 is not a request-workload header: {e}") from None
    reqs = []
    for n, ln in enumerate(lines[1:], start=2):
        try:
            reqs.append(RequestSpec.model_validate_json(ln))
        except ValidationError as e:
            raise ConfigError(f"{where}: line {n} is not a request: {e}") from None
    try:
        w = Workload(setup=head.setup, requests=reqs, concurrent=head.concurrent, note=head.note, run=head.run)
    except ValidationError as e:
        raise ConfigError(f"{where}: {e}") from None
    for i, r in enumerate(w.requests):
        head.setup.check_fits(i, r)
    return w


def load_workload(path: Path) -> Workload:
    return parse_workload(path.read_text(), str(path))


def load_workloads(folder: Path) -> list[tuple[Path, Workload]]:
    """Every ``*.jsonl`` workload in ``folder`` (sorted), e.g. an adapter's findings."""
    if not folder.is_dir():
        return []
    return [(p, load_workload(p)) for p in sorted(folder.glob("*.jsonl"))]


def setup_of(capacity: int, block_size: int, host_blocks: int | None = None, dp_rank: int = 0) -> PoolSetup:
    manager = ManagerConfig(
        profile=VLLM.name, capacity=capacity, block_size=block_size, eviction="lru", dp_rank=dp_rank
    )
    return PoolSetup(manager=manager, host_blocks=host_blocks)


# --------------------------------------------------------------- strategies

#: token ids: mostly small, sometimes at the top of the u32 range
TOKENS = st.one_of(st.integers(1, 50_000), st.integers(2**32 - 64, 2**32 - 1))


@st.composite
def pool_setups(draw: Any, *, host: bool | None = None, max_capacity: int = 1_000_000) -> PoolSetup:
    """Small pools: few blocks of few tokens, so that eviction happens."""
    block_size = draw(st.sampled_from([2, 4, 4, 8, 16]))
    capacity = draw(st.integers(min(3, max_capacity), min(12, max_capacity)))
    want_host = draw(st.booleans()) if host is None else host
    host_blocks = draw(st.integers(2, 6)) if want_host else None
    return setup_of(capacity, block_size, host_blocks)


@st.composite
def prefix_tree(draw: Any, block_size: int) -> list[list[int]]:
    """Token paths of a small tree of shared prefixes (root excluded).

    Each node extends a random earlier node by a segment whose length falls
    on or off a block boundary."""
    nodes: list[list[int]] = [[]]
    for _ in range(draw(st.integers(2, 6))):
        parent = draw(st.integers(0, len(nodes) - 1))
        length = block_size * draw(st.integers(1, 3)) if draw(st.booleans()) else draw(st.integers(1, 4 * block_size))
        segment = draw(st.lists(TOKENS, min_size=length, max_size=length))
        nodes.append(nodes[parent] + segment)
    return nodes[1:]


@st.composite
def request_lists(draw: Any, setup: PoolSetup, max_requests: int = 10) -> list[RequestSpec]:
    bs = setup.manager.block_size
    pool = setup.pool_tokens
    paths = draw(prefix_tree(bs))
    out: list[RequestSpec] = []
    for _ in range(draw(st.integers(2, max_requests))):
        if out and draw(st.integers(0, 4)) == 0:  # a repeat of an earlier request
            out.append(draw(st.sampled_from(out)))
            continue
        path = draw(st.sampled_from(paths))
        cut = draw(st.sampled_from(["whole", "whole", "aligned", "any"]))
        if cut == "aligned" and len(path) >= bs:
            length = bs * draw(st.integers(1, len(path) // bs))
        elif cut == "any":
            length = draw(st.integers(1, len(path)))
        else:
            length = len(path)
        prompt = path[: min(length, pool)]
        room = pool - len(prompt) + 1
        max_tokens = draw(st.integers(1, max(1, min(room, 3 * bs + 1))))
        out.append(RequestSpec(prompt=prompt, max_tokens=max_tokens))
    return out


@st.composite
def workloads(
    draw: Any, *, concurrent: bool | None = None, host: bool | None = None, max_capacity: int = 1_000_000
) -> Workload:
    """A workload as traffic looks (see the module docstring)."""
    setup = draw(pool_setups(host=host, max_capacity=max_capacity))
    conc = draw(st.integers(0, 3)) == 0 if concurrent is None else concurrent
    requests = draw(request_lists(setup, max_requests=6 if conc else 10))
    return Workload(setup=setup, requests=requests, concurrent=conc)


# --------------------------------------------------------- seed workloads


def _toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def _w(setup: PoolSetup, reqs: Sequence[tuple[list[int], int]], note: str, concurrent: bool = False) -> Workload:
    return Workload(
        setup=setup, requests=[RequestSpec(prompt=p, max_tokens=m) for p, m in reqs], concurrent=concurrent, note=note
    )


def seed_workloads() -> list[Workload]:
    """Hand-written workloads every run starts with, so that each behaviour
    the layer checks is exercised whatever Hypothesis draws."""
    a, b, c = _toks(1000, 8), _toks(2000, 8), _toks(3000, 8)
    shared = _toks(100, 8)
    return [
        _w(
            setup_of(6, 4),
            [(a, 1), (b, 1), (a, 1), (c, 1), (_toks(4000, 8), 1), (_toks(5000, 8), 1), (_toks(6000, 8), 1)],
            "block-aligned repeat: the last block is recomputed into a second copy; pressure evicts both copies",
        ),
        _w(
            setup_of(8, 4),
            [
                (shared + _toks(200, 6), 3),
                (shared + _toks(300, 4), 6),
                (shared + _toks(200, 6), 2),
                (_toks(400, 12), 1),
                (shared, 2),
            ],
            "shared prefix, partial tails filled by decode, eviction of decode blocks",
        ),
        _w(
            setup_of(32, 4, host_blocks=8),
            [(_toks(1000 * (i + 1), 16), 1) for i in range(4)] + [([*_toks(1000, 16), 7], 1), (_toks(9000, 8), 2)],
            "host tier: write-through batches evicted under pressure, a refreshed batch survives",
        ),
        _w(
            setup_of(8, 4, host_blocks=16),
            [
                (_toks(1000, 16), 1),
                (_toks(5000, 16), 1),
                (_toks(6000, 16), 1),
                (_toks(1000, 16), 1),
                (_toks(1000, 16), 2),
            ],
            "host tier larger than the device: an evicted prompt comes back from the host",
        ),
        _w(
            setup_of(12, 2),
            [(_toks(10, 5), 4), (_toks(10, 5), 4), (_toks(10, 9), 3), (_toks(50, 6), 5)],
            "concurrent requests sharing a prefix",
            concurrent=True,
        ),
    ]
