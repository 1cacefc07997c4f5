"""``kvspec prove --profile radix``: the INV-RADIX-* invariants, proven 1-inductive with z3.

For each invariant and each step of ``radix_encoding.STEPS``: from *any*
state of the bounded universe satisfying all seven invariants (reachable or
not) in which the step is enabled, the successor satisfies the invariant
(``unsat`` of the negation is the proof); the empty cache satisfies them
all. A lemma row proves what the invariants give a reader directly (lock
counts never negative, a locked page's ancestors locked, one lock count per
node).

Not vacuous: ``sanity`` shows every step enabled and every sub-case of every
step (``RadixTransition.cases``) satisfiable under the invariants, and the invariants
satisfiable together in a rich state (a branching tree with a split node and
a lock held below it). ``MUTANTS`` breaks one rule each; ``refute`` must find
a counterexample for each, which ``render`` prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.radix.encoding import (
    INVARIANTS,
    ROOT,
    STEPS,
    RadixBound,
    RState,
    all_invariants,
    lemma_lock_path,
    live_pages,
)
from kvspec.spec.rules import RuleId as R

LEMMA_ID = "LEMMA-RADIX-LOCK-PATH"
DEFAULT_BOUND = RadixBound()


@dataclass(frozen=True)
class RadixMutant:
    """A broken rule of the encoding: the step it changes and the invariant it must break."""

    name: str
    rule: str
    step: str
    breaks: str
    description: str
    #: it changes a successor the model also computes, so the sampled
    #: agreement catches it too (a mutant that only drops a guard lets more
    #: steps through, which the model never takes: the proofs refute it)
    agreement: bool = True


MUTANTS: dict[str, RadixMutant] = {
    m.name: m
    for m in [
        RadixMutant(
            "evict-locked",
            R.RADIX_LOCKED_KEPT,
            "evict",
            R.INV_RADIX_LOCKS,
            "evict takes a leaf page that is locked",
            agreement=False,
        ),
        RadixMutant(
            "evict-inner",
            R.RADIX_EVICT_LRU,
            "evict",
            R.INV_RADIX_ANCHOR,
            "evict takes a page that has children",
            agreement=False,
        ),
        RadixMutant(
            "insert-restores-page",
            R.RADIX_MATCH,
            "add_head",
            R.INV_RADIX_NO_DUP,
            "insert hangs a page a child already holds (the walk stopped early): the page is stored twice",
            agreement=False,
        ),
        RadixMutant(
            "insert-republishes-prefix",
            R.RADIX_INSERT,
            "add_head",
            R.INV_RADIX_ROUTER,
            "insert's Stored also names the cached page it hangs under",
        ),
        RadixMutant(
            "leaf-under-run",
            R.RADIX_MATCH,
            "add_head",
            R.INV_RADIX_RUN,
            "insert hangs a leaf inside a node's run without splitting it",
            agreement=False,
        ),
        RadixMutant(
            "insert-takes-no-slot", R.RADIX_CAPACITY, "add_head", R.INV_RADIX_CAPACITY, "a new page takes no free slot"
        ),
        RadixMutant("split-publishes", R.RADIX_SPLIT_SILENT, "split", R.INV_RADIX_ROUTER, "a split publishes a Stored"),
        RadixMutant(
            "split-forgets-parent",
            R.RADIX_MATCH,
            "split",
            R.INV_RADIX_TREE,
            "a split leaves the lower half under the old parent, skipping the new upper node",
        ),
        RadixMutant(
            "split-forgets-lock",
            R.RADIX_MATCH,
            "split",
            R.INV_RADIX_LOCKS,
            "a split leaves the new upper node unlocked (its pages' lock counts 0)",
        ),
        RadixMutant(
            "lock-node-only", R.RADIX_LOCK, "lock", R.INV_RADIX_LOCKS, "lock counts the end page, not its path"
        ),
        RadixMutant("reset-keeps-locks", R.RADIX_RESET, "reset", R.INV_RADIX_LOCKS, "reset keeps the held locks"),
        RadixMutant("reset-without-clear", R.RADIX_RESET, "reset", R.INV_RADIX_ROUTER, "reset publishes no Cleared"),
    ]
}


#: rows no mutant names as the one it breaks -> a mutant that breaks it as well (``breaks`` checks it):
#: counting the end page only leaves the lock path's parent page behind
ALSO_BREAKS: dict[str, str] = {LEMMA_ID: "lock-node-only"}


def breaks(name: str, row: str, bound: RadixBound = DEFAULT_BOUND) -> bool:
    """The mutant's step, from a state of the invariants, leads to a state
    where ``row`` (an invariant or the lemma) is false."""
    m = MUTANTS[name]
    step = STEPS[m.step](RState.fresh(bound, "pre_"), frozenset({name}))
    prop = lemma_lock_path if row == LEMMA_ID else INVARIANTS[row]
    s = z3.Solver()
    s.add(*_hyp(step.pre), *step.requires, z3.Not(prop(step.post)))
    return solving.check(s).sat


@dataclass
class RadixProof:
    """One invariant: proven at every step (and initially), or where it failed."""

    property_id: str
    verdict: str  # "proven" | "refuted" | "unknown"
    seconds: float
    failed_at: list[str]


def _solver(timeout_ms: int | None) -> z3.Solver:
    s = z3.Solver()
    if timeout_ms:
        s.set("timeout", timeout_ms)
    return s


def _hyp(S: RState) -> list[z3.BoolRef]:
    return [S.cap >= 0, *all_invariants(S)]


def prove_radix(
    bound: RadixBound = DEFAULT_BOUND,
    tw: frozenset[str] = frozenset(),
    timeout_ms: int | None = None,
    on_result: Callable[[RadixProof], None] | None = None,
) -> list[RadixProof]:
    """Every INV-RADIX-* row (and the lemma): initially true, preserved by every step."""
    props: dict[str, Callable[[RState], z3.BoolRef]] = {**INVARIANTS, LEMMA_ID: lemma_lock_path}
    init = RState.initial(bound, z3.Int("cap0"))
    steps = {name: make(RState.fresh(bound, "pre_"), tw) for name, make in STEPS.items()}
    out = []
    for pid, prop in props.items():
        t0 = time.perf_counter()
        failed: list[str] = []
        unknown = False
        if pid == LEMMA_ID:
            S = RState.fresh(bound, "pre_")
            s = _solver(timeout_ms)
            s.add(*_hyp(S), z3.Not(prop(S)))
            r = solving.check(s, timeout_ms=timeout_ms)
            failed += ["the invariants"] if r.sat else []
            unknown |= r.unknown
        else:
            s = _solver(timeout_ms)
            s.add(z3.Int("cap0") >= 0, z3.Not(prop(init)))
            r = solving.check(s, timeout_ms=timeout_ms)
            failed += ["initial state"] if r.sat else []
            unknown |= r.unknown
            for name, step in steps.items():
                s = _solver(timeout_ms)
                s.add(*_hyp(step.pre), *step.requires, z3.Not(prop(step.post)))
                r = solving.check(s, timeout_ms=timeout_ms)
                if r.sat:
                    failed.append(name)
                unknown |= r.unknown
        verdict = "refuted" if failed else ("unknown" if unknown else "proven")
        res = RadixProof(str(pid), verdict, time.perf_counter() - t0, failed)
        if on_result:
            on_result(res)
        out.append(res)
    return out


def rich_state(S: RState) -> list[z3.BoolRef]:
    """A state worth having a model of: three live pages or more, a page with
    two children, a node run of two pages, a lock held at a page."""
    n = S.n
    two_kids = z3.Or(
        [z3.And(S.live[a], S.live[b], S.pp[a] == S.pp[b], S.pp[a] != ROOT) for a in range(n) for b in range(a + 1, n)]
        or [z3.BoolVal(False)]
    )
    run = z3.Or([z3.And(S.live[p], z3.Not(S.head[p])) for p in range(n)])
    locked = z3.Or([z3.And(S.held[k], S.at[k] != ROOT) for k in range(len(S.held))] or [z3.BoolVal(False)])
    return [live_pages(S) >= 3, two_kids, run, locked]


def sanity(bound: RadixBound = DEFAULT_BOUND, tw: frozenset[str] = frozenset()) -> list[str]:
    """Every step enabled, every sub-case of every step satisfiable, the
    invariants satisfiable in a rich state; the problems found (empty: ok)."""
    problems = []
    S = RState.fresh(bound, "s_")
    s = z3.Solver()
    s.add(*_hyp(S), *rich_state(S))
    if not solving.check(s).sat:
        problems.append("radix: the invariants have no state with a branch, a run and a lock")
    for name, make in STEPS.items():
        step = make(RState.fresh(bound, "s_"), tw)
        s = z3.Solver()
        s.add(*_hyp(step.pre), *step.requires)
        if not solving.check(s).sat:
            problems.append(f"radix {name}: never enabled")
            continue
        for case, cond in step.cases.items():
            s.push()
            s.add(cond)
            if not solving.check(s).sat:
                problems.append(f"radix {name}: the case {case!r} is never possible")
            s.pop()
    return problems


@dataclass
class RadixCounterexample:
    mutant: str
    invariant: str
    step: str
    text: str


def refute(name: str, bound: RadixBound = DEFAULT_BOUND) -> RadixCounterexample | None:
    """The mutant's counterexample: a state satisfying every invariant from
    which its step breaks the invariant it names (None: not refuted)."""
    m = MUTANTS[name]
    step = STEPS[m.step](RState.fresh(bound, "pre_"), frozenset({name}))
    s = z3.Solver()
    s.add(*_hyp(step.pre), *step.requires, z3.Not(INVARIANTS[m.breaks](step.post)))
    model = solving.check(s).model
    if model is None:
        return None
    text = render(step.pre, model, "before") + "\n" + render(step.post, model, "after")
    chosen = sorted(str(d) for d in model.decls() if str(d).startswith("in_"))
    picks = ", ".join(f"{c[3:]}={model.eval(z3.Int(c), model_completion=True)}" for c in chosen)
    head = f"MUTANT {name}: {m.description} (breaks {m.rule})\n{m.breaks} fails after {m.step}({picks}):"
    return RadixCounterexample(name, m.breaks, m.step, head + "\n" + text)


def render(S: RState, model: z3.ModelRef, label: str) -> str:
    """The live pages and held locks of ``S`` in ``model``, one line each."""

    def ev(x: z3.ExprRef) -> str:
        return str(model.eval(x, model_completion=True))

    lines = [f"  {label}: free={ev(S.free)} capacity={ev(S.cap)}"]
    for p in range(S.n):
        if z3.is_true(model.eval(S.live[p], model_completion=True)):
            parent = ev(S.pp[p])
            lines.append(
                f"    page {p}: parent={'root' if parent == str(ROOT) else parent} tokens={ev(S.tok[p])}"
                f" {'node-start ' if z3.is_true(model.eval(S.head[p], model_completion=True)) else ''}"
                f"lock={ev(S.lock[p])} router={ev(S.pub[p])}"
            )
        elif ev(S.pub[p]) != "0" or ev(S.lock[p]) != "0":
            lines.append(f"    page {p}: not live, lock={ev(S.lock[p])} router={ev(S.pub[p])}")
    for k in range(len(S.held)):
        if z3.is_true(model.eval(S.held[k], model_completion=True)):
            at = ev(S.at[k])
            lines.append(f"    lock {k}: held at {'root' if at == str(ROOT) else 'page ' + at}")
    return "\n".join(lines)
