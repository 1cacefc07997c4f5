"""conformance/radix/requests.py: a sequential request run checked against the radix model.

The engines this serves (Dynamo's mocker with its SGLang-style backend) are
tested where they run; here the runs come from the radix model itself, so a
faithful run must pass and a run with one bug must fail under its rule.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from kvspec.adapters import rust_mocker
from kvspec.adapters.radix_mutants.bugs import BUGS
from kvspec.conformance.radix.requests import (
    Flow,
    FlowModel,
    check_radix_run,
    check_radix_sequential,
    outputs_from_events,
)
from kvspec.conformance.requests.check import Finding, RunCheck
from kvspec.conformance.requests.interface import STALLED, RequestOutcome
from kvspec.conformance.requests.workloads import Workload, setup_of
from kvspec.conformance.run.manifest import load_manifest
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference.radix import RadixModel, RadixTreeNode
from kvspec.reference.requests import RequestSpec
from kvspec.spec.radix_wire import RadixConfig, RadixRequest
from kvspec.spec.wire import KvEvent


def _run(model: RadixModel, n: int, seed: int) -> tuple[list[list[int]], list[RequestOutcome]]:
    """A run with hidden output tokens (drawn at random, as an engine would generate them)."""
    rnd = random.Random(seed)
    system = [7, 7, 8, 9, 7, 8]
    prompts, outcomes = [], []
    for _ in range(n):
        prompt = system[: rnd.randint(1, 6)] + [rnd.randint(1, 3) for _ in range(rnd.randint(0, 5))]
        output = [rnd.randint(100, 10**6) for _ in range(rnd.randint(1, 5))]
        out = model.step(RadixRequest(prompt=prompt, output=output))
        assert out.value is not None
        prompts.append(prompt)
        outcomes.append(RequestOutcome(cached_tokens=out.value, output_tokens=len(output), events=out.events))
    return prompts, outcomes


@pytest.mark.parametrize("page", [1, 2, 4])
def test_model_run_passes(page: int) -> None:
    config = RadixConfig(page_size=page, capacity=40)
    prompts, outcomes = _run(RadixModel(config), 40, seed=page)
    assert any(o.events and o.events[0].kind == "removed" for o in outcomes), "the run must evict"
    check_radix_sequential(config, prompts, outcomes)


@pytest.mark.parametrize(
    ("bug", "rule"),
    [("evict_newest_first", "RADIX-EVICT-LRU"), ("hit_includes_last_token", "RADIX-PREFIX-HIT")],
)
def test_a_bug_fails_under_its_rule(bug: str, rule: str) -> None:
    config = RadixConfig(page_size=1, capacity=40)
    prompts, outcomes = _run(BUGS[bug](config), 40, seed=7)
    with pytest.raises(ConformanceFailure) as e:
        check_radix_sequential(config, prompts, outcomes)
    assert e.value.rule == rule


def test_outputs_come_from_the_stored_pages() -> None:
    model = RadixModel(RadixConfig(page_size=2, capacity=32))
    out = model.step(RadixRequest(prompt=[1, 2, 3], output=[50, 51, 52, 53]))
    # prompt + output[:-1] = 6 tokens, 3 pages: 50, 51, 52 cached; 53 never computed
    assert outputs_from_events([1, 2, 3], 4, out.events, 2) == [50, 51, 52, 0]


# ------------------------------------------------------------ the whole-run check and its followed departures

SGLANG_VARIANT = load_manifest(Path(rust_mocker.__file__).parent, "sglang")
MOCKER_FLOW = Flow(in_parts=True, last_token=True, leaf_suffix=True, extend_leaf=True)


def _flow_run(
    model: RadixModel, blocks: int, page: int, seed: int, n: int = 14
) -> tuple[Workload, list[RequestOutcome]]:
    """A run of ``model`` shaped as the mocker publishes it (events numbered
    from 1), with outputs drawn at random as an engine generates them."""
    rnd = random.Random(seed)
    system = [7, 7, 8, 9, 7, 8, 9, 9]
    reqs, outcomes = [], []
    ids = itertools.count(1)
    for _ in range(n):
        prompt = system[: rnd.randint(1, 8)] + [rnd.randint(1, 3) for _ in range(rnd.randint(0, 6))]
        output = [rnd.randint(100, 10**6) for _ in range(rnd.randint(1, 6))]
        out = model.step(RadixRequest(prompt=prompt, output=output))
        if out.error is not None:
            continue
        events = [e.model_copy(update={"event_id": next(ids)}) for e in out.events]
        reqs.append(RequestSpec(prompt=prompt, max_tokens=len(output)))
        outcomes.append(RequestOutcome(cached_tokens=None, output_tokens=len(output), events=events))
    return Workload(setup=setup_of(blocks, page), requests=reqs), outcomes


def _undeclared(check: RunCheck) -> list[Finding]:
    return [f for f in check.findings if SGLANG_VARIANT.deviation_for(f.site()) is None]


@pytest.mark.parametrize("page", [1, 2, 4])
def test_the_mockers_flow_is_followed_and_declared(page: int) -> None:
    """A run with the mocker's departures (the checker's own Flow model, numbered
    from 1) passes but for findings the sglang variant's scoped deviations cover."""
    blocks = 40 // page
    w, outcomes = _flow_run(
        FlowModel(RadixConfig(page_size=page, capacity=blocks * page), MOCKER_FLOW), blocks, page, 3
    )
    assert any(e.kind == "removed" for o in outcomes for e in o.events), "the run must evict"
    check = check_radix_run(w, outcomes)
    assert {c for f in check.findings for c in f.conditions} >= {"event_ids_from_1", "request_inserts_in_parts"}
    assert _undeclared(check) == [], [f.report() for f in _undeclared(check)]
    assert sum(check.exercised.values()) > 0


