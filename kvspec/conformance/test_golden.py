"""Every golden scenario of spec/scenarios/ against the implementation.

A scenario runs when the adapter supports its profile, policy and every
capability it requires; otherwise it is skipped with the missing capability
named (a skip is never a pass).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvspec.conformance.manifest import Manifest
from kvspec.conformance.scenario_runner import run_scenario
from kvspec.spec.scenario import Scenario, all_scenarios

SCENARIOS = all_scenarios()


def _skip_reason(manifest: Manifest, s: Scenario) -> str | None:
    caps = manifest.capabilities
    if not caps.block_level:
        return f"adapter {manifest.name!r} does not declare capability block_level"
    if s.config.profile not in manifest.supported_profiles():
        return f"adapter {manifest.name!r} does not declare capability profile:{s.config.profile}"
    if s.config.eviction not in caps.policies:
        return f"adapter {manifest.name!r} does not declare capability policy:{s.config.eviction}"
    if s.config.capacity > caps.max_capacity:
        return f"adapter {manifest.name!r} supports capacity up to {caps.max_capacity}"
    missing = [c for c in s.requires if not caps.has(c)]
    if missing:
        return f"adapter {manifest.name!r} does not declare capability {', '.join(missing)}"
    return None


@pytest.mark.kvspec_rules()
@pytest.mark.parametrize(("path", "scenario"), SCENARIOS, ids=[f"{p.parent.name}/{p.stem}" for p, _ in SCENARIOS])
def test_golden_scenario(
    path: Path, scenario: Scenario, kvspec_manifest: Manifest, open_impl: Any, kvspec_record_rule: Any
) -> None:
    reason = _skip_reason(kvspec_manifest, scenario)
    if reason is not None:
        pytest.skip(reason)
    impl = open_impl(scenario.config)
    run_scenario(scenario, impl)
    for rule in scenario.rules:
        kvspec_record_rule(str(rule))
