"""Vacuity by construction: every guarded case reached from the initial state.

An inductive proof covers every state that satisfies its invariants,
reachable or not, so "this rule's guard is satisfiable in some such state"
says little: a contract or an over-strong guard can make a case impossible
in every *reachable* state while an unreachable state still allows it, and
the proof then says nothing about that case. Here each encoding describes
its transition table once (``System``: the initial state, and per transition
the successor, the enabling condition and the cases) and ``cover`` unrolls it
from the initial state, up to ``depth`` steps (bounded model checking),
asking z3 for traces on which every goal happens:

- ``enabled``: the transition happens at all;
- ``rule R``: each rule guard of the transition fires (from the rule tables
  of the encodings that name their rules);
- ``case C``: each named sub-case of the transition (where the encoding names
  them);
- ``with U enabled``: the transition happens in a reachable state in which
  transition ``U`` is enabled as well. No encoding names these: they come
  from the transition table alone, and they catch a contract such as "no
  slot is reserved" on a Use, which removes no rule case but every state in
  which a swap-in has reserved a slot.

A goal the encoding makes impossible by design is listed in ``System.never``
with its reason; it must not be reached (a listed goal that is reached is a
stale entry). Encodings whose steps run in phases (a Use is begin, one step
per block, close; nothing else runs meanwhile) give each transition the
phases it runs in (``System.phases``); that table is itself checked (no
transition is enabled, in any state of the universe, outside its phases) and
the pairs of transitions with no phase in common are the only ``with U
enabled`` goals left out. Every other goal not reached within the bound is reported,
naming the transition and the case: a narrowing, or a bound too small to
show the case (both are failures of ``kvspec prove``).

The search is greedy: at each depth it asks for a trace on which some goal
not yet reached happens at the last step, marks every goal that trace reaches
at any step, and repeats until no goal is left at that depth. Deep goals cost
the most there (each depth ends with a proof that nothing more happens at it),
so a system may give a ``guide``: a last stage that proposes whole traces
(the block profiles take them from an explicit search of the Python model)
and has z3 check each pinned (``_Unrolling.pin``) against the encoding; a
goal reached this way is on a trace of the encoding from the initial state
all the same.

``violation`` uses the same unrolling to look for a trace from the initial
state to a step that breaks a property: a counterexample reachable within
the bound, as opposed to one found by induction only (whose pre-state may be
unreachable).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import z3

from kvspec.reference.smt import solving

St = TypeVar("St")


@dataclass
class Move:
    """One transition from one pre-state: successor, enabling condition, cases, inputs."""

    post: Any
    enabled: z3.BoolRef
    #: rule guards and named sub-cases, by goal name (``rule R`` / ``case C``)
    cases: dict[str, z3.BoolRef] = field(default_factory=dict)
    #: the step's inputs and choices, by name (to print a trace)
    inputs: dict[str, z3.ExprRef] = field(default_factory=dict)
    #: anything the caller needs back (e.g. the encoding's own step object)
    step: Any = None


@dataclass(frozen=True)
class ReachStart(Generic[St]):
    """The initial state, constraints on what it leaves free (a capacity, a
    forest of hashes), and how to make a fresh state of the same universe."""

    state: St
    constraints: list[z3.BoolRef]
    fresh: Callable[[str], St]
    #: what the constraints leave free, by name (a capacity): a trace records the values its model chose
    params: dict[str, z3.ExprRef] = field(default_factory=dict)


@dataclass
class System(Generic[St]):
    """One profile's encoding at one level, as a transition table."""

    profile: str
    level: str
    #: the universe searched, in words (printed in the row)
    bound: str
    transitions: Sequence[str]
    start: Callable[[], ReachStart[St]]
    #: ``equal(a, b)``: every field of the two states is equal
    equal: Callable[[St, St], z3.BoolRef]
    #: ``move(transition, pre, prefix)``: that transition from ``pre``, inputs named with ``prefix``
    move: Callable[[str, St, str], Move]
    #: the longest trace searched
    depth: int
    #: (transition, goal) -> why it can never happen (must not be reached)
    never: Mapping[tuple[str, str], str] = field(default_factory=dict)
    #: also ask for each pair of transitions enabled together
    co_enabled: bool = True
    #: the phase of a state (a Use in progress, ...), when the encoding has phases
    phase: Callable[[St], z3.ExprRef] | None = None
    #: transition -> the phases (values of ``phase``) it may be enabled in
    phases: Mapping[str, frozenset[int]] = field(default_factory=dict)
    #: transitions proven never enabled under the invariants (their own row says so): none of their goals is asked
    unreachable: Sequence[str] = ()
    #: a last stage for the goals still missing: ``guide(goals, reached)`` marks traces it finds in ``reached``
    guide: Callable[[list[tuple[str, str]], dict[tuple[str, str], ReachTrace]], None] | None = None

    def excluded(self) -> dict[tuple[str, str], str]:
        """``never`` plus the co-enabled pairs with no phase in common."""
        out = dict(self.never)
        for t in self.unreachable:
            out[(t, "enabled")] = "proven never enabled"
            for u in self.transitions:
                out[(t, f"with {u} enabled")] = out[(u, f"with {t} enabled")] = f"{t} is proven never enabled"
        if self.phase is not None and self.co_enabled:
            for t in self.transitions:
                for u in self.transitions:
                    if not self.phases[t] & self.phases[u]:
                        out[(t, f"with {u} enabled")] = "no phase in common"
        return out

    def phase_problems(self) -> list[str]:
        """Each transition is enabled only in its listed phases, in every state of the universe."""
        if self.phase is None:
            return []
        out = []
        st = self.start().fresh("phase_")
        for t in self.transitions:
            mv = self.move(t, st, "phase_in_")
            s = z3.Solver()
            s.add(mv.enabled, z3.And([self.phase(st) != v for v in self.phases[t]] or [z3.BoolVal(True)]))
            if not solving.check(s).unsat:
                out.append(
                    f"{self.profile} {self.level}: {t} can be enabled outside its phases {sorted(self.phases[t])}"
                )
        return out

    def goals(self, probe: Mapping[str, Move]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for t in self.transitions:
            out.append((t, "enabled"))
            out += [(t, c) for c in probe[t].cases if t not in self.unreachable]
            if self.co_enabled:
                out += [(t, f"with {u} enabled") for u in self.transitions]
        return out


@dataclass
class ReachStep:
    transition: str
    inputs: dict[str, int | bool | str]

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.inputs.items())
        return f"{self.transition}({args})"


