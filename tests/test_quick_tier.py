"""The quick tier covers every area: each test module keeps tests that ``make quick`` runs.

``make quick`` runs ``-m "not slow and not engines"``; the slow tier is ``tests/slow_tests.txt``
(tests/conftest.py marks what it lists). Listing a module's every function there would silently take
the module's area out of the edit-test loop, so a module may give the quick tier nothing only when it
is listed whole with the reason, or when all its tests need the real engines. The counts are those of
this session's own collection (tests/conftest.py keeps them before ``-m`` deselects anything), so the
check covers the modules this run collected: all of them under ``make quick``.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SlowList = tuple[set[str], dict[str, str]]
TierCounts = dict[str, tuple[int, int, int]]


def test_every_collected_module_keeps_quick_tests_or_says_why(tier_counts: TierCounts, slow_list: SlowList) -> None:
    _, whole = slow_list
    bare = sorted(m for m, (n, quick, engines) in tier_counts.items() if not quick and engines < n and m not in whole)
    assert not bare, (
        f"these test modules give `make quick` no test: {bare}; keep a fast test of each out of "
        "tests/slow_tests.txt, or list the module whole there as `module.py  # why`"
    )


def test_a_module_listed_whole_says_why_and_exists(slow_list: SlowList) -> None:
    _, whole = slow_list
    assert all(whole.values()), [m for m, why in whole.items() if not why]
    assert all((TESTS / m).is_file() for m in whole), [m for m in whole if not (TESTS / m).is_file()]


def _defined(module: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments)."""
    names: set[str] = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_every_listed_function_is_defined(slow_list: SlowList) -> None:
    """An entry naming a test that no longer exists (renamed, moved) is stale: its successor would run
    in the quick tier unmeasured. Read from the sources, so that it holds whatever this run selected."""
    functions, _ = slow_list
    missing = sorted(f for f in functions if not (TESTS / f.split("::", 1)[0]).is_file())
    assert not missing, f"tests/slow_tests.txt lists modules that do not exist: {missing}"
    defined = {m: _defined(TESTS / m) for m in {f.split("::", 1)[0] for f in functions}}
    stale = sorted(f for f in functions if f.split("::")[1] not in defined[f.split("::", 1)[0]])
    assert not stale, f"tests/slow_tests.txt lists tests that do not exist: {stale}"


def test_the_counts_are_this_sessions_collection(tier_counts: TierCounts) -> None:
    """The counts the checks above read include this module's own four tests, all quick."""
    assert tier_counts[Path(__file__).name] == (4, 4, 0)
