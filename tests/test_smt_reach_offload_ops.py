"""REACHABLE for kvbm-offload at operation level: every operation variant, outcome and pair.

``offload/op_reach.py`` makes each whole operation of the model (a Use or
Deref of every batch shape up to 2 blocks, Promote, SwapIn, each Tick unit)
a transition; its traces are recorded offline (``scripts/gen_reach_traces.py``:
a shallow search, then the guide's sequences of operations) and ``kvspec
prove`` checks them again pinned. A contract planted on the Use ("no slot is
reserved": it removes no outcome of the Use, only every state where a SwapIn
waits) makes the row fail, naming the Use and the pair it removes."""

from __future__ import annotations

from typing import Any

import pytest
import z3

from kvspec.reference.smt import reach_recordings
from kvspec.reference.smt.cli import operations
from kvspec.reference.smt.offload import op_reach
from kvspec.reference.smt.offload.ops import OpOutcome, UseOp
from kvspec.reference.smt.universe import RESERVED

KEY = "kvbm-offload-operation"


def _no_reserved_slot(real: Any) -> Any:
    def apply(S: Any, op: Any, ch: Any, concrete: bool = False) -> OpOutcome:
        out: OpOutcome = real(S, op, ch, concrete)
        if isinstance(op, UseOp):
            out.contracts = {**out.contracts, "ASSUME-NO-RESERVED": z3.And([S.st[k] != RESERVED for k in S.slots])}
        return out

    return apply


def test_the_recorded_traces_reach_every_case() -> None:
    chk = reach_recordings.check(KEY)
    assert chk.problems == []
    assert chk.reached == chk.goals > 300


@pytest.mark.slow
def test_a_contract_on_the_use_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(op_reach, "apply_op", _no_reserved_slot(op_reach.apply_op))
    rows: list[list[str]] = []
    found = operations.reach_row(rows.append)  # the row kvspec prove prints at operation level
    assert rows[0][:2] == ["operation: REACHABLE", "FAILED"]
    named = [p for p in found if p.startswith("kvbm-offload operation: use[F]:")]
    assert named and "with tick(swap_in job) enabled" in named[0]
