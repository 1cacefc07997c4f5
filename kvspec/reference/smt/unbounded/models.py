"""Finite models of the unbounded encoding: the non-vacuity checks of ``kvspec prove --unbounded``.

Deciding *satisfiability* of the quantified formulas of ``unbounded.py`` (the
sanity checks, a mutant's counterexample) is where z3's quantifier reasoning
gives up (``unknown``). A finite instance answers it: ``k`` distinct slots
(the whole Slot universe) and hash-indexed arrays equal to a default value
outside -1..H-1. On such a state every ``ForAll``/``Exists`` is exactly its
conjunction/disjunction over the k slots and over -1..H-1 plus two sentinels
(-2 and H stand for every index out of range: there each array holds its
default), provided every index term is in range, which the instance
requires. The census ghosts are required to be the counts of the instance,
so a model is a real finite state (of k slots and H hashes), not only a
model of the formulas.
"""

from __future__ import annotations

from collections.abc import Callable

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.unbounded.encoding import (
    ARRAYS,
    MUTANTS,
    TRANSITIONS,
    Int,
    Slot,
    Tweaks,
    UMutant,
    UState,
    UStep,
    by_id,
    census_facts,
    domain,
    hypothesis,
    instantiate,
)
from kvspec.reference.smt.universe import ACTIVE, NONE, RESERVED, SLOT_STATES

__all__ = ["MUTANTS", "finite_check", "finite_sanity", "refute_finite"]

FINITE_SLOTS, FINITE_HASHES = 3, 4


def _ind(c: z3.BoolRef) -> z3.ArithRef:
    return z3.If(c, 1, 0)


def _solver(timeout_ms: int) -> z3.Solver:
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    return s


#: the hash-indexed arrays whose default must be "nothing" (else their counts are infinite)
_EMPTY_DEFAULT = {"dev": False, "g2": False, "g2v": False, "reg": False, "phel": False, "jcnt": 0}


def finite_state(prefix: str, n: z3.ArithRef, cap2: z3.ArithRef, H: int) -> UState:
    """A state whose hash-indexed arrays are a default plus H+1 entries (-1..H-1)."""
    S = UState.fresh(prefix, n, cap2)
    a = dict(S.a)
    for name, (idx, rng) in ARRAYS.items():
        if idx != Int:
            continue
        arr = z3.K(Int, z3.Const(f"{prefix}{name}_default", rng))
        for i in range(NONE, H):
            arr = z3.Store(arr, i, z3.Const(f"{prefix}{name}_{i}", rng))
        a[name] = arr
    return S.but(a)


def _expand(e: z3.ExprRef, slots: list[z3.ExprRef], ints: list[z3.ArithRef], memo: dict[int, z3.ExprRef]) -> z3.ExprRef:
    """``e`` with each ``ForAll``/``Exists`` replaced by its conjunction/disjunction
    over ``slots`` (or ``ints``, by the bound variable's sort) and each select of a
    ``Lambda`` beta-reduced. A ``Lambda`` is a term, not a quantifier: read as one
    (a disjunction of its bodies) it was an Or of Ints (a z3 sort mismatch) or,
    with a Bool range, a wrong formula. A lambda no select applies stays as it is."""
    key = e.get_id()
    if key in memo:
        return memo[key]
    if z3.is_quantifier(e) and e.is_lambda():
        out: z3.ExprRef = e
    elif z3.is_quantifier(e):
        assert e.num_vars() == 1, "one bound variable per quantifier"
        dom = ints if e.var_sort(0) == z3.IntSort() else slots
        body = e.body()
        cases = [_expand(z3.substitute_vars(body, c), slots, ints, memo) for c in dom]
        out = z3.And(cases) if e.is_forall() else z3.Or(cases)
    elif z3.is_select(e) and z3.is_quantifier(e.arg(0)) and e.arg(0).is_lambda():
        idx = [_expand(e.arg(i), slots, ints, memo) for i in range(1, e.num_args())]
        out = _expand(z3.substitute_vars(e.arg(0).body(), *reversed(idx)), slots, ints, memo)
    elif z3.is_app(e) and e.num_args() > 0:
        out = e.decl()(*[_expand(c, slots, ints, memo) for c in e.children()])
    else:
        out = e
    memo[key] = out
    memo[-key - 1] = e  # held, so its id is not reused by another term while the memo lives
    return out


def _index_terms(fs: list[z3.ExprRef], sort: z3.SortRef = Slot) -> tuple[list[z3.ExprRef], list[z3.ArithRef]]:
    """The ``sort``-sorted terms (slots) and the non-literal Int indices of hash arrays."""
    slot_terms: dict[int, z3.ExprRef] = {}
    idx_terms: dict[int, z3.ArithRef] = {}
    seen: set[int] = set()
    todo = list(fs)
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if e.sort() == sort:
            slot_terms[e.get_id()] = e
        if z3.is_select(e) and e.arg(1).sort() == Int and not z3.is_int_value(e.arg(1)):
            idx_terms[e.arg(1).get_id()] = e.arg(1)
        if z3.is_app(e):
            todo.extend(e.children())
    return list(slot_terms.values()), list(idx_terms.values())


