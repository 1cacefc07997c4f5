"""Golden scenarios of the allocator-level profiles (``paged``, ``session``).

A file under ``spec/scenarios/paged/`` or ``spec/scenarios/session/`` names
its rules, its source (a seed's own unit test or the rule it pins down), the
manager's configuration and a list of steps: one operation each and what must
come out of it. As for the G1 scenarios (``spec.scenario``), a key left out of
``expect`` is not checked, and expected values are written by hand from the
source, never computed by the model they check.

Physical block ids are the implementation's choice, so a paged scenario
never names one: it states reference counts per sequence (``refs``), which
logical blocks of two sequences must be the same physical block (``shared``)
or must not (``private``), and the values a sequence reads back (``data``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import Field

from kvspec.spec import registry
from kvspec.spec.manager_wire import Admission, ManagerConfigKind, PagedOp, Pressure, SessionOp, SlotView, Tier
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Wire

MANAGER_SCENARIO_DIRS = registry.scenario_dirs("manager")
SCENARIO_ROOT = Path(__file__).parent / "scenarios"

BlockPair = tuple[str, int, str, int]


class ManagerExpect(Wire):
    #: paged: the value the op returns
    value: int | None = None
    #: the op is rejected with this rule (and changes nothing)
    error: RuleId | None = None
    #: paged: what each named sequence reads back (null: not written, any value)
    data: dict[str, list[int | None]] | None = None
    #: paged: reference counts of each named sequence's blocks, in table order
    refs: dict[str, list[int]] | None = None
    #: paged: the pool each named sequence is in
    tiers: dict[str, Tier] | None = None
    #: paged: exactly these sequences are live
    sequences: list[str] | None = None
    #: paged: (seq a, block i, seq b, block j) that are one physical block
    shared: list[BlockPair] | None = None
    #: paged: (seq a, block i, seq b, block j) that are different physical blocks
    private: list[BlockPair] | None = None
    free_device: int | None = None
    free_host: int | None = None
    #: paged: prefix-cache keys, least recently used first
    prefixes: list[str] | None = None
    pressure: Pressure | None = None
    #: session: the admission granted (exactly)
    admission: Admission | None = None
    #: session: the admit is refused under this rule
    refused: RuleId | None = None
    #: session: whether a handle-carrying op acted
    applied: bool | None = None
    drained: list[tuple[int, int]] | None = None
    slots: list[SlotView] | None = None
    idle_lru: list[str] | None = None
    in_flight: list[str] | None = None


class PagedStep(Wire):
    op: PagedOp
    expect: ManagerExpect = ManagerExpect()
    note: str | None = None


class SessionStep(Wire):
    op: SessionOp
    expect: ManagerExpect = ManagerExpect()
    note: str | None = None


class ManagerScenario(Wire):
    name: str
    description: str
    source: str
    rules: Annotated[list[RuleId], Field(min_length=1)]
    config: ManagerConfigKind
    steps: Annotated[list[PagedStep | SessionStep], Field(min_length=1)]


def load_manager_scenario(path: Path) -> ManagerScenario:
    return ManagerScenario.model_validate(json.loads(path.read_text()))


def manager_scenarios(root: Path = SCENARIO_ROOT) -> list[tuple[Path, ManagerScenario]]:
    """Every paged and session scenario, sorted by path."""
    out: list[tuple[Path, ManagerScenario]] = []
    for d in MANAGER_SCENARIO_DIRS:
        out.extend((p, load_manager_scenario(p)) for p in sorted((root / d).glob("*.json")))
    return out
