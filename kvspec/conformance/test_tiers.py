"""The lower-tier goldens of several workers (spec/scenarios/tiers/): G3 and G4 shared.

These goldens drive several workers of one process, and the adapter
protocol has no worker id yet, so no adapter can run them. An adapter that
does not declare the tier a golden uses (``disk`` for G3, ``external`` for
G4) skips it with that capability named, which makes the ``TIER-*`` rules
not applicable to it (never a pass). One that declares the tiers is checked
on the single-worker tier goldens (``offload/tier_*``, test_golden.py) and
skips these with the reason: kvspec cannot drive several workers through an
adapter yet (SPEC.md, "Lower tiers", what is not covered). The goldens run
on the model in tests/test_lower_tiers.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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
def test_tier_golden(path: Path, scenario: ProcessScenario, kvspec_manifest: Manifest) -> None:
    caps = kvspec_manifest.capabilities
    missing = [f"tier:{t}" for t in _tiers_needed(scenario) if t not in caps.tiers]
    if missing:
        pytest.skip(f"adapter {kvspec_manifest.name!r} does not declare capability {missing[0]}")
    pytest.skip(
        f"{scenario.name} drives {scenario.workers} workers of one process; the adapter protocol has no worker id "
        "yet, so it runs on the model only (tests/test_lower_tiers.py); the offload/tier_* goldens check this "
        "adapter's tiers with one worker"
    )
