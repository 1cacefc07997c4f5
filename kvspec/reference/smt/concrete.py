"""Concrete states of the encoding: read from a z3 model, printed for people.

A counterexample, a witness trace and the comparison with the Python model
all go through ``ConcreteState``: plain ints, bools and slot-state names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from kvspec.reference.smt.offload.state import FIELDS, Rigid, State
from kvspec.reference.smt.universe import NONE, SLOT_STATES, Bound


def _py(v: z3.ExprRef) -> Any:
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    if z3.is_int_value(v):
        return v.as_long()
    return str(v)


def evaluate(model: z3.ModelRef, term: z3.ExprRef) -> Any:
    return _py(model.eval(term, model_completion=True))


@dataclass
class ConcreteState:
    bound: Bound
    cap2: int
    par: list[int]
    values: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values")
        if values is not None and name in values:
            return values[name]
        raise AttributeError(name)

    # ---------------------------------------------------------- conversion
    @classmethod
    def from_model(cls, model: z3.ModelRef, S: State) -> ConcreteState:
        vals: dict[str, Any] = {}
        for name, (dim, _s) in FIELDS.items():
            v = getattr(S, name)
            vals[name] = evaluate(model, v) if dim == "scalar" else [evaluate(model, x) for x in v]
        return cls(S.bound, evaluate(model, S.rigid.cap2), [evaluate(model, p) for p in S.rigid.par], vals)

    @classmethod
    def from_terms(cls, S: State) -> ConcreteState:
        """Read a state whose terms simplify to constants (raises otherwise)."""
        vals: dict[str, Any] = {}

        def lit(t: z3.ExprRef) -> Any:
            v = z3.simplify(t)
            if not (z3.is_int_value(v) or z3.is_true(v) or z3.is_false(v) or str(v) in SLOT_STATES):
                raise ValueError(f"not a constant: {v}")
            return _py(v)

        for name, (dim, _s) in FIELDS.items():
            v = getattr(S, name)
            vals[name] = lit(v) if dim == "scalar" else [lit(x) for x in v]
        return cls(S.bound, lit(S.rigid.cap2), [lit(p) for p in S.rigid.par], vals)

    def to_state(self) -> State:
        def term(v: Any, sort: str) -> z3.ExprRef:
            if sort == "slot":
                return SLOT_STATES[v]
            if sort == "bool":
                return z3.BoolVal(bool(v))
            return z3.IntVal(int(v))

        vals: dict[str, Any] = {}
        for name, (dim, sort) in FIELDS.items():
            v = self.values[name]
            vals[name] = term(v, sort) if dim == "scalar" else [term(x, sort) for x in v]
        return State(bound=self.bound, rigid=Rigid.concrete(self.cap2, self.par), **vals)

    # ------------------------------------------------------------- queries
    def slot_states(self) -> list[str]:
        return list(self.values["st"])

    def registered(self) -> dict[int, int]:
        """block -> owners, for every registered (active or inactive) block."""
        return {self.blk[s]: self.own[s] for s in range(self.bound.slots) if self.st[s] in ("active", "inactive")}

    def live_jobs(self) -> list[int]:
        return sorted({self.jid[s] for s in range(self.bound.slots) if self.st[s] == "reserved"})

    # ------------------------------------------------------------ printing
    def describe_slot(self, s: int) -> str:
        st = self.st[s]
        pend = f"; offload of block {self.pblk[s]} pending (queue #{self.pord[s]})" if self.pend[s] else ""
        if st == "free":
            return f"free{pend}"
        if st == "partial":
            return f"partial u{self.pu[s]}{pend}"
        if st in ("active", "inactive"):
            extra = f", inactive since tick {self.itick[s]}" if st == "inactive" else ""
            return f"{st} block {self.blk[s]} owners {self.own[s]} (parent {_h(self.mpar[s])}{extra}){pend}"
        if st == "quarantined":
            return f"quarantined{pend or '; NO transfer pending'}"
        return f"reserved for swap-in job {self.jid[s]} (block {self.blk[s]}){pend}"

    def render(self, indent: str = "  ") -> str:
        lines = [f"{indent}slot {s}: {self.describe_slot(s)}" for s in range(self.bound.slots)]
        v = self.values
        lines.append(
            f"{indent}counters: free {v['free_c']}, active full {v['afull_c']}, refs {v['refs_c']}, "
            f"quarantined {v['quar_c']}, reserved {v['resv_c']}"
        )
        for j in self.live_jobs():
            lines.append(f"{indent}swap-in job {j}: parent {_h(self.jpar[j])}, queue #{self.jord[j]}")
        g2 = sorted((self.g2t[h], h) for h in range(self.bound.hashes) if self.g2[h])
        lines.append(f"{indent}G2 (capacity {self.cap2}, LRU first): {[h for _t, h in g2]}")
        lines.append(f"{indent}router view, device: {self.view('dev')}")
        lines.append(f"{indent}router view, host-pinned: {self.view('g2v')}")
        return "\n".join(lines)

    def view(self, name: str) -> list[int]:
        return [h for h in range(self.bound.hashes) if self.values[name][h]]

    def diff(self, other: ConcreteState, indent: str = "  ") -> str:
        """What changed from ``self`` to ``other``, readably."""
        out: list[str] = []
        for s in range(self.bound.slots):
            a, b = self.describe_slot(s), other.describe_slot(s)
            if a != b:
                out.append(f"{indent}slot {s}: {a}  ->  {b}")
        for name in ("free_c", "afull_c", "refs_c", "quar_c", "resv_c"):
            if self.values[name] != other.values[name]:
                out.append(f"{indent}{name}: {self.values[name]} -> {other.values[name]}")
        for name, label in (("dev", "router device view"), ("g2v", "router host-pinned view"), ("g2", "G2")):
            if self.values[name] != other.values[name]:
                out.append(f"{indent}{label}: {self.view(name)} -> {other.view(name)}")
        return "\n".join(out) or f"{indent}(no change)"


def _h(h: int) -> str:
    return "none" if h == NONE else str(h)
