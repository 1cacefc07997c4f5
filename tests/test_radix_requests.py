"""conformance/radix_requests.py: a sequential request run checked against the radix model.

The engines this serves (Dynamo's mocker with its SGLang-style backend) are
tested where they run; here the runs come from the radix model itself, so a
faithful run must pass and a run with one bug must fail under its rule.
"""

from __future__ import annotations

import random

import pytest

from kvspec.adapters.radix_mutants.bugs import BUGS
from kvspec.conformance.failures import ConformanceFailure
from kvspec.conformance.radix_requests import check_radix_sequential, outputs_from_events
from kvspec.conformance.request_interface import RequestOutcome
from kvspec.reference.radix import RadixModel
from kvspec.spec.radix_wire import RadixConfig, RadixRequest


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
