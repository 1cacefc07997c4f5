"""The shared encoding of the block-level profiles without an offload tier: ``kvbm``, ``atomic``, ``legacy``.

The three models (``reference/g1.py`` without offload, ``reference/legacy.py``)
keep a *registry keyed by sequence hash* plus slot counters, so the encoding
does the same: every per-block field is an array indexed by the block hash
(unbounded integers), partial blocks an array indexed by their uuid, and the
slot counts are ghost censuses kept exact by the point-update identity, as
``profile_vllm.py`` does for physical blocks. "No hash registered twice" is
then true by construction; what the proofs are about is the router's view.

Batch-level semantics. A Use is not one step: its blocks are placed one by
one, and what it publishes depends on the whole batch (``kvbm``: one Stored
and one Removed after the batch; ``legacy``: each Removed at once and one
Stored at the end, or none if the Use fails; ``atomic``: a capacity check
before anything moves and one Stored per group). Each profile's Use is
therefore a sequence of steps (begin, one step per block, close) over a
state that carries the batch in progress as ghost fields (``new``: the
blocks it registered, whose Stored is pending; ``ev``: the blocks it
evicted, whose Removed is pending; ...), and the invariants are stated for
every state *inside* a batch as well as between operations: a proof covers
batches of any length, not only a bounded unrolling.

Each profile module gives its transitions (``Transition``: a pre-state and
inputs to a ``BStep``), its invariants (named conjuncts per rule id) and its
mutants (tweaks of the transitions). This module proves them (``prove``),
checks non-vacuity on finite instances (``sanity``: every step and rule guard
satisfiable together with the whole hypothesis) and refutes the mutants
(``refute``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.unbounded.models import _index_terms

Int = z3.IntSort()
Bool = z3.BoolSort()
#: "no block": the parent of a root block, the anchor of a Stored with no parent
NONE = -1

#: per-hash fields (arrays Int -> sort) and their "nothing" value
HASH_FIELDS: dict[str, z3.SortRef] = {
    "reg": Bool,  # registered (active or inactive)
    "own": Int,  # owner count (0: inactive)
    "ann": Bool,  # kvbm: the block's ``announced`` flag
    "unann": Bool,  # legacy: in the ``unannounced`` set (placed by a failed Use)
    "dev": Bool,  # the router's device view, built only from published events
    "new": Bool,  # batch: registered by the Use in progress, its Stored pending
    "ev": Bool,  # batch (kvbm): evicted by the Use in progress, its Removed pending
    "evann": Bool,  # batch (kvbm): the evicted block was announced
    "pin": Bool,  # batch (atomic): an inactive hit of the batch taken out of the pool
    "inb": Bool,  # batch (atomic): named by the batch and not placed yet
    "miss": Bool,  # batch (atomic): not registered when the batch was checked, not placed yet
}
#: per-uuid fields
UUID_FIELDS: dict[str, z3.SortRef] = {
    "preg": Bool,  # a partial block (kvbm, atomic: held; legacy: an entry of the cache)
    "pown": Int,  # legacy: the partial entry's owner count (0: inactive)
    "pmiss": Bool,  # batch (atomic): a partial of the batch not held at the check, not placed yet
}
#: scalars
SCALARS: dict[str, z3.SortRef] = {
    "cap": Int,  # capacity (slots)
    "free": Int,  # the model's free-slot counter (kvbm, atomic)
    "phase": Int,  # 0 idle, 1 declaring (atomic), 2 placing, 3 stopped (kvbm, legacy)
    "anc": Int,  # atomic: the parent of the next Stored group
    "prev": Int,  # atomic: the last full block of the batch so far (or the caller's parent)
    "gpar": Int,  # atomic: the block before the open group's first block
    "gopen": Bool,  # atomic: a Stored group is open
}
IDLE, DECLARE, PLACE, STOPPED = 0, 1, 2, 3
#: these encodings have no slot sort (``_index_terms`` collects none of it)
_NO_SLOT = z3.DeclareSort("NoSlot")


def _ind(c: z3.BoolRef) -> z3.ArithRef:
    return z3.If(c, 1, 0)


#: census name -> (index kind, predicate over the record of one hash or uuid)
Record = Mapping[str, z3.ExprRef]
CENSUS: dict[str, tuple[str, Callable[[Record], z3.BoolRef]]] = {
    "act": ("h", lambda r: z3.And(r["reg"], z3.Or(r["own"] >= 1, r["pin"]))),
    "inact": ("h", lambda r: z3.And(r["reg"], r["own"] == 0, z3.Not(r["pin"]))),
    "pin": ("h", lambda r: r["pin"]),
    "miss": ("h", lambda r: r["miss"]),
    "part": ("u", lambda r: r["preg"]),
    "pact": ("u", lambda r: z3.And(r["preg"], r["pown"] >= 1)),
    "pinact": ("u", lambda r: z3.And(r["preg"], r["pown"] == 0)),
    "pmiss": ("u", lambda r: r["pmiss"]),
}


@dataclass(frozen=True)
class BState:
    a: dict[str, z3.ArrayRef]  # hash and uuid arrays
    v: dict[str, z3.ExprRef]  # scalars
    c: dict[str, z3.ArithRef]  # census ghosts

    @staticmethod
    def fresh(p: str) -> BState:
        a = {k: z3.Array(f"{p}{k}", Int, s) for k, s in {**HASH_FIELDS, **UUID_FIELDS}.items()}
        v = {k: z3.Const(f"{p}{k}", s) for k, s in SCALARS.items()}
        c = {k: z3.Int(f"{p}c_{k}") for k in CENSUS}
        return BState(a, v, c)

    def rec(self, kind: str, x: z3.ArithRef) -> dict[str, z3.ExprRef]:
        names = HASH_FIELDS if kind == "h" else UUID_FIELDS
        return {k: self.a[k][x] for k in names}

    def but(self, **kw: z3.ExprRef) -> BState:
        a, v, c = dict(self.a), dict(self.v), dict(self.c)
        for k, x in kw.items():
            if k in a:
                a[k] = x
            elif k in v:
                v[k] = x
            else:
                c[k.removeprefix("c_")] = x
        return BState(a, v, c)

    def write(self, kind: str, x: z3.ArithRef, when: z3.BoolRef | bool, **vals: z3.ExprRef) -> BState:
        """Entry ``x`` of the hash (``h``) or uuid (``u``) arrays takes ``vals``
        when ``when``; each census of that kind moves by the point-update identity."""
        w = z3.BoolVal(when) if isinstance(when, bool) else when
        old = self.rec(kind, x)
        new = {**old, **vals}
        a = dict(self.a)
        for k, val in vals.items():
            a[k] = z3.If(w, z3.Store(self.a[k], x, val), self.a[k])
        c = dict(self.c)
        for name, (ck, pred) in CENSUS.items():
            if ck == kind:
                c[name] = self.c[name] + z3.If(w, _ind(pred(new)) - _ind(pred(old)), 0)
        return BState(a, dict(self.v), c)


@dataclass
class BStep:
    name: str
    pre: BState
    post: BState
    #: when the step may happen (the model accepts it; the inputs name what the rule needs)
    requires: list[z3.BoolRef] = field(default_factory=list)
    #: rule id -> when that rule fires in this step (sanity: each is satisfiable)
    rules: dict[str, z3.BoolRef] = field(default_factory=dict)
    #: invariant id -> obligations about the step itself (e.g. a Stored's parent when emitted)
    obligations: dict[str, list[z3.BoolRef]] = field(default_factory=dict)
    #: the Stored events the step publishes, as (when, parent) in order (atomic; for the agreement check)
    stored: list[tuple[z3.BoolRef, z3.ExprRef]] = field(default_factory=list)
    #: the hashes the step's Removed event names (kvbm, atomic: the batch's one Removed, at
    #: ``use(close)``; for the agreement check: an eviction whose Removed cancels the batch's own
    #: Stored leaves the end state as a different victim choice would, the event does not)
    removed: z3.ArrayRef | None = None


#: a transition: (pre-state, inputs, the mutants in force) -> step
Transition = Callable[[BState, dict[str, z3.ExprRef], frozenset[str]], BStep]
#: the inputs every transition may read (a hash, a victim hash, a uuid, a victim uuid, the caller's parent, a choice)
INPUTS: dict[str, z3.SortRef] = {"h": Int, "v": Int, "u": Int, "w": Int, "p": Int, "vp": Bool}


def inputs(p: str = "in_") -> dict[str, z3.ExprRef]:
    return {k: z3.Const(f"{p}{k}", s) for k, s in INPUTS.items()}


@dataclass(frozen=True)
class ProfileEncoding:
    """One profile's encoding: transitions, invariants, mutants."""

    name: str
    transitions: dict[str, Transition]
    #: invariant id -> its conjuncts (label, formula) over a state
    invariants: dict[str, Callable[[BState], list[tuple[str, z3.BoolRef]]]]
    #: the initial state (an empty cache of any capacity)
    initial: Callable[[z3.ArithRef], BState]
    #: mutant name -> (the rule it breaks, what it changes)
    mutants: dict[str, tuple[str, str]]
    #: transitions that must never be enabled in a state satisfying the invariants
    unreachable: tuple[str, ...] = ()

    def hypothesis(self, S: BState) -> list[z3.BoolRef]:
        return [f for inv in self.invariants.values() for _l, f in inv(S)]


