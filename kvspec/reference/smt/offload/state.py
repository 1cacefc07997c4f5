"""One state of the encoding: G1 slots, swap-in jobs, G2, and the router's view.

The fields mirror what the reference model (``reference/g1.py``) keeps, with
one change of viewpoint: the model counts slots (``free``, ``quarantined``,
``reserved``) where the encoding names each slot, so that "no hash in two
slots" (INV-NO-DUP) and "a quarantined slot is never allocated"
(INV-QUARANTINE) are statements about something that could go wrong.

Per slot ``s``:
  ``st``     free / partial / active / inactive / quarantined / reserved
  ``blk``    the block it holds (active, inactive) or will hold (reserved)
  ``own``    owner count of the block it holds
  ``pu``     the partial block's uuid (partial)
  ``mpar``   the block's parent as recorded at registration (what a later
             host-pinned Stored of it names as parent)
  ``itick``  when the block entered the inactive pool (the LRU order)
  ``jid``    the swap-in job a reserved slot belongs to
  ``pend``   an offload transfer out of this slot is pending, carrying
             ``pblk`` (the block), ``pmpar`` (its parent) and ``pord`` (its
             position in the transfer queue)
Per swap-in job ``j``: ``jpar`` (the parent the swap-in named), ``jord``
(queue position).
Per block hash ``h``: ``dev`` / ``g2v`` (the router's view of the device and
host-pinned tiers: built only from published events), ``g2`` (G2 holds
``h``), ``g2t`` (G2's LRU time of ``h``), ``g2par`` (parent G2 records).
Counters, kept incrementally like the model's: ``free_c``, ``afull_c``
(active full blocks), ``refs_c`` (owner references), ``quar_c``, ``resv_c``;
clocks ``clock`` (inactive-pool ticks), ``g2clock``, ``qclock`` (queue).
Swap-in registration, one reserved slot per step: ``busy`` is the job being
registered (NONE when none; the model registers a job in one go, so no other
step runs meanwhile), ``ranc`` the anchor of its current Stored group,
``rmpar`` the parent recorded for its next block, ``ropen`` a group is open.
Rigid (never changed by a transition): ``cap2`` (G2 capacity, any value
>= 1) and ``par`` (the parent relation of block hashes, a forest).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeAlias

import z3

from kvspec.reference.smt.terms import count, sel
from kvspec.reference.smt.universe import ACTIVE, FREE, INACTIVE, NONE, PARTIAL, QUARANTINED, RESERVED, Bound, SlotSort

Term: TypeAlias = z3.ExprRef

#: field name -> (dimension, sort): dimension is "slot", "job", "hash" or "scalar"
FIELDS: dict[str, tuple[str, str]] = {
    "st": ("slot", "slot"),
    "blk": ("slot", "int"),
    "own": ("slot", "int"),
    "pu": ("slot", "int"),
    "mpar": ("slot", "int"),
    "itick": ("slot", "int"),
    "jid": ("slot", "int"),
    "pend": ("slot", "bool"),
    "pblk": ("slot", "int"),
    "pmpar": ("slot", "int"),
    "pord": ("slot", "int"),
    "jpar": ("job", "int"),
    "jord": ("job", "int"),
    "dev": ("hash", "bool"),
    "g2": ("hash", "bool"),
    "g2v": ("hash", "bool"),
    "g2t": ("hash", "int"),
    "g2par": ("hash", "int"),
    "free_c": ("scalar", "int"),
    "afull_c": ("scalar", "int"),
    "refs_c": ("scalar", "int"),
    "quar_c": ("scalar", "int"),
    "resv_c": ("scalar", "int"),
    "clock": ("scalar", "int"),
    "g2clock": ("scalar", "int"),
    "qclock": ("scalar", "int"),
    "busy": ("scalar", "int"),
    "ranc": ("scalar", "int"),
    "rmpar": ("scalar", "int"),
    "ropen": ("scalar", "bool"),
}


def _const(name: str, sort: str) -> Term:
    if sort == "bool":
        return z3.Bool(name)
    if sort == "slot":
        return z3.Const(name, SlotSort)
    return z3.Int(name)


@dataclass(frozen=True)
class Rigid:
    """What no transition changes: the G2 capacity and the hash forest."""

    cap2: z3.ArithRef
    par: list[z3.ArithRef]

    @staticmethod
    def fresh(bound: Bound, prefix: str = "") -> Rigid:
        return Rigid(z3.Int(f"{prefix}cap2"), [z3.Int(f"{prefix}par{h}") for h in range(bound.hashes)])

    @staticmethod
    def concrete(cap2: int, par: list[int]) -> Rigid:
        return Rigid(z3.IntVal(cap2), [z3.IntVal(p) for p in par])

    def domain(self) -> list[z3.BoolRef]:
        """cap2 >= 1; every hash's parent is NONE or a smaller hash (a forest)."""
        out: list[z3.BoolRef] = [self.cap2 >= 1]
        out += [z3.And(NONE <= p, p < h) for h, p in enumerate(self.par)]
        return out


