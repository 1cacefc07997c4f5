"""A bug stopped by a crash: the verdict says so, with the operations and a replay.

Block level (``tests/test_machine.py``): a crash at an operation names the
rule that decides the operation. Request level: an engine that dies during a
run is reported plainly as crashed, with the workload it crashed on and a
replay file of it (a request-level run cannot tell which rule's
precondition the engine's own assert guards); an engine that cannot
schedule a request reports it finishing 'stalled', which USE-CAPACITY
judges.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

SUITE = Path(__file__).resolve().parents[1] / "kvspec" / "conformance"

CRASHING = """
from kvspec.adapters.reference_requests.adapter import ReferenceRequests
from kvspec.spec.errors import AdapterError


class DiesOnSecondRequest(ReferenceRequests):
    def run_sequential(self, requests):
        if len(requests) > 1:
            raise AdapterError("engine worker exited: AssertionError: ref_cnt > 0", exit_status=1)
        return super().run_sequential(requests)

    def run_concurrent(self, requests):
        raise AdapterError("engine worker exited: AssertionError: ref_cnt > 0", exit_status=1)


def open_crashing(setup, manifest, adapter_dir):
    return DiesOnSecondRequest(setup, manifest)
"""

MANIFEST = """
name = "crashing"
kind = "request"
profile = "vllm"
[start]
python = "crashing_adapter:open_crashing"
[capabilities]
block_level = false
request_level = true
partial_blocks = false
promote = false
typed_errors = false
policies = ["lru"]
"""


def test_a_request_level_crash_is_reported_plainly_with_the_workload_and_a_replay(
    tmp_path: Path, child_pytest: Callable[..., tuple[int, str]]
) -> None:
    (tmp_path / "crashing_adapter.py").write_text(CRASHING)
    folder = tmp_path / "crashing"
    folder.mkdir()
    (folder / "manifest.toml").write_text(textwrap.dedent(MANIFEST))
    code, out = child_pytest(str(SUITE / "test_requests.py"), f"--impl={folder}", "-x")
    assert code == 1, out[-4000:]
    assert "the implementation crashed during a request-level run" in out
    assert "ref_cnt > 0" in out and "the workload it crashed on:" in out
    replay = next(line for line in out.splitlines() if line.startswith("replay file: "))
    path = Path(replay.removeprefix("replay file: ").strip())
    assert path.exists() and "the implementation crashed" in path.read_text()
