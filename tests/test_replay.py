"""Replay files: a real failure found by the lockstep machine (an adapter that
drops its Removed events) writes one, ``kvspec replay`` reproduces the same
rule from it, the reference passes it, and bad files are refused clearly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvspec import cli
from kvspec.conformance.block.lockstep import Lockstep
from kvspec.conformance.block.machine import MachineSetup, machine_class
from kvspec.conformance.run.manifest import load_manifest
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.conformance.verdicts.replay_file import load_replay
from kvspec.spec.config import ManagerConfig
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Deref, FullBlock, Operation, Plh, Use

BROKEN_MODULE = '''
"""The reference, except that it never publishes a Removed event."""
from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.spec.errors import AdapterError
from kvspec.spec.wire import Deref


class DropRemoved(ReferenceImplementation):
    def step(self, op):
        out = super().step(op)
        return out.model_copy(update={"events": [e for e in out.events if e.kind != "removed"]})


class CrashOnDeref(ReferenceImplementation):
    def step(self, op):
        if isinstance(op, Deref):
            raise AdapterError("child exited", exit_status=9)
        return super().step(op)


def open_drop_removed(config, manifest, adapter_dir):
    return DropRemoved(config, manifest)


def open_crash(config, manifest, adapter_dir):
    return CrashOnDeref(config, manifest)
'''

MANIFEST = """
name = "{name}"
kind = "python"
profile = "kvbm"
[start]
python = "kvspec_test_broken_adapters:{factory}"
[capabilities]
profiles = ["kvbm"]
policies = ["lineage", "lru", "multi_lru", "unordered"]
"""


def _adapter(root: Path, name: str, factory: str) -> Path:
    d = root / name
    d.mkdir()
    (d / "manifest.toml").write_text(MANIFEST.format(name=name, factory=factory))
    return d


@pytest.fixture
def adapters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    (tmp_path / "kvspec_test_broken_adapters.py").write_text(textwrap.dedent(BROKEN_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return {
        "drop_removed": _adapter(tmp_path, "drop_removed", "open_drop_removed"),
        "crash": _adapter(tmp_path, "crash", "open_crash"),
    }


def test_a_machine_failure_replays_with_the_same_rule(
    adapters: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = adapters["drop_removed"]
    replay_path = tmp_path / "replays" / "drop_removed.jsonl"
    setup = MachineSetup(load_manifest(broken), broken, "kvbm", replay_path=replay_path)
    with pytest.raises(ConformanceFailure) as ei:
        run_state_machine_as_test(
            machine_class(setup),
            settings=settings(
                max_examples=200,
                stateful_step_count=30,
                database=None,
                derandomize=True,
                deadline=None,
                report_multiple_bugs=False,
                suppress_health_check=list(HealthCheck),
                # without the explain phase (which only annotates the report with the steps that
                # could vary, after the shrink has fixed the sequence the replay file holds): it
                # was 60% of this test's time
                phases=[p for p in Phase if p is not Phase.explain],
            ),
        )
    assert ei.value.rule == RuleId.REMOVE_EXACT
    assert f"replay file: {replay_path}" in ei.value.report

    rf = load_replay(replay_path)
    assert rf.adapter == "drop_removed" and rf.config.profile == "kvbm"
    assert rf.failure is not None and rf.failure["rule"] == "REMOVE-EXACT"
    assert rf.failure["step"] == len(rf.ops) - 1  # the file ends at the failing operation
    assert len(rf.ops) <= 6, "the file holds the shrunk sequence"
    assert all(e is not None for e in rf.expected)

    assert cli.main(["replay", str(replay_path), "--impl", str(broken)]) == 1
    out = capsys.readouterr().out
    assert f"replay FAILED at step {rf.failure['step']}: rule REMOVE-EXACT" in out
    assert "first divergence" in out and "step | operation" in out

    assert cli.main(["replay", str(replay_path), "--impl", "adapters/reference"]) == 0
    out = capsys.readouterr().out
    assert f"replay passed ({len(rf.ops)} steps)" in out
    assert "note:" not in out  # the model still expects what the file recorded


def _write_failure(path: Path, adapter_name: str) -> None:
    """A replay file from a direct lockstep failure (capacity 1: the second
    Use evicts, and the broken implementation drops that Removed)."""
    import kvspec_test_broken_adapters as mod  # type: ignore[import-not-found]

    config = ManagerConfig(profile="kvbm", capacity=1, eviction="lru")
    impl = mod.DropRemoved(config, None)
    ls = Lockstep(impl, config, adapter=adapter_name, replay_path=path)
    ops: list[Operation] = [
        Use(blocks=[FullBlock(full=1)], plhs=[Plh(hash=1)]),
        Deref(blocks=[FullBlock(full=1)]),
        Use(blocks=[FullBlock(full=2)], plhs=[Plh(hash=2)]),
    ]
    with pytest.raises(ConformanceFailure):
        for op in ops:
            ls.step(op)


def test_a_file_that_records_no_implementation_is_refused_without_impl(
    adapters: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that names an adapter but not its folder (no replay target, as
    an older kvspec wrote them) is not run against whatever the name finds:
    that printed "passed" for the bundled reference instead of the port."""
    path = tmp_path / "r.jsonl"
    _write_failure(path, "reference")  # names the bundled reference, records no folder
    assert cli.main(["replay", str(path)]) == 2
    out = capsys.readouterr().out
    assert "does not record the adapter folder" in out and "--impl=" in out, out
    assert "replay passed" not in out and "against reference" not in out
    # with --impl it runs (and says against what)
    assert cli.main(["replay", str(path), f"--impl={adapters['drop_removed']}"]) == 1
    out = capsys.readouterr().out
    assert "rule REMOVE-EXACT" in out and f"against {adapters['drop_removed']}" in out


