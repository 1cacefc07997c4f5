"""Working files in one place (issue 10): a run with ``--kvspec-dir`` writes
nothing outside it; a named example database is refused by a derandomised effort."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "kvspec.conformance", "-q", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_a_run_with_kvspec_dir_writes_nothing_else(tmp_path: Path) -> None:
    run_dir, wd = tmp_path / "empty", tmp_path / "wd"
    run_dir.mkdir()
    proc = _pytest(
        run_dir,
        f"--impl={ROOT / 'adapters' / 'reference'}",
        "-k",
        "golden_scenario and evict or router_view",
        "--hypothesis-profile=smoke",
        f"--kvspec-dir={wd}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(run_dir.iterdir()) == []
    assert (wd / ".gitignore").is_file()
    assert (wd / "pytest-cache").is_dir() and (wd / "hypothesis").is_dir()


def test_an_example_db_with_a_derandomised_effort_is_a_usage_error(tmp_path: Path) -> None:
    proc = _pytest(tmp_path, "--impl=reference", f"--kvspec-example-db={tmp_path / 'db'}", f"--kvspec-dir={tmp_path}")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "derandomised" in proc.stderr
