"""Incomplete runs: a rule that applies and was never exercised is not a pass.

The reference's whole-suite run exercises every rule that applies to it
(its rules table lists none as never exercised). An adapter whose run
exercises nothing of what applies to it (here: a request-level engine that
cannot run on this machine) ends **incomplete**: the summary names the
rules, the results file and JUnit carry the outcome, the session fails
unless ``--kvspec-allow-incomplete`` is given; a single test module is not
judged. ``applicability`` says which rules apply to which manifest, the
gate blocks a newly incomplete run, and a mutant campaign counts a run that
is only incomplete as a survivor (the sanity run as an error).
"""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from kvspec.conformance.commands import mutants as campaign
from kvspec.conformance.commands.gate import compare
from kvspec.conformance.run.manifest import load_impl, load_manifest
from kvspec.conformance.verdicts.applicability import MODEL_ONLY, applicable_rules, not_applicable_reason
from kvspec.conformance.verdicts.results import (
    ImplementationInfo,
    Results,
    RuleResult,
    spec_version,
)
from kvspec.spec.rules import RULES

SUITE = Path(__file__).resolve().parents[1] / "kvspec" / "conformance"

UNAVAILABLE = """
from kvspec.conformance.requests.interface import ImplementationUnavailableError


def open_unavailable(setup, manifest, adapter_dir):
    raise ImplementationUnavailableError("the engine's wheel is not installed here")
"""

MANIFEST = """
name = "unavailable"
kind = "request"
profile = "vllm"
[start]
python = "unavailable_adapter:open_unavailable"
[capabilities]
block_level = false
request_level = true
partial_blocks = false
promote = false
typed_errors = false
policies = ["lru"]
reset = true
"""


@pytest.fixture
def unavailable(tmp_path: Path) -> Path:
    (tmp_path / "unavailable_adapter.py").write_text(UNAVAILABLE)
    folder = tmp_path / "unavailable"
    folder.mkdir()
    (folder / "manifest.toml").write_text(textwrap.dedent(MANIFEST))
    return folder


def _props(junit: Path) -> dict[str, str]:
    """The run-level properties the plugin writes into the JUnit report."""
    wanted = ("kvspec_outcome", "kvspec_rules_not_exercised")
    root = ET.parse(junit).getroot()
    return {str(p.get("name")): p.get("value") or "" for p in root.iter("property") if p.get("name") in wanted}


