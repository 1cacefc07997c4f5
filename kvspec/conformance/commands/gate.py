"""``kvspec gate RESULTS --baseline FILE``: fail an engine's CI when its KV
behaviour regresses against the last accepted run.

A run passing or failing as a whole cannot tell "same as before" from "a new
rule broke" once an engine declares deviations (every real one does), and it
never notices a rule that silently stops being exercised. The gate compares
two results files (``conformance/verdicts/results.py``) rule by rule and exits 1, with
a table of what changed, when:

- a rule fails that did not fail in the baseline (it passed, or was not
  exercised, or is new);
- a declared deviation changes: new, gone, its scope changed, or observed now
  where the baseline did not observe it;
- a rule's coverage drops to zero, or below ``--min-coverage`` (a fraction,
  default 0.5) of the baseline's count (listed without blocking when a rule
  newly fails in the same run: a failing test stops exercising its rules, so
  the drop is likely its consequence; once the failure is fixed, a drop that
  remains blocks);
- the implementation's capabilities shrink (a capability turned off, a
  profile, policy or tier gone, a lower ``max_capacity``);
- the run itself did not complete (status ``error`` / ``unreadable``);
- the run is incomplete (status ``incomplete``: a rule that applies to the
  implementation was never exercised) and the baseline was not incomplete
  for those same rules (each such rule is a row; an accepted baseline that
  was incomplete for them makes them notes).

Other differences (a failure fixed, more coverage, a deviation no longer
observed, more findings of an already failing stream rule, another kvspec)
are listed without failing the gate.

Each row says where the difference comes from. Both files carry the spec
version (a digest of everything that judges and one digest per rule): with
equal digests every difference is the engine's; a rule whose own digest
changed, or that one side lacks, is the spec's; a difference in an unchanged
rule under a changed kvspec is marked as the engine's with that caveat, so a
team can upgrade kvspec deliberately (run, read the table, ``--update``).

**Not comparable (exit 3).** Coverage counts and the failures a run finds
depend on the traffic Hypothesis generated, and that depends on the
Hypothesis version, the effort, its settings and (for a random effort) the
seed: the same port got different counts under Hypothesis 6.155 and 6.170.
Both files record these (``provenance``); when they differ between two suite
runs, or a file does not record them (results format 1 or 2), the gate says
NOT COMPARABLE, lists what differs and exits 3 instead of reporting the
differences as regressions (or as a pass). Pin Hypothesis (spec/GATING.md),
or accept the new run deliberately with ``--update``. Streams generate
nothing: only a difference in kvspec or Python is listed for them, as a note.

``--update`` writes the run as the new baseline (after printing the table)
and exits 0; ``--markdown`` prints the table as Markdown for a pull-request
comment. Exit 2: a file cannot be read, or the baseline is missing (the
message says to create it with ``--update``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec.conformance.verdicts.provenance import ProvenanceDifference, describe, differences
from kvspec.conformance.verdicts.results import (
    DeviationResult,
    Results,
    load_results,
    merge_stream_results,
    spec_version_label,
)
from kvspec.spec.errors import ConfigError

ENGINE = "engine"
#: the exit code of a comparison whose runs' traffic came from different generators
NOT_COMPARABLE = 3


@dataclass(frozen=True, slots=True)
class Change:
    kind: str
    subject: str
    baseline: str
    current: str
    #: where it comes from: "engine", "spec: ...", "engine (kvspec also changed ...)"
    source: str
    blocking: bool


def _rule_source(base: Results, cur: Results, rid: str) -> str:
    if base.spec.digest == cur.spec.digest:
        return ENGINE
    b, c = base.spec.rules.get(rid), cur.spec.rules.get(rid)
    if b is None and c is not None:
        return "spec: new rule"
    if c is None and b is not None:
        return "spec: rule removed"
    if b is None and c is None:
        return "engine (kvspec changed; no per-rule digests to compare)"
    if b != c:
        return "spec: rule changed"
    return "engine (kvspec changed, this rule did not)"


def _describe(r: Any) -> str:
    if r is None:
        return "absent"
    if r.status in ("pass", "deviation") and r.exercised:
        return f"{r.status} ({r.exercised}x)"
    if r.status == "fail":
        return f"fail ({r.failures})"
    return str(r.status)


def provenance_differences(base: Results, cur: Results) -> list[ProvenanceDifference]:
    """What differs in the two runs' provenance (``provenance.differences``):
    for suite runs the traffic-deciding differences make them not comparable;
    a stream generates nothing, so only its versions are listed."""
    generated = not (base.is_stream and cur.is_stream)
    return differences(base.provenance, cur.provenance, generated=generated)


def not_comparable(diffs: Sequence[ProvenanceDifference]) -> list[ProvenanceDifference]:
    """The differences that make two runs' counts not comparable."""
    return [d for d in diffs if d.decides_traffic]


