"""The results file: one JSON shape for every kvspec verdict, with a format version.

``pytest conformance --kvspec-results FILE``, ``kvspec check-log --json FILE``
and ``kvspec watch --json FILE`` all write a ``Results`` document;
``kvspec report`` renders several of them as a matrix and ``kvspec gate``
compares one with a baseline. Keeping one model (rather than one per tool)
is what lets a nightly stream be gated exactly like a suite run.

Why each part is there:

- ``spec`` carries the kvspec version, a digest of everything that judges
  (spec texts, rule catalogue, scenarios, the reference model, the checker)
  and one digest per rule (its catalogue entry and its SPEC.md section), so
  that a gate can tell a difference the engine caused from one a kvspec
  upgrade caused.
- ``rules`` holds one entry per rule of the catalogue with a ``status``
  (``pass``, ``fail``, ``deviation``, ``not_applicable``,
  ``not_exercised``) and how often the run exercised it: the gate needs the
  coverage as well as the verdict, because a rule that silently stops being
  exercised is a regression too. ``not_applicable`` says why the rule does
  not apply to this adapter (``applicability.py``); ``not_exercised`` is a
  rule that applies and that the run never reached.
- ``status`` is the run's outcome; ``incomplete`` lists the applicable
  rules a whole-suite run never exercised (status ``incomplete`` when that
  is all that is wrong: not a pass, whatever the exit code).
- ``deviations`` lists the manifest's declared deviations with their scope and
  whether the run observed them; ``failures`` the failures with their rule and
  replay file; ``capabilities`` what the implementation declared.
- Streams fill ``input``, ``counts``, ``findings_by_rule`` and ``findings``
  (the fields of format 1, where they were): a stream's rules pass or fail by
  their findings.

- ``provenance`` (``provenance.py``) records what decided the run's traffic:
  the kvspec, Hypothesis and Python versions, the effort, its settings and
  seed, the adapter folder and variant, the profile's options. The gate
  refuses to compare runs whose generated traffic came from different
  Hypothesis versions or efforts; the report says when its columns differ.

Format history: 1 was the stream-only shape of ``check-log --json``
(``streams/results.py``); 2 is this model; 3 adds ``provenance`` (and the
``incomplete`` status and list).
``load_results`` reads all three (a file of format 1 or 2 has no provenance:
the gate says it cannot tell what generated it).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import kvspec
from kvspec.conformance.verdicts.provenance import Provenance, Versions, versions_of
from kvspec.spec.errors import ConfigError
from kvspec.spec.rules import RULES, RuleId

RESULTS_FORMAT = 3
#: the formats ``load_results`` reads
READABLE_FORMATS = (1, 2, 3)

RuleStatus = Literal["pass", "fail", "deviation", "not_applicable", "not_exercised"]
#: the run's outcome: ``clean`` (pass: every applicable rule exercised, no
#: failure outside a declared scope), ``findings`` (fail), ``incomplete``
#: (no failure, but a rule that applies was never exercised: not a pass),
#: ``error`` / ``unreadable`` (the implementation or the input could not run)
Status = Literal["clean", "findings", "incomplete", "unreadable", "error"]
Tool = Literal["pytest conformance", "kvspec check-log", "kvspec watch"]

_PKG = Path(kvspec.__file__).resolve().parent

#: the note of a rule not exercised because its covering tests failed
#: without naming a rule (an adapter error, a crash in a fixture)
ERRORED = "its tests failed before reaching it"


class _ResultsModel(BaseModel):
    # extra fields are kept, not refused: a newer kvspec may add some and an
    # older gate must still read its results
    model_config = ConfigDict(extra="allow")


class SpecVersion(_ResultsModel):
    """Which kvspec judged: the package version, a digest of the judging
    code and texts, and one digest per rule."""

    kvspec_version: str
    #: sha256 prefix over spec texts, rule catalogue, scenarios, reference model and checker
    digest: str
    #: rule id -> sha256 prefix of its catalogue entry and SPEC.md section
    rules: dict[str, str] = {}


class ImplementationInfo(_ResultsModel):
    name: str
    kind: str = ""
    #: the adapter folder (suite) or the producer (streams)
    adapter: str = ""
    #: the selected ``[[variants]]`` entry (``--impl=adapters/mutants/NAME``)
    variant: str | None = None
    description: str = ""

    @property
    def label(self) -> str:
        return f"{self.name}/{self.variant}" if self.variant else self.name


class DeviationResult(_ResultsModel):
    rule: str
    reason: str
    link: str | None = None
    #: what the deviation is limited to (profile and any other scope fields of the manifest)
    scope: dict[str, Any] = {}
    observed: int = 0
    #: can "not observed" be judged? (False: its evidence depends on timing)
    deterministic: bool = True


class FailureResult(_ResultsModel):
    #: the rule the failure names (None: the test failed without naming one)
    rule: str | None
    test: str
    message: str
    replay: str | None = None


class RuleResult(_ResultsModel):
    status: RuleStatus
    #: how often the run exercised the rule (suite: checked steps; stream: events checked)
    exercised: int = 0
    #: failures (suite) or findings (stream) of this rule
    failures: int = 0
    #: why it is not applicable (the missing capability) or not exercised
    note: str = ""
    #: the declared deviation's reason (status deviation)
    reason: str = ""
    replays: list[str] = []


class Results(_ResultsModel):
    format: int = RESULTS_FORMAT
    tool: Tool
    spec: SpecVersion
    implementation: ImplementationInfo
    profile: str | None = None
    options: dict[str, Any] = {}
    capabilities: dict[str, Any] = {}
    status: Status
    exit_code: int
    #: what decided the traffic (None: a file of format 1 or 2, which did not record it)
    provenance: Provenance | None = None
    rules: dict[str, RuleResult] = Field(default_factory=dict)
    #: suite: the applicable rules a whole-suite run never exercised (empty:
    #: complete, or not judged: a narrowed selection, see ``options``)
    incomplete: list[str] = []
    deviations: list[DeviationResult] = []
    failures: list[FailureResult] = []
    warnings: list[str] = []
    error: str | None = None
    # -- what a stream check (check-log, watch) adds; empty for a suite run --
    #: the input read: path or endpoint, format, producer and the checker's settings
    input: dict[str, Any] = {}
    #: records, events, stored, removed, ... (suite: tests passed, failed, skipped, ...)
    counts: dict[str, int] = {}
    #: every finding, by rule id (ignored rules left out)
    findings_by_rule: dict[str, int] = {}
    #: findings of rules the user chose to ignore
    ignored_by_rule: dict[str, int] = {}
    #: the findings, in stream order
    findings: list[dict[str, Any]] = []
    #: per worker (and dp rank) and per tier: events, gaps, restarts, redeliveries, findings, live blocks
    statistics: dict[str, Any] = {}

    @property
    def is_stream(self) -> bool:
        return self.tool != "pytest conformance"

    @property
    def label(self) -> str:
        """The column name of this run in a report."""
        if self.is_stream:
            src = self.input.get("path") or self.input.get("endpoint") or ""
            return f"{self.implementation.label} ({Path(str(src)).name or self.tool})"
        return self.implementation.label

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"


# ------------------------------------------------------------------ spec digests


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


_SECTION = re.compile(r"^#{2,4} `([A-Z0-9-]+)`", re.M)


@cache
def rule_sections() -> dict[str, str]:
    """Rule id -> its SPEC.md section (heading to the next heading)."""
    text = (_PKG / "spec" / "SPEC.md").read_text()
    out: dict[str, str] = {}
    for m in _SECTION.finditer(text):
        nxt = re.compile(r"^#{1,3} ", re.M).search(text, m.end())
        out[m.group(1)] = text[m.start() : nxt.start() if nxt else len(text)].strip()
    return out


def rule_text(rid: str) -> str:
    """A rule's text for a reader: its title, then its SPEC.md section's
    first paragraph (what a report shows on hover)."""
    try:
        r = RULES[RuleId(rid)]
    except ValueError:
        return rid
    body = rule_sections().get(rid, "").split("\n\n")
    para = " ".join(body[1].split()) if len(body) > 1 else ""
    return f"{rid}: {r.title} ({r.concern}).{' ' + para if para else ''}"


@cache
def _judging_files() -> tuple[Path, ...]:
    files: list[Path] = []
    for sub, pattern in (
        ("spec", "*.md"),
        ("spec", "*.py"),
        ("spec/scenarios", "**/*.json"),
        ("reference", "**/*.py"),
        ("conformance", "**/*.py"),
    ):
        files += [p for p in (_PKG / sub).glob(pattern) if "__pycache__" not in p.parts]
    return tuple(sorted(set(files)))


@cache
def spec_version() -> SpecVersion:
    """The version of kvspec judging this run (computed once per process)."""
    sections = rule_sections()
    rules = {
        str(rid): _digest(
            [f"{rid}|{r.concern}|{r.title}|{r.stream_checkable}|{r.strict}".encode(), sections.get(rid, "").encode()]
        )
        for rid, r in sorted(RULES.items())
    }
    files = _judging_files()
    digest = _digest([json.dumps(rules, sort_keys=True).encode()] + [p.read_bytes() for p in files])
    return SpecVersion(kvspec_version=kvspec.__version__, digest=digest, rules=rules)


@cache
def current_versions() -> Versions:
    """The kvspec (and spec digest), Hypothesis and Python versions of this process."""
    return versions_of(spec_version().digest)


def spec_version_label(v: SpecVersion) -> str:
    return f"{v.kvspec_version}+{v.digest[:12]}"


# ------------------------------------------------------------------ reading and writing


def load_results(path: str | Path) -> Results:
    """Read a results file (format 3 or 2, or the stream-only format 1); a
    ``ConfigError`` names the file and what is wrong with it."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the results file: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(data, dict) or "format" not in data:
        raise ConfigError(f"{p}: not a kvspec results file (no 'format' field)")
    fmt = data.get("format")
    if fmt == 1:
        data = _from_format_1(data)
    elif fmt not in READABLE_FORMATS:
        raise ConfigError(
            f"{p}: results format {fmt!r} is not one this kvspec reads "
            f"({', '.join(map(str, READABLE_FORMATS))}): upgrade kvspec"
        )
    if fmt != RESULTS_FORMAT:
        data = {**data, "provenance": None}  # an older file: nothing recorded, whatever it holds
    try:
        return Results.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{p}: invalid results file:\n{e}") from e


