"""One way to read z3's answer, for every proof, refutation and witness of ``reference/smt``.

z3's "unsat" is a proof; its "sat" is only as good as the model it comes
with. z3 has answered "sat" for obligations over lambda-built arrays with a
model in which the query does not even evaluate to true (seen in a CI worker
on the vllm step binding, and reproduced with a fresh ``z3.Context``). Taken
on trust, such an answer prints "refuted" for a true property, a
counterexample that is none, or a sanity witness for a case that never
happens. So every check-sat site asks ``check``:

- **unsat**: proven (the negated goal has no model);
- **sat**: only when the model, evaluated with model completion, makes every
  assertion of the solver (the hypotheses and the negated goal) and every
  assumption true. A model that does not is retried with other random seeds
  (a fresh solver each, the same assertions): another seed usually answers
  with a real model at once;
- **unknown** otherwise, with the reason: ``timeout after N s`` (z3 ran out of
  time), ``z3 model does not show the violation`` (no seed gave a model that
  satisfies the query), or z3's own reason (incomplete quantifiers, ...).

``Answer.verdict`` is the word the rows print: ``proven``, ``refuted`` or
``unknown (REASON)``; ``Answer.result`` is z3's ``CheckSatResult`` with a sat
whose model does not show it turned into ``unknown``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import z3

#: Seeds tried, in order, when a sat's model does not show the query (and, with
#: ``retry_unknown``, when z3 gives up). z3's search on array and lambda terms depends on term
#: order, which depends on everything the process built before, so one query can stall or
#: answer with a broken model in one process and answer properly in the next; another seed
#: usually does at once.
RETRY_SEEDS = (1, 3, 7)

MODEL_NOT_SHOWN = "z3 model does not show the violation"

Verdict = Literal["proven", "refuted", "unknown"]


@dataclass(frozen=True)
class Answer:
    """z3's answer to one query, a sat kept only with a model that shows it."""

    result: z3.CheckSatResult
    model: z3.ModelRef | None = None
    #: why the answer is unknown: "timeout after N s", MODEL_NOT_SHOWN, or z3's reason
    reason: str = ""

    @property
    def sat(self) -> bool:
        return self.result == z3.sat

    @property
    def unsat(self) -> bool:
        return self.result == z3.unsat

    @property
    def unknown(self) -> bool:
        return self.result == z3.unknown

    @property
    def kind(self) -> Verdict:
        return "proven" if self.unsat else "refuted" if self.sat else "unknown"

    @property
    def verdict(self) -> str:
        """``proven`` | ``refuted`` | ``unknown (REASON)``: as the rows print it."""
        return self.kind if not self.unknown else f"unknown ({self.reason or 'the solver gave up'})"


def shows(model: z3.ModelRef, formulas: list[z3.BoolRef]) -> bool:
    """``model`` makes every formula true, unknowns completed with defaults."""
    return all(z3.is_true(model.eval(f, model_completion=True)) for f in formulas)


def _reason(s: z3.Solver, timeout_ms: int | None) -> str:
    why = s.reason_unknown()
    if why in ("timeout", "canceled") and timeout_ms:
        return f"timeout after {timeout_ms / 1000:g} s"
    return why or "the solver gave up"


def check(
    s: z3.Solver,
    *assumptions: z3.BoolRef,
    timeout_ms: int | None = None,
    seeds: tuple[int, ...] = RETRY_SEEDS,
    retry_unknown: bool = False,
) -> Answer:
    """Check ``s`` (under ``assumptions``) and keep a sat only with a model that shows it.

    ``timeout_ms`` is the per-attempt limit of the retries (fresh solvers) and the figure an
    unknown's reason names; ``s`` itself keeps the timeout its caller set. With
    ``retry_unknown`` an unknown is retried with the seeds too (a portfolio: callers that do so
    give each attempt a share of their budget)."""
    r = s.check(*assumptions)
    if r == z3.unsat:
        return Answer(z3.unsat)
    if r == z3.sat:
        m = s.model()
        query = [*s.assertions(), *assumptions]
        if shows(m, query):
            return Answer(z3.sat, m)
        why = MODEL_NOT_SHOWN
    else:
        why = _reason(s, timeout_ms)
        if not retry_unknown:
            return Answer(z3.unknown, reason=why)
        query = [*s.assertions(), *assumptions]
    for seed in seeds:
        t = z3.Solver(ctx=s.ctx)
        if timeout_ms:
            t.set("timeout", timeout_ms)
        t.set("random_seed", seed)
        t.add(*query)
        r = t.check()
        if r == z3.unsat:
            return Answer(z3.unsat)
        if r == z3.sat:
            m = t.model()
            if shows(m, query):
                return Answer(z3.sat, m)
            why = MODEL_NOT_SHOWN
        elif why != MODEL_NOT_SHOWN:
            why = _reason(t, timeout_ms)
    return Answer(z3.unknown, reason=why)


def decide(hyp: list[z3.BoolRef], goal: z3.BoolRef, timeout_ms: int) -> Answer:
    """``hyp`` and ``goal`` in a fresh solver with a seed portfolio: the budget ``timeout_ms``
    split evenly between the default seed and ``RETRY_SEEDS``, an unknown retried too (for
    queries whose answer takes milliseconds or never comes)."""
    share = max(1, timeout_ms // (1 + len(RETRY_SEEDS)))
    s = z3.Solver()
    s.set("timeout", share)
    s.add(*hyp, goal)
    return check(s, timeout_ms=share, retry_unknown=True)
