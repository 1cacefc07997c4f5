"""The benchmarks page is generated from records, and a record keeps what a run printed and when.

``scripts/bench_record.py`` runs a benchmark and writes its record; ``scripts/bench_page.py`` renders
docs/results/benchmarks.md from the records (``tests/test_docs.py`` holds the committed page to the
generator). Here: a record of a stand-in benchmark holds its output, last line, load and cores; a run
that fails or ends on the wrong line records nothing; the page marks each row measured, carried
over or not recorded; and the committed page shows each committed record's own figure, read from
the JSON files rather than from the renderer.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

#: ``script(NAME)``: scripts/NAME.py as a module (the ``script`` fixture of conftest.py)
LoadScript = Callable[[str], ModuleType]
ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "results" / "data" / "benchmarks"
PAGE = ROOT / "docs" / "results" / "benchmarks.md"


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """A repository root holding one benchmark that prints two figures and its last line."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "fake.py").write_text(
        '"""Widgets per second of a stand-in."""\n'
        "import sys\n"
        "print('lineage: 12 widgets')\n"
        "print('lru: 34 widgets')\n"
        "print('fake: ' + (sys.argv[1] if len(sys.argv) > 1 else '3.5') + ' widgets/s')\n"
    )
    return tmp_path


def test_a_record_keeps_the_output_the_load_and_the_command(fake_root: Path, script: LoadScript) -> None:
    rec = script("bench_record").run("fake", ["7.25"], root=fake_root)
    assert rec["status"] == "measured"
    assert rec["command"] == "python benchmarks/fake.py 7.25"
    assert (rec["last_line"], rec["value"], rec["unit"]) == ("fake: 7.25 widgets/s", "7.25", "widgets/s")
    assert rec["output"] == ["lineage: 12 widgets", "lru: 34 widgets"]
    assert rec["machine"]["cores"] == os.cpu_count()
    for key in ("load_start", "load_end"):
        assert len(rec["machine"][key]) == 3 and all(x >= 0 for x in rec["machine"][key])
    assert rec["started"] <= rec["ended"] and rec["started"].endswith("Z")
    assert rec["wall_s"] >= 0 and rec["cpu_s"] >= 0
    assert rec["commit"] == "unknown"  # the stand-in root is no git checkout


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("print('fake: 1 s')\nraise SystemExit(3)\n", "exited with 3"),
        ("print('other: 1 s')\n", "not 'fake: VALUE UNIT'"),
        ("print('fake: 1 s')\nprint('done')\n", "not 'fake: VALUE UNIT'"),
        ("pass\n", "printed nothing"),
    ],
)
def test_a_run_that_did_not_finish_gives_no_record(fake_root: Path, body: str, why: str, script: LoadScript) -> None:
    (fake_root / "benchmarks" / "fake.py").write_text(body)
    with pytest.raises(SystemExit, match=why):
        script("bench_record").run("fake", [], root=fake_root)


def _alive(pid: int) -> bool:
    """The process exists and is no zombie (one killed but not yet reaped by init)."""
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:4]
    except FileNotFoundError:
        return False


@pytest.mark.timeout(120)  # a run that waits for the sleepers instead of killing them hangs here for 10 minutes
def test_a_run_over_its_time_is_killed_and_gives_no_record(fake_root: Path, script: LoadScript) -> None:
    """The benchmark and what it started are killed at the limit, not waited for."""
    pid_file = fake_root / "grandchild.pid"
    (fake_root / "benchmarks" / "fake.py").write_text(
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(SystemExit, match=r"ran over 1\.0 s; nothing recorded"):
        script("bench_record").run("fake", [], root=fake_root, timeout=1.0)
    pid = int(pid_file.read_text())
    for _ in range(300):  # SIGKILL is delivered at once but a loaded machine takes a while to end the process
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid)


def test_an_unknown_benchmark_is_named(fake_root: Path, script: LoadScript) -> None:
    with pytest.raises(SystemExit, match=r"no benchmark 'nope'.*known: fake"):
        script("bench_record").run("nope", [], root=fake_root)


def _carried(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "status": "carried over",
        "command": f"python benchmarks/{name}.py",
        "measured": "2026-11-22",
        "load": "1.5 on 2 cores",
        "summary": "99 old widgets/s",
        "figures": ["99 old widgets/s, typed by hand"],
        "not_rerun_because": "it takes an hour",
    }


def test_the_page_says_which_figures_were_measured_and_which_carried_over(fake_root: Path, script: LoadScript) -> None:
    for name in ("old", "never"):
        (fake_root / "benchmarks" / f"{name}.py").write_text(f'"""The {name} benchmark."""\n')
    records = fake_root / "records"
    rec = script("bench_record")
    rec.write(rec.run("fake", [], root=fake_root), records)
    (records / "old.json").write_text(json.dumps(_carried("old")))
    page = script("bench_page").render(records, fake_root / "benchmarks", "HEADER")
    rows = {line.split("`")[1]: line for line in page.splitlines() if line.startswith("| [`")}
    assert "3.5 widgets/s" in rows["fake"] and rows["fake"].endswith("| measured |")
    assert "99 old widgets/s" in rows["old"] and rows["old"].endswith("| **carried over** |")
    assert "2026-11-22" in rows["old"] and "1.5 on 2 cores" in rows["old"]
    assert rows["never"].endswith("| not recorded |")
    assert "1 measured by `scripts/bench_record.py`, 1 carried over, 1 not recorded." in page
    assert "| not measured again because | it takes an hour |" in page
    assert "lineage: 12 widgets\nlru: 34 widgets\nfake: 3.5 widgets/s\n```" in page
    assert "Widgets per second of a stand-in." in page


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"status": "guessed"}, "status must be one of"),
        ({"summary": None}, "needs summary"),
        ({"name": "other"}, "its name is 'other', not 'old'"),
    ],
)
def test_a_malformed_record_is_named(tmp_path: Path, change: dict[str, Any], why: str, script: LoadScript) -> None:
    bad = {k: v for k, v in {**_carried("old"), **change}.items() if v is not None}
    (tmp_path / "old.json").write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match=why):
        script("bench_page").load_records(tmp_path)


def test_the_committed_page_shows_each_records_own_figure() -> None:
    page = PAGE.read_text()
    assert page.startswith("<!-- generated by scripts/gen_docs.py")
    rows = {line.split("`")[1]: line for line in page.splitlines() if line.startswith("| [`")}
    records = sorted(RECORDS.glob("*.json"))
    assert records
    for path in records:
        rec = json.loads(path.read_text())
        row = rows[path.stem]
        if rec["status"] == "measured":
            assert f"| {rec['value']} {rec['unit']} |" in row and row.endswith("| measured |")
            assert rec["last_line"].startswith(f"{path.stem}: ")
        else:
            assert rec["status"] == "carried over" and row.endswith("| **carried over** |")
            assert f"| {rec['summary']} | {rec['measured']} |" in row
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        assert script.stem in rows, f"benchmarks/{script.name} has no row"