def finite_check(
    build: Callable[[UState], list[z3.BoolRef]], k: int = FINITE_SLOTS, H: int = FINITE_HASHES, timeout_ms: int = 60_000
) -> tuple[z3.CheckSatResult, z3.Solver]:
    """Is ``build(pre)`` satisfiable in a finite instance of ``k`` slots and
    ``H`` hashes (the census ghosts exact)? ``sat`` is a model of the
    quantified formulas themselves (see above)."""
    n, cap2 = z3.Int("n"), z3.Int("cap2")
    S = finite_state("fi_", n, cap2, H)
    cs = [z3.Const(f"slot{i}", Slot) for i in range(k)]
    ints = [z3.IntVal(i) for i in range(NONE - 1, H + 1)]
    memo: dict[int, z3.ExprRef] = {}
    fs = [_expand(f, cs, ints, memo) for f in build(S)]
    a, v = S.a, S.v
    exact = [z3.Distinct(*cs) if k > 1 else z3.BoolVal(True), n == k]
    exact += [v[f"cnt_{X}"] == z3.Sum([_ind(a["st"][c] == X) for c in cs]) for X in SLOT_STATES.values()]
    exact.append(v["refsum"] == z3.Sum([z3.If(a["st"][c] == ACTIVE, a["own"][c], 0) for c in cs]))
    exact += [
        a["jcnt"][j] == z3.Sum([_ind(z3.And(a["st"][c] == RESERVED, a["jid"][c] == j)) for c in cs])
        for j in range(NONE, H)
    ]
    exact.append(v["g2n"] == z3.Sum([_ind(a["g2"][i]) for i in range(NONE, H)]))
    exact += [z3.Const(f"fi_{name}_default", ARRAYS[name][1]) == val for name, val in _EMPTY_DEFAULT.items()]
    slot_terms, idx_terms = _index_terms(fs + exact)
    universe = [z3.Or([t == c for c in cs]) for t in slot_terms if not any(t.eq(c) for c in cs)]
    in_range = [z3.And(i >= NONE, i < H) for i in idx_terms]
    s = _solver(timeout_ms)
    s.add(*fs, *exact, *universe, *in_range)
    return solving.check(s, timeout_ms=timeout_ms).result, s


def _finite_base(name: str, tw: Tweaks) -> Callable[[UState], tuple[UStep, list[z3.BoolRef]]]:
    def build(S: UState) -> tuple[UStep, list[z3.BoolRef]]:
        step, doms = instantiate(name, S, tw)
        return step, [*domain(S), *census_facts(S, "fi_"), *doms, *hypothesis(S), step.enabled()]

    return build


def finite_sanity(tw: Tweaks = frozenset(), timeout_ms: int = 60_000) -> list[str]:
    """Non-vacuity of the unbounded proofs: for every transition, a finite
    state satisfies the whole hypothesis (every invariant and lemma, the
    census facts) with the step enabled, and each rule guard fires in one."""
    problems = []
    for name in TRANSITIONS:
        build = _finite_base(name, tw)

        def assumptions(S: UState, b: Callable[[UState], tuple[UStep, list[z3.BoolRef]]] = build) -> list[z3.BoolRef]:
            return b(S)[1]

        r, _ = finite_check(assumptions, timeout_ms=timeout_ms)
        if r != z3.sat:
            problems.append(f"{name}: assumptions not shown satisfiable ({r})")
            continue
        for rule in build(UState.fresh("probe_", z3.Int("n"), z3.Int("cap2")))[0].rules:

            def with_rule(S: UState, b=build, rule=rule) -> list[z3.BoolRef]:
                step, base = b(S)
                return [*base, step.rules[rule]]

            r, _ = finite_check(with_rule, timeout_ms=timeout_ms)
            if r != z3.sat:
                problems.append(f"{name}: rule {rule} not shown to fire ({r})")
    return problems


def refute_finite(m: UMutant, timeout_ms: int = 60_000) -> tuple[str, str | None]:
    """A counterexample to the mutant's property in the unbounded encoding, in
    a finite instance: (verdict, the transition). "refuted" when found."""
    prop = by_id(m.expect)
    tw = frozenset({m.name})
    verdict = "not refuted"
    for name in TRANSITIONS:
        build = _finite_base(name, tw)

        def broken(S: UState, b=build) -> list[z3.BoolRef]:
            step, base = b(S)
            conj = prop.step_conjuncts(step)
            return [*base, z3.Not(z3.And([c for _l, c in conj] or [z3.BoolVal(True)]))]

        r, _ = finite_check(broken, timeout_ms=timeout_ms)
        if r == z3.sat:
            return "refuted", name
        if r == z3.unknown:
            verdict = "unknown"
    return verdict, None
