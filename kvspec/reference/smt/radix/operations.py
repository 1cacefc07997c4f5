"""The radix profile's *operations* in z3: each a whole transition built from the steps.

``radix_encoding.STEPS`` are one-page steps; the model (``reference/radix.py``)
runs operations, each a sequence of them. Here every operation of the model
is one transition of the page tree, with the model's own guard (not the
steps' guards), bounded by ``OpBound``:

- ``match``: the walk down the tree along a key of up to ``key`` pages
  (``RadixModel._walk``: at each page the live child with the key's next
  page, until none is left or the key ends), then the split of the node the
  walk ends inside (RADIX-MATCH). Publishes nothing.
- ``insert``: that walk and split, then every page of the key the walk did
  not reach as one new leaf under the page the walk ended at, and **one
  Stored** naming those pages with that page as its parent (RADIX-INSERT);
  the model's capacity guard (the whole key fits in the free slots,
  RADIX-CAPACITY).
- ``lock``: the walk and split, then one lock on every page from the end of
  the match up to the root (RADIX-LOCK); ``unlock`` gives a held lock back.
- ``evict``: a batch of up to ``batch`` whole nodes of up to ``node`` pages
  each, each an unlocked leaf node when its turn comes (after the ones
  before it went: the second victim may be the first one's parent), every
  page of it freed, and **one Removed** naming every page of the batch
  (RADIX-EVICT-LRU, RADIX-LOCKED-KEPT, RADIX-REMOVE).
- ``reset``: the tree empties, one Cleared (RADIX-RESET).

The router's counts after an operation are computed from the events the
operation assembles (a Stored adds one per page it names, a Removed takes
one, a Cleared zeroes them), not from the steps: an operation that
assembles a wrong event breaks INV-RADIX-ROUTER even if its steps are right.
``OpTransition.subs`` lists the steps the operation is made of (with the
condition under which each runs): ``profile_radix_ops`` proves each one
enabled whenever the operation is, which ties the operations to the proven
steps and, through ``radix_agreement.py``, to the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import z3

from kvspec.reference.smt.radix.encoding import (
    ROOT,
    STEPS,
    RadixBound,
    RState,
    children,
    in_slots,
    live_at,
    parent_of,
    sel_b,
    sel_i,
)
from kvspec.spec.rules import RuleId as R


@dataclass(frozen=True)
class OpBound:
    """The universe (page slots, lock handles) and the size of an operation:
    pages of a key, nodes of an eviction batch, pages of an evicted node."""

    pages: int = 5
    handles: int = 2
    key: int = 3
    batch: int = 2
    node: int = 3

    @property
    def radix(self) -> RadixBound:
        return RadixBound(self.pages, self.handles)

    def __str__(self) -> str:
        return (
            f"{self.pages} pages, {self.handles} locks, keys of {self.key} pages,"
            f" evictions of {self.batch} nodes of {self.node} pages"
        )


@dataclass
class Sub:
    """One step of an operation: it runs when ``when`` holds, and then its guard must."""

    step: str
    when: z3.BoolRef
    guard: list[z3.BoolRef]


@dataclass
class OpTransition:
    """One operation: its guard (the model's), the state after it with the
    router's counts taken from its events, its steps, its rules, its events'
    properties (``events``: a named formula each) and the sub-cases the
    sanity check must find satisfiable."""

    name: str
    pre: RState
    post: RState
    requires: list[z3.BoolRef]
    subs: list[Sub]
    rules: tuple[str, ...]
    events: dict[str, z3.BoolRef] = field(default_factory=dict)
    cases: dict[str, z3.BoolRef] = field(default_factory=dict)


# ----------------------------------------------------------------- plumbing
def _map(x: Any, f: Callable[[z3.ExprRef], z3.ExprRef]) -> Any:
    return tuple(_map(y, f) for y in x) if isinstance(x, tuple) else f(x)


def _zip(a: Any, b: Any, f: Callable[[Any, Any], Any]) -> Any:
    if isinstance(a, tuple):
        return tuple(_zip(x, y, f) for x, y in zip(a, b, strict=True))
    return f(a, b)


def ite(c: z3.BoolRef, A: RState, B: RState) -> RState:
    """Field by field: ``A`` when ``c`` holds, else ``B``."""
    return RState(
        **{k.name: _zip(getattr(A, k.name), getattr(B, k.name), lambda x, y: z3.If(c, x, y)) for k in fields(RState)}
    )


def run_step(name: str, S: RState, tw: frozenset[str], **bind: z3.ArithRef) -> tuple[RState, list[z3.BoolRef]]:
    """The step ``name`` from ``S`` with its choices bound to the operation's
    terms: its successor and its guard."""
    step = STEPS[name](S, tw)
    pairs = [(z3.Int(f"in_{k}"), v) for k, v in bind.items()]

    def sub(e: z3.ExprRef) -> z3.ExprRef:
        return z3.substitute(e, *pairs) if pairs else e

    post = RState(**{k.name: _map(getattr(step.post, k.name), sub) for k in fields(RState)})
    return post, [sub(g) for g in step.requires]


def _named(S: RState, slots: list[tuple[z3.BoolRef, z3.ArithRef]]) -> list[z3.ArithRef]:
    """Per page slot: how many of ``slots`` (each when its condition holds) name it."""
    return [z3.Sum([z3.If(z3.And(c, q == s), 1, 0) for c, q in slots] or [z3.IntVal(0)]) for s in range(S.n)]


def _unique(xs: list[tuple[z3.BoolRef, z3.ArithRef]]) -> list[z3.BoolRef]:
    return [z3.Implies(z3.And(a, b), x != y) for i, (a, x) in enumerate(xs) for b, y in xs[i + 1 :]]


# --------------------------------------------------------------------- walk
@dataclass
class Walk:
    """The match of a key of ``length`` pages (``tok``, up to ``OpBound.key``):
    ``got`` pages matched along ``path``, ending at ``end`` (ROOT: nothing),
    and the split of the node it ends inside (``split`` at page ``cut``)."""

    tok: list[z3.ArithRef]
    length: z3.ArithRef
    got: z3.ArithRef
    path: list[z3.ArithRef]
    end: z3.ArithRef
    split: z3.BoolRef
    cut: z3.ArithRef
    requires: list[z3.BoolRef]
    after: RState
    subs: list[Sub]


def walk(S: RState, b: OpBound, tw: frozenset[str], tag: str) -> Walk:
    """RADIX-MATCH: the longest cached prefix of the key, page by page, and the
    split of the node the walk ends inside (its end page has a child that
    continues its node)."""
    K = b.key
    tok = [z3.Int(f"{tag}_tok{i}") for i in range(K)]
    length, got, cut = z3.Int(f"{tag}_len"), z3.Int(f"{tag}_got"), z3.Int(f"{tag}_cut")
    path: list[z3.ArithRef] = [z3.IntVal(ROOT), *[z3.Int(f"{tag}_w{i + 1}") for i in range(K)]]
    req = [length >= 0, length <= K, got >= 0, got <= length]
    for i in range(1, K + 1):
        here = z3.And(in_slots(S, path[i]), live_at(S, path[i]), parent_of(S, path[i]) == path[i - 1])
        req.append(z3.Implies(got >= i, z3.And(here, sel_i(S.tok, path[i], 0) == tok[i - 1])))
    for i in range(K if "op-walk-stops-early" not in tw else 0):  # the walk went as far as it could
        stuck = z3.And([z3.Implies(ch, S.tok[c] != tok[i]) for c, ch in enumerate(children(S, path[i]))])
        req.append(z3.Implies(z3.And(got == i, length > i), stuck))
    end = path[K]
    for i in reversed(range(K)):
        end = z3.If(got == i, path[i], end)
    inside = z3.Or([z3.And(ch, z3.Not(S.head[c])) for c, ch in enumerate(children(S, end))])
    split = z3.And(end != ROOT, inside)
    req.append(z3.Implies(split, z3.And(in_slots(S, cut), live_at(S, cut), parent_of(S, cut) == end)))
    req.append(z3.Implies(split, z3.Not(sel_b(S.head, cut, True))))
    cut_post, cut_guard = run_step("split", S, tw, p=cut)
    after = S if "op-insert-no-split" in tw and tag == "i" else ite(split, cut_post, S)
    return Walk(tok, length, got, path, end, split, cut, req, after, [Sub("split", split, cut_guard)])


def _with_pub(S: RState, pub: list[z3.ArithRef]) -> RState:
    return RState(**{k.name: (tuple(pub) if k.name == "pub" else getattr(S, k.name)) for k in fields(RState)})


# --------------------------------------------------------------- operations
def op_match(S: RState, b: OpBound, tw: frozenset[str]) -> OpTransition:
    w = walk(S, b, tw, "m")
    post = _with_pub(w.after, list(S.pub))
    op = OpTransition("match", S, post, w.requires, w.subs, (R.RADIX_MATCH, R.RADIX_SPLIT_SILENT))
    op.events = {
        "publishes nothing: the steps' router counts are unchanged": z3.And(
            [a == x for a, x in zip(w.after.pub, S.pub, strict=True)]
        )
    }
    op.cases = {
        "nothing cached": w.got == 0,
        "a miss in a tree with pages": z3.And(w.got == 0, w.length > 0, z3.Or(S.live)),
        "a hit of part of the key": z3.And(w.got > 0, w.got < w.length),
        "the key matched in full": z3.And(w.got == w.length, w.length == b.key),
        "the walk stops early": w.got < w.length,
        "ends at a node's last page": z3.And(w.got > 0, z3.Not(w.split)),
        "ends inside a node: a split": w.split,
        "splits a locked node": z3.And(w.split, sel_i(S.lock, w.cut, 0) > 0),
    }
    return op


def op_insert(S: RState, b: OpBound, tw: frozenset[str]) -> OpTransition:
    """RADIX-INSERT: the walk, its split, then the key's uncached pages as one
    leaf under the walk's end page, one Stored of them anchored there."""
    K = b.key
    w = walk(S, b, tw, "i")
    q = [z3.Int(f"i_q{i + 1}") for i in range(K)]
    new = [z3.And(w.got <= i, i < w.length) for i in range(K)]  # key page i+1 is new
    req = [*w.requires, S.free >= w.length]  # the model's guard: the whole key fits
    for i in range(K):
        req.append(z3.Implies(new[i], z3.And(in_slots(S, q[i]), z3.Not(live_at(S, q[i])))))
    req += _unique(list(zip(new, q, strict=True)))
    cur, subs = w.after, list(w.subs)
    for i in range(K):
        first = w.got == i
        head_post, head_guard = run_step("add_head", cur, tw, q=q[i], e=w.end, t=w.tok[i])
        if i == 0:
            nxt = head_post
        else:
            cont_post, cont_guard = run_step("add_cont", cur, tw, q=q[i], e=q[i - 1], t=w.tok[i])
            nxt = ite(first, head_post, cont_post)
            subs.append(Sub("add_cont", z3.And(new[i], z3.Not(first)), cont_guard))
        subs.append(Sub("add_head", z3.And(new[i], first), head_guard))
        cur = ite(new[i], nxt, cur)
    # the one Stored: its pages, its parent
    stored = w.length > w.got
    blocks = list(zip(new, q, strict=True))
    parent: z3.ArithRef = w.end
    if "op-insert-republishes-prefix" in tw:
        blocks.append((z3.And(stored, w.end != ROOT), w.end))
    if "op-stored-parent-none" in tw:
        parent = z3.IntVal(ROOT)
    named = _named(S, blocks)
    post = _with_pub(cur, [x + n for x, n in zip(S.pub, named, strict=True)])
    op = OpTransition("insert", S, post, req, subs, (R.RADIX_MATCH, R.RADIX_INSERT, R.RADIX_CAPACITY))
    chain = []
    for i in range(K):
        above = z3.If(w.got == i, parent, q[i - 1]) if i else parent
        chain.append(z3.Implies(new[i], z3.And(sel_i(post.pp, q[i], ROOT) == above, sel_i(S.pub, q[i], 1) == 0)))
    op.events = {
        "the Stored's parent is the root or a page the router holds": z3.Implies(
            stored, z3.Or(parent == ROOT, z3.And(in_slots(S, parent), sel_i(S.pub, parent, 0) == 1))
        ),
        "it names the new pages in path order under that parent, none held before": z3.And(chain),
        "the steps' router counts are the Stored's": z3.And([a == x for a, x in zip(cur.pub, post.pub, strict=True)]),
    }
    op.cases = {
        "everything new, under the root": z3.And(w.got == 0, w.length == K),
        "everything cached: no Stored": z3.And(w.length > 0, w.got == w.length),
        "a leaf under a node's last page": z3.And(w.got > 0, stored, z3.Not(w.split)),
        "a leaf after a split": z3.And(stored, w.split),
        "a split, nothing new": z3.And(w.split, z3.Not(stored)),
        "beside other children": z3.And(stored, w.got > 0, z3.Not(w.split), z3.Or(children(S, w.end))),
        "under a locked page": z3.And(stored, w.end != ROOT, sel_i(S.lock, w.end, 0) > 0),
        f"a leaf of {K} pages on the last free slots": z3.And(w.got == 0, w.length == K, S.free == K),
    }
    return op


def op_lock(S: RState, b: OpBound, tw: frozenset[str]) -> OpTransition:
    """RADIX-LOCK: the walk, its split, one lock on the path from its end up (handle ``k``)."""
    w = walk(S, b, tw, "l")
    k = z3.Int("l_k")
    post, guard = run_step("lock", w.after, tw, k=k, e=w.end)
    req = [*w.requires, k >= 0, k < len(S.held), z3.Not(sel_b(S.held, k, True))]
    op = OpTransition(
        "lock",
        S,
        _with_pub(post, list(S.pub)),
        req,
        [*w.subs, Sub("lock", z3.BoolVal(True), guard)],
        (R.RADIX_MATCH, R.RADIX_LOCK),
    )
    op.events = {"publishes nothing": z3.And([a == x for a, x in zip(post.pub, S.pub, strict=True)])}
    op.cases = {
        "at the root": w.got == 0,
        "at a node's last page": z3.And(w.got > 0, z3.Not(w.split)),
        "after a split": w.split,
        "after a split of a locked node": z3.And(w.split, sel_i(S.lock, w.cut, 0) > 0),
        "on a locked path": z3.And(w.end != ROOT, sel_i(S.lock, w.end, 0) > 0),
    }
    return op


def op_unlock(S: RState, b: OpBound, tw: frozenset[str]) -> OpTransition:
    """RADIX-LOCK: a held lock given back, one less on its whole path."""
    k = z3.Int("u_k")
    post, guard = run_step("unlock", S, tw, k=k)
    req = [k >= 0, k < len(S.held), sel_b(S.held, k, False)]
    op = OpTransition(
        "unlock", S, _with_pub(post, list(S.pub)), req, [Sub("unlock", z3.BoolVal(True), guard)], (R.RADIX_LOCK,)
    )
    e = sel_i(S.at, k, ROOT)
    op.cases = {
        "at the root": e == ROOT,
        "at a page": e != ROOT,
        "another lock on the path": z3.And(e != ROOT, sel_i(S.lock, e, 0) >= 2),
    }
    return op


def op_evict(S: RState, b: OpBound, tw: frozenset[str]) -> OpTransition:
    """RADIX-EVICT-LRU / RADIX-LOCKED-KEPT / RADIX-REMOVE: up to ``batch`` whole
    unlocked leaf nodes, each a leaf node when its turn comes, and one Removed
    naming every page of them."""
    B, M = b.batch, b.node
    count = z3.Int("x_nodes")
    req = [count >= 1, count <= B]
    cur, subs = S, []
    removed: list[tuple[z3.BoolRef, z3.ArithRef]] = []
    size: list[z3.ArithRef] = []
    v: list[list[z3.ArithRef]] = []
    for i in range(B):
        go = count > i
        m = z3.Int(f"x_len{i}")
        pages = [z3.Int(f"x_v{i}_{r}") for r in range(M)]
        v.append(pages)
        size.append(m)
        node = [z3.Implies(go, z3.And(m >= 1, m <= M))]
        node.append(
            z3.Implies(go, z3.And(in_slots(cur, pages[0]), live_at(cur, pages[0]), sel_b(cur.head, pages[0], False)))
        )
        for r in range(1, M):
            cont = z3.And(in_slots(cur, pages[r]), live_at(cur, pages[r]), parent_of(cur, pages[r]) == pages[r - 1])
            node.append(z3.Implies(z3.And(go, m > r), z3.And(cont, z3.Not(sel_b(cur.head, pages[r], True)))))
        for r in range(M if "op-evict-inner" not in tw else 0):  # its last page is a leaf: the node has no child
            node.append(z3.Implies(z3.And(go, m == r + 1), z3.Not(z3.Or(children(cur, pages[r])))))
        if not (i > 0 and "op-batch-evicts-locked" in tw):
            node.append(z3.Implies(go, sel_i(cur.lock, pages[0], 1) == 0))
        req += node
        for r in reversed(range(M)):  # from its last page up
            when = z3.And(go, m > r)
            nxt, guard = run_step("evict", cur, tw, t=pages[r])
            subs.append(Sub("evict", when, guard))
            cur = ite(when, nxt, cur)
            if r == 0 or "op-removed-names-first-page-only" not in tw:
                removed.append((when, pages[r]))
    named = _named(S, removed)
    post = _with_pub(cur, [x - n for x, n in zip(S.pub, named, strict=True)])
    op = OpTransition("evict", S, post, req, subs, (R.RADIX_EVICT_LRU, R.RADIX_LOCKED_KEPT, R.RADIX_REMOVE))
    op.events = {
        "the Removed names exactly the pages that went, once each": z3.And(
            [n == z3.If(z3.And(S.live[s], z3.Not(cur.live[s])), 1, 0) for s, n in enumerate(named)]
        ),
        "the steps' router counts are the Removed's": z3.And([a == x for a, x in zip(cur.pub, post.pub, strict=True)]),
    }
    one = count == 1
    op.cases = {
        "one node of one page": z3.And(one, size[0] == 1),
        f"one node of {M} pages": z3.And(one, size[0] == M),
        f"{B} nodes": count == B,
        "the second victim is the first one's parent": z3.And(
            count >= 2, z3.Or([z3.And(size[1] == r + 1, parent_of(S, v[0][0]) == v[1][r]) for r in range(M)])
        )
        if B >= 2
        else z3.BoolVal(True),
        "its parent still locked by another path": z3.And(
            parent_of(S, v[0][0]) != ROOT, sel_i(S.lock, parent_of(S, v[0][0]), 0) > 0
        ),
        "from a full cache": S.free == 0,
    }
    return op


def op_reset(S: RState, b: OpBound, tw: frozenset[str]) -> OpTransition:
    """RADIX-RESET: the tree empties, every lock forgotten, one Cleared."""
    post, guard = run_step("reset", S, tw)
    cleared = [z3.IntVal(0)] * S.n
    op = OpTransition(
        "reset", S, _with_pub(post, cleared), [], [Sub("reset", z3.BoolVal(True), guard)], (R.RADIX_RESET,)
    )
    op.events = {"the steps' router counts are the Cleared's": z3.And([a == 0 for a in post.pub])}
    op.cases = {"with pages": z3.Or(S.live), "with a lock held": z3.Or(S.held) if S.held else z3.BoolVal(False)}
    return op


OPERATIONS: dict[str, Callable[[RState, OpBound, frozenset[str]], OpTransition]] = {
    "match": op_match,
    "insert": op_insert,
    "lock": op_lock,
    "unlock": op_unlock,
    "evict": op_evict,
    "reset": op_reset,
}
