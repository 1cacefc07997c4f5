"""``kvspec mutants``: run the conformance suite against every mutant.

The suite is only worth trusting if it fails on broken implementations. A
mutant is a variant an adapter folder declares in its manifest
(``[[variants]]``: name, rule, description, profiles, needs); by default the
bundled ``adapters/mutants`` (realistic bugs of the reference model), or any
folder with ``--impl=DIR`` (a port's own single-bug twins). This command
runs the whole suite (Hypothesis profile ``ci``, stop at the first failure)
against each (``--impl=DIR/NAME``) in its own pytest process, a few at a
time (``--jobs``), and prints a table:
which mutant was killed, by which test, under which rule, and how long the
suite took to kill it. It exits non-zero if any mutant survives or its run
breaks, so CI can gate on it.

Before any mutant it runs the suite once on the adapter with no variant
selected (``--impl=DIR``, shown as ``none``; for ``adapters/mutants`` the
unmutated reference): if that fails, every kill would be meaningless and the
run stops as invalid.

Every run's pytest output, JUnit report and replay files are kept in a
folder of the campaign (``<working dir>/mutants/<run id>-<adapter>/NAME``;
``--log-dir DIR`` instead: ``DIR/NAME``), the newest ``LOG_KEEP`` campaigns
kept. The working dir (``--kvspec-dir``, else ``KVSPEC_HOME``, else
``./.kvspec`` of the directory the command runs in; ``workdir.py``) is
handed to every child, so that a campaign writes its Hypothesis files,
replays and C or Rust builds there and nothing into the source tree, which
is the children's current directory.

Each run is a child forked from a server that has imported pytest,
Hypothesis and kvspec once (``forkserver.py``; one server per job): a kill
then pays for collecting the suite and running tests, not for start-up. The
child is a pytest session like any other (its own process group, its test
modules collected and assertion-rewritten afresh); ``--fresh-processes``
starts a new interpreter per run instead. Time to kill is the wall time from
asking for the run to its verdict; a forked run also reports its CPU time.

A kill is a failed test in the pytest run. An expected failure cannot count:
the mutants' manifest declares no deviation, and the JUnit report marks an
xfail as skipped, which is never read as a kill.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvspec.conformance.run import workdir
from kvspec.conformance.run.forkserver import ForkServer, ServerPool, package_modules, suite_imports
from kvspec.spec.manifest import Manifest
from kvspec.spec.rules import RuleId

Status = Literal["killed", "passed", "error", "timeout", "false_kill"]

_RULE_RE = re.compile(r"\[([A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*)\]")
_KNOWN_RULES = {r.value for r in RuleId}


@dataclass(frozen=True, slots=True)
class SuiteRun:
    """The outcome of one pytest run of the suite against one variant."""

    name: str
    status: Status
    seconds: float
    test: str | None = None
    rule: str | None = None
    detail: str = ""
    #: CPU seconds of the run (known for a forked run; independent of load)
    cpu: float | None = None


# ------------------------------------------------------------------ locations


def suite_dir() -> Path:
    """The installed conformance suite (the ``kvspec.conformance`` package's folder)."""
    return Path(__file__).resolve().parent.parent


def mutants_adapter_dir() -> Path:
    """The bundled mutant zoo (the default ``--impl``)."""
    from kvspec.conformance.run.manifest import _builtin_adapters_dir

    return (_builtin_adapters_dir() / "mutants").resolve()


#: the name of the sanity run (the adapter with no variant selected)
UNMUTATED = "none"
#: campaign log folders kept under ``<working dir>/mutants`` (the newest ones)
LOG_KEEP = 10


def campaign_log_dir(root: Path, adapter_name: str, keep: int = LOG_KEEP) -> Path:
    """A new folder for one campaign's logs under ``root/mutants``, named
    ``<UTC stamp>-<microseconds>-<random>-<adapter>`` (sorts by age; two
    campaigns started at once do not collide); older campaigns beyond ``keep`` go."""
    from kvspec.conformance.verdicts.replay_store import prune, slug

    base = root / workdir.MUTANTS
    base.mkdir(parents=True, exist_ok=True)
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    folder = base / f"{stamp}-{int(now % 1 * 1e6):06d}-{uuid.uuid4().hex[:4]}-{slug(adapter_name)}"
    folder.mkdir()
    prune(base, keep, spare=folder)
    return folder


def impl_of(name: str, adapter_dir: Path) -> str:
    """The ``--impl`` value that runs variant ``name`` of ``adapter_dir``."""
    return str(adapter_dir) if name == UNMUTATED else str(adapter_dir / name)


# --------------------------------------------------------- reading the result


def rule_in(text: str) -> str | None:
    """The first known rule id written as ``[RULE-ID]`` in ``text``."""
    for m in _RULE_RE.finditer(text):
        if m.group(1) in _KNOWN_RULES:
            return m.group(1)
    return None


def first_failure(junit: Path) -> tuple[str, str | None, str] | None:
    """(test, rule, message) of the first failed or errored test case in a
    JUnit report; skipped cases (skips and xfails) are never failures."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return None
    for case in root.iter("testcase"):
        for child in case:
            if child.tag not in ("failure", "error"):
                continue
            module = (case.get("classname") or "").rsplit(".", 1)[-1]
            test = f"{module}::{case.get('name', '?')}" if module else case.get("name", "?")
            message = child.get("message") or ""
            text = f"{message}\n{child.text or ''}"
            first_line = next((ln.strip() for ln in message.splitlines() if ln.strip()), child.tag)
            return test, rule_in(text), first_line[:200]
    return None


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run_outcome(junit: Path) -> tuple[str | None, list[str]]:
    """The suite's own verdict in a JUnit report (the ``kvspec_outcome`` and
    ``kvspec_rules_not_exercised`` properties the plugin writes)."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return None, []
    props = {p.get("name"): p.get("value") or "" for p in root.iter("property")}
    return props.get("kvspec_outcome"), (props.get("kvspec_rules_not_exercised") or "").split()