def compare(base: Results, cur: Results, *, min_coverage: float = 0.5) -> list[Change]:
    """Every difference between the baseline and the current run, blocking first
    (the provenance differences that do not decide the traffic are notes; the
    ones that do are reported by ``run`` as NOT COMPARABLE before this)."""
    out: list[Change] = []
    for d in provenance_differences(base, cur):
        if not d.decides_traffic and d.what != "kvspec":  # kvspec: the "kvspec changed" row below
            out.append(Change("provenance differs", d.what, d.first, d.second, "run", False))
    if cur.status in ("error", "unreadable"):
        out.append(Change("run did not complete", "-", base.status, f"{cur.status}: {cur.error or ''}", ENGINE, True))
    out += _incomplete_changes(base, cur)
    if base.spec.digest != cur.spec.digest:
        out.append(
            Change(
                "kvspec changed",
                "-",
                spec_version_label(base.spec),
                spec_version_label(cur.spec),
                "spec",
                False,
            )
        )
    if (base.implementation.label, base.profile) != (cur.implementation.label, cur.profile):
        out.append(
            Change(
                "implementation changed",
                "-",
                f"{base.implementation.label} (profile {base.profile})",
                f"{cur.implementation.label} (profile {cur.profile})",
                ENGINE,
                False,
            )
        )
    rules = _rule_changes(base, cur, min_coverage)
    if any(c.kind in ("passing rule fails", "rule fails") for c in rules):
        # a failing test stops exercising its rules: with a new failure, the
        # coverage drops are shown as its likely consequence (the failure
        # already fails the gate; once it is fixed they block on their own)
        rules = [
            Change(c.kind + " (may follow from the new failure)", c.subject, c.baseline, c.current, c.source, False)
            if c.kind.startswith("coverage")
            else c
            for c in rules
        ]
    out += rules
    out += _deviation_changes(base.deviations, cur.deviations)
    out += _capability_changes(base.capabilities, cur.capabilities)
    return sorted(out, key=lambda c: (not c.blocking, _ORDER.get(c.kind.split(" ")[0], 9)))


#: the order of the table: what broke first, its consequences (coverage) last
_ORDER = {"run": 0, "passing": 1, "rule": 2, "new": 3, "deviation": 4, "capability": 5, "coverage": 6}


def _incomplete_changes(base: Results, cur: Results) -> list[Change]:
    """An incomplete run: one row per applicable rule it never exercised,
    blocking unless the accepted baseline was incomplete for it too."""
    if cur.status != "incomplete" and not cur.incomplete:
        return []
    accepted = set(base.incomplete)
    out = [
        Change(
            "rule never exercised (run incomplete)",
            rid,
            "incomplete (accepted)" if rid in accepted else _describe(base.rules.get(rid)),
            "applies, never exercised",
            _rule_source(base, cur, rid),
            rid not in accepted,
        )
        for rid in cur.incomplete
    ]
    if any(c.blocking for c in out):
        n = sum(c.blocking for c in out)
        out.insert(
            0,
            Change("run incomplete", "-", base.status, f"incomplete: {n} rule(s) newly never exercised", ENGINE, True),
        )
    return out


def _rule_changes(base: Results, cur: Results, min_coverage: float) -> list[Change]:
    out: list[Change] = []
    complete = cur.status not in ("error", "unreadable")
    for rid in sorted(set(base.rules) | set(cur.rules)):
        b, c = base.rules.get(rid), cur.rules.get(rid)
        src = _rule_source(base, cur, rid)

        def add(kind: str, blocking: bool, rid: str = rid, b: Any = b, c: Any = c, src: str = src) -> None:
            out.append(Change(kind, rid, _describe(b), _describe(c), src, blocking))

        if c is None:
            if complete:
                add("rule no longer reported", False)
            continue
        if c.status == "fail" and (b is None or b.status != "fail"):
            add("passing rule fails" if b is not None and b.status == "pass" else "rule fails", True)
            continue
        if b is None:
            continue
        if b.status == "fail" and c.status != "fail":
            add("failure fixed", False)
            continue
        if b.status == "fail" and c.failures > b.failures:
            add("more findings", False)
            continue
        if not complete or rid in cur.incomplete:
            continue  # an incomplete rule has its own row (_incomplete_changes)
        if b.exercised > 0 and c.exercised == 0:
            add("coverage dropped to zero", True)
        elif b.exercised > 0 and c.exercised < min_coverage * b.exercised:
            add(f"coverage below {min_coverage:g} of baseline", True)
    return out