@dataclass
class ReachTrace:
    """A sequence of transitions from the initial state."""

    steps: list[ReachStep]
    #: the initial state's free parameters (``ReachStart.params``) on this trace
    params: dict[str, int | bool | str] = field(default_factory=dict)

    def render(self, indent: str = "  ") -> str:
        return "\n".join(f"{indent}{i}. {s}" for i, s in enumerate(self.steps, 1))

    def __len__(self) -> int:
        return len(self.steps)


@dataclass
class Coverage:
    system: System[Any]
    reached: dict[tuple[str, str], ReachTrace]
    missing: list[tuple[str, str]]
    #: goals listed as impossible that a trace reached
    stale: list[tuple[str, str]]
    seconds: float
    #: the solver gave up (timeout) at this depth, or None
    gave_up: int | None = None
    #: goals left out as impossible by design (``System.excluded``), and not reached
    excluded: int = 0
    phase_problems: list[str] = field(default_factory=list)

    @property
    def goals(self) -> int:
        return len(self.reached) + len(self.missing) + len(self.stale)

    def summary(self) -> str:
        """The row's scope column: what was reached, from where, how deep."""
        deepest = max((len(t) for t in self.reached.values()), default=0)
        left = f", {self.excluded} impossible by design" if self.excluded else ""
        return f"{len(self.reached)}/{self.goals} cases reached in <= {deepest} steps{left}"

    def problems(self) -> list[str]:
        s = self.system
        where = f"{s.profile} {s.level}"
        out = list(self.phase_problems)
        by_t: dict[str, list[str]] = {}
        for t, g in self.missing:
            by_t.setdefault(t, []).append(g)
        within = f"{s.depth} steps" + (" (and the guided search)" if s.guide else "")
        out += [
            f"{where}: {t}: not reached from the initial state within {within} ({s.bound}): "
            + "; ".join(gs)
            + " (a contract or guard narrows them, or the bound is too small)"
            for t, gs in by_t.items()
        ]
        excluded = s.excluded()
        out += [f"{where}: {t}: {g} is listed as impossible ({excluded[(t, g)]}) but is reached" for t, g in self.stale]
        if self.gave_up is not None:
            out.append(f"{where}: the reachability search gave up (solver unknown) at depth {self.gave_up}")
        return out


