"""INVARIANTS.md's tables say what ``kvspec prove`` prints (``smt/cli/doc_tables.py``).

The parsers are checked here on a sample and on the document itself;
``tests/test_smt_prove.py::test_kvspec_prove_at_the_default_bound`` applies
``problems`` to the output of its one run of plain ``kvspec prove``
(minutes of CPU: the suite runs it once)."""

from __future__ import annotations

from kvspec.reference.smt.cli.doc_tables import DOC, problems, progress_claims, proven_claims, vacuity_claims

SAMPLE_DOC = """
| profile | properties | level | bound | contracts assumed | command |
|---|---|---|---|---|---|
| `vllm` | INV-VLLM-COPIES | step | unbounded | none | `kvspec prove --profile vllm` |
| same | INV-VLLM-OWNER-SAFE, the INV-VLLM-* rows | operation | unbounded | none | `prove` |

| profile | level | REACHABLE (bound searched) | MUTANTS-COVER |
|---|---|---|---|
| `vllm` | step | yes: 2 blocks | yes |
| `vllm` | operation | no | yes |

| profile | property | form | bound | command (row) |
|---|---|---|---|---|
| `vllm` | PROGRESS-USE-FITS | ranking: budget | any | `kvspec prove --profile vllm` (`PROGRESS-USE-FITS (ranking)`) |
| `vllm` | PROGRESS-NO-DEADLOCK | walk | 2 blocks | `kvspec equivalence --profile vllm` |
| `kvbm-offload` | PROGRESS-QUARANTINE | ranking: rank quarantined | unbounded | `kvspec prove --unbounded` |
"""
SAMPLE_OUT = """kvspec prove --profile vllm: copy counting
invariant        result            scope    time
---------------  ----------------  -------  -----
INV-VLLM-COPIES  unbounded proven  any      0.1s
REACHABLE        ok                77/77    1.0s
MUTANTS-COVER    ok                every row broken by a mutant
operation: INV-VLLM-OWNER-SAFE  unbounded proven  initial + 11 steps  1.6s
operation: MUTANTS-COVER  ok  every row broken by a mutant
PROGRESS-USE-FITS (ranking)  unbounded proven  any blocks  0.1s
"""


def test_the_checks_read_a_sample() -> None:
    assert problems(SAMPLE_DOC, SAMPLE_OUT) == []
    # a claim the output contradicts, either way, is named
    assert problems(SAMPLE_DOC.replace("| operation | no |", "| operation | yes |"), SAMPLE_OUT) == [
        "vllm operation: the table says yes, the row 'operation: REACHABLE' is absent"
    ]
    failed = SAMPLE_OUT.replace("REACHABLE        ok", "REACHABLE        FAILED")
    assert problems(SAMPLE_DOC, failed) == ["vllm step: the table says yes, the row 'REACHABLE' is FAILED"]
    extra = SAMPLE_OUT + "operation: REACHABLE  ok  63/63  1.0s\n"
    assert problems(SAMPLE_DOC, extra) == [
        "vllm operation: the table says no, but 'operation: REACHABLE' is printed (ok)"
    ]
    assert problems(SAMPLE_DOC.replace("INV-VLLM-OWNER-SAFE", "INV-VLLM-OWNERS"), SAMPLE_OUT) == [
        "vllm: the table lists INV-VLLM-OWNERS, no row of it is printed",
        "vllm: the row INV-VLLM-OWNER-SAFE is printed, the table does not list it",
    ]
    # the progress table: a ranking claimed for plain prove is a held row, and every such row is claimed
    unproven = SAMPLE_OUT.replace("(ranking)  unbounded proven", "(ranking)  unknown")
    assert problems(SAMPLE_DOC, unproven) == [
        "vllm: the progress table claims PROGRESS-USE-FITS, the row 'PROGRESS-USE-FITS (ranking)' is unknown"
    ]
    assert problems(SAMPLE_DOC, SAMPLE_OUT.replace("PROGRESS-USE-FITS (ranking)", "PROGRESS-USE-FIT")) == [
        "vllm: the progress table claims PROGRESS-USE-FITS, the row 'PROGRESS-USE-FITS (ranking)' is absent"
    ]
    extra = SAMPLE_OUT + "PROGRESS-NO-DEADLOCK (ranking)  unbounded proven  any blocks  0.1s\n"
    assert problems(SAMPLE_DOC, extra) == [
        "vllm: the row 'PROGRESS-NO-DEADLOCK (ranking)' is printed, the progress table does not claim it"
    ]


def test_the_doc_tables_parse() -> None:
    text = DOC.read_text()
    claims = vacuity_claims(text)
    assert {(p, lv) for p, lv, _r, _c in claims} >= {("vllm", "step"), ("vllm", "operation"), ("radix", "operation")}
    assert progress_claims(text).get("vllm") == {"PROGRESS-USE-FITS", "PROGRESS-NO-DEADLOCK"}
    assert set(proven_claims(text)) >= {"kvbm-offload", "kvbm", "legacy", "atomic", "vllm", "paged", "session", "radix"}