def _from_format_1(d: Mapping[str, Any]) -> dict[str, Any]:
    """A stream-only results file of format 1 as a ``Results`` document (its
    spec digest is the old rule-catalogue one, with no per-rule digests)."""
    findings = {str(k): int(v) for k, v in d.get("findings_by_rule", {}).items()}
    ignored = {str(k): int(v) for k, v in d.get("ignored_by_rule", {}).items()}
    inp = dict(d.get("input", {}))
    events = int(d.get("counts", {}).get("events", 0))
    rules = stream_rules(findings, ignored, events=events, checked=None)
    ver = str(d.get("spec_version", ""))
    return {
        "format": RESULTS_FORMAT,
        "tool": d.get("tool", "kvspec check-log"),
        "spec": {"kvspec_version": d.get("kvspec_version", ""), "digest": ver.rpartition(".")[2] or ver},
        "implementation": {"name": str(inp.get("producer") or "stream"), "kind": "stream"},
        "profile": inp.get("profile"),
        "options": {k: v for k, v in inp.items() if k not in ("path", "endpoint")},
        "status": d.get("status", "unreadable"),
        "exit_code": d.get("exit_code", 2),
        "rules": {k: v.model_dump() for k, v in rules.items()},
        "input": inp,
        "counts": d.get("counts", {}),
        "findings_by_rule": findings,
        "ignored_by_rule": ignored,
        "findings": d.get("findings", []),
        "warnings": d.get("warnings", []),
        "error": d.get("error"),
    }