class _Unrolling(Generic[St]):
    """The trace as z3 terms: states s0..sd, the transition index at each step, each transition's move."""

    def __init__(self, system: System[St], solver: z3.Solver) -> None:
        self.sys = system
        self.solver = solver
        start = system.start()
        self.fresh = start.fresh
        self.params = start.params
        solver.add(*start.constraints)
        self.states: list[St] = [start.state]
        self.choice: list[z3.ArithRef] = []
        self.moves: list[dict[str, Move]] = []

    def extend(self) -> None:
        d = len(self.choice) + 1
        pre = self.states[-1]
        ts = self.sys.transitions
        c = z3.Int(f"reach_c{d}")
        ms = {t: self.sys.move(t, pre, f"r{d}_{i}_") for i, t in enumerate(ts)}
        post = self.fresh(f"reach_s{d}_")
        self.solver.add(c >= 0, c < len(ts))
        for i, t in enumerate(ts):
            self.solver.add(z3.Implies(c == i, z3.And(ms[t].enabled, self.sys.equal(post, ms[t].post))))
        self.states.append(post)
        self.choice.append(c)
        self.moves.append(ms)

    def takes(self, j: int, t: str) -> z3.BoolRef:
        """Step ``j`` (1-based) is transition ``t``."""
        return self.choice[j - 1] == self.sys.transitions.index(t)

    def goal(self, j: int, t: str, g: str) -> z3.BoolRef:
        if g == "enabled":
            return self.takes(j, t)
        if g.startswith("with ") and g.endswith(" enabled"):
            u = g.removeprefix("with ").removesuffix(" enabled")
            return z3.And(self.takes(j, t), self.moves[j - 1][u].enabled)
        return z3.And(self.takes(j, t), self.moves[j - 1][t].cases[g])

    def pin(self, trace: ReachTrace) -> None:
        """Unroll ``trace``'s length and fix each step's transition and inputs to the trace's."""
        while len(self.choice) < len(trace):
            self.extend()
        for j, st in enumerate(trace.steps, 1):
            self.solver.add(self.takes(j, st.transition))
            mv = self.moves[j - 1][st.transition]
            for k, val in st.inputs.items():
                x = mv.inputs[k]
                if isinstance(val, bool) and z3.is_bool(x):
                    self.solver.add(x == z3.BoolVal(val))
                elif isinstance(val, int) and not isinstance(val, bool) and z3.is_int(x):
                    self.solver.add(x == val)

    def trace(self, m: z3.ModelRef, upto: int) -> ReachTrace:
        steps = []
        for j in range(1, upto + 1):
            t = self.sys.transitions[m.eval(self.choice[j - 1], model_completion=True).as_long()]
            mv = self.moves[j - 1][t]
            steps.append(ReachStep(t, {k: _value(m, v) for k, v in mv.inputs.items()}))
        return ReachTrace(steps, {k: _value(m, v) for k, v in self.params.items()})


def _value(m: z3.ModelRef, v: z3.ExprRef) -> int | bool | str:
    x = m.eval(v, model_completion=True)
    if z3.is_int_value(x):
        return x.as_long()
    if z3.is_true(x) or z3.is_false(x):
        return z3.is_true(x)
    return str(x)


