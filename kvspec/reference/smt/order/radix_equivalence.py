"""The radix model's recency order against the order encoding, both ways (``EQUIV-RADIX-ORDER``).

``order/encoding.py`` states radix LRU with touches over stamps; this binds
it to ``reference/radix.py`` the way ``smt/equivalence.py`` binds the other
profiles: breadth first over every state the model reaches within the depth
(page size 1, capacity 3, the alphabet below), and in each state, for each
operation, the model's outcome set must equal the encoding's.

An outcome is the tree's node set (each node named by its full path of
tokens from the root, which a split does not change for the lower half),
the locked nodes, and the recency relation the eviction order reads: for
every two nodes neither above the other, which was accessed earlier (two
nodes on one path may tie in the model, one walk touching both, and are
never compared by an eviction). The encoding side: the pre-state as an
order state (stamps = the model's access times, parents, lock bits), then
the order steps an operation is made of with z3: a ``touch`` of every node
the walk passes (in walk order), an ``insert`` of a split's upper half and
of a new leaf (which nodes are new comes from the tree; the tree itself is
bound to the model by ``radix/agreement.py``), ``lock`` of the matched node;
an eviction of one page is one ``evict`` with its victim free, so every
victim the encoding allows is an outcome.

The escape of issue 24, a new leaf with ``last_access = 0``, is the model
bug ``radix-leaf-time-zero`` (``--model-bug``): it agreed with the sampled
radix agreement over 300 operations; here it differs after two.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import z3

from kvspec.reference.radix import RadixModel, RadixTreeNode
from kvspec.reference.smt.equivalence import all_values
from kvspec.reference.smt.order.encoding import RADIX_ORDER, OrderState, candidate, steps
from kvspec.spec.radix_wire import RadixConfig, RadixEvict, RadixInsert, RadixLock, RadixMatch, RadixUnlock

KEYS: tuple[tuple[int, ...], ...] = ((1,), (1, 2), (1, 3), (2,))
Path = tuple[int, ...]


class LeafTimeZero(RadixModel):
    """Model bug: a new leaf is created with ``last_access = 0`` (the escape of issue 24)."""

    def _insert(self, key: list[int], events: list[Any]) -> tuple[int, RadixTreeNode]:
        before = set(map(id, self.nodes()))
        pos, node = super()._insert(key, events)
        if id(node) not in before:
            node.last_access = 0
        return pos, node


MODEL_BUGS: dict[str, type[RadixModel]] = {"radix-leaf-time-zero": LeafTimeZero}


def _set(xs: tuple[z3.ArithRef, ...], i: int, v: z3.ArithRef) -> tuple[z3.ArithRef, ...]:
    return (*xs[:i], v, *xs[i + 1 :])


def _full(m: RadixModel, n: RadixTreeNode) -> Path:
    toks: list[int] = []
    while n.parent is not None:
        toks = n.tokens + toks
        n = n.parent
    return tuple(toks)


def _nodes(m: RadixModel) -> dict[Path, RadixTreeNode]:
    return {_full(m, n): n for n in m.nodes()}


def _above(a: Path, b: Path) -> bool:
    return len(a) < len(b) and b[: len(a)] == a


def abstract(paths: dict[Path, int], locked: frozenset[Path], held: tuple[str, ...]) -> Hashable:
    """Node set, locks and the recency relation between nodes neither above the other."""
    rel = frozenset(
        (a, b)
        for a, b in itertools.permutations(paths, 2)
        if not _above(a, b) and not _above(b, a) and paths[a] < paths[b]
    )
    return (frozenset(paths), locked, held, rel)


@dataclass
class RadixOrderSubject:
    """The radix model (or a model bug) and the radix order encoding."""

    model_class: type[RadixModel] = RadixModel
    name: str = "radix-order"
    capacity: int = 3
    #: an order-encoding mutant in force (``order/encoding.MUTANTS``)
    mutant: str | None = None

    def initial(self) -> list[RadixModel]:
        return [self.model_class(RadixConfig(page_size=1, capacity=self.capacity))]

    def key(self, m: RadixModel) -> Hashable:
        ns = _nodes(m)
        return abstract({p: n.last_access for p, n in ns.items()}, frozenset(p for p, n in ns.items() if n.lock_ref),
                        tuple(sorted(m.locks)))  # fmt: skip

    def alphabet(self, m: RadixModel) -> Sequence[Any]:
        ops: list[Any] = [RadixInsert(tokens=list(k)) for k in KEYS] + [RadixMatch(tokens=list(k)) for k in KEYS]
        ops.append(RadixEvict(tokens=1))
        ops += [RadixLock(name="a", tokens=list(k)) for k in KEYS] + [RadixUnlock(name="a")]
        return ops

    def model_outcomes(self, m: RadixModel, op: Any) -> list[tuple[Hashable, RadixModel]]:
        c = copy.deepcopy(m)
        out = c.step(op)
        if out.error is not None:
            return []
        return [(self.key(c), c)]

    # --------------------------------------------------------------- encoding
    def encoding_outcomes(self, m: RadixModel, op: Any) -> set[Hashable]:
        ns = _nodes(m)
        if isinstance(op, (RadixInsert, RadixLock)) and not self._allowed(m, op):
            return set()
        if isinstance(op, RadixUnlock) and op.name not in m.locks:
            return set()
        paths = sorted(ns, key=lambda p: (len(p), p))
        idx = {p: i for i, p in enumerate(paths)}
        n = len(paths) + 2  # room for a split's upper half and a new leaf
        S = OrderState(
            inp=tuple(z3.BoolVal(i < len(paths)) for i in range(n)),
            st=tuple(z3.IntVal(ns[p].last_access) for p in paths) + (z3.IntVal(0),) * 2,
            lvl=(z3.IntVal(0),) * n,
            par=tuple(
                z3.IntVal(idx.get(_full(m, ns[p].parent), -1) if ns[p].parent else -1)  # type: ignore[arg-type]
                for p in paths
            )
            + (z3.IntVal(-1),) * 2,
            lock=tuple(z3.BoolVal(ns[p].lock_ref > 0) for p in paths) + (z3.BoolVal(False),) * 2,
            bef=tuple(
                tuple(
                    z3.BoolVal(
                        i < len(paths) and j < len(paths) and ns[paths[i]].last_access < ns[paths[j]].last_access
                    )
                    for j in range(n)
                )
                for i in range(n)
            ),
            clock=z3.IntVal(m.clock + 1),
        )
        names = list(paths)
        held = tuple(sorted(m.locks))
        locked = {p for p in paths if ns[p].lock_ref}
        req: list[z3.BoolRef] = []
        victim: z3.ArithRef | None = None

        def run(name: str, k: int | None, St: OrderState, tag: str) -> OrderState:
            nonlocal victim
            tw = frozenset({self.mutant}) if self.mutant else frozenset()
            [stp] = [s for s in steps(St, RADIX_ORDER, tw, tag) if s.name == name]
            if k is not None:
                req.append(z3.Int(f"{tag}k") == k)
            req.extend(stp.requires)
            if stp.victim is not None:
                victim = stp.victim
            return stp.post

        if isinstance(op, RadixEvict):
            none = z3.Not(z3.Or([candidate(S, RADIX_ORDER, i, frozenset()) for i in range(n)]))
            if z3.is_true(z3.simplify(none)):  # no unlocked leaf: the eviction frees nothing
                return {self.key(m)}
            S = run("evict", None, S, "e_")
        elif isinstance(op, RadixUnlock):
            node = _full(m, m.locks[op.name])
            held = tuple(h for h in held if h != op.name)
            locked = {p for p in paths if ns[p].lock_ref - (1 if p == node or _above(p, node) else 0) > 0}
        else:
            key = tuple(op.tokens)

            def pp(p: Path) -> Path:
                return p[: len(p) - len(ns[p].tokens)]

            # the walk (RADIX-MATCH): every child whose parent path is a prefix of the key and
            # whose first token is the key's next one, touched in walk order
            walk = [p for p in paths if key[: len(pp(p))] == pp(p) and len(key) > len(pp(p))
                    and p[len(pp(p))] == key[len(pp(p))]]  # fmt: skip
            for i, p in enumerate(walk):
                S = run("touch", idx[p], S, f"t{i}_")
            end: Path = max([p for p in walk if key[: len(p)] == p], key=len, default=())
            cut = [p for p in walk if key[: len(p)] != p]
            if cut:  # the walk ends inside a node: its upper half is a new node
                lo = cut[0]
                upper = next(lo[:j] for j in range(len(lo), -1, -1) if key[:j] == lo[:j])
                names.append(upper)
                S = replace(S, par=_set(S.par, len(names) - 1, S.par[idx[lo]]))
                S = run("insert", len(names) - 1, S, "u_")
                end = upper
                if lo in locked:  # the upper half keeps the lower's locks (RADIX-MATCH)
                    locked.add(upper)
            if isinstance(op, RadixInsert) and end != key:  # a new leaf under the walk's end
                names.append(key)
                parent = names.index(end) if end else -1
                S = replace(S, par=_set(S.par, len(names) - 1, z3.IntVal(parent)))
                S = run("insert", len(names) - 1, S, "l_")
            if isinstance(op, RadixLock):
                held = tuple(sorted({*held, op.name}))
                locked |= {p for p in names if p == end or _above(p, end)} if end else set()
        terms: list[z3.ExprRef] = [S.inp[i] for i in range(len(names))] + [S.st[i] for i in range(len(names))]
        out: set[Hashable] = set()
        for vals in all_values(req, terms):
            live = {names[i]: vals[len(names) + i] for i in range(len(names)) if vals[i]}
            out.add(abstract(live, frozenset(p for p in locked if p in live), held))
        return out

    def _allowed(self, m: RadixModel, op: Any) -> bool:
        """The model's own refusals (capacity, a lock name held): not the order's business."""
        c = copy.deepcopy(m)
        return c.step(op).error is None
