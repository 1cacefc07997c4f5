"""Golden scenarios of one process with several kvbm workers (``scenarios/tiers/``).

The lower tiers (G3 disk, G4 object store) are shared by every worker of a
process, so their goldens drive several workers: each step names the worker
its operation goes to and expects the events of every worker (a step may
publish on another worker's stream, SPEC.md "Lower tiers"). Expectations
follow ``scenario.Expect``: a field left out is not checked, an explicit
``"result": null`` is.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field, model_validator

from kvspec.spec.config import ManagerConfig
from kvspec.spec.rules import RuleId
from kvspec.spec.scenario import SCENARIO_DIR
from kvspec.spec.wire import KvEvent, Operation, Status, Wire

TIERS_DIR = SCENARIO_DIR / "tiers"


class ProcessExpect(Wire):
    result: int | bool | None = None
    status: Status | None = None
    error: RuleId | None = None
    #: worker id (as a string key) -> exactly the events it publishes in this
    #: step; a worker left out publishes none
    events: dict[str, list[KvEvent]] | None = None
    #: worker id -> the blocks its G2 holds (any order)
    g2: dict[str, list[int]] | None = None
    #: the blocks G3 / G4 hold (any order)
    g3: list[int] | None = None
    g4: list[int] | None = None
    #: exactly the inactive full blocks of the step's worker (any order)
    inactive: list[int] | None = None
    #: the step's worker's earliest pending deadline
    earliest_deadline_ms: float | None = None


class ProcessStepSpec(Wire):
    note: str | None = None
    worker: int = Field(default=0, ge=0)
    op: Operation
    expect: ProcessExpect


class ProcessScenario(Wire):
    name: str
    description: str
    source: str
    rules: list[RuleId]
    config: ManagerConfig
    workers: int = Field(ge=1, le=64)
    steps: list[ProcessStepSpec]

    @model_validator(mode="after")
    def _workers_exist(self) -> ProcessScenario:
        for i, s in enumerate(self.steps):
            if s.worker >= self.workers:
                raise ValueError(f"step {i} names worker {s.worker}; the process has {self.workers}")
            for k in (s.expect.events or {}) | (s.expect.g2 or {}):
                if not 0 <= int(k) < self.workers:
                    raise ValueError(f"step {i} expects worker {k}; the process has {self.workers}")
        return self


def load_process_scenario(path: Path) -> ProcessScenario:
    return ProcessScenario.model_validate(json.loads(path.read_text()))


def tier_scenarios(directory: Path = TIERS_DIR) -> list[tuple[Path, ProcessScenario]]:
    return [(p, load_process_scenario(p)) for p in sorted(directory.glob("*.json"))]
