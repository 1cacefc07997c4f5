"""What a conformance run prints (issue 10): the header names the adapter,
its profiles, policies, semantics options, capabilities, protocol and the
effort; a failure shows its readable report before any traceback; the
rules table has a legend and lists the rules never exercised with the
reason; ``--junitxml`` tags every test case with its rules and the
implementation; a long run shows progress lines.

Each end-to-end case runs the suite in a child pytest against a small
adapter written to its temporary folder (the reference, but it never
publishes a Removed; tests/conftest.py).
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis
import pytest

import kvspec.conformance as conformance_pkg
from kvspec.conformance.run.progress import DEFAULT_INTERVAL, Progress, interval
from kvspec.spec.rules import RULES

SUITE = Path(conformance_pkg.__file__).parent


@pytest.fixture
def adapter(drops_removed_adapter: Callable[[str], Path]) -> Path:
    return drops_removed_adapter("probe")


def _section(out: str, title: str) -> str:
    """The text of the first failure section whose title contains ``title``."""
    m = re.search(rf"_+ [^\n]*{re.escape(title)}[^\n]* _+\n(.*?)(?=\n_{{5,}} |\n={{5,}} )", out, re.S)
    assert m, out[-4000:]
    return m.group(1)


def test_golden_run_header_failure_first_rules_table_and_junit(
    tmp_path: Path, adapter: Path, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    junit = tmp_path / "junit.xml"
    code, out = child_pytest(str(SUITE / "test_golden.py"), "--impl=probe", f"--junitxml={junit}")
    assert code == 1, out[-4000:]

    # the header
    assert f"kvspec adapter: probe at {adapter.resolve()} (--impl=probe)" in out
    assert "kvspec profiles: kvbm (claimed)\n" in out
    assert "kvspec policies: lineage, lru; semantics options: defaults" in out
    caps = next(line for line in out.splitlines() if line.startswith("kvspec capabilities:"))
    assert "block_level" in caps and "not declared:" in caps and "offload" in caps.split("not declared:")[1]
    assert "kvspec protocol: in-process" in out
    assert "kvspec effort: default (60 examples per test, 40 steps, derandomised)" in out
    assert "also kvbm" not in out

    # failure first: the report, then where it was raised; no source or reprs
    sec = _section(out, "kvbm/")
    assert sec.startswith("kvspec: [REMOVE-EXACT] scenario "), sec[:500]
    assert sec.index("first divergence") < sec.index("raised at")
    assert "test_golden.py:" in sec.split("raised at")[1]
    assert "kvspec_manifest = Manifest(" not in sec and "def test_golden_scenario" not in sec

    # the rules table: legend, counts, and the rules never exercised with why
    table = out.split("kvspec: rules exercised", 1)[1]
    assert "legend: RULE COUNT" in table
    assert re.search(r"never exercised \(\d+ of \d+ rules\):", table)
    assert re.search(r"QUARANTINE-HOLD\s+does not apply: missing capability .*offload", table), table
    assert re.search(r"INV-NO-DUP\s+APPLIES, never exercised: no test of this run covers it", table), table

    # JUnit: every test case carries its rules and the implementation
    cases = ET.parse(junit).getroot().iter("testcase")
    known = {str(r) for r in RULES}
    n = 0
    for case in cases:
        props = {p.get("name"): p.get("value") or "" for p in case.iter("property")}
        assert set(props["kvspec_rules"].split()) <= known and props["kvspec_rules"], props
        assert props["kvspec_impl"] == "probe" and props["kvspec_adapter_path"] == str(adapter.resolve())
        assert props["kvspec_variant"] == "" and props["kvspec_profiles"] == "kvbm"
        assert props["kvspec_effort"] == "default"
        n += 1
    assert n > 50


def test_with_v_the_full_traceback_follows_the_report(
    adapter: Path, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    code, out = child_pytest(str(SUITE / "test_golden.py"), "--impl=probe", "-v", "-k", "kvbm and evict")
    assert code == 1, out[-4000:]
    sec = _section(out, "kvbm/")
    assert sec.startswith("kvspec: [REMOVE-EXACT] scenario ")
    assert sec.index("first divergence") < sec.index("---- traceback (pytest) ----")
    assert "def test_golden_scenario" in sec.split("---- traceback (pytest) ----")[1]


def test_a_lockstep_failure_shows_its_table_first_and_progress_lines(
    adapter: Path, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    code, out = child_pytest(
        str(SUITE / "test_stateful.py"),
        "--impl=probe",
        "-q",
        "-k",
        "test_lockstep and kvbm",
        "--kvspec-progress=0.2",
    )
    assert code == 1, out[-4000:]
    sec = _section(out, "test_lockstep[kvbm]")
    assert sec.startswith("kvspec: [REMOVE-EXACT] lockstep divergence at step"), sec[:500]
    # Hypothesis's minimal failing case under kvspec's own heading, whatever
    # this Hypothesis calls it ("Falsifying example" or "Failing test case")
    heading = f"minimal failing case (Hypothesis {hypothesis.__version__}):\nstate = "
    assert sec.index("run again with: kvspec replay") < sec.index(heading) < sec.index("raised at"), sec
    assert "Falsifying example" not in sec and "Failing test case" not in sec
    progress = re.findall(r"kvspec progress \d+:\d\d:\d\d: test 1 of 1 \(test_lockstep\[kvbm\]\), [\d,]+ examples", out)
    assert progress, out[-4000:]


#: the notes Hypothesis attached to a failing test, as 6.155.2 and 6.170.17 wrote
#: them (copied from a run of each: a @given test and a state machine)
_NOTES = {
    "6.155.2 given": ["Falsifying example: test_a(\n    x=11,\n)", "Explanation:", "    These lines ..."],
    "6.155.2 stateful": ["Falsifying example:", "state = M()", "state.step(k=3)", "state.teardown()"],
    "6.170.17 given": ["Failing test case: test_a(\n    x=11,\n)", "Explanation:", "    These lines ..."],
    "6.170.17 stateful": ["Failing test case: <state machine>", "state = M()", "state.step(k=3)", "state.teardown()"],
}


@pytest.mark.parametrize("layout", sorted(_NOTES))
def test_the_minimal_failing_case_has_one_heading_in_every_hypothesis_layout(layout: str) -> None:
    from kvspec.conformance.verdicts.failure_first import hypothesis_notes

    out = hypothesis_notes(_NOTES[layout])
    assert out[0] == f"minimal failing case (Hypothesis {hypothesis.__version__}):"
    if layout.endswith("stateful"):
        assert out[1:] == ["state = M()", "state.step(k=3)", "state.teardown()"]
    else:
        assert out[1:] == ["test_a(\n    x=11,\n)", "Explanation:", "    These lines ..."]
    assert hypothesis_notes(["@reproduce_failure('6.1', b'AA==')"]) == ["@reproduce_failure('6.1', b'AA==')"]


class _Config:
    def __init__(self, **opts: Any) -> None:
        self.opts = opts

    def getoption(self, name: str, default: Any = None) -> Any:
        return self.opts.get(name, default)


def test_progress_is_off_unless_thorough_on_a_terminal_or_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert interval(_Config(verbose=0), "thorough") == DEFAULT_INTERVAL  # type: ignore[arg-type]
    assert interval(_Config(verbose=-1), "thorough") == 0  # type: ignore[arg-type]
    assert interval(_Config(verbose=0), "default") == 0  # type: ignore[arg-type]
    assert interval(_Config(**{"--kvspec-progress": 5.0}), "default") == 5.0  # type: ignore[arg-type]
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert interval(_Config(verbose=0), "thorough") == 0  # type: ignore[arg-type]


def test_progress_lines_are_rate_limited_and_count_examples_and_rules() -> None:
    now = [0.0]
    lines: list[str] = []
    stats = {"examples": 0, "steps": 0}
    p = Progress(10, lines.append, stats, lambda: {"USE-NEW", "not-a-rule"}, clock=lambda: now[0])
    p.tests_total, p.current = 3, "test_lockstep[kvbm]"
    stats.update(examples=1200, steps=34000)
    now[0] = 5
    p.tick()
    assert lines == []
    now[0] = 70
    p.tick()
    p.tick()
    assert lines == [
        f"kvspec progress 0:01:10: test 1 of 3 (test_lockstep[kvbm]), 1,200 examples, 34,000 steps, "
        f"1 of {len(RULES)} rules covered"
    ]


def test_the_header_names_the_protocol_version_the_handshake_chose(tmp_path: Path) -> None:
    """Once the adapter has started (once per run, before the tests), the
    protocol line is completed with the version its handshake chose."""
    import subprocess

    root = SUITE.parent.parent
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(SUITE / "test_golden.py"),
            f"--impl={root / 'adapters' / 'reference_jsonl'}",
            "-k",
            "evict",
            f"--kvspec-dir={tmp_path}",
            "-p",
            "no:cacheprovider",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("kvspec protocol:")]
    assert lines[0].startswith("kvspec protocol: kind subprocess, protocol versions")  # the header: offered
    assert re.fullmatch(r"kvspec protocol: JSON lines protocol version \d+ \(chosen in the handshake\)", lines[1])
    assert len(lines) == 2


def test_negotiated_finds_the_version_through_wrappers() -> None:
    from types import SimpleNamespace as Ns

    from kvspec.conformance.run.startup import negotiated

    assert negotiated(object()) is None  # in process: nothing negotiated
    assert negotiated(Ns(ready=Ns(protocol=3))) == "JSON lines protocol version 3 (chosen in the handshake)"
    assert negotiated(Ns(_host=Ns(ready=Ns(protocol=2)))) == "JSON lines protocol version 2 (chosen in the handshake)"
    assert (negotiated(Ns(_session=Ns(lib=Ns(version=2)))) or "").startswith("C ABI version 2")


@pytest.mark.parametrize(
    ("effort_name", "seeded", "ignored"),
    [("default", True, True), ("ci", True, True), ("default", False, False), ("thorough", True, False)],
)
def test_header_says_when_a_seed_is_ignored(effort_name: str, seeded: bool, ignored: bool) -> None:
    """Under a derandomised effort Hypothesis draws each test's examples from
    the test itself and ignores --hypothesis-seed; the header must say so, or
    runs at several seeds read as independent samples when they are one run."""
    from kvspec.conformance.run.manifest import load_impl
    from kvspec.conformance.run.summary import header_lines

    adapter_dir, manifest = load_impl("adapters/reference")
    line = header_lines(manifest, adapter_dir, None, effort_name, seeded=seeded)[-1]
    assert line.startswith(f"kvspec effort: {effort_name} ")
    assert ("--hypothesis-seed has no effect" in line) is ignored, line


@pytest.mark.parametrize("effort_name", ["default", "ci"])
def test_a_seed_under_a_derandomised_effort_is_a_usage_error(
    effort_name: str, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    """--hypothesis-seed would change nothing under default or ci: refused, naming what to do."""
    code, out = child_pytest(
        str(SUITE / "test_golden.py"),
        f"--impl={SUITE.parent / 'adapters' / 'reference'}",
        f"--hypothesis-profile={effort_name}",
        "--hypothesis-seed=7",
        "-q",
    )
    assert code == 4, out[-2000:]  # pytest's usage error
    assert f"--hypothesis-seed has no effect under the {effort_name} effort" in out, out[-2000:]
    assert "--hypothesis-profile=smoke or thorough" in out
