"""The inductive prover: every invariant holds initially and every transition
preserves it, for every state of the bounded universe.

For each transition the prover builds one symbolic step from a fully
symbolic pre-state (every field a fresh constant, only its type
constrained), assumes the inductive hypothesis (all state invariants and
lemmas) and that the step is enabled (the operation is valid, the caller
keeps its contract, the rule's choices are ones it allows), and asks z3 for
a post-state (or transition property) that breaks each invariant in turn.
``unsat`` for every transition and the initial state means proven; ``sat``
comes with a counterexample: the pre-state, the step and its inputs, the
rules it applied, the events it published, and the post-state.

Two sanity checks guard against vacuous proofs: every valid operation from
every such state has a successor (the rule's choices exist), and every
rule guard of every transition fires in some state the proof covers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import z3

from kvspec.reference.smt.concrete import ConcreteState, evaluate
from kvspec.reference.smt.offload.catalogue import TRANSITIONS, TransitionSpec, domain_range
from kvspec.reference.smt.offload.invariants import ALL_PROPERTIES, INVARIANTS, LEMMAS, Conjuncts, Property, assumed
from kvspec.reference.smt.offload.state import Rigid, State
from kvspec.reference.smt.offload.step import EncodedStep
from kvspec.reference.smt.offload.transitions import Policy
from kvspec.reference.smt.solving import check
from kvspec.reference.smt.universe import DEFAULT_BOUND, Bound

#: how the prover applies a transition: the catalogue's, or a mutant's
Applier = Callable[..., tuple[EncodedStep, dict[str, z3.ArithRef], list[z3.BoolRef]]]


def default_applier(
    spec: TransitionSpec, S: State, prefix: str, policy: Policy, *, symmetry: bool = False
) -> tuple[EncodedStep, dict[str, z3.ArithRef], list[z3.BoolRef]]:
    return spec.instantiate(S, prefix, policy, symmetry=symmetry)


@dataclass
class Counterexample:
    property_id: str
    transition: str  # "initial state" for the base case
    pre: ConcreteState | None
    post: ConcreteState
    params: dict[str, int]
    rules: list[str]
    events: list[str]
    failed: list[str]

    def render(self) -> str:
        lines = [f"COUNTEREXAMPLE to {self.property_id} ({self.transition})"]
        lines.append("  broken: " + "; ".join(self.failed))
        if self.pre is not None:
            lines.append("  pre-state (satisfies every invariant and lemma):")
            lines.append(self.pre.render("    "))
            args = ", ".join(f"{k}={v}" for k, v in self.params.items())
            lines.append(f"  transition: {self.transition}({args})")
            lines.append(f"  rules applied: {', '.join(self.rules) or '(none)'}")
            lines.append(f"  events published: {'; '.join(self.events) or '(none)'}")
            lines.append("  changes:")
            lines.append(self.pre.diff(self.post, "    "))
        lines.append("  post-state:")
        lines.append(self.post.render("    "))
        return "\n".join(lines)


@dataclass
class Result:
    property_id: str
    lemma: bool
    proven: bool
    seconds: float
    bound: Bound
    counterexample: Counterexample | None = None
    per_transition: dict[str, float] = field(default_factory=dict)
    unknown: bool = False
    #: why an unknown is one: "timeout after N s", "z3 model does not show the violation", ...
    reason: str = ""

    @property
    def verdict(self) -> str:
        if self.unknown:
            return "unknown" if self.reason.startswith("timeout") or not self.reason else f"unknown ({self.reason})"
        return "proven" if self.proven else "counterexample"


def _failed(model: z3.ModelRef, conj: Conjuncts) -> list[str]:
    return [label for label, c in conj if not z3.is_true(model.eval(c, model_completion=True))]


def _events(model: z3.ModelRef, step: EncodedStep) -> list[str]:
    out = []
    for f in step.frags:
        if z3.is_true(model.eval(f.when, model_completion=True)):
            desc = f"{f.tier} {f.kind} {evaluate(model, f.block)}"
            if f.kind == "stored" and f.parent is not None:
                desc += f" (parent {evaluate(model, f.parent)})"
            out.append(desc)
    return out


@dataclass
class _Built:
    spec: TransitionSpec
    step: EncodedStep
    consts: dict[str, z3.ArithRef]
    base: list[z3.BoolRef]


def build(
    spec: TransitionSpec, bound: Bound, policy: Policy, applier: Applier, assume: list[Property], symmetry: bool = False
) -> _Built:
    rigid = Rigid.fresh(bound)
    pre = State.fresh(bound, rigid, "pre_")
    step, consts, doms = applier(spec, pre, "in_", policy, symmetry=symmetry)
    base = [*rigid.domain(), *pre.domain(), *doms, assumed(pre, assume), step.enabled()]
    return _Built(spec, step, consts, base)


def _solver(timeout_ms: int | None) -> z3.Solver:
    s = z3.Solver()
    if timeout_ms:
        s.set("timeout", timeout_ms)
    return s


def check_initial(prop: Property, bound: Bound) -> Counterexample | str | None:
    """None: the initial state satisfies ``prop``; a Counterexample; or why z3's answer is
    unknown."""
    rigid = Rigid.fresh(bound)
    init = State.initial(bound, rigid)
    conj = prop.state_conjuncts(init)
    if not conj:
        return None
    s = z3.Solver()
    s.add(*rigid.domain())
    s.add(z3.Not(z3.And([c for _l, c in conj])))
    a = check(s)
    if a.unsat:
        return None
    if a.model is None:
        return a.reason
    m = a.model
    post = ConcreteState.from_model(m, init)
    return Counterexample(prop.id, "initial state", None, post, {}, [], [], _failed(m, conj))


def prove(
    bound: Bound = DEFAULT_BOUND,
    *,
    props: Iterable[Property] | None = None,
    assume: list[Property] | None = None,
    transitions: Iterable[TransitionSpec] | None = None,
    policy: Policy = "unordered",
    applier: Applier = default_applier,
    timeout_ms: int | None = None,
    on_result: Callable[[Result], None] | None = None,
    symmetry: bool = True,
) -> list[Result]:
    """Prove each property inductive over ``bound``; one Result per property."""
    props = list(ALL_PROPERTIES if props is None else props)
    assume = ALL_PROPERTIES if assume is None else assume
    specs = list(TRANSITIONS if transitions is None else transitions)
    built: list[tuple[_Built, z3.Solver]] = []
    results: list[Result] = []
    for spec in specs:
        b = build(spec, bound, policy, applier, assume, symmetry)
        s = _solver(timeout_ms)
        s.add(*b.base)
        built.append((b, s))
    for prop in props:
        t0 = time.perf_counter()
        res = Result(prop.id, prop.lemma, True, 0.0, bound)
        cex = check_initial(prop, bound)
        if isinstance(cex, str):
            res.proven, res.unknown, res.reason = False, True, cex
        elif cex is not None:
            res.proven, res.counterexample = False, cex
        for b, s in built:
            if not res.proven:
                break
            t1 = time.perf_counter()
            conj = prop.step_conjuncts(b.step)
            if not conj:
                continue
            s.push()
            s.add(z3.Not(z3.And([c for _l, c in conj])))
            a = check(s, timeout_ms=timeout_ms)
            if a.model is not None:
                m = a.model
                step = b.step
                res.proven = False
                res.counterexample = Counterexample(
                    prop.id,
                    b.spec.name,
                    ConcreteState.from_model(m, step.pre),
                    ConcreteState.from_model(m, step.post),
                    {k: evaluate(m, v) for k, v in b.consts.items()},
                    [str(r) for r, g in step.rules.items() if z3.is_true(m.eval(g, model_completion=True))],
                    _events(m, step),
                    _failed(m, conj),
                )
            elif a.unknown:
                res.proven, res.unknown, res.reason = False, True, a.reason
            s.pop()
            res.per_transition[b.spec.name] = time.perf_counter() - t1
        res.seconds = time.perf_counter() - t0
        results.append(res)
        if on_result is not None:
            on_result(res)
    return results


def without_contracts(applier: Applier = default_applier) -> Applier:
    """``applier`` with the caller contracts (ASSUME-*) dropped: every valid
    operation is allowed, whatever the caller holds."""

    def apply(spec: TransitionSpec, S: State, prefix: str, policy: Policy, *, symmetry: bool = False):
        step, consts, doms = applier(spec, S, prefix, policy, symmetry=symmetry)
        step.requires = {k: v for k, v in step.requires.items() if v[0] != "contract"}
        return step, consts, doms

    return apply


def contract_free(bound: Bound, policy: Policy = "unordered") -> set[str]:
    """The properties that stay inductive when the caller keeps no contract:
    the largest set proven with only itself as the hypothesis."""
    keep = list(ALL_PROPERTIES)
    while True:
        results = prove(bound, props=keep, assume=keep, policy=policy, applier=without_contracts())
        proven = [p for p, r in zip(keep, results, strict=True) if r.proven]
        if len(proven) == len(keep):
            return {str(p.id) for p in keep}
        keep = proven


# ------------------------------------------------------------ sanity checks


def _choice_vars(spec: TransitionSpec, cond: z3.BoolRef, consts: dict[str, z3.ArithRef]) -> list[str]:
    names = {str(c): n for n, c in consts.items() if n in spec.choices}
    found: set[str] = set()
    todo = [cond]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_const(e) and str(e) in names:
            found.add(names[str(e)])
        todo.extend(e.children())
    return sorted(found)


def check_enabled(
    bound: Bound,
    policy: Policy = "unordered",
    assume: list[Property] | None = None,
    applier: Applier = default_applier,
) -> list[str]:
    """Every valid operation, from every state the invariants allow and with
    the caller's contract kept, has a successor: each choice its rule needs
    exists. Returns the problems found (empty: none)."""
    problems: list[str] = []
    for spec in TRANSITIONS:
        b = build(spec, bound, policy, applier, ALL_PROPERTIES if assume is None else assume)
        step = b.step
        base = b.base[:-1]  # all but "enabled"
        base.append(step.enabled("valid", "contract"))
        for name, (cat, cond) in step.requires.items():
            if cat != "choice":
                continue
            vars_ = _choice_vars(spec, cond, b.consts)
            if len(vars_) != 1:
                problems.append(f"{spec.name}: choice {name} mentions {vars_}, expected one choice")
                continue
            var = b.consts[vars_[0]]
            dom = domain_range(bound, spec.choices[vars_[0]])
            s = z3.Solver()
            s.add(*base)
            s.add(*[z3.Not(z3.substitute(cond, (var, z3.IntVal(k)))) for k in dom])
            if not check(s).unsat:
                problems.append(f"{spec.name}: choice {name} can be impossible for a valid operation")
    return problems


def check_rules_reachable(bound: Bound, policy: Policy = "unordered", applier: Applier = default_applier) -> list[str]:
    """Every rule guard of every transition fires in some state the proof
    covers (the proofs are not vacuous). Returns the guards that never fire."""
    problems: list[str] = []
    for spec in TRANSITIONS:
        b = build(spec, bound, policy, applier, ALL_PROPERTIES)
        s = z3.Solver()
        s.add(*b.base)
        if not check(s).sat:
            problems.append(f"{spec.name}: never enabled")
            continue
        for rule, guard in b.step.rules.items():
            s.push()
            s.add(guard)
            if not check(s).sat:
                problems.append(f"{spec.name}: rule {rule} never fires")
            s.pop()
    return problems


def needed_lemmas(bound: Bound, policy: Policy = "unordered") -> dict[str, list[str]]:
    """For each lemma, the properties that stop being provable without it
    (used to document which lemma strengthens which invariant)."""
    out: dict[str, list[str]] = {}
    for lemma in LEMMAS:
        assume = [p for p in ALL_PROPERTIES if p is not lemma]
        res = prove(bound, assume=assume, policy=policy)
        out[lemma.id] = [r.property_id for r in res if not r.proven]
    return out


def needed_for(bound: Bound, prop: Property, policy: Policy = "unordered") -> list[str]:
    """The other properties whose omission from the inductive hypothesis (one
    at a time) leaves ``prop`` without a proof: the lemmas it needs."""
    out: list[str] = []
    for other in ALL_PROPERTIES:
        if other is prop:
            continue
        assume = [p for p in ALL_PROPERTIES if p is not other]
        r = prove(bound, props=[prop], assume=assume, policy=policy)[0]
        if not r.proven:
            out.append(other.id)
    return out


__all__ = ["INVARIANTS", "LEMMAS", "Counterexample", "Result", "check_enabled", "check_rules_reachable", "prove"]


def replay(
    cex: Counterexample, applier: Applier = default_applier, policy: Policy = "unordered"
) -> tuple[bool, bool, bool]:
    """Check a counterexample by plain evaluation, without a solver: apply the
    transition (through ``applier``) to the concrete pre-state with the
    concrete inputs. Returns (every invariant and lemma holds before, the step
    is enabled, the property holds after)."""
    from kvspec.reference.smt.offload.catalogue import transition as spec_of
    from kvspec.reference.smt.offload.invariants import by_id

    assert cex.pre is not None, "the initial-state case has no transition to replay"
    S = cex.pre.to_state()
    step, consts, _doms = applier(spec_of(cex.transition), S, "rp_", policy, symmetry=False)
    subst = [(consts[k], z3.IntVal(v)) for k, v in cex.params.items() if k in consts]

    def value(t: z3.ExprRef) -> bool:
        return z3.is_true(z3.simplify(z3.substitute(t, *subst) if subst else t))

    before = value(assumed(S))
    enabled = value(step.enabled())
    after = value(z3.And([c for _l, c in by_id(cex.property_id).step_conjuncts(step)] or [z3.BoolVal(True)]))
    return before, enabled, after
