"""MUTANTS-COVER for the radix lemma and the radix operation rows.

Every row ``kvspec prove --profile radix`` prints is the property some
seeded bug breaks: the step invariants by the mutant that names each, the
lock-path lemma by ``lock-node-only`` (the end page counted, its path left
behind), each operation row by an operation mutant or by a step mutant
acting through the steps the operation runs (``radix/ops.OP_ALSO_BREAKS``).
A row no mutant breaks fails the cover row."""

from __future__ import annotations

import pytest

from kvspec.reference.smt.cli.profiles import cover_row
from kvspec.reference.smt.radix import ops
from kvspec.reference.smt.radix.encoding import INVARIANTS
from kvspec.reference.smt.radix.steps import ALSO_BREAKS, LEMMA_ID, MUTANTS, breaks


def test_the_lemma_is_broken_by_a_mutant() -> None:
    assert ALSO_BREAKS[LEMMA_ID] in MUTANTS
    assert breaks(ALSO_BREAKS[LEMMA_ID], LEMMA_ID)
    # the unbroken lock step keeps it: the mutant is what breaks it
    assert not breaks("reset-keeps-locks", LEMMA_ID)


def test_every_step_row_is_covered() -> None:
    hit = {str(m.breaks) for m in MUTANTS.values()} | set(ALSO_BREAKS)
    assert [str(r) for r in [*INVARIANTS, LEMMA_ID] if str(r) not in hit] == []


def test_every_operation_row_is_broken_by_a_mutant() -> None:
    also = ops.also_broken()
    assert len(also) == len(ops.OP_ALSO_BREAKS)
    hit = {str(m.breaks) for m in ops.OP_MUTANTS.values()} | {w.rsplit("(", 1)[-1].rstrip(")") for w in also}
    assert [r for r in ops.cover_rows() if r not in hit] == []


@pytest.mark.parametrize("name", ["op-walk-stops-early", "op-insert-no-split", "op-evict-inner"])
def test_the_new_operation_mutants_are_refuted(name: str) -> None:
    m = ops.OP_MUTANTS[name]
    assert ops.refute_op(name) is not None
    assert not ops.op_breaks("op-inert-name", m.op, m.breaks)  # the unbroken operation keeps the row


def test_a_row_no_mutant_breaks_fails_the_cover(capsys: pytest.CaptureFixture[str]) -> None:
    rows = ops.cover_rows()
    broken = [f"{m.op} ({m.breaks})" for m in ops.OP_MUTANTS.values() if m.breaks != "INV-RADIX-ANCHOR"]
    found = cover_row(rows, broken + ops.also_broken(), "op MUTANTS-COVER")
    out = capsys.readouterr().out
    assert out.startswith("op MUTANTS-COVER") and "FAILED" in out and "INV-RADIX-ANCHOR" in out
    assert found and found[0].startswith("INV-RADIX-ANCHOR")
