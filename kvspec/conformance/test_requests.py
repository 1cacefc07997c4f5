"""The request-level layer: workloads of requests against any adapter that takes them.

It runs for every adapter declaring ``request_level``, checked against its
profile: the ``vllm`` pool's layer (``request_check``) or, for an adapter
whose profile is ``radix`` (Dynamo's mocker with its SGLang-style backend),
the radix tree's (``radix_requests.check_radix_run``, its own rules and
tests ``test_radix_request_*``). The vllm layer runs for in-process ones such as ``adapters/reference_requests`` (the
reference model's request driver) and ``adapters/rust_mocker`` (the Dynamo
mocker wheel), and subprocess or C ABI ones through the request-level
messages of protocol version 2 (``adapters/reference_jsonl``,
``adapters/vllm_c_port``).

One exploration per session drives the implementation with workloads: the
seed workloads (``conformance.requests.workloads.seed_workloads``), the adapter's own
finding files (``adapters/NAME/findings/*.jsonl``, so that every declared
deviation is observed on every run), then Hypothesis-generated ones
(``workloads()``: traffic-shaped, sequential and concurrent). Each run is
checked by ``conformance.requests.check`` (protocol through the router view,
the exact differential against the reference model for sequential runs, the
hashes). A run breaking an undeclared rule stops the exploration and is
shrunk by Hypothesis; a declared deviation is recorded and the exploration
goes on (the checker follows it, so the rest of each run is still compared;
after a declared ``request_stalled`` whose engine ran nothing more, the
requests after the stall run on a fresh engine: ``replay.run_workload``).

Then one test per rule reports what the exploration found for that rule:
a finding raises ``ConformanceFailure`` with the rule (an expected deviation
of the manifest turns it into an xfail with its reason), a rule the
exploration never exercised is skipped saying so, and a replay file is
written for each finding.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, given, settings

from kvspec.conformance.radix.requests import RADIX_LAYER_RULES
from kvspec.conformance.requests.api import ImplementationUnavailableError
from kvspec.conformance.requests.check import LAYER_RULES, Finding
from kvspec.conformance.requests.replay import run_workload
from kvspec.conformance.requests.workloads import Workload, load_workloads, seed_workloads, workloads
from kvspec.conformance.run.manifest import Manifest
from kvspec.conformance.run.plugin import replay_run
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.conformance.verdicts.replay_file import recorded_header
from kvspec.conformance.verdicts.replay_store import replay_command
from kvspec.spec.errors import AdapterError
from kvspec.spec.profiles import VLLM
from kvspec.spec.registry import RADIX
from kvspec.spec.rules import RuleId

#: every test here is a conformance test of the request level; the rules each
#: one reports are named by what the exploration exercised
pytestmark = [pytest.mark.kvspec_rules(), pytest.mark.kvspec_requires("request_level")]


class UndeclaredFindingError(Exception):
    """Raised inside Hypothesis so that it shrinks the workload."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.report())
        self.finding = finding


@dataclass(slots=True)
class Exploration:
    """What the session's exploration found, per rule: the smallest finding
    no declared deviation covers (``findings``) and, apart, the smallest one
    each declared deviation covers (``declared``, by the deviation's index),
    so that a declared departure never hides an undeclared one of its rule."""

    findings: dict[RuleId, Finding] = field(default_factory=dict)
    declared: dict[int, Finding] = field(default_factory=dict)
    exercised: Counter[RuleId] = field(default_factory=Counter)
    runs: int = 0
    seeds: int = 0
    #: declared stalls followed: the requests after them run on a fresh engine (``replay.run_workload``)
    followed_stalls: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def record(self, finding: Finding, deviation: int | None = None) -> None:
        if deviation is not None:
            prev = self.declared.get(deviation)
            if prev is None or finding.size() < prev.size():
                self.declared[deviation] = finding
            return
        old = self.findings.get(finding.rule)
        if old is None or finding.size() < old.size():
            self.findings[finding.rule] = finding


def _covering(manifest: Manifest, finding: Finding) -> int | None:
    site = finding.site()
    return next((i for i, d in enumerate(manifest.deviations) if d.covers(site)), None)


def findings_dir(manifest: Manifest, adapter_dir: Path) -> Path:
    """Where the adapter's finding files are: ``findings/``, or for a backend
    variant (``kind = "backend"``, its own deviations) ``findings/VARIANT/``."""
    v = manifest.find_variant(manifest.variant) if manifest.variant else None
    if v is not None and v.kind == "backend":
        return adapter_dir / "findings" / v.name
    return adapter_dir / "findings"


