"""Parallel and distributed runs (issue 10): ``-n 2`` gives a serial run's
verdict, merged rule counts and results file; a broken implementation fails
under ``-n 2``, both workers' failures in the merged results; a shared
example database (a directory, or a real Redis server through Hypothesis's
own ``RedisExampleDatabase``) makes the next run replay a failure an earlier
run found.

Each case runs the suite in a child pytest, as a user would. Whether the
second run replayed the stored failure is read from Hypothesis's own record
of how each test case came about (its observability output, enabled with
``HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY``: ``how_generated`` is ``during
reuse phase`` for an example read back from the database), not from timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "adapters" / "reference"
#: a mutant whose extra Removed event both the goldens and the lockstep machine catch
MUTANT = ROOT / "adapters" / "mutants" / "removed_extra_block"


def _env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: none of this pytest's (or xdist's)
    variables, no redirected Hypothesis or kvspec folders."""
    drop = ("PYTEST", "HYPOTHESIS_", "KVSPEC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, **extra}


def _suite(cwd: Path, impl: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--pyargs",
            "kvspec.conformance",
            f"--impl={impl}",
            f"--kvspec-dir={cwd / 'wd'}",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        env=env if env is not None else _env(),
    )


def _needs_xdist() -> None:
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (pip install 'kvspec[parallel]')")


def _comparable(results: dict[str, Any]) -> dict[str, Any]:
    """What a serial and a parallel run of the same selection must agree on."""
    return {
        "status": results["status"],
        "exit_code": results["exit_code"],
        "counts": results["counts"],
        "rules": results["rules"],
        "failures": results["failures"],
        "deviations": results["deviations"],
    }


def test_two_workers_give_the_serial_verdict_and_rule_counts(tmp_path: Path) -> None:
    _needs_xdist()
    select = ("-k", "golden_scenario and kvbm", "-q")
    serial = _suite(tmp_path, REFERENCE, *select, f"--kvspec-results={tmp_path / 'serial.json'}")
    assert serial.returncode == 0, serial.stdout[-3000:] + serial.stderr[-3000:]
    par = _suite(tmp_path, REFERENCE, *select, "-n", "2", f"--kvspec-results={tmp_path / 'n2.json'}")
    assert par.returncode == 0, par.stdout[-3000:] + par.stderr[-3000:]
    a = json.loads((tmp_path / "serial.json").read_text())
    b = json.loads((tmp_path / "n2.json").read_text())
    assert a["counts"]["passed"] > 100  # the selection ran, in both
    assert _comparable(b) == _comparable(a)
    # the rules table printed at the end: the same counts, merged from the workers
    table = re.compile(r"^\s+([A-Z][A-Z0-9-]+)\s+(\d+)$", re.M)
    assert table.findall(par.stdout) == table.findall(serial.stdout) != []


def test_a_mutant_fails_under_two_workers(tmp_path: Path) -> None:
    _needs_xdist()
    proc = _suite(
        tmp_path, MUTANT, "-k", "golden_scenario and kvbm", "-n", "2", "-v", f"--kvspec-results={tmp_path / 'r.json'}"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    failed = re.findall(r"\[(gw\d)\] .*FAILED .*::test_golden_scenario", proc.stdout)
    assert len({w for w in failed}) == 2, failed  # both workers found failures ...
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["status"] == "findings" and results["counts"]["failed"] == len(failed)  # ... and both reported
    assert results["rules"]["REMOVE-EXACT"]["status"] == "fail"


def _how_generated(wd: Path) -> Counter[tuple[str, str]]:
    """(how_generated, status) of every test case Hypothesis observed under
    the working dir (its home: ``wd/hypothesis``); the files are then removed,
    so that the next run's are read alone."""
    seen: Counter[tuple[str, str]] = Counter()
    for f in (wd / "hypothesis" / "observed").glob("*_testcases.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            seen[(str(rec.get("how_generated")), str(rec.get("status")))] += 1
        f.unlink()
    return seen


def _twice_with(tmp_path: Path, db: str) -> tuple[Counter[tuple[str, str]], Counter[tuple[str, str]]]:
    """Run the mutant's lockstep test twice with the example database ``db``
    (the random smoke effort, unseeded: nothing but the database links the
    two runs); Hypothesis's observations of each run."""
    # observations without coverage (the coverage tracer makes a run several times slower)
    env = _env(HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY="1", HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER="1")
    args = ("-k", "test_lockstep and kvbm", "--hypothesis-profile=smoke", f"--kvspec-example-db={db}")
    observed = []
    # unseeded: Hypothesis turns its database off for a seeded test (--hypothesis-seed)
    for _ in range(2):
        proc = _suite(tmp_path, MUTANT, *args, env=env)
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "[REMOVE-EXACT]" in proc.stdout
        assert f"kvspec example database: {db}" in proc.stdout  # the header names the shared database
        observed.append(_how_generated(tmp_path / "wd"))
    return observed[0], observed[1]


#: Hypothesis's name of the final replay of the shrunk failure, before and
#: after it renamed examples to test cases (6.170)
MINIMAL = ("minimal failing example", "minimal failing test case")


def _replayed(first: Counter[tuple[str, str]], second: Counter[tuple[str, str]]) -> None:
    # the first run found the failure itself (an empty database has nothing to reuse) ...
    assert first[("during reuse phase", "failed")] == 0, first
    assert sum(first[(name, "failed")] for name in MINIMAL) == 1, first
    # ... the second read it back from the database before generating anything
    assert second[("during reuse phase", "failed")] >= 1, second
    assert not [k for k in second if k[0].startswith("during generate")], second


def test_a_directory_example_db_replays_a_failure_of_an_earlier_run(tmp_path: Path) -> None:
    db = tmp_path / "shared-db"
    first, second = _twice_with(tmp_path, str(db))
    assert [p for p in db.rglob("*") if p.is_file()], "the failure was not saved in the directory"
    _replayed(first, second)


@contextlib.contextmanager
def _redis_server(folder: Path) -> Iterator[str]:
    """A private redis-server on a free local port, no persistence; stopped on exit."""
    binary = shutil.which("redis-server")
    assert binary is not None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_redis_example_db_replays_a_failure_of_an_earlier_run(tmp_path: Path) -> None:
    pytest.importorskip("redis", reason="the redis package is not installed (pip install 'kvspec[redis]')")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
    import redis

    from kvspec.conformance.run.example_db import REDIS_PREFIX

    with _redis_server(tmp_path) as url:
        first, second = _twice_with(tmp_path, url)
        keys = redis.Redis.from_url(url).keys(REDIS_PREFIX + b"*")
    assert keys, "the failure was not saved in Redis under kvspec's key prefix"
    _replayed(first, second)
