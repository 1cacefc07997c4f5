"""Model and encoding, equal successor sets at a small bound: an explicit-state check.

Sampled agreement asks one direction: can the encoding make the model's move?
An over-permissive guard (an eviction that ignores owners) or a model that
refuses what the encoding allows passes it. This module closes both
directions, exhaustively at a bound: breadth-first over every state the
Python model reaches from its initial states within ``depth`` operations of
a finite alphabet, and in each state, for every operation of the alphabet,
the model's outcome set (every outcome the choices it leaves to the caller
allow) must equal the encoding's, enumerated by z3 from the same concrete
pre-state with every choice input free. An outcome is the profile's
abstraction of the post-state plus the events published; a refused
operation has no outcome, so "enabled in one iff in the other" is the
special case of an empty set.

A profile supplies a ``Subject``: initial models, the alphabet, a canonical
key for a model state (states with equal keys have equal successor sets),
the model's outcomes (with the successor models) and the encoding's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import z3

from kvspec.reference.smt.solving import check

M = TypeVar("M")


class Subject(Protocol[M]):
    """One profile's model and encoding, at one bound."""

    name: str

    def initial(self) -> list[M]: ...

    def key(self, m: M) -> Hashable: ...

    def alphabet(self, m: M) -> Sequence[Any]: ...

    def model_outcomes(self, m: M, op: Any) -> list[tuple[Hashable, M]]: ...

    def encoding_outcomes(self, m: M, op: Any) -> set[Hashable]: ...


@dataclass
class OutcomeDifference:
    """An operation whose outcome sets differ, with the operations that reach its state."""

    trace: list[Any]
    op: Any
    only_model: list[Hashable]
    only_encoding: list[Hashable]

    def render(self) -> str:
        """The trace from the initial state (replayable against the model), then the two sides."""
        head = " ; ".join(map(short, self.trace)) if self.trace else "(nothing)"
        lines = [f"from the initial state: {head}", f"  then {short(self.op)}"]
        lines += [f"  model only:    {o}" for o in self.only_model]
        lines += [f"  encoding only: {o}" for o in self.only_encoding]
        return "\n".join(lines)


@dataclass
class EquivalenceReport:
    subject: str
    depth: int
    states: int = 0
    pairs: int = 0
    outcomes: int = 0
    seconds: float = 0.0
    complete: bool = True  # False: stopped at max_states or at the first difference
    #: no state one more operation reaches is new: every reachable state of the bound was checked
    closed: bool = True
    #: progress property id -> states it was checked in (``Subject.progress``, when the subject has one)
    progress_checked: dict[str, int] = field(default_factory=dict)
    #: violations of a progress property: "ID: what, after <trace>"
    progress_violations: list[str] = field(default_factory=list)
    differences: list[OutcomeDifference] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.differences


def explore(subject: Subject[M], depth: int, *, max_states: int | None = None, first: bool = True) -> EquivalenceReport:
    """Every state within ``depth`` operations of an initial one; in each,
    every operation of the alphabet, model and encoding compared."""
    t0 = time.process_time()
    rep = EquivalenceReport(subject.name, depth)
    seen: set[Hashable] = set()
    queue: deque[tuple[M, list[Any]]] = deque()
    for m in subject.initial():
        k = subject.key(m)
        if k not in seen:
            seen.add(k)
            queue.append((m, []))
    while queue:
        m, trace = queue.popleft()
        rep.states += 1
        if max_states is not None and rep.states > max_states:
            rep.complete = False
            break
        seen_here: list[tuple[Any, list[tuple[Hashable, M]]]] = []
        for op in subject.alphabet(m):
            rep.pairs += 1
            outs = subject.model_outcomes(m, op)
            seen_here.append((op, outs))
            mset = {o for o, _ in outs}
            eset = subject.encoding_outcomes(m, op)
            rep.outcomes += len(mset)
            if mset != eset:
                rep.differences.append(
                    OutcomeDifference(list(trace), op, sorted(mset - eset, key=repr), sorted(eset - mset, key=repr))
                )
                if first:
                    rep.complete = rep.closed = False
                    rep.seconds = time.process_time() - t0
                    return rep
            if len(trace) + 1 > depth:
                rep.closed = rep.closed and all(subject.key(nxt) in seen for _, nxt in outs)
                continue
            for _, nxt in outs:
                k = subject.key(nxt)
                if k not in seen:
                    seen.add(k)
                    queue.append((nxt, [*trace, op]))
        check = getattr(subject, "progress", None)
        if check is not None:
            for pid, problem in check(m, seen_here):
                rep.progress_checked[pid] = rep.progress_checked.get(pid, 0) + 1
                if problem:
                    where = " ; ".join(map(short, trace)) or "(nothing)"
                    rep.progress_violations.append(f"{pid}: {problem}, after {where}")
    rep.seconds = time.process_time() - t0
    rep.closed = rep.closed and rep.complete
    return rep


def short(op: Any) -> str:
    """An operation in one line: its kind and the fields that matter here
    (lineage and local hashes are derived from the block hashes by the alphabets)."""
    dump = getattr(op, "model_dump", None)
    if dump is None:
        return repr(op)
    fields = {k: v for k, v in dump(exclude_defaults=True).items() if k not in ("op", "plhs", "local_hashes", "plh")}
    body = ", ".join(f"{k}={_compact(v)}" for k, v in fields.items())
    return f"{type(op).__name__}({body})"


def _compact(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_compact(x) for x in v) + "]"
    if isinstance(v, dict) and len(v) == 1:
        k, x = next(iter(v.items()))
        return f"{'F' if k == 'full' else 'P' if k == 'partial' else k}{x}"
    return repr(v)


def all_values(constraints: Iterable[z3.BoolRef], terms: Sequence[z3.ExprRef], limit: int = 10_000) -> set[tuple]:
    """Every assignment of ``terms`` (as Python values) that some model of
    ``constraints`` gives, by blocking each one found."""
    s = z3.Solver()
    s.set("timeout", 60_000)
    s.add(*constraints)
    out: set[tuple] = set()
    while True:
        a = check(s, timeout_ms=60_000)
        if a.unsat:
            return out
        if a.model is None:
            raise RuntimeError(f"z3 gave up enumerating successors: {a.reason}")
        mdl = a.model
        vals = [mdl.eval(t, model_completion=True) for t in terms]
        out.add(tuple(_py(v) for v in vals))
        if len(out) > limit:
            raise RuntimeError(f"more than {limit} successors")
        s.add(z3.Or([t != v for t, v in zip(terms, vals, strict=True)]) if terms else z3.BoolVal(False))


def _py(v: z3.ExprRef) -> Any:
    if z3.is_int_value(v):
        return v.as_long()
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    return str(v)
