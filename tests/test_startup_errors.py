"""A conformance run that cannot work ends at once, with one message (issue 10).

Each case runs ``pytest conformance --impl=...`` in a child process, the way
a port author would, and checks the exit status (pytest's usage error, 4,
for anything that stops the run before a test ran), the time the whole run
took, how much it printed, and that the message says what to do.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BROKEN = Path(__file__).parent / "broken_adapters"


def _run(*args: str, timeout: float = 120) -> tuple[int, str, float]:
    t = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t


def test_a_missing_binary_is_one_short_message_with_a_hint() -> None:
    code, out, _ = _run(f"--impl={BROKEN / 'not_found'}")
    assert code == 4, out
    assert "did not start" in out and "did you build it?" in out
    assert out.count("no-such-adapter-binary: [Errno 2]") <= 1
    assert len(out.splitlines()) < 30, out
    assert "Traceback" not in out


def test_a_handshake_that_never_comes_ends_the_run_once() -> None:
    code, out, seconds = _run(f"--impl={BROKEN / 'slow_handshake'}")
    assert code == 4, out
    assert "did not complete its handshake" in out
    assert seconds < 60
    assert len(out.splitlines()) < 30, out


def test_an_adapter_that_stops_answering_stops_the_run() -> None:
    """The handshake works, the first operation never gets a reply: one
    failure, then the run stops (not one timeout per test)."""
    code, out, seconds = _run(f"--impl={BROKEN / 'hang_first_op'}")
    assert code == 2, out  # pytest's "interrupted"
    assert "the run stops here" in out
    assert "1 failed" in out, out
    assert seconds < 60


def test_a_manifest_error_is_reported_once(tmp_path: Path) -> None:
    (tmp_path / "manifest.toml").write_text('name = "x"\nkind = "subprocess"\nprofile = "kvbm"\n[start]\n')
    code, out, _ = _run(f"--impl={tmp_path}")
    assert code == 4, out
    assert out.count("needs start.command") == 1, out
    assert "Falsifying example" not in out
    assert len(out.splitlines()) < 30, out


@pytest.mark.parametrize("profile", ["bogus", "Thorough"])
def test_an_unknown_effort_lists_the_efforts(profile: str) -> None:
    code, out, _ = _run("--impl=adapters/reference", f"--hypothesis-profile={profile}")
    assert code == 4, out
    assert "smoke, default, ci, thorough" in out and "INTERNALERROR" not in out