def test_the_spec_model_passes_whole_runs() -> None:
    w, outcomes = _flow_run(RadixModel(RadixConfig(page_size=2, capacity=40)), 20, 2, 5)
    outcomes = [
        o.model_copy(update={"events": [e.model_copy(update={"event_id": e.event_id - 1}) for e in o.events]})
        for o in outcomes
    ]
    assert check_radix_run(w, outcomes).findings == []


class _EvictNewest(FlowModel):
    """The mocker's flow with one bug: the most recently used leaf is evicted."""

    def nodes(self) -> Iterator[RadixTreeNode]:
        return iter(sorted(super().nodes(), key=lambda n: -n.last_access))

    def _evict(self, tokens: int, events: list[KvEvent]) -> int:
        saved = {n: n.last_access for n in super().nodes()}
        for n in saved:
            n.last_access = -n.last_access
        try:
            return super()._evict(tokens, events)
        finally:
            for n, t in saved.items():
                n.last_access = t


def _drop_last_decode_stored(outcomes: list[RequestOutcome]) -> list[RequestOutcome]:
    """The mocker's flow with one bug: the first request with two Stored loses its last one."""
    out, done = [], False
    for o in outcomes:
        stored = [i for i, e in enumerate(o.events) if e.kind == "stored"]
        if not done and len(stored) >= 2:
            o = o.model_copy(update={"events": [e for i, e in enumerate(o.events) if i != stored[-1]]})
            done = True
        out.append(o)
    assert done
    ids = itertools.count(1)  # ids stay contiguous: the bug is the missing page, not a gap
    return [
        o.model_copy(update={"events": [e.model_copy(update={"event_id": next(ids)}) for e in o.events]}) for o in out
    ]


@pytest.mark.parametrize("bug", ["evict_newest", "drop_decode_stored"])
def test_a_bug_in_the_mockers_flow_is_not_hidden_by_its_deviations(bug: str) -> None:
    """Declared, scoped departures do not waive a bug of the same flow: the
    finding falls outside every deviation of the sglang variant."""
    config = RadixConfig(page_size=2, capacity=40)
    if bug == "evict_newest":
        w, outcomes = _flow_run(_EvictNewest(config, MOCKER_FLOW), 20, 2, 3)
    else:
        w, outcomes = _flow_run(FlowModel(config, MOCKER_FLOW), 20, 2, 3)
        outcomes = _drop_last_decode_stored(outcomes)
    bad = _undeclared(check_radix_run(w, outcomes))
    assert bad, f"{bug} was not caught"
    assert bad[0].rule in {"RADIX-EVICT-LRU", "RADIX-REMOVE", "RADIX-INSERT", "PARENT-ANCHOR", "REMOVE-EXACT"}


#: the prompts of findings/sglang/eviction_moment.jsonl (7 pages of 2 tokens); request 4's
#: prompt is wholly cached, its last page a leaf past the match
_LATE_PROMPTS = [[41, 6, 23, 20], [83], [41, 6, 23, 20], [10, 1, 1, 11, 99, 60], [41, 6, 23, 20], [83]]
_LATE_OUTPUTS = [[501, 502, 503, 504], [511, 512, 513], [521, 522, 523], [531, 532, 533], [541, 542, 543, 544], [551]]


