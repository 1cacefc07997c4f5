"""Eviction order per policy, over an encoded recency order: the ORDER-* rows.

The profile encodings let any inactive block (unlocked radix leaf, unowned
copy) go: their invariants hold under every victim choice. This module adds
what those leave out, the order itself, one policy at a time, on a bounded
pool of ``N`` entries:

- every entry carries a stamp ``st`` taken from a clock when it enters the
  pool (LRU, multi-LRU, lineage: ``policies.py``; the vllm free queue: a
  block freed; radix: a node created) or is accessed (radix: a match or
  insert passing it, a *touch*); multi-LRU also a level fixed at entry,
  lineage and radix a parent (constant, acyclic), radix a lock bit, lineage
  a link bit (the entry knows its parent: set when it enters the pool,
  dropped when its node goes; a ghost made for a missing parent has none);
- a ghost relation ``bef[i][j]`` (``i`` entered or was last touched before
  ``j``) is kept by the steps directly, from the history, without stamps;
- ``evict`` takes the candidate with the smallest key as the model orders
  them: LRU and the vllm free queue the stamp; multi-LRU (level, stamp);
  lineage (tick, position, hash) among *real leaves* (no node linked below
  it: a ghost without real descendants is dropped by the model; bound to
  ``policies.LineagePolicy`` by ``order/policy_equivalence.py``); radix the
  stamp among unlocked leaves.

Proven at every step, from any state of the invariant ``ORDER-STAMPS``
(stamps of entries distinct, below the clock, and ordered as ``bef``): the
invariant again, and at ``evict`` the policy's order row (``ORDER-LRU``,
``ORDER-MULTI-LRU``, ``ORDER-LINEAGE``, ``ORDER-VLLM-FREE``,
``ORDER-RADIX-LRU``): the victim is a candidate that entered (or was
touched) before every other candidate of its class, stated over ``bef``,
not over the stamps the guard reads. Bounded: ``N`` entries (default 4).
Each policy has mutants (order reversed, a new entry stamped 0 as the
radix escape of issue 24, level or leaf or lock ignored), each refuted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import z3

from kvspec.reference.smt.solving import check
from kvspec.spec.registry import RADIX

N = 4
#: the radix profile's eviction order (least recently used unlocked leaf), keyed by the profile's name
RADIX_ORDER = RADIX
POLICIES = ("lru", "multi_lru", "lineage", "vllm-free", RADIX_ORDER)
#: policy -> its order row id (SPEC.md, "Proven invariants")
ROW = {
    "lru": "ORDER-LRU",
    "multi_lru": "ORDER-MULTI-LRU",
    "lineage": "ORDER-LINEAGE",
    "vllm-free": "ORDER-VLLM-FREE",
    RADIX_ORDER: "ORDER-RADIX-LRU",
}
STAMPS = "ORDER-STAMPS"


@dataclass(frozen=True)
class OMutant:
    name: str
    policies: tuple[str, ...]
    breaks: str  # "order" (the policy's row) or STAMPS
    what: str


MUTANTS: dict[str, OMutant] = {
    m.name: m
    for m in [
        OMutant("order-reversed", POLICIES, "order", "evict takes the largest key (the newest)"),
        OMutant("insert-stamp-zero", POLICIES, STAMPS, "a new entry is stamped 0, not the clock (radix: a new leaf "
                "with last_access = 0)"),
        OMutant("touch-keeps-stamp", (RADIX_ORDER,), STAMPS, "a touch (match or insert passing a node) keeps "
                "its stamp"),
        OMutant("level-ignored", ("multi_lru",), "order", "evict compares stamps only, across levels"),
        OMutant("lineage-not-leaf", ("lineage",), "order", "evict may take a block with a real block below it"),
        OMutant("radix-evicts-locked", (RADIX_ORDER,), "order", "evict may take a locked leaf"),
    ]
}  # fmt: skip


def mutants_of(policy: str) -> list[str]:
    return [m.name for m in MUTANTS.values() if policy in m.policies]


@dataclass(frozen=True)
class OrderState:
    inp: tuple[z3.BoolRef, ...]
    st: tuple[z3.ArithRef, ...]
    lvl: tuple[z3.ArithRef, ...]
    par: tuple[z3.ArithRef, ...]
    lock: tuple[z3.BoolRef, ...]
    bef: tuple[tuple[z3.BoolRef, ...], ...]
    clock: z3.ArithRef
    #: lineage: the entry's link to its parent is known (it entered the pool since its node was
    #: made; a ghost made for a missing parent knows none). Empty: every link (other policies)
    lk: tuple[z3.BoolRef, ...] = ()

    @staticmethod
    def fresh(p: str, n: int = N) -> OrderState:
        r = range(n)
        return OrderState(
            inp=tuple(z3.Bool(f"{p}in{i}") for i in r),
            st=tuple(z3.Int(f"{p}st{i}") for i in r),
            lvl=tuple(z3.Int(f"{p}lvl{i}") for i in r),
            par=tuple(z3.Int(f"{p}par{i}") for i in r),
            lock=tuple(z3.Bool(f"{p}lock{i}") for i in r),
            bef=tuple(tuple(z3.Bool(f"{p}bef{i}_{j}") for j in r) for i in r),
            clock=z3.Int(f"{p}clock"),
            lk=tuple(z3.Bool(f"{p}lk{i}") for i in r),
        )

    @property
    def n(self) -> int:
        return len(self.inp)


def _anc(S: OrderState, a: int, d: int) -> z3.BoolRef:
    """``a`` is a proper ancestor of ``d`` through the constant parent links (bounded by N)."""
    out: list[z3.BoolRef] = []
    cur: z3.ArithRef = S.par[d]
    for _ in range(S.n):
        out.append(cur == a)
        nxt: z3.ArithRef = z3.IntVal(-1)
        for k in range(S.n):
            nxt = z3.If(cur == k, S.par[k], nxt)
        cur = nxt
    return z3.Or(out)


def wellformed(S: OrderState, policy: str) -> list[z3.BoolRef]:
    """The constant parts: parents acyclic (a parent has a smaller index), levels 0..3."""
    out = []
    for i in range(S.n):
        out.append(z3.Or(S.par[i] == -1, z3.And(S.par[i] >= 0, S.par[i] < i)))
        out.append(z3.And(S.lvl[i] >= 0, S.lvl[i] <= 3))
        if policy == RADIX_ORDER:  # a live node's parent is live (the tree), a lock covers the path above
            out.append(
                z3.Implies(
                    z3.And(S.inp[i], S.par[i] >= 0),
                    z3.Or([z3.And(S.par[i] == k, S.inp[k]) for k in range(i)] or [z3.BoolVal(False)]),
                )
            )
    return out  # fmt: skip


def stamps(S: OrderState) -> z3.BoolRef:
    """ORDER-STAMPS: entries' stamps are distinct, below the clock, and ordered as the history ``bef``."""
    out = [S.clock >= 0]
    for i in range(S.n):
        out.append(z3.Implies(S.inp[i], z3.And(S.st[i] >= 0, S.st[i] < S.clock)))
        for j in range(S.n):
            if i != j:
                both = z3.And(S.inp[i], S.inp[j])
                out.append(z3.Implies(both, S.bef[i][j] == (S.st[i] < S.st[j])))
                out.append(z3.Implies(both, S.st[i] != S.st[j]))
    return z3.And(out)


