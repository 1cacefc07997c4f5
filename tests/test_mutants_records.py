"""The Mutants page's tables of kills are generated from campaign records.

``scripts/mutants_record.py`` reads the table ``kvspec mutants`` prints into a record;
``scripts/mutants_page.py`` renders the records between the page's markers (``tests/test_docs.py``
holds the committed page to the generator). Here: the table kvspec's own ``format_table`` and
``summary`` print is read back cell for cell, a survivor included; output without a table gives no
record; and the committed page shows each committed record's rows, read from the JSON files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from kvspec.conformance.commands.mutants import SuiteRun, format_table, summary

#: ``script(NAME)``: scripts/NAME.py as a module (the ``script`` fixture of conftest.py)
LoadScript = Callable[[str], ModuleType]
ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "results" / "data" / "mutants"
PAGE = ROOT / "docs" / "results" / "mutants.md"


RUNS = [
    SuiteRun(
        "stored_on_inactive_hit",
        "killed",
        0.84,
        "test_golden::test_golden_scenario[a/b@lru]",
        "STORE-NEW-ONLY",
        cpu=0.4,
    ),
    SuiteRun(
        "validate_after_mutation", "killed", 12.0, "test_stateful::test_lockstep[kvbm]", "STORE-NEW-ONLY", cpu=8.25
    ),
    SuiteRun("sneaky", "passed", 30.5),
]
EXPECTED = {"stored_on_inactive_hit": "STORE-NEW-ONLY", "validate_after_mutation": "USE-VALIDATE", "sneaky": "EVENT-ID"}


def test_the_printed_table_is_read_back_cell_for_cell(script: LoadScript) -> None:
    lines = ["[1/3] ...", format_table(RUNS, EXPECTED), "", *summary(RUNS), "logs (pytest output, ...): /tmp/x"]
    rows, lines_of_summary = script("mutants_record").parse_output("\n".join(lines).split("\n"))
    assert rows == [
        {
            "mutant": "stored_on_inactive_hit",
            "result": "killed",
            "time_s": "0.8",
            "cpu_s": "0.40",
            "rule": "STORE-NEW-ONLY",
            "expected rule": "STORE-NEW-ONLY",
            "killed by test": "test_golden::test_golden_scenario[a/b@lru]",
        },
        {
            "mutant": "validate_after_mutation",
            "result": "killed",
            "time_s": "12.0",
            "cpu_s": "8.25",
            "rule": "STORE-NEW-ONLY",
            "expected rule": "USE-VALIDATE",
            "killed by test": "test_stateful::test_lockstep[kvbm]",
        },
        {
            "mutant": "sneaky",
            "result": "SURVIVED",
            "time_s": "30.5",
            "cpu_s": "-",
            "rule": "-",
            "expected rule": "EVENT-ID",
            "killed by test": "-",
        },
    ]
    assert lines_of_summary[0] == "killed 2/3 mutants" and "survived: sneaky" in lines_of_summary
    assert not any(line.startswith("logs (") for line in lines_of_summary)


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        (["kvspec mutants: unknown mutant(s): x (see --list)"], "no table of kills"),
        ([format_table(RUNS, EXPECTED)], "no summary line"),
    ],
)
def test_output_without_a_table_gives_no_record(lines: list[str], why: str, script: LoadScript) -> None:
    with pytest.raises(ValueError, match=why):
        script("mutants_record").parse_output("\n".join(lines).split("\n"))


def test_the_campaign_is_named_after_its_adapter_folder(script: LoadScript) -> None:
    name = script("mutants_record").campaign_name
    assert name([]) == "mutants"
    assert name(["--impl=adapters/radix_mutants", "-j", "1"]) == "radix_mutants"
    assert name(["--jobs", "1", "--impl", "adapters/paged_rust/"]) == "paged_rust"


def test_a_declared_rule_other_than_the_killing_one_is_shown(script: LoadScript) -> None:
    row = {"mutant": "m", "result": "killed", "time_s": "1.0", "cpu_s": "0.50", "rule": "A-B"}
    show = script("mutants_page")._row
    assert show({**row, "expected rule": "C-D", "killed by test": "t"}) == (
        "| `m` | killed | 1.0 s | 0.50 s | `A-B` (declared `C-D`) | t |"
    )
    assert "declared" not in show({**row, "expected rule": "A-B", "killed by test": "t"})


def test_the_committed_page_shows_each_records_rows() -> None:
    page = PAGE.read_text()
    records = sorted(RECORDS.glob("*.json"))
    assert records
    for path in records:
        rec = json.loads(path.read_text())
        for r in rec["rows"]:
            assert f"| `{r['mutant']}` | {r['result']} | " in page, r["mutant"]
            assert f"| {r['killed by test']} |" in page, r["mutant"]
        label = "**Measured**" if rec["status"] == "measured" else "**Carried over**"
        assert f"**`adapters/{path.stem}`**. {label}" in page
        for line in rec["summary"]:
            assert f"- {line}\n" in page