def census_facts(S: BState, prefix: str) -> list[z3.BoolRef]:
    """What the census ghosts satisfy in every finite state when they are the
    counts they stand for: not negative, at least one when some entry has the
    property, and a witness entry when positive (a fresh constant per census)."""
    out: list[z3.BoolRef] = []
    x = z3.Int("xc")
    for name, (kind, pred) in CENSUS.items():
        cnt = S.c[name]
        out.append(cnt >= 0)
        out.append(z3.ForAll([x], z3.Implies(pred(S.rec(kind, x)), cnt >= 1)))
        wit = z3.Int(f"{prefix}wit_{name}")
        out.append(z3.Implies(cnt >= 1, pred(S.rec(kind, wit))))
    out.append(z3.ForAll([x], z3.And(S.a["own"][x] >= 0, S.a["pown"][x] >= 0)))
    return out


def domain(S: BState) -> list[z3.BoolRef]:
    """Block hashes are >= 0 (NONE = -1 is no block): nothing is held at a negative hash."""
    x = z3.Int("xd")
    return [
        S.v["cap"] >= 1,
        z3.ForAll([x], z3.Implies(x < 0, z3.And(z3.Not(S.a["reg"][x]), z3.Not(S.a["dev"][x])))),
    ]


def base(
    prof: ProfileEncoding, name: str, S: BState, inp: dict[str, z3.ExprRef], tw: frozenset[str], p: str
) -> tuple[BStep, list[z3.BoolRef]]:
    step = prof.transitions[name](S, inp, tw)
    return step, [*domain(S), *census_facts(S, p), *prof.hypothesis(S), *step.requires]


