"""kvbm with an offload tier: the operation encoding and ``G1Model`` agree in every state of a small bound.

``offload/agreement.EncodingLockstep`` already compares one operation both ways:
the model refuses exactly when the encoding's operation is invalid (same
rule), and otherwise the encoding's successor, computed from the model's
state with canonical choices (lowest free slot, the LRU victim), has the
model's events, result, counters, abstract state (LRU order, pending
transfers in queue order, G2 in LRU order, recorded parents) and router
views, and is the only one up to renaming slots (distinct ticks, G2 times,
queue positions). What sampling lacks is coverage, and one direction of the
victim choice: this module walks every state the model reaches within the
depth over a finite alphabet (breadth first, ``smt/equivalence.py``), runs
the lockstep on each operation, and for every Use asks z3 whether the
encoding's rules allow any victim sequence other than the model's (the
victims left free under the LRU policy; more than one is an over-permissive
eviction rule).

Universe: 2 G1 slots, hashes 0 -> 1 (a chain) and 2 (a root), G2 of one
block, uuid u0, the LRU policy. Ticks go to the earliest pending deadline.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import z3

from kvspec.reference.smt.concrete import ConcreteState
from kvspec.reference.smt.equivalence import all_values
from kvspec.reference.smt.offload.agreement.encoding_mutants import encoding_mutant
from kvspec.reference.smt.offload.agreement.sampled import (
    EncodingLockstep,
    Universe,
    deref_op,
    promote_op,
    swap_in_op,
    to_encoding,
    use_op,
)
from kvspec.reference.smt.offload.ops import Chooser, apply_op
from kvspec.reference.smt.universe import NONE
from kvspec.spec.registry import KVBM_OFFLOAD
from kvspec.spec.wire import Operation, Tick, Use

UNIVERSE = Universe(slots=2, par=(NONE, 0, NONE), cap2=1, policy="lru")


@dataclass
class ONode:
    """A lockstep between operations (the encoding's state kept as values)."""

    step: EncodingLockstep
    values: ConcreteState


def _copy(n: ONode) -> EncodingLockstep:
    ls = EncodingLockstep(n.step.universe)
    ls.model = copy.deepcopy(n.step.model)
    ls.view = copy.deepcopy(n.step.view)
    ls.state = n.values.to_state()
    ls.now, ls.next_event_id, ls.index = n.step.now, n.step.next_event_id, n.step.index
    return ls


@dataclass
class OffloadSubject:
    """kvbm with an offload tier at the bound of ``UNIVERSE`` (``mutant``: an encoding mutant installed)."""

    universe: Universe = UNIVERSE
    mutant: str | None = None
    name: str = KVBM_OFFLOAD
    #: the last lockstep run (node, operation, result): ``explore`` asks for the model's outcomes
    #: and then the encoding's of the same pair, and both sides read the one lockstep step
    _last: tuple[ONode, Operation, tuple[list[str], EncodingLockstep]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def initial(self) -> list[ONode]:
        ls = EncodingLockstep(self.universe)
        return [ONode(ls, ConcreteState.from_terms(ls.state))]

    def key(self, n: ONode) -> Hashable:
        """The model's state with times relative to its clock, and the router's views."""
        fp = repr(n.step.model.fingerprint()).replace(repr(n.step.now), "NOW")
        return fp, tuple(sorted(n.step.view.stored("device"))), tuple(sorted(n.step.view.stored("host_pinned")))

    def alphabet(self, n: ONode) -> Sequence[Operation]:
        u = self.universe
        hs = range(len(u.par))
        refs: list[int | str] = [*hs, "u0"]
        out: list[Operation] = []
        for k in (1, 2):
            for seq in itertools.permutations(refs, k):
                parents: list[int | None] = [None]
                first = seq[0]
                if isinstance(first, int) and u.par[first] != NONE:
                    parents = [u.par[first]]
                for par in parents:
                    out.append(use_op(u, list(seq), par))
            out += [deref_op(list(sub)) for sub in itertools.combinations(refs, k)]
        out += [promote_op(u, "u0", h) for h in hs]
        out += [swap_in_op(u, u.chain(h), None) for h in hs]
        deadline = n.step.model.earliest_deadline()
        if deadline is not None:
            out.append(Tick(now_ms=max(deadline, n.step.now)))
        return out

    def progress(
        self, n: ONode, seen: list[tuple[Operation, list[tuple[Hashable, ONode]]]]
    ) -> list[tuple[str, str | None]]:
        """PROGRESS-QUARANTINE: while a transfer is pending, a Tick to the earliest deadline
        completes one (a quarantined slot is released by its deadline). PROGRESS-NO-DEADLOCK:
        while anything is held or pending, some operation of the alphabet is accepted."""
        m = n.step.model
        out: list[tuple[str, str | None]] = []
        if m.pending:
            tick = next(((op, outs) for op, outs in seen if isinstance(op, Tick)), None)
            done = False
            if tick is not None:
                for _o, nxt in tick[1]:
                    after = nxt.step.model
                    done |= len(after.pending) < len(m.pending) or after.quarantined < m.quarantined
            out.append(
                ("PROGRESS-QUARANTINE", None if done else "no Tick to the earliest deadline completes a transfer")
            )
        if m.pending or m.blocks or m.partial:
            here = self.key(n)
            moved = any(self.key(nxt) != here for _op, outs in seen for _o, nxt in outs)
            out.append(("PROGRESS-NO-DEADLOCK", None if moved else "no operation changes the state"))
        return out

    def _lockstep(self, n: ONode, op: Operation) -> tuple[list[str], EncodingLockstep]:
        """The lockstep step of ``op`` from ``n`` (on a copy; the step read is never changed after:
        a successor is stepped from a copy of it), run once for the two sides of one pair."""
        if self._last is not None and self._last[0] is n and self._last[1] is op:
            return self._last[2]
        ls = _copy(n)
        if self.mutant is None:
            problems = ls.step(op)
        elif self.mutant.startswith("op:"):  # an operation-level mutant (offload/op_mutants.py)
            from kvspec.reference.smt.offload.op_mutants import OP_MUTANTS

            om = next(m for m in OP_MUTANTS if m.name == self.mutant)
            ls.mutate, ls.reshape = om.mutate, om.reshape
            problems = ls.step(op)
        else:
            with encoding_mutant(self.mutant).installed():
                problems = ls.step(op)
        out = [str(p) for p in problems], ls
        self._last = (n, op, out)
        return out

    def model_outcomes(self, n: ONode, op: Operation) -> list[tuple[Hashable, ONode]]:
        problems, ls = self._lockstep(n, op)
        if problems:
            return [(("lockstep: model side", tuple(problems)), n)]
        nxt = ONode(ls, ConcreteState.from_terms(ls.state))
        return [(("agree", self.key(nxt)), nxt)]

    def encoding_outcomes(self, n: ONode, op: Operation) -> set[Hashable]:
        problems, ls = self._lockstep(n, op)
        if problems:
            return {("lockstep: encoding side", tuple(problems))}
        extra = self._other_victims(n, op)
        if extra:
            return {("encoding allows other victims", tuple(extra))}
        return {("agree", self.key(ONode(ls, ConcreteState.from_terms(ls.state))))}

    def _other_victims(self, n: ONode, op: Operation) -> list[str]:
        """Victim sequences the encoding's rules allow for a Use besides the LRU one's."""
        if not isinstance(op, Use):
            return []
        enc, pre = to_encoding(op), n.values.to_state()
        free = apply_op(pre, enc, Chooser("lru", free_victims=True, prefix="eqv"))
        if not free.victims:
            return []
        lru = apply_op(pre, enc, Chooser("lru"))
        allowed = all_values([free.valid, *free.constraints], [z3.If(w, v, -1) for w, v in free.victims])
        canonical = all_values([lru.valid, *lru.constraints], [z3.If(w, v, -1) for w, v in lru.victims])
        return [f"victim slots {s}" for s in sorted(allowed - canonical)]
