"""``pytest conformance --impl=... -n auto``: the suite over pytest-xdist workers.

Each worker is its own pytest process: it collects the suite, runs the tests
the controller hands it and starts its own adapter processes (one
implementation per worker, nothing shared but the working dir's files). What
the serial run keeps in one session's state is split over the workers, so:

- the controller probes the implementation once, before any worker starts
  (``pytest_sessionstart``), and tells the workers not to probe again
  (``workerinput``); a failed probe ends the run with the serial run's one
  message and usage-error status;
- the controller chooses the working dir and a run id, and the workers use
  the controller's (``workerinput``: replay folders of one run stay together);
- at its end each worker sends what it counted (rules exercised, deviations
  observed, tests run, the results-file record of each test it ran) in xdist's
  ``workeroutput``; the controller adds them up when the worker goes down
  (``pytest_testnodedown``), before the session finishes, so the summary
  table, the unexpected-pass judgement and ``--kvspec-results`` are written
  once, by the controller, from the merged counts: the verdict of a serial run.

A worker that crashes sends nothing: the test it was running is reported
failed by xdist and is in the results file as such, but the rules and
deviations it had counted are lost (the summary says how many workers did
not report).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any, Protocol

import pytest

from kvspec.conformance.run.workdir import WORKER_KEY, working_dir

#: ``workeroutput`` key of a worker's counts
OUTPUT_KEY = "kvspec"
#: ``workerinput`` keys: the controller probed the implementation; the run's id
PROBED_KEY = "kvspec_probed"
RUN_ID_KEY = "kvspec_run_id"

_RUN_ID = pytest.StashKey[str]()


class _MergedState(Protocol):
    """What is merged of the plugin's session state (``plugin._KvspecState``)."""

    active: bool
    error: str | None
    deviations_seen: Counter[int]
    rule_hits: Counter[str]
    conformance_tests: int
    conformance_ran: int
    selection_narrowed: bool
    partial_suite: bool


def is_worker(config: pytest.Config) -> bool:
    """Is this pytest process an xdist worker?"""
    return isinstance(getattr(config, "workerinput", None), dict)


def is_controller(config: pytest.Config) -> bool:
    """Is this pytest process an xdist controller (``-n N`` with N > 0)?"""
    return config.pluginmanager.has_plugin("dsession")


def worker_input(config: pytest.Config) -> dict[str, Any]:
    wi = getattr(config, "workerinput", None)
    return wi if isinstance(wi, dict) else {}


def controller_probed(config: pytest.Config) -> bool:
    """On a worker: did the controller already start the implementation once?"""
    return bool(worker_input(config).get(PROBED_KEY))


def run_id(config: pytest.Config) -> str:
    """An id of this run, the same in the controller and every worker (a UTC
    time stamp and a random suffix): a per-run folder name."""
    given = worker_input(config).get(RUN_ID_KEY)
    if given:
        return str(given)
    if _RUN_ID not in config.stash:
        config.stash[_RUN_ID] = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    return config.stash[_RUN_ID]


# ------------------------------------------------------------ state in transit


def export_state(st: _MergedState) -> dict[str, Any]:
    """A worker's counts, as plain data execnet can send."""
    return {
        "active": st.active,
        "error": st.error,
        "deviations_seen": {str(k): v for k, v in st.deviations_seen.items()},
        "rule_hits": dict(st.rule_hits),
        "conformance_tests": st.conformance_tests,
        "conformance_ran": st.conformance_ran,
        "selection_narrowed": st.selection_narrowed,
        "partial_suite": st.partial_suite,
    }


def merge_state(st: _MergedState, data: dict[str, Any]) -> None:
    """Add one worker's counts to the controller's state. Every worker
    collects the whole suite (``conformance_tests`` is the same in each) and
    runs a share of it (``conformance_ran`` adds up)."""
    st.active = st.active or bool(data.get("active"))
    st.error = st.error or data.get("error")
    st.deviations_seen.update({int(k): int(v) for k, v in dict(data.get("deviations_seen", {})).items()})
    st.rule_hits.update({str(k): int(v) for k, v in dict(data.get("rule_hits", {})).items()})
    st.conformance_tests = max(st.conformance_tests, int(data.get("conformance_tests", 0)))
    st.conformance_ran += int(data.get("conformance_ran", 0))
    st.selection_narrowed = st.selection_narrowed or bool(data.get("selection_narrowed"))
    st.partial_suite = st.partial_suite or bool(data.get("partial_suite"))


class Controller:
    """The controller's side: hands the workers their inputs and merges their
    outputs (registered by the plugin only under ``-n``)."""

    def __init__(self, config: pytest.Config, state: _MergedState, merge_results: Any) -> None:
        self.config = config
        self.state = state
        #: ``merge_results(tests)``: the results-file plugin's merge (None: no ``--kvspec-results``)
        self.merge_results = merge_results
        self.probed = False
        self.reported = 0
        self.silent: list[str] = []

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKER_KEY] = str(working_dir(self.config))
        node.workerinput[PROBED_KEY] = self.probed
        node.workerinput[RUN_ID_KEY] = run_id(self.config)

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        out = getattr(node, "workeroutput", None) or {}
        data = out.get(OUTPUT_KEY)
        if not isinstance(data, dict):
            self.silent.append(str(getattr(getattr(node, "gateway", None), "id", "?")))
            return
        self.reported += 1
        merge_state(self.state, data.get("state", {}))
        tests = data.get("tests")
        if self.merge_results is not None and isinstance(tests, dict):
            self.merge_results(tests)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.silent and self.state.conformance_tests:
            terminalreporter.write_line(
                f"kvspec: {len(self.silent)} xdist worker(s) ({', '.join(self.silent)}) ended without reporting "
                "their counts (crashed?): the rules and deviations they counted are missing above",
                yellow=True,
            )


def send_from_worker(config: pytest.Config, state: _MergedState, tests: dict[str, Any] | None) -> None:
    """On a worker at the end of its session: put its counts in ``workeroutput``
    (xdist sends them after ``pytest_sessionfinish``)."""
    out = getattr(config, "workeroutput", None)
    if isinstance(out, dict):
        out[OUTPUT_KEY] = {"state": export_state(state), "tests": tests}
