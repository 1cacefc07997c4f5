"""``kvspec report FILE... --markdown OUT.md --html OUT.html``: the rules x
implementations matrix.

Each results file (``--kvspec-results`` of a suite run, ``--json`` of
check-log or watch) is one column; each rule of the catalogue one row, in the
catalogue's order, grouped by concern. A cell says what that run made of the
rule:

| cell | meaning |
|---|---|
| ``✓ N`` | passed, exercised N times |
| ``≈ deviation`` | a declared deviation (its reason in the notes; whether the run observed it) |
| ``✗ fail`` | failed, with a link to the replay file |
| ``n/a`` | not applicable: the capability the implementation lacks, or why the rule does not apply to it |
| ``! not exercised`` | the rule applies and the run never exercised it: the run is incomplete |

Each run's provenance (kvspec, Hypothesis and Python versions, effort and
seed) is listed under the matrix. When the suite runs of the columns were not
generated alike (another Hypothesis, effort, budget or random seed, or a file
that does not record it), their counts are not comparable: the report says
so above the matrix and on standard error, naming what differs, rather than
mixing them silently.

The HTML page is self-contained (inline style, no script, no external
resource), so a CI job can upload it as one artifact; hovering a rule shows
its text (title and the first paragraph of its SPEC.md section), hovering a
cell shows the detail.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kvspec.conformance.verdicts.provenance import describe, differences
from kvspec.conformance.verdicts.results import (
    ERRORED,
    Results,
    RuleResult,
    load_results,
    merge_stream_results,
    rule_text,
    spec_version_label,
)
from kvspec.spec.errors import ConfigError
from kvspec.spec.rules import RULES

SYMBOL = {"pass": "✓", "fail": "✗", "deviation": "≈", "not_applicable": "n/a", "not_exercised": "! not exercised"}


@dataclass(frozen=True, slots=True)
class Cell:
    status: str
    #: the short text shown in the cell
    text: str
    #: the detail shown on hover (HTML) or in the notes (Markdown)
    detail: str
    #: replay files (links), relative to the report's folder where they exist
    links: tuple[str, ...] = ()
    #: the index of this cell's note (deviations), 0 for none
    note: int = 0


@dataclass(frozen=True, slots=True)
class Matrix:
    columns: list[str]
    runs: list[Results]
    #: (concern, rule id) in catalogue order
    rows: list[tuple[str, str]]
    cells: dict[tuple[str, int], Cell]
    notes: list[str]
    #: why the columns' counts are not comparable (None: generated alike)
    mixed: str | None = None


def _label_columns(runs: Sequence[Results]) -> list[str]:
    labels = [r.label for r in runs]
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if labels.count(lab) == 1 else f"{lab} #{seen[lab]}")
    return out


def _link(replay: str, out_dir: Path | None) -> str:
    p = Path(replay)
    if out_dir is None:
        return replay
    target = p if p.is_absolute() else Path.cwd() / p
    if not target.exists():
        return replay
    return os.path.relpath(target, out_dir.resolve())


def _cell(r: RuleResult | None, out_dir: Path | None) -> Cell:
    if r is None:
        return Cell("absent", "–", "not in this results file")
    if r.status == "pass":
        return Cell("pass", f"✓ {r.exercised}", f"passed, exercised {r.exercised} times")
    if r.status == "fail":
        what = f"failed ({r.failures} failure(s)" + (f", exercised {r.exercised} times)" if r.exercised else ")")
        links = tuple(_link(p, out_dir) for p in r.replays)
        return Cell("fail", "✗ fail", what + ("; replay: " + ", ".join(r.replays) if r.replays else ""), links)
    if r.status == "deviation":
        seen = "observed" if r.note.startswith("observed") else "not observed"
        return Cell("deviation", f"≈ deviation ({seen})", f"declared deviation, {r.note}: {r.reason}")
    if r.status == "not_applicable":
        caps = r.note.removeprefix("missing capability ").split(", ") if r.note.startswith("missing capability") else []
        more = f" +{len(caps) - 1}" if len(caps) > 1 else ""
        text = f"n/a ({caps[0]}{more})" if caps else "n/a"
        return Cell("not_applicable", text, f"not applicable: {r.note}" if r.note else "not applicable")
    text = f"{SYMBOL['not_exercised']} (test error)" if r.note.startswith(ERRORED) else SYMBOL["not_exercised"]
    return Cell("not_exercised", text, f"not exercised{': ' + r.note if r.note else ''}")


def build_matrix(runs: Sequence[Results], out_dir: Path | None = None) -> Matrix:
    columns = _label_columns(runs)
    extra = sorted({rid for r in runs for rid in r.rules} - {str(i) for i in RULES})
    rows = [(str(rule.concern), str(rid)) for rid, rule in RULES.items()] + [("other", rid) for rid in extra]
    cells: dict[tuple[str, int], Cell] = {}
    notes: list[str] = []
    for j, run in enumerate(runs):
        for _, rid in rows:
            c = _cell(run.rules.get(rid), out_dir)
            if c.status == "deviation":
                notes.append(f"{columns[j]} {rid}: {c.detail}")
                c = replace(c, note=len(notes))
            cells[(rid, j)] = c
    return Matrix(columns, list(runs), rows, cells, notes, mixed_provenance(runs, columns))


def mixed_provenance(runs: Sequence[Results], columns: Sequence[str]) -> str | None:
    """Why the suite runs among ``runs`` were not generated alike (each
    compared with the first one), or None. Streams generate nothing."""
    suite = [(c, r) for c, r in zip(columns, runs, strict=True) if not r.is_stream]
    if len(suite) < 2:
        return None
    first_col, first = suite[0]
    parts = []
    for col, r in suite[1:]:
        diffs = [d for d in differences(first.provenance, r.provenance) if d.decides_traffic]
        if diffs:
            parts.append(f"{first_col} vs {col}: {describe(diffs)}")
    if not parts:
        return None
    return (
        "these runs were not generated alike, so their counts are not comparable ("
        + "; ".join(parts)
        + "): the Hypothesis version, the effort and a random effort's seed decide the traffic"
    )


# ------------------------------------------------------------------ Markdown


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render_markdown(m: Matrix) -> str:
    lines = ["| rule | " + " | ".join(_md_escape(c) for c in m.columns) + " |"]
    lines.append("|---|" + "---|" * len(m.columns))
    for _, rid in m.rows:
        row = [f"`{rid}`"]
        for j in range(len(m.columns)):
            c = m.cells[(rid, j)]
            text = c.text
            if c.links:
                text = f"[{text}]({c.links[0]})"
            if c.note:
                text += f" [{c.note}]"
            row.append(_md_escape(text))
        lines.append("| " + " | ".join(row) + " |")
    out = [f"**Note:** {_md_escape(m.mixed)}", ""] if m.mixed else []
    out += ["\n".join(lines), ""]
    out.append(
        "✓ N: passed, exercised N times; ≈: declared deviation (reason below); ✗: failed (linked to its replay file); "
        "n/a: not applicable (the missing capability, or why the rule does not apply); "
        "! not exercised: the rule applies and the run never exercised it (an incomplete run, not a pass)."
    )
    out.append("")
    out.append("Runs: " + "; ".join(_run_line(c, r) for c, r in zip(m.columns, m.runs, strict=True)) + ".")
    if m.notes:
        out.append("")
        out += [f"{i}. {_md_escape(n)}" for i, n in enumerate(m.notes, 1)]
    return "\n".join(out) + "\n"


def _run_line(label: str, r: Results) -> str:
    src = f" (profile {r.profile})" if r.profile else ""
    missing = (
        f" ({len(r.incomplete)} applicable rule(s) never exercised: {', '.join(r.incomplete)})" if r.incomplete else ""
    )
    if r.provenance is not None:
        return f"{label}{src}: {r.status}{missing}, {r.provenance.label()}"
    return f"{label}{src}: {r.status}{missing}, kvspec {spec_version_label(r.spec)} (provenance not recorded)"


# ------------------------------------------------------------------ HTML

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; }
th, td { border: 1px solid #bbb; padding: 3px 8px; text-align: center; white-space: nowrap; }
th.rule, td.rule { text-align: left; font-family: ui-monospace, monospace; cursor: help; }
tr.concern th { background: #e8eaf6; text-align: left; }
td.pass { background: #c8e6c9; }
td.fail { background: #ef9a9a; font-weight: bold; }
td.deviation { background: #ffe0b2; }
td.not_applicable { background: #e0e0e0; color: #555; }
td.not_exercised { background: #fff3e0; color: #b71c1c; font-weight: bold; }
td.absent { background: #fff; color: #888; }
td[title] { cursor: help; }
.legend span { display: inline-block; padding: 1px 6px; margin-right: 6px; border: 1px solid #bbb; }
ol.notes { font-size: 13px; }
"""