def classify(name: str, returncode: int, junit: Path, output: str, seconds: float) -> SuiteRun:
    """Turn a finished pytest run into a SuiteRun.

    Exit 0: the suite passed (a mutant survived). Exit 1 with a failed test
    case: killed, by that test. Exit 1 with no failed test and the run
    judged incomplete (applicable rules never exercised): a mutant survived
    it (no test failed), the sanity run is an error (the campaign cannot
    trust a suite that leaves rules out). Anything else (collection error,
    usage error, internal error, no report) is an error of the run, not a kill."""
    if returncode == 0:
        return SuiteRun(name, "passed", seconds)
    failure = first_failure(junit)
    if returncode == 1 and failure is not None:
        test, rule, message = failure
        return SuiteRun(name, "killed", seconds, test, rule, message)
    outcome, missing = run_outcome(junit)
    if returncode == 1 and outcome == "incomplete":
        detail = f"the run was incomplete: rules never exercised: {', '.join(missing)}"
        return SuiteRun(name, "error" if name == UNMUTATED else "passed", seconds, detail=detail)
    return SuiteRun(name, "error", seconds, detail=f"pytest exit status {returncode}\n{_tail(output)}")


# ------------------------------------------------------------- running pytest

_live: set[subprocess.Popen[str]] = set()
_live_pools: set[ServerPool] = set()
_live_lock = threading.Lock()


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def pytest_command(
    name: str,
    suite: Path,
    junit: Path,
    replay_dir: Path,
    profile: str,
    adapter_dir: Path | None = None,
    kvspec_dir: Path | None = None,
) -> list[str]:
    """The child's pytest command line (``kvspec_dir``: the working dir it
    must use; None: its own default, relative to its current directory)."""
    return [
        sys.executable,
        "-m",
        "pytest",
        str(suite),
        f"--impl={impl_of(name, adapter_dir or mutants_adapter_dir())}",
        f"--hypothesis-profile={profile}",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        f"--kvspec-replay-dir={replay_dir}",
        *([f"--kvspec-dir={kvspec_dir}"] if kvspec_dir is not None else []),
    ]