def _link(S: OrderState, i: int) -> z3.BoolRef:
    return S.lk[i] if S.lk else z3.BoolVal(True)


def nodes(S: OrderState) -> list[z3.BoolRef]:
    """Lineage: which entries have a node in the forest: in the pool, or a ghost with a node
    linked below it (a parent has a smaller index, so each is settled from the last entry up)."""
    out: list[z3.BoolRef] = [z3.BoolVal(False)] * S.n
    for i in reversed(range(S.n)):
        kids = [z3.And(out[d], _link(S, d), S.par[d] == i) for d in range(i + 1, S.n)]
        out[i] = z3.Or(S.inp[i], *kids)
    return out


def _settle(S: OrderState) -> OrderState:
    """Lineage: a node that went (no longer in the pool, nothing linked below) forgets its link."""
    if not S.lk:
        return S
    ex = nodes(S)
    return replace(S, lk=tuple(z3.And(S.lk[i], ex[i]) for i in range(S.n)))


def candidate(S: OrderState, policy: str, i: int, tw: frozenset[str]) -> z3.BoolRef:
    """May entry ``i`` be evicted at all (before the order is applied)? Lineage: a real leaf of
    the forest the pool has built, no node linked below it (as ``policies.LineagePolicy``)."""
    c = S.inp[i]
    if policy == "lineage" and "lineage-not-leaf" not in tw:
        ex = nodes(S)
        c = z3.And(c, z3.Not(z3.Or([z3.And(ex[d], _link(S, d), S.par[d] == i) for d in range(S.n) if d != i])))
    if policy == RADIX_ORDER:
        c = z3.And(c, z3.Not(z3.Or([z3.And(S.inp[d], S.par[d] == i) for d in range(S.n) if d != i])))
        if "radix-evicts-locked" not in tw:
            c = z3.And(c, z3.Not(S.lock[i]))
    return c


