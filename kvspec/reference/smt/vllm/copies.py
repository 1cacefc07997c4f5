"""``INV-VLLM-COPIES``: the vllm profile's copy counting, proven for any pool size and any hashes.

The ``vllm`` profile (``reference/vllm_pool.py``) may cache one block hash
in several physical copies, and announces every copy: a Stored per copy
cached (STORE-COPY), a Removed per copy evicted (REMOVE-COPY), one Cleared
for a reset (CLEAR-ALL). A router that counts copies per hash then knows
whether some copy is still resident. The invariant: for every hash, the
router's copy count (built only from the published events) equals the
number of physical blocks caching that hash.

Encoded as ``unbounded.py`` does it: physical blocks are an uninterpreted
sort, hashes unbounded integers, the per-hash number of cached copies a
ghost count kept exact by the point-update identity. Steps, one block each
(the model's Use, Deref and Promote are sequences of them; their
all-or-nothing batching is an operation-level matter): a prefix hit on any
cached copy (VLLM-PREFIX-HIT), a new copy in a free block (USE-NEW,
STORE-COPY), a partial block (USE-PARTIAL), a promote of a held block,
a Deref of a copy or of a held block, the eviction of any cached copy with
no owner (VLLM-LAZY-REMOVE, REMOVE-COPY), and a reset with nothing held
(CLEAR-ALL). Non-vacuity: finite models of every step with each rule
firing (``unbounded_models``); three mutants, one per copy rule, refuted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.unbounded.models import _expand, _index_terms
from kvspec.spec.rules import RuleId as R
from kvspec.spec.rules import rid

#: the invariant this module proves
INVARIANT_ID = rid("INV-VLLM-COPIES")

Block = z3.DeclareSort("PhysBlock")
VBlockSort, (V_FREE, V_HELD, V_CACHED) = z3.EnumSort("VBlockState", ["vfree", "vheld", "vcached"])
Int = z3.IntSort()
STATES = {"free": V_FREE, "held": V_HELD, "cached": V_CACHED}


@dataclass(frozen=True)
class VState:
    st: z3.ArrayRef  # Block -> VState
    hsh: z3.ArrayRef  # Block -> Int (the hash a cached copy holds)
    own: z3.ArrayRef  # Block -> Int (owners of a cached copy)
    ccnt: z3.ArrayRef  # ghost: Int -> Int, cached copies per hash
    view: z3.ArrayRef  # router: Int -> Int, copies per hash from the events
    cnt: dict[str, z3.ArithRef]  # ghost census per block state
    n: z3.ArithRef

    @staticmethod
    def fresh(p: str, n: z3.ArithRef) -> VState:
        return VState(
            z3.Array(f"{p}st", Block, VBlockSort),
            z3.Array(f"{p}hsh", Block, Int),
            z3.Array(f"{p}own", Block, Int),
            z3.Array(f"{p}ccnt", Int, Int),
            z3.Array(f"{p}view", Int, Int),
            {k: z3.Int(f"{p}cnt_{k}") for k in STATES},
            n,
        )

    def write(self, b: z3.ExprRef, when: z3.BoolRef, st: z3.ExprRef, hsh: z3.ArithRef, own: z3.ArithRef) -> VState:
        """Slot ``b`` takes (st, hsh, own) when ``when``; ghosts by the point-update identity."""
        old_c = z3.And(when, self.st[b] == V_CACHED)
        new_c = z3.And(when, st == V_CACHED)
        c1 = z3.Store(self.ccnt, self.hsh[b], self.ccnt[self.hsh[b]] - z3.If(old_c, 1, 0))
        c2 = z3.Store(c1, hsh, c1[hsh] + z3.If(new_c, 1, 0))
        cnt = {
            k: v + z3.If(when, z3.If(st == X, 1, 0) - z3.If(self.st[b] == X, 1, 0), 0)
            for (k, v), X in zip(self.cnt.items(), STATES.values(), strict=True)
        }
        return VState(
            z3.If(when, z3.Store(self.st, b, st), self.st),
            z3.If(when, z3.Store(self.hsh, b, hsh), self.hsh),
            z3.If(when, z3.Store(self.own, b, own), self.own),
            c2,
            self.view,
            cnt,
            self.n,
        )

    def announce(self, h: z3.ArithRef, delta: int, when: z3.BoolRef | bool = True) -> VState:
        w = z3.BoolVal(when) if isinstance(when, bool) else when
        view = z3.If(w, z3.Store(self.view, h, self.view[h] + delta), self.view)
        return VState(self.st, self.hsh, self.own, self.ccnt, view, self.cnt, self.n)


@dataclass
class VStep:
    name: str
    pre: VState
    post: VState
    requires: list[z3.BoolRef] = field(default_factory=list)
    rules: dict[str, z3.BoolRef] = field(default_factory=dict)


def _b(name: str) -> z3.ExprRef:
    return z3.Const(f"in_{name}", Block)


def use_hit(S: VState, tw: frozenset[str]) -> VStep:
    h, b = z3.Int("in_h"), _b("b")
    step = VStep("use(hit)", S, S, [h >= 0, S.st[b] == V_CACHED, S.hsh[b] == h])
    step.rules = {R.VLLM_PREFIX_HIT: z3.BoolVal(True)}
    step.post = S.write(b, z3.BoolVal(True), V_CACHED, h, S.own[b] + 1)
    return step


def use_new(S: VState, tw: frozenset[str]) -> VStep:
    h, b = z3.Int("in_h"), _b("b")
    step = VStep("use(new)", S, S, [h >= 0, S.st[b] == V_FREE])
    announced = S.ccnt[h] == 0 if "store-new-only" in tw else z3.BoolVal(True)
    step.rules = {R.USE_NEW: z3.BoolVal(True), R.STORE_COPY: S.ccnt[h] >= 1}
    step.post = S.write(b, z3.BoolVal(True), V_CACHED, h, z3.IntVal(1)).announce(h, 1, announced)
    return step


def use_partial(S: VState, tw: frozenset[str]) -> VStep:
    b = _b("b")
    step = VStep("use(partial)", S, S, [S.st[b] == V_FREE])
    step.rules = {R.USE_PARTIAL: z3.BoolVal(True)}
    step.post = S.write(b, z3.BoolVal(True), V_HELD, S.hsh[b], z3.IntVal(0))
    return step


def promote(S: VState, tw: frozenset[str]) -> VStep:
    h, b = z3.Int("in_h"), _b("b")
    step = VStep("promote", S, S, [h >= 0, S.st[b] == V_HELD])
    step.rules = {R.PROMOTE_NEW: z3.BoolVal(True), R.STORE_COPY: S.ccnt[h] >= 1}
    announced = S.ccnt[h] == 0 if "store-new-only" in tw else z3.BoolVal(True)
    step.post = S.write(b, z3.BoolVal(True), V_CACHED, h, z3.IntVal(1)).announce(h, 1, announced)
    return step


def deref_full(S: VState, tw: frozenset[str]) -> VStep:
    b = _b("b")
    step = VStep("deref(full)", S, S, [S.st[b] == V_CACHED, S.own[b] >= 1])
    step.rules = {R.DEREF_OWNER: z3.BoolVal(True)}
    step.post = S.write(b, z3.BoolVal(True), V_CACHED, S.hsh[b], S.own[b] - 1)
    return step


def deref_partial(S: VState, tw: frozenset[str]) -> VStep:
    b = _b("b")
    step = VStep("deref(partial)", S, S, [S.st[b] == V_HELD])
    step.rules = {R.DEREF_PARTIAL: z3.BoolVal(True)}
    step.post = S.write(b, z3.BoolVal(True), V_FREE, S.hsh[b], z3.IntVal(0))
    return step


def evict(S: VState, tw: frozenset[str]) -> VStep:
    b = _b("b")
    h = S.hsh[b]
    step = VStep("evict", S, S, [S.st[b] == V_CACHED, S.own[b] == 0])
    announced = S.ccnt[h] == 1 if "remove-last-only" in tw else z3.BoolVal(True)
    step.rules = {R.VLLM_LAZY_REMOVE: z3.BoolVal(True), R.REMOVE_COPY: S.ccnt[h] >= 2}
    step.post = S.write(b, z3.BoolVal(True), V_FREE, h, z3.IntVal(0)).announce(h, -1, announced)
    return step


def reset(S: VState, tw: frozenset[str]) -> VStep:
    """CLEAR-ALL: with nothing held (no partial block, no owner), every block
    is freed and one Cleared empties the router's counts."""
    x = z3.Const("xb", Block)
    idle = z3.ForAll([x], z3.And(S.st[x] != V_HELD, z3.Implies(S.st[x] == V_CACHED, S.own[x] == 0)))
    step = VStep("reset", S, S, [idle])
    step.rules = {R.CLEAR_ALL: z3.BoolVal(True)}
    view = S.view if "reset-without-clear" in tw else z3.K(Int, z3.IntVal(0))
    cnt = {"free": S.n, "held": z3.IntVal(0), "cached": z3.IntVal(0)}
    step.post = VState(z3.K(Block, V_FREE), S.hsh, S.own, z3.K(Int, z3.IntVal(0)), view, cnt, S.n)
    return step


