"""The lockstep machine's extension points: rule groups mixed in by
capability, their swarm kinds, configuration hook and actions; and the
short-circuit that keeps a crashing adapter from being restarted while
Hypothesis shrinks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec.conformance.block import machine as mm
from kvspec.conformance.block.machine import Digits, MachineSetup, RuleGroup, action, machine_class, run_machine
from kvspec.conformance.block.traffic import Planned
from kvspec.conformance.run.manifest import Manifest, load_manifest, resolve_adapter_dir
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.errors import AdapterError
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Operation, StepOutcome, Tick

REF_DIR = resolve_adapter_dir("adapters/reference")
REF: Manifest = load_manifest(REF_DIR)
QUICK = settings(
    max_examples=15,
    stateful_step_count=20,
    phases=[Phase.generate],
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
)


class TickGroup(RuleGroup, register=False):
    """A stand-in for the offload group: attaches a G2 tier, adds a 'tick'
    kind whose action moves the clock forward."""

    kinds = ("tick",)
    requires = ("offload",)
    profiles = ("kvbm",)
    seen: ClassVar[Counter[str]] = Counter()

    def configure(self, config: ManagerConfig, data: Any) -> ManagerConfig:
        config = super().configure(config, data)
        return config.model_copy(update={"offload": OffloadConfig.legacy(num_g2_blocks=4, block_size_bytes=1_000_000)})

    @action("tick", weight=2)
    def tick(self, d: Digits) -> Planned | None:
        now = (self.check.model.now if self.check else 0.0) + d.take(5)  # type: ignore[attr-defined]

        def commit(out: StepOutcome, before: Any) -> None:
            TickGroup.seen["ticks"] += 1

        return Planned(Tick(now_ms=now), "tick", commit)

    def after_step(self, planned: Planned, expected: StepOutcome) -> None:
        super().after_step(planned, expected)
        TickGroup.seen[f"after {planned.kind}"] += 1


def test_a_group_mixes_in_its_kind_config_and_actions() -> None:
    TickGroup.seen.clear()
    cls = machine_class(MachineSetup(REF, REF_DIR, "kvbm"), groups=[TickGroup])
    assert "tick" in cls.optional_kinds() and "tick" in {a.kind for a in cls.all_actions()}
    run_state_machine_as_test(cls, settings=QUICK)
    assert TickGroup.seen["ticks"] > 0 and TickGroup.seen["after tick"] == TickGroup.seen["ticks"]
    assert TickGroup.seen["after new"] > 0  # the base actions still run


def test_groups_apply_only_to_adapters_that_declare_their_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RuleGroup, "_registry", [TickGroup])
    no_offload = REF.model_copy(update={"capabilities": REF.capabilities.model_copy(update={"offload": False})})
    plain = machine_class(MachineSetup(no_offload, REF_DIR, "kvbm"))
    assert not issubclass(plain, TickGroup) and "tick" not in plain.optional_kinds()
    assert issubclass(machine_class(MachineSetup(REF, REF_DIR, "kvbm")), TickGroup)
    assert not issubclass(machine_class(MachineSetup(REF, REF_DIR, "legacy")), TickGroup)  # not its profile


def test_a_machine_class_is_not_registered_as_a_group() -> None:
    before = list(RuleGroup._registry)
    machine_class(MachineSetup(REF, REF_DIR, "kvbm"))
    assert RuleGroup._registry == before


def test_offload_config_from_a_group_checks_the_host_tier_too() -> None:
    """With an offload tier, INV-ROUTER-MATCH covers host_pinned as well."""
    cls = machine_class(MachineSetup(REF, REF_DIR, "kvbm"), groups=[TickGroup])
    m = cls()
    cfg = ManagerConfig(
        profile="kvbm", capacity=4, eviction="lru", offload=OffloadConfig.legacy(num_g2_blocks=2, block_size_bytes=0)
    )
    m.start(cfg, frozenset({"tick", "finish"}))
    try:
        assert m.check is not None and m.check.tiers == ["device", "host_pinned"]
        for x in range(60):
            m.step(x * 7919)
        assert m.check.coverage[RuleId.INV_ROUTER_MATCH] == m.steps
    finally:
        m.teardown()


def test_base_kinds_follow_the_capabilities() -> None:
    caps = REF.capabilities.model_copy(update={"typed_errors": False, "promote": False})
    limited = REF.model_copy(update={"capabilities": caps})
    kinds = machine_class(MachineSetup(limited, REF_DIR, "kvbm")).optional_kinds()
    assert "invalid" not in kinds and "promote" not in kinds and "destroy" not in kinds
    assert "destroy" in machine_class(MachineSetup(REF, REF_DIR, "legacy")).optional_kinds()
    assert "fork" not in machine_class(MachineSetup(REF, REF_DIR, "atomic")).optional_kinds()


def test_an_adapter_that_cannot_start_is_reported_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first AdapterError stops the run's use of the adapter: later
    examples do nothing (Hypothesis has nothing to shrink, so a broken
    process is not restarted hundreds of times) and the error is raised once
    Hypothesis returns."""
    opened = Counter[str]()

    def open_implementation(manifest: Any, adapter_dir: Any, config: Any) -> Any:
        opened["n"] += 1
        raise AdapterError("adapter process exited during the handshake", exit_status=1)

    monkeypatch.setattr(mm, "open_implementation", open_implementation)
    cls = machine_class(MachineSetup(REF, REF_DIR, "kvbm"))
    with pytest.raises(AdapterError, match="handshake"):
        run_machine(cls, settings=settings(QUICK, phases=[Phase.generate, Phase.shrink]))
    assert opened["n"] == 1
    assert cls.adapter_failure is None  # reset for the next run


