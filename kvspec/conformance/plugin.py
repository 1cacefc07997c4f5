"""The kvspec pytest plugin: ``--impl``, capability skips, expected deviations.

Registered through the ``pytest11`` entry point, so that once kvspec is
installed any repository can run the suite against its own adapter:

    pytest --pyargs kvspec.conformance --impl=path/to/adapter

- ``--impl`` picks the adapter folder (default: the bundled reference).
- ``@pytest.mark.kvspec_requires("offload", "profile:atomic")`` skips a test
  whose capability the manifest does not declare, naming it in the reason.
- A test failing with a ``ConformanceFailure`` whose rule the manifest lists
  as an expected deviation is reported as xfail with the manifest's reason.
  A declared deviation that no test observed in a full run is an unexpected
  pass: the session fails and says to remove it from the manifest.
- The terminal summary shows how often each rule was exercised and which
  deviations were observed; ``--kvspec-results FILE`` writes all of it as the
  results JSON (``conformance/results_suite.py``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError

from .failures import ConformanceFailure
from .implementation import Implementation, open_implementation
from .manifest import Manifest, load_impl
from .settings import register_hypothesis_profiles

register_hypothesis_profiles()

_STATE_KEY = pytest.StashKey["_KvspecState"]()


class _KvspecState:
    def __init__(self) -> None:
        self.adapter_dir: Path | None = None
        self.manifest: Manifest | None = None
        self.error: str | None = None
        self.deviations_seen: Counter[str] = Counter()
        self.rule_hits: Counter[str] = Counter()
        self.conformance_tests = 0
        #: conformance tests that got as far as running (a skip at set-up does not)
        self.conformance_ran = 0
        self.selection_narrowed = False


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvspec", "kvspec conformance suite")
    group.addoption(
        "--impl",
        action="store",
        default="adapters/reference",
        help="adapter folder (with manifest.toml) or bundled adapter name; default: adapters/reference",
    )
    group.addoption(
        "--kvspec-replay-dir",
        action="store",
        default=".kvspec/replays",
        help="where failing stateful runs write their replay files (JSON lines)",
    )
    group.addoption(
        "--kvspec-results",
        action="store",
        default=None,
        metavar="FILE",
        help="write the run's results JSON here (rules, deviations, failures; kvspec report / kvspec gate read it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kvspec_requires(*capabilities): skip unless the adapter declares every capability"
    )
    config.addinivalue_line("markers", "kvspec_rules(*rule_ids): the rules a conformance test exercises")
    state = _KvspecState()
    config.stash[_STATE_KEY] = state
    try:
        state.adapter_dir, state.manifest = load_impl(config.getoption("--impl"))
    except ConfigError as e:
        state.error = str(e)
    if config.getoption("--kvspec-results", None):
        from .results_suite import SuiteResults

        config.pluginmanager.register(
            SuiteResults(config, state, config.getoption("--kvspec-results")), "kvspec-results"
        )


def _state(config: pytest.Config) -> _KvspecState:
    return config.stash[_STATE_KEY]


def record_rule(config: pytest.Config, rule: str, n: int = 1) -> None:
    """Count that a test exercised ``rule`` (shown in the summary)."""
    _state(config).rule_hits[rule] += n


def pytest_report_header(config: pytest.Config) -> list[str]:
    st = _state(config)
    if st.manifest is None:
        return [f"kvspec: {st.error}"] if st.error and _is_conformance_run(config) else []
    m = st.manifest
    return [
        f"kvspec impl: {m.name} ({m.kind}) from {st.adapter_dir}",
        f"kvspec profile: {m.profile}; also {', '.join(m.capabilities.profiles) or '-'}",
    ]


def _is_conformance_run(config: pytest.Config) -> bool:
    return any("conformance" in str(a) for a in config.args)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    st = _state(config)
    st.conformance_tests = sum(1 for it in items if it.get_closest_marker("kvspec_rules") is not None)
    st.selection_narrowed = bool(config.getoption("keyword") or config.getoption("markexpr")) or any(
        "::" in str(a) for a in config.args
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("kvspec_requires")
    if marker is None:
        return
    st = _state(item.config)
    if st.manifest is None:
        pytest.fail(f"kvspec: cannot load the adapter: {st.error}", pytrace=False)
    caps = st.manifest.capabilities
    missing = [c for c in marker.args if not caps.has(c)]
    if missing:
        pytest.skip(f"adapter {st.manifest.name!r} does not declare capability {', '.join(missing)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    outcome = yield
    rep = outcome.get_result()
    if call.when == "call" and item.get_closest_marker("kvspec_rules") is not None:
        _state(item.config).conformance_ran += 1
    if call.when != "call" or call.excinfo is None:
        return
    exc = call.excinfo.value
    rule = getattr(exc, "rule", None)
    if not isinstance(exc, ConformanceFailure) or rule is None:
        return
    st = _state(item.config)
    profile = getattr(item, "callspec", None)
    prof = profile.params.get("profile") if profile is not None else None
    dev = st.manifest.deviation(str(rule), prof) if st.manifest else None
    if dev is not None:
        st.deviations_seen[str(rule)] += 1
        rep.outcome = "skipped"
        rep.wasxfail = f"expected deviation {rule}: {dev.reason}"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    st = _state(config)
    if st.manifest is None or st.conformance_tests == 0:
        return
    tr = terminalreporter
    if st.rule_hits:
        tr.section("kvspec: rules exercised")
        for rule, n in sorted(st.rule_hits.items()):
            tr.write_line(f"  {rule:<26} {n}")
    if st.manifest.deviations:
        tr.section("kvspec: declared deviations")
        for d in st.manifest.deviations:
            seen = st.deviations_seen.get(str(d.rule), 0)
            state = f"observed {seen}x" if seen else "NOT OBSERVED"
            tr.write_line(f"  {d.rule:<26} {state}: {d.reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    st = _state(session.config)
    if st.manifest is None or st.conformance_tests == 0 or st.selection_narrowed or st.conformance_ran == 0:
        return  # nothing ran (e.g. every test skipped: the implementation is not installed)
    unseen = [d for d in st.manifest.deviations if st.deviations_seen.get(str(d.rule), 0) == 0]
    if unseen and exitstatus == 0:
        rep = session.config.pluginmanager.get_plugin("terminalreporter")
        for d in unseen:
            msg = (
                f"UNEXPECTED PASS: deviation {d.rule} declared in {st.manifest.name}/manifest.toml "
                "was not observed; remove it from the manifest"
            )
            if rep is not None:
                rep.write_line(msg, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session", autouse=True)
def _kvspec_reuse_children(request: pytest.FixtureRequest) -> Any:
    """In a conformance run, reuse adapter processes that announce multi_session
    (spec/PROTOCOL.md 3.8): one process start per test instead of per example."""
    if not _is_conformance_run(request.config):
        yield None
        return
    from .transport.jsonl import reuse_children

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
def open_impl(kvspec_manifest: Manifest, kvspec_adapter_dir: Path) -> Any:
    """Factory: ``open_impl(config)`` starts the implementation; all are
    closed at the end of the test, whatever happens."""
    opened: list[Implementation] = []

    def _open(config: ManagerConfig) -> Implementation:
        impl = open_implementation(kvspec_manifest, kvspec_adapter_dir, config)
        opened.append(impl)
        return impl

    yield _open
    for impl in opened:
        impl.close()


@pytest.fixture
def kvspec_record_rule(request: pytest.FixtureRequest) -> Any:
    def _record(rule: str, n: int = 1) -> None:
        record_rule(request.config, rule, n)

    return _record