TRANSITIONS: dict[str, Callable[[VState, frozenset[str]], VStep]] = {
    "use(hit)": use_hit,
    "use(new)": use_new,
    "use(partial)": use_partial,
    "promote": promote,
    "deref(full)": deref_full,
    "deref(partial)": deref_partial,
    "evict": evict,
    "reset": reset,
}

#: name -> the copy rule it breaks (each must be refuted)
MUTANTS: dict[str, str] = {
    "store-new-only": R.STORE_COPY,
    "remove-last-only": R.REMOVE_COPY,
    "reset-without-clear": R.CLEAR_ALL,
}


def invariant(S: VState) -> z3.BoolRef:
    """INV-VLLM-COPIES: the router's copy count of every hash is its cached copies."""
    h = z3.Int("hq")
    return z3.ForAll([h], S.view[h] == S.ccnt[h])


def facts(S: VState) -> list[z3.BoolRef]:
    """What the ghosts satisfy in every finite pool (cf. ``unbounded.census_facts``)."""
    x, h = z3.Const("xf", Block), z3.Int("hf")
    out = [S.n >= 1, z3.Sum(list(S.cnt.values())) == S.n, *[c >= 0 for c in S.cnt.values()]]
    out += [z3.ForAll([x], z3.Implies(S.st[x] == X, S.cnt[k] >= 1)) for k, X in STATES.items()]
    out += [
        z3.ForAll([h], S.ccnt[h] >= 0),
        z3.ForAll([x], z3.Implies(S.st[x] == V_CACHED, S.ccnt[S.hsh[x]] >= 1)),
        z3.ForAll([x], z3.And(S.hsh[x] >= 0, S.own[x] >= 0)),
    ]
    return out


