"""A seeded agreement campaign: the model and the encoding in lockstep over
many random operation sequences, under every eviction policy.

``sequence(seed, policy)`` is deterministic, so a budget ("the first K
sequences of ``plan``") is a measurable thing: ``benchmarks/agreement_budget.py``
finds, for each seeded encoding bug (``encoding_mutants.py``), the first
sequence of the plan that exposes it, and ``tests/test_smt_agreement.py``
runs the budget and asserts that it catches every one of them and that the
unmutated encoding agrees throughout.

The generator is a well-behaved caller most of the time (a Use's parent is
the block before the batch in its chain; a swap-in names the block before
its prefix, and the caller keeps owning it until the swap-in completes),
and, on ``misbehave`` draws, names a parent it does not hold or drops a
swap-in's parent early. Each operation is flagged, and the lockstep's
contract breaks must all fall on flagged operations: a contract is broken
only by a misbehaving caller. Sequences are biased towards what recency and
parent bugs need (``_weights``): small G1 and G2 (G2 holds at least two
blocks, so its LRU order means something), releases when G1 is all active,
Ticks when transfers are pending, Promotes of blocks with a parent, and
swap-ins of chains of blocks G2 holds (``_swap_in_blocks``; a one-block
swap-in never registers a block whose recorded parent differs from the
swap-in's own, which is why ``swapin-records-job-parent`` went uncaught).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kvspec.reference.g1 import G1Model
from kvspec.reference.smt.offload.agreement.sampled import (
    POLICY_NAMES,
    EncodingLockstep,
    OffloadMismatch,
    PolicyName,
    Universe,
    deref_op,
    promote_op,
    swap_in_op,
    use_op,
)
from kvspec.reference.smt.universe import NONE
from kvspec.spec.wire import Operation, Tick

#: the hash forest of the campaign: 0 <- 1 <- 2 <- 3, 0 <- 4, 5 <- 6 <- 7
FOREST = (NONE, 0, 1, 2, 0, NONE, 5, 6)
OPS_PER_SEQUENCE = 30
#: the sequences ``tests/test_smt_agreement.py`` runs (``plan(BUDGET)``: 4 per
#: policy). ``benchmarks/agreement_budget.py`` measures, for each encoding
#: mutant, the first sequence of the plan that catches it and how many of the
#: first 32 do; the test asserts each is caught within this budget.
BUDGET = 16


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
    blocks: list[int | str] = [*chain[start:][: rng.randint(1, 3)]]
    if rng.random() < 0.5:  # a partial block, for a Promote to fill later
        blocks.append(f"u{rng.randrange(u.slots)}")
    parent = chain[start - 1] if start > 0 else None
    if misbehave:
        parent = rng.choice([p for p in range(len(u.par)) if p not in c.owned] or [0])
    return use_op(u, blocks, parent)


def _swap_in_blocks(rng: random.Random, u: Universe, g2: list[int]) -> list[int]:
    """Up to three blocks down one chain from a block G2 holds, preferring
    children G2 holds too: a swap-in registers more than one block only
    then, and only its second and later blocks record a parent other than
    the swap-in's own (the parent and recency bugs of a job's later blocks
    are invisible to one-block swap-ins)."""
    pairs = _g2_pairs(u, g2)
    blocks = [rng.choice(pairs if pairs and rng.random() < 0.7 else g2)]
    while len(blocks) < 3:
        kids = [h for h in range(len(u.par)) if u.par[h] == blocks[-1]]
        if not kids:
            break
        blocks.append(rng.choice([h for h in kids if h in g2] or kids))
    return blocks


def _weights(m: G1Model, c: Caller, u: Universe) -> list[int]:
    """How likely each kind of operation is next (use, deref, promote, tick,
    swap_in), from what the model holds. Evictions fill G2 (each evicted
    block is offloaded, and a Tick completes the offload and frees its
    slot), and a busy G2 is where the recency and parent bugs of the
    encoding show; so: a G1 whose every slot is active mostly makes Uses
    fail with ``capacity``, and the caller releases; a Promote needs a
    partial block; pending transfers want a Tick; a swap-in needs G2 to
    hold something, and it registers two blocks or more (the case a
    one-block swap-in never reaches) only when G2 holds a parent and its
    child and G1 has two free slots (an eviction blocks a swap-in)."""
    all_active = m.free == 0 and len(m.policy) == 0 and m.quarantined == 0
    held = bool(c.owned or c.partial)
    pairs = _g2_pairs(u, list(m.g2))
    return [
        2 if all_active else 4,
        8 if all_active else 3 if held else 1,
        6 if c.partial else 0,
        5 if m.quarantined or m.reserved else 3,
        0 if not m.g2 else 8 if pairs and m.free >= 2 else 3,
    ]


def _g2_pairs(u: Universe, g2: list[int]) -> list[int]:
    """The blocks G2 holds together with one of their children."""
    return [h for h in g2 if any(u.par[k] == h for k in g2)]


def random_op(rng: random.Random, ls: EncodingLockstep, c: Caller) -> tuple[Operation, bool]:
    """One operation and whether the caller misbehaves with it."""
    u, m = ls.universe, ls.model
    misbehave = rng.random() < 0.05
    c.owned = [h for h, n in m.owners().items() for _ in range(n)]
    c.partial = list(m.partial)
    kind = rng.choices(["use", "deref", "promote", "tick", "swap_in"], _weights(m, c, u))[0]
    if kind == "swap_in":
        g2 = list(m.g2)
        if g2:
            blocks = _swap_in_blocks(rng, u, g2)
            p = u.par[blocks[0]]
            parent = None if p == NONE else p
            if parent is None or parent in c.owned or misbehave:
                if parent is not None:
                    c.pinned.append(parent)
                return swap_in_op(u, blocks, parent), misbehave and parent is not None
        kind = "use"
    if kind == "use":
        return _use(rng, u, c, misbehave), misbehave
    if kind == "deref":
        pool: list[int | str] = [*c.owned, *c.partial]
        if not misbehave:  # keep one owner of every pending swap-in's parent (out of the draw)
            for p in set(c.pinned):
                if p in pool:
                    pool.remove(p)
        if not pool or rng.random() < 0.05:
            return deref_op([rng.randrange(len(u.par))]), False  # (rejected: DEREF-UNKNOWN)
        picked = rng.sample(pool, min(len(pool), rng.randint(1, 3)))
        return deref_op(picked), misbehave
    if kind == "promote":
        uuid = rng.choice(c.partial) if c.partial else f"u{rng.randrange(u.slots)}"
        fine = [h for h in range(len(u.par)) if u.par[h] == NONE or u.par[h] in c.owned]
        # mostly a new block with a parent: only there does the recorded parent say something
        child = [h for h in fine if u.par[h] != NONE and h not in m.blocks]
        fine = child if child and rng.random() < 0.7 else fine
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
    mismatches: list[OffloadMismatch]
    #: contract breaks on operations the caller did not flag as misbehaving
    unflagged_breaks: list[tuple[int, str]]
    flagged_breaks: list[tuple[int, str]]


def universe_for(seed: int, policy: PolicyName) -> Universe:
    rng = random.Random(f"universe-{seed}")
    return Universe(rng.randint(2, 4), FOREST, rng.randint(2, 3), policy)


def sequence(seed: int, policy: PolicyName, n_ops: int = OPS_PER_SEQUENCE) -> SequenceResult:
    """Run sequence ``seed`` under ``policy``; stop at the first mismatch."""
    ls = EncodingLockstep(universe_for(seed, policy))
    rng = random.Random(f"ops-{seed}")
    caller = Caller()
    flagged: set[int] = set()
    mismatches: list[OffloadMismatch] = []
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


def plan(budget: int | None = None) -> list[tuple[int, PolicyName]]:
    """The campaign's first ``budget`` sequences: seeds 0, 1, ... with the
    eviction policies taken in turn (seed s runs under policy s mod 4), so
    every policy gets a quarter of any budget."""
    n = BUDGET if budget is None else budget
    return [(seed, POLICY_NAMES[seed % len(POLICY_NAMES)]) for seed in range(n)]


def first_failure(budget: int | None = None) -> SequenceResult | None:
    """The first sequence of ``plan(budget)`` that disagrees or whose caller
    breaks a contract unflagged; None if all agree."""
    for seed, policy in plan(budget):
        r = sequence(seed, policy)
        if r.mismatches or r.unflagged_breaks:
            return r
    return None


__all__ = ["BUDGET", "POLICY_NAMES", "first_failure", "plan", "sequence"]
