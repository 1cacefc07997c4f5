"""The radix profile at operation level (``reference/smt/radix/ops.py``):
every INV-RADIX-* kept by whole operations, each operation made of enabled
steps, its events right, every operation and case possible, every operation
mutant refuted. A small bound keeps it quick (the CLI runs the default)."""

from __future__ import annotations

import argparse
import re

import pytest
import z3

from kvspec.reference.smt.cli import prove as cli_prove
from kvspec.reference.smt.cli import radix as cli_radix
from kvspec.reference.smt.radix import operations as radix_operations
from kvspec.reference.smt.radix.encoding import INVARIANTS, ROOT, RadixBound, RState
from kvspec.reference.smt.radix.operations import OPERATIONS, OpBound, OpTransition
from kvspec.reference.smt.radix.ops import (
    EVENTS_ROW,
    OP_MUTANTS,
    STEPS_ROW,
    OpMutant,
    build,
    obligations,
    prove_ops,
    refute_op,
    sanity_ops,
)
from kvspec.reference.smt.radix.steps import MUTANTS

#: 4 page slots, 2 locks, keys of 2 pages, evictions of 2 nodes of 2 pages
SMALL = OpBound(pages=4, handles=2, key=2, batch=2, node=2)


def test_every_operation_keeps_every_invariant_with_its_steps_and_events() -> None:
    results = prove_ops(SMALL)
    rows = {str(i) for i in INVARIANTS} | {STEPS_ROW, EVENTS_ROW}
    assert {(r.op, r.property_id) for r in results} == {(o, p) for o in OPERATIONS for p in rows}
    assert [(r.op, r.property_id) for r in results if r.verdict != "proven"] == []


def test_every_operation_and_case_is_possible() -> None:
    assert sanity_ops(SMALL) == []


def test_a_narrowed_operation_fails_the_sanity_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """An insert quietly restricted to keys the tree has no page of still keeps
    every invariant; the case check is what notices."""
    real = radix_operations.op_insert

    def narrowed(S: RState, b: OpBound, tw: frozenset[str]) -> OpTransition:
        op = real(S, b, tw)
        op.requires.append(z3.Int("i_got") == 0)
        return op

    monkeypatch.setitem(radix_operations.OPERATIONS, "insert", narrowed)
    assert all(r.verdict == "proven" for r in prove_ops(SMALL, ops=("insert",)))
    found = sanity_ops(SMALL, ops=("insert",))
    assert "radix operation insert: the case 'everything cached: no Stored' is never possible" in found


@pytest.mark.parametrize("name", sorted(OP_MUTANTS))
def test_every_operation_mutant_is_refuted(name: str) -> None:
    m = OP_MUTANTS[name]
    text = refute_op(name, SMALL)
    assert text is not None, f"{name} not refuted"
    assert f"{m.breaks} fails after the operation {m.op}:" in text and "before:" in text and "after:" in text
    # the unbroken operation keeps that row from every state: the failure is the mutant's
    t = build(m.op, SMALL)
    s = z3.Solver()
    s.add(t.pre.cap >= 0, *radix_encoding_invariants(t.pre), *t.requires, z3.Not(obligations(t)[m.breaks]))
    assert s.check() == z3.unsat


def radix_encoding_invariants(S: RState) -> list[z3.BoolRef]:
    return [f(S) for f in INVARIANTS.values()]


def test_the_step_mutant_split_forgets_lock_is_also_a_step_mutant() -> None:
    """It breaks the split step the model's agreement replays, so it is caught there too."""
    assert MUTANTS["split-forgets-lock"].agreement and MUTANTS["split-forgets-lock"].step == "split"


def test_the_stored_parent_is_the_page_the_leaf_hangs_under() -> None:
    """A concrete insert: a key of two pages whose first is cached under the root
    hangs one page under it; the Stored's parent row pins that page."""
    t = build("insert", SMALL)
    S = t.pre
    s = z3.Solver()
    s.add(S.cap >= 0, *radix_encoding_invariants(S), *t.requires)
    s.add(z3.Int("i_len") == 2, z3.Int("i_got") == 1, z3.Sum([z3.If(x, 1, 0) for x in S.live]) == 1)
    assert s.check() == z3.sat
    m = s.model()
    w1, q2 = m.eval(z3.Int("i_w1")).as_long(), m.eval(z3.Int("i_q2")).as_long()
    assert m.eval(S.pp[w1]).as_long() == ROOT
    assert m.eval(t.post.pp[q2]).as_long() == w1 and z3.is_true(m.eval(t.post.live[q2]))
    assert m.eval(t.post.pub[q2]).as_long() == 1 and m.eval(t.post.pub[w1]).as_long() == 1


