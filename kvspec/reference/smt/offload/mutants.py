"""Broken variants of the transition rules, for the bug-finding check.

Each mutant breaks one rule the way an implementation could, and names the
invariant (or lemma) the prover must then refute with a counterexample. If
the prover still "proved" everything for a mutant, the proofs would be
vacuous; ``tests/test_smt_mutants.py`` shows they are not. The catalogue
follows the mutants of ``kvspec mutants`` where they map onto the encoding
(slot released at offload enqueue, G2 Stored at enqueue, device Removed
delayed to completion, swap-in registering blocks already present) and adds
lifecycle ones (Deref making a block inactive at one owner, Use registering
a block already registered, eviction of an active block).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvspec.reference.smt.offload.catalogue import TRANSITIONS, TransitionSpec
from kvspec.reference.smt.offload.state import State
from kvspec.reference.smt.offload.step import EncodedStep, Frag, publish
from kvspec.reference.smt.offload.transitions import (
    ACTIVE,
    ASSUME_SWAPIN_PARENT_HELD,
    FREE,
    INACTIVE,
    PARTIAL,
    QUARANTINED,
    Policy,
)
from kvspec.reference.smt.prover import Result, prove
from kvspec.reference.smt.terms import count, sel, upd
from kvspec.reference.smt.universe import NONE, Bound
from kvspec.spec.rules import RuleId as R

Patch = Callable[[EncodedStep], EncodedStep]


@dataclass(frozen=True)
class OffloadMutant:
    name: str
    rule: str
    description: str
    #: the property the prover must refute
    expect: str
    #: transition name -> extra keyword arguments (a broken part swapped in)
    extra: dict[str, dict[str, object]] | None = None
    #: a change applied to every step after the rules ran
    patch: Patch | None = None
    #: caller contracts dropped (to show the proof needs them)
    drop: tuple[str, ...] = ()

    def applier(self, spec: TransitionSpec, S: State, prefix: str, policy: Policy, *, symmetry: bool = False):
        extra = (self.extra or {}).get(spec.name)
        if extra:
            spec = dataclasses.replace(spec, extra={**spec.extra, **extra})
        step, consts, doms = spec.instantiate(S, prefix, policy, symmetry=symmetry)
        if self.patch is not None:
            step = self.patch(step)
        for name in self.drop:
            step.requires.pop(name, None)
        return step, consts, doms


# ---------------------------------------------------------------- patches


def _release_at_enqueue(step: EncodedStep) -> EncodedStep:
    """QUARANTINE-HOLD broken: an evicted slot is freed when its offload is
    queued, although its transfer is still pending."""
    pre, post = step.pre, step.post
    newly = [z3.And(pre.st[k] != QUARANTINED, post.st[k] == QUARANTINED) for k in pre.slots]
    step.post = post.but(
        st=[z3.If(n, FREE, x) for n, x in zip(newly, post.st, strict=True)],
        free_c=post.free_c + count(newly),
        quar_c=post.quar_c - count(newly),
    )
    return step


def _deref_inactive_at_one(step: EncodedStep) -> EncodedStep:
    """DEREF-OWNER broken: the block goes to the inactive pool when it drops
    to one owner instead of zero."""
    if step.name != "deref(full)":
        return step
    pre, post, t = step.pre, step.post, step.params["t"]
    early = sel(pre.own, t) == 2
    step.post = post.but(st=upd(post.st, t, INACTIVE, early), afull_c=post.afull_c - z3.If(early, 1, 0))
    return step


def _partial_allocated_again(step: EncodedStep) -> EncodedStep:
    """USE-PARTIAL broken: a Use of a partial uuid that a slot already holds
    takes a free slot for it again instead of reusing the held one."""
    if step.name != "use(partial)":
        return step
    pre, post, u, s = step.pre, step.post, step.params["u"], step.params["s"]
    again = z3.And(pre.held_partial(u), pre.free_c > 0, 0 <= s, s < pre.bound.slots, sel(pre.st, s) == FREE)
    step.post = post.but(
        st=upd(post.st, s, PARTIAL, again),
        pu=upd(post.pu, s, u, again),
        free_c=post.free_c - z3.If(again, 1, 0),
    )
    return step


def _evictions(step: EncodedStep) -> list[Frag]:
    return [f for f in step.frags if f.tier == "device" and f.kind == "removed"]


def _g2_stored_at_enqueue(step: EncodedStep) -> EncodedStep:
    """G2-STORE-ON-COMPLETE broken: the host-pinned Stored is published when
    the offload is queued instead of when it completes."""
    extra = [
        Frag(f.when, "host_pinned", "stored", f.block, parent=z3.IntVal(-1), starts_group=True)
        for f in _evictions(step)
    ]
    if step.name == "offload_complete":
        step.frags = [f for f in step.frags if not (f.tier == "host_pinned" and f.kind == "stored")]
    step.frags = step.frags + extra
    step.post = publish(step.pre, step.post, step.frags)
    return step


def _device_removed_at_completion(step: EncodedStep) -> EncodedStep:
    """DEVICE-REMOVE-IMMEDIATE broken: the device Removed of an evicted block
    waits for its transfer to complete."""
    if step.name == "offload_complete":
        s = step.params["s"]
        step.frags = [*step.frags, Frag(z3.BoolVal(True), "device", "removed", sel(step.pre.pblk, s))]
    else:
        step.frags = [f for f in step.frags if f not in _evictions(step)]
    step.post = publish(step.pre, step.post, step.frags)
    return step


def _evict_any_registered(S: State, v: z3.ArithRef) -> z3.BoolRef:
    """EVICT-POLICY broken: the victim may be an active block."""
    return z3.And(0 <= v, v < S.bound.slots, z3.Or(sel(S.st, v) == INACTIVE, sel(S.st, v) == ACTIVE))


def _only_active(S: State, h: z3.ArithRef) -> z3.BoolRef:
    """USE-HIT-INACTIVE broken: the lookup sees active blocks only, so an
    inactive block is registered a second time."""
    return S.is_active(h)


def _never_present(S: State, h: z3.ArithRef) -> z3.BoolRef:
    """SWAPIN-SKIP-PRESENT broken: a block G1 already holds is registered again."""
    return z3.BoolVal(False)


def _anchor_to_g2_parent(S: State, j: z3.ArithRef, h: z3.ArithRef) -> z3.ArithRef:
    """SWAPIN-ANCHOR broken: the first group anchors to the parent G2 recorded
    for the block, which G1 may no longer hold, not to the swap-in's parent."""
    return sel(S.g2par, h)


