"""Request-level replay files replay against the implementation that failed
(issue 27 item 5).

A request-level finding used to be written as a bare workload: ``kvspec
replay FILE`` then ran the bundled ``reference_requests`` and printed
"conforms", exit 0, for a port's real failure and for a mutant's. Now the
file records the run (adapter folder, variant, effort, versions), the failure
prints a ``run again with:`` line, and the replay without ``--impl`` fails
as the run did. A workload that records nothing is refused (exit 2) unless
``--impl`` is given.

The port is a folder outside the tree whose server is the reference
JSON-lines server with a real request-level bug (``--mutant
prefix_hit_uncapped``: a block-aligned prompt hits all its cached blocks);
the mutant is the same bug as a variant of the bundled mutants adapter. Each
runs the request-level layer in a child pytest at the smoke effort with a
pinned seed.
"""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from kvspec.conformance.requests.workloads import Workload, load_workload, setup_of
from kvspec.reference.requests import RequestSpec

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "kvspec" / "conformance"
RULE = "VLLM-PREFIX-HIT"

PORT_MANIFEST = """
name = "my_request_port"
kind = "subprocess"
profile = "vllm"
[start]
command = ["{python}", "-m", "kvspec.adapters.reference_jsonl.server", "--mutant", "prefix_hit_uncapped"]
startup_timeout_s = 60.0
[capabilities]
block_level = false
request_level = true
profiles = ["vllm"]
policies = ["lru"]
"""


def _fail_and_replay(
    impl: Path,
    child_pytest: Callable[..., tuple[int, str]],
    child_kvspec: Callable[[list[str], Path], tuple[int, str]],
    elsewhere: Path,
) -> tuple[Path, dict[str, object], str]:
    """Run the request layer's rule test on ``impl`` (it fails), then replay
    its file without --impl from another folder; returns (file, its header's
    run, the replay's output)."""
    code, out = child_pytest(
        str(SUITE / "test_requests.py"),
        f"--impl={impl}",
        "-k",
        f"test_request_level_rule and {RULE}",
        "--hypothesis-profile=smoke",
        "--hypothesis-seed=1",
        "-q",
    )
    assert code == 1, out[-3000:]
    files = re.findall(r"replay file: (\S+)", out)
    hints = re.findall(r"run again with: (kvspec replay .+)", out)
    assert files and hints, out[-3000:]
    path = Path(files[0])
    assert shlex.split(hints[0])[2] == str(path)
    header = json.loads(path.read_text().splitlines()[0])
    assert header["version"] == 2 and isinstance(header["run"], dict)

    code, replayed = child_kvspec(["kvspec", "replay", str(path)], elsewhere)
    assert code == 1, replayed
    assert "conforms" not in replayed
    assert f"[{RULE}] (NOT DECLARED" in replayed and "replay FAILED" in replayed
    # the pasted hint does the same
    code, hinted = child_kvspec(shlex.split(hints[0]), elsewhere)
    assert code == 1 and f"[{RULE}]" in hinted, hinted
    return path, header["run"], replayed


def test_a_ports_request_level_failure_replays_against_the_port(
    tmp_path: Path,
    child_pytest: Callable[..., tuple[int, str]],
    child_kvspec: Callable[[list[str], Path], tuple[int, str]],
) -> None:
    port = tmp_path / "my_request_port"
    port.mkdir()
    (port / "manifest.toml").write_text(textwrap.dedent(PORT_MANIFEST))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path, run, out = _fail_and_replay(port, child_pytest, child_kvspec, elsewhere)
    assert run["adapter_path"] == str(port.resolve()) and run["variant"] is None
    assert run["effort"] == "smoke" and run["hypothesis_seed"] == "1" and run["rule"] == RULE
    versions = run["versions"]
    assert isinstance(versions, dict) and set(versions) >= {"kvspec", "spec_digest", "hypothesis", "python"}
    assert f"against {port.resolve()}" in out and "recorded versions: kvspec " in out

    # the port is gone: a clear error, not a run against something else
    port.rename(tmp_path / "moved")
    code, gone = child_kvspec(["kvspec", "replay", str(path)], elsewhere)
    assert code == 2 and "moved or deleted" in gone and "Traceback" not in gone, gone


def test_a_mutants_request_level_failure_replays_against_the_mutant(
    tmp_path: Path,
    child_pytest: Callable[..., tuple[int, str]],
    child_kvspec: Callable[[list[str], Path], tuple[int, str]],
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _, run, out = _fail_and_replay(
        ROOT / "adapters" / "mutants" / "prefix_hit_uncapped", child_pytest, child_kvspec, elsewhere
    )
    assert run["adapter_path"] == str((ROOT / "adapters" / "mutants").resolve())
    assert run["variant"] == "prefix_hit_uncapped"
    assert "variant prefix_hit_uncapped" in out


def test_a_workload_that_records_no_run_needs_impl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.cli import main

    w = Workload(setup=setup_of(6, 4), requests=[RequestSpec(prompt=list(range(1, 9)), max_tokens=1)] * 2)
    path = tmp_path / "w.jsonl"
    path.write_text(w.to_jsonl())
    assert json.loads(path.read_text().splitlines()[0])["version"] == 1
    assert main(["replay", str(path)]) == 2
    out = capsys.readouterr().out
    assert "does not record the adapter folder" in out and "--impl=ADAPTER" in out
    assert "conforms" not in out
    # a run that records an implementation but no versions is refused too
    recorded = w.model_copy(update={"run": {"adapter_path": str(ROOT / "adapters" / "reference_jsonl")}})
    path.write_text(recorded.to_jsonl())
    assert load_workload(path).run is not None
    assert main(["replay", str(path)]) == 2
    out = capsys.readouterr().out
    assert "does not record the kvspec, Hypothesis and Python versions" in out
    assert f"--impl={ROOT / 'adapters' / 'reference_jsonl'}" in out
    # with --impl it runs
    assert main(["replay", str(path), "--impl", "adapters/reference_jsonl"]) == 0
    assert "conforms" in capsys.readouterr().out
