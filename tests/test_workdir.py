"""Working files in one place (issue 10): a run with ``--kvspec-dir`` writes
nothing outside it (no file in the folder it started in, the temp dir or
the adapter's folder, C and Rust builds included), nor does ``kvspec
mutants`` (its per-mutant logs are under the working dir's ``mutants/``); a
named example database is refused by a derandomised effort."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvspec"


def _clean_env(tmp: Path) -> dict[str, str]:
    """The environment of a user who set nothing: no build dir, no working
    dir, and a temp dir of its own (to see whether anything lands there)."""
    env = {k: v for k, v in os.environ.items() if k not in ("KVSPEC_BUILD_DIR", "KVSPEC_HOME")}
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST")}
    (tmp / "tmpdir").mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp / "tmpdir")
    return env


def _pytest(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "kvspec.conformance", "-q", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )


def _files(folder: Path) -> set[Path]:
    return {p.relative_to(folder) for p in folder.rglob("*")} if folder.exists() else set()


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


def test_a_c_port_run_builds_into_the_working_dir(tmp_path: Path) -> None:
    """The C ABI adapter's library is built under the working dir's build/,
    not in the folder the run started in (it used to be ./.kvspec/build) nor
    in the temp dir."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the c_port adapter cannot be built")
    run_dir, wd = tmp_path / "empty", tmp_path / "wd"
    run_dir.mkdir()
    proc = _pytest(
        run_dir,
        f"--impl={ROOT / 'adapters' / 'c_port'}",
        "-k",
        "golden_scenario and evict",
        f"--kvspec-dir={wd}",
        env=_clean_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(run_dir.iterdir()) == []
    assert list((tmp_path / "tmpdir").iterdir()) == []
    assert [p for p in (wd / "build").iterdir() if p.suffix == ".so"], list((wd / "build").iterdir())


def test_a_rust_port_builds_into_the_working_dir_not_its_folder(tmp_path: Path) -> None:
    """A subprocess adapter starts in its own folder; its build (rust_launch)
    goes to the session's working dir (the session hands KVSPEC_BUILD_DIR to
    the adapter process), so the port's sources stay untouched."""
    if shutil.which("rustc") is None:
        pytest.skip("rustc is not installed: the Rust ports are built from source")
    port = tmp_path / "paged_rust"
    skip = shutil.ignore_patterns(".kvspec", "__pycache__")
    shutil.copytree(ROOT / "adapters" / "paged_rust", port, ignore=skip)
    shutil.copytree(ROOT / "adapters" / "rust_common", tmp_path / "rust_common", ignore=skip)  # main.rs includes it
    before = _files(port)
    run_dir, wd = tmp_path / "empty", tmp_path / "wd"
    run_dir.mkdir()
    proc = _pytest(run_dir, f"--impl={port}", "-k", "paged_lockstep", f"--kvspec-dir={wd}", env=_clean_env(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _files(port) == before
    assert list(run_dir.iterdir()) == []
    assert [p for p in (wd / "build").iterdir() if p.name.startswith("paged_rust-")], list((wd / "build").iterdir())


def test_kvspec_mutants_keeps_its_logs_in_the_working_dir(tmp_path: Path) -> None:
    """``kvspec mutants`` from an empty folder: each mutant's pytest output,
    JUnit report and replay files under ``<working dir>/mutants/<campaign>/NAME``,
    nothing in the folder it ran in or in the package (the children's
    current directory)."""
    run_dir, wd = tmp_path / "empty", tmp_path / "wd"
    run_dir.mkdir()
    package_before = _files(PACKAGE / ".kvspec")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvspec",
            "mutants",
            "--only",
            "removed_extra_block",
            "--skip-sanity",
            "--jobs",
            "1",
            f"--kvspec-dir={wd}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=run_dir,
        env=_clean_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(run_dir.iterdir()) == []
    assert list((tmp_path / "tmpdir").iterdir()) == []
    assert _files(PACKAGE / ".kvspec") == package_before
    (campaign,) = (wd / "mutants").iterdir()
    logs = campaign / "removed_extra_block"
    assert "failed" in (logs / "pytest.log").read_text()
    assert (logs / "junit.xml").is_file()
    assert str(campaign) in proc.stdout  # the table says where the logs are


def test_each_mutant_run_is_handed_the_campaign_working_dir(tmp_path: Path) -> None:
    """The children run in the package's folder; without ``--kvspec-dir`` their
    Hypothesis files (and builds) would land there."""
    from kvspec.conformance.commands import mutants

    cmd = mutants.pytest_command("m", tmp_path, tmp_path / "j.xml", tmp_path / "r", "ci", None, tmp_path / "wd")
    assert f"--kvspec-dir={tmp_path / 'wd'}" in cmd
    first = mutants.campaign_log_dir(tmp_path, "my port", keep=2)
    assert first.parent == tmp_path / "mutants" and first.name.endswith("-my_port")
    for _ in range(3):
        last = mutants.campaign_log_dir(tmp_path, "my port", keep=2)
    assert len(list((tmp_path / "mutants").iterdir())) == 2 and last.is_dir() and not first.exists()
