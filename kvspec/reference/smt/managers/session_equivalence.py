"""session: the INV-SESSION-FENCE encoding and the model have the same successors (``EQUIV-SESSION``).

Every state ``reference/session.py`` reaches from 2 free slots within the
explored depth, over an alphabet of the sessions ``s0``, ``s1``, ``s2``
(three, so that with both slots taken an admission steals one): every
admission, warm or cold; every finalize (keeping the slot or not) and reset
of every session with a handle of each slot at its current generation and
at the one before (a stale handle), and one naming a slot that does not
exist; evict-all. In each state, for each operation, the model's outcome set
must equal the encoding's (``managers/session.py``, the transitions
``kvspec prove --profile session`` proves) from the same concrete pre-state,
with the operation's session, warm flag and handle fixed and the slot the
encoding picks for an admission left free.

An outcome is every slot's generation, state and session, and the idle
slots in LRU order (the order a steal reads). An operation the model
refuses, rejects or does not apply (a stale or foreign handle, no such slot,
an admission with nothing to take) changes nothing and has no outcome; the
encoding must enable none of its transitions for it.

Not in the encoding, so not compared: the parked tokens and an admission's
answer (candidate, clearing), the snapshot queue (``snapshot``, ``drain``),
and the departures the lockstep follows (``FOLLOW``: generation-only
fencing, trusted handles, unchecked slots).
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import z3

from kvspec.reference.session import SessionModel
from kvspec.reference.smt.equivalence import all_values
from kvspec.reference.smt.managers import session
from kvspec.reference.smt.managers.session import NOBODY, SState, Transition
from kvspec.spec.manager_wire import (
    SessionAdmit,
    SessionConfig,
    SessionEvictAll,
    SessionFinalize,
    SessionReset,
)
from kvspec.spec.registry import SESSION

SLOTS = 2
SESSIONS = ("s0", "s1", "s2")
STATES = {"free": session.FREE, "idle": session.IDLE, "leased": session.LEASED}
Op = SessionAdmit | SessionFinalize | SessionReset | SessionEvictAll


def steal_most_recent(s: SState, n: int, t: str) -> tuple[SState, z3.BoolRef]:
    """Encoding mutant (SESSION-LRU): with no free slot, the most recently parked idle slot
    is taken (the fence still holds: only the comparison with the model finds it)."""
    flipped = SState(s.gen, s.st, s.old_slot, s.old_gen, s.has_old, s.own, [-x for x in s.stamp], s.clock)
    post, en = session.cold_lease(flipped, n, t)
    post.stamp, post.clock = list(s.stamp), s.clock
    return post, en


def warm_ignores_flag(s: SState, n: int, t: str) -> tuple[SState, z3.BoolRef]:
    """Encoding mutant (SESSION-CANDIDATE): a session's own idle slot is resumed warm even
    when the admission asks for a cold lease."""
    post, en = session.warm_admit(s, n, t)
    w = z3.Bool(f"{t}w")
    return post, z3.Or(en, z3.And(z3.substitute(en, (w, z3.BoolVal(True))), z3.Not(w)))


#: encoding mutants the exhaustive check must catch, beside ``cli/managers.SESSION_MUTANTS``
EQUIVALENCE_MUTANTS: dict[str, tuple[str, Transition]] = {
    "steal-most-recent": ("cold lease", steal_most_recent),
    "warm-ignores-flag": ("warm admit", warm_ignores_flag),
}


class ParkKeepsOrder(SessionModel):
    """Model bug (SESSION-LRU): parking a session that is already idle leaves it where it
    was in the LRU order instead of making it the most recently parked."""

    def park(self, op: SessionFinalize) -> object:  # type: ignore[override]
        if op.session in self.idle_lru:
            s = self.slots[op.slot]
            s.state, s.tokens = "idle", list(op.tokens)
            return self.outcome(applied=True)
        return super().park(op)


MODEL_BUGS: dict[str, type[SessionModel]] = {"park-keeps-order": ParkKeepsOrder}


@dataclass
class SNode:
    model: SessionModel


def _sid(name: str | None) -> int:
    return NOBODY if name is None else SESSIONS.index(name)


def _idle_order(m: SessionModel) -> tuple[int, ...]:
    return tuple(m.holder[k] for k in m.idle_lru)


@dataclass
class SessionSubject:
    """The session profile at ``SLOTS`` slots (``mutant``: an encoding mutant; ``model_class``: a model bug)."""

    mutant: str | None = None
    model_class: type[SessionModel] = SessionModel
    name: str = SESSION
    table: dict[str, Transition] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.table = dict(session.TRANSITIONS)
        if self.mutant is not None:
            from kvspec.reference.smt.cli.managers import SESSION_MUTANTS

            where, broken = {**SESSION_MUTANTS, **EQUIVALENCE_MUTANTS}[self.mutant]
            self.table[where] = broken

    def initial(self) -> list[SNode]:
        return [SNode(self.model_class(SessionConfig(slots=SLOTS)))]

    def key(self, n: SNode) -> Hashable:
        """A slot's generation only as 0 or not: both sides act on a generation plus a
        constant as on the generation (guards compare a handle's generation with the
        slot's, steps add 1, the alphabet's handles are the current one and the one
        before), so states equal but for that have equal comparisons, and the walk closes."""
        m = n.model
        slots = tuple((min(s.generation, 1), s.state, _sid(s.session)) for s in m.slots)
        return slots, _idle_order(m)

    def alphabet(self, n: SNode) -> Sequence[Op]:
        out: list[Op] = [SessionAdmit(session=x, warm=w) for x in SESSIONS for w in (True, False)]
        for k, s in enumerate(n.model.slots):
            for g in sorted({s.generation, max(s.generation - 1, 0)}):
                for x in SESSIONS:
                    out += [SessionFinalize(session=x, slot=k, generation=g, keep=keep) for keep in (True, False)]
                    out.append(SessionReset(session=x, slot=k, generation=g))
        out += [SessionFinalize(session="s0", slot=SLOTS, generation=0), SessionReset(session="s0", slot=SLOTS,
                generation=0), SessionEvictAll()]  # fmt: skip
        return out

    # ------------------------------------------------------------------ model
    def model_outcomes(self, n: SNode, op: Op) -> list[tuple[Hashable, SNode]]:
        m = copy.deepcopy(n.model)
        o = m.step(op)
        if o.admission is None and o.applied is not True:
            return []
        slots = tuple((s.generation, s.state, _sid(s.session)) for s in m.slots)
        return [((slots, _idle_order(m)), SNode(m))]

    # --------------------------------------------------------------- encoding
    def _plan(self, op: Op) -> tuple[list[str], dict[str, z3.ExprRef]]:
        """The transitions that may make ``op``, and its fixed inputs."""
        if isinstance(op, SessionAdmit):
            return ["cold lease", "warm admit"], {"x": z3.IntVal(_sid(op.session)), "w": z3.BoolVal(op.warm)}
        if isinstance(op, SessionEvictAll):
            return ["evict_all"], {}
        handle = {"k": z3.IntVal(op.slot), "g": z3.IntVal(op.generation), "x": z3.IntVal(_sid(op.session))}
        if isinstance(op, SessionFinalize) and op.keep:
            return ["park (finalize, keep)"], handle
        return ["release (finalize, reset)"], handle

    def _pre(self, m: SessionModel) -> SState:
        rank = {slot: i for i, slot in enumerate(_idle_order(m))}
        z = z3.IntVal(0)
        return SState(
            gen=[z3.IntVal(s.generation) for s in m.slots],
            st=[z3.IntVal(STATES[s.state]) for s in m.slots],
            old_slot=z,
            old_gen=z,
            has_old=z3.BoolVal(False),
            own=[z3.IntVal(_sid(s.session)) for s in m.slots],
            stamp=[z3.IntVal(rank.get(i, -1)) for i in range(len(m.slots))],
            clock=z3.IntVal(len(rank)),
        )

    def encoding_outcomes(self, n: SNode, op: Op) -> set[Hashable]:
        pre = self._pre(n.model)
        names, fixed = self._plan(op)
        out: set[Hashable] = set()
        back = {v: k for k, v in STATES.items()}
        for name in names:
            tag = "eq_"
            post, enabled = self.table[name](pre, SLOTS, tag)
            req = [enabled, *(_input(tag, k, v) == v for k, v in fixed.items())]
            terms: list[z3.ExprRef] = []
            for i in range(SLOTS):
                terms += [post.gen[i], post.st[i], post.own[i], post.stamp[i]]
            for vals in all_values(req, terms):
                slots = []
                idle: list[tuple[int, int]] = []
                for i in range(SLOTS):
                    gen, st, own, stamp = vals[4 * i : 4 * i + 4]
                    slots.append((gen, back.get(st, f"state {st}"), own))
                    if st == session.IDLE:
                        idle.append((stamp, i))
                out.add((tuple(slots), tuple(i for _, i in sorted(idle))))
        return out


def _input(tag: str, name: str, like: z3.ExprRef) -> z3.ExprRef:
    return z3.Bool(f"{tag}{name}") if z3.is_bool(like) else z3.Int(f"{tag}{name}")