def _goal(prof: ProfileEncoding, inv_id: str, step: BStep) -> z3.BoolRef:
    post = [f for _l, f in prof.invariants[inv_id](step.post)] if inv_id in prof.invariants else []
    return z3.And([*post, *step.obligations.get(inv_id, [])] or [z3.BoolVal(True)])


@dataclass
class Proof:
    invariant: str
    transition: str
    verdict: str  # proven | refuted | unknown
    seconds: float
    #: why a verdict is unknown (``solving.Answer.reason``: "timeout after N s", ...)
    reason: str = ""


def prove(prof: ProfileEncoding, tw: frozenset[str] = frozenset(), timeout_ms: int = 120_000) -> list[Proof]:
    """Each invariant holds initially and is kept by every transition from any
    state satisfying all of them (1-inductive, any capacity, any hashes)."""
    out = []
    ids = list(prof.invariants)
    for inv_id in ids:
        t0 = time.perf_counter()
        s = z3.Solver()
        s.set("timeout", timeout_ms)
        cap = z3.Int("cap0")
        init = prof.initial(cap)
        s.add(cap >= 1, z3.Not(z3.And([f for _l, f in prof.invariants[inv_id](init)])))
        r = solving.check(s, timeout_ms=timeout_ms)
        out.append(Proof(inv_id, "initial state", r.kind, time.perf_counter() - t0, r.reason))
        for name in prof.transitions:
            if name in prof.unreachable:
                continue
            t0 = time.perf_counter()
            step, hyp = base(prof, name, BState.fresh("pre_"), inputs(), tw, "pre_")
            s = z3.Solver()
            s.set("timeout", timeout_ms)
            s.add(*hyp, z3.Not(_goal(prof, inv_id, step)))
            r = solving.check(s, timeout_ms=timeout_ms)
            out.append(Proof(inv_id, name, r.kind, time.perf_counter() - t0, r.reason))
    for name in prof.unreachable:
        t0 = time.perf_counter()
        _step, hyp = base(prof, name, BState.fresh("pre_"), inputs(), tw, "pre_")
        s = z3.Solver()
        s.set("timeout", timeout_ms)
        s.add(*hyp)
        r = solving.check(s, timeout_ms=timeout_ms)
        out.append(Proof(f"never: {name}", name, r.kind, time.perf_counter() - t0, r.reason))
    return out


