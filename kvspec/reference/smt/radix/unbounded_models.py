"""Finite models of the unbounded radix encoding: its non-vacuity checks and mutant counterexamples.

z3 proves the quantified obligations of ``radix_unbounded.py`` ``unsat``;
showing a quantified formula *satisfiable* (a step enabled, a sub-case
possible, a mutant's counterexample) is where its quantifier reasoning can
give up. A finite instance answers it: ``k`` distinct pages plus ``root``
are the whole ``RPage`` sort and ``m`` distinct handles the whole
``RHandle`` sort (domain-closure axioms), every universal fact is also given
as its full expansion over those elements, and the census ghosts are
required to be the counts of the instance. A ``sat`` answer is then a real
finite state of ``k`` pages and ``m`` handles, not only a model of the
formulas.
"""

from __future__ import annotations

from collections.abc import Callable

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.radix.unbounded import (
    INVARIANTS,
    ROOT,
    STEPS,
    UR,
    Handle,
    Page,
    Tweaks,
    URStep,
    goal,
    hypothesis,
)

FINITE_PAGES, FINITE_HANDLES = 4, 2


def _ind(c: z3.BoolRef) -> z3.ArithRef:
    return z3.If(c, 1, 0)


def _expand(
    e: z3.ExprRef, pages: list[z3.ExprRef], handles: list[z3.ExprRef], memo: dict[int, tuple[z3.ExprRef, z3.ExprRef]]
) -> z3.ExprRef:
    """``e`` with every quantifier replaced by its conjunction (disjunction)
    over the elements and every select of a ``Lambda`` beta-reduced: a
    quantifier-free formula, equivalent on the finite instance."""
    key = e.get_id()
    if key in memo and memo[key][0].eq(e):
        return memo[key][1]
    out: z3.ExprRef
    if z3.is_quantifier(e) and not e.is_lambda():
        doms = [pages if e.var_sort(i) == Page else handles for i in range(e.num_vars())]
        combos: list[list[z3.ExprRef]] = [[]]
        for d in doms:
            combos = [[*c, x] for c in combos for x in d]
        cases = [_expand(z3.substitute_vars(e.body(), *reversed(c)), pages, handles, memo) for c in combos]
        out = z3.And(cases) if e.is_forall() else z3.Or(cases)
    elif z3.is_select(e) and z3.is_quantifier(e.arg(0)) and e.arg(0).is_lambda():
        lam = e.arg(0)
        idx = [_expand(e.arg(i), pages, handles, memo) for i in range(1, e.num_args())]
        out = _expand(z3.substitute_vars(lam.body(), *reversed(idx)), pages, handles, memo)
    elif z3.is_app(e) and e.num_args() > 0:
        out = e.decl()(*[_expand(c, pages, handles, memo) for c in e.children()])
    else:
        out = e
    memo[key] = (e, out)  # the term too: an id is reused once its term is freed
    return out


def _sorted_terms(fs: list[z3.ExprRef]) -> list[z3.ExprRef]:
    """The page- and handle-sorted subterms of quantifier-free ``fs``."""
    found: dict[int, z3.ExprRef] = {}
    seen: set[int] = set()
    todo = list(fs)
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if e.sort() in (Page, Handle):
            found[e.get_id()] = e
        if z3.is_app(e):
            todo.extend(e.children())
    return list(found.values())


def finite_check(
    build: Callable[[UR], list[z3.BoolRef]],
    k: int = FINITE_PAGES,
    m: int = FINITE_HANDLES,
    timeout_ms: int = 60_000,
) -> tuple[z3.CheckSatResult, z3.Solver, list[z3.ExprRef], list[z3.ExprRef]]:
    """Is ``build(pre)`` satisfiable in a state of ``k`` pages and ``m`` handles (censuses exact)?"""
    S = UR.fresh("fi_")
    pages = [z3.Const(f"page{i}", Page) for i in range(k)]
    handles = [z3.Const(f"handle{i}", Handle) for i in range(m)]
    every_page = [ROOT, *pages]
    exact = [S.npages == z3.Sum([_ind(S.live[p]) for p in pages])]
    exact += [S.lc[p] == z3.Sum([_ind(S.member(j, p)) for j in handles]) for p in every_page]
    memo: dict[int, tuple[z3.ExprRef, z3.ExprRef]] = {}
    fs = [_expand(f, every_page, handles, memo) for f in [*build(S), *exact]]
    universe = []
    for t in _sorted_terms(fs):
        dom = every_page if t.sort() == Page else handles
        if not any(t.eq(x) for x in dom):
            universe.append(z3.Or([t == x for x in dom]))
    distinct = [z3.Distinct(*every_page)] + ([z3.Distinct(*handles)] if m > 1 else [])
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*distinct, *universe, *fs)
    return solving.check(s, timeout_ms=timeout_ms).result, s, pages, handles


