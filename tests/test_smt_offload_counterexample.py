"""kvbm-offload ``--counterexamples``: an operation mutant's trace from the empty cache as a replay file.

The operation mutants (``offload/op_mutants.py``) are bugs of the encoding
that no adapter has. Their search (``offload/counterexample.py``) runs the
operation-level encoding with the model's choices from the empty cache; the
trace read back as wire operations must replay on the reference (a run of the
rules as written), and the operation encoding with the mutant in force must
depart from ``G1Model`` at the operation the file records, while the
unmutated one agrees on every operation. A step-only mutant keeps the step
trace and says why. The mutants are reachable by name from ``kvspec prove``
and counted by ``kvspec equivalence --campaign``; an unknown name is a usage
error."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvspec.conformance.commands.replay import replay
from kvspec.conformance.run.manifest import load_impl
from kvspec.conformance.verdicts.replay_file import load_replay
from kvspec.reference.smt.cli import prove as prove_cli
from kvspec.reference.smt.offload.agreement.sampled import Universe
from kvspec.reference.smt.offload.counterexample import divergence, emit, operations
from kvspec.reference.smt.offload.op_mutants import OP_MUTANTS, OffloadOpMutant
from kvspec.reference.smt.reach import ReachStep, ReachTrace
from kvspec.spec.wire import Deref, FullBlock, Operation, PartialBlock, Promote, SwapIn, Tick, Use


def _op(name: str) -> OffloadOpMutant:
    return next(m for m in OP_MUTANTS if m.name == name)


@pytest.mark.parametrize("name", ["op:use-removes-stored", "op:partial-allocated-again"])
def test_an_operation_mutant_replays_on_the_reference_and_departs_where_the_file_says(
    tmp_path: Path, name: str
) -> None:
    m = _op(name)
    lines = emit(tmp_path, m)
    assert lines[0].startswith("reachable: from the empty cache"), lines
    rf = load_replay(tmp_path / f"kvbm-offload-{name.replace(':', '-')}.jsonl")
    assert rf.failure is not None and rf.failure["rule"] == str(m.rule)
    assert "an encoding bug no adapter has" in rf.failure["what"]
    assert rf.target is not None and rf.target.impl == "adapters/reference"
    assert rf.config.offload is not None and rf.config.capacity == 3
    # the operations are a run of the rules as written: the reference passes them
    ref_dir, ref = load_impl("adapters/reference")
    assert replay(rf, ref_dir, manifest=ref).passed
    # the unmutated operation encoding agrees with the model on every one; with the mutant it
    # departs at the last operation, the one the file records as its failure
    u = Universe(slots=rf.config.capacity, par=_forest(rf.ops), cap2=rf.config.offload.num_g2_blocks, policy="lru")
    assert divergence(rf.ops, u, None) is None
    found = divergence(rf.ops, u, m)
    assert found is not None and found[0] == rf.failure["step"] == len(rf.ops) - 1
    assert any(f"departs from the model at operation {found[0]}" in line for line in lines), lines


def _forest(ops: list[Operation]) -> tuple[int, ...]:
    """The hash forest the file's blocks carry (their lineage hashes' parents), -1 for a root."""
    par = [-1, -1, -1, -1]
    for op in ops:
        plhs = op.plhs if isinstance(op, Use) else [op.plh] if isinstance(op, Promote) else []
        plhs += [b.plh for b in op.blocks] if isinstance(op, SwapIn) else []
        for plh in plhs:
            par[plh.hash] = -1 if plh.parent is None else plh.parent
    return tuple(par)


def test_a_trace_reads_back_as_wire_operations() -> None:
    u = Universe(slots=3, par=(-1, 0, 1, -1), cap2=2, policy="lru")
    steps = [
        ReachStep("use[FP]", {"op_h0": 1, "op_u1": 2, "op_parent": 0}),
        ReachStep("deref[PF]", {"op_u0": 2, "op_h1": 1}),
        ReachStep("tick", {}),
        ReachStep("promote", {"op_u": 0, "op_h": 2, "op_p": -1}),
        ReachStep("swap_in[FF]", {"op_h0": 1, "op_h1": 2, "op_parent": -1}),
        ReachStep("tick", {}),
    ]
    use, deref, tick, promote, swap, tick2 = operations(ReachTrace(steps), u)
    assert isinstance(use, Use) and use.blocks == [FullBlock(full=1), PartialBlock(partial="u2")]
    assert use.parent == FullBlock(full=0) and [(p.hash, p.parent, p.position) for p in use.plhs] == [(1, 0, 1)]
    assert deref == Deref(blocks=[PartialBlock(partial="u2"), FullBlock(full=1)])
    assert isinstance(promote, Promote) and (promote.uuid, promote.seq_hash, promote.parent_hash) == ("u0", 2, None)
    assert promote.plh.parent == 1  # the lineage hash is the forest's; the recorded parent the caller's
    assert isinstance(swap, SwapIn) and [b.seq_hash for b in swap.blocks] == [1, 2] and swap.parent is None
    # each Tick goes forward: the k-th at now_ms = k
    assert isinstance(tick, Tick) and isinstance(tick2, Tick) and (tick.now_ms, tick2.now_ms) == (1.0, 2.0)


@pytest.mark.slow  # about 4 s of CPU (the operation proofs of one mutant, then its search), 8-37 s wall under load
def test_prove_runs_an_operation_mutant_by_name_and_writes_its_replay_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = prove_cli.main(
        ["--profile", "kvbm-offload", "--mutant", "op:use-parent-own-block", "--counterexamples", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert code == 1, out  # caught
    assert "MUTANT op:use-parent-own-block" in out and "INV-ANCHOR not kept by the operation" in out
    rf = load_replay(tmp_path / "kvbm-offload-op-use-parent-own-block.jsonl")
    assert rf.failure is not None and rf.failure["rule"] == "PARENT-ANCHOR"
    assert "kvspec replay" in out and "against the reference model: passes" in out
    # every operation mutant is a choice of --mutant, listed under kvbm-offload
    assert {m.name for m in OP_MUTANTS} <= set(prove_cli.mutants_by_profile()["kvbm-offload"])
    assert len(OP_MUTANTS) == 14


def test_an_unknown_or_misapplied_mutant_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        prove_cli.main(["--profile", "kvbm-offload", "--mutant", "op:no-such-mutant"])
    assert e.value.code == 2
    assert "op:no-such-mutant" in capsys.readouterr().err
    # an operation mutant runs the operation-level proofs: a step-level option is refused
    assert prove_cli.main(["--profile", "kvbm-offload", "--mutant", "op:use-removes-stored", "--slots", "4"]) == 2
    assert "--slots does not apply to an operation mutant" in capsys.readouterr().err
    assert prove_cli.main(["--profile", "kvbm-offload", "--mutant", "op:use-removes-stored", "--unbounded"]) == 2
    # another profile has no operation mutants of kvbm-offload
    assert prove_cli.main(["--profile", "kvbm", "--mutant", "op:use-removes-stored"]) == 2


def test_a_step_mutant_with_an_operation_version_is_written_as_a_replay_file(tmp_path: Path) -> None:
    from kvspec.reference.smt.cli.offload import write_counterexample
    from kvspec.reference.smt.offload.invariants import by_id
    from kvspec.reference.smt.offload.mutants import mutant

    m = mutant("partial-allocated-again")
    write_counterexample(tmp_path, m, by_id(str(m.expect)))
    assert [p.name for p in tmp_path.iterdir()] == ["kvbm-offload-partial-allocated-again.jsonl"]
    rf = load_replay(tmp_path / "kvbm-offload-partial-allocated-again.jsonl")
    assert rf.failure is not None and rf.failure["rule"] == str(m.rule)


def test_the_campaign_kills_an_operation_mutant() -> None:
    from kvspec.reference.smt.cli.equivalence import BOUNDS
    from kvspec.reference.smt.equivalence import explore
    from kvspec.spec.registry import KVBM_OFFLOAD

    b = BOUNDS[KVBM_OFFLOAD]
    assert {m.name for m in OP_MUTANTS if not m.name.startswith("op:contract:")} <= set(b.mutants())
    rep = explore(b.build("op:use-removes-stored", None), 1)
    assert rep.differences, "the exhaustive walk must see a Use whose Removed names its stored blocks"
    [d] = rep.differences
    assert not d.trace and isinstance(d.op, Use)  # the first Use that stores: its Removed is the bug


def test_a_step_only_mutant_keeps_its_step_trace_and_says_why(tmp_path: Path) -> None:
    from kvspec.reference.smt.cli.offload import write_counterexample
    from kvspec.reference.smt.offload.invariants import by_id
    from kvspec.reference.smt.offload.mutants import mutant
    from kvspec.reference.smt.offload.op_mutants import op_twin

    m = mutant("evict-active")  # a broken part swapped into evict's own arguments: no operation version
    assert op_twin(m) is None
    write_counterexample(tmp_path, m, by_id(str(m.expect)))
    assert [p.name for p in tmp_path.iterdir()] == ["kvbm-offload-evict-active.txt"]
    text = (tmp_path / "kvbm-offload-evict-active.txt").read_text()
    assert "reachable: from the initial state (3 slots, 4 hashes" in text and "breaks INV-CONSERVE" in text
    assert "evict(" in text and "not a replay file" in text
    assert "evict-active is a step-only mutant: it swaps a broken part into a transition's own arguments" in text


@pytest.mark.slow  # two mutants' operation proofs and one search: about 4 s of CPU, 28 s wall at load 10
def test_the_operation_refutes_rows_write_a_whole_operation_bugs_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ``refutes`` row of a bug of whole operations (no step version) writes its replay file;
    a step mutant's operation version is left to the step rows (not written twice)."""
    from kvspec.reference.smt.cli.operations import mutant_rows
    from kvspec.reference.smt.offload import op_mutants

    one = [_op("op:use-parent-own-block"), _op("op:free-counter-stuck")]
    monkeypatch.setattr(op_mutants, "OP_MUTANTS", one)
    rows: list[list[str]] = []
    mutant_rows(rows.append, tmp_path)
    assert [r[1] for r in rows[:2]] == ["refuted", "refuted"]
    assert [p.name for p in tmp_path.iterdir()] == ["kvbm-offload-op-use-parent-own-block.jsonl"]
    assert "against the reference model: passes" in capsys.readouterr().out


@pytest.mark.slow  # one mutant's operation proofs at 3 slots, 4 hashes: 5-10 s of CPU
def test_the_campaign_asks_prove_first_for_an_operation_mutant(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug the depth-3 walk cannot reach (it needs an offload completed: 5 operations) is killed by
    its operation row, asked before the walk, and counted in the kill rate."""
    import dataclasses

    from kvspec.reference.smt.cli import equivalence as eq
    from kvspec.spec.registry import KVBM_OFFLOAD

    b = eq.BOUNDS[KVBM_OFFLOAD]
    assert b.prove_first("op:g2-keeps-victim") and not b.prove_first("promote-parent-none")
    one = dataclasses.replace(b, mutants=lambda: ["op:g2-keeps-victim"])
    monkeypatch.setitem(eq.BOUNDS, KVBM_OFFLOAD, one)
    assert eq.campaign([KVBM_OFFLOAD], None) == 0
    out = capsys.readouterr().out
    assert "op:g2-keeps-victim" in out and "killed    prove (refuted at operation row LEMMA-G2-CAPACITY)" in out
    assert "kill rate: 1/1 (100%)" in out
