"""The proven invariants and the lemmas that make them inductive.

Each invariant is a list of named conjuncts, so a counterexample can say
which slot or block broke it. State invariants are predicates of one state;
INV-ANCHOR and part of INV-QUARANTINE are properties of a transition (the
events it publishes, the slots it allocates), checked on every step taken
from a state that satisfies all the state invariants and lemmas.

spec/INVARIANTS.md states each one in prose, with the lemmas each needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvspec.reference.smt.offload.state import State
from kvspec.reference.smt.offload.step import EncodedStep
from kvspec.reference.smt.terms import sel
from kvspec.reference.smt.universe import ACTIVE, FREE, INACTIVE, NONE, PARTIAL, QUARANTINED, RESERVED
from kvspec.spec.rules import rid

Conjuncts = list[tuple[str, z3.BoolRef]]


# ------------------------------------------------------------------ invariants


def inv_conserve(S: State) -> Conjuncts:
    """INV-CONSERVE: the counters the manager reports account for every slot."""
    total = S.free_c + S.partial_census() + S.afull_c + S.census(INACTIVE) + S.quar_c + S.resv_c
    return [("free + partial + active + inactive + quarantined + reserved = capacity", total == S.bound.slots)]


def inv_owners(S: State) -> Conjuncts:
    """INV-OWNERS: active iff at least one owner; inactive has none."""
    out: Conjuncts = []
    for s in S.slots:
        out.append((f"slot {s}: active => owners >= 1", z3.Implies(S.st[s] == ACTIVE, S.own[s] >= 1)))
        out.append((f"slot {s}: inactive => owners = 0", z3.Implies(S.st[s] == INACTIVE, S.own[s] == 0)))
    return out


def inv_router_match(S: State) -> Conjuncts:
    """INV-ROUTER-MATCH: the router's device view is the registered G1 set and
    its host-pinned view is the G2 set."""
    out: Conjuncts = []
    for h in S.hashes:
        out.append((f"block {h}: device view == registered in G1", S.dev[h] == S.is_registered(h)))
    for h in S.hashes:
        out.append((f"block {h}: host-pinned view == held in G2", S.g2v[h] == S.g2[h]))
    return out


def inv_no_dup(S: State) -> Conjuncts:
    """INV-NO-DUP: no block hash is registered in two G1 slots."""
    out: Conjuncts = []
    for s in S.slots:
        for t in S.slots:
            if s < t:
                both = z3.And(S.registered_slot(s), S.registered_slot(t))
                out.append((f"slots {s} and {t} hold different blocks", z3.Implies(both, S.blk[s] != S.blk[t])))
    return out


def inv_quarantine(S: State) -> Conjuncts:
    """INV-QUARANTINE (state part): a slot is quarantined exactly while an
    offload transfer out of it is pending, and the quarantine counter says so.
    A quarantined slot is neither free nor registered (one state per slot)."""
    out: Conjuncts = [
        (f"slot {s}: transfer pending <=> quarantined", S.pend[s] == (S.st[s] == QUARANTINED)) for s in S.slots
    ]
    out.append(("quarantined counter == quarantined slots", S.quar_c == S.census(QUARANTINED)))
    return out


def inv_host_anchor(S: State) -> Conjuncts:
    """INV-HOST-ANCHOR (state part): a pending transfer carries the parent G1 recorded for its
    block at registration (a quarantined slot's record is not written until it is freed)."""
    return [
        (
            f"slot {s}: a pending transfer carries its block's recorded parent",
            z3.Implies(S.pend[s], S.pmpar[s] == S.mpar[s]),
        )
        for s in S.slots
    ]


def inv_partial_uuid(S: State) -> Conjuncts:
    """INV-PARTIAL-UUID: no partial-block uuid is held by two G1 slots (so a
    Deref or a Promote of a uuid names one slot, and a counterexample's
    partial slots read unambiguously)."""
    out: Conjuncts = []
    for s in S.slots:
        for t in S.slots:
            if s < t:
                both = z3.And(S.st[s] == PARTIAL, S.st[t] == PARTIAL)
                out.append((f"slots {s} and {t} hold different partial uuids", z3.Implies(both, S.pu[s] != S.pu[t])))
    return out


# --------------------------------------------------------------------- lemmas


def lemma_free_count(S: State) -> Conjuncts:
    """LEMMA-FREE-COUNT: the free counter is the number of free slots."""
    return [("free counter == free slots", S.free_c == S.census(FREE))]


def lemma_active_count(S: State) -> Conjuncts:
    """LEMMA-ACTIVE-COUNT: the active-full counter is the number of active slots."""
    return [("active counter == active slots", S.afull_c == S.census(ACTIVE))]


def lemma_reserved_count(S: State) -> Conjuncts:
    """LEMMA-RESERVED-COUNT: the reserved counter is the number of reserved slots."""
    return [("reserved counter == reserved slots", S.resv_c == S.census(RESERVED))]


def lemma_refs(S: State) -> Conjuncts:
    """LEMMA-REFS: the reference counter is the sum of the active blocks' owners."""
    total = z3.Sum([z3.If(S.st[s] == ACTIVE, S.own[s], 0) for s in S.slots])
    return [("refs counter == sum of owners", S.refs_c == total)]


def lemma_swapin_parent_held(S: State) -> Conjuncts:
    """LEMMA-SWAPIN-PARENT-HELD: a pending swap-in's parent is the root or an
    active G1 block (it cannot be evicted before the swap-in registers)."""
    return [
        (
            f"job {j}: pending => parent is root or active",
            z3.Implies(S.job_live(j), z3.Or(S.jpar[j] == NONE, S.is_active(S.jpar[j]))),
        )
        for j in range(S.bound.jobs)
    ]


def lemma_onboard_anchor(S: State) -> Conjuncts:
    """LEMMA-ONBOARD-ANCHOR: while a swap-in job is being registered, it still
    holds a reserved slot and its current group's anchor is the root or a
    registered block (the parent it was given, or a block it skipped)."""
    busy = S.busy != NONE
    return [
        ("registration in progress => its job still has a reserved slot", z3.Implies(busy, S.job_live(S.busy))),
        (
            "registration in progress => its anchor is root or registered",
            z3.Implies(busy, z3.Or(S.ranc == NONE, S.is_registered(S.ranc))),
        ),
    ]


def lemma_g2_capacity(S: State) -> Conjuncts:
    """LEMMA-G2-CAPACITY: G2 never holds more blocks than its capacity."""
    return [("G2 count <= G2 capacity", S.g2_count() <= S.rigid.cap2)]


# -------------------------------------------------------- transition properties


def step_anchor(step: EncodedStep) -> Conjuncts:
    """INV-ANCHOR: every device Stored's parent is the root or held by the
    router's device view when the router applies that Stored (by
    INV-ROUTER-MATCH: registered in G1 when the event is emitted)."""
    return [
        (
            f"device Stored #{i} names a parent the router holds",
            z3.Implies(a.when, z3.Or(a.parent == NONE, sel(a.view, a.parent))),
        )
        for i, a in enumerate(step.anchors)
    ]


def step_host_anchor(step: EncodedStep) -> Conjuncts:
    """INV-HOST-ANCHOR: every host-pinned Stored names as parent the parent G1 recorded for its
    block when it registered it (the parent its device Stored was anchored under, INV-ANCHOR)."""
    if step.name != "offload_complete":
        return []
    s = step.params["s"]
    return [
        (
            f"host-pinned Stored #{i} names its block's recorded parent",
            z3.Implies(f.when, f.parent == sel(step.pre.mpar, s)),
        )
        for i, f in enumerate(step.frags)
        if f.tier == "host_pinned" and f.kind == "stored" and f.parent is not None
    ]


def step_quarantine(step: EncodedStep) -> Conjuncts:
    """INV-QUARANTINE (transition part): a quarantined slot is never allocated;
    it leaves quarantine only to free, and only as its transfer completes."""
    pre, post = step.pre, step.post
    out: Conjuncts = []
    for s in pre.slots:
        leaves = z3.And(pre.st[s] == QUARANTINED, post.st[s] != QUARANTINED)
        out.append(
            (
                f"slot {s}: leaves quarantine only to free, at its transfer's completion",
                z3.Implies(leaves, z3.And(post.st[s] == FREE, pre.pend[s], z3.Not(post.pend[s]))),
            )
        )
    return out


@dataclass(frozen=True)
class Property:
    id: str
    doc: str
    state: Callable[[State], Conjuncts] | None = None
    step: Callable[[EncodedStep], Conjuncts] | None = None
    lemma: bool = False

    def state_conjuncts(self, S: State) -> Conjuncts:
        return self.state(S) if self.state is not None else []

    def step_conjuncts(self, step: EncodedStep) -> Conjuncts:
        out = self.state_conjuncts(step.post)
        if self.step is not None:
            out += self.step(step)
        return out


INVARIANTS: list[Property] = [
    Property(
        rid("INV-CONSERVE"), "free + partial + active + inactive + quarantined + reserved = capacity", inv_conserve
    ),
    Property(rid("INV-OWNERS"), "a block is active iff it has an owner; inactive blocks have none", inv_owners),
    Property(
        rid("INV-ROUTER-MATCH"),
        "router view per tier == registered blocks (device: G1, host-pinned: G2)",
        inv_router_match,
    ),
    Property(rid("INV-NO-DUP"), "no block hash is registered in two G1 slots", inv_no_dup),
    Property(
        rid("INV-QUARANTINE"),
        "quarantined exactly while its offload is pending; never allocated",
        inv_quarantine,
        step_quarantine,
    ),
    Property(rid("INV-ANCHOR"), "every device Stored's parent is the root or held by the router", None, step_anchor),
    Property(rid("INV-PARTIAL-UUID"), "no partial-block uuid is held by two G1 slots", inv_partial_uuid),
    Property(
        rid("INV-HOST-ANCHOR"),
        "every host-pinned Stored names its block's parent as G1 recorded it",
        inv_host_anchor,
        step_host_anchor,
    ),
]

#: invariants of the bounded encoding only (the unbounded one, ``unbounded/encoding.py``, has no row for them)
BOUNDED_ONLY_INVARIANTS: tuple[str, ...] = ("INV-HOST-ANCHOR",)

LEMMAS: list[Property] = [
    Property("LEMMA-FREE-COUNT", "free counter == free slots", lemma_free_count, lemma=True),
    Property("LEMMA-ACTIVE-COUNT", "active counter == active slots", lemma_active_count, lemma=True),
    Property("LEMMA-RESERVED-COUNT", "reserved counter == reserved slots", lemma_reserved_count, lemma=True),
    Property("LEMMA-REFS", "refs counter == sum of the active blocks' owners", lemma_refs, lemma=True),
    Property(
        "LEMMA-SWAPIN-PARENT-HELD",
        "a pending swap-in's parent is the root or active",
        lemma_swapin_parent_held,
        lemma=True,
    ),
    Property(
        "LEMMA-ONBOARD-ANCHOR",
        "a registration in progress has a slot left and a registered anchor",
        lemma_onboard_anchor,
        lemma=True,
    ),
    Property("LEMMA-G2-CAPACITY", "G2 holds at most its capacity", lemma_g2_capacity, lemma=True),
]

ALL_PROPERTIES: list[Property] = INVARIANTS + LEMMAS


def by_id(pid: str) -> Property:
    for p in ALL_PROPERTIES:
        if p.id == pid:
            return p
    raise KeyError(f"unknown invariant or lemma {pid!r}; known: {[p.id for p in ALL_PROPERTIES]}")


def assumed(S: State, props: list[Property] | None = None) -> z3.BoolRef:
    """The inductive hypothesis: every state invariant and lemma holds in ``S``."""
    props = ALL_PROPERTIES if props is None else props
    return z3.And([c for p in props for _l, c in p.state_conjuncts(S)] or [z3.BoolVal(True)])
