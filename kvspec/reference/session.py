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
"Session slot leases" states it. Pure and deterministic.

The model is a transition table (``reference.transitions``): per operation,
the rules in the order they are tried, each with its guard (which reads the
state) and its effect (which changes it and answers). A refusal or a
rejection is a transition whose effect changes nothing, so a rejected
operation leaves the state as it was. Guards and effects are named by method,
so a variant (the mutant zoo's) overrides one method and keeps the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvspec.reference.transitions import Transition, TransitionModel, always
from kvspec.spec.manager_wire import (
    Admission,
    OpError,
    SessionAdmit,
    SessionConfig,
    SessionDrain,
    SessionEvictAll,
    SessionFinalize,
    SessionOutcome,
    SessionReset,
    SessionSnapshot,
    SessionState,
    SlotState,
    SlotView,
)
from kvspec.spec.rules import RuleId, rid

#: the operations that carry a handle (slot, generation) of a session
Handle = SessionFinalize | SessionReset


@dataclass
class Slot:
    generation: int = 0
    state: SlotState = "free"
    session: str | None = None
    tokens: list[int] = field(default_factory=list)


def _refuse(rule: str) -> Callable[[SessionModel, SessionAdmit], SessionOutcome]:
    """The effect of a refused admission: nothing changes, the answer names the rule."""
    return lambda m, op: m.outcome(refused=rule)


class SessionModel(TransitionModel[SessionOutcome]):
    """The session-slot manager. ``step(op)`` answers like an implementation.

    ``FOLLOW``: the departures the lockstep can follow when a manifest
    declares them (``kvspec.conformance.managers.follow``): condition -> (the
    rule it breaks, the switch that runs the one step that departs). They are
    the llama.cpp-based runtime's ``KvCacheManager`` handle checks
    (``sequence_generation_matches`` compares the generation only, and
    ``finalize_slot`` / ``release_slot_for_reset`` trust the handle):

    - ``handle_of_free_slot`` (SESSION-FENCE, ``fence_generation_only``): a
      handle with a free slot's generation acts on it (a finalize that keeps
      parks the slot idle for the session, one that does not, or a reset,
      releases it); a drain hands out a free slot's pending snapshot;
    - ``handle_of_another_session`` (SESSION-LEASE, ``trust_handle_session``):
      a current handle of a slot another session leased acts under the
      caller's name (keep: the slot is parked idle for the caller), and the
      leasing session stays in flight with no slot (``orphaned``: it is
      refused every admission until an evict-all);
    - ``handle_of_no_slot`` (SESSION-VALIDATE, ``unchecked_slots``): a
      finalize or reset naming no slot does not act (no error), a snapshot of
      one is queued, and a drain drops it.

    In both acting cases the caller's own record moves as the runtime's does:
    another slot it held keeps its state, an idle one with no session."""

    FOLLOW: ClassVar[dict[str, tuple[RuleId, str]]] = {
        "handle_of_free_slot": (rid("SESSION-FENCE"), "fence_generation_only"),
        "handle_of_another_session": (rid("SESSION-LEASE"), "trust_handle_session"),
        "handle_of_no_slot": (rid("SESSION-VALIDATE"), "unchecked_slots"),
    }

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.slots = [Slot() for _ in range(config.slots)]
        #: session -> its slot while leased or idle
        self.holder: dict[str, int] = {}
        self.idle_lru: list[str] = []
        self.pending: list[tuple[int, int]] = []
        #: sessions left in flight with no slot (only after a followed handle_of_another_session)
        self.orphaned: set[str] = set()
        self.fence_generation_only = False
        self.trust_handle_session = False
        self.unchecked_slots = False

    # ------------------------------------------------------------ guards

    def own_leased(self, op: SessionAdmit) -> bool:
        own = self.holder.get(op.session)
        return (own is not None and self.slots[own].state == "leased") or op.session in self.orphaned

    def own_idle_warm(self, op: SessionAdmit) -> bool:
        return op.session in self.holder and op.warm

    def own_idle(self, op: SessionAdmit) -> bool:
        return op.session in self.holder

    def a_slot_free(self, op: SessionAdmit) -> bool:
        return any(s.state == "free" for s in self.slots)

    def an_idle_session(self, op: SessionAdmit) -> bool:
        return bool(self.idle_lru)

    def no_such_slot(self, op: Handle | SessionSnapshot) -> bool:
        return op.slot >= len(self.slots)

    def stale(self, op: Handle) -> bool:
        """The handle is of an older lease (or of a free slot): it never acts."""
        s = self.slots[op.slot]
        return s.generation != op.generation or (s.state == "free" and not self.fence_generation_only)

    def foreign(self, op: Handle) -> bool:
        """A current handle carried back under another session's name."""
        return self.slots[op.slot].session != op.session

    def keep(self, op: SessionFinalize) -> bool:
        return op.keep

    # ------------------------------------------------------------ effects

    def outcome(
        self,
        *,
        admission: Admission | None = None,
        refused: str | None = None,
        applied: bool | None = None,
        drained: list[tuple[int, int]] | None = None,
        error: OpError | None = None,
    ) -> SessionOutcome:
        """The answer, with the state after the step."""
        return SessionOutcome(
            admission=admission, refused=refused, applied=applied, drained=drained, error=error, state=self.state()
        )

    def invalid_slot(self, op: Handle | SessionSnapshot) -> SessionOutcome:
        if self.unchecked_slots:  # followed handle_of_no_slot
            return self.queue_snapshot(op) if isinstance(op, SessionSnapshot) else self.not_applied(op)
        message = f"slot {op.slot} does not exist ({len(self.slots)} slots)"
        return self.outcome(error=OpError(rule="SESSION-VALIDATE", message=message))

    def foreign_handle(self, op: Handle) -> SessionOutcome:
        s = self.slots[op.slot]
        if s.state == "free" or (self.trust_handle_session and s.state == "leased"):
            # followed handle_of_free_slot (a free slot is foreign to every session) or handle_of_another_session
            self._act_as_runtime(op, isinstance(op, SessionFinalize) and op.keep)
            return self.outcome(applied=True)
        message = f"handle ({op.slot}, {op.generation}) belongs to session {s.session!r}, not {op.session!r}"
        return self.outcome(error=OpError(rule="SESSION-LEASE", message=message))

    def not_applied(self, op: Handle) -> SessionOutcome:
        return self.outcome(applied=False)

    def resume(self, op: SessionAdmit) -> SessionOutcome:
        """The session's own idle slot, warm: its cache is the live candidate."""
        own = self.holder[op.session]
        s = self.slots[own]
        s.state = "leased"
        self.idle_lru.remove(op.session)
        adm = Admission(
            slot=own, generation=s.generation, candidate="live", requires_clear=False, tokens=list(s.tokens)
        )
        return self.outcome(admission=adm)

    def lease_own(self, op: SessionAdmit) -> SessionOutcome:
        """The session's own idle slot, cold: a new lease that clears it."""
        own = self.holder.pop(op.session)
        self.idle_lru.remove(op.session)
        return self._lease(op, own, clear=True)

    def lease_free(self, op: SessionAdmit) -> SessionOutcome:
        target = next(i for i, s in enumerate(self.slots) if s.state == "free")
        return self._lease(op, target, clear=self.slots[target].generation > 0)

    def lru_victim(self) -> str:
        """The idle session that loses its slot: the least recently parked."""
        return self.idle_lru[0]

    def steal(self, op: SessionAdmit) -> SessionOutcome:
        victim = self.lru_victim()
        self.idle_lru.remove(victim)
        return self._lease(op, self.holder.pop(victim), clear=True)

    def _lease(self, op: SessionAdmit, target: int, *, clear: bool) -> SessionOutcome:
        s = self.slots[target]
        s.generation += 1
        s.state, s.session, s.tokens = "leased", op.session, []
        self.holder[op.session] = target
        self.pending = [p for p in self.pending if p[0] != target]
        return self.outcome(
            admission=Admission(slot=target, generation=s.generation, candidate="none", requires_clear=clear)
        )

    def park(self, op: SessionFinalize) -> SessionOutcome:
        s = self.slots[op.slot]
        s.state, s.tokens = "idle", list(op.tokens)
        if op.session in self.idle_lru:
            self.idle_lru.remove(op.session)
        self.idle_lru.append(op.session)
        return self.outcome(applied=True)

    def release(self, op: Handle) -> SessionOutcome:
        self._release(op.slot)
        return self.outcome(applied=True)

    def _act_as_runtime(self, op: Handle, keep: bool) -> None:
        """A handle of a free slot or of another session's lease acting as the
        runtime's ``finalize_slot`` / ``release_slot_for_reset`` do (class doc)."""
        key, s = op.session, self.slots[op.slot]
        if s.session is not None and s.session != key:  # the leasing session: in flight, no slot
            self.holder.pop(s.session, None)
            self.orphaned.add(s.session)
        own = self.holder.pop(key, None)
        if own is not None and own != op.slot and self.slots[own].state == "idle":
            self.slots[own].session = None  # its record moved: the slot stays idle, nobody's
        if key in self.idle_lru:
            self.idle_lru.remove(key)
        self.orphaned.discard(key)
        if keep:
            s.state, s.session, s.tokens = "idle", key, list(op.tokens) if isinstance(op, SessionFinalize) else []
            self.holder[key] = op.slot
            self.idle_lru.append(key)
        else:
            s.session = None
            self._release(op.slot)

    def _release(self, index: int) -> None:
        s = self.slots[index]
        if s.session is not None:
            self.holder.pop(s.session, None)
            if s.session in self.idle_lru:
                self.idle_lru.remove(s.session)
        s.state, s.session, s.tokens = "free", None, []
        s.generation += 1
        self.pending = [p for p in self.pending if p[0] != index]

    def evict_all(self) -> None:
        for s in self.slots:
            s.state, s.session, s.tokens = "free", None, []
            s.generation += 1
        self.holder.clear()
        self.idle_lru.clear()
        self.pending.clear()
        self.orphaned.clear()

    def evicted_all(self, op: SessionEvictAll) -> SessionOutcome:
        self.evict_all()
        return self.outcome(applied=True)

    def queue_snapshot(self, op: SessionSnapshot) -> SessionOutcome:
        self.pending.append((op.slot, op.generation))
        return self.outcome(applied=True)

    def drain(self) -> list[tuple[int, int]]:
        taken = [
            (i, g)
            for i, g in self.pending
            if i < len(self.slots)
            and self.slots[i].generation == g
            and (self.slots[i].state != "free" or self.fence_generation_only)
        ]
        self.pending = []
        return taken

    def drained(self, op: SessionDrain) -> SessionOutcome:
        return self.outcome(drained=self.drain())

    # ------------------------------------------------------------ the table

    TRANSITIONS: ClassVar[Sequence[Transition[Any, Any]]] = (
        # admit
        Transition("SESSION-LEASE", SessionAdmit, "own_leased", _refuse("SESSION-LEASE")),
        Transition("SESSION-CANDIDATE", SessionAdmit, "own_idle_warm", "resume"),
        Transition("SESSION-CANDIDATE", SessionAdmit, "own_idle", "lease_own"),
        Transition("SESSION-LEASE", SessionAdmit, "a_slot_free", "lease_free"),
        Transition("SESSION-LRU", SessionAdmit, "an_idle_session", "steal"),
        Transition("SESSION-LRU", SessionAdmit, always, _refuse("SESSION-LRU")),
        # finalize and reset: a handle's operations
        Transition(
            "SESSION-VALIDATE", (SessionFinalize, SessionReset, SessionSnapshot), "no_such_slot", "invalid_slot"
        ),
        Transition("SESSION-FENCE", (SessionFinalize, SessionReset), "stale", "not_applied"),
        Transition("SESSION-LEASE", (SessionFinalize, SessionReset), "foreign", "foreign_handle"),
        Transition("SESSION-LRU", SessionFinalize, "keep", "park"),
        Transition("SESSION-RELEASE", (SessionFinalize, SessionReset), always, "release"),
        # the rest
        Transition("SESSION-RELEASE", SessionEvictAll, always, "evicted_all"),
        Transition("SESSION-FENCE", SessionSnapshot, always, "queue_snapshot"),
        Transition("SESSION-FENCE", SessionDrain, always, "drained"),
    )

    # ------------------------------------------------------------ observation

    def state(self) -> SessionState:
        return SessionState(
            slots=[SlotView(state=s.state, generation=s.generation, session=s.session) for s in self.slots],
            idle_lru=list(self.idle_lru),
            in_flight=sorted({k for k, i in self.holder.items() if self.slots[i].state == "leased"} | self.orphaned),
            pending=list(self.pending),
        )
