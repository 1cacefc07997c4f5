"""The results JSON: ``pytest conformance --kvspec-results FILE`` and
``kvspec check-log --json FILE`` write one model (format 3) that says per
rule pass / fail / deviation / not applicable / not exercised with counts,
the declared deviations with their scope and whether they were observed, the
failures with their replay files, the capabilities, the spec version and
the run's provenance (the versions and settings that decided its traffic).

The suite cases run real child pytest sessions against a small adapter
(the probe adapters of tests/conftest.py: the reference, or the reference
that never publishes a Removed, does not start or fails on its first
operation)."""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis
import pytest

import kvspec
import kvspec.conformance as conformance_pkg
from kvspec.cli import main
from kvspec.conformance.verdicts.results import ERRORED, RESULTS_FORMAT, load_results, rule_text, spec_version
from kvspec.spec.errors import ConfigError
from kvspec.spec.rules import RULES

SUITE = Path(conformance_pkg.__file__).parent
DYNAMO = Path(__file__).parent / "data" / "dynamo-1.6.1-mocker-device.router.jsonl"

DEVIATION = """
[[deviations]]
rule = "REMOVE-EXACT"
reason = "probe: never publishes Removed, in every operation (so rule-wide)"
scope = "all"
profile = "kvbm"
"""

#: ``probe(factory, deviations="")`` -> the adapter folder
Probe = Callable[..., Path]
#: ``suite(adapter, *test_modules, extra=())`` -> (exit code, results document)
Suite = Callable[..., tuple[int, dict[str, Any]]]


@pytest.fixture
def probe(probe_adapter: Callable[..., Path]) -> Probe:
    """The conftest's probe adapter ``factory`` (``open_plain``,
    ``open_drops_removed``, ``open_broken``, ``open_fails_on_use``) as adapter
    "probe" in ``tmp_path/adapter``: kvbm profile, lineage and lru policies, no
    offload, the given deviations."""
    return lambda factory, deviations="": probe_adapter(
        "probe", factory, folder="adapter", capabilities="offload = false\nswap_in = false", deviations=deviations
    )


@pytest.fixture
def suite(tmp_path: Path, child_pytest: Callable[..., tuple[int, str]]) -> Suite:
    """The given conformance modules in a child pytest against ``adapter``
    (default effort, derandomised: no seed; results to ``tmp_path/out/results.json``): its exit code and the
    results document, which must exist and validate."""

    def run(adapter: Path, *tests: str, extra: tuple[str, ...] = ()) -> tuple[int, dict[str, Any]]:
        out = tmp_path / "out" / "results.json"
        code, output = child_pytest(
            *(str(SUITE / t) for t in tests),
            f"--impl={adapter}",
            f"--kvspec-results={out}",
            "-q",
            *extra,
        )
        assert out.is_file(), output[-5000:]
        doc = json.loads(out.read_text())
        load_results(out)  # and it validates
        return code, doc

    return run


def test_a_clean_run_says_per_rule_what_it_exercised_and_what_does_not_apply(probe: Probe, suite: Suite) -> None:
    code, doc = suite(probe("open_plain"), "test_golden.py")
    assert code == 0
    assert doc["format"] == RESULTS_FORMAT and doc["tool"] == "pytest conformance"
    assert doc["status"] == "clean" and doc["exit_code"] == 0
    assert doc["implementation"]["name"] == "probe" and doc["profile"] == "kvbm"
    assert doc["capabilities"]["offload"] is False and doc["capabilities"]["policies"] == ["lineage", "lru"]
    assert doc["options"]["hypothesis_seed"] is None
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
    # what decided the traffic: versions read from the packages, not from kvspec's code
    prov = doc["provenance"]
    assert prov["versions"]["hypothesis"] == hypothesis.__version__
    assert prov["versions"]["python"] == platform.python_version()
    assert prov["versions"]["kvspec"] == kvspec.__version__
    assert prov["versions"]["spec_digest"] == doc["spec"]["digest"]
    assert prov["effort"] == "default" and prov["hypothesis_seed"] is None
    assert prov["settings"] == {"max_examples": 60, "stateful_step_count": 40, "derandomize": True}
    assert prov["adapter_path"].endswith("/adapter") and prov["variant"] is None
    assert prov["profile"] == "kvbm" and prov["profile_options"] == {}


def test_a_format_2_file_still_loads_without_provenance(tmp_path: Path) -> None:
    """A results file of the previous format is read; it records no
    provenance (whatever it holds), which the gate reports as such."""
    doc = {
        "format": 2,
        "tool": "pytest conformance",
        "spec": {"kvspec_version": "0.1.0", "digest": "abc"},
        "implementation": {"name": "x"},
        "status": "clean",
        "exit_code": 0,
        "provenance": {"versions": {"kvspec": "0", "spec_digest": "0", "hypothesis": "1", "python": "3"}},
    }
    p = tmp_path / "old.json"
    p.write_text(json.dumps(doc))
    res = load_results(p)
    assert res.format == 2 and res.provenance is None


def test_a_failure_names_its_rule_and_replay_file(tmp_path: Path, probe: Probe, suite: Suite) -> None:
    code, doc = suite(probe("open_drops_removed"), "test_stateful.py", extra=("-k", "lockstep and kvbm"))
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


def test_a_declared_deviation_is_reported_with_its_scope_and_observation(probe: Probe, suite: Suite) -> None:
    code, doc = suite(
        probe("open_drops_removed", DEVIATION),
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


def test_a_declared_deviation_not_observed_is_in_the_results(probe: Probe, suite: Suite) -> None:
    code, doc = suite(probe("open_plain", DEVIATION), "test_golden.py")
    assert code == 1  # the plugin's unexpected pass
    assert doc["status"] == "findings"
    (dev,) = doc["deviations"]
    assert dev["observed"] == 0
    assert doc["rules"]["REMOVE-EXACT"]["note"] == "declared but not observed"


def test_an_engine_that_does_not_start_is_an_error_saying_why(probe: Probe, suite: Suite) -> None:
    """The plugin starts the implementation once before the tests
    (conformance/run/startup.py): a start that fails ends the run as a usage
    error, and the results say why and that no rule was exercised."""
    code, doc = suite(probe("open_broken"), "test_golden.py")
    assert code == 4 and doc["status"] == "error"
    assert "the engine does not start" in doc["error"]
    assert doc["failures"] == []
    assert doc["rules"]["USE-NEW"]["status"] == "not_exercised"


def test_rules_whose_tests_error_out_are_not_exercised_saying_so(probe: Probe, suite: Suite) -> None:
    code, doc = suite(probe("open_fails_on_use"), "test_golden.py")
    assert code == 1 and doc["status"] == "findings"
    assert doc["failures"] and all(f["rule"] is None for f in doc["failures"])
    assert "crashed on its first operation" in doc["failures"][0]["message"]
    r = doc["rules"]["USE-NEW"]
    assert r["status"] == "not_exercised" and r["note"].startswith(ERRORED)


def test_an_adapter_that_cannot_load_still_writes_results(tmp_path: Path, suite: Suite) -> None:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "manifest.toml").write_text("name = 3\n")
    _, doc = suite(folder, "test_golden.py")
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