def _free_counter_stuck(step: EncodedStep) -> EncodedStep:
    """USE-NEW's bookkeeping broken: a Use takes a free slot and the free counter does not move."""
    if step.name in ("use(full)", "use(partial)"):
        step.post = step.post.but(free_c=step.pre.free_c)
    return step


def _reserved_counter_stuck(step: EncodedStep) -> EncodedStep:
    """SWAPIN-RESERVE's bookkeeping broken: a reservation does not count the reserved slot."""
    if step.name == "swapin_reserve":
        step.post = step.post.but(resv_c=step.pre.resv_c)
    return step


def _g2_keeps_victim(step: EncodedStep) -> EncodedStep:
    """G2-EVICT broken: a full G2 stores the offloaded block and keeps its victim too."""
    if step.name == "offload_complete":
        step.post = step.post.but(
            g2=upd(list(step.post.g2), step.params["w"], z3.BoolVal(True), step.rules[R.G2_EVICT])
        )
    return step


def _host_stored_parent_dropped(step: EncodedStep) -> EncodedStep:
    """G2-STORE-ON-COMPLETE's event broken: the host-pinned Stored names the root, not the parent
    G1 recorded for the block (G2's own record and every view stay right)."""
    if step.name == "offload_complete":
        step.frags = [
            dataclasses.replace(f, parent=z3.IntVal(NONE)) if f.tier == "host_pinned" and f.kind == "stored" else f
            for f in step.frags
        ]
    return step