def _key_lt(S: OrderState, policy: str, a: int, b: int, tw: frozenset[str]) -> z3.BoolRef:
    """The model's key of ``a`` below ``b`` (lineage: (tick, position, hash), position and hash = index)."""
    if policy == "multi_lru" and "level-ignored" not in tw:
        return z3.Or(S.lvl[a] < S.lvl[b], z3.And(S.lvl[a] == S.lvl[b], S.st[a] < S.st[b]))
    if policy == "lineage":
        return z3.Or(S.st[a] < S.st[b], z3.And(S.st[a] == S.st[b], z3.BoolVal(a < b)))
    return S.st[a] < S.st[b]


def older(S: OrderState, policy: str, a: int, b: int) -> z3.BoolRef:
    """The order row's statement, from the history: ``a`` goes before ``b``."""
    if policy == "multi_lru":
        return z3.Or(S.lvl[a] < S.lvl[b], z3.And(S.lvl[a] == S.lvl[b], S.bef[a][b]))
    return S.bef[a][b]


@dataclass(frozen=True)
class OrderStep:
    name: str
    requires: list[z3.BoolRef]
    post: OrderState
    victim: z3.ArithRef | None = None


def _stamp(S: OrderState, k: z3.ArithRef, value: z3.ArithRef) -> OrderState:
    """Entry ``k`` in the pool with stamp ``value``, the most recent in the history."""
    n = S.n
    inp = tuple(z3.Or(S.inp[i], k == i) for i in range(n))
    st = tuple(z3.If(k == i, value, S.st[i]) for i in range(n))
    bef = tuple(
        tuple(S.bef[i][j] if i == j else z3.If(k == j, z3.BoolVal(True), z3.If(k == i, z3.BoolVal(False), S.bef[i][j]))
              for j in range(n))
        for i in range(n)
    )  # fmt: skip
    return replace(S, inp=inp, st=st, bef=bef, clock=S.clock + 1)