def _late_run(flow: Flow) -> tuple[Workload, list[RequestOutcome]]:
    """The eviction_moment workload run by the checker's model with ``flow`` (ids from 1)."""
    model = FlowModel(RadixConfig(page_size=2, capacity=14), flow)
    ids = itertools.count(1)
    outcomes = []
    for prompt, output in zip(_LATE_PROMPTS, _LATE_OUTPUTS, strict=True):
        out = model.step(RadixRequest(prompt=prompt, output=output))
        assert out.error is None
        events = [e.model_copy(update={"event_id": next(ids)}) for e in out.events]
        outcomes.append(RequestOutcome(cached_tokens=None, output_tokens=len(output), events=events))
    reqs = [RequestSpec(prompt=p, max_tokens=len(o)) for p, o in zip(_LATE_PROMPTS, _LATE_OUTPUTS, strict=True)]
    return Workload(setup=setup_of(7, 2), requests=reqs), outcomes


def test_a_prompt_cached_after_the_first_decode_page_is_followed_and_declared() -> None:
    """The mocker's late prompt insert (its first decode page evicts the prompt's own
    cached last page, unannounced) is followed under its condition, and nothing else is found."""
    flow = replace(MOCKER_FLOW, late_prompt=True, extend_leaf=False)
    w, outcomes = _late_run(flow)
    plain = _late_run(replace(flow, late_prompt=False))[1]
    assert [e.kind for e in outcomes[4].events] != [e.kind for e in plain[4].events], "request 4 must differ"
    check = check_radix_run(w, outcomes)
    assert "prompt_cached_after_first_decode_page" in {c for f in check.findings for c in f.conditions}
    assert _undeclared(check) == [], [f.report() for f in _undeclared(check)]


def test_an_eviction_published_elsewhere_is_not_waived() -> None:
    """A hand-written bug in that area: request 3 (no prompt page cached) publishes its
    first decode page's eviction, same page, after that page's Stored instead of before
    it: the pages and their order are the model's (the scope this condition replaced,
    eviction_elsewhere_in_request, waived that), but nothing of the prompt is cached past
    its match, so the late prompt insert cannot explain it: found, outside every deviation."""
    w, outcomes = _late_run(replace(MOCKER_FLOW, extend_leaf=False))
    ev = outcomes[3].events
    kinds = [e.kind for e in ev]
    assert kinds[:4] == ["removed", "stored", "removed", "stored"], [e.brief() for e in ev]
    swapped = [
        *ev[:2],
        ev[3].model_copy(update={"event_id": ev[2].event_id}),
        ev[2].model_copy(update={"event_id": ev[3].event_id}),
        *ev[4:],
    ]
    outcomes[3] = outcomes[3].model_copy(update={"events": swapped})
    bad = _undeclared(check_radix_run(w, outcomes))
    assert bad, "the moved eviction was waived"
    assert bad[0].rule in {"RADIX-EVICT-LRU", "RADIX-INSERT"} and bad[0].request == 3, bad[0].report()


@pytest.mark.parametrize(("max_tokens", "declared"), [(9, True), (3, False)])
def test_a_stall_is_declared_only_where_the_admission_bound_refuses(max_tokens: int, declared: bool) -> None:
    """RADIX-CAPACITY's scope in a sequential run: a 6-token prompt on a fresh pool of
    14 slots in pages of 2 with max_tokens 9 (6 + 9 >= 14: the mocker's prefill
    admission never lets it in, the model runs it in 14 slots) stalls under the
    declared deviation; the same request with max_tokens 3 stalling is a bug, found
    outside every deviation."""
    w = Workload(setup=setup_of(7, 2), requests=[RequestSpec(prompt=[5, 6, 7, 8, 9, 10], max_tokens=max_tokens)])
    stalled = [RequestOutcome(cached_tokens=None, output_tokens=0, events=[], finish=STALLED)]
    check = check_radix_run(w, stalled)
    capacity = [f for f in check.findings if f.rule == "RADIX-CAPACITY"]
    assert capacity and "request_stalled" in capacity[0].conditions
    assert ("prefill_admission_refused" in capacity[0].conditions) is declared
    assert (_undeclared(check) == []) is declared, [f.report() for f in _undeclared(check)]
