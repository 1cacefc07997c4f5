"""``kvspec gate``: each kind of regression the issue names fails the gate
with its row in the table, the differences that are not regressions do not,
the spec-or-engine attribution follows the digests, and ``--update`` /
a missing baseline / an unreadable file behave as documented."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kvspec.cli import main
from kvspec.conformance.commands.gate import NOT_COMPARABLE, Change, compare
from kvspec.conformance.verdicts.provenance import Provenance, Versions
from kvspec.conformance.verdicts.results import (
    DeviationResult,
    ImplementationInfo,
    Results,
    RuleResult,
    SpecVersion,
    spec_version,
    write_results,
)

#: a suite run's provenance (written out, not computed by the code under test)
PROVENANCE = Provenance(
    versions=Versions(kvspec="0.1.0", spec_digest="0123456789abcdef", hypothesis="6.155.2", python="3.11.7"),
    effort="ci",
    hypothesis_seed="20260101",
    settings={"max_examples": 60, "stateful_step_count": 40, "derandomize": True},
    adapter_path="/repo/kvspec-adapter",
    profile="kvbm",
)

CAPS = {"offload": True, "profiles": ["kvbm", "atomic"], "max_capacity": 100, "tiers": ["device", "host_pinned"]}


def run_results(**kw: object) -> Results:
    base: dict[str, object] = {
        "tool": "pytest conformance",
        "spec": spec_version(),
        "implementation": ImplementationInfo(name="engine", kind="python"),
        "profile": "kvbm",
        "status": "clean",
        "exit_code": 0,
        "capabilities": dict(CAPS),
        "rules": {
            "USE-NEW": RuleResult(status="pass", exercised=100),
            "EVENT-ID": RuleResult(status="pass", exercised=50),
            "STORE-COPY": RuleResult(status="deviation", exercised=10, reason="copies", note="observed 2x"),
            "CLEAR-ALL": RuleResult(status="not_exercised"),
        },
        "deviations": [DeviationResult(rule="STORE-COPY", reason="copies", scope={"profile": "vllm"}, observed=2)],
        "provenance": PROVENANCE,
    }
    base.update(kw)
    return Results.model_validate(base)


def with_rule(r: Results, rid: str, **kw: object) -> Results:
    rules = dict(r.rules)
    rules[rid] = RuleResult.model_validate({**(rules[rid].model_dump() if rid in rules else {}), **kw})
    return r.model_copy(update={"rules": rules})


def blocking(changes: list[Change]) -> list[tuple[str, str]]:
    return [(c.kind, c.subject) for c in changes if c.blocking]


def test_the_same_run_passes() -> None:
    assert compare(run_results(), run_results()) == []


def test_a_passing_rule_that_fails_blocks() -> None:
    cur = with_rule(run_results(), "EVENT-ID", status="fail", failures=3, replays=["r.jsonl"])
    assert blocking(compare(run_results(), cur)) == [("passing rule fails", "EVENT-ID")]


def test_a_rule_not_exercised_before_that_fails_blocks() -> None:
    cur = with_rule(run_results(), "CLEAR-ALL", status="fail", failures=1)
    assert blocking(compare(run_results(), cur)) == [("rule fails", "CLEAR-ALL")]


def test_a_failure_kept_from_the_baseline_does_not_block_and_a_fix_is_noted() -> None:
    failing = with_rule(run_results(), "EVENT-ID", status="fail", failures=1)
    assert compare(failing, failing) == []
    changes = compare(failing, run_results())
    assert blocking(changes) == [] and [c.kind for c in changes] == ["failure fixed"]


@pytest.mark.parametrize(
    ("current", "kind"),
    [
        ([], "deviation gone"),
        (
            [
                DeviationResult(rule="STORE-COPY", reason="copies", scope={"profile": "vllm"}, observed=2),
                DeviationResult(rule="EVENT-ID", reason="ids from 1", observed=1),
            ],
            "new deviation",
        ),
        ([DeviationResult(rule="STORE-COPY", reason="copies", scope={"profile": None}, observed=2)], "new deviation"),
    ],
)
def test_a_deviation_that_appears_or_goes_blocks(current: list[DeviationResult], kind: str) -> None:
    changes = compare(run_results(), run_results(deviations=current))
    assert kind in [k for k, _ in blocking(changes)]


def test_a_deviation_observed_now_but_not_in_the_baseline_blocks() -> None:
    quiet = run_results(deviations=[DeviationResult(rule="STORE-COPY", reason="copies", scope={"profile": "vllm"})])
    assert blocking(compare(quiet, run_results())) == [("deviation now observed", "STORE-COPY")]
    # the other way round is noted (the suite itself fails such a run as an unexpected pass)
    changes = compare(run_results(), quiet)
    assert blocking(changes) == [] and changes[0].kind == "deviation no longer observed"


def test_a_timing_dependent_deviation_observed_now_is_noted_not_blocking() -> None:
    quiet = DeviationResult(rule="STORE-COPY", reason="copies", scope={"profile": "vllm"}, deterministic=False)
    seen = quiet.model_copy(update={"observed": 1})
    changes = compare(run_results(deviations=[quiet]), run_results(deviations=[seen]))
    assert blocking(changes) == [] and changes[0].kind == "deviation now observed (timing dependent)"


def test_coverage_to_zero_or_below_the_fraction_blocks() -> None:
    to_zero = with_rule(run_results(), "USE-NEW", status="not_exercised", exercised=0)
    assert blocking(compare(run_results(), to_zero)) == [("coverage dropped to zero", "USE-NEW")]
    low = with_rule(run_results(), "USE-NEW", exercised=40)
    assert blocking(compare(run_results(), low)) == [("coverage below 0.5 of baseline", "USE-NEW")]
    assert blocking(compare(run_results(), low, min_coverage=0.3)) == []
    assert blocking(compare(run_results(), low, min_coverage=0.0)) == []
    more = with_rule(run_results(), "USE-NEW", exercised=400)
    assert compare(run_results(), more) == []


@pytest.mark.parametrize(
    ("caps", "subject"),
    [
        ({**CAPS, "offload": False}, "offload"),
        ({**CAPS, "profiles": ["kvbm"]}, "profiles"),
        ({**CAPS, "max_capacity": 99}, "max_capacity"),
        ({k: v for k, v in CAPS.items() if k != "tiers"}, "tiers"),
    ],
)
def test_capabilities_that_shrink_block(caps: dict[str, object], subject: str) -> None:
    assert blocking(compare(run_results(), run_results(capabilities=caps))) == [("capability lost", subject)]


def test_coverage_drops_beside_a_new_failure_are_listed_as_its_consequence() -> None:
    cur = with_rule(run_results(), "EVENT-ID", status="fail", failures=1)
    cur = with_rule(cur, "USE-NEW", status="not_exercised", exercised=0)
    changes = compare(run_results(), cur)
    assert blocking(changes) == [("passing rule fails", "EVENT-ID")]
    assert ("coverage dropped to zero (may follow from the new failure)", "USE-NEW") in [
        (c.kind, c.subject) for c in changes
    ]


def test_capabilities_that_grow_do_not_block() -> None:
    changes = compare(run_results(), run_results(capabilities={**CAPS, "profiles": ["kvbm", "atomic", "legacy"]}))
    assert blocking(changes) == [] and changes[0].kind == "capability gained"


def test_a_run_that_did_not_complete_blocks_without_coverage_noise() -> None:
    broken = run_results(status="error", exit_code=2, rules={}, error="cannot load the adapter")
    assert blocking(compare(run_results(), broken)) == [("run did not complete", "-")]


def _other_spec(changed: str | None = None, new: str | None = None) -> SpecVersion:
    v = spec_version()
    rules = dict(v.rules)
    if changed:
        rules[changed] = "0" * 16
    if new:
        rules[new] = "1" * 16
    return SpecVersion(kvspec_version="9.9.9", digest="f" * 16, rules=rules)


def test_differences_are_attributed_to_the_spec_or_the_engine() -> None:
    base = run_results()
    same_spec = with_rule(run_results(), "EVENT-ID", status="fail", failures=1)
    assert {c.source for c in compare(base, same_spec)} == {"engine"}

    rule_changed = with_rule(run_results(spec=_other_spec(changed="EVENT-ID")), "EVENT-ID", status="fail", failures=1)
    rows = {c.subject: c for c in compare(base, rule_changed)}
    assert rows["EVENT-ID"].source == "spec: rule changed" and rows["EVENT-ID"].blocking
    assert rows["-"].kind == "kvspec changed" and "9.9.9" in rows["-"].current

    other_rule_changed = with_rule(
        run_results(spec=_other_spec(changed="USE-NEW")), "EVENT-ID", status="fail", failures=1
    )
    rows = {c.subject: c for c in compare(base, other_rule_changed)}
    assert rows["EVENT-ID"].source == "engine (kvspec changed, this rule did not)"

    new_rule = with_rule(run_results(spec=_other_spec(new="NEW-RULE")), "NEW-RULE", status="fail", failures=1)
    rows = {c.subject: c for c in compare(base, new_rule)}
    assert rows["NEW-RULE"].source == "spec: new rule" and rows["NEW-RULE"].kind == "rule fails"


def test_stream_findings_growing_in_a_failing_rule_are_noted() -> None:
    base = with_rule(run_results(), "EVENT-ID", status="fail", failures=2)
    cur = with_rule(run_results(), "EVENT-ID", status="fail", failures=5)
    changes = compare(base, cur)
    assert blocking(changes) == [] and changes[0].kind == "more findings"


# ------------------------------------------------------------------ command line


def _write(tmp: Path, name: str, r: Results) -> str:
    write_results(r, tmp / name)
    return str(tmp / name)


def test_cli_exit_codes_table_and_update(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, "good.json", run_results())
    bad = _write(tmp_path, "bad.json", with_rule(run_results(), "EVENT-ID", status="fail", failures=1))
    baseline = tmp_path / "ci" / "baseline.json"

    assert main(["gate", good, "--baseline", str(baseline)]) == 2
    assert "create it with --update" in capsys.readouterr().err
    assert main(["gate", good, "--baseline", str(baseline), "--update"]) == 0
    assert baseline.read_text() == Path(good).read_text()
    capsys.readouterr()

    assert main(["gate", good, "--baseline", str(baseline)]) == 0
    assert "passed: no regression" in capsys.readouterr().out

    assert main(["gate", bad, "--baseline", str(baseline)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  passing rule fails" in out and "EVENT-ID" in out and "FAILED: 1 regression" in out

    assert main(["gate", bad, "--baseline", str(baseline), "--markdown"]) == 1
    out = capsys.readouterr().out
    assert "| passing rule fails | `EVENT-ID` | pass (50x) | fail (1) | engine | **yes** |" in out

    # accepting the regression deliberately
    assert main(["gate", bad, "--baseline", str(baseline), "--update"]) == 0
    capsys.readouterr()
    assert main(["gate", bad, "--baseline", str(baseline)]) == 0


def test_cli_refuses_unreadable_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, "good.json", run_results())
    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    assert main(["gate", str(junk), "--baseline", good]) == 2
    assert "junk.json: not JSON" in capsys.readouterr().err
    assert main(["gate", good, "--baseline", str(junk)]) == 2
    assert "baseline:" in capsys.readouterr().err
    assert main(["gate", good, "--baseline", good, "--min-coverage", "2"]) == 2


def test_a_recorded_stream_is_gated_like_a_suite_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nightly streams: check-log's results of the clean Dynamo recording are
    the baseline; the same recording with one event dropped fails the gate on
    EVENT-ID, attributed to the engine."""
    rec = Path(__file__).parent / "data" / "dynamo-1.6.1-mocker-device.router.jsonl"
    lines = rec.read_text().splitlines()
    bad = tmp_path / "tonight.jsonl"
    bad.write_text("\n".join([lines[0], *lines[2:]]) + "\n")
    baseline, tonight = tmp_path / "stream-baseline.json", tmp_path / "tonight.json"
    assert main(["check-log", str(rec), "--json", str(baseline)]) == 0
    assert main(["check-log", str(bad), "--json", str(tonight)]) == 1
    capsys.readouterr()
    assert main(["gate", str(baseline), "--baseline", str(baseline)]) == 0
    capsys.readouterr()
    assert main(["gate", str(tonight), "--baseline", str(baseline), "--markdown"]) == 1
    out = capsys.readouterr().out
    assert "| passing rule fails | `EVENT-ID` |" in out and "| engine | **yes** |" in out


