"""The vllm profile at operation level (``reference/smt/vllm/ops.py``):
a whole Use of any length with its assembled Removed and Stored (and the
Stored's parent), Deref, Promote, Reset; sanity on finite pools; mutants."""

from __future__ import annotations

import pytest
import z3

from kvspec.reference.smt.vllm import ops as ops


def test_every_property_is_proven_for_every_step_of_an_operation() -> None:
    proofs = ops.prove_ops()
    assert {p.verdict for p in proofs} == {"proven"}, [p for p in proofs if p.verdict != "proven"]
    props = {str(p.prop) for p in proofs}
    assert props == {
        "INV-VLLM-COPIES",
        "INV-VLLM-OWNER-SAFE",
        "PARENT-ANCHOR",
        "USE-CAPACITY",
        "USE-CAPACITY (never: stuck)",
    }
    for prop in ("INV-VLLM-COPIES", "PARENT-ANCHOR", "USE-CAPACITY"):
        steps = {p.transition for p in proofs if p.prop == prop}
        assert steps == {"initial state", *ops.TRANSITIONS}


def test_sanity_every_step_and_rule_guard_has_a_finite_model() -> None:
    assert ops.sanity() == []


def test_sanity_catches_a_narrowed_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A contract slipped into a step whose guard it does not change (a hit
    only on an owned copy) makes the VLLM-PREFIX-HIT case unreachable: the
    proofs still pass, the sanity check does not."""
    real = ops.hit

    def narrowed(pre: ops.VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> ops.VllmOpStep:
        step = real(pre, inp, tw)
        step.requires.append(pre.own[inp["b"]] >= 1)
        return step

    monkeypatch.setitem(ops.TRANSITIONS, "use(hit)", narrowed)
    assert {p.verdict for p in ops.prove_ops() if p.transition == "use(hit)"} == {"proven"}
    assert ops.sanity(only=("use(hit)",)) == ["vllm use(hit): rule VLLM-PREFIX-HIT never fires"]


@pytest.mark.parametrize(
    ("mutant", "where"),
    [
        ("parent-moves", "use(new) (PARENT-ANCHOR)"),
        ("store-new-only", "use(new) (INV-VLLM-COPIES)"),
        ("remove-last-only", "use(new) (INV-VLLM-COPIES)"),
        ("check-before-pins", "use(check) (USE-CAPACITY)"),
        ("contract-registered-only", "use(begin) (PARENT-ANCHOR)"),
        ("evict-ignores-owners", "use(new) (INV-VLLM-COPIES)"),
    ],
)
def test_each_operation_mutant_is_refuted_where_it_breaks(mutant: str, where: str) -> None:
    assert ops.refute(mutant) == where


@pytest.mark.parametrize(("mutant", "refuted"), [("evict-ignores-owners", True), (None, False)])
def test_owner_safety_alone_refutes_an_eviction_of_an_owned_copy(mutant: str | None, refuted: bool) -> None:
    """INV-VLLM-OWNER-SAFE by itself (not only through the copy counts) has a finite counterexample."""
    tw = frozenset({mutant}) if mutant else frozenset()

    def build(s: ops.VllmOpState) -> list:
        step, hyp = ops.base("use(new)", s, ops.inputs(), tw, "fi_")
        return [*hyp, z3.Not(ops.goal(ops.OWNER_SAFE, step))]

    assert (ops.finite_check(build) == z3.sat) is refuted


def test_prove_with_an_operation_mutant_shows_its_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.reference.smt.cli.prove import main

    assert main(["--profile", "vllm", "--mutant", "check-before-pins"]) == 1
    out = capsys.readouterr().out
    assert "NOT proven: USE-CAPACITY at use(check)" in out
    assert "counterexample (finite pool): use(check) (USE-CAPACITY)" in out


def test_prove_vllm_refuses_another_profiles_mutant(capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.reference.smt.cli.prove import main

    assert main(["--profile", "vllm", "--mutant", "no-pin"]) == 2
    assert "the vllm profile has no mutant 'no-pin'" in capsys.readouterr().err
    assert main(["--mutant", "parent-moves"]) == 2
    assert "parent-moves is a mutant of --profile vllm" in capsys.readouterr().err
