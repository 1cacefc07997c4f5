"""The lower-tier goldens of several workers (spec/scenarios/tiers/): G3 and G4 shared.

These goldens drive several workers of one process through the adapter
(``Implementation.step_on``, PROTOCOL.md version 5): each step names its
worker and expects every worker's events. An adapter that does not declare
the tier a golden uses (``disk`` for G3, ``external`` for G4), or fewer
workers than the golden drives (``workers = N`` in its manifest), skips it
with that capability named, which makes the ``TIER-*`` rules not applicable
to it (never a pass). Checking: ``conformance/workers/check.py``.

``test_two_worker_lockstep`` drives two workers sharing G3/G4 with drawn
traffic against the reference process (``conformance/workers/lockstep.py``),
in every effort, for adapters that declare ``workers`` >= 2 and a lower tier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kvspec.conformance.block.opener import open_implementation
from kvspec.conformance.run.manifest import Manifest
from kvspec.conformance.workers.check import run_process_scenario
from kvspec.conformance.workers.lockstep import WORKERS, run_two_workers, tier_configs
from kvspec.spec.process_scenario import ProcessScenario, tier_scenarios
from kvspec.spec.profiles import KVBM
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


@pytest.mark.kvspec_rules(*rules_of(Concern.TIERS))
@pytest.mark.kvspec_requires("block_level")
def test_two_worker_lockstep(
    kvspec_manifest: Manifest, kvspec_adapter_dir: Path, kvspec_settings: settings, kvspec_record_rule: Any
) -> None:
    """Two workers sharing G3/G4: every step of each equals the reference process's."""
    caps = kvspec_manifest.capabilities
    if KVBM.name not in kvspec_manifest.supported_profiles():
        pytest.skip(f"adapter {kvspec_manifest.name!r} does not declare capability profile:kvbm")
    if not caps.offload or not {"disk", "external"} & set(caps.tiers):
        pytest.skip(f"adapter {kvspec_manifest.name!r} does not declare capability tier:disk or tier:external")
    if caps.workers < WORKERS:
        pytest.skip(
            f"adapter {kvspec_manifest.name!r} declares workers = {caps.workers}; the lockstep drives {WORKERS}"
        )
    budget = settings(
        kvspec_settings,
        max_examples=max(5, kvspec_settings.max_examples // 4),
        report_multiple_bugs=False,
        phases=[p for p in kvspec_settings.phases if p is not Phase.explain],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )

    tier_rules = set(rules_of(Concern.TIERS))

    def record(rule: str, n: int = 1) -> None:
        # it checks the G1/G2 rules at every step too; they are counted by the one-worker lockstep
        if rule in tier_rules:
            kvspec_record_rule(rule, n)

    @budget
    @given(data=st.data())
    def run(data: Any) -> None:
        config = data.draw(tier_configs(caps), label="config")
        with open_implementation(kvspec_manifest, kvspec_adapter_dir, config, workers=WORKERS) as impl:
            run_two_workers(impl, config, data.draw, record=record)

    run()
