"""Run a ``kvspec mutants`` campaign and keep its table of kills as a record the Mutants page shows.

    python scripts/mutants_record.py [--timeout S] [KVSPEC MUTANTS ARGS...]

runs ``python -m kvspec mutants ARGS`` from the repository root (its output passes through) and
writes ``docs/results/data/mutants/NAME.json``, NAME the adapter folder of ``--impl`` (default
``mutants``): when it ran, the machine's cores and load, the command, the commit, its exit code, the
table's rows (mutant, result, time to kill, CPU, rule, expected rule, killing test) and the summary
lines. A campaign with survivors is recorded too (exit code 1: the page shows them); one that did
not get to its table (a usage error, an interrupt, the timeout) records nothing.
``python scripts/gen_docs.py`` renders docs/results/mutants.md's table from the records.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_record

ROOT = bench_record.ROOT
RECORDS = ROOT / "docs" / "results" / "data" / "mutants"
#: the columns of ``kvspec mutants``' table (``conformance/commands/mutants.py`` ``format_table``)
COLUMNS = ("mutant", "result", "time_s", "cpu_s", "rule", "expected rule", "killed by test")


def parse_output(lines: list[str]) -> tuple[list[dict[str, str]], list[str]]:
    """The table's rows and the summary lines of a campaign's output; ValueError saying what is missing."""
    try:
        head = next(i for i, line in enumerate(lines) if line.split() and line.split()[:2] == ["mutant", "result"])
    except StopIteration:
        raise ValueError("no table of kills (a line starting 'mutant  result') in the output") from None
    rule = lines[head + 1] if head + 1 < len(lines) else ""
    spans = [m.span() for m in re.finditer(r"-+", rule)]
    if len(spans) != len(COLUMNS) or [lines[head][a:b].strip() for a, b in spans] != list(COLUMNS):
        raise ValueError(f"the table's header is {lines[head]!r}, not the columns {COLUMNS}")
    rows: list[dict[str, str]] = []
    for line in lines[head + 2 :]:
        if not line.strip():
            break
        cells = [line[a : (spans[k + 1][0] if k + 1 < len(spans) else None)].strip() for k, (a, _) in enumerate(spans)]
        rows.append(dict(zip(COLUMNS, cells, strict=True)))
    if not rows:
        raise ValueError("the table of kills has no rows")
    start = next((i for i, line in enumerate(lines) if re.match(r"killed \d+/\d+ mutants$", line)), None)
    if start is None:
        raise ValueError("no summary line 'killed N/M mutants' in the output")
    summary = [line for line in lines[start:] if line.strip() and not line.startswith("logs (")]
    return rows, summary


def campaign_name(args: list[str]) -> str:
    """The adapter folder's name of ``--impl`` (``mutants`` without one)."""
    for i, a in enumerate(args):
        if a.startswith("--impl="):
            return Path(a.partition("=")[2]).name
        if a == "--impl" and i + 1 < len(args):
            return Path(args[i + 1]).name
    return "mutants"


def run(args: list[str], root: Path = ROOT, timeout: float | None = None) -> dict[str, Any]:
    """Run the campaign once and return its record; SystemExit saying why when there is none."""
    name = campaign_name(args)
    ran = bench_record.run_command([sys.executable, "-m", "kvspec", "mutants", *args], root, timeout)
    lines, rc = ran.pop("lines"), ran.pop("rc")
    if rc is None:
        raise SystemExit(f"kvspec mutants ran over {timeout} s; nothing recorded")
    if rc not in (0, 1):
        raise SystemExit(f"kvspec mutants exited with {rc}; nothing recorded")
    try:
        rows, summary = parse_output(lines)
    except ValueError as e:
        raise SystemExit(f"kvspec mutants: {e}; nothing recorded") from None
    return {
        "name": name,
        "status": "measured",
        "command": shlex.join(["kvspec", "mutants", *args]),
        **ran,
        "commit": bench_record.commit_of(root, name),
        "rc": rc,
        "rows": rows,
        "summary": summary,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--timeout", type=float, default=None, help="seconds the campaign may take (default: no limit)")
    p.add_argument("--records", type=Path, default=RECORDS, help="folder of the records (default %(default)s)")
    a, rest = p.parse_known_args(argv)  # the rest goes to kvspec mutants
    record = run(rest, timeout=a.timeout)
    a.records.mkdir(parents=True, exist_ok=True)
    path = a.records / f"{record['name']}.json"
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {path}; run python scripts/gen_docs.py to render docs/results/mutants.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
