"""The allocator-level profiles: the paged allocator and session slot leases.

For an adapter declaring ``profile:paged`` or ``profile:session``: every
golden scenario of ``spec/scenarios/paged/`` and ``spec/scenarios/session/``
(each step against its hand-written expectation and against the model), then
Hypothesis-drawn traffic in lockstep with the model (``manager_lockstep``).
A declared deviation is followed where the model can take the
implementation's state (``managers/follow.py``) and every rule is checked
after it.
A failure names the rule and lists the operations that led to it; the
Hypothesis report prints the shrunk operation list to replay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.conformance.managers.lockstep import (
    AbstractSessionOp,
    ManagerLockstep,
    concrete_session_op,
    open_manager,
    paged_configs,
    paged_ops,
    run_golden,
    session_configs,
    session_ops,
)
from kvspec.conformance.managers.profile_suite import cheap_op_settings, record_rules, require_profile
from kvspec.conformance.run.manifest import Manifest
from kvspec.spec.manager_scenario import ManagerScenario, manager_scenarios
from kvspec.spec.manager_wire import PAGED_OP_ADAPTER, PagedConfig, SessionConfig
from kvspec.spec.registry import PAGED, SESSION
from kvspec.spec.rules import Concern, rules_of

SCENARIOS = manager_scenarios()
PAGED_RULES = rules_of(Concern.PAGED)
SESSION_RULES = rules_of(Concern.SESSION)


@pytest.mark.kvspec_rules()
@pytest.mark.parametrize(("path", "scenario"), SCENARIOS, ids=[f"{p.parent.name}/{p.stem}" for p, _ in SCENARIOS])
def test_manager_golden(
    path: Path,
    scenario: ManagerScenario,
    kvspec_manifest: Manifest,
    kvspec_adapter_dir: Path,
    kvspec_record_rule: Any,
    kvspec_record_deviation: Any,
) -> None:
    require_profile(kvspec_manifest, scenario.config.kind)
    with open_manager(kvspec_manifest, kvspec_adapter_dir, scenario.config) as impl:
        run_golden(
            scenario,
            impl,
            deviations=kvspec_manifest.deviations,
            on_deviation=kvspec_record_deviation,
            scenario_id=f"{path.parent.name}/{path.stem}",
        )
    record_rules(kvspec_record_rule, scenario.rules)


@pytest.mark.kvspec_rules(*PAGED_RULES)
def test_paged_lockstep(
    kvspec_manifest: Manifest,
    kvspec_adapter_dir: Path,
    kvspec_record_rule: Any,
    kvspec_record_deviation: Any,
    kvspec_settings: settings,
) -> None:
    """Values, errors, block sharing, reference counts, contents and pressure equal the model's at every step."""
    require_profile(kvspec_manifest, PAGED)

    @cheap_op_settings(kvspec_settings)
    @given(config=paged_configs(), ops=st.lists(paged_ops(), min_size=1, max_size=kvspec_settings.stateful_step_count))
    def run(config: PagedConfig, ops: list[dict[str, Any]]) -> None:
        with open_manager(kvspec_manifest, kvspec_adapter_dir, config) as impl:
            ls = ManagerLockstep(impl, config, kvspec_manifest.deviations, kvspec_record_deviation)
            for raw in ops:
                ls.step(PAGED_OP_ADAPTER.validate_python(raw))

    run()
    record_rules(kvspec_record_rule, PAGED_RULES)


@pytest.mark.kvspec_rules(*SESSION_RULES)
def test_session_lockstep(
    kvspec_manifest: Manifest,
    kvspec_adapter_dir: Path,
    kvspec_record_rule: Any,
    kvspec_record_deviation: Any,
    kvspec_settings: settings,
) -> None:
    """Admissions, fencing, LRU reuse and releases equal the model's at every step."""
    require_profile(kvspec_manifest, SESSION)

    @cheap_op_settings(kvspec_settings)
    @given(
        config=session_configs(),
        ops=st.lists(session_ops(), min_size=1, max_size=kvspec_settings.stateful_step_count),
    )
    def run(config: SessionConfig, ops: list[AbstractSessionOp]) -> None:
        with open_manager(kvspec_manifest, kvspec_adapter_dir, config) as impl:
            ls = ManagerLockstep(impl, config, kvspec_manifest.deviations, kvspec_record_deviation)
            for a in ops:
                ls.step(concrete_session_op(ls, a))

    run()
    record_rules(kvspec_record_rule, SESSION_RULES)
