"""``kvspec prove --counterexamples DIR``: a refuted row's counterexample as a replay file.

A bug planted in the kvbm encoding (the mutant ``deref-partial-keeps-slot``:
a released partial block's slot is not given back) must yield a file of
operations from an empty cache that the reference model passes and the
Python model with the same bug (``adapters/mutants/partial_leaked_on_deref``)
fails under the rule the file names. A search too shallow to reach the
violation must say "induction only" instead of writing operations. The
profiles whose traces are not block-level wire operations (paged, session,
radix, kvbm-offload) write the trace and say why it is no replay file; so does
vllm's step level, while its operation-level mutants are replay files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvspec.conformance.commands.replay import replay
from kvspec.conformance.run.manifest import load_impl
from kvspec.conformance.verdicts.replay_file import load_replay
from kvspec.reference.smt.blocks.catalogue import block_encoding
from kvspec.reference.smt.blocks.counterexample import emit, operations
from kvspec.reference.smt.cli import prove as prove_cli
from kvspec.reference.smt.reach import ReachStep, ReachTrace
from kvspec.spec.wire import Deref, FullBlock, PartialBlock, Use


def test_planted_bug_replays_on_the_model_under_its_rule(tmp_path: Path) -> None:
    prof = block_encoding("kvbm")
    rule, what = prof.mutants["deref-partial-keeps-slot"]
    lines = emit(tmp_path, prof, "deref-partial-keeps-slot", rule, what)
    assert lines[0].startswith("reachable:"), lines
    rf = load_replay(tmp_path / "kvbm-deref-partial-keeps-slot.jsonl")
    assert rf.failure is not None and rf.failure["rule"] == "DEREF-PARTIAL"
    assert any(isinstance(op, Deref) for op in rf.ops)
    # the file records the model with the same bug, and replaying it there breaks the same rule
    assert rf.target is not None and rf.target.variant == "partial_leaked_on_deref"
    twin_dir, twin = load_impl(rf.target.impl_option())
    broken = replay(rf, twin_dir, manifest=twin)
    assert not broken.passed and broken.failure is not None
    assert str(broken.failure.rule) == rf.failure["rule"]
    # the operations are a valid run of the rules as written: the reference passes them
    ref_dir, ref = load_impl("adapters/reference")
    assert replay(rf, ref_dir, manifest=ref).passed


def test_too_shallow_a_search_says_induction_only(tmp_path: Path) -> None:
    prof = block_encoding("kvbm")
    rule, what = prof.mutants["deref-partial-keeps-slot"]
    # the violation needs 4 steps; the model-guided stage is left out (it would find them)
    lines = emit(tmp_path, prof, "deref-partial-keeps-slot", rule, what, depth=3, guide=False)
    assert "induction only" in lines[0] and "no trace of up to 3 steps" in lines[0]
    assert not list(tmp_path.glob("*.jsonl"))
    assert "induction only" in (tmp_path / "kvbm-deref-partial-keeps-slot.txt").read_text()


def test_trace_reads_back_as_operations() -> None:
    steps = [
        ReachStep("use(begin)", {"p": 1}),
        ReachStep("use(declare full)", {"h": 2}),
        ReachStep("use(declare partial)", {"u": 0}),
        ReachStep("use(check)", {}),
        ReachStep("use(place full)", {"h": 2}),
        ReachStep("use(close)", {}),
        ReachStep("deref(full)", {"h": 2}),
    ]
    # atomic: the declares are the Use's blocks (the second was never placed), the parent is the caller's
    [use, deref] = operations("atomic", ReachTrace(steps))
    assert isinstance(use, Use) and use.blocks == [FullBlock(full=2), PartialBlock(partial="u0")]
    assert use.parent == FullBlock(full=1)
    assert deref == Deref(blocks=[FullBlock(full=2)])
    # kvbm ignores the parent in its encoding: its Use names none; a trace that ends inside a Use is closed there
    [kuse] = operations("kvbm", ReachTrace([ReachStep("use(begin)", {"p": 1}), ReachStep("use(full)", {"h": 0})]))
    assert isinstance(kuse, Use) and kuse.parent is None and kuse.blocks == [FullBlock(full=0)]


def test_an_allocator_profile_writes_its_trace_and_says_it_is_no_replay_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """session: the refuted row (the release that keeps the generation) is reached from the initial
    state; its trace is written, with why it is not a replay file (allocator operations)."""
    assert prove_cli.main(["--profile", "session", "--counterexamples", str(tmp_path)]) == 0
    text = (tmp_path / "session-release-same-gen.txt").read_text()
    assert "reachable: from the initial state (3 slots)" in text and "breaks INV-SESSION-FENCE" in text
    assert "release (finalize, reset)" in text
    assert "not a replay file: session is an allocator-level profile" in text
    assert not list(tmp_path.glob("*.jsonl"))
    assert "session-release-same-gen.txt" in capsys.readouterr().out


def test_each_refuted_paged_seed_gets_its_file(tmp_path: Path) -> None:
    assert prove_cli.main(["--profile", "paged", "--counterexamples", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["paged-seed-extend-copy.txt", "paged-seed-swap-out.txt"]
    for p in tmp_path.iterdir():
        assert "reachable: from the initial state" in p.read_text() and "INV-PAGED-REFS" in p.read_text()


def test_the_statement_says_induction_only_unknown_or_not_searched(tmp_path: Path) -> None:
    from kvspec.reference.smt import counterexamples as cx

    common = {"rule": "R", "what": "w", "bound": "3 slots", "trace": None}
    cx.trace_statement(tmp_path, "paged", "a", depth=6, **common)  # type: ignore[arg-type]
    assert "induction only: no trace of up to 6 steps" in (tmp_path / "a.txt").read_text()
    cx.trace_statement(tmp_path, "paged", "b", depth=6, why=["timeout after 30 s"], **common)  # type: ignore[arg-type]
    assert "unknown (timeout after 30 s)" in (tmp_path / "b.txt").read_text()
    cx.trace_statement(tmp_path, "vllm", "c", depth=None, **common)  # type: ignore[arg-type]
    text = (tmp_path / "c.txt").read_text()
    assert "unknown (not searched)" in text and "reachable" not in text


def test_vllm_writes_a_step_mutant_as_text_and_an_operation_one_as_a_replay_file(tmp_path: Path) -> None:
    from kvspec.reference.smt.cli.profiles import _vllm_statement

    _vllm_statement(tmp_path, "reset-without-clear")  # step level only: its trace is not wire operations
    text = (tmp_path / "vllm-reset-without-clear.txt").read_text()
    assert "reachable: from the initial state (2 blocks, hashes 0..1)" in text and "breaks INV-VLLM-COPIES" in text
    assert "not a replay file" in text
    _vllm_statement(tmp_path, "parent-moves")  # operation level: a replay file
    assert not (tmp_path / "vllm-parent-moves.txt").exists()
    rf = load_replay(tmp_path / "vllm-parent-moves.jsonl")
    assert rf.failure is not None and rf.failure["rule"] == "PARENT-ANCHOR"
    assert rf.target is not None and rf.target.impl == "adapters/reference"


def test_a_vllm_operation_mutant_is_reached_from_the_empty_pool() -> None:
    """The operation-level search (its quantifiers expanded, a close's Lambda included) finds the
    planted bug's trace from the initial state: a Use whose Stored's parent moves with the batch."""
    import z3

    from kvspec.reference.smt.vllm.counterexample import broken, find
    from kvspec.reference.smt.vllm.reach import op_system

    trace, verdict = find(frozenset({"parent-moves"}), depth=4)
    assert verdict == z3.sat and trace is not None
    assert trace.steps[0].transition == "use(begin)" and trace.steps[-1].transition == "use(new)"
    # the rules as written: the same search finds nothing (every operation-level row is proven)
    none, verdict = find(frozenset(), depth=4)
    assert none is None and verdict == z3.unsat
    # the last step breaks a row: pinned, the unmutated encoding keeps them all
    from kvspec.reference.smt import solving
    from kvspec.reference.smt.reach import _Unrolling

    for tw, want in ((frozenset({"parent-moves"}), True), (frozenset(), False)):
        s = z3.Solver()
        u = _Unrolling(op_system(tw), s)
        u.pin(trace)
        last = trace.steps[-1].transition
        got = solving.check(s, broken(last, u.moves[len(trace) - 1][last])).model is not None
        assert got == want, tw


def test_a_lambda_is_not_expanded_as_a_quantifier() -> None:
    import z3

    from kvspec.reference.smt.unbounded.models import _expand

    x, a = z3.Int("x"), z3.Array("a", z3.IntSort(), z3.IntSort())
    lam = z3.Lambda([x], a[x] + 1)
    ints = [z3.IntVal(i) for i in range(3)]
    h = z3.Int("h")
    flat = _expand(z3.ForAll([h], lam[h] >= a[h]), [], ints, {})  # was: an Or of Ints, a sort mismatch
    assert not z3.is_quantifier(flat)
    s = z3.Solver()
    s.add(z3.Not(flat))
    assert s.check() == z3.unsat
    pred = z3.Lambda([x], x > 5)  # a Bool lambda: once read as "exists x. x > 5", i.e. true
    kept = _expand(pred == z3.K(z3.IntSort(), z3.BoolVal(True)), [], ints, {})
    s = z3.Solver()
    s.add(kept)
    assert s.check() == z3.unsat


def test_a_vllm_trace_reads_back_as_operations() -> None:
    from kvspec.reference.smt.vllm.counterexample import operations
    from kvspec.spec.wire import Promote, Reset

    steps = [
        ReachStep("use(begin)", {"p": -1, "F": 2}),
        ReachStep("use(check)", {"h": 1}),
        ReachStep("use(partial)", {"b": 0}),
        ReachStep("use(new)", {"h": 1, "b": 1}),
        ReachStep("use(close)", {}),
        ReachStep("promote", {"b": 0, "h": 0, "p": 1}),
        ReachStep("deref(full)", {"b": 1}),
        ReachStep("deref(promoted)", {"b": 0}),
        ReachStep("reset", {}),
        ReachStep("use(begin)", {"p": 0}),
        ReachStep("use(hit)", {"h": 0, "b": 0}),
    ]
    use, promote, deref, deref2, reset, use2 = operations(ReachTrace(steps))
    # the full blocks first, then the partial one (its own uuid); no parent
    assert isinstance(use, Use) and use.blocks == [FullBlock(full=1), PartialBlock(partial="u0")]
    assert use.parent is None and [p.hash for p in use.plhs] == [1]
    assert isinstance(promote, Promote) and (promote.uuid, promote.seq_hash, promote.parent_hash) == ("u0", 0, 1)
    assert deref == Deref(blocks=[FullBlock(full=1)])  # block 1 caches hash 1
    assert deref2 == Deref(blocks=[PartialBlock(partial="u0")])  # a promoted block is released by its uuid
    assert isinstance(reset, Reset)
    # a trace that ends inside a Use is closed there
    assert isinstance(use2, Use) and use2.blocks == [FullBlock(full=0)] and use2.parent == FullBlock(full=0)


def test_a_vllm_use_cut_at_its_check_is_read_with_its_fresh_blocks() -> None:
    """A trace that ends at a Use's capacity check gets the Use's fresh blocks as ``F`` says:
    the full block the check names, then partial blocks of fresh uuids."""
    from kvspec.reference.smt.vllm.counterexample import operations

    steps = [
        ReachStep("use(begin)", {"p": -1, "F": 1}),
        ReachStep("use(check)", {"h": -1}),
        ReachStep("use(partial)", {"b": 0}),
        ReachStep("use(close)", {}),
        ReachStep("use(begin)", {"p": -1, "F": 3}),
        ReachStep("use(hit)", {"h": 0, "b": 1}),
        ReachStep("use(check)", {"h": 1}),
    ]
    _first, cut = operations(ReachTrace(steps))
    assert isinstance(cut, Use)
    assert cut.blocks == [FullBlock(full=0), FullBlock(full=1), PartialBlock(partial="u1"), PartialBlock(partial="u2")]


@pytest.mark.slow  # about 6 s of CPU: the guided search over every scenario
def test_check_before_pins_is_reached_from_the_empty_pool() -> None:
    """The mutant breaks USE-CAPACITY only at a check after a hit pins the last unowned copy, so
    no whole scenario of ``OP_GUIDE`` shows it (the Use cannot close); ``cx_guide`` ends there. The
    operations are a run of the rules as written; the mutated encoding departs at the last Use,
    which the model refuses for capacity."""
    from kvspec.reference.smt.vllm.counterexample import divergence, guided, operations

    tw = frozenset({"check-before-pins"})
    trace = guided(tw)
    assert trace is not None and trace.steps[-1].transition == "use(check)"
    assert [s.transition for s in trace.steps].count("use(hit)") >= 1
    ops = operations(trace)
    assert divergence(ops, frozenset()) is None
    found = divergence(ops, tw)
    assert found is not None and found[0] == len(ops) - 1 and "refused" in found[1], found


def test_a_vllm_replay_file_passes_on_the_reference_and_names_where_the_mutant_departs(tmp_path: Path) -> None:
    """An encoding mutant has no twin in the model: the file replays the operations on the
    reference (they are a run of the rules as written) and the lines name the operation at
    which the mutated encoding departs from the model; the unmutated one never does."""
    from kvspec.reference.smt.vllm import ops as vops
    from kvspec.reference.smt.vllm.counterexample import divergence, emit

    rule, what = vops.MUTANTS["store-new-only"]
    lines = emit(tmp_path, "store-new-only", str(rule), what)
    assert lines[0].startswith("reachable: from the empty pool"), lines
    assert any("departs from the model at operation 0" in line and "router 1" in line for line in lines), lines
    rf = load_replay(tmp_path / "vllm-store-new-only.jsonl")
    assert rf.failure is not None and rf.failure["rule"] == "STORE-COPY"
    [use] = rf.ops
    assert isinstance(use, Use) and len(use.blocks) == 2 and use.blocks[0] == use.blocks[1]
    ref_dir, ref = load_impl("adapters/reference")
    assert replay(rf, ref_dir, manifest=ref).passed
    assert divergence(rf.ops, frozenset()) is None
    found = divergence(rf.ops, frozenset({"store-new-only"}))
    assert found is not None and found[0] == 0


def test_the_option_is_a_usage_error_at_the_unbounded_level(tmp_path: Path) -> None:
    assert prove_cli.main(["--profile", "radix", "--unbounded", "--counterexamples", str(tmp_path)]) == 2
    assert not list(tmp_path.iterdir())