def steps(S: OrderState, policy: str, tw: frozenset[str], p: str = "") -> list[OrderStep]:
    """Every step of ``policy`` from ``S``, its inputs free (``k``: the entry, ``v``: the victim)."""
    n = S.n
    k, v, lv = z3.Int(f"{p}k"), z3.Int(f"{p}v"), z3.Int(f"{p}lv")
    inr = z3.And(k >= 0, k < n)
    out: list[OrderStep] = []
    stamp = z3.IntVal(0) if "insert-stamp-zero" in tw else S.clock
    ins = _stamp(S, k, stamp)
    req = [inr, z3.Not(z3.Or([z3.And(k == i, S.inp[i]) for i in range(n)]))]
    if policy == "multi_lru":
        ins = replace(ins, lvl=tuple(z3.If(k == i, lv, S.lvl[i]) for i in range(n)))
        req.append(z3.And(lv >= 0, lv <= 3))
    if policy == "lineage" and S.lk:  # the entry now knows its parent (RADIX has its own parents)
        ins = replace(ins, lk=tuple(z3.Or(S.lk[i], k == i) for i in range(n)))
    if policy == RADIX_ORDER:  # a new leaf hangs under a live node (or the root), unlocked
        req.append(z3.Or([z3.And(k == i, z3.Or(S.par[i] == -1, *[z3.And(S.par[i] == q, S.inp[q]) for q in range(i)]))
                          for i in range(n)]))  # fmt: skip
        ins = replace(ins, lock=tuple(z3.If(k == i, z3.BoolVal(False), S.lock[i]) for i in range(n)))
    out.append(OrderStep("insert", req, ins))
    member = z3.Or([z3.And(k == i, S.inp[i]) for i in range(n)])
    if policy == RADIX_ORDER:
        touched = S if "touch-keeps-stamp" in tw else _stamp(S, k, S.clock)
        if "touch-keeps-stamp" in tw:
            touched = replace(S, clock=S.clock + 1, bef=_stamp(S, k, S.clock).bef)
        out.append(OrderStep("touch", [inr, member], touched))
        # lock a node and every node above it (RADIX-LOCK); unlock one node (the lock bits are
        # what the order reads: a locked leaf is no candidate)
        lk = tuple(z3.Or(S.lock[i], k == i, _anc_of(S, i, k)) for i in range(n))
        out.append(OrderStep("lock", [inr, member], replace(S, lock=lk)))
        unl = tuple(z3.If(k == i, z3.BoolVal(False), S.lock[i]) for i in range(n))
        out.append(OrderStep("unlock", [inr, member], replace(S, lock=unl)))
    else:  # taken out of the pool without eviction (a hit; vllm: a free block reused by a prefix hit)
        rem = replace(S, inp=tuple(z3.And(S.inp[i], k != i) for i in range(n)))
        out.append(OrderStep("remove", [inr, member], _settle(rem) if policy == "lineage" else rem))
    cands = [candidate(S, policy, i, tw) for i in range(n)]
    least = []
    for i in range(n):
        for j in range(n):
            if i != j:
                lt = _key_lt(S, policy, j, i, tw) if "order-reversed" in tw else _key_lt(S, policy, i, j, tw)
                least.append(z3.Implies(z3.And(v == i, cands[j]), lt))
    ev_req = [v >= 0, v < n, z3.Or([z3.And(v == i, cands[i]) for i in range(n)]), *least]
    ev_post = replace(S, inp=tuple(z3.And(S.inp[i], v != i) for i in range(n)))
    if policy == "lineage":
        ev_post = _settle(ev_post)
    out.append(OrderStep("evict", ev_req, ev_post, victim=v))
    return out


def _anc_of(S: OrderState, i: int, k: z3.ArithRef) -> z3.BoolRef:
    """Entry ``i`` is a proper ancestor of the entry ``k`` names."""
    return z3.Or([z3.And(k == d, _anc(S, i, d)) for d in range(S.n) if d != i] or [z3.BoolVal(False)])


def order_goal(S: OrderState, policy: str, v: z3.ArithRef) -> z3.BoolRef:
    """The policy's order row at ``evict``: the victim goes before every other candidate of the
    model's own definition (stated with the unmutated candidates), and is one itself."""
    clean: frozenset[str] = frozenset()
    out = []
    for i in range(S.n):
        others = [z3.Implies(candidate(S, policy, j, clean), older(S, policy, i, j)) for j in range(S.n) if j != i]
        out.append(z3.Implies(v == i, z3.And(candidate(S, policy, i, clean), *others)))
    return z3.And(out)


@dataclass
class OProof:
    row: str
    step: str
    verdict: str
    seconds: float


