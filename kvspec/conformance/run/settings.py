"""The search effort of the suite's Hypothesis tests.

- ``default``: what ``make conformance`` runs; enough to kill every mutant of
  ``adapters/mutants`` (``kvspec mutants``), derandomised;
- ``smoke``: a few examples per test, no database (a quick gate in an
  engine's CI; random unless ``--hypothesis-seed`` pins it);
- ``ci``: what CI runs; the same effort as ``default`` (a verdict a port
  author gets locally is the one CI gets);
- ``thorough``: a long run before a release or after a port change; random
  unless ``--hypothesis-seed`` is given, with an example database (the
  working dir's ``hypothesis/examples``, ``workdir.py``, or the shared one
  ``--kvspec-example-db`` names, ``example_db.py``) so that a failure
  replays first next time, on this machine or on any machine sharing it.

``default`` and ``ci`` are derandomised (each test's examples are fixed by
the test itself) and keep no database: the same implementation gets the
same verdict on every run, and "unexpected pass" (a declared deviation not
observed) can be judged. Pick one with ``--hypothesis-profile=NAME``.
An example database therefore only ever applies to the random efforts
(``thorough``, and ``smoke`` when one is named explicitly): ``effort``
takes the database the plugin chose (``example_db.database_for``) and
drops it for a derandomised effort.

The efforts are settings *objects* that the conformance tests apply
explicitly (``effort``); nothing here registers or loads a profile with
Hypothesis globally, so a project that has kvspec installed keeps
Hypothesis's own defaults in its own tests. The plugin registers a kvspec
effort as a Hypothesis profile only when the command line asks for it by a
name Hypothesis does not know (``smoke``, ``thorough``), so that
Hypothesis's own option parsing accepts it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis.database import ExampleDatabase

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

#: the effort names, in increasing cost
EFFORTS = ("smoke", "default", "ci", "thorough")

_BASE: dict[str, dict[str, object]] = {
    "smoke": {"max_examples": 12, "stateful_step_count": 25, "derandomize": False, "database": False},
    "default": {"max_examples": 60, "stateful_step_count": 40, "derandomize": True},
    "ci": {"max_examples": 60, "stateful_step_count": 40, "derandomize": True},
    "thorough": {"max_examples": 3000, "stateful_step_count": 120, "derandomize": False},
}


def effort(name: str = "default", *, seeded: bool = False, database: ExampleDatabase | None = None) -> settings:
    """The settings of effort ``name`` (``seeded``: ``--hypothesis-seed`` was
    given, so a random effort is reproducible too; ``database``: the example
    database to use, ignored by a derandomised effort, which keeps none)."""
    if name not in _BASE:
        raise ValueError(f"unknown effort {name!r}; the efforts are {', '.join(EFFORTS)}")
    base = dict(_BASE[name])
    random = not base["derandomize"]
    return settings(
        max_examples=int(str(base["max_examples"])),
        stateful_step_count=int(str(base["stateful_step_count"])),
        derandomize=bool(base["derandomize"]),
        database=database if random else None,
        deadline=None,
        suppress_health_check=_SUPPRESS,
        print_blob=True,
    )


def keeps_database(name: str, *, seeded: bool = False) -> bool:
    """Does effort ``name`` keep an example database when none is named
    explicitly? (random, not pinned by a seed, and not ``smoke``)"""
    base = _BASE.get(name, _BASE["default"])
    return not base["derandomize"] and not seeded and bool(base.get("database", True))


def is_deterministic(name: str, *, seeded: bool = False) -> bool:
    """Does effort ``name`` give the same examples on every run?"""
    return bool(_BASE.get(name, _BASE["default"])["derandomize"]) or seeded


def effort_name(profile_option: str | None) -> str:
    """The effort a ``--hypothesis-profile`` value selects (a profile name that
    is not an effort, or none, selects ``default``)."""
    return profile_option if profile_option in EFFORTS else "default"