def _run_one(manifest: Manifest, adapter_dir: Path, w: Workload, exp: Exploration, *, raise_undeclared: bool) -> None:
    try:
        checked = run_workload(manifest, adapter_dir, w)
    except AdapterError as e:
        e.add_note(f"the workload it crashed on:\n{w.describe()}")
        e.workload = w  # type: ignore[attr-defined]  # written as the replay file (_session_exploration)
        raise
    exp.runs += 1
    exp.followed_stalls += checked.followed_stalls
    exp.exercised.update(checked.exercised)
    undeclared = None
    for f in checked.findings:
        dev = _covering(manifest, f)
        exp.record(f, dev)
        if undeclared is None and dev is None:
            undeclared = f
    if undeclared is not None and raise_undeclared:
        raise UndeclaredFindingError(undeclared)


def _explore(manifest: Manifest, adapter_dir: Path, effort: settings) -> Exploration:
    caps = manifest.capabilities
    host = "host_pinned" in caps.tiers
    exp = Exploration()
    t0 = time.monotonic()
    seeds = [w for w in seed_workloads() if host or w.setup.host_blocks is None]
    seeds += [w for _, w in load_workloads(findings_dir(manifest, adapter_dir))]
    for w in seeds:
        _run_one(manifest, adapter_dir, w, exp, raise_undeclared=False)
    exp.seeds = exp.runs

    # one failure: two distinct ones (a finding and a crash) would come as an
    # ExceptionGroup, which neither the finding nor the crash report reads
    @settings(effort, phases=[p for p in effort.phases if p is not Phase.explain], report_multiple_bugs=False)
    @given(workloads(host=None if host else False, max_capacity=caps.max_capacity))
    def explore(w: Workload) -> None:
        _run_one(manifest, adapter_dir, w, exp, raise_undeclared=True)

    try:
        explore()
    except UndeclaredFindingError as e:
        exp.record(e.finding, None)
    exp.seconds = time.monotonic() - t0
    return exp


def _session_exploration(
    profile: str,
    kvspec_manifest: Manifest,
    kvspec_adapter_dir: Path,
    pytestconfig: pytest.Config,
    kvspec_settings: settings,
) -> Exploration:
    """The session's exploration for the layer of ``profile`` (the vllm pool's
    or the radix tree's: ``request_replay.run_workload`` picks the check by
    the manifest's profile)."""
    caps = kvspec_manifest.capabilities
    if not caps.request_level:
        pytest.skip(f"adapter {kvspec_manifest.name!r} does not declare capability request_level")
    if kvspec_manifest.request_profile() != profile:
        pytest.skip(f"adapter {kvspec_manifest.name!r} does not take requests under profile:{profile}")
    try:
        exp = _explore(kvspec_manifest, kvspec_adapter_dir, kvspec_settings)
        reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(
                    f"\nkvspec request-level ({profile}): {exp.runs} runs ({exp.seeds} seeds and findings)"
                    f" in {exp.seconds:.1f} s;"
                    + (
                        f" {exp.followed_stalls} declared stalls followed (the requests after each checked on a"
                        " fresh engine);"
                        if exp.followed_stalls
                        else ""
                    )
                    + f" rules found broken: {', '.join(sorted(map(str, exp.findings))) or 'none'};"
                    " declared deviations observed: "
                    f"{', '.join(sorted({str(f.rule) for f in exp.declared.values()})) or 'none'}"
                )
        return exp
    except ImplementationUnavailableError as e:
        pytest.skip(f"adapter {kvspec_manifest.name!r} cannot run here: {e}")
    except AdapterError as e:
        pytest.fail(_crash_report(kvspec_manifest, pytestconfig, e), pytrace=False)


def _crash_report(manifest: Manifest, config: pytest.Config, e: AdapterError) -> str:
    """What a crash of the engine during a request-level run says: plainly
    that it crashed (a request-level run cannot tell which rule's
    precondition the engine's own assert guards), with the workload it
    crashed on and its replay file."""
    text = (
        f"adapter {manifest.name!r}: the implementation crashed during a request-level run (no rule: the engine "
        f"stopped instead of answering; a request the engine cannot schedule should finish 'stalled', which "
        f"USE-CAPACITY judges):\n{e}"
    )
    w: Workload | None = getattr(e, "workload", None)
    replays = replay_run(config)
    if w is not None and replays is not None:
        try:
            path = replays.path_for("requests-crash")
            path.write_text(w.model_copy(update={"note": f"the implementation crashed: {str(e)[:200]}"}).to_jsonl())
            text += f"\nreplay file: {path}"
        except OSError:
            pass
    for note in getattr(e, "__notes__", []):
        text += f"\n{note}"
    return text


