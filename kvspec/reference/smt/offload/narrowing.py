"""No silent narrowing: every branch and sub-case of every transition happens
in some state the proof covers.

A proof is only as wide as the steps it looks at. A condition added to a
transition (a contract such as "Deref never drops the last owner", a guard
written too strongly) removes steps from the proof without making any
property fail, and a whole-guard check misses it when the guard it narrows
is ``True`` (DEREF-OWNER's). So each transition names its sub-cases here,
both sides of every split the rules make (last owner or not, G2 full or not,
a new swap-in job or a running one, ...), and ``check_cases`` asks z3 for a
state satisfying every invariant and lemma and a step that is enabled (valid,
within the caller contracts, with its choices) in each rule guard and each
sub-case. A case that is never enabled is reported as narrowed.

The sub-cases are written against the step's own parameters and pre-state,
so they stay next to the proof and are checked at the proof's bound.
"""

from __future__ import annotations

from collections.abc import Callable

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.offload.catalogue import TRANSITIONS, TransitionSpec
from kvspec.reference.smt.offload.invariants import ALL_PROPERTIES
from kvspec.reference.smt.offload.step import EncodedStep
from kvspec.reference.smt.offload.transitions import Policy
from kvspec.reference.smt.prover import Applier, build, default_applier
from kvspec.reference.smt.terms import sel
from kvspec.reference.smt.universe import NONE, QUARANTINED, RESERVED, Bound
from kvspec.spec.rules import RuleId as R

Cases = dict[str, z3.BoolRef]


def _root_or_block(p: z3.ExprRef, what: str) -> Cases:
    return {f"{what} is the root": p == NONE, f"{what} is a block": p != NONE}


def _use_full(step: EncodedStep) -> Cases:
    S, p = step.pre, step.params
    hit = z3.Or(step.rules[R.USE_HIT_ACTIVE], step.rules[R.USE_HIT_INACTIVE])
    return {
        **_root_or_block(p["a"], "the Stored's parent"),
        "a new block recorded with the batch's previous block as parent": z3.And(step.rules[R.USE_NEW], p["m"] != NONE),
        "a new block whose recorded parent differs from the Stored's parent": z3.And(
            step.rules[R.USE_NEW], p["m"] != p["a"]
        ),
        "a hit while another block is inactive": z3.And(hit, S.any_inactive()),
        "blocked while another offload is pending": z3.And(step.rules[R.OFFLOAD_BLOCKS_USE], S.quar_c >= 1),
    }


def _use_partial(step: EncodedStep) -> Cases:
    S, u = step.pre, step.params["u"]
    held = S.held_partial(u)
    return {"the partial block is held already": held, "the partial block is new": z3.Not(held)}


def _deref_full(step: EncodedStep) -> Cases:
    S, t = step.pre, step.params["t"]
    return {
        "the last owner goes (the block becomes inactive)": sel(S.own, t) == 1,
        "an owner stays": sel(S.own, t) >= 2,
        "the last owner goes while a swap-in is pending": z3.And(
            sel(S.own, t) == 1, z3.Or([S.job_live(j) for j in range(S.bound.jobs)])
        ),
    }


def _deref_partial(step: EncodedStep) -> Cases:
    return {"another slot is quarantined": step.pre.quar_c >= 1}


def _promote(step: EncodedStep) -> Cases:
    return _root_or_block(step.params["p"], "the parent")


def _evict(step: EncodedStep) -> Cases:
    S = step.pre
    return {"no offload pending yet": S.quar_c == 0, "another offload already pending": S.quar_c >= 1}


def _offload_complete(step: EncodedStep) -> Cases:
    S, s = step.pre, step.params["s"]
    h = sel(S.pblk, s)
    full = S.g2_count() >= S.rigid.cap2
    return {
        "G2 full, the block new to G2": z3.And(full, z3.Not(sel(S.g2, h))),
        "G2 not full, the block new to G2": z3.And(z3.Not(full), z3.Not(sel(S.g2, h))),
        "the block already in G2 (a use of it in G2)": sel(S.g2, h),
        "the slot is quarantined": sel(S.st, s) == QUARANTINED,
        "the offloaded block's parent is a block": sel(S.pmpar, s) != NONE,
    }


def _swapin_reserve(step: EncodedStep) -> Cases:
    S, j = step.pre, step.params["j"]
    return {
        "a new job": z3.Not(S.job_live(j)),
        "a running job's next slot": S.job_live(j),
        **_root_or_block(step.params["p"], "the swap-in's parent"),
    }


def _swapin_register(step: EncodedStep) -> Cases:
    S, j, k = step.pre, step.params["j"], step.params["k"]
    others = z3.Or([z3.And(S.st[i] == RESERVED, S.jid[i] == j, i != k) for i in S.slots])
    starting = S.busy == NONE
    return {
        "the job's first slot": starting,
        "a later slot of the job": z3.Not(starting),
        "a later slot while a Stored group is open": z3.And(z3.Not(starting), S.ropen),
        "a later slot after a skip (no group open)": z3.And(z3.Not(starting), z3.Not(S.ropen)),
        "the job's last slot": z3.Not(others),
        "not the job's last slot": others,
        **_root_or_block(sel(S.jpar, j), "the job's parent"),
    }


#: transition name -> its named sub-cases (each must be enabled somewhere)
CASES: dict[str, Callable[[EncodedStep], Cases]] = {
    "use(full)": _use_full,
    "use(partial)": _use_partial,
    "deref(full)": _deref_full,
    "deref(partial)": _deref_partial,
    "promote": _promote,
    "evict": _evict,
    "offload_complete": _offload_complete,
    "swapin_reserve": _swapin_reserve,
    "swapin_register": _swapin_register,
}


def cases_of(step: EncodedStep, spec_name: str) -> Cases:
    """Every rule guard of the step and every named sub-case of its transition."""
    out: Cases = {f"rule {r}": g for r, g in step.rules.items()}
    make = CASES.get(spec_name)
    if make is not None:
        out |= {f"case {n}": c for n, c in make(step).items()}
    return out


def check_cases(
    bound: Bound,
    policy: Policy = "unordered",
    applier: Applier = default_applier,
    transitions: list[TransitionSpec] | None = None,
) -> list[str]:
    """Each rule guard and each sub-case of each transition holds for some
    enabled step from some state satisfying every invariant and lemma
    (symmetry reduction on, as in the proofs). Returns the narrowed ones
    (empty: none), and any transition without a sub-case list."""
    problems: list[str] = []
    for spec in TRANSITIONS if transitions is None else transitions:
        if spec.name not in CASES:
            problems.append(f"{spec.name}: no sub-cases listed in narrowing.CASES")
        b = build(spec, bound, policy, applier, ALL_PROPERTIES, symmetry=True)
        s = z3.Solver()
        s.add(*b.base)
        if not solving.check(s).sat:
            problems.append(f"{spec.name}: never enabled")
            continue
        for name, cond in cases_of(b.step, spec.name).items():
            s.push()
            s.add(cond)
            if not solving.check(s).sat:
                problems.append(f"{spec.name}: {name} never happens (narrowed)")
            s.pop()
    return problems
