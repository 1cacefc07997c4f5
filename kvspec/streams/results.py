"""The results of a stream check, in the one results model of kvspec.

``kvspec check-log --json FILE`` and ``kvspec watch --json FILE`` write a
``kvspec.conformance.verdicts.results.Results`` document (format 2, the same model a
``pytest conformance --kvspec-results`` run writes), so that ``kvspec gate``
compares a nightly recorded stream with its baseline exactly as it compares
suite runs. A stream fills these fields of the model (where format 1 had them)::

    "input": {"path": "trace.jsonl", "format": "router", "producer": "dynamo", ...},
    "counts": {"records": 487, "events": 487, "stored": 241, ...},
    "findings_by_rule": {"EVENT-ID": 2},   # every finding, by rule id (ignored rules left out)
    "ignored_by_rule": {},                 # findings of rules the user chose to ignore
    "findings": [                          # every finding, in stream order
      {"rule": "EVENT-ID", "message": "...", "at": "line 17", "worker_id": 3, "dp_rank": 0,
       "tier": "device", "event": "#5 Stored[...] parent=None", "context": {...}}
    ]

and ``rules`` says per rule: ``fail`` with its findings, ``pass`` over the
events checked, ``not_exercised`` when ignored, ``not_applicable`` when a
stream cannot show it. ``status`` is ``clean`` / ``findings`` /
``unreadable`` as the exit code 0 / 1 / 2.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from kvspec.reference.router_view import Violation
from kvspec.streams.producer_names import VLLM_FORMAT

if TYPE_CHECKING:  # the pydantic results model is imported when a document is written, not at start-up
    from kvspec.conformance.verdicts.results import Results, Status

__all__ = ["finding_json", "format_at", "results", "write_json"]

STATUS: dict[int, Status] = {0: "clean", 1: "findings", 2: "unreadable"}


#: what a record is called in each input format
RECORD = {
    "router": "line",
    "kvspec": "line",
    "zmq": "line",
    "eventplane": "line",
    VLLM_FORMAT: "batch",
    "live": "message",
}


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
    tool: Literal["kvspec check-log", "kvspec watch"],
    exit_code: int,
    input: Mapping[str, Any],
    counts: Mapping[str, int],
    findings_by_rule: Mapping[str, int],
    ignored_by_rule: Mapping[str, int],
    findings: Sequence[Mapping[str, Any]],
    warnings: Sequence[str],
    error: str | None,
    checked: Iterable[str] | None = None,
    ignored: Iterable[str] = (),
    statistics: Mapping[str, Any] | None = None,
) -> Results:
    """The results document of a stream check. ``checked``: the rules the
    checker ran (default: every stream-checkable rule); ``ignored``: the
    rules left out with ``--ignore``."""
    from kvspec.conformance.verdicts.provenance import Provenance
    from kvspec.conformance.verdicts.results import (
        ImplementationInfo,
        Results,
        current_versions,
        spec_version,
        stream_rules,
    )

    inp = dict(input)
    producer = str(inp.get("producer") or inp.get("format") or "stream")
    events = int(counts.get("events", 0))
    return Results(
        tool=tool,
        spec=spec_version(),
        implementation=ImplementationInfo(name=producer, kind="stream", adapter=str(inp.get("format", ""))),
        profile=inp.get("profile"),
        options={k: v for k, v in inp.items() if k not in ("path", "endpoint")},
        status=STATUS[exit_code],
        exit_code=exit_code,
        # a stream check generates nothing: its provenance is the versions that judged
        provenance=Provenance(versions=current_versions(), profile=inp.get("profile")),
        rules=stream_rules(findings_by_rule, ignored_by_rule, events=events, checked=checked, ignored=ignored)
        if exit_code != 2
        else {},
        input=inp,
        counts=dict(counts),
        findings_by_rule=dict(sorted(findings_by_rule.items())),
        ignored_by_rule=dict(sorted(ignored_by_rule.items())),
        findings=[dict(f) for f in findings],
        warnings=list(warnings),
        error=error,
        statistics=dict(statistics or {}),
    )


def write_json(doc: Results, dest: str) -> None:
    """Write to a path, or to standard output for ``-``."""
    from kvspec.conformance.verdicts.results import write_results

    write_results(doc, dest)
