"""The radix profile: a radix-tree prefix cache (SGLang's RadixCache and its emulations).

For an adapter declaring ``profile:radix``: every golden scenario of
``spec/scenarios/radix/`` (each step against its hand-written expectation
and against the model), Hypothesis-drawn traffic of tree operations and
requests in lockstep with the model, and request-only workloads on small
pools (the scheduler's path: match, lock, evict, insert, unlock). A
failure names the rule and lists the operations that led to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.conformance.managers.profile_suite import cheap_op_settings, open_or_skip, record_rules, require_profile
from kvspec.conformance.radix.check import RadixLockstep, drive, radix_configs, run_golden
from kvspec.conformance.radix.opener import open_radix
from kvspec.conformance.run.manifest import Manifest
from kvspec.spec.radix_wire import RadixConfig, RadixRequest, radix_scenarios
from kvspec.spec.registry import RADIX, RADIX_FAMILY
from kvspec.spec.rules import Concern, rules_of

SCENARIOS = radix_scenarios()
#: the radix rules and the stream rules the router view checks on every step
RADIX_RULES = (
    *rules_of(Concern.RADIX),
    "EVENT-ID",
    "STORE-NO-DUP",
    "PARENT-ANCHOR",
    "REMOVE-EXACT",
    "REMOVE-NO-ORPHAN",
)


def _require_tree_operations(manifest: Manifest) -> None:
    """Skip unless the adapter runs the radix profile operation by operation
    (``start.radix`` in process, or a ``subprocess`` child over protocol
    version 4); a request-only one is checked by the radix request layer
    (test_requests.py, ``test_radix_request_*``)."""
    require_profile(manifest, RADIX)
    if not manifest.start.factory_for(RADIX_FAMILY, manifest.kind) and manifest.kind != "subprocess":
        pytest.skip(
            f"adapter {manifest.name!r} takes requests only (no start.radix, not a protocol-4 child):"
            " the radix request layer checks it (test_requests.py, test_radix_request_*)"
        )


#: what the fixed request workload exercises
REQUEST_RULES = ("RADIX-PREFIX-HIT", "RADIX-EVICT-LRU", "RADIX-INSERT", "RADIX-CAPACITY", "RADIX-REMOVE")


@pytest.mark.kvspec_rules()
@pytest.mark.parametrize(("path", "scenario"), SCENARIOS, ids=[f"radix/{p.stem}" for p, _ in SCENARIOS])
def test_radix_golden(
    path: Path, scenario: Any, kvspec_manifest: Manifest, kvspec_adapter_dir: Path, kvspec_record_rule: Any
) -> None:
    _require_tree_operations(kvspec_manifest)
    with open_or_skip(open_radix, kvspec_manifest, kvspec_adapter_dir, scenario.config) as impl:
        run_golden(scenario, impl)
    record_rules(kvspec_record_rule, scenario.rules)


@pytest.mark.kvspec_rules(*RADIX_RULES)
def test_radix_lockstep(
    kvspec_manifest: Manifest, kvspec_adapter_dir: Path, kvspec_record_rule: Any, kvspec_settings: settings
) -> None:
    """Values, errors, events, the tree, lock counts and sizes equal the model's
    at every step, on traffic drawn from the model's state as the run goes
    (``radix_check.drive``)."""
    _require_tree_operations(kvspec_manifest)
    open_or_skip(open_radix, kvspec_manifest, kvspec_adapter_dir, RadixConfig()).close()  # skips when unavailable

    @cheap_op_settings(kvspec_settings)
    @given(config=radix_configs(), data=st.data())
    def run(config: RadixConfig, data: st.DataObject) -> None:
        with open_radix(kvspec_manifest, kvspec_adapter_dir, config) as impl:
            drive(data, RadixLockstep(impl, config), kvspec_settings.stateful_step_count)

    run()
    record_rules(kvspec_record_rule, RADIX_RULES)


@pytest.mark.kvspec_rules(*REQUEST_RULES)
@pytest.mark.parametrize("page_size", [1, 4])
def test_radix_requests(
    page_size: int, kvspec_manifest: Manifest, kvspec_adapter_dir: Path, kvspec_record_rule: Any
) -> None:
    """A fixed request workload on a pool a third of its size: shared system
    prompts, multi-turn follow-ups that extend earlier answers, evictions."""
    _require_tree_operations(kvspec_manifest)
    config = RadixConfig(page_size=page_size, capacity=48)
    system = [7, 7, 8, 9, 7, 8, 9, 9]
    reqs: list[RadixRequest] = []
    for turn in range(12):
        user = [10 + turn % 3, 11, 12 + turn % 5, 13]
        prompt = system + user if turn % 4 else [20 + turn, 21, 22, 23, 24]
        if turn % 3 == 2 and reqs:
            prompt = reqs[-1].prompt + reqs[-1].output[:-1] + user[:2]
        reqs.append(RadixRequest(prompt=prompt, output=[30 + turn, 31, 32, 33, 34][: 2 + turn % 4]))
    with open_or_skip(open_radix, kvspec_manifest, kvspec_adapter_dir, config) as impl:
        ls = RadixLockstep(impl, config)
        for r in reqs:
            ls.step(r)
    record_rules(kvspec_record_rule, REQUEST_RULES)
