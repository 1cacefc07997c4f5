"""vllm: the operation encoding (``vllm/ops.py``) and ``VllmPoolModel`` have the same successors.

Every state the model reaches from an empty pool of ``capacity`` blocks
within the explored depth, over an alphabet of every Use (0-2 full blocks of
``hashes`` hashes, in any order, then at most one partial block; parent none
or a hash the request owns, as ASSUME-PARENT-REGISTERED asks), every Deref
of one or two blocks (known or not), every Promote and Reset. In each state
and for each operation the two outcome sets must be equal
(``smt/equivalence.py``).

What the encoding leaves open, the model is asked every way: which copy of a
hash a prefix hit pins and a Deref by hash releases (the model takes the
oldest), and which unowned copy an allocation evicts (the model takes the
least recently freed). So the model is run on every order of its copy lists
and of its free queue; the recency order itself is not part of the encoding
and not compared. An outcome is the result, the pool as a multiset of
blocks (held without a hash, or a cached hash with its owner count), the
router's counts built from the published events, the Removed and Stored
hashes as multisets and the Stored's parent.

The encoding side: the model's pre-state as an encoding state (one block
constant per physical block, ``vllm/agreement.py``), then the operation's
steps with every choice free among those blocks; for a Use, the steps for
every number of prefix hits (the encoding's ``use(check)`` admits only the
longest), and the check's ``refusal`` (USE-CAPACITY: nothing changes).
z3 enumerates every post-state and event set (``equivalence.all_values``).
"""

from __future__ import annotations

import copy
import itertools
from collections import Counter, OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from kvspec.reference.smt.equivalence import all_values, short
from kvspec.reference.smt.unbounded.models import _expand
from kvspec.reference.smt.vllm import ops
from kvspec.reference.smt.vllm.agreement import Mirror, _state, snapshot
from kvspec.reference.smt.vllm.copies import Block
from kvspec.reference.vllm_pool import VllmPoolModel
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.registry import VLLM_NAME
from kvspec.spec.wire import Deref, FullBlock, Operation, PartialBlock, Plh, Promote, Removed, Reset, Stored, Use

#: what a Cleared stands for in an outcome's Removed
CLEARED = -99


@dataclass
class VNode:
    """A model state and the router's counts built from the model's events so far."""

    model: VllmPoolModel
    router: Counter[int] = field(default_factory=Counter)


def _inp(h: int = 0, b: z3.ExprRef | None = None, p: int = ops.NONE, pb: z3.ExprRef | None = None, F: int = 0) -> dict:
    return {"h": z3.IntVal(h), "b": b, "p": z3.IntVal(p), "pb": pb, "F": z3.IntVal(F)}