# ``kvspec prove --profile radix --mutant M`` for the operation mutants: the
# operation's rows, the sanity check and the counterexample, all at SMALL (the
# CLI reads cli_radix.OP_BOUND at call time; its default is DEFAULT_OP_BOUND).


def test_cli_accepts_every_operation_mutant_with_the_radix_profile() -> None:
    p = argparse.ArgumentParser()
    cli_prove.add_arguments(p)
    for name in OP_MUTANTS:
        assert p.parse_args(["--profile", "radix", "--mutant", name]).mutant == name
    assert set(OP_MUTANTS) <= set(cli_radix.ALL_MUTANTS)


def test_cli_runs_an_operation_mutant_and_prints_its_counterexample(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_radix, "OP_BOUND", SMALL)
    assert cli_prove.main(["--profile", "radix", "--mutant", "op-batch-evicts-locked"]) == 1
    out = capsys.readouterr().out
    assert "MUTANT op-batch-evicts-locked (operation level)" in out
    assert re.search(r"^INV-RADIX-LOCKS +refuted +evict", out, re.M)
    assert re.search(r"^INV-RADIX-TREE +proven +evict", out, re.M)
    assert re.search(r"^SANITY-RADIX-OPS +ok", out, re.M)
    assert "INV-RADIX-LOCKS fails after the operation evict:" in out and "before:" in out and "after:" in out
    # and from the empty cache: an insert, a lock that splits its node, the eviction of both nodes
    reach = "reachable: from the initial state (4 pages, 2 locks, keys of 2 pages, evictions of 2 nodes of 2 pages)"
    assert f"{reach}, 3 operations, the last breaks INV-RADIX-LOCKS:" in out
    assert re.search(r"^  3\. evict\(.*x_nodes=2", out, re.M)


def test_cli_exits_0_when_the_operation_mutant_is_not_caught(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mutant name no operation reads leaves every row proven: no counterexample, exit 0."""
    monkeypatch.setitem(OP_MUTANTS, "op-inert", OpMutant("op-inert", "RADIX-LOCK", "unlock", "INV-RADIX-LOCKS", "none"))
    assert cli_radix.run_op_mutant("op-inert", SMALL) == 0
    assert "no counterexample to INV-RADIX-LOCKS at unlock" in capsys.readouterr().out


def test_cli_refuses_an_operation_mutant_without_the_radix_profile_or_unbounded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_prove.main(["--mutant", "op-stored-parent-none"]) == 2
    assert "op-stored-parent-none is a mutant of --profile radix" in capsys.readouterr().err
    assert cli_prove.main(["--profile", "vllm", "--mutant", "op-stored-parent-none"]) == 2
    assert "the vllm profile has no mutant 'op-stored-parent-none'" in capsys.readouterr().err
    assert cli_prove.main(["--profile", "radix", "--unbounded", "--mutant", "op-stored-parent-none"]) == 2
    assert "encoded in a bounded universe only" in capsys.readouterr().err
    assert cli_radix.run_op_mutant("evict-locked", SMALL) == 2
    assert "the radix profile has no mutant 'evict-locked'" in capsys.readouterr().err


def test_cli_runs_a_step_and_operation_mutant_at_both_levels(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """split-forgets-lock breaks the split step and so the lock operation: both levels report it."""
    monkeypatch.setattr(cli_radix, "OP_BOUND", SMALL)
    assert cli_radix.run_radix("split-forgets-lock", bound=RadixBound(pages=4, handles=2)) == 1
    out = capsys.readouterr().out
    assert "INV-RADIX-LOCKS fails after split(" in out
    assert "INV-RADIX-LOCKS fails after the operation lock:" in out
