"""A conformance failure shows its readable report first.

pytest's default long traceback puts about forty lines of source and
argument reprs (the scenario, the manifest, the fixtures) before the
exception's message, which is the part a port author needs: the operation
table, the first divergence and its rule, the replay command. The plugin
replaces the failed report's ``longrepr`` with:

1. the report (``ConformanceFailure.report``), its first line tagged
   ``kvspec: [RULE]`` (what JUnit's failure message and ``kvspec mutants`` read);
2. Hypothesis's notes: the minimal failing case under a heading of kvspec's
   own (``minimal failing case (Hypothesis X):``), whatever Hypothesis calls
   it (``Falsifying example:`` up to 6.16x, ``Failing test case:`` since it
   renamed examples to test cases), then the rest (``@reproduce_failure``,
   the explanation) as Hypothesis wrote them;
3. where it was raised: one line per frame of the traceback, or, with
   ``-v`` or an explicit ``--tb=long/short/native``, pytest's own traceback
   in full (``--tb=line`` and ``--tb=no`` are left to pytest).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import hypothesis
import pytest

from kvspec.conformance.verdicts.failures import ConformanceFailure

#: frames of these packages are machinery, not where the failure is
_LIBRARIES = ("_pytest", "pluggy", "hypothesis")
#: the traceback styles where pytest's own rendering is kept as asked
_KEEP = ("line", "no")


def failure_first(config: pytest.Config, excinfo: Any, exc: ConformanceFailure, original: Any) -> Any:
    """The ``longrepr`` of a failed conformance test (see the module doc)."""
    tbstyle = config.getoption("tbstyle", "auto")
    if tbstyle in _KEEP:
        return original
    first, _, rest = exc.report.partition("\n")
    lines = [f"kvspec: [{exc.rule}] {first}", *([rest] if rest else [])]
    notes = hypothesis_notes([str(n) for n in getattr(exc, "__notes__", ()) or ()])
    if notes:
        lines += ["", *notes]
    full = config.getoption("verbose", 0) > 0 or tbstyle in ("long", "short", "native")
    if full:
        lines += ["", "---- traceback (pytest) ----", str(original)]
    else:
        lines += ["", "raised at (-v or --tb=long for the full traceback):"]
        lines += [f"  {e.path}:{e.lineno + 1} in {e.name}" for e in _frames(excinfo)]
    return "\n".join(lines)


#: the heading of Hypothesis's minimal failing case, in each layout it has had:
#: "Falsifying example: test(x=1)" / "Falsifying example:" then the state
#: machine's steps, and since the rename "Failing test case: test(x=1)" /
#: "Failing test case: <state machine>" (also the "explicit" variants)
_CASE = re.compile(r"^(?:Falsifying|Failing) (?:explicit )?(?:example|test case):[ \t]*(?:<state machine>)?[ \t]*")
#: the heading kvspec prints instead (tests and readers look for it)
CASE_HEADING = "minimal failing case (Hypothesis {version}):"


def hypothesis_notes(notes: Sequence[str]) -> list[str]:
    """Hypothesis's notes with its minimal-failing-case heading replaced by
    kvspec's own (``CASE_HEADING``), so the report's layout does not change
    with the Hypothesis version; other notes are kept as they are."""
    out: list[str] = []
    for note in notes:
        m = _CASE.match(note)
        if m is None:
            out.append(note)
            continue
        out.append(CASE_HEADING.format(version=hypothesis.__version__))
        rest = note[m.end() :].strip("\n")
        if rest:
            out.append(rest)
    return out


def _frames(excinfo: Any) -> list[Any]:
    """The traceback's frames, pytest's internals and Hypothesis's left out."""
    try:
        tb = excinfo.traceback
    except AttributeError:
        return []
    keep = [e for e in tb if not any(f"/{lib}/" in str(e.path) for lib in _LIBRARIES)]
    return keep[-8:]
