"""The lru, multi-LRU, lineage and vllm free-queue order encodings against the Python code, both ways.

``order/encoding.py`` states each policy's eviction order over stamps on a
pool of ``N`` entries (the ORDER-* rows). This binds it to the code the
model runs, the way ``order/radix_equivalence.py`` binds the radix order:
breadth first over every state the Python side reaches from an empty pool,
and in each state, for each operation, the Python side's outcome set must
equal the encoding's, from the same concrete pre-state (stamps = the
Python order's ranks, or the lineage ticks), with the victim left free.

The Python side: the policy objects of ``reference/policies.py`` (entries
``0..N-1``; ``insert`` of an entry not in the pool, multi-LRU at the levels
0 and 1, lineage with the fixed forest ``FOREST``, each entry's key its
depth and its number; ``remove`` of one in the pool; an eviction takes each
block ``allowed()`` gives), and for the vllm free queue the pool model
``reference/vllm_pool.py`` itself at 3 blocks, driven by Uses and Derefs of
one or two blocks of the hashes ``0..N-1`` (one copy per hash): a Deref
that drops a copy's last owner is an ``insert``, a prefix hit on a free
copy a ``remove``, a new block with no free block an ``evict``. What the
order does not decide (a rejected Deref, a refused Use) is the model's: such
operations have no outcome on either side.

An outcome is the pool's order as the eviction reads it (lru, lineage, the
vllm queue: the entries oldest first; multi-LRU: each level's entries oldest
first) and the victim. The walk closes: every state of the bound is
visited.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import z3

from kvspec.reference.policies import LineagePolicy, LruPolicy, MultiLruPolicy, Policy
from kvspec.reference.smt.equivalence import all_values
from kvspec.reference.smt.order.encoding import N, OrderState, steps
from kvspec.reference.vllm_pool import VllmPoolModel
from kvspec.spec.config import ManagerConfig
from kvspec.spec.registry import VLLM_NAME
from kvspec.spec.wire import Deref, FullBlock, Plh, Use

#: lineage: entry i's parent (constant; -1 a root): 0 <- 1 <- 3, 0 <- 2
FOREST: tuple[int, ...] = (-1, 0, 0, 1)
#: multi-LRU: the touch counts an insert is made with (levels 0 and 1)
TOUCHES: tuple[int, ...] = (0, 3)
POLICIES = ("lru", "multi_lru", "lineage", "vllm-free")
VLLM_BLOCKS = 3


def _depth(i: int) -> int:
    return 0 if FOREST[i] < 0 else 1 + _depth(FOREST[i])


def _key(i: int) -> tuple[int, int]:
    return (_depth(i), i)


# ---------------------------------------------------------------- seeded bugs of the Python side
class LruPolicyNewestFirst(LruPolicy):
    """Policy bug (EVICT-POLICY, lru): the most recently inserted block goes first."""

    def victim(self) -> int | None:
        return next(reversed(self._order), None)

    def copy(self) -> LruPolicyNewestFirst:
        c = LruPolicyNewestFirst()
        c._order = self._order.copy()
        return c


class MultiLruHottestFirst(MultiLruPolicy):
    """Policy bug (EVICT-POLICY, multi_lru): the hottest non-empty level goes first."""

    def victim(self) -> int | None:
        for lvl in reversed(self._levels):
            if lvl:
                return next(iter(lvl))
        return None

    def copy(self) -> MultiLruHottestFirst:
        c = MultiLruHottestFirst()
        c._levels = [lvl.copy() for lvl in self._levels]
        c._level_of = dict(self._level_of)
        return c


class LineageNewestLeaf(LineagePolicy):
    """Policy bug (EVICT-POLICY, lineage): among the real leaves, the newest goes first."""

    def victim(self) -> int | None:
        leaves = self.leaves()
        return max(leaves, key=lambda s: self._nodes[self._key_of[s]].tick) if leaves else None

    def copy(self) -> LineageNewestLeaf:
        base = LineagePolicy.copy(self)
        return LineageNewestLeaf(_nodes=base._nodes, _key_of=base._key_of, _heap=base._heap, _tick=base._tick)


class VllmReleaseAtHead(VllmPoolModel):
    """Pool bug (VLLM-FREE-ORDER): a block that loses its last owner goes to the head of the free queue."""

    def _release(self, cid: int) -> None:
        super()._release(cid)
        if cid in self.inactive:
            self.inactive.move_to_end(cid, last=False)


#: policy -> {bug name: class}
POLICY_BUGS: dict[str, dict[str, type]] = {
    "lru": {"lru-newest-first": LruPolicyNewestFirst},
    "multi_lru": {"multi-lru-hottest-first": MultiLruHottestFirst},
    "lineage": {"lineage-newest-leaf": LineageNewestLeaf},
    "vllm-free": {"vllm-release-at-head": VllmReleaseAtHead},
}
_CLEAN: dict[str, type] = {"lru": LruPolicy, "multi_lru": MultiLruPolicy, "lineage": LineagePolicy,
                           "vllm-free": VllmPoolModel}  # fmt: skip


# ---------------------------------------------------------------- the Python side's order
def _order(policy: str, p: Any) -> tuple[Any, ...]:
    """The order an eviction reads, as an outcome compares it."""
    if policy == "lru":
        return tuple(p._order)
    if policy == "multi_lru":
        return tuple(tuple(lvl) for lvl in p._levels[:2])
    if policy == "lineage":
        return tuple(sorted(p._key_of, key=lambda s: p._nodes[p._key_of[s]].tick))
    return tuple(p.copies[c].seq for c in p.inactive)


def _stamps(policy: str, p: Any) -> tuple[dict[int, int], dict[int, int], int]:
    """(entry -> stamp, entry -> level, clock) of the Python state, for the encoding's pre-state."""
    if policy == "lineage":
        st = {s: p._nodes[p._key_of[s]].tick for s in p._key_of}
        return st, {}, p._tick
    if policy == "multi_lru":
        ranked = [s for lvl in p._levels for s in lvl]
        return {s: r for r, s in enumerate(ranked)}, dict(p._level_of), len(ranked)
    order = _order(policy, p)
    return {s: r for r, s in enumerate(order)}, {}, len(order)


