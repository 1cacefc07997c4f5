"""What the suites of the small-operation profiles (paged, session and radix:
conformance/test_managers.py and conformance/test_radix.py) share: the skip
of an adapter that does not declare the profile, the skip of one whose
engine is not installed, the reduced Hypothesis settings of their lockstep
tests, and the recording of the rules a test exercised.

The Hypothesis-decorated functions stay in the test modules: Hypothesis
derives a derandomised run's examples and its example-database key from
the decorated function's source, so one shared function would give every
profile the same draws and the same database entries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

import pytest
from hypothesis import Phase, settings

from kvspec.conformance.requests.api import ImplementationUnavailableError
from kvspec.conformance.run.manifest import Manifest

P = ParamSpec("P")
T = TypeVar("T")


def require_profile(manifest: Manifest, profile: str) -> None:
    """Skip the calling test unless the adapter declares ``profile:PROFILE``."""
    if profile not in manifest.supported_profiles():
        pytest.skip(f"adapter {manifest.name!r} does not declare capability profile:{profile}")


def open_or_skip(opener: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``opener(*args, **kwargs)``, or a skip naming why when the
    implementation is not available here (an engine wheel that is not
    installed)."""
    try:
        return opener(*args, **kwargs)
    except ImplementationUnavailableError as e:
        pytest.skip(str(e))


def cheap_op_settings(current: settings) -> settings:
    """A third of the effort's examples (``kvspec_settings``, at least 20),
    one bug reported, no explain phase: these profiles' operations are cheap
    and collide often (small name and token pools), and every mutant run of
    ``kvspec mutants`` passes through here."""
    return settings(
        current,
        report_multiple_bugs=False,
        max_examples=max(20, current.max_examples // 3),
        phases=[p for p in current.phases if p is not Phase.explain],
    )


def record_rules(record: Callable[[str], None], rules: Iterable[object]) -> None:
    """Record each rule (a RuleId or its id) as exercised by the calling test."""
    for rule in rules:
        record(str(rule))
