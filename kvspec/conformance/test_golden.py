"""Every golden scenario of spec/scenarios/ against the implementation.

A scenario runs when the adapter supports its profile, policy and every
capability it requires; otherwise it is skipped with the missing capability
named (a skip is never a pass). A scenario whose expectations hold under
several eviction policies (``"policies"`` in the file) is one test per
policy (``kvbm/single_use@lru``), each run when the adapter declares it.
A declared departure is followed, and the rest of the golden is checked
against the followed model (``scenario_runner``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvspec.conformance.block.scenario_runner import run_scenario
from kvspec.conformance.run.manifest import Manifest
from kvspec.spec.config import ManagerConfig
from kvspec.spec.scenario import Scenario, all_scenarios

SCENARIOS = all_scenarios()
#: (path, scenario, configuration, test id): a scenario once per policy it runs
#: under; every scenario's first policy first, then the second ones, and so on,
#: so that a run stopped at its first failure (``-x``, ``kvspec mutants``) has
#: tried each scenario once before it repeats any under another policy
CASES: list[tuple[Path, Scenario, ManagerConfig, str]] = [
    (p, s, s.config_for(pol), f"{p.parent.name}/{p.stem}" + ("" if s.policies is None else f"@{pol}"))
    for _, p, s, pol in sorted(
        ((i, p, s, pol) for p, s in SCENARIOS for i, pol in enumerate(s.run_policies())),
        key=lambda c: c[0],  # stable: path order within each round
    )
]


def _skip_reason(manifest: Manifest, s: Scenario, config: ManagerConfig) -> str | None:
    caps = manifest.capabilities
    if not caps.block_level:
        return f"adapter {manifest.name!r} does not declare capability block_level"
    if s.config.profile not in manifest.supported_profiles():
        return f"adapter {manifest.name!r} does not declare capability profile:{s.config.profile}"
    if config.eviction not in caps.policies:
        return f"adapter {manifest.name!r} does not declare capability policy:{config.eviction}"
    if s.config.capacity > caps.max_capacity:
        return f"adapter {manifest.name!r} supports capacity up to {caps.max_capacity}"
    missing = [c for c in s.requires if not caps.has(c)]
    if missing:
        return f"adapter {manifest.name!r} does not declare capability {', '.join(missing)}"
    if s.config.offload is not None:
        for option, value in s.config.offload.options().items():
            if not caps.supports(option, value):
                return f"adapter {manifest.name!r} does not declare capability semantics:{option}={value}"
    return None


@pytest.mark.kvspec_rules()
@pytest.mark.parametrize(("path", "scenario", "config"), [c[:3] for c in CASES], ids=[c[3] for c in CASES])
def test_golden_scenario(
    path: Path,
    scenario: Scenario,
    config: ManagerConfig,
    kvspec_manifest: Manifest,
    open_impl: Any,
    kvspec_record_rule: Any,
    kvspec_record_deviation: Any,
) -> None:
    reason = _skip_reason(kvspec_manifest, scenario, config)
    if reason is not None:
        pytest.skip(reason)
    impl = open_impl(config)
    run_scenario(
        scenario,
        impl,
        deviations=kvspec_manifest.deviations,
        on_deviation=kvspec_record_deviation,
        scenario_id=f"{path.parent.name}/{path.stem}",
    )
    for rule in scenario.rules:
        kvspec_record_rule(str(rule))
