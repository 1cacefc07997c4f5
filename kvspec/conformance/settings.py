"""Hypothesis settings profiles of the suite.

- ``default``: quick, for a developer's loop;
- ``smoke``: a few examples per test, no database (a quick gate in an engine's CI);
- ``ci``: what CI and ``kvspec mutants`` run (enough to kill every mutant);
- ``thorough``: a long run before a release or after a port change.

Pick one with ``--hypothesis-profile=NAME`` (Hypothesis's own option).
The database lives in ``.kvspec/hypothesis`` so failures replay first next time.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
_registered = False


def register_hypothesis_profiles() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    db = DirectoryBasedExampleDatabase(".kvspec/hypothesis")
    settings.register_profile(
        "default", max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=_SUPPRESS, database=db
    )
    settings.register_profile(
        "ci",
        max_examples=150,
        stateful_step_count=50,
        deadline=None,
        suppress_health_check=_SUPPRESS,
        database=None,
        derandomize=False,
        print_blob=True,
    )
    # a quick gate (the CI recipe's smallest effort): few examples, no
    # database, so that a pinned --hypothesis-seed repeats the run exactly
    settings.register_profile(
        "smoke",
        max_examples=12,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=_SUPPRESS,
        database=None,
    )
    settings.register_profile(
        "thorough",
        max_examples=3000,
        stateful_step_count=120,
        deadline=None,
        suppress_health_check=_SUPPRESS,
        database=db,
    )
    settings.load_profile("default")
