"""Render the tables of kills on docs/results/mutants.md from the campaign records (``scripts/gen_docs.py``).

A record is ``docs/results/data/mutants/NAME.json``, one per adapter folder whose variants were run.
``scripts/mutants_record.py`` writes one with status ``measured`` from a campaign it ran itself; a
record with status ``carried over`` holds a table typed on the earlier hand-kept page, with the date,
load and command stated then. The block between ``<!-- gen:mutants-runs -->`` and
``<!-- /gen:mutants-runs -->`` is replaced; the prose around it is the page's own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_page

BEGIN, END = "<!-- gen:mutants-runs -->", "<!-- /gen:mutants-runs -->"
NEEDS = {
    "measured": ("name", "status", "command", "started", "machine", "wall_s", "cpu_s", "commit", "rows", "summary"),
    "carried over": ("name", "status", "command", "measured", "load", "rows", "summary", "carried_from"),
}


def _code(text: str) -> str:
    return "-" if text in ("", "-") else f"`{text}`"


def _row(r: dict[str, str]) -> str:
    rule = _code(r["rule"])
    expected = r.get("expected rule", "-")
    if expected not in ("-", "", r["rule"]):
        rule += f" (declared {_code(expected)})"
    seconds = "-" if r["time_s"] in ("", "-") else f"{r['time_s']} s"
    cpu = "-" if r["cpu_s"] in ("", "-") else f"{r['cpu_s']} s"
    return f"| `{r['mutant']}` | {r['result']} | {seconds} | {cpu} | {rule} | {r['killed by test']} |"


def _when(rec: dict[str, Any]) -> str:
    if rec["status"] == "carried over":
        return (
            f"**Carried over**: measured {rec['measured']} at a load average of {rec['load']}, by "
            f"`{rec['command']}`; typed on {rec['carried_from']}, not measured again by a recorded run."
        )
    m = rec["machine"]
    return (
        f"**Measured** by `python scripts/mutants_record.py`: `{rec['command']}`, {rec['started']} to "
        f"{rec['ended']}, {rec['wall_s']} s wall, {rec['cpu_s']} s CPU; {m['cores']} cores, load average "
        f"{m['load_start'][0]:.1f} at start, {m['load_end'][0]:.1f} at end; commit `{rec['commit']}`."
    )


def block(folder: Path) -> str:
    """The generated block: per campaign, when and how it ran, its summary and its table."""
    records = bench_page.load_records(folder, NEEDS)
    out = [
        "The table of each recorded campaign, generated from its record "
        "(`docs/results/data/mutants/NAME.json`): `python scripts/mutants_record.py [--impl=adapters/NAME]` "
        "runs `kvspec mutants` and records it, `python scripts/gen_docs.py` renders it here.",
        "",
    ]
    if not records:
        out += ["No campaign recorded yet.", ""]
    for name, rec in records.items():
        out += [f"**`adapters/{name}`**. {_when(rec)}", ""]
        out += [f"- {line}" for line in rec["summary"]]
        out += ["", f"<details><summary>The table of kills of adapters/{name}</summary>", ""]
        out += ["| mutant | result | time to kill | CPU | rule | killed by |", "|---|---|---|---|---|---|"]
        out += [_row(r) for r in rec["rows"]]
        out += ["", "</details>", ""]
    return "\n".join(out).rstrip("\n")


def fill(text: str, folder: Path, where: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{where}: no {BEGIN} ... {END} markers")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{block(folder)}\n{END}{tail}"
