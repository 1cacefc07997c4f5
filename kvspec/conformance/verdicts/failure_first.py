"""A conformance failure shows its readable report first.

pytest's default long traceback puts about forty lines of source and
argument reprs (the scenario, the manifest, the fixtures) before the
exception's message, which is the part a port author needs: the operation
table, the first divergence and its rule, the replay command. The plugin
replaces the failed report's ``longrepr`` with:

1. the report (``ConformanceFailure.report``), its first line tagged
   ``kvspec: [RULE]`` (what JUnit's failure message and ``kvspec mutants`` read);
2. Hypothesis's notes (the falsifying example, ``@reproduce_failure``);
3. where it was raised: one line per frame of the traceback, or, with
   ``-v`` or an explicit ``--tb=long/short/native``, pytest's own traceback
   in full (``--tb=line`` and ``--tb=no`` are left to pytest).
"""

from __future__ import annotations

from typing import Any

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
    notes = [str(n) for n in getattr(exc, "__notes__", ()) or ()]
    if notes:
        lines += ["", *notes]
    full = config.getoption("verbose", 0) > 0 or tbstyle in ("long", "short", "native")
    if full:
        lines += ["", "---- traceback (pytest) ----", str(original)]
    else:
        lines += ["", "raised at (-v or --tb=long for the full traceback):"]
        lines += [f"  {e.path}:{e.lineno + 1} in {e.name}" for e in _frames(excinfo)]
    return "\n".join(lines)


def _frames(excinfo: Any) -> list[Any]:
    """The traceback's frames, pytest's internals and Hypothesis's left out."""
    try:
        tb = excinfo.traceback
    except AttributeError:
        return []
    keep = [e for e in tb if not any(f"/{lib}/" in str(e.path) for lib in _LIBRARIES)]
    return keep[-8:]