def _base(name: str, S: VState, tw: frozenset[str]) -> tuple[VStep, list[z3.BoolRef]]:
    step = TRANSITIONS[name](S, tw)
    return step, [*facts(S), invariant(S), *step.requires]


@dataclass
class VProof:
    transition: str
    verdict: str
    seconds: float


def prove_vllm(tw: frozenset[str] = frozenset(), timeout_ms: int = 60_000) -> list[VProof]:
    """The initial pool (all free, router empty) and every step preserve the invariant."""
    out = []
    n = z3.Int("n")
    init = VState(
        z3.K(Block, V_FREE),
        z3.K(Block, z3.IntVal(0)),
        z3.K(Block, z3.IntVal(0)),
        z3.K(Int, z3.IntVal(0)),
        z3.K(Int, z3.IntVal(0)),
        {"free": n, "held": z3.IntVal(0), "cached": z3.IntVal(0)},
        n,
    )
    s = z3.Solver()
    s.add(n >= 1, z3.Not(invariant(init)))
    out.append(VProof("initial state", solving.check(s).verdict, 0.0))
    for name in TRANSITIONS:
        t0 = time.perf_counter()
        step, base = _base(name, VState.fresh("pre_", n), tw)
        s = z3.Solver()
        s.set("timeout", timeout_ms)
        s.add(*base, z3.Not(invariant(step.post)))
        out.append(VProof(name, solving.check(s, timeout_ms=timeout_ms).verdict, time.perf_counter() - t0))
    return out


