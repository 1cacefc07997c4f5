"""Which ``reach.System`` is checked from recorded traces (``recorded.py``), and where its traces are kept.

One entry per system too slow to search on every ``kvspec prove``: how to
build it (as the encoding is now), the file and key of its recording, and
the per-call timeout of the offline search (``scripts/gen_reach_traces.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec.reference.smt import recorded
from kvspec.reference.smt.reach import Coverage, System, cover

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


RECORDINGS: dict[str, Recording] = {
    "vllm-operation": Recording(_vllm_op, _HERE / "vllm" / "reach_traces.json", "operation", _vllm_op_search),
    "kvbm-offload-operation": Recording(
        _offload_op, _HERE / "offload" / "reach_traces.json", "operation", _offload_op_search
    ),
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