@dataclass
class VllmSubject:
    """The vllm model and operation encoding at one bound (``tw``: encoding mutants in force)."""

    capacity: int = 2
    hashes: int = 2
    uuids: int = 1
    tw: frozenset[str] = frozenset()
    name: str = VLLM_NAME

    def initial(self) -> list[VNode]:
        cfg = ManagerConfig(profile=VLLM_NAME, capacity=self.capacity, block_size=4, eviction="lru")
        return [VNode(VllmPoolModel(cfg))]

    def key(self, n: VNode) -> Hashable:
        """Copies up to their ids and the free queue's order (both asked every way)."""
        p = n.model
        uu = {cid: u for u, cid in p.held.items()}
        blocks = sorted((-1 if c.seq is None else c.seq, c.owners, uu.get(c.cid, "")) for c in p.copies.values())
        return tuple(blocks), _counts(n.router)

    def alphabet(self, n: VNode) -> Sequence[Operation]:
        p = n.model
        hs, us = range(self.hashes), [f"u{i}" for i in range(self.uuids)]
        owned = sorted(h for h, ids in p.by_hash.items() if any(p.copies[c].owners for c in ids))
        out: list[Operation] = []
        for k in range(3):
            for fulls in itertools.permutations(hs, k):
                for part in [None, *us]:
                    if not fulls and part is None:
                        continue
                    refs: list[FullBlock | PartialBlock] = [FullBlock(full=h) for h in fulls]
                    refs += [PartialBlock(partial=part)] if part is not None else []
                    plhs = [Plh(hash=h, parent=None, position=i) for i, h in enumerate(fulls)]
                    for par in [None, *owned]:
                        parent = None if par is None else FullBlock(full=par)
                        out.append(Use(blocks=refs, plhs=plhs, local_hashes=[100 + h for h in fulls], parent=parent))
        one: list[FullBlock | PartialBlock] = [FullBlock(full=h) for h in hs]
        one += [PartialBlock(partial=u) for u in us]
        for k in (1, 2):
            out += [Deref(blocks=list(sub)) for sub in itertools.combinations(one, k)]
        for u in us:
            for h in hs:
                for par in [None, *owned]:
                    plh = Plh(hash=h, position=0)
                    out.append(Promote(uuid=u, seq_hash=h, parent_hash=par, local_hash=7, plh=plh))
        out.append(Reset())
        return out

    # ------------------------------------------------------------------ model
    def model_outcomes(self, n: VNode, op: Operation) -> list[tuple[Hashable, VNode]]:
        """Every outcome of ``op``, over every order of the copy lists and the free queue."""
        p = n.model
        out: dict[Hashable, VNode] = {}
        multi = [h for h, ids in p.by_hash.items() if len(ids) > 1]
        for order in itertools.permutations(p.inactive):
            for perms in itertools.product(*[list(itertools.permutations(p.by_hash[h])) for h in multi]):
                m = copy.deepcopy(p)
                m.inactive = OrderedDict((c, None) for c in order)
                for h, perm in zip(multi, perms, strict=True):
                    m.by_hash[h] = list(perm)
                try:
                    step = m.apply(op)
                except InvalidOperation:
                    continue
                router = Counter(n.router)
                rem: list[int] = []
                sto: list[int] = []
                par: int | None = None
                for ev in step.events:
                    d = ev.data
                    if isinstance(d, Stored):
                        router.update(b.block_hash for b in d.stored.blocks)
                        sto += [b.block_hash for b in d.stored.blocks]
                        par = d.stored.parent_hash
                    elif isinstance(d, Removed):
                        router.subtract(d.removed.block_hashes)
                        rem += d.removed.block_hashes
                    else:
                        router.clear()
                        rem.append(CLEARED)
                value = step.result.value if isinstance(step.result.value, int | bool) else None
                o = ((value, step.result.status), _pool(m), _counts(router), tuple(sorted(rem)), tuple(sorted(sto)))
                out.setdefault((*o, par if sto else None), VNode(m, router))
        return list(out.items())

    # --------------------------------------------------------------- progress
    def progress(
        self, n: VNode, seen: list[tuple[Operation, list[tuple[Hashable, VNode]]]]
    ) -> list[tuple[str, str | None]]:
        """PROGRESS-USE-FITS: a Use whose fresh blocks fit in the free blocks and the unowned
        copies it need not pin (a hit pins an unowned copy only when its hash has no owned one)
        has an accepted outcome (some allowed copy choice succeeds; the model's own, the oldest
        copy, may pin an unowned one and refuse: INVARIANTS.md). PROGRESS-NO-DEADLOCK: while a
        request holds something, some operation of the alphabet releases it (a Deref is accepted)."""
        p = n.model
        out: list[tuple[str, str | None]] = []
        for op, outs in seen:
            parts = [b.partial for b in op.blocks if isinstance(b, PartialBlock)] if isinstance(op, Use) else []
            if not isinstance(op, Use) or any(u in p.held for u in parts):
                continue
            fulls = [b.full for b in op.blocks if isinstance(b, FullBlock)]
            hits = p.prefix_hits(fulls)
            fresh = len(fulls) - hits + len(parts)
            forced = sum(1 for h in set(fulls[:hits]) if not any(p.copies[c].owners for c in p.by_hash[h]))
            if fresh <= p.free + len(p.inactive) - forced:
                ok = any(o[0][1] == "ok" for o, _ in outs)  # type: ignore[index]
                out.append(("PROGRESS-USE-FITS", None if ok else f"{short(op)} fits and is refused"))
        if p.held or any(c.owners for c in p.copies.values()):
            released = any(isinstance(op, Deref) and outs for op, outs in seen)
            out.append(("PROGRESS-NO-DEADLOCK", None if released else "something is held and no Deref is accepted"))
        return out

    # --------------------------------------------------------------- encoding
    def encoding_outcomes(self, n: VNode, op: Operation) -> set[Hashable]:
        p = n.model
        slot = {cid: i for i, cid in enumerate(sorted(p.copies))}
        mirror = Mirror(p, slot, Counter(n.router))
        bs = [z3.Const(f"eq_blk{i}", Block) for i in range(self.capacity)]
        S = _state(mirror, snapshot(mirror), bs)
        base = [z3.Distinct(*bs)] if len(bs) > 1 else []
        unchanged = (_pool(p), _counts(n.router), (), (), None)
        fresh = itertools.count()

        def choice(reqs: list[z3.BoolRef]) -> z3.ExprRef:
            b = z3.Const(f"eq_ch{next(fresh)}", Block)
            reqs.append(z3.Or([b == x for x in bs]))
            return b

        def run(T: ops.VllmOpState, name: str, inp: dict, reqs: list[z3.BoolRef]) -> ops.VllmOpStep:
            st = ops.TRANSITIONS[name](T, inp, self.tw)
            reqs += st.requires
            return st

        out: set[Hashable] = set()
        if isinstance(op, Use):
            fulls = [b.full for b in op.blocks if isinstance(b, FullBlock)]
            parts = [b.partial for b in op.blocks if isinstance(b, PartialBlock)]
            if any(u in p.held for u in parts):
                return out  # USE-PARTIAL: a uuid already held (the encoding names blocks, not uuids)
            par = op.parent.full if isinstance(op.parent, FullBlock) else ops.NONE
            for j in range(len(fulls) + 1):  # j prefix hits
                reqs = list(base)
                F = len(fulls) - j + len(parts)
                T = run(S, "use(begin)", _inp(p=par, pb=choice(reqs), F=F), reqs).post
                for h in fulls[:j]:
                    T = run(T, "use(hit)", _inp(h=h, b=choice(reqs)), reqs).post
                chk = ops.TRANSITIONS["use(check)"](T, _inp(h=fulls[j] if j < len(fulls) else ops.NONE), self.tw)
                if chk.refusal is not None and all_values([*reqs, chk.refusal], []):
                    out.add(((0, "capacity"), *unchanged))
                reqs += chk.requires
                T = chk.post
                for name, h in [("use(new)", h) for h in fulls[j:]] + [("use(partial)", 0) for _ in parts]:
                    T = run(T, name, _inp(h=h, b=choice(reqs)), reqs).post
                cl = run(T, "use(close)", _inp(), reqs)
                out |= self._outcomes(reqs, bs, cl.post, (j, "ok"), T.prem, T.psto, cl.stored)
        elif isinstance(op, Promote):
            cid = p.held.get(op.uuid)
            if cid is None:
                return out  # PROMOTE-UNKNOWN
            reqs = list(base)
            par = ops.NONE if op.parent_hash is None else op.parent_hash
            st = run(S, "promote", _inp(h=op.seq_hash, b=bs[slot[cid]], p=par, pb=choice(reqs)), reqs)
            zero = z3.K(z3.IntSort(), z3.IntVal(0))
            sto = z3.Lambda([x := z3.Int("xp")], st.post.view[x] - S.view[x])
            out |= self._outcomes(reqs, bs, st.post, (None, "ok"), zero, sto, st.stored)
        elif isinstance(op, Deref):
            reqs = list(base)
            T = S
            for ref in op.blocks:
                if isinstance(ref, FullBlock):
                    b = choice(reqs)
                    reqs.append(T.hsh[b] == ref.full)
                    T = run(T, "deref(full)", _inp(b=b), reqs).post
                else:
                    cid = p.held.get(ref.partial)
                    if cid is None or op.blocks.count(ref) > 1:
                        return out  # DEREF-UNKNOWN: a uuid not held (or named twice)
                    name = "deref(partial)" if p.copies[cid].seq is None else "deref(promoted)"
                    T = run(T, name, _inp(b=bs[slot[cid]]), reqs).post
            zero = z3.K(z3.IntSort(), z3.IntVal(0))
            out |= self._outcomes(reqs, bs, T, (None, "ok"), zero, zero, None)
        elif isinstance(op, Reset):
            st = ops.TRANSITIONS["reset"](S, _inp(), self.tw)
            zero = z3.K(z3.IntSort(), z3.IntVal(0))
            out |= {
                (r, pool, view, (CLEARED,), sto, par)
                for r, pool, view, _rem, sto, par in self._outcomes(
                    [*base, *_finite(st.requires, bs)], bs, st.post, (True, "ok"), zero, zero, None
                )
            }
            if st.refusal is not None and all_values([*base, *_finite([st.refusal], bs)], []):
                out.add(((False, "ok"), *unchanged))
        return out

    def _outcomes(
        self,
        reqs: list[z3.BoolRef],
        bs: list[z3.ExprRef],
        post: ops.VllmOpState,
        result: tuple[object, str],
        prem: z3.ArrayRef,
        psto: z3.ArrayRef,
        stored: tuple[z3.BoolRef, z3.ArithRef] | None,
    ) -> set[tuple[Any, ...]]:
        """Every (result, pool, router, Removed, Stored, parent) the constraints allow."""
        hs = range(self.hashes)
        terms: list[z3.ExprRef] = []
        for b in bs:
            terms += [post.st[b], post.hsh[b], post.own[b]]
        terms += [post.view[h] for h in hs] + [prem[h] for h in hs] + [psto[h] for h in hs]
        terms += [stored[0], stored[1]] if stored is not None else []
        out: set[tuple[Any, ...]] = set()
        k, H = 3 * len(bs), self.hashes
        for vals in all_values(reqs, terms):
            pool = []
            for i in range(len(bs)):
                st, h, own = vals[3 * i : 3 * i + 3]
                if st == "vheld":
                    pool.append(("held", -1, 0))
                elif st == "vcached":
                    pool.append(("cached", h, own))
            view = tuple((h, v) for h, v in zip(hs, vals[k : k + H], strict=True) if v)
            rem = tuple(h for h in hs for _ in range(vals[k + H + h]))
            sto = tuple(h for h in hs for _ in range(vals[k + 2 * H + h]))
            par = None
            if stored is not None and vals[-2] is True and sto:
                par = None if vals[-1] == ops.NONE else vals[-1]
            out.add((result, tuple(sorted(pool)), view, rem, sto, par))
        return out


def _pool(p: VllmPoolModel) -> tuple:
    return tuple(sorted(("held", -1, 0) if c.seq is None else ("cached", c.seq, c.owners) for c in p.copies.values()))


def _counts(router: Counter[int]) -> tuple:
    return tuple(sorted((h, k) for h, k in router.items() if k))


def _finite(fs: list[z3.BoolRef], bs: list[z3.ExprRef]) -> list[z3.BoolRef]:
    """``fs`` with every quantifier over blocks expanded to the pool's blocks."""
    ints = [z3.IntVal(i) for i in range(-2, 4)]
    return [_expand(f, bs, ints, {}) for f in fs]
