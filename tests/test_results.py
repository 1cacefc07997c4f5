"""The results JSON: ``pytest conformance --kvspec-results FILE`` and
``kvspec check-log --json FILE`` write one model (format 2) that says per
rule pass / fail / deviation / not applicable / not exercised with counts,
the declared deviations with their scope and whether they were observed, the
failures with their replay files, the capabilities and the spec version.

The suite cases run real child pytest sessions against a small adapter
written here (the reference, or the reference that never publishes a
Removed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kvspec.conformance as conformance_pkg
from kvspec.cli import main
from kvspec.conformance.results import ERRORED, RESULTS_FORMAT, load_results, rule_text, spec_version
from kvspec.spec.errors import ConfigError
from kvspec.spec.rules import RULES

SUITE = Path(conformance_pkg.__file__).parent
DYNAMO = Path(__file__).parent / "data" / "dynamo-1.6.1-mocker-device.router.jsonl"

ADAPTER_MODULE = """
from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.spec.wire import StepOutcome


class DropsRemoved(ReferenceImplementation):
    def step(self, op):
        out = super().step(op)
        kept = [e for e in out.events if e.kind != "removed"]
        return StepOutcome.model_construct(**{**out.__dict__, "events": kept})


def open_plain(config, manifest, adapter_dir):
    return ReferenceImplementation(config, manifest)


def open_drops_removed(config, manifest, adapter_dir):
    return DropsRemoved(config, manifest)


def open_broken(config, manifest, adapter_dir):
    raise RuntimeError("the engine does not start")


class FailsOnUse(ReferenceImplementation):
    def step(self, op):
        raise RuntimeError("the engine crashed on its first operation")


def open_fails_on_use(config, manifest, adapter_dir):
    return FailsOnUse(config, manifest)