def test_replay_reports_model_drift(
    adapters: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.jsonl"
    _write_failure(path, "drop_removed")
    lines = path.read_text().splitlines()
    rec = json.loads(lines[1])
    rec["expect"]["counters"]["free_blocks"] = 99  # as if the spec had changed since
    lines[1] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")
    assert cli.main(["replay", str(path), "--impl", "adapters/reference"]) == 0
    out = capsys.readouterr().out
    assert "now expects something different from the file at step(s) 0" in out


def test_an_adapter_that_crashes_during_replay_is_exit_2(
    adapters: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.jsonl"
    _write_failure(path, "drop_removed")
    assert cli.main(["replay", str(path), "--impl", str(adapters["crash"])]) == 2
    out = capsys.readouterr().out
    assert "cannot run" in out and "child exited" in out and "exit status 9" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty file"),
        ("not json\n", ":1: header is not JSON"),
        ('{"something": 1}\n', "not a kvspec replay header"),
        ('{"kvspec_replay": 1, "config": {"capacity": 0}}\n', ":1: invalid config"),
        (
            '{"kvspec_replay": 1, "config": {"capacity": 2}}\n{"op": {"op": "use", "blocks": "x"}}\n',
            ":2: invalid operation",
        ),
        (
            '{"kvspec_replay": 1, "config": {"capacity": 2}}\n{"op": {"op": "deref", "blocks": []}}\n[1]\n',
            ':3: expected an object with an "op"',
        ),
    ],
    ids=["empty", "garbage", "not-replay", "bad-config", "bad-op", "bad-line"],
)
def test_bad_replay_files_are_refused_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert cli.main(["replay", str(path)]) == 2
    assert message in capsys.readouterr().out


def test_a_binary_replay_file_is_refused_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b'{"kvspec_replay": 1}\n\xef\xbf\x00\xff\xfe garbage')
    assert cli.main(["replay", str(path)]) == 2
    out = capsys.readouterr().out
    assert "is not UTF-8 text" in out and "Traceback" not in out


def test_kvspec_version(capsys: pytest.CaptureFixture[str]) -> None:
    import kvspec

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"kvspec {kvspec.__version__}"


def test_kvspec_replay_command_line(tmp_path: Path, adapters: dict[str, Path]) -> None:
    """The installed command, in a child process, on the reference."""
    path = tmp_path / "r.jsonl"
    _write_failure(path, "reference")
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec", "replay", str(path), "--impl=adapters/reference"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "replay passed (3 steps)" in proc.stdout