@dataclass
class PolicyWalkNode:
    """A Python state: a policy object, or (vllm-free) the pool model."""

    obj: Any


Op = tuple[Any, ...]


@dataclass
class PolicyOrderSubject:
    """One policy's order encoding (``mutant``: an order-encoding mutant) against its Python code
    (``bug``: a seeded bug of it, ``POLICY_BUGS``)."""

    policy: str
    mutant: str | None = None
    bug: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"order-{self.policy}"
        self.cls = POLICY_BUGS[self.policy][self.bug] if self.bug else _CLEAN[self.policy]

    def initial(self) -> list[PolicyWalkNode]:
        if self.policy == "vllm-free":
            return [PolicyWalkNode(self.cls(ManagerConfig(profile=VLLM_NAME, capacity=VLLM_BLOCKS, eviction="lru")))]
        return [PolicyWalkNode(self.cls())]

    def key(self, n: PolicyWalkNode) -> Hashable:
        p = n.obj
        if self.policy == "vllm-free":
            cached = tuple(sorted((c.seq, c.owners) for c in p.copies.values()))
            return _order(self.policy, p), cached, p.free, tuple(sorted(p.held))
        if self.policy == "lineage":
            nodes = tuple(sorted((k, nd.seq, nd.parent, nd.children) for k, nd in p._nodes.items()))
            return _order(self.policy, p), nodes
        if self.policy == "multi_lru":
            return _order(self.policy, p)
        return _order(self.policy, p)

    def alphabet(self, n: PolicyWalkNode) -> Sequence[Any]:
        if self.policy == "vllm-free":
            m: VllmPoolModel = n.obj
            out: list[Any] = []
            for k in (1, 2):
                for hs in itertools.permutations(range(N), k):
                    out.append(Deref(blocks=[FullBlock(full=h) for h in hs]))
                    if any(m.cached(h) for h in hs[m.prefix_hits(list(hs)) :]):
                        continue  # a second copy of a hash: outside the bound (an entry is a hash)
                    if any(c.owners >= 2 for c in m.copies.values() if c.seq in hs):
                        continue  # owners beyond 2: outside the bound (the order reads only 0 or not)
                    plhs = [Plh(hash=h, parent=None, position=i) for i, h in enumerate(hs)]
                    out.append(Use(blocks=[FullBlock(full=h) for h in hs], plhs=plhs,
                                   local_hashes=[100 + h for h in hs]))  # fmt: skip
            return out
        p = n.obj
        ops: list[Op] = []
        for i in range(N):
            if i in p:
                ops.append(("remove", i))
            elif self.policy == "multi_lru":
                ops += [("insert", i, t) for t in TOUCHES]
            else:
                ops.append(("insert", i, 0))
        ops.append(("evict",))
        return ops

    # ------------------------------------------------------------------ Python side
    def model_outcomes(self, n: PolicyWalkNode, op: Any) -> list[tuple[Hashable, PolicyWalkNode]]:
        if self.policy == "vllm-free":
            m = copy.deepcopy(n.obj)
            before = {c: m.copies[c].seq for c in m.copies}
            try:
                m.apply(op)
            except Exception:  # a rejected operation: the model's, not the order's
                return []
            gone = tuple(sorted(s for c, s in before.items() if c not in m.copies and s is not None))
            return [((_order(self.policy, m), gone), PolicyWalkNode(m))]
        p: Policy = n.obj
        if op[0] == "insert":
            c = p.copy()
            key = _key(op[1])
            parent = _key(FOREST[op[1]]) if self.policy == "lineage" and FOREST[op[1]] >= 0 else None
            c.insert(op[1], key, parent, op[2])
            return [((_order(self.policy, c), None), PolicyWalkNode(c))]
        if op[0] == "remove":
            c = p.copy()
            c.remove(op[1])
            return [((_order(self.policy, c), None), PolicyWalkNode(c))]
        out: list[tuple[Hashable, PolicyWalkNode]] = []
        for v in p.allowed():
            c = p.copy()
            c.evict(v)
            out.append(((_order(self.policy, c), v), PolicyWalkNode(c)))
        return out

    # ------------------------------------------------------------------ encoding
    def _pre(self, obj: Any) -> OrderState:
        st, lvl, clock = _stamps(self.policy, obj)
        if self.policy == "vllm-free":
            st = {s: r for r, s in enumerate(_order(self.policy, obj))}
        pol = "lru" if self.policy == "vllm-free" else self.policy
        r = range(N)
        return OrderState(
            inp=tuple(z3.BoolVal(i in st) for i in r),
            st=tuple(z3.IntVal(st.get(i, 0)) for i in r),
            lvl=tuple(z3.IntVal(MultiLruPolicy.level(0) if i not in lvl else lvl[i]) for i in r),
            par=tuple(z3.IntVal(FOREST[i] if pol == "lineage" else -1) for i in r),
            lock=(z3.BoolVal(False),) * N,
            bef=tuple(tuple(z3.BoolVal(i in st and j in st and st[i] < st[j]) for j in r) for i in r),
            clock=z3.IntVal(clock),
            lk=self._links(obj) if pol == "lineage" else (),
        )

    @staticmethod
    def _links(p: LineagePolicy) -> tuple[z3.BoolRef, ...]:
        """Which entries' nodes know their parent (a ghost made for a missing parent does not)."""
        known = {key[1] for key, nd in p._nodes.items() if nd.parent is not None}
        return tuple(z3.BoolVal(i in known) for i in range(N))

    def _plan(self, n: PolicyWalkNode, op: Any) -> list[tuple[str, dict[str, int]]] | None:
        """The order steps the operation is made of (None: the model rejects it)."""
        if self.policy != "vllm-free":
            if op[0] == "insert":
                given = {"k": op[1]}
                if self.policy == "multi_lru":
                    given["lv"] = MultiLruPolicy.level(op[2])
                return [("insert", given)]
            if op[0] == "remove":
                return [("remove", {"k": op[1]})]
            return [("evict", {})]
        m: VllmPoolModel = n.obj
        probe = copy.deepcopy(m)
        try:
            res = probe.apply(op)
        except Exception:
            return None
        hs = [b.full for b in op.blocks]
        by = {c.seq: c for c in m.copies.values()}
        plan: list[tuple[str, dict[str, int]]] = []
        if isinstance(op, Deref):
            owners = {h: by[h].owners for h in hs}
            for h in hs:
                owners[h] -= 1
                if owners[h] == 0:
                    plan.append(("insert", {"k": h}))
            return plan
        if res.result.status == "capacity":
            return []
        hits = m.prefix_hits(hs)
        for h in hs[:hits]:
            if by[h].cid in m.inactive:
                plan.append(("remove", {"k": h}))
        free = m.free
        for _ in hs[hits:]:
            if free:
                free -= 1
            else:
                plan.append(("evict", {}))
        return plan

    def encoding_outcomes(self, n: PolicyWalkNode, op: Any) -> set[Hashable]:
        plan = self._plan(n, op)
        if plan is None:
            return set()
        pol = "lru" if self.policy == "vllm-free" else self.policy
        tw = frozenset({self.mutant}) if self.mutant else frozenset()
        S = self._pre(n.obj)
        req: list[z3.BoolRef] = []
        victims: list[z3.ArithRef] = []
        for t, (name, given) in enumerate(plan):
            tag = f"p{t}_"
            [stp] = [s for s in steps(S, pol, tw, tag) if s.name == name]
            req += stp.requires
            req += [z3.Int(f"{tag}{k}") == v for k, v in given.items()]
            if stp.victim is not None:
                victims.append(stp.victim)
            S = stp.post
        terms: list[z3.ExprRef] = [*S.inp, *S.st, *S.lvl, *victims]
        out: set[Hashable] = set()
        for vals in all_values(req, terms):
            inp, st, lvl, vs = vals[:N], vals[N : 2 * N], vals[2 * N : 3 * N], vals[3 * N :]
            members = sorted((i for i in range(N) if inp[i]), key=lambda i: st[i])
            order: tuple[Any, ...]
            if self.policy == "multi_lru":
                order = tuple(tuple(i for i in members if lvl[i] == level) for level in (0, 1))
            else:
                order = tuple(members)
            if self.policy == "vllm-free":
                out.add((order, tuple(sorted(vs))))
            else:
                out.add((order, vs[0] if vs else None))
        return out