def render_html(m: Matrix, title: str = "kvspec conformance matrix") -> str:
    e = html.escape
    head = "".join(f'<th class="impl" scope="col">{e(c)}</th>' for c in m.columns)
    body: list[str] = []
    concern = None
    for group, rid in m.rows:
        if group != concern:
            concern = group
            body.append(f'<tr class="concern"><th colspan="{len(m.columns) + 1}">{e(group)}</th></tr>')
        tds = []
        for j in range(len(m.columns)):
            c = m.cells[(rid, j)]
            text = e(c.text)
            if c.links:
                text = f'<a href="{e(c.links[0])}">{text}</a>'
            if c.note:
                text += f' <sup><a href="#note-{c.note}">{c.note}</a></sup>'
            tds.append(
                f'<td class="{c.status}" data-rule="{e(rid)}" data-impl="{e(m.columns[j])}" '
                f'data-status="{c.status}" title="{e(c.detail)}">{text}</td>'
            )
        body.append(f'<tr><td class="rule" title="{e(rule_text(rid))}">{e(rid)}</td>{"".join(tds)}</tr>')
    runs = "".join(f"<li>{e(_run_line(c, r))}</li>" for c, r in zip(m.columns, m.runs, strict=True))
    notes = "".join(f'<li id="note-{i}">{e(n)}</li>' for i, n in enumerate(m.notes, 1))
    legend = (
        '<p class="legend"><span class="pass" style="background:#c8e6c9">✓ N passed, exercised N times</span>'
        '<span style="background:#ffe0b2">≈ declared deviation</span>'
        '<span style="background:#ef9a9a">✗ failed (link: replay file)</span>'
        '<span style="background:#e0e0e0">n/a not applicable (missing capability)</span>'
        "<span>! not exercised: applies, never exercised (an incomplete run)</span> "
        "<span>– not in the results file</span></p>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{e(title)}</h1>"
        + (f'<p class="mixed" id="mixed"><strong>Note:</strong> {e(m.mixed)}</p>' if m.mixed else "")
        + f"{legend}"
        f'<table id="matrix"><thead><tr><th class="rule" scope="col">rule</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
        f'<h2>Runs</h2><ul id="runs">{runs}</ul>'
        + (f'<h2>Declared deviations</h2><ol class="notes" id="notes">{notes}</ol>' if notes else "")
        + "<p>Hover a rule for its text, a cell for the detail.</p></body></html>\n"
    )


