"""The reference model of the ``session`` profile: slot leases fenced by generations.

A fixed set of physical sequences (slots). A session is admitted onto a slot
and gets a handle ``(slot, generation)``; when its request ends the slot is
either parked idle for the session (its cache stays warm) or released. Every
cold lease, release and evict-all moves the slot's generation on, so a
handle kept from an earlier lease can never act on the slot again. With no
free slot left, the least recently parked idle session loses its slot.

Written from the semantics of a llama.cpp-based runtime's session KV cache
manager (``KvCacheManager``: ``admit``, ``finalize_slot``,
``release_slot_for_reset``, ``evict_all_active_and_idle``,
``queue_prefix_snapshot`` / ``drain_pending_prefix_snapshots``), as SPEC.md
"Session slot leases" states it. Pure and deterministic; a rejected operation
changes nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from kvspec.reference.labels import applies
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.manager_wire import (
    Admission,
    OpError,
    SessionAdmit,
    SessionConfig,
    SessionDrain,
    SessionEvictAll,
    SessionFinalize,
    SessionOp,
    SessionOutcome,
    SessionReset,
    SessionSnapshot,
    SessionState,
    SlotState,
    SlotView,
)
from kvspec.spec.rules import rid


@dataclass
class Slot:
    generation: int = 0
    state: SlotState = "free"
    session: str | None = None
    tokens: list[int] = field(default_factory=list)


class SessionModel:
    """The session-slot manager. ``step(op)`` answers like an implementation."""

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.slots = [Slot() for _ in range(config.slots)]
        #: session -> its slot while leased or idle
        self.holder: dict[str, int] = {}
        self.idle_lru: list[str] = []
        self.pending: list[tuple[int, int]] = []

    # ------------------------------------------------------------ helpers

    @applies("SESSION-VALIDATE")
    def _slot(self, slot: int) -> Slot:
        if slot >= len(self.slots):
            raise InvalidOperation(rid("SESSION-VALIDATE"), f"slot {slot} does not exist ({len(self.slots)} slots)")
        return self.slots[slot]

    @applies("SESSION-FENCE", "SESSION-LEASE")
    def _current(self, session: str, slot: int, generation: int) -> Slot | None:
        """The slot a handle names if the handle is current (None: fenced off);
        a current handle of another session is rejected."""
        s = self._slot(slot)
        if s.generation != generation or s.state == "free":
            return None
        if s.session != session:
            raise InvalidOperation(
                rid("SESSION-LEASE"), f"handle ({slot}, {generation}) belongs to session {s.session!r}, not {session!r}"
            )
        return s

    @applies("SESSION-RELEASE", "SESSION-FENCE")
    def _release(self, index: int) -> None:
        s = self.slots[index]
        if s.session is not None:
            self.holder.pop(s.session, None)
            if s.session in self.idle_lru:
                self.idle_lru.remove(s.session)
        s.state, s.session, s.tokens = "free", None, []
        s.generation += 1
        self.pending = [p for p in self.pending if p[0] != index]

    # ------------------------------------------------------------ operations

    @applies("SESSION-LEASE", "SESSION-LRU", "SESSION-CANDIDATE", "SESSION-FENCE")
    def admit(self, op: SessionAdmit) -> tuple[Admission | None, str | None]:
        """(admission, None) or (None, the rule of the refusal)."""
        key = op.session
        own = self.holder.get(key)
        if own is not None and self.slots[own].state == "leased":
            return None, str(rid("SESSION-LEASE"))
        if own is not None and op.warm:
            s = self.slots[own]
            s.state = "leased"
            self.idle_lru.remove(key)
            return Admission(
                slot=own, generation=s.generation, candidate="live", requires_clear=False, tokens=list(s.tokens)
            ), None
        free = [i for i, s in enumerate(self.slots) if s.state == "free"]
        if own is not None:
            target, clear = own, True
            self.idle_lru.remove(key)
            del self.holder[key]
        elif free:
            target = free[0]
            clear = self.slots[target].generation > 0
        elif self.idle_lru:
            victim = self.idle_lru.pop(0)
            target = self.holder.pop(victim)
            clear = True
        else:
            return None, str(rid("SESSION-LRU"))
        s = self.slots[target]
        s.generation += 1
        s.state, s.session, s.tokens = "leased", key, []
        self.holder[key] = target
        self.pending = [p for p in self.pending if p[0] != target]
        return Admission(slot=target, generation=s.generation, candidate="none", requires_clear=clear), None

    @applies("SESSION-FENCE", "SESSION-RELEASE", "SESSION-LRU")
    def finalize(self, op: SessionFinalize) -> bool:
        s = self._current(op.session, op.slot, op.generation)
        if s is None:
            return False
        if op.keep:
            s.state, s.tokens = "idle", list(op.tokens)
            if op.session in self.idle_lru:
                self.idle_lru.remove(op.session)
            self.idle_lru.append(op.session)
        else:
            self._release(op.slot)
        return True

    @applies("SESSION-RELEASE")
    def reset(self, op: SessionReset) -> bool:
        if self._current(op.session, op.slot, op.generation) is None:
            return False
        self._release(op.slot)
        return True

    @applies("SESSION-RELEASE")
    def evict_all(self) -> None:
        for s in self.slots:
            s.state, s.session, s.tokens = "free", None, []
            s.generation += 1
        self.holder.clear()
        self.idle_lru.clear()
        self.pending.clear()

    def snapshot_op(self, op: SessionSnapshot) -> bool:
        self._slot(op.slot)
        self.pending.append((op.slot, op.generation))
        return True

    @applies("SESSION-FENCE")
    def drain(self) -> list[tuple[int, int]]:
        taken = [(i, g) for i, g in self.pending if self.slots[i].generation == g and self.slots[i].state != "free"]
        self.pending = []
        return taken

    # ------------------------------------------------------------ observation

    def state(self) -> SessionState:
        return SessionState(
            slots=[SlotView(state=s.state, generation=s.generation, session=s.session) for s in self.slots],
            idle_lru=list(self.idle_lru),
            in_flight=sorted(k for k, i in self.holder.items() if self.slots[i].state == "leased"),
            pending=list(self.pending),
        )

    def step(self, op: SessionOp) -> SessionOutcome:
        saved = copy.deepcopy((self.slots, self.holder, self.idle_lru, self.pending))
        try:
            if isinstance(op, SessionAdmit):
                adm, refused = self.admit(op)
                return SessionOutcome(admission=adm, refused=refused, state=self.state())
            if isinstance(op, SessionFinalize):
                return SessionOutcome(applied=self.finalize(op), state=self.state())
            if isinstance(op, SessionReset):
                return SessionOutcome(applied=self.reset(op), state=self.state())
            if isinstance(op, SessionEvictAll):
                self.evict_all()
                return SessionOutcome(applied=True, state=self.state())
            if isinstance(op, SessionSnapshot):
                return SessionOutcome(applied=self.snapshot_op(op), state=self.state())
            assert isinstance(op, SessionDrain)
            return SessionOutcome(drained=self.drain(), state=self.state())
        except InvalidOperation as e:
            self.slots, self.holder, self.idle_lru, self.pending = saved
            return SessionOutcome(error=OpError(rule=str(e.rule), message=e.message), state=self.state())
