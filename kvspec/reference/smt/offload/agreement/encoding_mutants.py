"""Seeded bugs of the *encoding* (not of the rules), for the agreement test.

A rule mutant (``mutants.py``) breaks an invariant and the prover refutes
it. The bugs here keep every invariant (the proofs still pass) but make the
encoding say something the model does not: a parent recorded wrong, a
recency (LRU tick, G2 use time) not refreshed. Only the comparison with the
model (``agreement.EncodingLockstep``) can find them, so each one measures whether
the agreement campaign's budget is enough: ``tests/test_smt_agreement.py``
shows each is caught within the budget, and ``python
benchmarks/agreement_budget.py`` measures how many sequences each needs.

Each mutant wraps one transition function as ``ops.py`` calls it and
changes the step it returns; ``installed`` swaps it in for a ``with`` block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import z3

from kvspec.reference.smt.offload import ops
from kvspec.reference.smt.offload.step import EncodedStep
from kvspec.reference.smt.terms import sel, upd
from kvspec.reference.smt.universe import INACTIVE, NONE
from kvspec.spec.rules import RuleId as R

Kind = Literal["parent", "recency", "frame"]


@dataclass(frozen=True)
class EncodingMutant:
    name: str
    kind: Kind
    description: str
    #: the name ``ops.py`` calls the transition by
    target: str
    #: the change made to the step the transition returns
    patch: Callable[[EncodedStep], EncodedStep]

    @contextmanager
    def installed(self) -> Iterator[None]:
        original = getattr(ops, self.target)

        def broken(*args: Any, **kwargs: Any) -> EncodedStep:
            return self.patch(original(*args, **kwargs))

        setattr(ops, self.target, broken)
        try:
            yield
        finally:
            setattr(ops, self.target, original)


def _promote_parent_none(step: EncodedStep) -> EncodedStep:
    s, new = step.params["s"], step.rules[R.PROMOTE_NEW]
    step.post = step.post.but(mpar=upd(step.post.mpar, s, z3.IntVal(NONE), new))
    return step


def _reserve_no_g2_use(step: EncodedStep) -> EncodedStep:
    step.post = step.post.but(g2t=list(step.pre.g2t), g2clock=step.pre.g2clock)
    return step


def _deref_no_lru_tick(step: EncodedStep) -> EncodedStep:
    t = step.params["t"]
    last = sel(step.pre.own, t) == 1
    # the block enters the pool with the tick of its previous stay: not the newest
    step.post = step.post.but(itick=upd(step.post.itick, t, sel(step.pre.itick, t), last))
    return step


def _complete_no_g2_use(step: EncodedStep) -> EncodedStep:
    s = step.params["s"]
    h = sel(step.pre.pblk, s)
    again = sel(step.pre.g2, h)
    step.post = step.post.but(g2t=upd(step.post.g2t, h, sel(step.pre.g2t, h), again))
    return step


def _use_records_anchor(step: EncodedStep) -> EncodedStep:
    s, new = step.params["s"], step.rules[R.USE_NEW]
    step.post = step.post.but(mpar=upd(step.post.mpar, s, step.params["a"], new))
    return step


def _register_records_job_parent(step: EncodedStep) -> EncodedStep:
    k, j = step.params["k"], step.params["j"]
    reg = step.rules[R.SWAPIN_ANCHOR]
    step.post = step.post.but(mpar=upd(step.post.mpar, k, sel(step.pre.jpar, j), reg))
    return step


def _g2_records_no_parent(step: EncodedStep) -> EncodedStep:
    s = step.params["s"]
    h = sel(step.pre.pblk, s)
    step.post = step.post.but(g2par=upd(step.post.g2par, h, z3.IntVal(NONE)))
    return step


ENCODING_MUTANTS: list[EncodingMutant] = [
    EncodingMutant(
        "promote-parent-none",
        "parent",
        "Promote records the new block's parent as none",
        "promote",
        _promote_parent_none,
    ),
    EncodingMutant(
        "use-records-stored-parent",
        "parent",
        "a new block of a Use records the Stored's parent instead of the block before it",
        "use_full",
        _use_records_anchor,
    ),
    EncodingMutant(
        "swapin-records-job-parent",
        "parent",
        "a swapped-in block records the swap-in's parent instead of the block before it",
        "swapin_register",
        _register_records_job_parent,
    ),
    EncodingMutant(
        "g2-records-no-parent",
        "parent",
        "G2 records no parent for an offloaded block",
        "offload_complete",
        _g2_records_no_parent,
    ),
    EncodingMutant(
        "swapin-reserve-no-g2-use",
        "recency",
        "a swap-in's reservation does not count as a use of the block in G2",
        "swapin_reserve",
        _reserve_no_g2_use,
    ),
    EncodingMutant(
        "deref-keeps-old-lru-tick",
        "recency",
        "a block going inactive keeps the LRU tick of its previous stay in the pool",
        "deref_full",
        _deref_no_lru_tick,
    ),
    EncodingMutant(
        "offload-again-no-g2-use",
        "recency",
        "offloading a block G2 already holds does not count as a use of it in G2",
        "offload_complete",
        _complete_no_g2_use,
    ),
]


def _lru_clock_reversed(step: EncodedStep) -> EncodedStep:
    t = step.params["t"]
    last = sel(step.pre.own, t) == 1
    # the clock counts down: the block made inactive last gets the smallest tick (evicted first)
    step.post = step.post.but(itick=upd(step.post.itick, t, -step.pre.clock, last))
    return step


def _deref_frame_other_ticks(step: EncodedStep) -> EncodedStep:
    t = step.params["t"]
    last = sel(step.pre.own, t) == 1
    # the frame of the other slots dropped: every inactive block's tick is refreshed too
    ticks = [
        z3.If(z3.And(last, t != k, step.pre.st[k] == INACTIVE), step.pre.clock, step.post.itick[k])
        for k in step.pre.slots
    ]
    step.post = step.post.but(itick=ticks)
    return step


def _hit_frame_other_owner(step: EncodedStep) -> EncodedStep:
    t = step.params["t"]
    hit = step.rules[R.USE_HIT_ACTIVE]
    # the frame of the other slots dropped: a hit on an active block also drops an owner of slot 0
    own0 = z3.If(z3.And(hit, t != 0, step.post.own[0] >= 2), step.post.own[0] - 1, step.post.own[0])
    step.post = step.post.but(own=[own0, *step.post.own[1:]])
    return step


#: seeded encoding bugs written for the exhaustive model-encoding check
#: (``offload/agreement/equivalence.py``), kept out of the sampled agreement campaign's budget tests
EQUIVALENCE_MUTANTS: list[EncodingMutant] = [
    EncodingMutant(
        "lru-clock-reversed",
        "recency",
        "a block going inactive takes minus the clock as its LRU tick (the order is reversed)",
        "deref_full",
        _lru_clock_reversed,
    ),
    EncodingMutant(
        "deref-frame-refreshes-others",
        "frame",
        "a Deref that makes a block inactive also refreshes every other inactive block's LRU tick",
        "deref_full",
        _deref_frame_other_ticks,
    ),
    EncodingMutant(
        "hit-frame-drops-other-owner",
        "frame",
        "a hit on an active block also drops one owner of slot 0 (when it has two or more)",
        "use_full",
        _hit_frame_other_owner,
    ),
]


def encoding_mutant(name: str) -> EncodingMutant:
    for m in [*ENCODING_MUTANTS, *EQUIVALENCE_MUTANTS]:
        if m.name == name:
            return m
    known = [m.name for m in [*ENCODING_MUTANTS, *EQUIVALENCE_MUTANTS]]
    raise KeyError(f"unknown encoding mutant {name!r}; known: {known}")
