"""Several workers through an adapter: the worker id, protocol version 5, conformance/workers."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.api import builtin_adapters_dir, load_manifest
from kvspec.conformance.block.opener import open_implementation
from kvspec.conformance.transport.jsonl import encode_hello, encode_request, offered_versions
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.conformance.workers.check import run_process_scenario
from kvspec.conformance.workers.lockstep import WORKERS, run_two_workers, tier_configs
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.manifest import Manifest
from kvspec.spec.process_scenario import ProcessScenario, tier_scenarios
from kvspec.spec.protocol import WorkerOutcomeReply, WorkerRequest
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Deref, FullBlock, Operation, ProcessOutcome, StepOutcome, WorkerEvents

SCENARIOS = {s.name: s for _p, s in tier_scenarios()}
OWNER = "g3_eviction_is_published_by_its_owner"


def _reference(s: ProcessScenario) -> ReferenceImplementation:
    return ReferenceImplementation(s.config, load_manifest(builtin_adapters_dir() / "reference"), s.workers)


class _WrongPublisher(ReferenceImplementation):
    """Publishes the other workers' events as the stepped worker's own."""

    def step_on(self, worker: int, op: Operation) -> ProcessOutcome:
        got = super().step_on(worker, op)
        moved = [e for o in got.others for e in o.events]
        if not moved:
            return got
        out = got.outcome.model_copy(update={"events": [*got.outcome.events, *moved]})
        return ProcessOutcome(outcome=out)


class _LostOthers(ReferenceImplementation):
    """Drops what the other workers publish."""

    def step_on(self, worker: int, op: Operation) -> ProcessOutcome:
        return ProcessOutcome(outcome=super().step_on(worker, op).outcome)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_goldens_pass_on_the_reference_process(name: str) -> None:
    s = SCENARIOS[name]
    run_process_scenario(s, _reference(s))


def test_an_eviction_published_by_the_wrong_worker_is_tier_events() -> None:
    s = SCENARIOS[OWNER]
    impl = _WrongPublisher(s.config, load_manifest(builtin_adapters_dir() / "reference"), s.workers)
    with pytest.raises(ConformanceFailure) as e:
        run_process_scenario(s, impl)
    assert e.value.rule == RuleId.TIER_EVENTS
    assert "wrong worker" in str(e.value)


def test_an_eviction_nobody_publishes_is_caught() -> None:
    s = SCENARIOS[OWNER]
    impl = _LostOthers(s.config, load_manifest(builtin_adapters_dir() / "reference"), s.workers)
    with pytest.raises(ConformanceFailure) as e:
        run_process_scenario(s, impl)
    assert e.value.rule.value.startswith("TIER-")


def test_one_worker_adapter_serves_worker_zero_only() -> None:
    s = SCENARIOS[OWNER]
    one = ReferenceImplementation(s.config, load_manifest(builtin_adapters_dir() / "reference"))
    op = Deref(blocks=[FullBlock(full=5)])
    assert one.step_on(0, op).outcome.error is not None  # DEREF-UNKNOWN, through step
    with pytest.raises(ConfigError, match="worker 1"):
        one.step_on(1, op)


def test_more_workers_than_declared_is_refused() -> None:
    m = load_manifest(builtin_adapters_dir() / "reference")
    with pytest.raises(ConfigError, match="declares workers = 4"):
        open_implementation(m, builtin_adapters_dir() / "reference", SCENARIOS[OWNER].config, workers=5)


def test_workers_capability_needs_a_shared_tier_and_no_c_abi() -> None:
    base = {"name": "x", "profile": "kvbm", "kind": "subprocess"}
    with pytest.raises(ValueError, match="does nothing"):
        Manifest.model_validate({**base, "capabilities": {"workers": 2}})
    caps = {"workers": 2, "offload": True, "tiers": ["device", "host_pinned", "disk"]}
    assert Manifest.model_validate({**base, "capabilities": caps}).capabilities.has("workers")
    with pytest.raises(ValueError, match="C ABI"):
        Manifest.model_validate({**base, "kind": "c_abi", "capabilities": caps})


def test_one_worker_hello_and_request_are_unchanged() -> None:
    config = ManagerConfig(capacity=2)
    assert b"workers" not in encode_hello(config)
    assert offered_versions() == (1, 2)
    op = Deref(blocks=[FullBlock(full=1)])
    assert encode_request(1, op) == b'{"id":1,"op":%s}' % op.model_dump_json().encode()
    hello = encode_hello(config, workers=2)
    assert b'"workers":2' in hello and b'"versions":[5]' in hello
    req = WorkerRequest.model_validate_json(encode_request(3, op, 1))
    assert (req.worker, req.op) == (1, op)


def test_worker_reply_refuses_a_worker_twice() -> None:
    out = StepOutcome.model_validate(
        {"result": {}, "counters": {"active_blocks": 0, "active_refs": 0, "inactive_blocks": 0, "free_blocks": 1}}
    )
    ev = {"event_id": 0, "data": {"removed": {"block_hashes": [1]}}}
    twice = [WorkerEvents.model_validate({"worker": 1, "events": [ev]})] * 2
    with pytest.raises(ValueError, match="at most once"):
        WorkerOutcomeReply(id=1, outcome=out, others=twice).process_outcome()


def test_jsonl_session_of_two_workers_matches_the_golden() -> None:
    s = SCENARIOS[OWNER]
    d = builtin_adapters_dir() / "reference_jsonl"
    with open_implementation(load_manifest(d), d, s.config, workers=s.workers) as impl:
        run_process_scenario(s, impl)


def _lockstep(impl_type: type[ReferenceImplementation], examples: int) -> None:
    """The two-worker lockstep at ``examples`` examples, unshrunk: a failure is raised as first
    found (the examples before it are the same; shrinking it was most of a kill's time)."""
    manifest = load_manifest(builtin_adapters_dir() / "reference")
    phases = [p for p in Phase if p is not Phase.shrink]

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        phases=phases,
    )
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        config = data.draw(tier_configs(manifest.capabilities))
        run_two_workers(impl_type(config, manifest, WORKERS), config, data.draw)

    run()


def test_two_worker_lockstep_passes_on_the_reference() -> None:
    """Also: the traffic keeps the caller contracts (``WorkersRun.send`` checks
    each operation before sending it and fails the run on a break)."""
    _lockstep(ReferenceImplementation, 20)


def test_two_worker_lockstep_catches_the_wrong_publisher() -> None:
    with pytest.raises(ConformanceFailure) as e:
        _lockstep(_WrongPublisher, 30)
    assert e.value.rule == RuleId.TIER_EVENTS


def test_the_hellos_of_versions_3_and_4_are_unchanged_by_version_5() -> None:
    """A version's messages never change: the allocator (3) and radix (4) hellos carry no workers field."""
    from kvspec.conformance.transport.manager import manager_config
    from kvspec.conformance.transport.radix import radix_manager_config
    from kvspec.spec.manager_wire import PagedConfig
    from kvspec.spec.radix_wire import RadixConfig

    paged = PagedConfig(kind="paged", device_blocks=4, block_size=2)
    radix = RadixConfig(kind="radix", page_size=1, capacity=4)
    hellos = (
        encode_hello(manager_config(paged), manager=paged),
        encode_hello(radix_manager_config(radix), radix=radix),
    )
    for hello in hellos:
        assert b'"workers"' not in hello, hello