def test_the_reference_whole_suite_run_exercises_every_rule_that_applies(
    tmp_path: Path, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    out_file, junit = tmp_path / "r.json", tmp_path / "j.xml"
    code, out = child_pytest(
        str(SUITE), "--impl=adapters/reference", f"--kvspec-results={out_file}", f"--junitxml={junit}"
    )
    assert code == 0, out[-4000:]
    doc = json.loads(out_file.read_text())
    assert doc["status"] == "clean" and doc["incomplete"] == [] and doc["options"]["whole_suite"]
    unexercised = {r: v for r, v in doc["rules"].items() if v["status"] not in ("pass", "not_applicable")}
    assert unexercised == {}
    assert "APPLIES, never exercised" not in out and "INCOMPLETE" not in out
    # the rules the issue named as never exercised are now
    for rid in ("CLEAR-ALL", "INV-OWNERS", "INV-NO-DUP", "DESTROY-ACTIVE"):
        assert doc["rules"][rid]["status"] == "pass" and doc["rules"][rid]["exercised"] > 0, rid
    assert _props(junit)["kvspec_outcome"] == "pass"


def test_a_run_that_exercises_nothing_that_applies_is_incomplete_and_fails(
    tmp_path: Path, unavailable: Path, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    out_file, junit = tmp_path / "r.json", tmp_path / "j.xml"
    code, out = child_pytest(str(SUITE), f"--impl={unavailable}", f"--kvspec-results={out_file}", f"--junitxml={junit}")
    assert code == 1, out[-4000:]
    assert "kvspec: INCOMPLETE:" in out and "CLEAR-ALL" in out.split("kvspec: INCOMPLETE:")[1]
    assert "--kvspec-allow-incomplete" in out
    doc = json.loads(out_file.read_text())
    assert doc["status"] == "incomplete" and doc["exit_code"] == 1
    assert {"CLEAR-ALL", "STORE-COPY", "VLLM-PREFIX-HIT"} <= set(doc["incomplete"])
    assert doc["rules"]["CLEAR-ALL"]["status"] == "not_exercised"
    assert doc["rules"]["DESTROY-ACTIVE"]["status"] == "not_applicable"
    props = _props(junit)
    assert props["kvspec_outcome"] == "incomplete" and "CLEAR-ALL" in props["kvspec_rules_not_exercised"].split()


def test_allow_incomplete_passes_the_run_but_still_reports_it(
    tmp_path: Path, unavailable: Path, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    out_file = tmp_path / "r.json"
    code, out = child_pytest(
        str(SUITE), f"--impl={unavailable}", f"--kvspec-results={out_file}", "--kvspec-allow-incomplete"
    )
    assert code == 0, out[-4000:]
    assert "kvspec: INCOMPLETE:" in out and "the run does not fail for it" in out
    doc = json.loads(out_file.read_text())
    assert doc["status"] == "incomplete" and doc["exit_code"] == 0 and "CLEAR-ALL" in doc["incomplete"]


def test_one_test_module_is_not_judged(
    tmp_path: Path, unavailable: Path, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    out_file, junit = tmp_path / "r.json", tmp_path / "j.xml"
    code, out = child_pytest(
        str(SUITE / "test_reset.py"), f"--impl={unavailable}", f"--kvspec-results={out_file}", f"--junitxml={junit}"
    )
    assert code == 0, out[-4000:]
    assert "INCOMPLETE" not in out
    doc = json.loads(out_file.read_text())
    assert doc["incomplete"] == [] and not doc["options"]["whole_suite"]
    assert _props(junit)["kvspec_outcome"].startswith("not judged")


# ------------------------------------------------------------------ which rules apply


def test_applicability_follows_profiles_and_capabilities() -> None:
    _, ref = load_impl("adapters/reference")
    _, c_port = load_impl("adapters/c_port")
    _, vllm = load_impl("adapters/vllm")
    assert {"CLEAR-ALL", "DESTROY-ACTIVE", "INV-OWNERS", "INV-NO-DUP", "SWAPIN-ANCHOR"} <= set(applicable_rules(ref))
    # c_port: kvbm only, no offload, no destroy, no requests
    assert not_applicable_reason("DESTROY-ACTIVE", c_port) is not None
    assert "missing capability offload" in (not_applicable_reason("QUARANTINE-HOLD", c_port) or "")
    assert not_applicable_reason("INV-OWNERS", c_port) is None
    assert "missing capability request_level" in (not_applicable_reason("CLEAR-ALL", c_port) or "")
    # the real vLLM adapter declares reset: CLEAR-ALL applies, the G1 rules do not
    assert not_applicable_reason("CLEAR-ALL", vllm) is None
    assert not_applicable_reason("USE-HIT-ACTIVE", vllm) is not None
    # invariants no step compares on an implementation are the model's (kvspec prove)
    assert not_applicable_reason("INV-RADIX-TREE", ref) == MODEL_ONLY


def test_every_rule_either_applies_to_the_reference_or_says_why_not() -> None:
    _, ref = load_impl("adapters/reference")
    for rid in RULES:
        why = not_applicable_reason(rid, ref)
        assert why is None or why.strip(), rid


def test_reset_without_a_vllm_profile_is_refused_not_ignored(tmp_path: Path) -> None:
    (tmp_path / "manifest.toml").write_text(
        'name = "x"\nkind = "python"\nprofile = "kvbm"\n[capabilities]\nreset = true\n'
    )
    with pytest.raises(Exception, match="reset = true does nothing"):
        load_manifest(tmp_path)


# ------------------------------------------------------------------ gate and campaign


def _results(status: str, incomplete: list[str]) -> Results:
    rules = {str(r): RuleResult(status="pass", exercised=5) for r in RULES}
    for rid in incomplete:
        rules[rid] = RuleResult(status="not_exercised", note="never reached")
    return Results(
        tool="pytest conformance",
        spec=spec_version(),
        implementation=ImplementationInfo(name="engine"),
        profile="vllm",
        status=status,  # type: ignore[arg-type]
        exit_code=1 if status == "incomplete" else 0,
        rules=rules,
        incomplete=incomplete,
    )


def test_the_gate_blocks_a_newly_incomplete_run_and_notes_an_accepted_one() -> None:
    changes = compare(_results("clean", []), _results("incomplete", ["CLEAR-ALL"]))
    blocking = [(c.kind, c.subject) for c in changes if c.blocking]
    assert ("run incomplete", "-") in blocking
    assert ("rule never exercised (run incomplete)", "CLEAR-ALL") in blocking
    assert not any(c.kind.startswith("coverage") for c in changes)  # its own row, not a coverage drop
    accepted = compare(_results("incomplete", ["CLEAR-ALL"]), _results("incomplete", ["CLEAR-ALL"]))
    assert [c for c in accepted if c.blocking] == []
    assert any(c.subject == "CLEAR-ALL" and c.baseline == "incomplete (accepted)" for c in accepted)


def _junit(tmp_path: Path, outcome: str, rules: str) -> Path:
    p = tmp_path / "j.xml"
    p.write_text(
        '<testsuites><testsuite name="pytest"><properties>'
        f'<property name="kvspec_outcome" value="{outcome}"/>'
        f'<property name="kvspec_rules_not_exercised" value="{rules}"/>'
        '</properties><testcase classname="x" name="t"/></testsuite></testsuites>'
    )
    return p


def test_a_mutant_run_that_is_only_incomplete_survived_and_the_sanity_run_errs(tmp_path: Path) -> None:
    junit = _junit(tmp_path, "incomplete", "CLEAR-ALL")
    survived = campaign.classify("some_mutant", 1, junit, "", 1.0)
    assert survived.status == "passed" and "CLEAR-ALL" in survived.detail
    assert campaign.classify(campaign.UNMUTATED, 1, junit, "", 1.0).status == "error"