def _check(premises: list[z3.BoolRef], goal: z3.BoolRef, timeout_ms: int) -> tuple[str, z3.ModelRef | None]:
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*premises, z3.Not(goal))
    a = check(s, timeout_ms=timeout_ms)
    return a.verdict, a.model


def prove(policy: str, tw: frozenset[str] = frozenset(), n: int = N, timeout_ms: int = 60_000) -> list[OProof]:
    """ORDER-STAMPS at every step and the policy's order row at ``evict``."""
    out = []
    for st in steps(S := OrderState.fresh("o_", n), policy, tw):
        hyp = [*wellformed(S, policy), stamps(S), *st.requires]
        goals = {STAMPS: stamps(st.post)}
        if st.victim is not None:
            goals[ROW[policy]] = order_goal(S, policy, st.victim)
        for row, goal in goals.items():
            t0 = time.process_time()
            verdict, _ = _check(hyp, goal, timeout_ms)
            out.append(OProof(row, st.name, verdict, time.process_time() - t0))
    return out


def sanity(policy: str, n: int = N) -> list[str]:
    """Every step enabled under the invariant, and ``evict`` with two candidates or more (the order
    matters): the problems found."""
    S = OrderState.fresh("s_", n)
    problems = []
    for st in steps(S, policy, frozenset()):
        s = z3.Solver()
        s.add(*wellformed(S, policy), stamps(S), *st.requires)
        if st.victim is not None:
            cands = [z3.If(candidate(S, policy, i, frozenset()), 1, 0) for i in range(n)]
            s.add(z3.Sum(cands) >= 2)
        if not check(s).sat:
            problems.append(
                f"{ROW[policy]}: the step {st.name} is never enabled"
                + (" with two candidates" if st.victim is not None else "")
            )
    return problems  # fmt: skip


def refute(policy: str, mutant: str, n: int = N) -> str | None:
    """Where the mutant's counterexample is (``step (row)``), or None."""
    m = MUTANTS[mutant]
    for p in prove(policy, frozenset({mutant}), n):
        if p.verdict == "refuted" and (p.row == STAMPS) == (m.breaks == STAMPS):
            return f"{p.step} ({p.row})"
    return None


def rows(policy: str, row: Callable[[list[str]], str], n: int = N, timeout_ms: int = 60_000) -> list[str]:
    """Print the policy's rows through ``row`` (a table row of ``kvspec prove``); the problems."""
    problems: list[str] = []
    t0 = time.process_time()
    proofs = prove(policy, n=n, timeout_ms=timeout_ms)
    for rid in (STAMPS, ROW[policy]):
        mine = [p for p in proofs if p.row == rid]
        bad = [p.step for p in mine if p.verdict != "proven"]
        verdict = f"proven (N={n})" if not bad else ("unknown" if all(p.verdict != "refuted" for p in mine)
                                                     else "NOT proven")  # fmt: skip
        scope = f"{policy}: {len(mine)} step(s), {n} entries" + (f"; fails at {', '.join(bad)}" if bad else "")
        print(row([rid if rid != STAMPS else f"{STAMPS} ({policy})", verdict, scope,
                   f"{sum(p.seconds for p in mine):.2f}s"]))  # fmt: skip
        problems += [f"{rid} ({policy}) not proven at {s}" for s in bad]
    found = sanity(policy, n)
    print(row([f"SANITY-ORDER ({policy})", "ok" if not found else "FAILED", "every step enabled",
               f"{time.process_time() - t0:.2f}s"]))  # fmt: skip
    problems += found
    for name in mutants_of(policy):
        t1 = time.process_time()
        where = refute(policy, name, n)
        print(row([f"  refutes {name}", "refuted" if where else "NOT REFUTED", where or MUTANTS[name].what,
                   f"{time.process_time() - t1:.2f}s"]))  # fmt: skip
        if where is None:
            problems.append(f"the order mutant {name} ({policy}) was not refuted")
    return problems