def stream_rules(
    findings_by_rule: Mapping[str, int],
    ignored_by_rule: Mapping[str, int],
    *,
    events: int,
    checked: Iterable[str] | None,
    ignored: Iterable[str] = (),
) -> dict[str, RuleResult]:
    """Per-rule verdicts of a stream check: a rule the checker ran fails with
    its findings and otherwise passes over the events it saw; an ignored rule
    and a rule a stream cannot show are not exercised / not applicable.
    ``checked`` None: the stream-checkable rules."""
    run = {str(r) for r in checked} if checked is not None else {str(i) for i, r in RULES.items() if r.stream_checkable}
    skip = {str(r) for r in ignored} | set(ignored_by_rule)
    out: dict[str, RuleResult] = {}
    for rid, r in sorted(RULES.items()):
        key = str(rid)
        n = int(findings_by_rule.get(key, 0))
        if key in skip:
            out[key] = RuleResult(status="not_exercised", note="ignored (--ignore)")
        elif n:
            out[key] = RuleResult(status="fail", exercised=events, failures=n)
        elif key in run:
            out[key] = RuleResult(status="pass" if events else "not_exercised", exercised=events)
        elif r.stream_checkable:
            out[key] = RuleResult(status="not_exercised", note="not checked for this stream")
        else:
            out[key] = RuleResult(status="not_applicable", note="needs the operations: not checkable from a stream")
    for key, n in findings_by_rule.items():  # a finding under an id the catalogue lacks
        if key not in out:
            out[key] = RuleResult(status="fail", exercised=events, failures=int(n))
    return out


