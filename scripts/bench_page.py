"""Render docs/results/benchmarks.md from the benchmark records (``scripts/gen_docs.py`` calls it).

A record is ``docs/results/data/benchmarks/NAME.json``. ``scripts/bench_record.py NAME`` writes one
with status ``measured`` from a run it timed itself (date, load, cores, command, output). A record
with status ``carried over`` holds figures measured before the records existed, converted from the
hand-kept page: it names the date, load and command as they were stated then, and why it was not
measured again. The page says which is which on every row, so a reader never takes an old figure for
a new one. Every benchmarks/NAME.py has a row, recorded or not; a record with no such script (a
measurement of some other command) goes under "Other measurements".
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

STATUSES = ("measured", "carried over")
#: the keys each kind of record must have
NEEDS = {
    "measured": (
        *("name", "status", "command", "started", "ended", "wall_s", "cpu_s", "machine", "commit"),
        *("last_line", "value", "unit", "output"),
    ),
    "carried over": ("name", "status", "command", "measured", "load", "summary", "figures", "not_rerun_because"),
}


def load_records(folder: Path, needs: dict[str, tuple[str, ...]] = NEEDS) -> dict[str, dict[str, Any]]:
    """Name -> record; SystemExit naming the file when one is not a well-formed record (a status of
    ``needs`` and that status's keys, named after its file)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path}: not JSON ({e})") from None
        if not isinstance(rec, dict) or rec.get("status") not in needs:
            raise SystemExit(f"{path}: status must be one of {tuple(needs)}")
        missing = [k for k in needs[rec["status"]] if k not in rec]
        if missing:
            raise SystemExit(f"{path}: a {rec['status']} record needs {', '.join(missing)}")
        if rec["name"] != path.stem:
            raise SystemExit(f"{path}: its name is {rec['name']!r}, not {path.stem!r}")
        out[path.stem] = rec
    return out


def purpose(script: Path) -> str:
    """The first line of the benchmark's docstring: what it measures, in its own words."""
    doc = ast.get_docstring(ast.parse(script.read_text()))
    return doc.strip().splitlines()[0].strip() if doc else "(no docstring)"


def _when(rec: dict[str, Any]) -> str:
    if rec["status"] == "carried over":
        return str(rec["measured"])
    return str(rec["started"]).replace("T", " ")[:16] + " UTC"


def _load(rec: dict[str, Any]) -> str:
    if rec["status"] == "carried over":
        return str(rec["load"])
    m = rec["machine"]
    return f"{m['load_start'][0]:.1f} → {m['load_end'][0]:.1f} ({m['cores']} cores)"


def _figure(rec: dict[str, Any]) -> str:
    if rec["status"] == "carried over":
        return str(rec["summary"])
    return f"{rec['value']} {rec['unit']}".strip()


def _row(name: str, rec: dict[str, Any] | None) -> str:
    if rec is None:
        return f"| [`{name}`](#{name}) | no record | | | not recorded |"
    status = "measured" if rec["status"] == "measured" else "**carried over**"
    return f"| [`{name}`](#{name}) | {_figure(rec)} | {_when(rec)} | {_load(rec)} | {status} |"


def _detail(name: str, rec: dict[str, Any] | None, what: str | None) -> list[str]:
    out = [f"### {name}", ""]
    if what is not None:
        out += [f"{what}", ""]
    if rec is None:
        out += [f"No record yet: `python scripts/bench_record.py {name}` measures it.", ""]
        return out
    out += ["| | |", "|---|---|", f"| command | `{rec['command']}` |"]
    if rec["status"] == "measured":
        m = rec["machine"]
        out.append(f"| run | {rec['started']} to {rec['ended']}: {rec['wall_s']} s wall, {rec['cpu_s']} s CPU |")
        out.append(
            f"| machine | {m['cores']} cores, {m['system']}, Python {m['python']}; load average (1, 5, 15 min) "
            f"{', '.join(f'{x:.2f}' for x in m['load_start'])} at start, "
            f"{', '.join(f'{x:.2f}' for x in m['load_end'])} at end |"
        )
        out.append(f"| commit | `{rec['commit']}` |")
        out.append(f"| last line | `{rec['last_line']}` |")
        out += ["", "What it printed:", "", "```text", *rec["output"], rec["last_line"], "```", ""]
        return out
    out.append(f"| measured | {rec['measured']}, load {rec['load']} |")
    if rec.get("last_line"):
        out.append(f"| last line | `{rec['last_line']}` |")
    out.append(f"| carried over from | {rec.get('carried_from', 'an earlier hand-kept page')} |")
    out.append(f"| not measured again because | {rec['not_rerun_because']} |")
    out += ["", "Figures as they were recorded:", ""]
    out += [f"- {f}" for f in rec["figures"]]
    for note in rec.get("notes", []):
        out += ["", note]
    out.append("")
    return out


def render(records_dir: Path, benchmarks_dir: Path, header: str) -> str:
    """The whole page: a short row per benchmark, then a section per benchmark from its record."""
    records = load_records(records_dir)
    scripts = {p.stem: p for p in sorted(benchmarks_dir.glob("*.py")) if not p.stem.startswith("_")}
    others = sorted(set(records) - set(scripts))
    counts = {s: sum(r["status"] == s for r in records.values()) for s in STATUSES}
    unrecorded = sorted(set(scripts) - set(records))
    out = [header, "", "# Benchmarks", ""]
    out += [
        "Each benchmark is `python benchmarks/NAME.py` from the repository root; its last line is "
        "`NAME: VALUE UNIT`. `python scripts/bench_record.py NAME [ARGS...]` runs one and keeps what it "
        "printed, with the date, the command, the commit and the machine's load, as "
        "`docs/results/data/benchmarks/NAME.json`; `python scripts/gen_docs.py` renders this page from "
        "those records, so nothing on it is typed by hand.",
        "",
        "The machine is a shared 2-core virtual machine: read each figure beside its load average "
        "(1-minute, at the start and end of the run). A row marked **carried over** holds a figure "
        "measured before the records existed, typed on the earlier hand-kept page: its date, load and "
        "command are as stated then, and its section says why it was not measured again.",
        "",
        f"{counts['measured']} measured by `scripts/bench_record.py`, {counts['carried over']} carried over, "
        f"{len(unrecorded)} not recorded.",
        "",
        "| benchmark | figure (last line) | when | load | record |",
        "|---|---|---|---|---|",
    ]
    out += [_row(name, records.get(name)) for name in scripts]
    if others:
        out += ["", "Other measurements (commands that are not benchmarks):", ""]
        out += ["| measurement | figure | when | load | record |", "|---|---|---|---|---|"]
        out += [_row(name, records[name]) for name in others]
    out += ["", "## The benchmarks", ""]
    for name, script in scripts.items():
        out += _detail(name, records.get(name), purpose(script))
    if others:
        out += ["## Other measurements", ""]
        for name in others:
            out += _detail(name, records[name], None)
    return "\n".join(out).rstrip("\n") + "\n"
