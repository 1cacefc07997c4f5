"""The type gate sees across modules: mypy resolves kvspec's own imports
(import names follow paths), so a wrong call into another module fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    shutil.which("mypy") is None and not (ROOT / ".venv/bin/mypy").exists(),
    reason="mypy is not installed (the dev extra)",
)


#: the two probes, checked by one mypy run (each alone cost a cold mypy run of about 5 s of CPU)
PROBES = {
    "probe_wrong.py": 'from kvspec.spec.wire import make_removed\nx: int = make_removed("str", [1])\n',
    "probe_right.py": "from kvspec.spec.wire import KvEvent, make_removed\nx: KvEvent = make_removed(0, [1])\n",
}


def _mypy(folder: Path) -> str:
    """mypy (the project's configuration) on both probes in ``folder``: its exit status, a newline,
    its output."""
    for name, source in PROBES.items():
        (folder / name).write_text(source)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(folder / "cache"),
            "--follow-imports=silent",
            *(str(folder / name) for name in PROBES),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return f"{out.returncode}\n{out.stdout}{out.stderr}"


@pytest.fixture
def checked(once_per_run: Callable[[str, Callable[[Path], str]], str]) -> tuple[int, str]:
    """The one mypy run over both probes (shared by this module's tests): exit status, output."""
    code, _, out = once_per_run("type-gate", _mypy).partition("\n")
    return int(code), out


def _errors(out: str, probe: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(probe) or f"/{probe}:" in line]


def test_a_wrong_call_into_the_spec_fails_type_checking(checked: tuple[int, str]) -> None:
    code, out = checked
    assert code == 1, out
    assert "import-not-found" not in out
    assert any(":2: error" in line for line in _errors(out, "probe_wrong.py")), out


def test_a_right_call_type_checks(checked: tuple[int, str]) -> None:
    _, out = checked
    assert "import-not-found" not in out
    # the run's exit status is the wrong probe's: the right one has no line of its own, and only
    # one of the two files checked has errors
    assert _errors(out, "probe_right.py") == [], out
    assert "in 1 file (checked 2 source files)" in out, out
