"""The transitions the prover checks, with the domains of their inputs.

Every input and choice of a transition ranges over a finite domain of the
bound (a slot, a block hash, "a block hash or none", a uuid, a job); the
prover makes each a fresh z3 constant constrained to its domain, so one
check covers every operation of that kind from every state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import z3

from kvspec.reference.smt.offload.state import State
from kvspec.reference.smt.offload.step import EncodedStep
from kvspec.reference.smt.offload.transitions import (
    Policy,
    deref_full,
    deref_partial,
    evict,
    offload_complete,
    promote,
    swapin_register,
    swapin_reserve,
    use_full,
    use_partial,
)
from kvspec.reference.smt.universe import NONE, Bound

Domain = Literal["slot", "hash", "hash?", "uuid", "job"]


def domain_range(bound: Bound, dom: Domain) -> range:
    return {
        "slot": range(bound.slots),
        "hash": range(bound.hashes),
        "hash?": range(NONE, bound.hashes),
        "uuid": range(bound.uuids),
        "job": range(bound.jobs),
    }[dom]


def in_domain(bound: Bound, x: z3.ArithRef, dom: Domain) -> z3.BoolRef:
    r = domain_range(bound, dom)
    return z3.And(r.start <= x, x < r.stop)


@dataclass(frozen=True)
class TransitionSpec:
    name: str
    fn: Callable[..., EncodedStep]
    #: the operation's inputs (positional, in order)
    inputs: dict[str, Domain]
    #: the rule's choices (keyword)
    choices: dict[str, Domain] = field(default_factory=dict)
    takes_policy: bool = False
    #: extra keyword arguments (mutants use them to swap in a broken part)
    extra: dict[str, Any] = field(default_factory=dict)
    #: symmetry reduction: the slots (and job) this transition picks, fixed to
    #: the lowest indices (see ``instantiate``)
    canonical: dict[str, int] = field(default_factory=dict)
    #: symmetry reduction on the pre-state (block hashes are alike as well)
    canonical_state: Callable[[State], list[z3.BoolRef]] | None = None

    def instantiate(
        self, S: State, prefix: str, policy: Policy, *, symmetry: bool = False
    ) -> tuple[EncodedStep, dict[str, z3.ArithRef], list[z3.BoolRef]]:
        """Apply to ``S`` with fresh inputs and choices; return the step, the
        fresh constants by name, and their domain constraints.

        With ``symmetry`` the slots (and swap-in job) the transition picks are
        fixed to the lowest indices. That loses nothing: every rule treats
        slots alike and so does every invariant, so renaming the slots maps
        any step onto one whose picked slots are 0 (and 1 when a rule picks
        two distinct slots); the same holds for job ids. Swap-in registration
        registers a job's slots in any order in the proofs (the model's order is
        one of them), so its slot is fixed to 0 as well. A test checks that
        the reduced and unreduced proofs agree on a small bound."""
        consts: dict[str, z3.ArithRef] = {}
        doms: list[z3.BoolRef] = []
        for name, dom in {**self.inputs, **self.choices}.items():
            c = z3.Int(f"{prefix}{name}")
            consts[name] = c
            if symmetry and name in self.canonical:
                doms.append(c == self.canonical[name])
            elif name in self.inputs:
                doms.append(in_domain(S.bound, c, dom))
        if symmetry and self.canonical_state is not None:
            doms += self.canonical_state(S)
        kwargs: dict[str, Any] = {n: consts[n] for n in self.choices}
        if self.takes_policy:
            kwargs["policy"] = policy
        kwargs |= self.extra
        step = self.fn(S, *[consts[n] for n in self.inputs], **kwargs)
        return step, consts, doms


TRANSITIONS: list[TransitionSpec] = [
    TransitionSpec(
        "use(full)",
        use_full,
        {"h": "hash", "a": "hash?", "m": "hash?"},
        {"t": "slot", "s": "slot", "v": "slot"},
        takes_policy=True,
        canonical={"t": 0, "s": 0, "v": 0},
    ),  # one of the three cases applies
    TransitionSpec(
        "use(partial)",
        use_partial,
        {"u": "uuid"},
        {"s": "slot", "v": "slot"},
        takes_policy=True,
        canonical={"s": 0, "v": 0},
    ),
    TransitionSpec("deref(full)", deref_full, {"h": "hash"}, {"t": "slot"}, canonical={"t": 0}),
    TransitionSpec("deref(partial)", deref_partial, {"u": "uuid"}, {"s": "slot"}, canonical={"s": 0}),
    TransitionSpec(
        "promote",
        promote,
        {"u": "uuid", "h": "hash", "p": "hash?"},
        {"s": "slot", "t": "slot"},
        canonical={"s": 0, "t": 1},
    ),  # the partial slot and the existing block's slot differ
    TransitionSpec("evict", evict, {}, {"v": "slot"}, takes_policy=True, canonical={"v": 0}),
    TransitionSpec(
        "offload_complete",
        offload_complete,
        {"s": "slot"},
        {"w": "hash"},
        canonical={"s": 0, "w": 1},  # G2's victim is named 1 and the offloaded block 0:
        canonical_state=lambda S: [S.pblk[0] == 0],
    ),  # block hashes are alike too
    TransitionSpec(
        "swapin_reserve",
        swapin_reserve,
        {"j": "job", "h": "hash", "p": "hash?"},
        {"s": "slot"},
        canonical={"s": 0, "j": 0},
    ),
    TransitionSpec(
        "swapin_register", swapin_register, {"j": "job"}, {"k": "slot"}, canonical={"j": 0, "k": 0}
    ),  # any order of the job's slots
]


def transition(name: str) -> TransitionSpec:
    for t in TRANSITIONS:
        if t.name == name:
            return t
    raise KeyError(f"unknown transition {name!r}; known: {[t.name for t in TRANSITIONS]}")