@dataclass(frozen=True)
class State:
    bound: Bound
    rigid: Rigid
    st: list[Term]
    blk: list[Term]
    own: list[Term]
    pu: list[Term]
    mpar: list[Term]
    itick: list[Term]
    jid: list[Term]
    pend: list[Term]
    pblk: list[Term]
    pmpar: list[Term]
    pord: list[Term]
    jpar: list[Term]
    jord: list[Term]
    dev: list[Term]
    g2: list[Term]
    g2v: list[Term]
    g2t: list[Term]
    g2par: list[Term]
    free_c: Term
    afull_c: Term
    refs_c: Term
    quar_c: Term
    resv_c: Term
    clock: Term
    g2clock: Term
    qclock: Term
    busy: Term
    ranc: Term
    rmpar: Term
    ropen: Term

    # ----------------------------------------------------------- building
    @staticmethod
    def size(bound: Bound, dim: str) -> int:
        return {"slot": bound.slots, "job": bound.jobs, "hash": bound.hashes}[dim]

    @classmethod
    def fresh(cls, bound: Bound, rigid: Rigid, prefix: str) -> State:
        """A state of fresh z3 constants named ``{prefix}{field}{index}``."""
        vals: dict[str, Any] = {}
        for name, (dim, sort) in FIELDS.items():
            if dim == "scalar":
                vals[name] = _const(f"{prefix}{name}", sort)
            else:
                vals[name] = [_const(f"{prefix}{name}{i}", sort) for i in range(cls.size(bound, dim))]
        return cls(bound=bound, rigid=rigid, **vals)

    @classmethod
    def initial(cls, bound: Bound, rigid: Rigid) -> State:
        """A fresh manager: every slot free, nothing pending, views empty,
        counters as the model starts them (free = capacity)."""
        n, m, j = bound.slots, bound.hashes, bound.jobs
        zero, f, none = z3.IntVal(0), z3.BoolVal(False), z3.IntVal(NONE)
        return cls(
            bound=bound,
            rigid=rigid,
            st=[FREE] * n,
            blk=[zero] * n,
            own=[zero] * n,
            pu=[zero] * n,
            mpar=[none] * n,
            itick=[zero] * n,
            jid=[zero] * n,
            pend=[f] * n,
            pblk=[zero] * n,
            pmpar=[none] * n,
            pord=[zero] * n,
            jpar=[none] * j,
            jord=[zero] * j,
            dev=[f] * m,
            g2=[f] * m,
            g2v=[f] * m,
            g2t=[zero] * m,
            g2par=[none] * m,
            free_c=z3.IntVal(n),
            afull_c=zero,
            refs_c=zero,
            quar_c=zero,
            resv_c=zero,
            clock=zero,
            g2clock=zero,
            qclock=zero,
            busy=none,
            ranc=none,
            rmpar=none,
            ropen=f,
        )

    def but(self, **changes: Any) -> State:
        """This state with some fields replaced (the transitions' frame rule:
        whatever a transition does not name stays as it was)."""
        return dataclasses.replace(self, **changes)

    def components(self) -> list[tuple[str, int | None, Term]]:
        out: list[tuple[str, int | None, Term]] = []
        for name, (dim, _sort) in FIELDS.items():
            v = getattr(self, name)
            if dim == "scalar":
                out.append((name, None, v))
            else:
                out += [(name, i, x) for i, x in enumerate(v)]
        return out

    def equals(self, other: State) -> z3.BoolRef:
        return z3.And([a == b for (_n, _i, a), (_m, _j, b) in zip(self.components(), other.components(), strict=True)])

    def map_terms(self, f: Any) -> State:
        vals: dict[str, Any] = {}
        for name, (dim, _sort) in FIELDS.items():
            v = getattr(self, name)
            vals[name] = f(v) if dim == "scalar" else [f(x) for x in v]
        return self.but(**vals)

    def map2(self, other: State, f: Any) -> State:
        vals: dict[str, Any] = {}
        for name, (dim, _sort) in FIELDS.items():
            a, b = getattr(self, name), getattr(other, name)
            vals[name] = f(a, b) if dim == "scalar" else [f(x, y) for x, y in zip(a, b, strict=True)]
        return self.but(**vals)

    def simplified(self) -> State:
        return self.map_terms(z3.simplify)

    def domain(self) -> list[z3.BoolRef]:
        """The types of the fields: hashes in range, counts non-negative."""
        m, u, j = self.bound.hashes, self.bound.uuids, self.bound.jobs
        out: list[z3.BoolRef] = []
        for s in range(self.bound.slots):
            out += [
                z3.And(0 <= self.blk[s], self.blk[s] < m),
                self.own[s] >= 0,
                z3.And(0 <= self.pu[s], self.pu[s] < u),
                z3.And(NONE <= self.mpar[s], self.mpar[s] < m),
                z3.And(0 <= self.jid[s], self.jid[s] < j),
                z3.And(0 <= self.pblk[s], self.pblk[s] < m),
                z3.And(NONE <= self.pmpar[s], self.pmpar[s] < m),
            ]
        out += [z3.And(NONE <= p, p < m) for p in self.jpar]
        out += [z3.And(NONE <= p, p < m) for p in self.g2par]
        out += [
            z3.And(NONE <= self.busy, self.busy < j),
            z3.And(NONE <= self.ranc, self.ranc < m),
            z3.And(NONE <= self.rmpar, self.rmpar < m),
        ]
        return out

    # ------------------------------------------------------------ queries
    @property
    def slots(self) -> range:
        return range(self.bound.slots)

    @property
    def hashes(self) -> range:
        return range(self.bound.hashes)

    def is_(self, s: int, state: Term) -> z3.BoolRef:
        return self.st[s] == state

    def registered_slot(self, s: int) -> z3.BoolRef:
        """Slot ``s`` holds a registered block (active or inactive)."""
        return z3.Or(self.st[s] == ACTIVE, self.st[s] == INACTIVE)

    def holds(self, s: int, h: Term | int) -> z3.BoolRef:
        """Slot ``s`` holds the registered block ``h``."""
        return z3.And(self.registered_slot(s), self.blk[s] == h)

    def is_registered(self, h: Term | int) -> z3.BoolRef:
        """Block ``h`` is registered in G1 (active or inactive) in some slot."""
        return z3.Or([self.holds(s, h) for s in self.slots])

    def is_active(self, h: Term | int) -> z3.BoolRef:
        return z3.Or([z3.And(self.st[s] == ACTIVE, self.blk[s] == h) for s in self.slots])

    def held_partial(self, u: Term | int) -> z3.BoolRef:
        return z3.Or([z3.And(self.st[s] == PARTIAL, self.pu[s] == u) for s in self.slots])

    def census(self, state: Term) -> z3.ArithRef:
        """How many slots are in ``state``."""
        return count([self.st[s] == state for s in self.slots])

    def any_inactive(self) -> z3.BoolRef:
        return z3.Or([self.st[s] == INACTIVE for s in self.slots])

    def job_live(self, j: Term | int) -> z3.BoolRef:
        """Swap-in job ``j`` is pending (it holds a reserved slot)."""
        return z3.Or([z3.And(self.st[s] == RESERVED, self.jid[s] == j) for s in self.slots])

    def g2_count(self) -> z3.ArithRef:
        return count(list(self.g2))

    def g2_has(self, h: Term | int) -> z3.BoolRef:
        return sel(self.g2, h) if not isinstance(h, int) else self.g2[h]

    def dev_has(self, h: Term | int) -> z3.BoolRef:
        return sel(self.dev, h) if not isinstance(h, int) else self.dev[h]

    def quarantined_census(self) -> z3.ArithRef:
        return self.census(QUARANTINED)

    def partial_census(self) -> z3.ArithRef:
        return self.census(PARTIAL)