def write_results(doc: Results, dest: str | Path) -> None:
    """Write to a path (its folder created), or to standard output for ``-``."""
    text = doc.to_json()
    if str(dest) == "-":
        import sys

        sys.stdout.write(text)
        return
    p = Path(dest)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(p)


_STREAM_STATUS: dict[int, Status] = {0: "clean", 1: "findings", 2: "unreadable"}
#: the checker settings that must agree for results to be merged into one verdict
SETTINGS = ("producer", "profile", "counting", "first_event_id", "anchored_tiers", "hash_scheme", "format")


def merge_stream_results(docs: Sequence[Results]) -> Results:
    """One verdict from the results files of watchers that shared a fleet
    (``kvspec watch ... --queue-group``): counts, findings and statistics
    added up, the rules judged again over all events. Refuses (ConfigError)
    results that are not stream checks, whose spec or checker settings
    differ, or where one worker was checked by two watchers (a split worker
    has no single state: its verdict would be unsound)."""
    if not docs:
        raise ConfigError("nothing to merge")
    if len(docs) == 1:
        return docs[0]
    first = docs[0]
    for d in docs:
        if not d.is_stream:
            raise ConfigError(f"only stream results (check-log, watch) merge: {d.label} is a suite run")
        if d.spec != first.spec:
            raise ConfigError(f"results of different specs do not merge: {first.spec} and {d.spec}")
        for k in SETTINGS:
            if d.input.get(k) != first.input.get(k):
                raise ConfigError(
                    f"results checked with different settings do not merge: {k} {first.input.get(k)!r} and "
                    f"{d.input.get(k)!r}"
                )
    counts: dict[str, int] = {}
    by_rule: dict[str, int] = {}
    ignored: dict[str, int] = {}
    workers: dict[tuple[int, int], dict[str, Any]] = {}
    tiers: dict[str, dict[str, int]] = {}
    findings: list[dict[str, Any]] = []
    warnings: list[str] = []
    errors: list[str] = []
    checked: set[str] = set()
    for d in docs:
        for k, n in d.counts.items():
            counts[k] = counts.get(k, 0) + int(n)
        for k, n in d.findings_by_rule.items():
            by_rule[k] = by_rule.get(k, 0) + int(n)
        for k, n in d.ignored_by_rule.items():
            ignored[k] = ignored.get(k, 0) + int(n)
        for w in d.statistics.get("workers", []):
            key = (int(w["worker_id"]), int(w["dp_rank"]))
            if key in workers:
                raise ConfigError(
                    f"worker {key[0]} dp {key[1]} was checked by two watchers (split across {d.label} and "
                    "another): its verdict would be unsound"
                )
            workers[key] = w
        for name, t in d.statistics.get("tiers", {}).items():
            agg = tiers.setdefault(name, {})
            for k, n in t.items():
                agg[k] = agg.get(k, 0) + int(n)
        findings.extend(d.findings)
        warnings.extend(d.warnings)
        if d.error:
            errors.append(d.error)
        checked |= {r for r, res in d.rules.items() if res.status in ("pass", "fail")}
    code = 2 if any(d.exit_code == 2 for d in docs) else (1 if by_rule else 0)
    sources = [str(d.input.get("endpoint") or d.input.get("path") or "") for d in docs]
    inp = {**first.input, "merged": sources, "member": None}
    events = counts.get("events", 0)
    return first.model_copy(
        update={
            "status": _STREAM_STATUS[code],
            "exit_code": code,
            "rules": stream_rules(by_rule, ignored, events=events, checked=checked or None) if code != 2 else {},
            "input": inp,
            "options": {k: v for k, v in inp.items() if k not in ("path", "endpoint")},
            "counts": counts,
            "findings_by_rule": dict(sorted(by_rule.items())),
            "ignored_by_rule": dict(sorted(ignored.items())),
            "findings": findings,
            "warnings": warnings,
            "error": "; ".join(errors) or None,
            "statistics": {"workers": [workers[k] for k in sorted(workers)], "tiers": tiers},
        }
    )