def run_suite(
    name: str,
    *,
    suite: Path,
    timeout: float,
    profile: str = "ci",
    log_dir: Path | None = None,
    adapter_dir: Path | None = None,
    server: ForkServer | None = None,
    kvspec_dir: Path | None = None,
) -> SuiteRun:
    """Run the suite against variant ``name`` of ``adapter_dir`` (default: the
    bundled mutants; ``none``: no variant) in a child process group that
    is killed whole when the run passes ``timeout`` seconds: a child forked
    by ``server`` (imports already paid), or a fresh ``python -m pytest``
    without one. With ``log_dir`` the run's output, JUnit report and replay
    files stay in ``log_dir/name`` (without it, in a temporary folder removed
    after the verdict). ``kvspec_dir`` is the working dir the child uses. The
    time is the wall time from asking for the run to its verdict."""
    with tempfile.TemporaryDirectory(prefix=f"kvspec-mutant-{name}-") as tmp:
        keep = Path(tmp) if log_dir is None else log_dir / name
        keep.mkdir(parents=True, exist_ok=True)
        junit = keep / "junit.xml"
        cmd = pytest_command(name, suite, junit, keep / "replays", profile, adapter_dir, kvspec_dir)
        start = time.monotonic()
        if server is not None:
            log = keep / "pytest.log"
            # pytest would warn that the pre-imported Hypothesis cannot be assertion-rewritten (harmless)
            argv = [*cmd[3:], "-W", "ignore::pytest.PytestAssertRewriteWarning"]
            code = server.run(argv, cwd=suite.parent, log=log, timeout=timeout)
            seconds = time.monotonic() - start
            out = log.read_text(errors="replace") if log.exists() else ""
            if code is None:
                return SuiteRun(name, "timeout", seconds, detail=f"no verdict after {timeout:g} s")
            return dataclasses.replace(classify(name, code, junit, out, seconds), cpu=server.last_cpu)
        proc = subprocess.Popen(
            cmd,
            cwd=suite.parent,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        with _live_lock:
            _live.add(proc)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, _ = proc.communicate()
            return SuiteRun(name, "timeout", time.monotonic() - start, detail=f"no verdict after {timeout:g} s")
        finally:
            _kill_group(proc)  # whatever the suite started is gone with it
            with _live_lock:
                _live.discard(proc)
            if log_dir is not None:
                (keep / "pytest.log").write_text(out or "")
        return classify(name, proc.returncode, junit, out, time.monotonic() - start)


def profiles_of_test(test: str, scenario_profiles: dict[str, str]) -> set[str]:
    """The profiles a test id says it ran under: a parameter that is a
    profile name (``test_lockstep[kvbm]``), or a golden scenario's profile."""
    from kvspec.spec.profiles import PROFILES

    m = re.search(r"\[(.*)\]$", test)
    if m is None:
        return set()
    param = m.group(1)
    found = {tok for tok in param.split("-") if tok in PROFILES}
    if not found and "test_golden_scenario" in test:
        param = param.partition("@")[0]  # FOLDER/NAME@POLICY: one run of a multi-policy scenario
        prof = scenario_profiles.get(param) or scenario_profiles.get(param.rstrip("0123456789"))
        if prof is not None:
            found.add(prof)
    return found


def credit(run: SuiteRun, mutant_profiles: Iterable[str], scenario_profiles: dict[str, str]) -> SuiteRun:
    """A kill by a test that ran only under profiles the mutant leaves
    untouched is the suite failing on the reference: not a kill."""
    if run.status != "killed" or run.test is None:
        return run
    ran = profiles_of_test(run.test, scenario_profiles)
    if ran and not ran & set(mutant_profiles):
        return dataclasses.replace(
            run,
            status="false_kill",
            detail=f"killed under {', '.join(sorted(ran))}, where this mutant is the unmutated reference: {run.detail}",
        )
    return run


def _scenario_profiles() -> dict[str, str]:
    try:
        from kvspec.spec.scenario import all_scenarios

        found = all_scenarios()
        by_stem = {p.stem: s.config.profile for p, s in found}
        return {**by_stem, **{f"{p.parent.name}/{p.stem}": s.config.profile for p, s in found}}
    except Exception:  # a broken scenario file must not hide the table
        return {}


def kill_all() -> None:
    with _live_lock:
        procs = list(_live)
        pools = list(_live_pools)
    for p in procs:
        _kill_group(p)
    for pool in pools:
        pool.close()


def preload_modules(suite: Path, manifest: Manifest) -> list[str]:
    """What a fork server imports before forking: kvspec's spec, reference
    and conformance modules (not the tests), the suite's imports, the
    adapter's Python factories, and the parsed golden scenarios."""
    factories = [manifest.start.python, manifest.start.requests, manifest.start.managers, manifest.start.radix]
    return list(
        dict.fromkeys(
            [
                "kvspec.conformance.run.plugin",
                *package_modules("kvspec.spec"),
                *package_modules("kvspec.reference", skip=["kvspec.reference.smt"]),  # z3: the suite needs none
                *package_modules("kvspec.conformance", skip=["kvspec.streams"]),
                *suite_imports(suite),
                *(f.partition(":")[0] for f in factories if f),
                "kvspec.spec.scenario:all_scenarios",
                "kvspec.spec.manager_scenario:manager_scenarios",
            ]
        )
    )


def run_many(
    names: Iterable[str],
    run: Callable[[str], SuiteRun],
    jobs: int,
    on_done: Callable[[SuiteRun, int, int], None] | None = None,
) -> list[SuiteRun]:
    """Run ``run(name)`` for every name on ``jobs`` workers; Ctrl-C kills
    every child process group before it propagates."""
    names = list(names)
    results: list[SuiteRun] = []
    futures: list[Future[SuiteRun]] = []
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = [pool.submit(run, n) for n in names]
        for fut in as_completed(futures):
            r = fut.result()
            results.append(r)
            if on_done is not None:
                on_done(r, len(results), len(names))
    except BaseException:
        for f in futures:
            f.cancel()
        kill_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    order = {n: i for i, n in enumerate(names)}
    return sorted(results, key=lambda r: order[r.name])


# -------------------------------------------------------------------- report

_SHOWN = {"killed": "killed", "passed": "SURVIVED", "error": "ERROR", "timeout": "TIMEOUT", "false_kill": "FALSE-KILL"}


def format_table(runs: list[SuiteRun], expected: dict[str, str]) -> str:
    header = ("mutant", "result", "time_s", "cpu_s", "rule", "expected rule", "killed by test")
    rows = [
        (
            r.name,
            _SHOWN[r.status],
            f"{r.seconds:.1f}",
            "-" if r.cpu is None else f"{r.cpu:.2f}",
            r.rule or ("(no rule id)" if r.status == "killed" else "-"),
            expected.get(r.name, "-"),
            r.test or "-",
        )
        for r in runs
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary(runs: list[SuiteRun]) -> list[str]:
    killed = [r for r in runs if r.status == "killed"]
    lines = [f"killed {len(killed)}/{len(runs)} mutants"]
    for status, label in (
        ("passed", "survived"),
        ("false_kill", "failed under a profile the mutant does not change (a suite failure, not a kill)"),
        ("error", "run errors"),
        ("timeout", "timed out"),
    ):
        names = [r.name for r in runs if r.status == status]
        if names:
            lines.append(f"{label}: {', '.join(names)}")
    if killed:
        worst = max(killed, key=lambda r: r.seconds)
        med = statistics.median(r.seconds for r in killed)
        lines.append(f"time to kill: median {med:.1f} s, worst {worst.seconds:.1f} s ({worst.name})")
        cpus = [r.cpu for r in killed if r.cpu is not None]
        if cpus:
            lines.append(f"CPU time to kill: median {statistics.median(cpus):.2f} s, worst {max(cpus):.2f} s")
    return lines


# ----------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--impl",
        default=None,
        help="adapter folder whose manifest declares the variants to run ([[variants]]; default: adapters/mutants)",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", default="", metavar="NAME,...", help="run only these mutants (comma-separated)")
    parser.add_argument("--jobs", type=int, default=2, help="suite runs at a time (default 2)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one suite run may take (default 900)")
    parser.add_argument("--hypothesis-profile", default="ci", help="Hypothesis settings profile (default ci)")
    parser.add_argument(
        "--suite", type=Path, default=None, help="the conformance suite folder (default: the installed one)"
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="keep each run's pytest output, JUnit report and replay files in LOG_DIR/NAME "
        "(default: a new folder under the working dir's mutants/, the newest "
        f"{LOG_KEEP} campaigns kept)",
    )
    parser.add_argument(
        "--kvspec-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"kvspec's working dir for the campaign and every suite run (logs, Hypothesis files, builds); "
        f"default: ${workdir.ENV}, else ./{workdir.DEFAULT}",
    )
    parser.add_argument(
        "--fresh-processes",
        action="store_true",
        help="start each suite run in a new Python process (slower; the default forks each run from a "
        "server that has imported pytest, Hypothesis and kvspec once per job)",
    )
    parser.add_argument(
        "--skip-sanity",
        action="store_true",
        help="do not run the unmutated reference first (local debugging only; the result is then not a proof)",
    )


def _list(manifest: Manifest) -> int:
    w = max((len(v.name) for v in manifest.mutants()), default=4)
    for v in manifest.mutants():
        needs = f" [needs {', '.join(v.needs)}]" if v.needs else ""
        profiles = ",".join(manifest.variant_profiles(v))
        print(f"{v.name:<{w}}  {profiles:<19} {v.rule:<24} {v.description}{needs}")
    print(f"{len(manifest.mutants())} mutants")
    return 0


def run(args: argparse.Namespace) -> int:
    from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
    from kvspec.spec.errors import ConfigError

    try:
        adapter_dir = resolve_adapter_dir(args.impl) if args.impl else mutants_adapter_dir()
        manifest = load_manifest(adapter_dir)
    except ConfigError as e:
        print(f"kvspec mutants: {e}", file=sys.stderr)
        return 2
    if not manifest.mutants():
        print(
            f"kvspec mutants: {adapter_dir}/manifest.toml declares no [[variants]] that are mutants",
            file=sys.stderr,
        )
        return 2
    if args.list:
        return _list(manifest)
    variants = {v.name: v for v in manifest.mutants()}  # backend variants are not mutants
    names = list(variants)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in variants]
        if unknown:
            print(f"kvspec mutants: unknown mutant(s): {', '.join(unknown)} (see --list)", file=sys.stderr)
            return 2
        names = wanted
    suite = (args.suite or suite_dir()).resolve()
    try:
        root = workdir.ensure(workdir.resolve(args.kvspec_dir))
        log_dir = args.log_dir.resolve() if args.log_dir else campaign_log_dir(root, manifest.name)
    except OSError as e:
        print(f"kvspec mutants: cannot make the working dir's folders: {e}", file=sys.stderr)
        return 2
    print(f"kvspec mutants: working dir {root}; logs in {log_dir}", file=sys.stderr, flush=True)

    scenario_profiles = _scenario_profiles()
    pool = None if args.fresh_processes else ServerPool(args.jobs, preload_modules(suite, manifest), cwd=suite.parent)
    if pool is not None:
        with _live_lock:
            _live_pools.add(pool)

    def one(name: str) -> SuiteRun:
        server = None if pool is None else pool.acquire()
        try:
            r = run_suite(
                name,
                suite=suite,
                timeout=args.timeout,
                profile=args.hypothesis_profile,
                log_dir=log_dir,
                adapter_dir=adapter_dir,
                server=server,
                kvspec_dir=root,
            )
        finally:
            if pool is not None and server is not None:
                pool.release(server)
        if name == UNMUTATED:
            return r
        return credit(r, manifest.variant_profiles(variants[name]), scenario_profiles)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # a CI timeout's SIGTERM cleans up like Ctrl-C

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        if not args.skip_sanity:
            print(
                f"sanity: the suite ({suite}) against {manifest.name} with no variant ...", file=sys.stderr, flush=True
            )
            sane = one(UNMUTATED)
            if sane.status != "passed":
                print(
                    f"INVALID RUN: the suite does not pass on {manifest.name} without a variant ({sane.status}"
                    f"{', ' + sane.test if sane.test else ''}{', rule ' + sane.rule if sane.rule else ''}); "
                    f"no kill would mean anything.\n{sane.detail}",
                    file=sys.stderr,
                )
                return 2
            print(f"sanity: passed in {sane.seconds:.1f} s", file=sys.stderr, flush=True)

        def progress(r: SuiteRun, i: int, n: int) -> None:
            print(f"[{i}/{n}] {r.name}: {_SHOWN[r.status]} in {r.seconds:.1f} s", file=sys.stderr, flush=True)

        runs = run_many(names, one, args.jobs, progress)
    except KeyboardInterrupt:
        kill_all()
        print("kvspec mutants: interrupted", file=sys.stderr)
        return 130
    finally:
        if pool is not None:
            pool.close()
            with _live_lock:
                _live_pools.discard(pool)
    print(format_table(runs, {v.name: str(v.rule) for v in manifest.mutants()}))
    for r in runs:
        if r.status in ("error", "timeout", "false_kill"):
            print(f"\n{r.name}: {r.status}\n{r.detail}")
    print()
    for line in summary(runs):
        print(line)
    print(f"logs (pytest output, JUnit report, replay files of each run): {log_dir}")
    return 0 if all(r.status == "killed" for r in runs) else 1