@pytest.fixture(scope="session")
def request_exploration(
    kvspec_manifest: Manifest, kvspec_adapter_dir: Path, pytestconfig: pytest.Config, kvspec_settings: settings
) -> Exploration:
    return _session_exploration(VLLM.name, kvspec_manifest, kvspec_adapter_dir, pytestconfig, kvspec_settings)


@pytest.fixture(scope="session")
def radix_request_exploration(
    kvspec_manifest: Manifest, kvspec_adapter_dir: Path, pytestconfig: pytest.Config, kvspec_settings: settings
) -> Exploration:
    return _session_exploration(RADIX, kvspec_manifest, kvspec_adapter_dir, pytestconfig, kvspec_settings)


def _write_replay(request: pytest.FixtureRequest, finding: Finding) -> tuple[Path, str] | None:
    """Write the finding's workload as a replay file recording this run (the
    implementation and versions: ``kvspec replay FILE`` runs it against the
    implementation that failed); returns the file and the command to replay it."""
    replays = replay_run(request.config)
    if replays is None:
        return None
    try:
        path = replays.path_for(f"requests-{finding.rule}")
        note = f"{finding.rule}: {finding.summary}"
        run = {**recorded_header(replays.target), "rule": str(finding.rule)}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(finding.workload.model_copy(update={"note": note, "run": run}).to_jsonl())
        tmp.replace(path)
    except OSError:
        return None
    return path, replay_command(path, replays.target)


def _assert_ran(exp: Exploration) -> None:
    assert exp.runs > 0
    assert sum(exp.exercised.values()) > 0


#: the ``report_rule`` fixture: ``report_rule(rule, exploration)``
ReportRule = Callable[[RuleId, Exploration], None]


@pytest.fixture
def report_rule(request: pytest.FixtureRequest, kvspec_record_rule: Any, kvspec_record_deviation: Any) -> ReportRule:
    """``report_rule(rule, exploration)``: the verdict of one rule of a layer
    (``_report_rule``), recorded for this test."""
    return lambda rule, exp: _report_rule(rule, exp, request, kvspec_record_rule, kvspec_record_deviation)


def test_request_level_exploration_ran(request_exploration: Exploration) -> None:
    """The exploration ran workloads and exercised the layer's rules."""
    _assert_ran(request_exploration)


@pytest.mark.parametrize("rule", LAYER_RULES, ids=str)
def test_request_level_rule(rule: RuleId, request_exploration: Exploration, report_rule: ReportRule) -> None:
    report_rule(rule, request_exploration)


def test_radix_request_exploration_ran(radix_request_exploration: Exploration) -> None:
    """The radix exploration ran workloads and exercised the layer's rules."""
    _assert_ran(radix_request_exploration)


@pytest.mark.parametrize("rule", RADIX_LAYER_RULES, ids=str)
def test_radix_request_rule(rule: RuleId, radix_request_exploration: Exploration, report_rule: ReportRule) -> None:
    """Each rule of the radix request layer (``conformance.radix.requests``), as the vllm one's."""
    report_rule(rule, radix_request_exploration)


def _report_rule(
    rule: RuleId,
    exp: Exploration,
    request: pytest.FixtureRequest,
    kvspec_record_rule: Any,
    kvspec_record_deviation: Any,
) -> None:
    n = exp.exercised.get(rule, 0)
    finding = exp.findings.get(rule)
    declared = {i: f for i, f in exp.declared.items() if f.rule == rule}
    if n == 0 and finding is None and not declared:
        pytest.skip(f"{rule} was not exercised by the {exp.runs} request-level runs")
    kvspec_record_rule(str(rule), n)
    for i, f in declared.items():
        kvspec_record_deviation(i, f.site())
    if finding is None and declared:
        finding = min(declared.values(), key=Finding.size)  # in scope: reported as the expected failure it is
    if finding is not None:
        written = _write_replay(request, finding)
        where = f"\nreplay file: {written[0]}\nrun again with: {written[1]}" if written is not None else ""
        raise ConformanceFailure(rule, finding.report() + where, site=finding.site())