def cover(system: System[Any], timeout_ms: int | None = None) -> Coverage:
    """Reach every goal of ``system`` from its initial state (see the module doc)."""
    t0 = time.perf_counter()
    phase_problems = system.phase_problems()
    excluded = system.excluded()
    s = z3.Solver()
    if timeout_ms:
        s.set("timeout", timeout_ms)
    u = _Unrolling(system, s)
    goals: list[tuple[str, str]] | None = None
    reached: dict[tuple[str, str], ReachTrace] = {}
    gave_up: int | None = None
    for d in range(1, system.depth + 1):
        u.extend()
        if goals is None:
            goals = system.goals(u.moves[0])
        while True:
            todo = [g for g in goals if g not in reached and g not in excluded]
            if not todo:
                break
            s.push()
            s.add(z3.Or([u.goal(d, t, g) for t, g in todo]))
            a = solving.check(s, timeout_ms=timeout_ms)
            if a.model is None:
                s.pop()
                if a.unknown:
                    gave_up = d
                break
            m = a.model
            trace = u.trace(m, d)
            for j in range(1, d + 1):
                for t, g in todo:
                    if (t, g) not in reached and z3.is_true(m.eval(u.goal(j, t, g), model_completion=True)):
                        reached[(t, g)] = ReachTrace(trace.steps[:j], trace.params)
            s.pop()
        if gave_up is not None or (goals is not None and all(g in reached or g in excluded for g in goals)):
            break
    assert goals is not None
    if system.guide is not None and gave_up is None:
        system.guide([g for g in goals if g not in reached and g not in excluded], reached)
    missing = [g for g in goals if g not in reached and g not in excluded]
    # a listed impossibility must stay impossible: one more question, at the deepest unrolling
    never = [g for g in goals if g in excluded]
    stale: list[tuple[str, str]] = []
    if never:
        s.push()
        s.add(z3.Or([u.goal(j, t, g) for j in range(1, len(u.choice) + 1) for t, g in never]))
        a = solving.check(s, timeout_ms=timeout_ms)
        if a.model is not None:
            m = a.model
            stale = [
                (t, g)
                for t, g in never
                if any(z3.is_true(m.eval(u.goal(j, t, g), model_completion=True)) for j in range(1, len(u.choice) + 1))
            ]
        s.pop()
    cov = Coverage(system, reached, missing, stale, time.perf_counter() - t0, gave_up)
    cov.excluded = len(never) - len(stale)
    cov.phase_problems = phase_problems
    return cov


def violation(
    system: System[Any],
    bad: Callable[[str, Move], z3.BoolRef | None],
    *,
    depth: int | None = None,
    timeout_ms: int | None = None,
    why: list[str] | None = None,
) -> tuple[ReachTrace | None, z3.CheckSatResult]:
    """The shortest trace from the initial state whose last step breaks a
    property: ``bad(transition, move)`` is when that move breaks it (None:
    that transition cannot). Returns (the trace or None, the last verdict);
    an unknown's reason (``solving.Answer.reason``) is appended to ``why``."""
    s = z3.Solver()
    if timeout_ms:
        s.set("timeout", timeout_ms)
    u = _Unrolling(system, s)
    r = z3.unsat
    for d in range(1, (depth or system.depth) + 1):
        u.extend()
        cases = []
        for t in system.transitions:
            b = bad(t, u.moves[d - 1][t])
            if b is not None:
                cases.append(z3.And(u.takes(d, t), b))
        if not cases:
            continue
        s.push()
        s.add(z3.Or(cases))
        a = solving.check(s, timeout_ms=timeout_ms)
        r = a.result
        if a.model is not None:
            return u.trace(a.model, d), r
        s.pop()
        if r == z3.unknown:
            if why is not None:
                why.append(a.reason)
            break
    return None, r


def renamer(exprs: Iterable[z3.ExprRef], old_prefix: str, new_prefix: str) -> Callable[[Any], Any]:
    """A function that renames, in any structure of z3 terms (dataclasses,
    tuples, lists, dicts), every free constant whose name starts with
    ``old_prefix`` (an encoding that names its inputs globally) to ``new_prefix``."""

    found: dict[str, z3.ExprRef] = {}
    seen: set[int] = set()
    todo = list(exprs)
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED and str(e).startswith(old_prefix):
            found[str(e)] = e
        elif z3.is_app(e):
            todo.extend(e.children())
    pairs = [(e, z3.Const(new_prefix + n.removeprefix(old_prefix), e.sort())) for n, e in found.items()]

    def sub(x: Any) -> Any:
        if isinstance(x, z3.ExprRef):
            return z3.substitute(x, *pairs) if pairs else x
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return dataclasses.replace(x, **{f.name: sub(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init})
        if isinstance(x, tuple):
            return tuple(sub(y) for y in x)
        if isinstance(x, list):
            return [sub(y) for y in x]
        if isinstance(x, dict):
            return {k: sub(v) for k, v in x.items()}
        return x

    return sub


def leaves(x: Any) -> list[z3.ExprRef]:
    """Every z3 term in a structure of dataclasses, tuples, lists and dicts."""

    if isinstance(x, z3.ExprRef):
        return [x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [t for f in dataclasses.fields(x) for t in leaves(getattr(x, f.name))]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in leaves(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in leaves(y)]
    return []


def equal_leaves(a: Any, b: Any) -> z3.BoolRef:
    """Field-by-field equality of two states of the same shape."""
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb), "states of different shapes"
    return z3.And([x == y for x, y in zip(la, lb, strict=True)] or [z3.BoolVal(True)])
