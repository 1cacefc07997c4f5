"""A declared ``request_stalled`` is followed: the requests after the stall are checked.

An engine that keeps a request it never finishes (the Dynamo mocker's SGLang
backend refusing its prefill admission) runs nothing after it in that
session: the adapter reports the requests after it stalled, unsent. Before,
the run's check ended at the stall and those requests were never checked.
Now ``replay.run_workload`` runs them as a workload of their own on a fresh
engine when the manifest declares the stall, and checks it.

The engine here is the reference request driver, wrapped: a prompt starting
with ``STALL`` stalls (it and every request after it come back stalled,
unsent, as the mocker's worker reports them) and, in the ``buggy`` adapter,
a prompt starting with ``BUG`` reports one block more cached than it hit.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvspec.conformance.requests.replay import run_workload, unsent_after
from kvspec.conformance.requests.workloads import Workload, setup_of
from kvspec.conformance.run.manifest import load_manifest
from kvspec.reference.requests import RequestSpec
from kvspec.spec.rules import RuleId

STALL, BUG = 7_000_001, 7_000_002

ADAPTER = f"""
from kvspec.adapters.reference_requests.adapter import ReferenceRequests
from kvspec.conformance.requests.interface import STALLED, RequestOutcome


class Stalling(ReferenceRequests):
    def run_sequential(self, requests):
        stop = next((i for i, r in enumerate(requests) if r.prompt[0] == {STALL}), len(requests))
        out = super().run_sequential(requests[:stop]) if stop else []
        bs = self.setup.manager.block_size
        out = [
            o.model_copy(update={{"cached_tokens": (o.cached_tokens or 0) + bs}})
            if r.prompt[0] == {BUG} and self.manifest.name == "buggy"
            else o
            for o, r in zip(out, requests)
        ]
        return out + [RequestOutcome(finish=STALLED) for _ in requests[stop:]]


def open_stalling(setup, manifest, adapter_dir):
    return Stalling(setup, manifest)
"""

MANIFEST = """
name = "{name}"
kind = "request"
profile = "vllm"
[start]
python = "stall_follow_adapter:open_stalling"
[capabilities]
block_level = false
request_level = true
partial_blocks = false
promote = false
typed_errors = false
policies = ["lru"]
{deviation}
"""

DECLARED = """
[[deviations]]
rule = "USE-CAPACITY"
scope = { conditions = ["request_stalled"] }
reason = "a request the engine cannot admit is kept for good (test)"
"""


@pytest.fixture
def adapters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "stall_follow_adapter.py").write_text(ADAPTER)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, deviation in [("clean", DECLARED), ("buggy", DECLARED), ("undeclared", "")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.toml").write_text(textwrap.dedent(MANIFEST.format(name=name, deviation=deviation)))
    yield tmp_path


def _workload() -> Workload:
    shared = list(range(1, 9))
    reqs = [
        RequestSpec(prompt=[100, *shared], max_tokens=2),
        RequestSpec(prompt=[STALL, *range(200, 207)], max_tokens=2),
        RequestSpec(prompt=[BUG, *shared], max_tokens=2),
        RequestSpec(prompt=[BUG, *shared], max_tokens=2),
    ]
    return Workload(setup=setup_of(8, 4), requests=reqs)


def _run(adapters: Path, name: str) -> tuple[set[tuple[RuleId, frozenset[str]]], int, int]:
    folder = adapters / name
    checked = run_workload(load_manifest(folder), folder, _workload())
    found = {(f.rule, f.conditions) for f in checked.findings}
    return found, checked.exercised[RuleId.VLLM_PREFIX_HIT], checked.followed_stalls


STALLED_FINDING = (RuleId.USE_CAPACITY, frozenset({"request_stalled"}))


def test_a_declared_stall_is_followed_and_the_requests_after_it_are_checked(adapters: Path) -> None:
    found, prefix_hits, followed = _run(adapters, "clean")
    assert found == {STALLED_FINDING}
    # request 0 before the stall, requests 2 and 3 after it (on the fresh engine)
    assert (prefix_hits, followed) == (3, 1)


def test_a_bug_after_a_declared_stall_is_found(adapters: Path) -> None:
    found, _, followed = _run(adapters, "buggy")
    assert followed == 1
    assert STALLED_FINDING in found and (RuleId.VLLM_PREFIX_HIT, frozenset()) in found


def test_an_undeclared_stall_is_not_followed(adapters: Path) -> None:
    found, prefix_hits, followed = _run(adapters, "undeclared")
    assert found == {STALLED_FINDING} and (prefix_hits, followed) == (1, 0)


def test_unsent_after_needs_every_later_request_unsent() -> None:
    from kvspec.conformance.requests.interface import STALLED, RequestOutcome

    stalled, ran = RequestOutcome(finish=STALLED), RequestOutcome(finish="length", output_tokens=1)
    assert unsent_after([ran, stalled, stalled], 1)
    assert not unsent_after([ran, stalled, ran], 1)
    assert not unsent_after([ran, stalled], 1)
    assert not unsent_after([ran, ran, stalled], 1)
