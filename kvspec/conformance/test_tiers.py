"""The lower-tier goldens of several workers (spec/scenarios/tiers/): G3 and G4 shared.

These goldens drive several workers of one process through the adapter
(``Implementation.step_on``, PROTOCOL.md version 5): each step names its
worker and expects every worker's events. An adapter that does not declare
the tier a golden uses (``disk`` for G3, ``external`` for G4), or fewer
workers than the golden drives (``workers = N`` in its manifest), skips it
with that capability named, which makes the ``TIER-*`` rules not applicable
to it (never a pass). Checking: ``conformance/block/process_check.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvspec.conformance.block.opener import open_implementation
from kvspec.conformance.block.process_check import run_process_scenario
from kvspec.conformance.run.manifest import Manifest
from kvspec.spec.process_scenario import ProcessScenario, tier_scenarios
from kvspec.spec.rules import Concern, rules_of

SCENARIOS = tier_scenarios()


def _tiers_needed(s: ProcessScenario) -> list[str]:
    off = s.config.offload
    if off is None:
        return []
    return [t for t, on in (("disk", off.num_g3_blocks is not None), ("external", off.g4)) if on]


@pytest.mark.kvspec_rules(*rules_of(Concern.TIERS))
@pytest.mark.parametrize(("path", "scenario"), SCENARIOS, ids=[f"tiers/{p.stem}" for p, _ in SCENARIOS])
def test_tier_golden(
    path: Path, scenario: ProcessScenario, kvspec_manifest: Manifest, kvspec_adapter_dir: Path
) -> None:
    caps = kvspec_manifest.capabilities
    missing = [f"tier:{t}" for t in _tiers_needed(scenario) if t not in caps.tiers]
    if missing:
        pytest.skip(f"adapter {kvspec_manifest.name!r} does not declare capability {missing[0]}")
    if caps.workers < scenario.workers:
        pytest.skip(
            f"{scenario.name} drives {scenario.workers} workers of one process; adapter {kvspec_manifest.name!r} "
            f"declares workers = {caps.workers} (ADAPTERS.md)"
        )
    if scenario.config.eviction not in caps.policies:
        pytest.skip(f"adapter {kvspec_manifest.name!r} does not declare capability policy:{scenario.config.eviction}")
    off = scenario.config.offload
    for option, value in (off.options() if off is not None else {}).items():
        if not caps.supports(option, value):
            pytest.skip(f"adapter {kvspec_manifest.name!r} does not declare capability semantics:{option}={value}")
    with open_implementation(kvspec_manifest, kvspec_adapter_dir, scenario.config, workers=scenario.workers) as impl:
        run_process_scenario(scenario, impl)