def _with_provenance(r: Results, *, versions: dict[str, str] | None = None, **kw: object) -> Results:
    prov = PROVENANCE.model_copy(update={**kw, "versions": PROVENANCE.versions.model_copy(update=versions or {})})
    return r.model_copy(update={"provenance": prov})


def test_runs_under_different_hypothesis_versions_are_not_comparable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same port under Hypothesis 6.155 and 6.170 got different coverage
    counts: the gate says NOT COMPARABLE (exit 3), not regressions and not a
    pass, even when the rules look better or the same."""
    baseline = _write(tmp_path, "baseline.json", run_results())
    for cur in (
        run_results(),  # the same rules: still not a pass
        with_rule(run_results(), "USE-NEW", exercised=1),  # a coverage drop: not a regression
    ):
        newer = _write(tmp_path, "newer.json", _with_provenance(cur, versions={"hypothesis": "6.170.17"}))
        assert main(["gate", newer, "--baseline", baseline]) == NOT_COMPARABLE == 3
        out = capsys.readouterr().out
        assert "NOT COMPARABLE" in out and "Hypothesis 6.155.2 vs 6.170.17" in out, out
        assert "regression" not in out.split("NOT COMPARABLE")[1].split(".")[0] and "passed" not in out
        assert re.search(r"FAIL\s+not comparable\s+Hypothesis\s+6\.155\.2\s+6\.170\.17", out), out
    # --update accepts the new run deliberately; then the gate compares again
    assert main(["gate", newer, "--baseline", baseline, "--update"]) == 0
    capsys.readouterr()
    assert main(["gate", newer, "--baseline", baseline]) == 0


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({"effort": "thorough"}, "effort ci vs thorough"),
        ({"settings": {**PROVENANCE.settings, "max_examples": 200}}, "effort setting max_examples 60 vs 200"),
        (
            {"settings": {**PROVENANCE.settings, "derandomize": False}, "hypothesis_seed": "7"},
            "seed 20260101 vs 7",
        ),
    ],
    ids=["effort", "budget", "random-seed"],
)
def test_other_traffic_deciding_differences_are_not_comparable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], what: str
) -> None:
    baseline = _write(tmp_path, "baseline.json", run_results())
    cur = _write(tmp_path, "cur.json", _with_provenance(run_results(), **change))
    assert main(["gate", cur, "--baseline", baseline]) == 3
    assert what in capsys.readouterr().out


def test_differences_that_do_not_decide_the_traffic_are_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A derandomised effort ignores the seed; another Python is listed, not judged."""
    baseline = _write(tmp_path, "baseline.json", run_results())
    cur = _write(
        tmp_path, "cur.json", _with_provenance(run_results(), hypothesis_seed="7", versions={"python": "3.12.1"})
    )
    assert main(["gate", cur, "--baseline", baseline]) == 0
    out = capsys.readouterr().out
    assert re.search(r"note\s+provenance differs\s+Python\s+3\.11\.7\s+3\.12\.1", out), out
    assert "seed" not in out


def test_a_baseline_that_records_no_provenance_is_not_comparable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A results file of format 2 does not say which Hypothesis generated it."""
    import json

    old = json.loads(run_results().to_json())
    old["format"] = 2
    del old["provenance"]
    baseline = tmp_path / "old.json"
    baseline.write_text(json.dumps(old))
    assert main(["gate", _write(tmp_path, "cur.json", run_results()), "--baseline", str(baseline)]) == 3
    out = capsys.readouterr().out
    assert "NOT COMPARABLE" in out and "the baseline does not record what generated its traffic" in out
    assert "results format 2" in out and "--update" in out
