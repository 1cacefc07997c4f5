"""Which ``reach.System`` is checked from recorded traces (``recorded.py``), and where its traces are kept.

One entry per system too slow to search on every ``kvspec prove``: how to
build it (as the encoding is now), the file and key of its recording, and
the offline search whose traces are kept (``scripts/gen_reach_traces.py``).
The block profiles' step level (kvbm, legacy, atomic: ``blocks/reach.py``)
are entries like the others, their traces in ``blocks/reach_traces.json``;
radix's operations (``radix/op_reach.py``) too: the greedy search reaches
every goal there in seconds, but checking its traces pinned costs less.
A system with no recording prints why (``not_checked``) instead of a row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from kvspec.reference.smt import recorded
from kvspec.reference.smt.reach import Coverage, System, cover
from kvspec.spec.profiles import block_semantics
from kvspec.spec.registry import ATOMIC_NAME, KVBM_NAME, LEGACY_NAME

_HERE = Path(__file__).parent
HOW = "python scripts/gen_reach_traces.py"


@dataclass(frozen=True)
class Recording:
    system: Callable[[], System[Any]]
    path: Path
    key: str
    #: the offline search: the coverage whose traces are kept
    search: Callable[[], Coverage]


def _vllm_op() -> System[Any]:
    from kvspec.reference.smt.vllm.reach import op_system

    return op_system()


def _vllm_op_search() -> Coverage:
    """The greedy search to 3 steps (it also checks the listed impossibilities
    unreached there), then the guide's scenarios (``vllm/reach.OP_GUIDE``)."""
    from kvspec.reference.smt.vllm.reach import OP_GUIDE, op_system

    shallow = cover(op_system(depth=3))
    cov = recorded.attribute(op_system(), OP_GUIDE, shallow.reached)
    cov.stale = [*shallow.stale, *cov.stale]
    return cov


def _offload_op() -> System[Any]:
    from kvspec.reference.smt.offload.op_reach import system

    return system()


def _offload_op_search() -> Coverage:
    """The greedy search to 2 steps, then the guide's sequences of operations (``offload/op_reach.OP_GUIDE``)."""
    from kvspec.reference.smt.offload.op_reach import OP_GUIDE, system

    shallow = cover(system(depth=2))
    cov = recorded.attribute(system(), OP_GUIDE, shallow.reached)
    cov.stale = [*shallow.stale, *cov.stale]
    return cov


def _radix_op() -> System[Any]:
    from kvspec.reference.smt.radix.op_reach import system

    return system()


def _radix_op_search() -> Coverage:
    """The greedy search from the empty cache (``radix/op_reach.search``): it reaches every goal."""
    from kvspec.reference.smt.radix.op_reach import search

    return search()


def _block(profile: str) -> System[Any]:
    from kvspec.reference.smt.blocks.catalogue import block_encoding
    from kvspec.reference.smt.blocks.reach import system

    return system(block_encoding(profile))


def _block_search(profile: str, timeout_ms: int = 20_000) -> Coverage:
    """The greedy search of ``blocks/reach.py`` to its depth, then the model-guided
    stage (``blocks/reach.model_guided``) for the goals it left, even where the greedy
    search gave up (the guide pins whole traces: each question is cheap). The greedy
    search of a profile that declares its batch (atomic: a Use is five steps at least)
    gives up too early for that: a scenario run on its model instead
    (``blocks/atomic_reach.py``)."""
    sysm = _block(profile)
    if block_semantics(profile).declares_batch:
        from kvspec.reference.smt.blocks import atomic_reach

        return atomic_reach.search(sysm)
    cov = cover(replace(sysm, guide=None), timeout_ms)
    if cov.missing and sysm.guide is not None:
        sysm.guide(list(cov.missing), cov.reached)
        cov.missing = [g for g in cov.missing if g not in cov.reached]
    return cov


def _block_recording(profile: str) -> Recording:
    return Recording(
        partial(_block, profile), _HERE / "blocks" / "reach_traces.json", profile, partial(_block_search, profile)
    )


RECORDINGS: dict[str, Recording] = {
    **{f"{name}-step": _block_recording(name) for name in (KVBM_NAME, LEGACY_NAME, ATOMIC_NAME)},
    "vllm-operation": Recording(_vllm_op, _HERE / "vllm" / "reach_traces.json", "operation", _vllm_op_search),
    "kvbm-offload-operation": Recording(
        _offload_op, _HERE / "offload" / "reach_traces.json", "operation", _offload_op_search
    ),
    "radix-operation": Recording(_radix_op, _HERE / "radix" / "reach_traces.json", "operation", _radix_op_search),
}


def recorded_for(key: str) -> bool:
    rec = RECORDINGS[key]
    return recorded.load(rec.path, rec.key) is not None


def not_checked(key: str) -> str:
    """The line a REACHABLE row prints instead when ``key`` has no recording."""
    sysm = RECORDINGS[key].system()
    return f"REACHABLE: not checked for {sysm.profile} {sysm.level} (no recorded traces; {HOW} {key})"


def check(key: str, system: System[Any] | None = None) -> recorded.Checked:
    """The recorded traces of ``key`` checked against ``system`` (default: the encoding as it is now)."""
    rec = RECORDINGS[key]
    return recorded.check(system or rec.system(), recorded.load(rec.path, rec.key), f"{HOW} {key}")
