"""Golden scenario files: operations in, results, counters and events out.

A scenario is a JSON file under ``spec/scenarios/``. It names the rules it
exercises, the profile and configuration it runs under, the capabilities an
implementation needs to run it, and a list of steps. Each step holds one
operation and what must come out of it: the result, or the rule id of the
error that must reject it; the events, exactly (ids, tiers, hashes, parents,
token ids); and any counters or block states to check. A key left out of
``expect`` is not checked; ``"events": []`` checks that nothing was published.

Expected values are written by hand from the source they cite (a seed's unit
test, a witness), never computed by the model they check.

Most scenarios do not depend on which block an eviction picks (nothing is
evicted, or only one block can go). Such a scenario says so with
``"policies": "any"`` (or lists the policies it holds under) and runs under
each of them that the implementation declares, so that a port with a single
eviction policy still runs it; the policy is pinned (``config.eviction``,
no ``policies``) only where the victim matters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from kvspec.spec import registry
from kvspec.spec.config import ManagerConfig, PolicyName
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Operation, Status, Wire

SCENARIO_DIR = Path(__file__).parent / "scenarios"


class Expect(Wire):
    result: int | bool | None = None
    status: Status | None = None
    #: the operation must be rejected with this rule id (and change nothing)
    error: RuleId | None = None
    events: list[KvEvent] | None = None
    #: counters to check (any subset of the Counters fields)
    counters: dict[str, int] | None = None
    #: exact owner counts of the active full blocks (hash as a string key)
    active: dict[str, int] | None = None
    #: exactly the inactive full blocks (any order)
    inactive: list[int] | None = None
    #: blocks that must be registered in the host-pinned tier (any order)
    g2: list[int] | None = None
    earliest_deadline_ms: float | None = None

    @field_validator("active")
    @classmethod
    def _int_keys(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        if v is not None:
            for k in v:
                int(k)
        return v


class ScenarioStep(Wire):
    op: Operation
    expect: Expect = Expect()
    note: str | None = None


class Scenario(Wire):
    name: str
    description: str
    #: where the expected values come from (a seed test, a witness, an issue)
    source: str
    rules: Annotated[list[RuleId], Field(min_length=1)]
    config: ManagerConfig
    #: capabilities an implementation must declare to run this scenario
    requires: list[str] = []
    #: the eviction policies the expectations hold under: "any" (every policy
    #: the profile allows: no step depends on the victim), a list (which must
    #: include ``config.eviction``), or None: pinned to ``config.eviction``
    policies: Literal["any"] | list[PolicyName] | None = None
    steps: Annotated[list[ScenarioStep], Field(min_length=1)]

    @model_validator(mode="after")
    def _policies_are_consistent(self) -> Scenario:
        if isinstance(self.policies, list):
            if self.config.eviction not in self.policies:
                raise ValueError(f"policies {self.policies} must include config.eviction {self.config.eviction!r}")
            if len(set(self.policies)) != len(self.policies):
                raise ValueError(f"policies {self.policies} lists a policy twice")
        if self.policies is not None and any(r.startswith("policy:") for r in self.requires):
            raise ValueError("a scenario with 'policies' runs under each of them: leave policy:* out of 'requires'")
        for policy in self.run_policies():
            self.config_for(policy)  # raises for a policy the profile does not allow
        return self

    def run_policies(self) -> list[PolicyName]:
        """The policies this scenario runs under, ``config.eviction`` first."""
        if self.policies is None:
            return [self.config.eviction]
        if self.policies == "any":
            allowed: list[PolicyName] = [self.config.eviction]
            for p in get_args(PolicyName):
                if p != self.config.eviction and _allows(self.config, p):
                    allowed.append(p)
            return allowed
        return [self.config.eviction, *(p for p in self.policies if p != self.config.eviction)]

    def config_for(self, policy: PolicyName) -> ManagerConfig:
        """The configuration under ``policy`` (validated: a profile that
        allows one policy only refuses the others)."""
        if policy == self.config.eviction:
            return self.config
        return ManagerConfig.model_validate({**self.config.model_dump(), "eviction": policy})


def _allows(config: ManagerConfig, policy: PolicyName) -> bool:
    try:
        ManagerConfig.model_validate({**config.model_dump(), "eviction": policy})
    except ValueError:
        return False
    return True


def load_scenario(path: Path) -> Scenario:
    return Scenario.model_validate(json.loads(path.read_text()))


def all_scenarios(directory: Path = SCENARIO_DIR) -> list[tuple[Path, Scenario]]:
    """Every scenario file under ``directory`` (recursively), sorted by path;
    the allocator-level folders (``paged/``, ``session/``), ``radix/`` and ``tiers/`` have their own
    format (``spec.manager_scenario``, ``spec.radix_wire``) and are left out."""
    # every registered folder not in this format: the allocator-level, radix and multi-worker ones
    skip = {directory / d for d in set(registry.all_scenario_dirs()) - set(registry.scenario_dirs("block"))}
    return [(p, _load_unchanged(p)) for p in sorted(directory.rglob("*.json")) if not skip & set(p.parents)]


#: parsed scenario files by (path, modification time, size): a file is parsed
#: again when it changes, and a process that forks (``kvspec mutants``'s fork
#: server) parses each file once for all its children
_PARSED: dict[tuple[str, int, int], Scenario] = {}


def _load_unchanged(path: Path) -> Scenario:
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    found = _PARSED.get(key)
    if found is None:
        found = _PARSED[key] = load_scenario(path)  # frozen: safe to share
    return found


def dump_scenario(s: Scenario) -> str:
    data: Any = s.model_dump(mode="json", exclude_none=True)
    return json.dumps(data, indent=1) + "\n"
