"""Fixtures shared by the end-to-end tests that run the suite as a port
author would: an adapter written outside the tree (the reference, except
that it never publishes a Removed, so every run has a failure to show) and
child processes of pytest and of the ``kvspec`` command that import it.

They are fixtures rather than an imported module because the tests are
collected with ``--import-mode=importlib`` and no package: a test module
cannot import a sibling, but every test sees this file's fixtures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

#: the module the adapter's manifest starts (``drops_removed_adapter:open_drops_removed``)
DROPS_REMOVED_MODULE = """
from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.spec.wire import StepOutcome


class DropsRemoved(ReferenceImplementation):
    def step(self, op):
        out = super().step(op)
        kept = [e for e in out.events if e.kind != "removed"]
        return StepOutcome.model_construct(**{**out.__dict__, "events": kept})


def open_drops_removed(config, manifest, adapter_dir):
    return DropsRemoved(config, manifest)
"""


def child_env(tmp: Path) -> dict[str, str]:
    """The environment of a child run: this run's own PYTEST_* variables
    removed (they would make the child believe it is a worker of this run)
    and ``tmp`` first on the import path, where the adapter's module is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(tmp) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(argv: list[str], cwd: Path, tmp: Path, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    full_env = {**child_env(tmp), **(env or {})}
    proc = subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def drops_removed_adapter(tmp_path: Path) -> Callable[[str], Path]:
    """Write the adapter to ``tmp_path/NAME`` (a kvbm-profile manifest with the
    lineage and lru policies) and its module next to it; return the folder."""

    def make(name: str) -> Path:
        (tmp_path / "drops_removed_adapter.py").write_text(DROPS_REMOVED_MODULE)
        folder = tmp_path / name
        folder.mkdir()
        (folder / "manifest.toml").write_text(
            textwrap.dedent(
                f"""
                name = "{name}"
                kind = "python"
                profile = "kvbm"
                [start]
                python = "drops_removed_adapter:open_drops_removed"
                [capabilities]
                profiles = ["kvbm"]
                policies = ["lineage", "lru"]
                """
            )
        )
        return folder

    return make


@pytest.fixture
def child_pytest(tmp_path: Path) -> Callable[..., tuple[int, str]]:
    """Run pytest in a child process from ``tmp_path`` with the given
    arguments and no cache; return its exit code and its output (stdout then
    stderr). The replay files go under ``tmp_path/replays`` unless
    ``replay_dir=False`` (then where the working dir says); ``env`` adds to
    the child's environment."""

    def run(*args: str, replay_dir: bool = True, env: dict[str, str] | None = None) -> tuple[int, str]:
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
        if replay_dir:
            argv.append(f"--kvspec-replay-dir={tmp_path / 'replays'}")
        return _run([*argv, *args], tmp_path, tmp_path, 300, env)

    return run


@pytest.fixture
def child_kvspec(tmp_path: Path) -> Callable[[list[str], Path], tuple[int, str]]:
    """Run a ``kvspec ...`` command line (as printed by a hint) in a child
    process from ``cwd``; return its exit code and its output."""

    def run(cmd: list[str], cwd: Path) -> tuple[int, str]:
        assert cmd[0] == "kvspec", cmd
        return _run([sys.executable, "-m", "kvspec", *cmd[1:]], cwd, tmp_path, 120)

    return run