def _dev_key(d: DeviationResult) -> tuple[str, str]:
    return (d.rule, repr(sorted((k, repr(v)) for k, v in d.scope.items() if v is not None)))


def _deviation_changes(base: Sequence[DeviationResult], cur: Sequence[DeviationResult]) -> list[Change]:
    out: list[Change] = []
    b = {_dev_key(d): d for d in base}
    c = {_dev_key(d): d for d in cur}

    def scope(d: DeviationResult) -> str:
        s = ", ".join(f"{k}={v}" for k, v in sorted(d.scope.items()) if v is not None)
        return f" [{s}]" if s else ""

    def seen(d: DeviationResult) -> str:
        return f"declared{scope(d)}, observed {d.observed}x" if d.observed else f"declared{scope(d)}, not observed"

    for k in sorted(set(b) | set(c)):
        bd, cd = b.get(k), c.get(k)
        if bd is None and cd is not None:
            out.append(Change("new deviation", cd.rule, "-", seen(cd) + f": {cd.reason}", ENGINE, True))
        elif cd is None and bd is not None:
            out.append(Change("deviation gone", bd.rule, seen(bd), "-", ENGINE, True))
        elif bd is not None and cd is not None:
            if cd.observed and not bd.observed:
                # a deviation whose evidence depends on timing may or may not show in a run
                kind = "deviation now observed" + ("" if cd.deterministic else " (timing dependent)")
                out.append(Change(kind, cd.rule, seen(bd), seen(cd), ENGINE, cd.deterministic))
            elif bd.observed and not cd.observed:
                out.append(Change("deviation no longer observed", cd.rule, seen(bd), seen(cd), ENGINE, False))
            if bd.reason != cd.reason:
                out.append(Change("deviation reason changed", cd.rule, bd.reason, cd.reason, ENGINE, False))
    return out


def _capability_changes(base: dict[str, Any], cur: dict[str, Any]) -> list[Change]:
    out: list[Change] = []
    for name in sorted(set(base) | set(cur)):
        b, c = base.get(name), cur.get(name)
        if b == c:
            continue
        if isinstance(b, bool) or isinstance(c, bool):
            lost = bool(b) and not c
            out.append(Change("capability lost" if lost else "capability gained", name, str(b), str(c), ENGINE, lost))
        elif isinstance(b, list) or isinstance(c, list):
            gone = sorted(set(b or []) - set(c or []))
            added = sorted(set(c or []) - set(b or []))
            if gone:
                out.append(
                    Change(
                        "capability lost",
                        name,
                        ", ".join(map(str, b or [])),
                        ", ".join(map(str, c or [])),
                        ENGINE,
                        True,
                    )
                )
            elif added:
                out.append(
                    Change(
                        "capability gained",
                        name,
                        ", ".join(map(str, b or [])),
                        ", ".join(map(str, c or [])),
                        ENGINE,
                        False,
                    )
                )
        elif isinstance(b, int | float) and isinstance(c, int | float):
            out.append(Change("capability lost" if c < b else "capability gained", name, str(b), str(c), ENGINE, c < b))
        else:
            out.append(Change("capability changed", name, str(b), str(c), ENGINE, True))
    return out


# ------------------------------------------------------------------ rendering

_HEAD = ("", "change", "rule / capability", "baseline", "now", "from")


def _rows(changes: Sequence[Change]) -> list[tuple[str, ...]]:
    return [("FAIL" if c.blocking else "note", c.kind, c.subject, c.baseline, c.current, c.source) for c in changes]


