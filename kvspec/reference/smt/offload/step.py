"""What one transition of the encoding produces, and the router's view of it.

A transition is a function from a pre-state and its inputs to a ``EncodedStep``:
the post-state of the manager, the events it publishes (as ``Frag``\\ s, one
block each), and named conditions:

- ``requires``: when the transition may happen, by name and category:
  ``valid`` (the model accepts the operation; otherwise it rejects it and
  nothing changes, which trivially keeps every invariant), ``contract`` (an
  assumption about the caller, named ``ASSUME-...``; see spec/INVARIANTS.md)
  and ``choice`` (which slot, which victim: the existential witnesses of the
  rule, left free so the proof covers every choice the rules allow).
- ``rules``: rule id -> the condition under which that rule fires, so a
  counterexample can say which rules the step applied.
- ``anchors``: for INV-ANCHOR, each device Stored's parent together with the
  router's device view at the moment the router applies that Stored.

The router's view in the post-state is never written by a transition: it is
what the pre-state's view becomes after applying the published events, in
order (``publish``). That is how a router's indexer sees the manager, so a
transition that forgets or misplaces an event breaks INV-ROUTER-MATCH.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeAlias

import z3

from kvspec.reference.smt.offload.state import State
from kvspec.reference.smt.terms import upd

Term: TypeAlias = z3.ExprRef
Tier = Literal["device", "host_pinned"]
Kind = Literal["stored", "removed"]
Category = Literal["valid", "contract", "choice"]

STATUS_OK, STATUS_CAPACITY, STATUS_BLOCKED = 0, 1, 2

#: every caller contract's id starts so (spec/INVARIANTS.md, "Caller contracts")
CONTRACT_PREFIX = "ASSUME-"


class ContractError(ValueError):
    """A transition tried to file a contract under a name that is not its own."""


@dataclass(frozen=True)
class Frag:
    """One block in a published event."""

    when: z3.BoolRef
    tier: Tier
    kind: Kind
    block: Term
    #: Stored only: the parent the event names (its group's anchor)
    parent: Term | None = None
    #: Stored only: this block opens a new Stored event (swap-in groups)
    starts_group: z3.BoolRef | bool = False


@dataclass(frozen=True)
class Anchor:
    """INV-ANCHOR obligation: when ``when``, a device Stored names ``parent``
    and the router's device view is ``view`` as it applies that Stored."""

    when: z3.BoolRef
    parent: Term
    view: list[Term]


@dataclass
class EncodedStep:
    name: str
    pre: State
    post: State
    params: dict[str, Term] = field(default_factory=dict)
    requires: dict[str, tuple[Category, z3.BoolRef]] = field(default_factory=dict)
    rules: dict[str, z3.BoolRef] = field(default_factory=dict)
    frags: list[Frag] = field(default_factory=list)
    anchors: list[Anchor] = field(default_factory=list)
    #: Use of one block: was it placed, and if not why (STATUS_*)
    placed: z3.BoolRef = field(default_factory=lambda: z3.BoolVal(True))
    status: Term = field(default_factory=lambda: z3.IntVal(STATUS_OK))
    #: the slots a step released back to free (QUARANTINE-RELEASE, skips): for printing
    notes: dict[str, Term] = field(default_factory=dict)

    def require(self, name: str, category: Category, cond: z3.BoolRef) -> None:
        """Add a named condition. A contract narrows what the proofs cover, so
        it must be visible as itself: its id starts with ``ASSUME-`` and is new
        to this step (a second condition under an existing name, or a rule's
        validity condition re-filed as a contract, would hide the narrowing
        inside a name that reads as something else). A validity or choice
        condition added twice under its own name is conjoined."""
        if category == "contract":
            if not name.startswith(CONTRACT_PREFIX):
                raise ContractError(f"{self.name}: contract {name!r} must have its own id starting {CONTRACT_PREFIX!r}")
            if name in self.requires:
                raise ContractError(f"{self.name}: contract {name!r} is already required; a contract has one condition")
            self.requires[name] = (category, cond)
            return
        if name.startswith(CONTRACT_PREFIX):
            raise ContractError(f"{self.name}: {name!r} is a contract id, not a {category} condition")
        if name in self.requires:
            cat, old = self.requires[name]
            if cat != category:
                raise ContractError(f"{self.name}: {name!r} is a {cat} condition; cannot add a {category} one")
            self.requires[name] = (cat, z3.And(old, cond))
        else:
            self.requires[name] = (category, cond)

    def contracts(self) -> dict[str, z3.BoolRef]:
        """The caller contracts this step assumes, by id."""
        return {n: c for n, (cat, c) in self.requires.items() if cat == "contract"}

    def enabled(self, *categories: Category) -> z3.BoolRef:
        cats = categories or ("valid", "contract", "choice")
        return z3.And([c for cat, c in self.requires.values() if cat in cats] or [z3.BoolVal(True)])


def publish(pre: State, post: State, frags: list[Frag]) -> State:
    """Apply the published events, in order, to the router's views (device
    and host-pinned): a Stored adds its block, a Removed takes it away."""
    dev, g2v = list(pre.dev), list(pre.g2v)
    for f in frags:
        if f.tier == "device":
            dev = upd(dev, f.block, z3.BoolVal(f.kind == "stored"), f.when)
        else:
            g2v = upd(g2v, f.block, z3.BoolVal(f.kind == "stored"), f.when)
    return post.but(dev=dev, g2v=g2v)
