"""Lockstep stateful testing of the implementation against the reference model.

For each profile the adapter supports (of kvbm, atomic, legacy), Hypothesis
drives scheduler-like traffic (``conformance/block/traffic.py``) through the
implementation and the model together (``conformance/block/lockstep.py``); the
eviction policy is drawn per example among those the adapter declares. A
failure reports the shrunk operation table, the first divergence and the
rule, and writes a replay file into the run's replay folder (``replay_store``).

``test_router_view_matches_model`` is the protocol-only variant: it ignores
differences a router cannot see and checks the stream rules and
INV-ROUTER-MATCH only (fewer examples: the full test checks this too): it
shows the stream safe for a router for implementations whose events differ
from the model's in detail a router cannot see.

Budget (``_settings``): the adapter's own profile gets the effort's
examples (``--hypothesis-profile``, ``conformance/run/settings.py``), other
profiles a third, the protocol-only test a tenth.

A declared deviation (scoped, ``kvspec.spec.deviations``) seen by the
lockstep is recorded and followed, never raised: the run goes on checking
every rule, and the plugin counts the observation.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings

from kvspec.conformance.block.coverage import STEP_INVARIANTS
from kvspec.conformance.block.machine import MachineSetup, machine_class, run_machine
from kvspec.conformance.run.manifest import Manifest
from kvspec.conformance.run.plugin import replay_run
from kvspec.spec import registry
from kvspec.spec.profiles import profile as get_profile
from kvspec.spec.rules import Concern, rules_of

PROFILES = registry.names("block", stateful=True)

LIFECYCLE_RULES = rules_of(Concern.LIFECYCLE)
#: the offload tier's rules (checked where the adapter declares offload)
OFFLOAD_RULES = rules_of(Concern.OFFLOAD)
#: the invariants a lockstep step exercises (``coverage.STEP_INVARIANTS``)
LOCKSTEP_INVARIANTS = tuple(str(r) for r in STEP_INVARIANTS)
#: what the protocol-only variant checks of the offload tier (the stream)
OFFLOAD_STREAM_RULES = ("G2-STORE-ON-COMPLETE", "G2-EVICT")
PROTOCOL_RULES = (
    "STORE-NEW-ONLY",
    "STORE-NO-DUP",
    "STORE-TOKENS-HASH",
    "PARENT-ANCHOR",
    "REMOVE-EXACT",
    "REMOVE-NO-ORPHAN",
    "EVENT-ID",
    "EVENT-ORDER",
    "EVENT-SOURCE",
    "INV-ROUTER-MATCH",
)


def _setup(
    request: pytest.FixtureRequest,
    manifest: Manifest,
    adapter_dir: Path,
    profile: str,
    record: Any,
    *,
    protocol_only: bool = False,
    record_deviation: Any = None,
) -> MachineSetup:
    if profile not in manifest.supported_profiles():
        pytest.skip(f"adapter {manifest.name!r} does not declare capability profile:{profile}")
    caps = manifest.capabilities
    if not any(p in caps.policies for p in get_profile(profile).policies):
        pytest.skip(
            f"adapter {manifest.name!r} declares no eviction policy of profile {profile} "
            f"({', '.join(get_profile(profile).policies)})"
        )
    replays = replay_run(request.config)
    if protocol_only:
        # the protocol-only run checks the stream, not the lifecycle: it
        # reports coverage of the rules it checks (its kvspec_rules marker)
        checked = {*PROTOCOL_RULES, *OFFLOAD_STREAM_RULES}
        record_all = record

        def record(rule: str, n: int = 1) -> None:
            if rule in checked or rule not in LIFECYCLE_RULES + OFFLOAD_RULES + LOCKSTEP_INVARIANTS:
                record_all(rule, n)

    return MachineSetup(
        manifest=manifest,
        adapter_dir=adapter_dir,
        profile=profile,
        replay_path=None if replays is None else partial(replays.path_for, request.node.name),
        replay_target=None if replays is None else replays.target,
        record=record,
        protocol_only=protocol_only,
        record_deviation=record_deviation,
    )


def _settings(current: settings, manifest: Manifest, profile: str, share: int) -> settings:
    """The suite's effort (``--hypothesis-profile``), with its
    example budget split: the profile the adapter claims gets all of it, each
    further profile it supports a third (they share most of their code paths
    with it), and the protocol-only variant a tenth of that (the full test
    checks everything it does). Hypothesis's explain phase is skipped: the
    failure report already names the step, the divergence and the rule."""
    if profile != manifest.profile:
        share *= 3
    return settings(
        current,
        report_multiple_bugs=False,
        max_examples=max(5, current.max_examples // share),
        phases=[p for p in current.phases if p is not Phase.explain],
    )


@pytest.mark.kvspec_rules(*LIFECYCLE_RULES, *PROTOCOL_RULES, *OFFLOAD_RULES, *LOCKSTEP_INVARIANTS)
@pytest.mark.kvspec_requires("block_level")
@pytest.mark.parametrize("profile", PROFILES)
def test_lockstep(
    profile: str,
    request: pytest.FixtureRequest,
    kvspec_manifest: Manifest,
    kvspec_adapter_dir: Path,
    kvspec_record_rule: Any,
    kvspec_record_deviation: Any,
    kvspec_settings: settings,
) -> None:
    """Results, errors, events and counters equal the model's at every step."""
    setup = _setup(
        request,
        kvspec_manifest,
        kvspec_adapter_dir,
        profile,
        kvspec_record_rule,
        record_deviation=kvspec_record_deviation,
    )
    run_machine(machine_class(setup), settings=_settings(kvspec_settings, kvspec_manifest, profile, share=1))


@pytest.mark.kvspec_rules(*PROTOCOL_RULES, *OFFLOAD_STREAM_RULES)
@pytest.mark.kvspec_requires("block_level")
@pytest.mark.parametrize("profile", PROFILES)
def test_router_view_matches_model(
    profile: str,
    request: pytest.FixtureRequest,
    kvspec_manifest: Manifest,
    kvspec_adapter_dir: Path,
    kvspec_record_rule: Any,
    kvspec_record_deviation: Any,
    kvspec_settings: settings,
) -> None:
    """Protocol only: the router view of the implementation's stream breaks no
    rule the profile keeps and holds exactly the blocks the model announced."""
    setup = _setup(
        request,
        kvspec_manifest,
        kvspec_adapter_dir,
        profile,
        kvspec_record_rule,
        protocol_only=True,
        record_deviation=kvspec_record_deviation,
    )
    run_machine(machine_class(setup), settings=_settings(kvspec_settings, kvspec_manifest, profile, share=10))
