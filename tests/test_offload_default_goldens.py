"""Every offload rule has a golden written for Dynamo's default option values.

A port that implements only the defaults (what Dynamo's offload code does)
runs only the goldens whose offload config names the defaults; each rule of
the offload tier must be checked by at least one of them (issue 27, item 7c).
"""

from __future__ import annotations

from kvspec.spec.config import SEMANTICS
from kvspec.spec.rules import Concern, rules_of
from kvspec.spec.scenario import SCENARIO_DIR, Scenario, load_scenario


def _default_goldens() -> list[Scenario]:
    out = []
    for path in sorted((SCENARIO_DIR / "offload").glob("*.json")):
        s = load_scenario(path)
        off = s.config.offload
        if off is None:
            continue
        if all(getattr(off, n) == o.default for n, o in SEMANTICS.items() if o.scope == "offload"):
            out.append(s)
    return out


def test_every_offload_rule_has_a_golden_under_the_defaults() -> None:
    covered = {r for s in _default_goldens() for r in s.rules}
    offload_rules = set(rules_of(Concern.OFFLOAD))
    assert offload_rules, "the catalogue names no offload rule"
    missing = sorted(offload_rules - covered)
    assert not missing, f"offload rules with no golden under Dynamo's default options: {missing}"


def test_tick_result_has_a_golden_for_each_non_legacy_value() -> None:
    values = {s.config.offload.tick_result for s in _default_goldens() if s.config.offload is not None}
    assert values == {"none"}
    released = load_scenario(SCENARIO_DIR / "offload" / "tick_returns_released_source_slots.json")
    assert released.config.offload is not None and released.config.offload.tick_result == "released_slots"