def _expand(e: z3.ExprRef, ints: list[z3.ArithRef], memo: dict[int, z3.ExprRef]) -> z3.ExprRef:
    """Every ForAll/Exists over Int as the conjunction/disjunction over ``ints``
    (lambdas, the post-state arrays of bulk updates, are left to z3)."""
    key = e.get_id()
    if key in memo:
        return memo[key]
    if z3.is_quantifier(e) and not e.is_lambda():
        assert e.num_vars() == 1 and e.var_sort(0) == Int, "one Int variable per quantifier"
        cases = [_expand(z3.substitute_vars(e.body(), c), ints, memo) for c in ints]
        out: z3.ExprRef = z3.And(cases) if e.is_forall() else z3.Or(cases)
    elif z3.is_app(e) and e.num_args() > 0:
        out = e.decl()(*[_expand(c, ints, memo) for c in e.children()])
    else:
        out = e
    memo[key] = out
    return out


def finite_check(
    build: Callable[[BState], list[z3.BoolRef]], H: int = 3, timeout_ms: int = 60_000
) -> z3.CheckSatResult:
    """Is ``build(S)`` satisfiable in a finite state: hashes and uuids -1..H-1,
    every array "nothing" elsewhere, the census ghosts the exact counts?"""
    S0 = BState.fresh("fi_")
    a = {}
    for k, sort in {**HASH_FIELDS, **UUID_FIELDS}.items():
        arr = z3.K(Int, z3.BoolVal(False) if sort == Bool else z3.IntVal(0))
        for i in range(NONE, H):
            arr = z3.Store(arr, i, z3.Const(f"fi_{k}_{i}", sort))
        a[k] = arr
    S = BState(a, S0.v, S0.c)
    ints = [z3.IntVal(i) for i in range(NONE - 1, H + 1)]
    memo: dict[int, z3.ExprRef] = {}
    fs = [_expand(f, ints, memo) for f in build(S)]
    exact = [
        S.c[name] == z3.Sum([_ind(pred(S.rec(kind, z3.IntVal(i)))) for i in range(NONE, H)])
        for name, (kind, pred) in CENSUS.items()
    ]
    _, idx = _index_terms(fs + exact, _NO_SLOT)
    in_range = [z3.And(i >= NONE, i < H) for i in idx]
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*fs, *exact, *in_range)
    return solving.check(s, timeout_ms=timeout_ms).result


def sanity(prof: ProfileEncoding, tw: frozenset[str] = frozenset()) -> list[str]:
    """Non-vacuity: every transition, and every rule guard of it, is enabled in
    a finite state satisfying the whole hypothesis; the unreachable ones are not."""
    problems = []
    for name in prof.transitions:
        probe, _ = base(prof, name, BState.fresh("probe_"), inputs("probe_"), tw, "probe_")
        for rule in [None, *probe.rules]:

            def build(S: BState, name: str = name, rule: str | None = rule) -> list[z3.BoolRef]:
                step, hyp = base(prof, name, S, inputs(), tw, "fi_")
                return hyp + ([step.rules[rule]] if rule else [])

            r = finite_check(build)
            if name in prof.unreachable:
                if rule is None and r != z3.unsat:
                    problems.append(f"{prof.name} {name}: expected never enabled, got {r}")
                break
            if r != z3.sat:
                problems.append(
                    f"{prof.name} {name}: " + (f"rule {rule} never fires" if rule else "never enabled") + f" ({r})"
                )
    return problems


def refute(prof: ProfileEncoding, mutant: str) -> str | None:
    """Where the mutant breaks an invariant, in a finite instance: "transition
    (invariant)", None when not refuted. One check per transition (some
    invariant broken), then the invariant is named."""
    tw = frozenset({mutant})

    def broken(name: str, ids: list[str]) -> bool:
        def build(S: BState) -> list[z3.BoolRef]:
            step, hyp = base(prof, name, S, inputs(), tw, "fi_")
            return [*hyp, z3.Not(z3.And([_goal(prof, i, step) for i in ids]))]

        return finite_check(build) == z3.sat

    ids = list(prof.invariants)
    for name in prof.transitions:
        if broken(name, ids):
            which = next((i for i in ids if broken(name, [i])), "?")
            return f"{name} ({which})"
    return None
