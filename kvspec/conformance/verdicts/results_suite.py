"""``pytest conformance --kvspec-results FILE``: the suite's results document.

A pytest plugin object the kvspec plugin registers when the option is given.
It watches every conformance test (the ones marked ``kvspec_rules``): which
rules each one covers (its marker, its ``rule`` parameter, its scenario's
rules), how it ended (passed, failed, skipped with which reason, an expected
deviation), the rule a failure names and its replay file; at the end of the
session it adds the plugin's rule counts and deviation observations and
writes one ``Results`` (``conformance/verdicts/results.py``).

How a rule's status is decided, in this order:

1. ``fail``: a test failed naming the rule (and no declared deviation covered it);
2. ``deviation``: the manifest declares a deviation for it (observed or not);
3. ``pass``: the run exercised it at least once;
4. ``not_applicable``: the rule does not apply to the adapter's profiles and
   capabilities (``applicability.not_applicable_reason``, the note says
   why), or every test covering it was skipped for a missing capability
   (the note names the capability);
5. ``not_exercised``: otherwise: it applies and the run never reached it (a
   test ran but never asked for it, a covering test failed without naming a
   rule, e.g. an adapter error, or no test of this run covers it).

A run that collected the whole suite (no ``-k``/``-m``, no node id, every
test module) and ended with applicable rules not exercised is
**incomplete** (``Results.incomplete``, status ``incomplete`` when nothing
failed): the plugin fails it unless ``--kvspec-allow-incomplete`` is given.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from kvspec.conformance.run.settings import effort
from kvspec.conformance.run.xdist_support import is_controller, is_worker
from kvspec.conformance.verdicts.applicability import not_applicable_reason
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.conformance.verdicts.provenance import Provenance
from kvspec.conformance.verdicts.replay_store import replay_root
from kvspec.conformance.verdicts.results import (
    ERRORED,
    DeviationResult,
    FailureResult,
    ImplementationInfo,
    Results,
    RuleResult,
    Status,
    current_versions,
    spec_version,
    write_results,
)
from kvspec.spec.manifest import Manifest
from kvspec.spec.rules import RULES


class _PluginState(Protocol):
    """What this module reads of the kvspec plugin's session state."""

    manifest: Manifest | None
    adapter_dir: Path | None
    error: str | None
    #: observations per declared deviation (its index in the manifest)
    deviations_seen: Counter[int]
    rule_hits: Counter[str]
    selection_narrowed: bool
    #: the effort (``--hypothesis-profile``) and whether a seed pins it
    effort: str
    seeded: bool
    #: some test module of the suite was not collected (coverage is not judged)
    partial_suite: bool
    conformance_ran: int
    #: ``--kvspec-allow-incomplete``: an incomplete run does not fail
    allow_incomplete: bool


_REPLAY = re.compile(r"replay file: (\S+)")
RULE_IDS = frozenset(map(str, RULES))
_MISSING = re.compile(r"does not declare (?:capability )?(.+?)$|declares no (eviction policy.*)$")


@dataclass(slots=True)
class _Test:
    rules: set[str]
    outcome: str = "not run"
    reason: str = ""
    rule: str | None = None
    message: str = ""
    replay: str | None = None
    #: a golden scenario's file: what replays its failure
    scenario: str | None = None


@dataclass(slots=True)
class _Seen:
    tests: dict[str, _Test] = field(default_factory=dict)
    exceptions: dict[str, BaseException] = field(default_factory=dict)


def item_rules(item: pytest.Item) -> set[str] | None:
    """The rules a conformance test covers (None: not a conformance test)."""
    marker = item.get_closest_marker("kvspec_rules")
    if marker is None:
        return None
    rules = {str(r) for r in marker.args}
    callspec = getattr(item, "callspec", None)
    params: dict[str, Any] = callspec.params if callspec is not None else {}
    if params.get("rule") is not None:
        rules.add(str(params["rule"]))
    scenario = params.get("scenario")
    rules.update(str(r) for r in getattr(scenario, "rules", ()) or ())
    return rules


def incomplete_rules(rules: dict[str, RuleResult]) -> list[str]:
    """The applicable rules a run never exercised (catalogue ids only)."""
    return [rid for rid, r in rules.items() if r.status == "not_exercised" and rid in RULE_IDS]


def missing_capability(reason: str) -> str | None:
    """The capability a skip reason names (``adapter 'x' does not declare
    capability profile:atomic`` -> ``profile:atomic``)."""
    m = _MISSING.search(reason.strip())
    if m is None:
        return None
    return (m.group(1) or m.group(2)).strip()


def _skip_reason(report: pytest.TestReport) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        return str(lr[2]).removeprefix("Skipped: ")
    return str(lr or "")


