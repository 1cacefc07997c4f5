"""``kvspec prove --counterexamples DIR``: a refuted row's counterexample as a replay file.

A bug planted in the kvbm encoding (the mutant ``deref-partial-keeps-slot``:
a released partial block's slot is not given back) must yield a file of
operations from an empty cache that the reference model passes and the
Python model with the same bug (``adapters/mutants/partial_leaked_on_deref``)
fails under the rule the file names. A search too shallow to reach the
violation must say "induction only" instead of writing operations."""

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


@pytest.mark.parametrize("profile", ["paged", "vllm", "kvbm-offload"])
def test_the_option_is_a_usage_error_where_it_writes_nothing(profile: str, tmp_path: Path) -> None:
    assert prove_cli.main(["--profile", profile, "--counterexamples", str(tmp_path)]) == 2
    assert not list(tmp_path.iterdir())
