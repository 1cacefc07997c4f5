"""The type gate sees across modules: mypy resolves kvspec's own imports
(import names follow paths), so a wrong call into another module fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    shutil.which("mypy") is None and not (ROOT / ".venv/bin/mypy").exists(),
    reason="mypy is not installed (the dev extra)",
)


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--follow-imports=silent",
            str(probe),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_wrong_call_into_the_spec_fails_type_checking(tmp_path: Path) -> None:
    out = _mypy(tmp_path, 'from kvspec.spec.wire import make_removed\nx: int = make_removed("str", [1])\n')
    assert out.returncode == 1, out.stdout + out.stderr
    assert "import-not-found" not in out.stdout
    assert "probe.py:2: error" in out.stdout, out.stdout


def test_a_right_call_type_checks(tmp_path: Path) -> None:
    out = _mypy(tmp_path, "from kvspec.spec.wire import KvEvent, make_removed\nx: KvEvent = make_removed(0, [1])\n")
    assert out.returncode == 0, out.stdout + out.stderr
