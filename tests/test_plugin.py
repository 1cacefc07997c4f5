"""The pytest plugin's verdicts: a declared deviation turns the failures its
scope covers into expected failures (and only those), a declared deviation
nothing observes fails the session as an unexpected pass, and a missing
capability is a named skip. Each case runs the golden-scenario module in a
child pytest against a small adapter (the probe adapters of tests/conftest.py).
And the plugin stays out of other projects: inert without ``--impl`` or a
conformance test, it leaves Hypothesis's own defaults alone."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import kvspec.conformance as conformance_pkg

GOLDEN = Path(conformance_pkg.__file__).parent / "test_golden.py"

#: the probe adapters' manifest here: three profiles, every policy
PROFILES = ("kvbm", "atomic", "legacy")
POLICIES = ("lineage", "lru", "multi_lru", "unordered")

#: ``golden(factory, deviations="", capabilities="")`` -> (exit code, output)
Golden = Callable[..., tuple[int, str]]


@pytest.fixture
def golden(probe_adapter: Callable[..., Path], child_pytest: Callable[..., tuple[int, str]]) -> Golden:
    """The golden-scenario module in a child pytest against the conftest's
    probe adapter ``factory`` (``open_plain``: the reference,
    ``open_drops_removed``: it never publishes a Removed) with the given
    manifest additions; its exit code and output."""

    def run(factory: str, deviations: str = "", capabilities: str = "") -> tuple[int, str]:
        folder = probe_adapter(
            "probe",
            factory,
            folder="adapter",
            profiles=PROFILES,
            policies=POLICIES,
            capabilities=capabilities,
            deviations=deviations,
        )
        return child_pytest(str(GOLDEN), f"--impl={folder}", "-q", "-rxs", replay_dir=False)

    return run


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


def test_undeclared_break_fails_with_its_rule(golden: Golden) -> None:
    code, out = golden("open_drops_removed")
    assert code == 1, out[-2000:]
    assert "[REMOVE-EXACT]" in out


def test_declared_deviation_turns_its_failures_into_xfails(golden: Golden) -> None:
    code, out = golden("open_drops_removed", DEVIATION)
    assert code == 0, out[-3000:]
    assert "xfailed" in out
    assert "expected deviation REMOVE-EXACT (scope all): probe: never publishes Removed" in out
    assert "REMOVE-EXACT               observed" in out


def test_declared_deviation_never_observed_is_an_unexpected_pass(golden: Golden) -> None:
    code, out = golden("open_plain", DEVIATION)
    assert code == 1, out[-2000:]
    assert "UNEXPECTED PASS: deviation REMOVE-EXACT" in out
    assert "remove it from the manifest" in out


def test_missing_capability_is_a_named_skip(golden: Golden) -> None:
    code, out = golden("open_plain", capabilities="offload = false\nswap_in = false")
    assert code == 0, out[-2000:]
    assert "does not declare capability offload" in out


def test_a_failure_outside_the_deviations_scope_fails(golden: Golden) -> None:
    code, out = golden("open_drops_removed", NARROW)
    assert code == 1, out[-2000:]
    assert "[REMOVE-EXACT]" in out
    assert "REMOVE-EXACT is declared, but not here: REMOVE-EXACT; scenario" in out
    assert "operation use" in out


def test_an_unscoped_deviation_is_a_clear_error(golden: Golden) -> None:
    unscoped = DEVIATION.replace('scope = "all"\n', "")
    code, out = golden("open_plain", unscoped)
    assert code == 4  # a usage error: the run stops before any test
    assert out.count("deviation REMOVE-EXACT has no scope") == 1


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


def _run_marked(tmp_path: Path, child_pytest: Callable[..., tuple[int, str]], body: str) -> tuple[int, str]:
    (tmp_path / "test_marked.py").write_text(body)
    return child_pytest("test_marked.py", "--impl=adapters/reference", "-q", replay_dir=False)


def test_kvspec_rules_lists_the_rules_a_test_may_report(
    tmp_path: Path, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    code, out = _run_marked(tmp_path, child_pytest, MARKED)
    assert code == 1, out[-2000:]
    assert "2 passed" in out and "1 failed" in out
    assert "test_records_a_rule_it_does_not_list exercised EVENT-ID, which its kvspec_rules marker" in out


def test_kvspec_rules_with_an_unknown_rule_is_a_usage_error(
    tmp_path: Path, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    code, out = _run_marked(
        tmp_path, child_pytest, MARKED.replace('kvspec_rules("USE-NEW")', 'kvspec_rules("USE-NEWW")', 1)
    )
    assert code == 4, out[-4000:]
    assert "kvspec_rules names unknown rule ids USE-NEWW" in out
