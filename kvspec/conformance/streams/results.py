"""The results file of a stream check: one small JSON shape, documented here.

``kvspec check-log --json FILE`` and ``kvspec watch --json FILE`` write it; a
gate (and later the conformance suite's own results) reads it. Shape
(``format`` 1)::

    {
      "format": 1,
      "tool": "kvspec check-log",            # or "kvspec watch"
      "kvspec_version": "0.1.0",
      "spec_version": "0.1.0+rules.3f2a9c1b0d4e",  # package version + digest of the rule catalogue
      "input": {"path": "trace.jsonl", "format": "router", "producer": "dynamo", ...},
      "status": "clean" | "findings" | "unreadable",
      "exit_code": 0 | 1 | 2,
      "counts": {"records": 487, "events": 487, "stored": 241, "removed": 246, "cleared": 0,
                 "sources": 1, "live_blocks": 16},
      "findings_by_rule": {"EVENT-ID": 2},   # every finding, by rule id (ignored rules left out)
      "ignored_by_rule": {},                 # findings of rules the user chose to ignore
      "findings": [                          # the first ones, in stream order
        {"rule": "EVENT-ID", "message": "...", "at": "line 17", "worker_id": 3, "dp_rank": 0,
         "tier": "device", "event": "#5 Stored[...] parent=None", "context": {...}}
      ],
      "warnings": ["..."],
      "error": null                          # the reason the input could not be read
    }

Rule ids are those of ``kvspec/spec/rules.py``. Everything a consumer needs
to gate on is ``status`` / ``exit_code`` and ``findings_by_rule``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import kvspec
from kvspec.reference.router_view import Violation
from kvspec.spec.rules import RULES

RESULTS_FORMAT = 1
STATUS = {0: "clean", 1: "findings", 2: "unreadable"}


def spec_version() -> str:
    """The package version and a digest of the rule catalogue (ids, titles,
    whether stream-checkable and strict): two results with the same value
    were judged by the same rules."""
    h = hashlib.sha256()
    for rid, r in sorted(RULES.items()):
        h.update(f"{rid}|{r.title}|{r.stream_checkable}|{r.strict}\n".encode())
    return f"{kvspec.__version__}+rules.{h.hexdigest()[:12]}"


#: what a record is called in each input format
RECORD = {"router": "line", "kvspec": "line", "zmq": "line", "vllm": "batch", "live": "message"}


def format_at(at: object, fmt: str = "router") -> str:
    """A violation's place in the input, as a person reads it: ``line 17``,
    ``line 4 event 2`` (a capture line holds a batch of events), ``batch 3
    event 1`` (msgpack payloads), ``message 9 event 0`` (a live feed)."""
    rec = RECORD.get(fmt, "record")
    if isinstance(at, int):
        return f"{rec} {at}"
    if isinstance(at, tuple) and len(at) == 2:
        return f"{rec} {at[0]} event {at[1]}"
    return "stream"


def finding_json(v: Violation, at: str) -> dict[str, Any]:
    return {
        "rule": str(v.rule),
        "message": v.message,
        "at": at,
        "worker_id": v.source[0],
        "dp_rank": v.source[1],
        "tier": v.tier,
        "event": v.event.brief() if v.event is not None else None,
        "context": {k: _plain(x) for k, x in v.context.items()},
    }


def _plain(x: Any) -> Any:
    if isinstance(x, int | float | str | bool) or x is None:
        return x
    if isinstance(x, list | tuple | set):
        return [_plain(y) for y in x]
    return str(x)


def results(
    *,
    tool: str,
    exit_code: int,
    input: Mapping[str, Any],
    counts: Mapping[str, int],
    findings_by_rule: Mapping[str, int],
    ignored_by_rule: Mapping[str, int],
    findings: Sequence[Mapping[str, Any]],
    warnings: Sequence[str],
    error: str | None,
) -> dict[str, Any]:
    return {
        "format": RESULTS_FORMAT,
        "tool": tool,
        "kvspec_version": kvspec.__version__,
        "spec_version": spec_version(),
        "input": dict(input),
        "status": STATUS[exit_code],
        "exit_code": exit_code,
        "counts": dict(counts),
        "findings_by_rule": dict(sorted(findings_by_rule.items())),
        "ignored_by_rule": dict(sorted(ignored_by_rule.items())),
        "findings": list(findings),
        "warnings": list(warnings),
        "error": error,
    }


def write_json(doc: Mapping[str, Any], dest: str) -> None:
    """Write to a path, or to standard output for ``-``."""
    text = json.dumps(doc, indent=2) + "\n"
    if dest == "-":
        import sys

        sys.stdout.write(text)
    else:
        Path(dest).write_text(text)