def _step_query(name: str, tw: Tweaks, extra: Callable[[URStep], list[z3.BoolRef]]) -> Callable[[UR], list]:
    def build(S: UR) -> list[z3.BoolRef]:
        step = STEPS[name](S, tw)
        return [*hypothesis(S), *step.requires, *extra(step)]

    return build


def rich_state(S: UR) -> list[z3.BoolRef]:
    """A branching tree with a node run of two pages and a lock held at a page."""
    a, b, c, d = z3.Consts("ra rb rc rd", Page)
    k = z3.Const("rk", Handle)
    return [
        S.live[b],
        S.live[c],
        b != c,
        S.pp[b] == a,
        S.pp[c] == a,
        a != ROOT,
        z3.Exists([d], z3.And(S.live[d], z3.Not(S.head[d]))),
        S.held[k],
        S.at[k] != ROOT,
    ]


def finite_sanity(tw: Tweaks = frozenset(), timeout_ms: int = 60_000) -> list[str]:
    """Every step enabled, every sub-case possible, the invariants hold of a
    rich state: each in a finite model. The problems found (empty: ok)."""
    problems = []
    r, *_ = finite_check(lambda S: [*hypothesis(S), *rich_state(S)], timeout_ms=timeout_ms)
    if r != z3.sat:
        problems.append(f"radix unbounded: no finite state with a branch, a run and a lock ({r})")
    for name in STEPS:
        r, *_ = finite_check(_step_query(name, tw, lambda st: []), timeout_ms=timeout_ms)
        if r != z3.sat:
            problems.append(f"radix unbounded {name}: never enabled in a finite state ({r})")
            continue
        cases = STEPS[name](UR.fresh("probe_"), tw).cases
        for case in cases:
            r, *_ = finite_check(
                _step_query(name, tw, lambda st, case=case: [st.cases[case]]),  # type: ignore[misc]
                timeout_ms=timeout_ms,
            )
            if r != z3.sat:
                problems.append(f"radix unbounded {name}: the case {case!r} has no finite state ({r})")
    return problems


def refute_finite(mutant: str, step: str, breaks: str, timeout_ms: int = 60_000) -> tuple[str, str]:
    """The mutant's counterexample in a finite state: (verdict, rendered text)."""
    tw = frozenset({mutant})
    r, s, pages, handles = finite_check(
        _step_query(step, tw, lambda st: [z3.Not(goal(breaks, st))]), timeout_ms=timeout_ms
    )
    model = solving.check(s, timeout_ms=timeout_ms).model if r == z3.sat else None
    if model is None:
        return ("not refuted" if r == z3.unsat else "unknown"), ""
    return "refuted", render(model, pages, handles)


def render(model: z3.ModelRef, pages: list[z3.ExprRef], handles: list[z3.ExprRef]) -> str:
    """The pre-state's live pages and held handles in ``model``, one line each."""
    S = UR.fresh("fi_")

    def ev(e: z3.ExprRef) -> z3.ExprRef:
        return model.eval(e, model_completion=True)

    names = {str(ev(p)): f"page{i}" for i, p in enumerate(pages)}
    names[str(ev(ROOT))] = "root"
    lines = [f"  before: free={ev(S.free)} capacity={ev(S.cap)}"]
    for i, p in enumerate(pages):
        if z3.is_true(ev(S.live[p])):
            lines.append(
                f"    page{i}: parent={names.get(str(ev(S.pp[p])), '?')} tokens={ev(S.tok[p])}"
                f"{' node-start' if z3.is_true(ev(S.head[p])) else ''} lock={ev(S.lock[p])} router={ev(S.pub[p])}"
            )
    for i, h in enumerate(handles):
        if z3.is_true(ev(S.held[h])):
            lines.append(f"    handle{i}: held at {names.get(str(ev(S.at[h])), '?')}")
    return "\n".join(lines)


__all__ = ["FINITE_HANDLES", "FINITE_PAGES", "INVARIANTS", "finite_check", "finite_sanity", "refute_finite"]