def render_text(changes: Sequence[Change]) -> str:
    rows = [_HEAD, *_rows(changes)]
    widths = [min(60, max(len(r[i]) for r in rows)) for i in range(len(_HEAD))]
    lines = ["  ".join(cell[:60].ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines) + "\n"


def render_markdown(changes: Sequence[Change]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(_HEAD[1:]) + " | blocks |", "|---|---|---|---|---|---|"]
    for c in changes:
        lines.append(
            "| "
            + " | ".join(esc(x) for x in (c.kind, f"`{c.subject}`", c.baseline, c.current, c.source))
            + f" | {'**yes**' if c.blocking else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def not_comparable_message(diffs: Sequence[ProvenanceDifference], base: Results, cur: Results) -> str:
    """Why the gate does not judge the run (exit 3), and what to do."""
    missing = any(d.what == "provenance" for d in diffs)
    if missing:
        older = "the baseline" if base.provenance is None else "the run"
        why = (
            f"{older} does not record what generated its traffic (results format "
            f"{base.format if base.provenance is None else cur.format}: written by an older kvspec)"
        )
    else:
        why = f"their traffic was generated differently: {describe(list(diffs))}"
    return (
        f"kvspec gate: NOT COMPARABLE: {cur.implementation.label} against baseline {base.implementation.label}: "
        f"{why}. Coverage counts and the failures found depend on the Hypothesis version, the effort and the "
        "seed, so differences between these runs are not regressions or fixes of the implementation. Run with "
        "the baseline's Hypothesis (pin it: spec/GATING.md) and effort, or accept this run as the new baseline "
        "with --update."
    )


def verdict(changes: Sequence[Change], base: Results, cur: Results) -> str:
    n = sum(c.blocking for c in changes)
    what = f"{cur.implementation.label} against baseline {base.implementation.label}"
    if n:
        return f"kvspec gate: FAILED: {n} regression(s) of {what}"
    return f"kvspec gate: passed: no regression of {what} ({len(changes)} other difference(s))"


# ------------------------------------------------------------------ command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "results",
        nargs="+",
        metavar="RESULTS",
        help="the run's results JSON (--kvspec-results, check-log --json); several stream results (the watchers of "
        "one queue group) are merged into one verdict first",
    )
    p.add_argument(
        "--baseline", required=True, metavar="FILE", help="the accepted results JSON, kept in the repository"
    )
    p.add_argument("--update", action="store_true", help="write RESULTS as the new baseline (exit 0)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (a pull-request comment)")
    p.add_argument(
        "--min-coverage",
        type=float,
        default=0.5,
        metavar="FRACTION",
        help="fail when a rule is exercised less than this fraction of its baseline count (default 0.5; 0: only zero)",
    )


def run(args: argparse.Namespace) -> int:
    if not 0.0 <= args.min_coverage <= 1.0:
        print("kvspec gate: --min-coverage must be a fraction between 0 and 1", file=sys.stderr)
        return 2
    try:
        runs = [load_results(f) for f in args.results]
        cur = merge_stream_results(runs) if len(runs) > 1 else runs[0]
    except ConfigError as e:
        print(f"kvspec gate: {e}", file=sys.stderr)
        return 2
    source = args.results[0] if len(args.results) == 1 else " + ".join(args.results)
    baseline = Path(args.baseline)
    if not baseline.exists():
        if args.update:
            _write_baseline(cur, baseline, args.results)
            print(f"kvspec gate: baseline {baseline} created from {source}")
            return 0
        print(f"kvspec gate: no baseline {baseline}: create it with --update once the run is accepted", file=sys.stderr)
        return 2
    try:
        base = load_results(baseline)
    except ConfigError as e:
        print(f"kvspec gate: baseline: {e}", file=sys.stderr)
        return 2
    blocking = not_comparable(provenance_differences(base, cur))
    if blocking:
        rows = [Change("not comparable", d.what, d.first, d.second, "run", True) for d in blocking]
        sys.stdout.write(render_markdown(rows) if args.markdown else render_text(rows))
        print(("\n" if args.markdown else "") + not_comparable_message(blocking, base, cur))
        if args.update:
            _write_baseline(cur, baseline, args.results)
            print(f"kvspec gate: baseline {baseline} updated from {source}")
            return 0
        return NOT_COMPARABLE
    changes = compare(base, cur, min_coverage=args.min_coverage)
    if changes:
        sys.stdout.write(render_markdown(changes) if args.markdown else render_text(changes))
    print(("\n" if args.markdown else "") + verdict(changes, base, cur))
    if args.update:
        _write_baseline(cur, baseline, args.results)
        print(f"kvspec gate: baseline {baseline} updated from {source}")
        return 0
    return 1 if any(c.blocking for c in changes) else 0


def _write_baseline(doc: Results, dest: Path, src: list[str]) -> None:
    """The run as the baseline: the file itself, or the merged verdict of several."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if len(src) == 1:
        shutil.copyfile(src[0], dest)
    else:
        dest.write_text(doc.to_json())
