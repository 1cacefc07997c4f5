"""``reference/smt/solving.py``: a z3 "sat" is a refutation only with a model that shows it.

The planted solver answers "sat" to every query and hands back a model of the
*negation* of its assertions (a model that violates the hypotheses or the
goal): a solver that lies the way z3 did on the vllm step binding's
lambda-built views. Every prover reading its answers through ``solving.check``
must then say "unknown", never "refuted" (the model shows nothing) and never
"proven" (no unsat was given)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import z3

from kvspec.reference.smt import solving

_REAL_CHECK = z3.Solver.check
_REAL_MODEL = z3.Solver.model


def _planted_check(self: z3.Solver, *assumptions: z3.ExprRef) -> z3.CheckSatResult:
    return z3.sat


def _planted_model(self: z3.Solver) -> z3.ModelRef:
    """A real model of "not every assertion": it violates the query it claims to satisfy."""
    t = z3.Solver(ctx=self.ctx)
    t.add(z3.Not(z3.And(list(self.assertions()) or [z3.BoolVal(True, self.ctx)])))
    assert _REAL_CHECK(t) == z3.sat
    return _REAL_MODEL(t)


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(z3.Solver, "check", _planted_check)
    monkeypatch.setattr(z3.Solver, "model", _planted_model)
    yield


def test_a_true_property_is_proven_and_a_false_one_refuted_with_its_model() -> None:
    x = z3.Int("x")
    s = z3.Solver()
    s.add(x > 2, z3.Not(x > 1))
    assert solving.check(s).verdict == "proven"
    s = z3.Solver()
    s.add(x > 2, z3.Not(x > 3))
    a = solving.check(s)
    assert a.verdict == "refuted" and a.model is not None and a.model.eval(x).as_long() == 3


def test_a_model_that_does_not_show_the_query_is_unknown(planted: None) -> None:
    x = z3.Int("x")
    for goal in (x > 1, x > 3):  # true and false alike: the planted answer says nothing
        s = z3.Solver()
        s.add(x > 2, z3.Not(goal))
        a = solving.check(s)
        assert a.unknown and a.model is None
        assert a.verdict == f"unknown ({solving.MODEL_NOT_SHOWN})"
    assert solving.decide([x > 2], z3.Not(x > 1), 1000).verdict == f"unknown ({solving.MODEL_NOT_SHOWN})"


def test_a_broken_model_is_retried_with_other_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the first answer is planted: the retry (a fresh solver, another seed) gives a real one."""
    calls: list[int] = []

    def once(self: z3.Solver, *assumptions: z3.ExprRef) -> z3.CheckSatResult:
        calls.append(1)
        return z3.sat if len(calls) == 1 else _REAL_CHECK(self, *assumptions)

    monkeypatch.setattr(z3.Solver, "check", once)
    monkeypatch.setattr(z3.Solver, "model", lambda self: _planted_model(self) if len(calls) == 1 else _REAL_MODEL(self))
    x = z3.Int("x")
    s = z3.Solver()
    s.add(x > 2, z3.Not(x > 1))
    assert solving.check(s).verdict == "proven" and len(calls) == 2


def test_a_timeout_says_after_how_long() -> None:
    a = solving.Answer(z3.unknown, reason="timeout after 2 s")
    assert a.verdict == "unknown (timeout after 2 s)" and a.kind == "unknown"


def test_session_and_paged_say_unknown_under_a_planted_answer(planted: None) -> None:
    from kvspec.reference.smt.managers import paged, session

    ok, broken = session.prove_session(3)
    for p in [*ok, *broken]:
        assert not p.proven and p.unknown and p.reason == solving.MODEL_NOT_SHOWN, p
    pok, pbroken = paged.prove_paged(paged.PagedBound())
    for q in [*pok, *pbroken]:
        assert not q.proven and q.unknown and q.counterexample is None, q


def test_block_vllm_radix_order_say_unknown_under_a_planted_answer(planted: None) -> None:
    from kvspec.reference.smt.blocks.catalogue import block_encoding
    from kvspec.reference.smt.blocks.encoding import prove as prove_blocks
    from kvspec.reference.smt.order.encoding import prove as prove_order
    from kvspec.reference.smt.radix.encoding import RadixBound
    from kvspec.reference.smt.radix.steps import prove_radix
    from kvspec.reference.smt.vllm import copies, ops

    verdicts = [p.verdict for p in prove_blocks(block_encoding("legacy"))]
    verdicts += [p.verdict for p in copies.prove_vllm()]
    verdicts += [p.verdict for p in ops.prove_ops() if p.transition in ("initial state", "deref(full)")]
    verdicts += [p.verdict for p in prove_radix(RadixBound(pages=3, handles=1))]
    verdicts += [p.verdict for p in prove_order("lru")]
    for v in verdicts:
        assert v.startswith("unknown") and v not in ("proven", "refuted"), v


def test_offload_prover_says_unknown_under_a_planted_answer(planted: None) -> None:
    from kvspec.reference.smt.offload.catalogue import TRANSITIONS
    from kvspec.reference.smt.prover import prove
    from kvspec.reference.smt.universe import Bound

    results = prove(Bound(slots=2, hashes=2), transitions=TRANSITIONS[:2])
    assert results
    for r in results:
        assert r.unknown and not r.proven and r.counterexample is None, r.verdict
        assert r.verdict == f"unknown ({solving.MODEL_NOT_SHOWN})"
