"""radix progress: an unlocked page is evictable, as a ranking argument over the page encoding.

``PROGRESS-RADIX-EVICTABLE`` (SPEC.md; INVARIANTS.md, section "Progress"): a
live page ``x`` whose lock count is 0 (no held lock ends at it or below it:
INV-RADIX-LOCKS; whatever locked its path has unlocked) can be evicted
without any client operation: in every state of the bounded universe
(``encoding.RadixBound``: 5 pages, 2 locks, any tokens and capacity)
satisfying every INV-RADIX-* invariant and the lock-path lemma (which
``kvspec prove --profile radix`` proves inductive at that bound, so every
reachable state of it), some ``evict`` step (an unlocked leaf page, any one:
the LRU victim the model takes is one of them) is enabled and lowers the
rank, the number of live pages in ``x``'s subtree (``x`` and the pages below
it, by the ancestry ghost). The rank is 0 exactly when ``x`` is gone, so
with no new lock or page below ``x`` at most that many evictions remove it.
The proof is ``unsat`` of: hypothesis, "some live page ``x`` has no lock",
and "no eviction of any page lowers ``x``'s subtree".

Non-vacuity (``sanity``): the premise is satisfiable, with ``x`` under a
locked page too (a lock ending at its parent, on another path: the premise
covers pages whose path is still partly locked); the move fires both below
``x`` and at ``x`` itself. The seeded bug ``evict-parent-unlocked`` (an
eviction also requires the leaf's parent page unlocked, as if the lock of
the node above covered its children) only adds a guard, so every invariant
stays inductive; its refutation is a state of the universe where ``x`` has
no lock and no eviction lowers its subtree (the parent of ``x`` locked by
another request). The universe is finite, so z3's model is that state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.radix.encoding import (
    ROOT,
    RadixBound,
    RadixTransition,
    RState,
    all_invariants,
    choice,
    evict,
    lemma_lock_path,
    parent_of,
    sel_i,
)
from kvspec.spec.rules import RuleName

#: the id of the property (SPEC.md; INVARIANTS.md, "Progress")
PROGRESS_ID: RuleName = "PROGRESS-RADIX-EVICTABLE"
#: what the rank counts, for the reader
COUNTS = "live pages in the unlocked page's subtree"

#: (transition, pre-state) -> an extra requirement of that step (a seeded progress bug)
Patch = Callable[[RadixTransition], list[z3.BoolRef]]


def _no_patch(step: RadixTransition) -> list[z3.BoolRef]:
    return []


def _parent_unlocked(step: RadixTransition) -> list[z3.BoolRef]:
    S, t = step.pre, choice("t")
    return [z3.Or(parent_of(S, t) == ROOT, sel_i(S.lock, parent_of(S, t), 0) == 0)]


@dataclass(frozen=True)
class RadixProgressBug:
    name: str
    why: str
    patch: Patch


PROGRESS_BUGS: list[RadixProgressBug] = [
    RadixProgressBug(
        "evict-parent-unlocked",
        "an eviction also requires the leaf's parent page unlocked",
        _parent_unlocked,
    ),
]


def subtree(S: RState, x: int) -> z3.ArithRef:
    """The rank: live pages at or below ``x`` (``anc[d][x]``: ``x`` is ``d`` or above it)."""
    return z3.Sum([z3.If(S.anc[d][x], 1, 0) for d in range(S.n)])


def _hyp(S: RState) -> list[z3.BoolRef]:
    return [S.cap >= 0, *all_invariants(S), lemma_lock_path(S)]


def _premise(S: RState, x: int) -> z3.BoolRef:
    return z3.And(S.live[x], S.lock[x] == 0)


def _subst(x: Any, sub: list[tuple[z3.ExprRef, z3.ExprRef]]) -> Any:
    """``x`` (a term, or nested tuples of terms) with ``sub`` applied."""
    if isinstance(x, tuple):
        return tuple(_subst(e, sub) for e in x)
    return z3.substitute(x, *sub)


def _evict_at(S: RState, t: int, patch: Patch) -> RadixTransition:
    """The eviction of page ``t`` (the step's choice ``in_t`` fixed to ``t``)."""
    step = evict(S, frozenset())
    sub = [(choice("t"), z3.IntVal(t))]
    reqs = [_subst(r, sub) for r in [*step.requires, *patch(step)]]
    post = RState(**{f.name: _subst(getattr(step.post, f.name), sub) for f in fields(RState)})
    return RadixTransition(step.name, S, post, reqs)


def _lowers(S: RState, x: int, t: int, patch: Patch) -> z3.BoolRef:
    step = _evict_at(S, t, patch)
    return z3.And(*step.requires, subtree(step.post, x) < subtree(S, x))


def _stuck(S: RState, patch: Patch) -> z3.BoolRef:
    """Some live page without a lock whose subtree no eviction lowers."""
    return z3.Or([z3.And(_premise(S, x), *(z3.Not(_lowers(S, x, t, patch)) for t in range(S.n))) for x in range(S.n)])


@dataclass
class RadixPResult:
    verdict: str  # proven | refuted (a state of the universe where no eviction lowers the rank) | unknown (...)
    seconds: float


def prove(bound: RadixBound, patch: Patch = _no_patch, timeout_ms: int = 60_000) -> RadixPResult:
    """The ranking argument at ``bound`` (module docstring)."""
    t0 = time.perf_counter()
    S = RState.fresh(bound, "rp_")
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*_hyp(S), _stuck(S, patch))
    return RadixPResult(solving.check(s, timeout_ms=timeout_ms).verdict, time.perf_counter() - t0)


def sanity(bound: RadixBound, timeout_ms: int = 60_000) -> list[str]:
    """The premise holds (also under a locked parent) and the move fires below ``x`` and at ``x``."""
    S = RState.fresh(bound, "rs_")
    n = S.n
    some = z3.Or([_premise(S, x) for x in range(n)])
    locked_parent = z3.Or([z3.And(_premise(S, x), S.pp[x] != ROOT, sel_i(S.lock, S.pp[x], 0) > 0) for x in range(n)])
    below = z3.Or(
        [z3.And(_premise(S, x), _lowers(S, x, t, _no_patch), z3.BoolVal(t != x)) for x in range(n) for t in range(n)]
    )
    itself = z3.Or([z3.And(_premise(S, x), _lowers(S, x, x, _no_patch)) for x in range(n)])
    out = []
    for label, goal in (
        ("a live page without a lock", some),
        ("a live page without a lock under a locked page", locked_parent),
        ("an eviction below the page", below),
        ("the eviction of the page itself", itself),
    ):
        s = z3.Solver()
        s.set("timeout", timeout_ms)
        s.add(*_hyp(S), goal)
        if not solving.check(s, timeout_ms=timeout_ms).sat:
            out.append(f"radix {PROGRESS_ID}: no state of the universe has {label}")
    return out


def refute(bug: RadixProgressBug, bound: RadixBound, timeout_ms: int = 60_000) -> str:
    """``refuted`` when the bug leaves a state where an unlocked page's subtree cannot shrink."""
    r = prove(bound, bug.patch, timeout_ms)
    return "refuted" if r.verdict == "refuted" else "not refuted" if r.verdict == "proven" else r.verdict
