"""The unbounded encoding takes the same steps as the bounded one.

``unbounded.py`` writes the kvbm-with-offload rules a second time, over
arrays and an uninterpreted sort of slots. This check binds the two: on a
finite instance (``k`` slots, ``H`` hashes) every state satisfying both
hypotheses is one state seen twice (each slot field of slot ``i`` of the
bounded state is the array's value at the ``i``-th slot constant, each hash
or job field the array's value at that index), and for every transition
and every input and choice, z3 shows that the step is enabled in one
encoding exactly when it is in the other and then leads to the same
post-state, field by field (the ghosts aside). ``unsat`` of the negation is
the proof; a ``sat`` names the transition that differs. The bounded
encoding is in turn compared with the Python model (``agreement.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import z3

from kvspec.reference.smt.offload.catalogue import TRANSITIONS as BOUNDED
from kvspec.reference.smt.offload.invariants import assumed
from kvspec.reference.smt.offload.state import FIELDS, Rigid, State
from kvspec.reference.smt.unbounded.encoding import Slot, UState
from kvspec.reference.smt.unbounded.models import _finite_base, finite_check
from kvspec.reference.smt.universe import Bound

K_SLOTS, K_HASHES = 2, 3


def _same(B: State, S, slots: list[z3.ExprRef], H: int) -> list[z3.BoolRef]:
    """Field by field: the bounded state ``B`` is the unbounded state ``S``."""
    out: list[z3.BoolRef] = []
    for name, (dim, _sort) in FIELDS.items():
        b = getattr(B, name)
        if dim == "scalar":
            u = S.ropen if name == "ropen" else S.v[name]
            out.append(b == u)
        elif dim == "slot":
            out += [b[i] == S.a[name][c] for i, c in enumerate(slots)]
        else:
            out += [b[i] == S.a[name][i] for i in range(len(b))]
    return out


def disagreements(
    k: int = K_SLOTS, H: int = K_HASHES, timeout_ms: int = 120_000, tw: frozenset[str] = frozenset()
) -> list[str]:
    """The transitions on which the two encodings differ (empty: none), with
    the unbounded one broken by the tweaks ``tw`` (a test shows a mutant is
    caught). Not vacuous: for each transition, a state both encodings accept
    with the step enabled must exist."""
    bound = Bound(k, H)
    slots = [z3.Const(f"slot{i}", Slot) for i in range(k)]
    problems: list[str] = []
    for spec in BOUNDED:

        def build(S, spec=spec, witness: bool = False) -> list[z3.BoolRef]:
            ustep, ubase = _finite_base(spec.name, tw)(S)
            ubase = ubase[:-1]  # all but "enabled"
            rigid = Rigid(S.cap2, [z3.Int(f"par{h}") for h in range(H)])
            B = State.fresh(bound, rigid, "b_")
            bstep, consts, doms = spec.instantiate(B, "in_", "unordered")
            links = []
            domains = {**spec.inputs, **spec.choices}
            for name, c in consts.items():
                if domains[name] == "slot":
                    u = z3.Const(f"in_{name}", Slot)
                    links.append(z3.And(0 <= c, c < k))
                    links.append(z3.Or([z3.And(c == i, u == s) for i, s in enumerate(slots)]))
                elif domains[name] == "job":
                    links.append(c < bound.jobs)
                elif domains[name] == "hash":
                    links.append(c < H)
            both = [*rigid.domain(), *B.domain(), *doms, assumed(B), *_same(B, S, slots, H), *links, *ubase]
            agree = z3.And(
                bstep.enabled() == ustep.enabled(),
                z3.Implies(bstep.enabled(), z3.And(_same(bstep.post, ustep.post, slots, H))),
            )
            return [*both, bstep.enabled()] if witness else [*both, z3.Not(agree)]

        def accepted(S: UState, b: Callable[..., list[z3.BoolRef]] = build) -> list[z3.BoolRef]:
            return b(S, witness=True)

        r, _ = finite_check(accepted, k=k, H=H, timeout_ms=timeout_ms)
        if r != z3.sat:
            problems.append(f"{spec.name}: no state both encodings accept with the step enabled ({r})")
            continue
        r, _ = finite_check(build, k=k, H=H, timeout_ms=timeout_ms)
        if r != z3.unsat:
            problems.append(f"{spec.name}: the encodings differ ({r})")
    return problems