def finite_check(build: Callable[[VState], list[z3.BoolRef]], k: int = 3, H: int = 3) -> z3.CheckSatResult:
    """Satisfiable in a pool of ``k`` distinct blocks and hashes 0..H-1 (ghosts exact)?"""
    n = z3.Int("n")
    S = VState.fresh("fi_", n)

    def table(name: str, default: int) -> z3.ArrayRef:
        arr = z3.K(Int, z3.IntVal(default))
        for i in range(-1, H):
            arr = z3.Store(arr, i, z3.Int(f"fi_{name}_{i}"))
        return arr

    S = VState(S.st, S.hsh, S.own, table("ccnt", 0), table("view", 0), S.cnt, n)
    bs = [z3.Const(f"blk{i}", Block) for i in range(k)]
    ints = [z3.IntVal(i) for i in range(-2, H + 1)]
    memo: dict[int, z3.ExprRef] = {}
    fs = [_expand(f, bs, ints, memo) for f in build(S)]
    exact = [z3.Distinct(*bs) if k > 1 else z3.BoolVal(True), n == k]
    exact += [S.cnt[key] == z3.Sum([z3.If(S.st[b] == X, 1, 0) for b in bs]) for key, X in STATES.items()]
    exact += [
        S.ccnt[h] == z3.Sum([z3.If(z3.And(S.st[b] == V_CACHED, S.hsh[b] == h), 1, 0) for b in bs]) for h in range(-1, H)
    ]
    block_terms, idx_terms = _index_terms(fs + exact, Block)
    universe = [z3.Or([t == b for b in bs]) for t in block_terms if not any(t.eq(b) for b in bs)]
    in_range = [z3.And(-1 <= i, i < H) for i in idx_terms]
    s = z3.Solver()
    s.set("timeout", 60_000)
    s.add(*fs, *exact, *universe, *in_range)
    return solving.check(s, timeout_ms=60_000).result


def sanity() -> list[str]:
    """Every step, with every rule guard, has a finite model of the hypothesis."""
    problems = []
    for name in TRANSITIONS:
        probe, _ = _base(name, VState.fresh("probe_", z3.Int("n")), frozenset())
        for rule in [None, *probe.rules]:

            def build(S: VState, name: str = name, rule: str | None = rule) -> list[z3.BoolRef]:
                step, base = _base(name, S, frozenset())
                return base + ([step.rules[rule]] if rule else [])

            if finite_check(build) != z3.sat:
                problems.append(f"vllm {name}: " + (f"rule {rule} never fires" if rule else "never enabled"))
    return problems


def refute(mutant: str) -> str | None:
    """The step at which the mutant breaks INV-VLLM-COPIES in a finite pool (None: not refuted)."""
    for name in TRANSITIONS:

        def build(S: VState, name: str = name) -> list[z3.BoolRef]:
            step, base = _base(name, S, frozenset({mutant}))
            return [*base, z3.Not(invariant(step.post))]

        if finite_check(build) == z3.sat:
            return name
    return None
