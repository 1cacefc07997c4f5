"""The kvspec pytest plugin: ``--impl``, capability skips, expected deviations.

Registered through the ``pytest11`` entry point, so that once kvspec is
installed any repository can run the suite against its own adapter:

    pytest --pyargs kvspec.conformance --impl=path/to/adapter

It is inert in any pytest session that neither gives ``--impl`` nor
collects a conformance test (a test of ``kvspec.conformance``, which all
carry the ``kvspec_rules`` marker): no manifest is loaded, no fixture runs,
no report line is added, and it never registers or loads a Hypothesis
profile for the session (the suite applies its efforts explicitly,
``settings.effort``), so an unrelated project sees Hypothesis's own defaults.

- ``--impl`` picks the adapter folder (default, when conformance tests are
  collected: the bundled reference).
- ``--hypothesis-profile=default|ci|thorough`` picks the suite's effort.
- ``@pytest.mark.kvspec_requires("offload", "profile:atomic")`` skips a test
  whose capability the manifest does not declare, naming it in the reason.
- ``@pytest.mark.kvspec_rules(*rule_ids)``: the rules a conformance test
  checks. The ids must be rule ids (a typo is a collection error) and a test
  that lists them may record coverage only of those (anything else fails
  it: the list is the test's contract); an empty list means the rules come
  from the data the test runs (a golden scenario names its own).
- A ``ConformanceFailure`` whose site (rule, golden scenario, operation kind,
  conditions) a declared deviation's scope covers is reported as xfail with
  the manifest's reason; the lockstep and the request-level exploration
  record in-scope deviations without failing and report them here. A
  declared deviation that nothing observed in a full, deterministic run
  (``default`` or ``ci`` effort, or a given seed) is an unexpected pass: the
  session fails and says to remove it from the manifest.
- The terminal summary shows how often each rule was exercised and which
  deviations were observed; ``--kvspec-results FILE`` writes all of it as the
  results JSON (``conformance/verdicts/results_suite.py``).
- A run of the whole suite that never exercised a rule that applies to the
  adapter (``verdicts/applicability.py``) is **incomplete**: not a pass. The
  summary names each such rule, the results file and the JUnit report carry
  the outcome, and the session fails unless ``--kvspec-allow-incomplete``
  is given (a narrowed selection or a single test module is not judged).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.opener import open_adapter
from kvspec.conformance.run import example_db, workdir, xdist_support
from kvspec.conformance.run.manifest import Manifest, load_impl
from kvspec.conformance.run.progress import Progress
from kvspec.conformance.run.settings import EFFORTS, effort, effort_name, is_deterministic
from kvspec.conformance.verdicts.failures import ConformanceFailure, DeviationNotFollowed
from kvspec.conformance.verdicts.replay_store import DEFAULT_KEEP, ReplayRun, Target, replay_root
from kvspec.spec.config import ManagerConfig
from kvspec.spec.deviations import Site, covering
from kvspec.spec.errors import HANG_MARK, ConfigError
from kvspec.spec.rules import known as known_rule

if TYPE_CHECKING:
    from hypothesis import settings

    from kvspec.conformance.transport.jsonl import ChildPool

_STATE_KEY = pytest.StashKey["_KvspecState"]()


#: where the conformance tests live: a test collected from here activates the plugin
_CONFORMANCE_DIR = Path(__file__).resolve().parent.parent

DEFAULT_IMPL = "adapters/reference"


class _KvspecState:
    def __init__(self) -> None:
        #: the plugin does something in this session (see the module doc)
        self.active = False
        self.adapter_dir: Path | None = None
        self.manifest: Manifest | None = None
        self.error: str | None = None
        #: observations per declared deviation (its index in the manifest)
        self.deviations_seen: Counter[int] = Counter()
        #: the rules each test recorded (checked against its kvspec_rules marker)
        self.test_rules: dict[str, set[str]] = {}
        self.current_test: str | None = None
        self.effort = "default"
        self.seeded = False
        self.rule_hits: Counter[str] = Counter()
        self.conformance_tests = 0
        #: conformance tests that got as far as running (a skip at set-up does not)
        self.conformance_ran = 0
        self.selection_narrowed = False
        #: the ``--impl`` value as given (or the default the suite picked)
        self.impl_arg: str | None = None
        #: this run's replay folder (made at the first failure)
        self.replays: ReplayRun | None = None
        #: the status line of a long run (``progress.py``; None: off)
        self.progress: Progress | None = None
        #: some conformance test module was not collected (coverage is not judged)
        self.partial_suite = False
        #: ``--kvspec-allow-incomplete``
        self.allow_incomplete = False
        #: the applicable rules a judged run never exercised (set at the session's end)
        self.incomplete: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvspec", "kvspec conformance suite")
    group.addoption(
        "--impl",
        action="store",
        default=None,
        help="adapter folder (with manifest.toml) or bundled adapter name; default: adapters/reference",
    )
    group.addoption(
        "--kvspec-replay-dir",
        action="store",
        default=None,
        help="root of the replay folders: a failing run writes its replay files (JSON lines) into "
        "ROOT/<UTC timestamp>-<adapter>[-<variant>]/; default: .kvspec/replays",
    )
    group.addoption(
        "--kvspec-replay-keep",
        action="store",
        type=int,
        default=DEFAULT_KEEP,
        metavar="N",
        help=f"keep the newest N run folders under the replay root (0: keep all; default {DEFAULT_KEEP})",
    )
    group.addoption(
        "--kvspec-progress",
        action="store",
        type=float,
        default=None,
        metavar="SECONDS",
        help="print a status line (examples, steps, rules covered) every SECONDS during the run; 0: never; "
        "default: every 30 s for the thorough effort on a terminal, else never",
    )
    workdir.add_options(group)
    example_db.add_options(group)
    group.addoption(
        "--kvspec-allow-incomplete",
        action="store_true",
        default=False,
        help="do not fail a run that never exercised a rule that applies to the adapter (the run is still "
        "reported incomplete, in the summary, the results file and JUnit)",
    )
    group.addoption(
        "--kvspec-results",
        action="store",
        default=None,
        metavar="FILE",
        help="write the run's results JSON here (rules, deviations, failures; kvspec report / kvspec gate read it)",
    )


def pytest_cmdline_main(config: pytest.Config) -> None:
    """Before any plugin is configured: a session that runs kvspec keeps
    pytest's cache and Hypothesis's files in the working dir (``workdir.py``)."""
    if workdir.in_effect(config, conformance_named=_names_conformance(config.args)):
        workdir.take_over(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    workdir.release()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kvspec_requires(*capabilities): skip unless the adapter declares every capability"
    )
    config.addinivalue_line("markers", "kvspec_rules(*rule_ids): the rules a conformance test exercises")
    state = _KvspecState()
    config.stash[_STATE_KEY] = state
    profile = config.getoption("hypothesis_profile", None)
    state.effort = effort_name(profile)
    state.seeded = config.getoption("hypothesis_seed", None) is not None
    state.allow_incomplete = bool(config.getoption("--kvspec-allow-incomplete", False))
    impl = config.getoption("--impl")
    if profile is not None and profile not in EFFORTS and (impl is not None or _names_conformance(config.args)):
        _check_profile_known(profile)
    if state.seeded and is_deterministic(state.effort) and (impl is not None or _names_conformance(config.args)):
        # Hypothesis draws a derandomised test's examples from the test itself: the seed would change
        # nothing, and runs "at several seeds" would read as independent samples when they are one run
        raise pytest.UsageError(
            f"--hypothesis-seed has no effect under the {state.effort} effort (derandomised: every run draws "
            "the same examples); drop it, or choose a random effort (--hypothesis-profile=smoke or thorough) "
            "for the seed to pick the examples"
        )
    if profile in EFFORTS:
        from hypothesis import settings

        try:
            settings.get_profile(profile)
        except Exception:
            # asked for by name on the command line and unknown to Hypothesis
            # (``thorough``): register it so that Hypothesis's option accepts it
            settings.register_profile(profile, effort(profile, seeded=state.seeded))
    example_db.check_option(config, state.effort)
    if impl is not None:
        _activate(state, impl, config)
    _register_results(config, state)


def _register_results(config: pytest.Config, state: _KvspecState) -> None:
    """Watch the run's outcomes per rule (``results_suite``): the summary's
    never-exercised reasons come from it, and with ``--kvspec-results`` it
    writes the results file."""
    from kvspec.conformance.verdicts.results_suite import SuiteResults

    config.pluginmanager.register(
        SuiteResults(config, state, config.getoption("--kvspec-results", None)), "kvspec-results"
    )


def _names_conformance(args: list[str]) -> bool:
    """Does the command line name the conformance suite (its folder, or a
    file or test in it, or its module for ``--pyargs``)?"""
    for a in args:
        if a == "kvspec.conformance" or a.startswith("kvspec.conformance."):
            return True
        try:
            p = Path(a.split("::", 1)[0]).resolve()
        except OSError:
            continue
        if p == _CONFORMANCE_DIR or p.parent == _CONFORMANCE_DIR:
            return True
    return False


def _check_profile_known(profile: str) -> None:
    """An unknown ``--hypothesis-profile`` is a usage error listing the
    efforts (instead of Hypothesis's INTERNALERROR traceback)."""
    from hypothesis import settings

    try:
        settings.get_profile(profile)
    except Exception:
        raise pytest.UsageError(
            f"--hypothesis-profile={profile}: no such effort; the suite's efforts are {', '.join(EFFORTS)}"
        ) from None


def _activate(state: _KvspecState, impl: str, config: pytest.Config) -> None:
    state.active = True
    state.impl_arg = impl
    try:
        state.adapter_dir, state.manifest = load_impl(impl)
    except ConfigError as e:
        state.error = str(e)
        return
    seed = config.getoption("hypothesis_seed", None)
    target = Target(
        impl=impl,
        adapter_path=str(state.adapter_dir),
        variant=state.manifest.variant,
        effort=state.effort,
        hypothesis_seed=None if seed is None else str(seed),
    )
    keep = int(config.getoption("--kvspec-replay-keep", DEFAULT_KEEP))
    state.replays = ReplayRun(replay_root(config), target, keep, run_id=xdist_support.run_id(config))


def replay_run(config: pytest.Config) -> ReplayRun | None:
    """This run's replay folder and the implementation its files record
    (None: the plugin is not active or the adapter did not load)."""
    return _state(config).replays


def _state(config: pytest.Config) -> _KvspecState:
    return config.stash[_STATE_KEY]


def record_rule(config: pytest.Config, rule: str, n: int = 1) -> None:
    """Count that a test exercised ``rule`` (shown in the summary)."""
    st = _state(config)
    st.rule_hits[rule] += n
    if st.current_test is not None:
        st.test_rules.setdefault(st.current_test, set()).add(rule)


def record_deviation(config: pytest.Config, index: int, site: Site) -> None:
    """Count that declared deviation ``index`` of the manifest was observed
    (by a checker that recorded it rather than failing)."""
    _state(config).deviations_seen[index] += 1


def conformance_settings(config: pytest.Config) -> settings:
    """The Hypothesis settings of the selected effort (``settings.effort``)."""
    st = _state(config)
    return effort(st.effort, seeded=st.seeded, database=example_db.database_for(config, st.effort, seeded=st.seeded))


def pytest_report_header(config: pytest.Config) -> list[str]:
    st = _state(config)
    if not st.active:
        return []
    if st.manifest is None:
        return [f"kvspec: {st.error}"] if st.error else []
    from kvspec.conformance.run.summary import header_lines

    assert st.adapter_dir is not None
    return [
        *header_lines(
            st.manifest,
            st.adapter_dir,
            st.impl_arg,
            st.effort,
            seeded=st.seeded,
            seed=config.getoption("hypothesis_seed", None),
        ),
        *_working_files_header(config, st),
    ]


@functools.lru_cache(maxsize=64)
def _folder_of(path: str) -> Path:
    """The resolved folder of a test file (hundreds of items share a few files)."""
    return Path(path).resolve().parent


def _working_files_header(config: pytest.Config, st: _KvspecState) -> list[str]:
    """Where this run's files go: the working dir, and the example database of a random effort."""
    lines = [f"kvspec working dir: {workdir.working_dir(config)}"]
    db = example_db.describe(config, st.effort, seeded=st.seeded)
    return [*lines, db] if db else lines


@functools.cache
def suite_modules() -> tuple[str, ...]:
    """The conformance suite's test modules (a run that collects them all is
    a whole-suite run, whose coverage is judged)."""
    return tuple(sorted(p.name for p in _CONFORMANCE_DIR.glob("test_*.py")))


def _is_conformance_test(item: pytest.Item) -> bool:
    """A test of the conformance suite: collected from kvspec/conformance/
    (where every test carries the kvspec_rules marker)."""
    try:
        return _folder_of(str(item.path)) == _CONFORMANCE_DIR
    except OSError:
        return False


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    st = _state(config)
    conformance = [it for it in items if _is_conformance_test(it)]
    if conformance and not st.active:
        _activate(st, DEFAULT_IMPL, config)
    if not st.active:
        return
    if conformance:
        _fail_fast_at_start(st, config)
    for it in conformance:
        if it.get_closest_marker("kvspec_rules") is None:
            raise pytest.UsageError(f"{it.nodeid}: a conformance test must carry @pytest.mark.kvspec_rules(...)")
    for it in items:
        marker = it.get_closest_marker("kvspec_rules")
        bad = [str(a) for a in marker.args if not known_rule(str(a))] if marker else []
        if bad:
            raise pytest.UsageError(f"{it.nodeid}: kvspec_rules names unknown rule ids {', '.join(bad)}")
    st.conformance_tests = sum(1 for it in items if it.get_closest_marker("kvspec_rules") is not None)
    collected = {Path(str(it.path)).name for it in conformance}
    st.partial_suite = bool(set(suite_modules()) - collected)
    st.selection_narrowed = bool(config.getoption("keyword") or config.getoption("markexpr")) or any(
        "::" in str(a) for a in config.args
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    st = _state(session.config)
    if st.active and st.manifest is not None:
        # after deselection (-k, -m): the tests that will run
        tests = sum(1 for it in session.items if it.get_closest_marker("kvspec_rules") is not None)
        _start_progress(st, session.config, tests)


def _start_progress(st: _KvspecState, config: pytest.Config, tests: int) -> None:
    """Turn the status line on when this run asks for it (``progress.interval``)."""
    from kvspec.conformance.run.progress import interval

    every = interval(config, st.effort)
    if every <= 0 or tests == 0 or config.getoption("collectonly", False):
        return
    from kvspec.conformance.block.machine import ON_EXAMPLE, STATS

    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")

    def write(line: str) -> None:
        if tr is None:
            return
        if capman is None:
            tr.write_line(line)
            return
        with capman.global_and_fixture_disabled():
            tr.write_line(line)

    def rules() -> set[str]:
        return {r for r, n in st.rule_hits.items() if n}

    st.progress = Progress(every, write, STATS, rules)
    st.progress.tests_total = tests
    ON_EXAMPLE.append(st.progress.tick)


def _stop_progress(st: _KvspecState) -> None:
    if st.progress is None:
        return
    from kvspec.conformance.block.machine import ON_EXAMPLE

    if st.progress.tick in ON_EXAMPLE:
        ON_EXAMPLE.remove(st.progress.tick)
    st.progress = None


def _fail_fast_at_start(st: _KvspecState, config: pytest.Config) -> None:
    """A manifest that does not load, or an implementation that does not
    start, ends the run here with one message (``startup.py``) instead of
    failing every test the same way."""
    if st.manifest is None:
        raise pytest.UsageError(
            f"kvspec: cannot load the adapter: {st.error}\n  hint: see spec/ADAPTERS.md for the manifest format"
        )
    if config.getoption("collectonly", False) or xdist_support.controller_probed(config):
        return
    from kvspec.conformance.run.startup import start_once

    assert st.adapter_dir is not None
    problem, agreed = start_once(st.manifest, st.adapter_dir)
    if problem is not None:
        st.error = problem  # the results file says why nothing ran
        raise pytest.UsageError(problem)
    _show_negotiated(config, agreed)


def _show_negotiated(config: pytest.Config, agreed: str | None) -> None:
    """Complete the header's protocol line once the adapter has started (the
    header is printed before anything starts, so it can only say what is offered)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if agreed is not None and reporter is not None and not xdist_support.is_worker(config):
        reporter.write_line(f"kvspec protocol: {agreed}")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Under ``-n``, on the controller, before any worker starts: probe the
    implementation once, and merge what the workers count (``xdist_support.py``)."""
    config = session.config
    if not xdist_support.is_controller(config):
        return
    st = _state(config)
    if not st.active and _names_conformance(config.args):
        _activate(st, DEFAULT_IMPL, config)
    results = config.pluginmanager.get_plugin("kvspec-results")
    controller = xdist_support.Controller(config, st, getattr(results, "merge_tests", None))
    config.pluginmanager.register(controller, "kvspec-xdist")
    if not st.active or config.getoption("collectonly", False):
        return
    problem: str | None = None
    if st.manifest is None:
        problem = f"kvspec: cannot load the adapter: {st.error}\n  hint: see spec/ADAPTERS.md for the manifest format"
    else:
        from kvspec.conformance.run.startup import start_once

        assert st.adapter_dir is not None
        problem, agreed = start_once(st.manifest, st.adapter_dir)
        if problem is None:
            _show_negotiated(config, agreed)
    if problem is not None:
        st.error = st.error or problem
        if results is not None:
            results.write(int(pytest.ExitCode.USAGE_ERROR))  # the session never finishes: write it now
        raise pytest.UsageError(problem)
    controller.probed = True


def pytest_runtest_setup(item: pytest.Item) -> None:
    st = _state(item.config)
    if not st.active:
        return
    st.current_test = item.nodeid
    if st.progress is not None:
        st.progress.current = item.name
    _junit_properties(item, st)
    marker = item.get_closest_marker("kvspec_requires")
    if marker is None:
        return
    if st.manifest is None:
        pytest.fail(f"kvspec: cannot load the adapter: {st.error}", pytrace=False)
    caps = st.manifest.capabilities
    missing = [c for c in marker.args if not caps.has(c)]
    if missing:
        pytest.skip(f"adapter {st.manifest.name!r} does not declare capability {', '.join(missing)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    outcome = yield
    st = _state(item.config)
    if not st.active:
        return
    rep = outcome.get_result()
    marker = item.get_closest_marker("kvspec_rules")
    if call.when == "call" and marker is not None:
        st.conformance_ran += 1
        _junit_exercised(item, st)
        if st.progress is not None:
            st.progress.tests_done += 1
            st.progress.tick()
        if call.excinfo is None and marker.args:
            _check_rules_contract(item, rep, [str(a) for a in marker.args], st)
    if call.when != "call" or call.excinfo is None:
        return
    exc = call.excinfo.value
    if HANG_MARK in str(exc):
        # a hanging implementation would make every later test wait its timeout too
        item.session.shouldstop = (
            "kvspec: the implementation stopped answering (see the first failure); "
            "the run stops here instead of waiting out the timeout in every test"
        )
    if not isinstance(exc, ConformanceFailure) or st.manifest is None:
        return
    site = _site_of(item, exc)
    # a declared deviation the lockstep could not follow fails the run (DeviationNotFollowed)
    i = None if isinstance(exc, DeviationNotFollowed) else covering(st.manifest.deviations, site)
    if i is not None:
        dev = st.manifest.deviations[i]
        st.deviations_seen[i] += 1
        rep.outcome = "skipped"
        rep.wasxfail = f"expected deviation {dev.rule} ({dev.describe_scope()}): {dev.reason}"
        return
    if rep.failed:
        from kvspec.conformance.verdicts.failure_first import failure_first

        rep.longrepr = failure_first(item.config, call.excinfo, exc, rep.longrepr)
    if any(d.rule == site.rule for d in st.manifest.deviations):
        rep.longrepr = f"{rep.longrepr}\nkvspec: {site.rule} is declared, but not here: {site.describe()}"


def _junit_properties(item: pytest.Item, st: _KvspecState) -> None:
    """Tag a conformance test with the rules it checks and the
    implementation (JUnit ``<properties>`` with ``--junitxml``)."""
    from kvspec.conformance.verdicts.results_suite import item_rules

    rules = item_rules(item)
    if rules is None or st.manifest is None:
        return
    m = st.manifest
    props = [
        ("kvspec_rules", " ".join(sorted(rules)) or "(named by the data the test runs)"),
        ("kvspec_impl", st.impl_arg or ""),
        ("kvspec_adapter_path", str(st.adapter_dir)),
        ("kvspec_adapter", m.name),
        ("kvspec_variant", m.variant or ""),
        ("kvspec_profiles", " ".join(m.supported_profiles())),
        ("kvspec_effort", st.effort),
    ]
    item.user_properties.extend(props)


def _junit_exercised(item: pytest.Item, st: _KvspecState) -> None:
    """After the call: the rules the test actually exercised."""
    if item.get_closest_marker("kvspec_rules") is None:
        return
    done = sorted(st.test_rules.get(item.nodeid, set()))
    item.user_properties.append(("kvspec_rules_exercised", " ".join(done)))


def _site_of(item: pytest.Item, exc: ConformanceFailure) -> Site:
    """The failure's site, completed with what the test's parameters say
    (the golden scenario id, the profile)."""
    from dataclasses import replace

    site = exc.site
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    if site.scenario is None and "path" in params:
        p = Path(str(params["path"]))
        site = replace(site, scenario=f"{p.parent.name}/{p.stem}")
    if site.profile is None and isinstance(params.get("profile"), str):
        site = replace(site, profile=params["profile"])
    return site


def _check_rules_contract(item: pytest.Item, rep: Any, listed: list[str], st: _KvspecState) -> None:
    """A passing test recorded only rules its kvspec_rules marker lists."""
    recorded = {r for r in st.test_rules.get(item.nodeid, set()) if known_rule(r)}
    extra = sorted(recorded - set(listed))
    if extra:
        rep.outcome = "failed"
        rep.longrepr = (
            f"kvspec: {item.nodeid} exercised {', '.join(extra)}, which its kvspec_rules marker does not list; "
            "add them to the marker (it is the list of rules the test checks)"
        )


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    st = _state(config)
    if not st.active or st.manifest is None or st.conformance_tests == 0:
        return
    tr = terminalreporter
    if st.rule_hits or st.conformance_ran:
        _write_rules_table(tr, st, config, exitstatus)
    if st.incomplete:
        _write_incomplete(tr, st)
    if st.manifest.deviations:
        tr.section("kvspec: declared deviations")
        for i, d in enumerate(st.manifest.deviations):
            seen = st.deviations_seen.get(i, 0)
            state = f"observed {seen}x" if seen else "NOT OBSERVED"
            tr.write_line(f"  {d.rule:<26} {state} [{d.describe_scope()}]: {d.reason}")


def _write_incomplete(tr: Any, st: _KvspecState) -> None:
    """The INCOMPLETE verdict: which applicable rules were never exercised,
    and what the run's exit status is because of it."""
    assert st.manifest is not None
    n = len(st.incomplete)
    tr.section("kvspec: INCOMPLETE", red=not st.allow_incomplete, yellow=st.allow_incomplete)
    tr.write_line(
        f"kvspec: INCOMPLETE: {n} rule(s) apply to {st.manifest.name} (its profiles and capabilities) and were "
        f"never exercised: {', '.join(st.incomplete)}",
        red=not st.allow_incomplete,
        yellow=st.allow_incomplete,
    )
    tr.write_line(
        "  not a pass: the run never asked the implementation what these rules govern (see 'never exercised' "
        "above for why); spec/ADAPTERS.md ('Complete coverage') says how a port reaches every rule"
    )
    if st.allow_incomplete:
        tr.write_line("  --kvspec-allow-incomplete: the run does not fail for it")
    else:
        tr.write_line("  the run fails for it; --kvspec-allow-incomplete accepts an incomplete run (still reported)")


def _write_rules_table(tr: Any, st: _KvspecState, config: pytest.Config, exitstatus: int) -> None:
    """The ``rules exercised`` section (``run_summary.rules_table``)."""
    from kvspec.conformance.run.summary import rules_table

    watcher = config.pluginmanager.get_plugin("kvspec-results")
    verdicts = None
    if watcher is not None and not st.selection_narrowed:
        # a narrowed selection (-k, a node id) leaves most rules out on purpose
        verdicts = watcher.build(int(exitstatus)).rules
    tr.section("kvspec: rules exercised")
    for line in rules_table(st.rule_hits, verdicts):
        tr.write_line(line)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Judge the whole run (tryfirst: before the JUnit report and the results
    file are written, so both carry the outcome)."""
    st = _state(session.config)
    _stop_progress(st)
    if xdist_support.is_worker(session.config):
        # the controller merges every worker's counts and judges (xdist_support.py)
        results = session.config.pluginmanager.get_plugin("kvspec-results")
        tests = results.export_tests() if results is not None else None
        xdist_support.send_from_worker(session.config, st, tests)
        return
    if not st.active or st.manifest is None or st.conformance_tests == 0:
        return
    _judge_coverage(session, st)
    if st.selection_narrowed or st.conformance_ran == 0:
        return  # nothing ran (e.g. every test skipped: the implementation is not installed)
    unseen = [
        (i, d) for i, d in enumerate(st.manifest.deviations) if st.deviations_seen.get(i, 0) == 0 and d.deterministic()
    ]
    if not unseen or exitstatus != 0:
        return
    rep = session.config.pluginmanager.get_plugin("terminalreporter")
    if not is_deterministic(st.effort, seeded=st.seeded):
        if rep is not None:
            rep.write_line(
                f"kvspec: {len(unseen)} declared deviation(s) not observed; not judged on a random run "
                "(run the default or ci effort, or give --hypothesis-seed)"
            )
        return
    for _, d in unseen:
        msg = (
            f"UNEXPECTED PASS: deviation {d.rule} ({d.describe_scope()}) declared in {st.manifest.name}/manifest.toml "
            "was not observed; remove it from the manifest"
        )
        if rep is not None:
            rep.write_line(msg, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _judge_coverage(session: pytest.Session, st: _KvspecState) -> None:
    """A whole-suite run that never exercised an applicable rule is
    incomplete: recorded (summary, results file, JUnit) and, unless
    allowed, a failed session."""
    watcher = session.config.pluginmanager.get_plugin("kvspec-results")
    if watcher is None or not watcher.judged():
        outcome = "not judged (a narrowed selection)"
    else:
        st.incomplete = watcher.build(int(session.exitstatus)).incomplete
        failed = int(session.exitstatus) not in (0, 5)
        outcome = "fail" if failed else "incomplete" if st.incomplete else "pass"
        if st.incomplete and not st.allow_incomplete and not failed:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _junit_outcome(session.config, outcome, st.incomplete)


def _junit_outcome(config: pytest.Config, outcome: str, incomplete: list[str]) -> None:
    """The run's outcome as JUnit ``<properties>`` of the test suite (with ``--junitxml``)."""
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    xml.add_global_property("kvspec_outcome", outcome)
    xml.add_global_property("kvspec_rules_not_exercised", " ".join(incomplete))


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session", autouse=True)
def _kvspec_reuse_children(request: pytest.FixtureRequest) -> Iterator[ChildPool | None]:
    """In a conformance run, reuse adapter processes that announce multi_session
    (spec/PROTOCOL.md 3.8): one process start per test instead of per example."""
    if not _state(request.config).active:
        yield None
        return
    from kvspec.conformance.transport.jsonl import reuse_children

    with reuse_children() as pool:
        yield pool


@pytest.fixture(scope="session")
def kvspec_manifest(request: pytest.FixtureRequest) -> Manifest:
    st = _state(request.config)
    if st.manifest is None:
        pytest.fail(f"kvspec: cannot load the adapter: {st.error}", pytrace=False)
    return st.manifest


@pytest.fixture(scope="session")
def kvspec_adapter_dir(request: pytest.FixtureRequest, kvspec_manifest: Manifest) -> Path:
    st = _state(request.config)
    assert st.adapter_dir is not None
    return st.adapter_dir


@pytest.fixture
def open_impl(
    kvspec_manifest: Manifest, kvspec_adapter_dir: Path
) -> Iterator[Callable[[ManagerConfig], Implementation]]:
    """Factory: ``open_impl(config)`` starts the block-level implementation
    (``kvspec.conformance.opener.open_adapter``); all are closed at the end of
    the test, whatever happens."""
    opened: list[Implementation] = []

    def _open(config: ManagerConfig) -> Implementation:
        impl = open_adapter(kvspec_manifest, kvspec_adapter_dir, config)
        opened.append(impl)
        return impl

    yield _open
    for impl in opened:
        impl.close()


@pytest.fixture
def kvspec_record_rule(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``record(rule, n=1)``: ``rule`` was exercised ``n`` times (the rules table counts it)."""

    def _record(rule: str, n: int = 1) -> None:
        record_rule(request.config, rule, n)

    return _record


@pytest.fixture
def kvspec_record_deviation(request: pytest.FixtureRequest) -> Callable[[int, Site], None]:
    """``record(index, site)``: a declared deviation was observed and followed."""

    def _record(index: int, site: Site) -> None:
        record_deviation(request.config, index, site)

    return _record


@pytest.fixture(scope="session")
def kvspec_settings(request: pytest.FixtureRequest) -> settings:
    """The Hypothesis settings of the selected effort (``--hypothesis-profile``)."""
    return conformance_settings(request.config)