def test_a_crash_mid_run_is_reported_once_naming_the_rule_with_a_replay(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A process that dies at an operation the model answers: reported once,
    as the verdict naming the rule that decides the operation (DEREF-OWNER
    for a Deref), with the operations, the model's answer and a replay file;
    the transport's error is its cause."""
    from kvspec.adapters.reference.adapter import ReferenceImplementation
    from kvspec.spec.wire import Deref

    opened = Counter[str]()

    class CrashOnDeref(ReferenceImplementation):
        def step(self, op: Operation) -> StepOutcome:
            if isinstance(op, Deref):
                raise AdapterError("child exited", exit_status=9)
            return super().step(op)

    def open_implementation(manifest: Any, adapter_dir: Any, config: Any) -> Any:
        opened["n"] += 1
        return CrashOnDeref(config, manifest)

    monkeypatch.setattr(mm, "open_implementation", open_implementation)
    replay = tmp_path / "crash.jsonl"
    cls = machine_class(MachineSetup(REF, REF_DIR, "kvbm", replay_path=replay))
    with pytest.raises(ConformanceFailure, match="child exited") as ei:
        run_machine(cls, settings=settings(QUICK, phases=[Phase.generate, Phase.shrink]))
    assert opened["n"] == 1  # never started again after the crash
    assert ei.value.rule == RuleId.DEREF_OWNER
    assert "the implementation crashed at step" in ei.value.report and "the model answers" in ei.value.report
    assert f"replay file: {replay}" in ei.value.report and replay.exists()
    cause = ei.value.__cause__
    assert isinstance(cause, AdapterError)
    notes = "\n".join(getattr(cause, "__notes__", []))
    assert "operations so far" in notes and "Deref" in notes


def test_an_in_process_assert_names_the_rule_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """An implementation's own assert (in process) is a failure naming the
    operation's rule, shrunk by Hypothesis like any divergence."""
    from kvspec.adapters.reference.adapter import ReferenceImplementation
    from kvspec.spec.wire import Deref

    class AssertsOnDeref(ReferenceImplementation):
        def step(self, op: Operation) -> StepOutcome:
            if isinstance(op, Deref):
                raise AssertionError("ref_cnt > 0")
            return super().step(op)

    monkeypatch.setattr(mm, "open_implementation", lambda m, d, c: AssertsOnDeref(c, m))
    cls = machine_class(MachineSetup(REF, REF_DIR, "kvbm"))
    with pytest.raises(ConformanceFailure) as ei:
        run_machine(cls, settings=settings(QUICK, phases=[Phase.generate, Phase.shrink]))
    assert ei.value.rule == RuleId.DEREF_OWNER
    assert "--- its error (AssertionError) ---\nref_cnt > 0" in ei.value.report


HANGING_SERVER = """
import os, sys, time
from kvspec.adapters.reference_jsonl import server
from kvspec.spec.wire import Deref

with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()}\\n")
real = server.outcome_of


def outcome_of(model, op):
    if isinstance(op, Deref):
        time.sleep(600)  # hangs: the parent's per-call timeout must end it
    return real(model, op)


server.outcome_of = outcome_of
sys.exit(server.main())
"""


def test_a_hanging_subprocess_adapter_is_reported_once_and_cleaned_up(tmp_path: Path) -> None:
    import os

    from kvspec.conformance.transport.jsonl import reuse_children

    (tmp_path / "server.py").write_text(HANGING_SERVER)
    pids = tmp_path / "pids.txt"
    (tmp_path / "manifest.toml").write_text(
        'name = "hangs_on_deref"\nkind = "subprocess"\nprofile = "kvbm"\n[start]\n'
        f'command = ["{{python}}", "{{adapter_dir}}/server.py", "{pids}"]\ntimeout_s = 1.0\n'
        '[capabilities]\nprofiles = ["kvbm"]\npolicies = ["lru"]\n'
    )
    cls = machine_class(MachineSetup(load_manifest(tmp_path), tmp_path, "kvbm"))
    with reuse_children(), pytest.raises(ConformanceFailure, match="no reply") as ei:
        run_machine(cls, settings=settings(QUICK, phases=[Phase.generate, Phase.shrink]))
    assert ei.value.rule == RuleId.DEREF_OWNER and isinstance(ei.value.__cause__, AdapterError)
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 1, f"the adapter was started {len(started)} times"
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # no process left behind
    assert "operations so far" in "\n".join(getattr(ei.value.__cause__, "__notes__", []))
