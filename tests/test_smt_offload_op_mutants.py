"""Operation-level mutants of kvbm-offload: each breaks its operation row; a row none breaks is named.

``offload/op_mutants.py`` seeds bugs into the operation-level encoding (a step
mutant acting on every step an operation takes, or a bug of a whole
operation); ``kvspec prove`` prints one ``operation: refutes`` row per mutant
and ``operation: MUTANTS-COVER``. Here the operation's own bugs are refuted
on their row, the unmutated operations keep every row, and the cover row
fails, naming the rows, when its mutants leave some unbroken."""

from __future__ import annotations

import pytest

from kvspec.reference.smt.cli import operations as op_cli
from kvspec.reference.smt.offload import op_mutants
from kvspec.reference.smt.offload.op_mutants import OP_MUTANTS, OffloadOpMutant, broken_rows

OWN = [
    m
    for m in OP_MUTANTS
    if m.reshape is not None or m.name in ("op:registers-twice", "op:offload-queued-without-parent")
]


@pytest.mark.slow  # about 2 s of CPU each; plain ``kvspec prove`` (tests/test_smt_prove.py) refutes every one
@pytest.mark.parametrize("m", OWN, ids=lambda m: m.name)
def test_an_operation_bug_breaks_its_row(m: OffloadOpMutant) -> None:
    assert m.expect in broken_rows(m)


@pytest.mark.slow
def test_the_unmutated_operations_keep_every_row() -> None:
    assert broken_rows(OffloadOpMutant("none", "", "the rules as written", "")) == []


def test_every_step_mutant_with_a_patch_or_a_dropped_contract_acts_through_the_operations() -> None:
    from kvspec.reference.smt.offload.mutants import MUTANTS

    names = {m.name for m in OP_MUTANTS}
    for m in MUTANTS:
        if (m.patch is not None or m.drop) and m.name not in op_mutants.STEP_ONLY:
            assert f"op:{m.name}" in names


def test_the_cover_row_names_the_rows_no_mutant_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    only = next(m for m in OP_MUTANTS if m.name == "op:use-removes-stored")
    monkeypatch.setattr(op_mutants, "OP_MUTANTS", [only])
    rows: list[list[str]] = []
    problems = op_cli.mutant_rows(rows.append)
    assert rows[0][:2] == ["  refutes op:use-removes-stored", "refuted"]
    cover = rows[-1]
    assert cover[0] == "operation: MUTANTS-COVER" and cover[1] == "FAILED"
    assert "INV-NO-DUP" in cover[2] and "OP-STORE-REMOVE-DISJOINT" not in cover[2]
    assert any(p.startswith("operation INV-ANCHOR: no seeded bug") for p in problems)
