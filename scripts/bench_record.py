"""Run one benchmark and keep what it measured as a record the benchmarks page is generated from.

    python scripts/bench_record.py NAME [ARGS...]     # python benchmarks/NAME.py ARGS, recorded

runs ``python benchmarks/NAME.py ARGS`` from the repository root (its output passes through), and
writes ``docs/results/data/benchmarks/NAME.json``: when it ran (UTC), the machine's cores and load
average at start and end (the machine is shared: a figure means little without the load beside it),
the command, wall and CPU time of the run, the commit it ran on, the script's last line
(``NAME: VALUE UNIT``, parsed) and every other line it printed, the figures. Nothing is written when
the benchmark fails or its last line is not ``NAME: VALUE UNIT``: a record only holds a run that
finished. ``python scripts/gen_docs.py`` then renders docs/results/benchmarks.md from the records.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import resource
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RECORDS = ROOT / "docs" / "results" / "data" / "benchmarks"
#: the last line every benchmark prints: ``NAME: VALUE UNIT`` (the unit may be several words)
LAST_LINE = re.compile(r"^(?P<name>[a-z0-9_]+): (?P<value>[^ ]+)(?: (?P<unit>.+))?$")


def _utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


#: paths whose changes do not change what a benchmark measures; tests/ counts only for the benchmarks
#: that run the tests (no other benchmark imports or runs them)
_NOT_MEASURED = (":(exclude)docs", ":(exclude)scripts")
_RUN_TESTS = {"quick_tier"}


def commit_of(root: Path, name: str) -> str:
    """HEAD's id, with ``+dirty`` when the measured code differs from it (tracked files outside docs/
    and scripts/; outside tests/ too unless the benchmark runs the tests)."""
    skip = _NOT_MEASURED if name in _RUN_TESTS else (*_NOT_MEASURED, ":(exclude)tests")
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", ".", *skip], cwd=root, capture_output=True
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def parse_last_line(name: str, line: str) -> tuple[str, str]:
    """(value, unit) of ``NAME: VALUE UNIT``; ValueError naming what is wrong otherwise."""
    m = LAST_LINE.match(line.strip())
    if m is None or m["name"] != name:
        raise ValueError(f"the last line of benchmarks/{name}.py is {line.strip()!r}, not '{name}: VALUE UNIT'")
    return m["value"], m["unit"] or ""


def run_command(argv: list[str], cwd: Path, timeout: float | None = None) -> dict[str, Any]:
    """Run ``argv`` once, its output passing through; what any record keeps of the run: when, how
    long (wall, and CPU of it and its children), the machine and its load, and the lines it printed.
    ``rc`` is its exit code, or None when it ran over ``timeout`` seconds (its process group killed)."""
    started, load_start = _utc(), _load()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    timed_out = threading.Event()

    def _kill() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, _kill) if timeout is not None else None
    if timer is not None:
        timer.start()
    lines: list[str] = []
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line.rstrip())
        rc = proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    while lines and not lines[-1].strip():
        lines.pop()
    return {
        "rc": None if timed_out.is_set() else rc,
        "started": started,
        "ended": _utc(),
        "wall_s": round(wall, 1),
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
        "machine": {
            "cores": os.cpu_count(),
            "load_start": load_start,
            "load_end": _load(),
            "python": platform.python_version(),
            "system": f"{platform.system()} {platform.machine()}",
        },
        "lines": lines,
    }


def run(name: str, args: list[str], root: Path = ROOT, timeout: float | None = None) -> dict[str, Any]:
    """Run the benchmark once and return its record; SystemExit saying why when it did not finish."""
    script = root / "benchmarks" / f"{name}.py"
    if not script.is_file():
        known = ", ".join(sorted(p.stem for p in (root / "benchmarks").glob("*.py")))
        raise SystemExit(f"no benchmark {name!r} (benchmarks/{name}.py); known: {known}")
    ran = run_command([sys.executable, str(script.relative_to(root)), *args], root, timeout)
    lines = ran.pop("lines")
    rc = ran.pop("rc")
    if rc is None:
        raise SystemExit(f"benchmarks/{name}.py ran over {timeout} s; nothing recorded")
    if rc != 0:
        raise SystemExit(f"benchmarks/{name}.py exited with {rc}; nothing recorded")
    if not lines:
        raise SystemExit(f"benchmarks/{name}.py printed nothing; nothing recorded")
    try:
        value, unit = parse_last_line(name, lines[-1])
    except ValueError as e:
        raise SystemExit(f"{e}; nothing recorded") from None
    return {
        "name": name,
        "status": "measured",
        "command": shlex.join(["python", f"benchmarks/{name}.py", *args]),
        **ran,
        "commit": commit_of(root, name),
        "last_line": lines[-1].strip(),
        "value": value,
        "unit": unit,
        "output": lines[:-1],
    }


def write(record: dict[str, Any], records: Path = RECORDS) -> Path:
    records.mkdir(parents=True, exist_ok=True)
    path = records / f"{record['name']}.json"
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("name", help="the benchmark: benchmarks/NAME.py")
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")
    p.add_argument("--timeout", type=float, default=None, help="seconds the run may take (default: no limit)")
    p.add_argument("--records", type=Path, default=RECORDS, help="folder of the records (default %(default)s)")
    a = p.parse_args(argv)
    record = run(a.name, a.args, timeout=a.timeout)
    path = write(record, a.records)
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"wrote {shown}; run python scripts/gen_docs.py to render docs/results/benchmarks.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