# ------------------------------------------------------------------ command line


def merge_fleets(runs: list[Results]) -> list[Results]:
    """The results of the watchers of one queue group (same endpoint, subject
    and group) merged into one column, in the place of the first."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for i, r in enumerate(runs):
        group = r.input.get("queue_group")
        if r.is_stream and group:
            groups.setdefault((str(r.input.get("endpoint")), str(r.input.get("subject")), str(group)), []).append(i)
    out: list[Results] = []
    for i, r in enumerate(runs):
        key = next((k for k, idx in groups.items() if i in idx), None)
        if key is None:
            out.append(r)
        elif groups[key][0] == i:
            out.append(merge_stream_results([runs[j] for j in groups[key]]))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "results",
        nargs="+",
        metavar="FILE",
        help="results JSON files (one column each; the watchers of one queue group make one column together)",
    )
    p.add_argument("--markdown", metavar="OUT.md", help="write the matrix as Markdown ('-': stdout)")
    p.add_argument("--html", metavar="OUT.html", help="write the matrix as one self-contained HTML page")
    p.add_argument("--title", default="kvspec conformance matrix", help="the HTML page's title")


def run(args: argparse.Namespace) -> int:
    try:
        runs = merge_fleets([load_results(f) for f in args.results])
    except ConfigError as e:
        print(f"kvspec report: {e}", file=sys.stderr)
        return 2
    if not args.markdown and not args.html:
        args.markdown = "-"
    mixed = mixed_provenance(runs, _label_columns(runs))
    if mixed:
        print(f"kvspec report: note: {mixed}", file=sys.stderr)
    if args.markdown:
        out_dir = None if args.markdown == "-" else Path(args.markdown).parent
        text = render_markdown(build_matrix(runs, out_dir))
        if args.markdown == "-":
            sys.stdout.write(text)
        else:
            Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(args.markdown).write_text(text)
    if args.html:
        page = render_html(build_matrix(runs, Path(args.html).parent), args.title)
        Path(args.html).parent.mkdir(parents=True, exist_ok=True)
        Path(args.html).write_text(page)
    return 0