MUTANTS: list[OffloadMutant] = [
    OffloadMutant(
        "release-at-enqueue",
        R.QUARANTINE_HOLD,
        "an evicted slot is freed when its offload is queued",
        R.INV_QUARANTINE,
        patch=_release_at_enqueue,
    ),
    OffloadMutant(
        "deref-inactive-at-one-owner",
        R.DEREF_OWNER,
        "Deref makes a block inactive at one owner",
        R.INV_OWNERS,
        patch=_deref_inactive_at_one,
    ),
    OffloadMutant(
        "use-registers-registered",
        R.USE_HIT_INACTIVE,
        "Use registers an inactive block a second time",
        R.INV_NO_DUP,
        extra={"use(full)": {"lookup": _only_active}},
    ),
    OffloadMutant(
        "evict-active",
        R.EVICT_POLICY,
        "eviction may pick an active block",
        R.INV_CONSERVE,
        extra={n: {"policy": _evict_any_registered} for n in ("use(full)", "use(partial)", "evict")},
    ),
    OffloadMutant(
        "partial-allocated-again",
        R.USE_PARTIAL,
        "a Use of a held partial uuid takes a second slot for it",
        R.INV_PARTIAL_UUID,
        patch=_partial_allocated_again,
    ),
    OffloadMutant(
        "g2-stored-at-enqueue",
        R.G2_STORE_ON_COMPLETE,
        "host-pinned Stored published at offload enqueue",
        R.INV_ROUTER_MATCH,
        patch=_g2_stored_at_enqueue,
    ),
    OffloadMutant(
        "device-removed-at-completion",
        R.DEVICE_REMOVE_IMMEDIATE,
        "device Removed delayed to transfer completion",
        R.INV_ROUTER_MATCH,
        patch=_device_removed_at_completion,
    ),
    OffloadMutant(
        "swapin-registers-present",
        R.SWAPIN_SKIP_PRESENT,
        "swap-in registers a block G1 already holds",
        R.INV_NO_DUP,
        extra={"swapin_register": {"lookup": _never_present}},
    ),
    OffloadMutant(
        "swapin-anchor-from-g2",
        R.SWAPIN_ANCHOR,
        "swap-in anchors its Stored to G2's recorded parent",
        R.INV_ANCHOR,
        extra={"swapin_register": {"first_anchor": _anchor_to_g2_parent}},
    ),
    OffloadMutant(
        "contract:swapin-parent-released",
        ASSUME_SWAPIN_PARENT_HELD,
        "the caller may release a pending swap-in's parent (the contract dropped)",
        "LEMMA-SWAPIN-PARENT-HELD",
        drop=(ASSUME_SWAPIN_PARENT_HELD,),
    ),
    OffloadMutant(
        "free-counter-stuck",
        R.USE_NEW,
        "a Use takes a free slot and the free counter does not move",
        "LEMMA-FREE-COUNT",
        patch=_free_counter_stuck,
    ),
    OffloadMutant(
        "reserved-counter-stuck",
        R.SWAPIN_RESERVE,
        "a swap-in reservation does not count its slot",
        "LEMMA-RESERVED-COUNT",
        patch=_reserved_counter_stuck,
    ),
    OffloadMutant(
        "g2-keeps-victim",
        R.G2_EVICT,
        "a full G2 stores the offloaded block and keeps its victim",
        "LEMMA-G2-CAPACITY",
        patch=_g2_keeps_victim,
    ),
    OffloadMutant(
        "host-stored-parent-dropped",
        R.G2_STORE_ON_COMPLETE,
        "the host-pinned Stored names the root, not its block's recorded parent",
        "INV-HOST-ANCHOR",
        patch=_host_stored_parent_dropped,
    ),
]


def mutant(name: str) -> OffloadMutant:
    for m in MUTANTS:
        if m.name == name:
            return m
    raise KeyError(f"unknown mutant {name!r}; known: {[m.name for m in MUTANTS]}")


def refute(m: OffloadMutant, bound: Bound, *, only_expected: bool = True) -> list[Result]:
    """Run the prover on the mutant (the uses of policies keep "unordered",
    unless the mutant swaps in its own)."""
    from kvspec.reference.smt.offload.invariants import by_id

    props = [by_id(m.expect)] if only_expected else None
    return prove(bound, props=props, applier=m.applier, transitions=TRANSITIONS)


#: mutants of the bounded encoding only (the three lemmas they break, the counters and G2's capacity,
#: had no seeded bug; the unbounded encoding's mutant list is the others, same names)
BOUNDED_ONLY = ("free-counter-stuck", "reserved-counter-stuck", "g2-keeps-victim", "host-stored-parent-dropped")