class SuiteResults:
    """Collects one session's outcomes and writes the results file at its end."""

    def __init__(self, config: pytest.Config, state: _PluginState, dest: str | None) -> None:
        self.config = config
        self.state = state
        self.dest = dest
        self.seen = _Seen()

    # -- pytest hooks ---------------------------------------------------------

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            rules = item_rules(item)
            if rules is not None:
                callspec = getattr(item, "callspec", None)
                path = callspec.params.get("path") if callspec is not None else None
                self.seen.tests[item.nodeid] = _Test(rules, scenario=str(path) if path is not None else None)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
        yield
        if call.excinfo is not None and item.nodeid in self.seen.tests:
            self.seen.exceptions[item.nodeid] = call.excinfo.value

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        t = self.seen.tests.get(report.nodeid)
        if t is None and report.failed and is_controller(self.config):
            # under -n the workers send their records at the end; a worker
            # that crashed sends none, and this failure is all there is
            t = self.seen.tests[report.nodeid] = _Test(set())
        if t is None or (report.when != "call" and report.passed):
            return
        exc = self.seen.exceptions.get(report.nodeid)
        if isinstance(exc, ConformanceFailure):
            t.rule = str(exc.rule)
            m = _REPLAY.search(exc.report)
            t.replay = m.group(1) if m else t.scenario
        if getattr(report, "wasxfail", ""):
            t.outcome, t.reason = "deviation", str(report.wasxfail)
        elif report.skipped:
            t.outcome, t.reason = "skipped", _skip_reason(report)
        elif report.failed:
            t.outcome = "failed"
            text = str(exc) if exc is not None else report.longreprtext
            t.message = (text.strip().splitlines() or [""])[0][:500]
        elif t.outcome == "not run":
            t.outcome = "passed"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if is_worker(self.config):
            return  # an xdist worker's records go to the controller (export_tests), which writes
        self.write(int(session.exitstatus))

    def write(self, exit_code: int) -> None:
        if self.dest is None:
            return  # only watching (the terminal summary reads the verdicts)
        write_results(self.build(exit_code), self.dest)

    # -- xdist: a worker's records, merged by the controller (xdist_support.py) --

    def export_tests(self) -> dict[str, dict[str, Any]]:
        """This worker's record of every test, as plain data."""
        return {nodeid: {**asdict(t), "rules": sorted(t.rules)} for nodeid, t in self.seen.tests.items()}

    def merge_tests(self, tests: dict[str, dict[str, Any]]) -> None:
        """Add one worker's records: every worker collected every test but ran
        only its share, so a record of a test it ran replaces what is known,
        and one it did not run only adds the test and its rules."""
        for nodeid, rec in tests.items():
            t = _Test(**{**rec, "rules": set(rec.get("rules", ()))})
            known = self.seen.tests.get(nodeid)
            if t.outcome != "not run" or known is None:
                self.seen.tests[nodeid] = t
            else:
                known.rules |= t.rules

    # -- the document ---------------------------------------------------------

    def build(self, exit_code: int) -> Results:
        st = self.state
        impl_arg = str(self.config.getoption("--impl"))
        status: Status = "clean" if exit_code == 0 else "findings" if exit_code == 1 else "error"
        if st.manifest is None:
            return Results(
                tool="pytest conformance",
                spec=spec_version(),
                implementation=ImplementationInfo(name=impl_arg, adapter=impl_arg),
                options=self._options(),
                status="error",
                exit_code=exit_code or 2,
                provenance=self.provenance(),
                error=st.error,
            )
        m = st.manifest
        tests = self.seen.tests.values()
        rules = self._rules(self._deviations(m), m)
        incomplete = incomplete_rules(rules) if self.judged() else []
        failed = any(t.outcome == "failed" for t in tests) or any(r.status == "fail" for r in rules.values())
        if incomplete and exit_code in (0, 1) and not failed:
            status = "incomplete"
        outcomes = Counter(t.outcome for t in tests)
        deviations = self._deviations(m)
        failures = [
            FailureResult(rule=t.rule, test=nodeid, message=t.message, replay=t.replay)
            for nodeid, t in self.seen.tests.items()
            if t.outcome == "failed"
        ]
        return Results(
            tool="pytest conformance",
            spec=spec_version(),
            implementation=ImplementationInfo(
                name=m.name,
                kind=m.kind,
                adapter=impl_arg,
                variant=m.variant,
                description=m.description,
            ),
            profile=m.profile,
            options=self._options(),
            capabilities=m.capabilities.model_dump(mode="json"),
            status=status,
            exit_code=exit_code,
            provenance=self.provenance(),
            rules=rules,
            incomplete=incomplete,
            deviations=deviations,
            failures=failures,
            counts={k: outcomes.get(k, 0) for k in ("passed", "failed", "skipped", "deviation", "not run")},
            error=st.error,
        )

    def judged(self) -> bool:
        """Can this run be called complete or incomplete? Only a run of the
        whole suite (nothing deselected, every test module collected): a
        narrower run leaves rules out on purpose. A whole-suite
        run whose tests were all skipped (the implementation is not installed)
        is judged, and is incomplete."""
        st = self.state
        return not st.selection_narrowed and not st.partial_suite

    def _deviations(self, m: Manifest) -> list[DeviationResult]:
        st = self.state
        return [
            DeviationResult(
                rule=str(d.rule),
                reason=d.reason,
                link=d.link,
                scope={k: v for k, v in d.model_dump(mode="json").items() if k not in ("rule", "reason", "link")},
                observed=st.deviations_seen.get(i, 0),
                deterministic=d.deterministic(),
            )
            for i, d in enumerate(m.deviations)
        ]

    def _rules(self, deviations: list[DeviationResult], m: Manifest) -> dict[str, RuleResult]:
        hits = self.state.rule_hits
        declared: dict[str, list[DeviationResult]] = defaultdict(list)
        for d in deviations:
            declared[d.rule].append(d)
        by_rule: dict[str, list[_Test]] = defaultdict(list)
        for t in self.seen.tests.values():
            for r in t.rules | ({t.rule} if t.rule else set()):
                by_rule[r].append(t)
        out: dict[str, RuleResult] = {}
        for rid in [*map(str, sorted(RULES)), *sorted(set(by_rule) - set(map(str, RULES)))]:
            ts = by_rule.get(rid, [])
            n = int(hits.get(rid, 0))
            failed = [t for t in ts if t.outcome == "failed" and t.rule == rid]
            replays = sorted({t.replay for t in ts if t.rule == rid and t.replay})
            if failed:
                out[rid] = RuleResult(status="fail", exercised=n, failures=len(failed), replays=replays)
            elif rid in declared:
                ds = declared[rid]
                seen = sum(d.observed for d in ds)
                note = f"observed {seen}x" if seen else "declared but not observed"
                if len(ds) > 1:
                    note += f" ({len(ds)} scoped deviations)"
                reason = " / ".join(d.reason for d in ds)
                out[rid] = RuleResult(status="deviation", exercised=n, reason=reason, note=note, replays=replays)
            elif n:
                out[rid] = RuleResult(status="pass", exercised=n)
            elif rid in RULE_IDS and (why := not_applicable_reason(rid, m)) is not None:
                out[rid] = RuleResult(status="not_applicable", note=why)
            else:
                skipped = [t for t in ts if t.outcome == "skipped"]
                caps = sorted({c for t in skipped if (c := missing_capability(t.reason))})
                if ts and len(skipped) == len(ts) and caps:
                    out[rid] = RuleResult(status="not_applicable", note="missing capability " + ", ".join(caps))
                elif errored := [t for t in ts if t.outcome == "failed"]:
                    out[rid] = RuleResult(status="not_exercised", note=f"{ERRORED} ({len(errored)} of {len(ts)})")
                elif ts:
                    out[rid] = RuleResult(status="not_exercised", note=f"covered by {len(ts)} test(s), never reached")
                else:
                    out[rid] = RuleResult(status="not_exercised", note="no test of this run covers it")
        return out

    def provenance(self) -> Provenance:
        """What decided this run's traffic (``provenance.py``): the versions,
        the effort with its settings and seed, the adapter folder, variant,
        profile and the semantics options the manifest declares."""
        st = self.state
        current = effort(st.effort, seeded=st.seeded)
        seed = self.config.getoption("hypothesis_seed", None)
        m = st.manifest
        return Provenance(
            versions=current_versions(),
            effort=st.effort,
            hypothesis_seed=None if seed is None else str(seed),
            settings={
                "max_examples": current.max_examples,
                "stateful_step_count": current.stateful_step_count,
                "derandomize": current.derandomize,
            },
            adapter_path=None if st.adapter_dir is None else str(st.adapter_dir),
            variant=None if m is None else m.variant,
            profile=None if m is None else m.profile,
            profile_options={} if m is None else dict(m.capabilities.semantics),
        )

    def _options(self) -> dict[str, Any]:
        cfg = self.config
        current = effort(self.state.effort, seeded=self.state.seeded)
        opts: dict[str, Any] = {
            "impl": str(cfg.getoption("--impl")),
            "effort": self.state.effort,
            "hypothesis_seed": cfg.getoption("hypothesis_seed", None),
            "derandomize": current.derandomize,
            "max_examples": current.max_examples,
            "stateful_step_count": current.stateful_step_count,
            "replay_dir": str(replay_root(cfg)),
            "selection_narrowed": self.state.selection_narrowed,
            "whole_suite": not self.state.partial_suite,
            "allow_incomplete": self.state.allow_incomplete,
        }
        for name in ("keyword", "markexpr"):
            if v := cfg.getoption(name, None):
                opts[name] = v
        return opts
