"""A seeded agreement campaign: the model and the encoding in lockstep over
many random operation sequences, under every eviction policy.

``sequence(seed, policy)`` is deterministic, so a budget ("the first K
seeds") is a measurable thing: ``benchmarks/agreement_budget.py`` finds, for
each seeded encoding bug (``encoding_mutants.py``), the first seed whose
sequence exposes it, and ``tests/test_smt_agreement.py`` runs the budget
that catches every one of them.

The generator is a well-behaved caller most of the time (a Use's parent is
the block before the batch in its chain; a swap-in names the block before
its prefix, and the caller keeps owning it until the swap-in completes),
and, on ``misbehave`` draws, names a parent it does not hold or drops a
swap-in's parent early. Each operation is flagged, and the lockstep's
contract breaks must all fall on flagged operations: a contract is broken
only by a misbehaving caller. Sequences are biased towards what recency and
parent bugs need: small G1 and G2, swap-ins of blocks G2 holds, and Ticks
that complete them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kvspec.spec.wire import Operation, Tick

from .agreement import POLICY_NAMES, Lockstep, Mismatch, PolicyName, Universe, deref_op, promote_op, swap_in_op, use_op
from .universe import NONE

#: the hash forest of the campaign: 0 <- 1 <- 2 <- 3, 0 <- 4, 5 <- 6 <- 7
FOREST = (NONE, 0, 1, 2, 0, NONE, 5, 6)
OPS_PER_SEQUENCE = 30
#: the sequences of one policy that ``tests/test_smt_agreement.py`` runs
#: (measured by benchmarks/agreement_budget.py: every encoding mutant is
#: caught by then under at least one policy; see spec/INVARIANTS.md)
BUDGET = 40


@dataclass
class Caller:
    """What the generating caller holds: its owners and partial blocks, and
    the parents of its pending swap-ins (which it keeps owning)."""

    owned: list[int] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    pinned: list[int] = field(default_factory=list)


def _use(rng: random.Random, u: Universe, c: Caller, misbehave: bool) -> Operation:
    h = rng.randrange(len(u.par))
    chain = u.chain(h)
    start = rng.randrange(len(chain))
    # a well-behaved parent: the block before the batch, if the caller owns it
    if start > 0 and chain[start - 1] not in c.owned:
        start = 0
    blocks: list[int | str] = [*chain[start:][:3]]
    if rng.random() < 0.3:
        blocks.append(f"u{rng.randrange(u.slots)}")
    parent = chain[start - 1] if start > 0 else None
    if misbehave:
        parent = rng.choice([p for p in range(len(u.par)) if p not in c.owned] or [0])
    return use_op(u, blocks, parent)


def random_op(rng: random.Random, ls: Lockstep, c: Caller) -> tuple[Operation, bool]:
    """One operation and whether the caller misbehaves with it."""
    u, m = ls.universe, ls.model
    misbehave = rng.random() < 0.05
    kind = rng.choices(["use", "deref", "promote", "tick", "swap_in"], [4, 3, 1, 3, 2])[0]
    c.owned = [h for h, n in m.owners().items() for _ in range(n)]
    c.partial = list(m.partial)
    if kind == "swap_in":
        g2 = list(m.g2)
        if g2:
            h = rng.choice(g2)
            chain = u.chain(h)
            i = chain.index(h)
            parent = chain[i - 1] if i > 0 else None
            if parent is None or parent in c.owned or misbehave:
                if parent is not None:
                    c.pinned.append(parent)
                return swap_in_op(u, chain[i:][:3], parent), misbehave and parent is not None
        kind = "use"
    if kind == "use":
        return _use(rng, u, c, misbehave), misbehave
    if kind == "deref":
        pool: list[int | str] = [*c.owned, *c.partial]
        if not misbehave:  # keep one owner of every pending swap-in's parent
            pool = [b for b in pool if not (isinstance(b, int) and b in c.pinned and c.owned.count(b) <= 1)]
        if not pool or rng.random() < 0.05:
            return deref_op([rng.randrange(len(u.par))]), False  # (rejected: DEREF-UNKNOWN)
        picked = rng.sample(pool, min(len(pool), rng.randint(1, 3)))
        return deref_op(picked), misbehave
    if kind == "promote":
        uuid = rng.choice(c.partial) if c.partial else f"u{rng.randrange(u.slots)}"
        fine = [h for h in range(len(u.par)) if u.par[h] == NONE or u.par[h] in c.owned]
        h = rng.randrange(len(u.par)) if misbehave or not fine else rng.choice(fine)
        return promote_op(u, uuid, h), misbehave
    back = rng.random() < 0.1
    if not back:
        c.pinned = []  # a forward Tick completes every pending swap-in
    return Tick(now_ms=max(0.0, ls.now - 1.0) if back else ls.now + rng.choice([0.0, 1.0, 2.5])), False


@dataclass
class SequenceResult:
    seed: int
    policy: str
    ops: int
    mismatches: list[Mismatch]
    #: contract breaks on operations the caller did not flag as misbehaving
    unflagged_breaks: list[tuple[int, str]]
    flagged_breaks: list[tuple[int, str]]


def universe_for(seed: int, policy: PolicyName) -> Universe:
    rng = random.Random(f"universe-{seed}")
    return Universe(rng.randint(2, 4), FOREST, rng.randint(1, 3), policy)


def sequence(seed: int, policy: PolicyName, n_ops: int = OPS_PER_SEQUENCE) -> SequenceResult:
    """Run sequence ``seed`` under ``policy``; stop at the first mismatch."""
    ls = Lockstep(universe_for(seed, policy))
    rng = random.Random(f"ops-{seed}")
    caller = Caller()
    flagged: set[int] = set()
    mismatches: list[Mismatch] = []
    for i in range(n_ops):
        op, misbehaves = random_op(rng, ls, caller)
        if misbehaves:
            flagged.add(i)
        mismatches = ls.step(op)
        if mismatches:
            break
    unflagged = [(i, cid) for i, cid in ls.contract_breaks if i not in flagged]
    flagged_breaks = [(i, cid) for i, cid in ls.contract_breaks if i in flagged]
    return SequenceResult(seed, policy, ls.index, mismatches, unflagged, flagged_breaks)


def first_failure(policy: PolicyName, budget: int, start: int = 0) -> SequenceResult | None:
    """The first sequence of ``start .. start+budget-1`` that disagrees or whose
    caller breaks a contract unflagged; None if all agree."""
    for seed in range(start, start + budget):
        r = sequence(seed, policy)
        if r.mismatches or r.unflagged_breaks:
            return r
    return None


__all__ = ["BUDGET", "POLICY_NAMES", "first_failure", "sequence"]