"""

DEVIATION = """
[[deviations]]
rule = "REMOVE-EXACT"
reason = "probe: never publishes Removed, in every operation (so rule-wide)"
scope = "all"
profile = "kvbm"
"""


def make_adapter(tmp: Path, factory: str, deviations: str = "") -> Path:
    (tmp / "results_probe_adapter.py").write_text(ADAPTER_MODULE)
    folder = tmp / "adapter"
    folder.mkdir()
    (folder / "manifest.toml").write_text(
        textwrap.dedent(
            f"""
            name = "probe"
            kind = "python"
            profile = "kvbm"
            [start]
            python = "results_probe_adapter:{factory}"
            [capabilities]
            profiles = ["kvbm"]
            policies = ["lineage", "lru"]
            offload = false
            swap_in = false
            """
        )
        + deviations
    )
    return folder


def run_suite(tmp: Path, adapter: Path, *tests: str, extra: tuple[str, ...] = ()) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(tmp) + os.pathsep + env.get("PYTHONPATH", "")
    out = tmp / "out" / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *(str(SUITE / t) for t in tests),
            f"--impl={adapter}",
            f"--kvspec-results={out}",
            f"--kvspec-replay-dir={tmp / 'replays'}",
            "-q",
            "-p",
            "no:cacheprovider",
            "--hypothesis-seed=1",
            *extra,
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    load_results(out)  # and it validates
    return proc.returncode, doc


def test_a_clean_run_says_per_rule_what_it_exercised_and_what_does_not_apply(tmp_path: Path) -> None:
    code, doc = run_suite(tmp_path, make_adapter(tmp_path, "open_plain"), "test_golden.py")
    assert code == 0
    assert doc["format"] == RESULTS_FORMAT and doc["tool"] == "pytest conformance"
    assert doc["status"] == "clean" and doc["exit_code"] == 0
    assert doc["implementation"]["name"] == "probe" and doc["profile"] == "kvbm"
    assert doc["capabilities"]["offload"] is False and doc["capabilities"]["policies"] == ["lineage", "lru"]
    assert doc["options"]["hypothesis_seed"] == "1"
    assert doc["spec"] == spec_version().model_dump(mode="json")
    assert set(doc["rules"]) == {str(r) for r in RULES}
    rules = doc["rules"]
    # golden scenarios of the kvbm profile name these rules
    assert rules["USE-NEW"]["status"] == "pass" and rules["USE-NEW"]["exercised"] > 0
    # the offload scenarios were skipped for the capability the adapter lacks
    assert rules["QUARANTINE-HOLD"]["status"] == "not_applicable"
    assert "offload" in rules["QUARANTINE-HOLD"]["note"]
    assert rules["INV-NO-DUP"]["status"] == "not_exercised"
    assert doc["failures"] == [] and doc["deviations"] == []
    assert doc["counts"]["passed"] > 0 and doc["counts"]["skipped"] > 0


def test_a_failure_names_its_rule_and_replay_file(tmp_path: Path) -> None:
    code, doc = run_suite(
        tmp_path, make_adapter(tmp_path, "open_drops_removed"), "test_stateful.py", extra=("-k", "lockstep and kvbm")
    )
    assert code == 1
    assert doc["status"] == "findings"
    r = doc["rules"]["REMOVE-EXACT"]
    assert r["status"] == "fail" and r["failures"] == 1
    (failure,) = [f for f in doc["failures"] if f["rule"] == "REMOVE-EXACT"]
    assert "test_lockstep[kvbm]" in failure["test"]
    assert failure["replay"] and Path(tmp_path, failure["replay"]).is_file()
    assert r["replays"] == [failure["replay"]]
    # other rules the same test exercised before the failure still count
    assert doc["rules"]["USE-NEW"]["status"] == "pass"


def test_a_declared_deviation_is_reported_with_its_scope_and_observation(tmp_path: Path) -> None:
    code, doc = run_suite(
        tmp_path,
        make_adapter(tmp_path, "open_drops_removed", DEVIATION),
        "test_golden.py",
    )
    assert code == 0
    (dev,) = doc["deviations"]
    assert dev["rule"] == "REMOVE-EXACT" and dev["reason"].startswith("probe: never publishes Removed")
    assert dev["scope"] == {"scope": "all", "profile": "kvbm"} and dev["observed"] >= 1
    assert dev["deterministic"] is True
    r = doc["rules"]["REMOVE-EXACT"]
    assert r["status"] == "deviation" and r["reason"] == dev["reason"] and "observed" in r["note"]
    assert doc["failures"] == []


def test_a_declared_deviation_not_observed_is_in_the_results(tmp_path: Path) -> None:
    code, doc = run_suite(tmp_path, make_adapter(tmp_path, "open_plain", DEVIATION), "test_golden.py")
    assert code == 1  # the plugin's unexpected pass
    assert doc["status"] == "findings"
    (dev,) = doc["deviations"]
    assert dev["observed"] == 0
    assert doc["rules"]["REMOVE-EXACT"]["note"] == "declared but not observed"


def test_an_engine_that_does_not_start_is_an_error_saying_why(tmp_path: Path) -> None:
    """The plugin starts the implementation once before the tests
    (conformance/startup.py): a start that fails ends the run as a usage
    error, and the results say why and that no rule was exercised."""
    code, doc = run_suite(tmp_path, make_adapter(tmp_path, "open_broken"), "test_golden.py")
    assert code == 4 and doc["status"] == "error"
    assert "the engine does not start" in doc["error"]
    assert doc["failures"] == []
    assert doc["rules"]["USE-NEW"]["status"] == "not_exercised"


def test_rules_whose_tests_error_out_are_not_exercised_saying_so(tmp_path: Path) -> None:
    code, doc = run_suite(tmp_path, make_adapter(tmp_path, "open_fails_on_use"), "test_golden.py")
    assert code == 1 and doc["status"] == "findings"
    assert doc["failures"] and all(f["rule"] is None for f in doc["failures"])
    assert "crashed on its first operation" in doc["failures"][0]["message"]
    r = doc["rules"]["USE-NEW"]
    assert r["status"] == "not_exercised" and r["note"].startswith(ERRORED)


def test_an_adapter_that_cannot_load_still_writes_results(tmp_path: Path) -> None:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "manifest.toml").write_text("name = 3\n")
    _, doc = run_suite(tmp_path, folder, "test_golden.py")
    assert doc["status"] == "error" and "invalid manifest" in doc["error"]


def test_check_log_writes_the_same_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = DYNAMO.read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], *lines[2:]]) + "\n")  # one event id skipped
    out = tmp_path / "r.json"
    assert main(["check-log", str(bad), "--json", str(out)]) == 1
    capsys.readouterr()
    res = load_results(out)
    assert res.tool == "kvspec check-log" and res.format == RESULTS_FORMAT
    assert res.implementation.name == "dynamo" and res.is_stream
    assert res.rules["EVENT-ID"].status == "fail" and res.rules["EVENT-ID"].failures == 1
    assert res.rules["PARENT-ANCHOR"].status == "pass"
    assert res.rules["PARENT-ANCHOR"].exercised == res.counts["events"] > 0
    assert res.rules["USE-NEW"].status == "not_applicable"
    assert res.spec == spec_version()


def test_check_log_ignored_rule_is_not_exercised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert main(["check-log", str(DYNAMO), "--json", str(out), "--ignore", "EVENT-ID"]) == 0
    capsys.readouterr()
    res = load_results(out)
    assert res.rules["EVENT-ID"].status == "not_exercised" and "ignored" in res.rules["EVENT-ID"].note


def test_format_1_stream_results_are_read(tmp_path: Path) -> None:
    old = {
        "format": 1,
        "tool": "kvspec check-log",
        "kvspec_version": "0.1.0",
        "spec_version": "0.1.0+rules.3f2a9c1b0d4e",
        "input": {"path": "t.jsonl", "format": "router", "producer": "dynamo"},
        "status": "findings",
        "exit_code": 1,
        "counts": {"events": 10},
        "findings_by_rule": {"EVENT-ID": 2},
        "ignored_by_rule": {},
        "findings": [],
        "warnings": [],
        "error": None,
    }
    p = tmp_path / "old.json"
    p.write_text(json.dumps(old))
    res = load_results(p)
    assert res.rules["EVENT-ID"].status == "fail" and res.rules["EVENT-ID"].failures == 2
    assert res.rules["PARENT-ANCHOR"].status == "pass" and res.spec.digest == "3f2a9c1b0d4e"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{", "not JSON"),
        ("[]", "no 'format' field"),
        ('{"format": 99}', "results format 99"),
        ('{"format": 2, "tool": "x"}', "invalid results file"),
    ],
)
def test_a_bad_results_file_is_refused_naming_the_problem(tmp_path: Path, text: str, expected: str) -> None:
    p = tmp_path / "r.json"
    p.write_text(text)
    with pytest.raises(ConfigError, match=expected) as e:
        load_results(p)
    assert str(p) in str(e.value)


def test_rule_digests_change_only_with_the_rule() -> None:
    v = spec_version()
    assert set(v.rules) == {str(r) for r in RULES}
    assert len(set(v.rules.values())) == len(RULES)  # each rule's text is its own
    assert rule_text("EVENT-ID").startswith("EVENT-ID: event ids start at 0")
