"""Seeded bugs of the kvbm, legacy and atomic *encodings* that only the model can expose.

A profile's own mutants (``ProfileEncoding.mutants``) break one of its invariants,
so ``kvspec prove --profile P`` refutes them. The bugs here are of the other
kind: the encoding moves differently from the model (a hit that takes no
owner, a Deref that never makes a block inactive, a Use whose groups forget
the caller's parent) while the invariants may well still hold of what it
does. Only the agreement with the model (``profile_agreement.py``) can catch
them, so they measure its budget: together with the profile mutants they
give every kind of step each profile encodes at least one seeded bug
(``tests/test_smt_profile_agreement.py`` checks that coverage and that each
is caught).

Each one wraps one transition of one profile and changes the step it
returns (``patched``); the steps without state of their own (``use(begin)``
of kvbm and legacy only enters the batch) have none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import z3

from kvspec.reference.smt.blocks.encoding import IDLE, NONE, PLACE, BState, BStep, ProfileEncoding, Transition
from kvspec.spec.registry import ATOMIC_NAME, KVBM_NAME, LEGACY_NAME


@dataclass(frozen=True)
class ProfileEncodingMutant:
    name: str
    #: the profiles whose transition of that name it breaks
    profiles: tuple[str, ...]
    transition: str
    #: the rule whose step it gets wrong
    rule: str
    description: str
    #: (the step, its inputs) -> the broken step
    patch: Callable[[BStep, dict[str, z3.ExprRef]], BStep]


def _hit_takes_no_owner(step: BStep, i: dict[str, z3.ExprRef]) -> BStep:
    S, h = step.pre, i["h"]
    hit = z3.And(S.v["phase"] == PLACE, S.a["reg"][h], S.a["own"][h] == 0)
    step.post = step.post.write("h", h, hit, own=z3.IntVal(0))
    return step


def _deref_keeps_last_owner(step: BStep, i: dict[str, z3.ExprRef]) -> BStep:
    S, h = step.pre, i["h"]
    step.post = step.post.write("h", h, z3.And(S.a["reg"][h], S.a["own"][h] == 1), own=z3.IntVal(1))
    return step


def _deref_partial_keeps_last_owner(step: BStep, i: dict[str, z3.ExprRef]) -> BStep:
    S, u = step.pre, i["u"]
    step.post = step.post.write("u", u, z3.And(S.a["preg"][u], S.a["pown"][u] == 1), pown=z3.IntVal(1))
    return step


def _destroy_partial_keeps_entry(step: BStep, i: dict[str, z3.ExprRef]) -> BStep:
    S, u = step.pre, i["u"]
    step.post = step.post.write("u", u, True, preg=z3.BoolVal(True), pown=S.a["pown"][u])
    return step


def _promote_existing_no_owner(step: BStep, i: dict[str, z3.ExprRef]) -> BStep:
    S, h = step.pre, i["h"]
    step.post = step.post.write("h", h, S.a["reg"][h], own=S.a["own"][h])
    return step


def _begin_forgets_parent(step: BStep, i: dict[str, z3.ExprRef]) -> BStep:
    step.post = step.post.but(anc=z3.IntVal(NONE), prev=z3.IntVal(NONE))
    return step


def _declare_partial_not_needed(step: BStep, i: dict[str, z3.ExprRef]) -> BStep:
    step.post = step.pre
    return step


def _place_partial_no_slot(step: BStep, i: dict[str, z3.ExprRef]) -> BStep:
    S = step.pre
    step.post = step.post.but(free=z3.If(S.a["preg"][i["u"]], step.post.v["free"], step.post.v["free"] + 1))
    return step


def _close_keeps_evicted(step: BStep, i: dict[str, z3.ExprRef]) -> BStep:
    S, x = step.pre, z3.Int("xm")
    post = step.post
    step.post = post.but(dev=z3.Lambda([x], z3.Or(post.a["dev"][x], z3.And(S.a["ev"][x], S.a["dev"][x]))))
    return step


PROFILE_ENCODING_MUTANTS: list[ProfileEncodingMutant] = [
    ProfileEncodingMutant(
        "hit-takes-no-owner",
        (KVBM_NAME, LEGACY_NAME),
        "use(full)",
        "USE-HIT-INACTIVE",
        "a Use that names an inactive block leaves it inactive (no owner taken)",
        _hit_takes_no_owner,
    ),
    ProfileEncodingMutant(
        "deref-keeps-last-owner",
        (KVBM_NAME, LEGACY_NAME, ATOMIC_NAME),
        "deref(full)",
        "DEREF-OWNER",
        "a Deref of a block's last owner leaves it active",
        _deref_keeps_last_owner,
    ),
    ProfileEncodingMutant(
        "deref-partial-keeps-last-owner",
        (LEGACY_NAME,),
        "deref(partial)",
        "DEREF-OWNER",
        "a Deref of a partial entry's last owner leaves it active",
        _deref_partial_keeps_last_owner,
    ),
    ProfileEncodingMutant(
        "destroy-partial-keeps-entry",
        (LEGACY_NAME,),
        "destroy(partial)",
        "DESTROY-ACTIVE",
        "a destroyed partial entry stays in the cache",
        _destroy_partial_keeps_entry,
    ),
    ProfileEncodingMutant(
        "promote-existing-no-owner",
        (KVBM_NAME, LEGACY_NAME, ATOMIC_NAME),
        "promote",
        "PROMOTE-EXISTING",
        "a Promote onto a registered block does not add an owner to it",
        _promote_existing_no_owner,
    ),
    ProfileEncodingMutant(
        "begin-forgets-parent",
        (ATOMIC_NAME,),
        "use(begin)",
        "PARENT-ANCHOR",
        "a Use's first Stored group is anchored to the root, not the caller's parent",
        _begin_forgets_parent,
    ),
    ProfileEncodingMutant(
        "declare-partial-not-needed",
        (ATOMIC_NAME,),
        "use(declare partial)",
        "USE-PARTIAL",
        "an unheld partial block is not counted as needing a slot",
        _declare_partial_not_needed,
    ),
    ProfileEncodingMutant(
        "place-partial-no-slot",
        (ATOMIC_NAME,),
        "use(place partial)",
        "USE-PARTIAL",
        "a new partial block's slot is not taken from the free count",
        _place_partial_no_slot,
    ),
    ProfileEncodingMutant(
        "close-keeps-evicted",
        (ATOMIC_NAME,),
        "use(close)",
        "REMOVE-EXACT",
        "a Use's closing Removed leaves the blocks it evicted in the router's view",
        _close_keeps_evicted,
    ),
]


def _widen(extra: Callable[[BState, dict[str, z3.ExprRef]], z3.BoolRef]) -> Callable[..., BStep]:
    """A guard made too weak: the step is also enabled when ``extra`` holds."""

    def patch(step: BStep, i: dict[str, z3.ExprRef]) -> BStep:
        step.requires = [z3.Or(z3.And(step.requires), extra(step.pre, i))]
        return step

    return patch


def _validate_dropped(step: BStep, i: dict[str, z3.ExprRef]) -> BStep:
    step.requires = [step.pre.v["phase"] == PLACE]
    return step


#: guard bugs: the encoding allows a move the model refuses. The sampled agreement checks only
#: the model's moves (one direction), so these are for the exhaustive check (``blocks/equivalence.py``)
GUARD_MUTANTS: list[ProfileEncodingMutant] = [
    ProfileEncodingMutant(
        "deref-guard-off-by-one",
        (KVBM_NAME, LEGACY_NAME, ATOMIC_NAME),
        "deref(full)",
        "DEREF-UNKNOWN",
        "a Deref of a registered block is enabled at zero owners too (own >= 0, not >= 1)",
        _widen(lambda S, i: z3.And(S.v["phase"] == IDLE, S.a["reg"][i["h"]], S.a["own"][i["h"]] == 0)),
    ),
    ProfileEncodingMutant(
        "promote-guard-unheld",
        (KVBM_NAME, ATOMIC_NAME),
        "promote",
        "PROMOTE-UNKNOWN",
        "a Promote of a uuid no partial block holds is enabled",
        _widen(lambda S, i: z3.And(S.v["phase"] == IDLE, z3.Not(S.a["preg"][i["u"]]), i["h"] >= 0)),
    ),
    ProfileEncodingMutant(
        "validate-partial-dropped",
        (LEGACY_NAME,),
        "use(validate partial)",
        "USE-VALIDATE",
        "a Use may name a partial block that is already held",
        _validate_dropped,
    ),
]


def profile_encoding_mutants(profile: str) -> list[ProfileEncodingMutant]:
    return [m for m in PROFILE_ENCODING_MUTANTS if profile in m.profiles]


def guard_mutants(profile: str) -> list[ProfileEncodingMutant]:
    return [m for m in GUARD_MUTANTS if profile in m.profiles]


def patched(prof: ProfileEncoding, name: str) -> ProfileEncoding:
    """``prof`` with encoding mutant ``name`` swapped in for its transition."""
    every = [*profile_encoding_mutants(prof.name), *guard_mutants(prof.name)]
    m = next((m for m in every if m.name == name), None)
    if m is None:
        known = [m.name for m in every]
        raise KeyError(f"the {prof.name} profile has no encoding mutant {name!r}; known: {known}")
    original = prof.transitions[m.transition]

    def broken(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
        return m.patch(original(S, i, tw), i)

    transitions: dict[str, Transition] = {**prof.transitions, m.transition: broken}
    return replace(prof, transitions=transitions)
