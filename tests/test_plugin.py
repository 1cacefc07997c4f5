"""The pytest plugin's verdicts: a declared deviation turns the failures its
scope covers into expected failures (and only those), a declared deviation
nothing observes fails the session as an unexpected pass, and a missing
capability is a named skip. Each case runs the golden-scenario module in a
child pytest against a small adapter written here. And the plugin stays out
of other projects: inert without ``--impl`` or a conformance test, it leaves
Hypothesis's own defaults alone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import kvspec.conformance as conformance_pkg

GOLDEN = Path(conformance_pkg.__file__).parent / "test_golden.py"

ADAPTER_MODULE = '''
from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.spec.wire import StepOutcome


class DropsRemoved(ReferenceImplementation):
    """The reference, except that it never publishes a Removed."""

    def step(self, op):
        out = super().step(op)
        kept = [e for e in out.events if e.kind != "removed"]
        return StepOutcome.model_construct(**{**out.__dict__, "events": kept})


def open_plain(config, manifest, adapter_dir):
    return ReferenceImplementation(config, manifest)


def open_drops_removed(config, manifest, adapter_dir):
    return DropsRemoved(config, manifest)
'''


def make_adapter(tmp: Path, factory: str, deviations: str = "", capabilities: str = "") -> Path:
    (tmp / "plugin_probe_adapter.py").write_text(ADAPTER_MODULE)
    folder = tmp / "adapter"
    folder.mkdir()
    (folder / "manifest.toml").write_text(
        textwrap.dedent(
            f"""
            name = "probe"
            kind = "python"
            profile = "kvbm"
            [start]
            python = "plugin_probe_adapter:{factory}"
            [capabilities]
            profiles = ["kvbm", "atomic", "legacy"]
            policies = ["lineage", "lru", "multi_lru", "unordered"]
            {capabilities}
            """
        )
        + deviations
    )
    return folder


def run_suite(tmp: Path, adapter: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(tmp) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(GOLDEN), f"--impl={adapter}", "-q", "-p", "no:cacheprovider", "-rxs"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


DEVIATION = """
[[deviations]]
rule = "REMOVE-EXACT"
scope = "all"
reason = "probe: never publishes Removed"
"""

#: covers a Removed left out of a Deref's step only: goldens' evictions happen in Use
NARROW = """
[[deviations]]
rule = "REMOVE-EXACT"
scope = { operations = ["deref"] }
reason = "probe: only derefs"
"""


def test_undeclared_break_fails_with_its_rule(tmp_path: Path) -> None:
    proc = run_suite(tmp_path, make_adapter(tmp_path, "open_drops_removed"))
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "[REMOVE-EXACT]" in proc.stdout


def test_declared_deviation_turns_its_failures_into_xfails(tmp_path: Path) -> None:
    proc = run_suite(tmp_path, make_adapter(tmp_path, "open_drops_removed", DEVIATION))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "xfailed" in proc.stdout
    assert "expected deviation REMOVE-EXACT (scope all): probe: never publishes Removed" in proc.stdout
    assert "REMOVE-EXACT               observed" in proc.stdout


def test_declared_deviation_never_observed_is_an_unexpected_pass(tmp_path: Path) -> None:
    proc = run_suite(tmp_path, make_adapter(tmp_path, "open_plain", DEVIATION))
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "UNEXPECTED PASS: deviation REMOVE-EXACT" in proc.stdout
    assert "remove it from the manifest" in proc.stdout


def test_missing_capability_is_a_named_skip(tmp_path: Path) -> None:
    proc = run_suite(tmp_path, make_adapter(tmp_path, "open_plain", capabilities="offload = false\nswap_in = false"))
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "does not declare capability offload" in proc.stdout


def test_a_failure_outside_the_deviations_scope_fails(tmp_path: Path) -> None:
    proc = run_suite(tmp_path, make_adapter(tmp_path, "open_drops_removed", NARROW))
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "[REMOVE-EXACT]" in proc.stdout
    assert "REMOVE-EXACT is declared, but not here: REMOVE-EXACT; scenario" in proc.stdout
    assert "operation use" in proc.stdout


def test_an_unscoped_deviation_is_a_clear_error(tmp_path: Path) -> None:
    unscoped = DEVIATION.replace('scope = "all"\n', "")
    proc = run_suite(tmp_path, make_adapter(tmp_path, "open_plain", unscoped))
    assert proc.returncode == 4  # a usage error: the run stops before any test
    assert (proc.stdout + proc.stderr).count("deviation REMOVE-EXACT has no scope") == 1


UNRELATED_TEST = """
from hypothesis import given, settings, strategies as st

SEEN = []


@given(st.integers())
def test_defaults(x):
    SEEN.append(x)


def test_profile_is_hypothesis_default():
    s = settings()
    assert s.max_examples == 100, s
    assert s.database is not None or s.derandomize, s
    assert settings._current_profile in ("default", "ci"), settings._current_profile
"""


def test_an_unrelated_project_sees_hypothesis_defaults(tmp_path: Path) -> None:
    """kvspec installed (the plugin's entry point loads), no --impl, no
    conformance test: Hypothesis's own profile, no kvspec report lines."""
    project = tmp_path / "other"
    project.mkdir()
    (project / "test_other.py").write_text(UNRELATED_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST") and k != "CI"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_other.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "kvspec" not in proc.stdout
    assert "2 passed" in proc.stdout
    assert (
        "kvspec"
        in subprocess.run(
            [sys.executable, "-m", "pytest", "--trace-config", "--co", "-q", "-p", "no:cacheprovider", "test_other.py"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    )  # the plugin was loaded, and stayed inert


MARKED = """
import pytest


@pytest.mark.kvspec_rules("USE-NEW")
def test_records_only_what_it_lists(kvspec_record_rule):
    kvspec_record_rule("USE-NEW", 3)


@pytest.mark.kvspec_rules("USE-NEW")
def test_records_a_rule_it_does_not_list(kvspec_record_rule):
    kvspec_record_rule("USE-NEW")
    kvspec_record_rule("EVENT-ID")


@pytest.mark.kvspec_rules()
def test_empty_marker_records_anything(kvspec_record_rule):
    kvspec_record_rule("EVENT-ID")
"""


def _run_marked(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_marked.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "test_marked.py", "--impl=adapters/reference", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_kvspec_rules_lists_the_rules_a_test_may_report(tmp_path: Path) -> None:
    proc = _run_marked(tmp_path, MARKED)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "2 passed" in proc.stdout and "1 failed" in proc.stdout
    assert "test_records_a_rule_it_does_not_list exercised EVENT-ID, which its kvspec_rules marker" in proc.stdout


def test_kvspec_rules_with_an_unknown_rule_is_a_usage_error(tmp_path: Path) -> None:
    proc = _run_marked(tmp_path, MARKED.replace('kvspec_rules("USE-NEW")', 'kvspec_rules("USE-NEWW")', 1))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "kvspec_rules names unknown rule ids USE-NEWW" in proc.stdout + proc.stderr
