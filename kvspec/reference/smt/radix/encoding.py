"""The ``radix`` profile in z3: the page tree, its steps and its INV-RADIX-* invariants.

The encoding works at the level of pages, the unit the radix cache stores
and publishes (``reference/radix.py``, SPEC.md "Radix prefix cache"). A
bounded universe of ``pages`` page slots and ``handles`` lock handles:

- a page slot is ``live`` or not; a live page has a parent page ``pp`` (a
  slot, or ``ROOT`` = -1 for a page hanging under the root), its tokens
  ``tok`` (one integer standing for the page's token ids, as its local hash
  does), ``head`` (it starts a tree node: the page after a node boundary),
  a lock count ``lock``, and the router's count ``pub`` of Stored minus
  Removed events naming it (a Cleared sets every count to 0). A page's
  identity is (parent, tokens): its sequence hash is a function of exactly
  those (HASH-SEQUENCE), so two live pages with one identity are one hash
  stored twice;
- a node is a maximal run of pages from a ``head`` page down through pages
  that are not heads; the tree of nodes is the page tree cut at heads, so a
  split (RADIX-MATCH) only sets one ``head`` bit;
- a lock handle is ``held`` or not and names the page its lock ends at
  (``at``: the last page of a node, or ``ROOT`` for a match of nothing);
- ``free`` counts free slots in pages (between operations the model's free
  tokens are ``capacity - page_size * pages``), ``cap`` the capacity, any.

Steps (``STEPS``; the model's operations are sequences of them, see
``radix_agreement.py``): ``split`` a node at a page; ``add_head`` hangs a
new leaf's first page under the last page of a node (or the root);
``add_cont`` extends the leaf being built by one page; ``lock`` and
``unlock`` a handle; ``evict`` one unlocked leaf page (a node is evicted
page by page from its last page up); ``reset``. Each step names its rules
and its sub-cases (``RadixTransition.cases``) so the sanity checks can show each one
satisfiable.

Eviction is by *any* unlocked leaf, not by last access: the invariants hold
under every victim choice, so under the LRU order the model uses
(RADIX-EVICT-LRU itself is checked by the goldens and the lockstep, not
here). Access times are not encoded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import z3

from kvspec.spec.rules import RuleId as R
from kvspec.spec.rules import rid

ROOT = -1


@dataclass(frozen=True)
class RadixBound:
    """The universe: page slots and lock handles."""

    pages: int = 5
    handles: int = 2

    def __str__(self) -> str:
        return f"{self.pages} pages, {self.handles} locks"


@dataclass(frozen=True)
class RState:
    """One state of the page tree (every field a z3 term, one per slot)."""

    live: tuple[z3.BoolRef, ...]
    pp: tuple[z3.ArithRef, ...]
    tok: tuple[z3.ArithRef, ...]
    head: tuple[z3.BoolRef, ...]
    lock: tuple[z3.ArithRef, ...]
    pub: tuple[z3.ArithRef, ...]
    held: tuple[z3.BoolRef, ...]
    at: tuple[z3.ArithRef, ...]
    free: z3.ArithRef
    cap: z3.ArithRef
    #: ghost: the depth of a live page (0 under the root), the well-founded
    #: measure that makes the tree acyclic
    dep: tuple[z3.ArithRef, ...]
    #: ghost: ``anc[p][q]``: page ``q`` is ``p`` or above it on its path
    anc: tuple[tuple[z3.BoolRef, ...], ...]

    @property
    def n(self) -> int:
        return len(self.live)

    @staticmethod
    def fresh(b: RadixBound, p: str) -> RState:
        r = range(b.pages)
        k = range(b.handles)
        return RState(
            live=tuple(z3.Bool(f"{p}live{i}") for i in r),
            pp=tuple(z3.Int(f"{p}pp{i}") for i in r),
            tok=tuple(z3.Int(f"{p}tok{i}") for i in r),
            head=tuple(z3.Bool(f"{p}head{i}") for i in r),
            lock=tuple(z3.Int(f"{p}lock{i}") for i in r),
            pub=tuple(z3.Int(f"{p}pub{i}") for i in r),
            held=tuple(z3.Bool(f"{p}held{j}") for j in k),
            at=tuple(z3.Int(f"{p}at{j}") for j in k),
            free=z3.Int(f"{p}free"),
            cap=z3.Int(f"{p}cap"),
            dep=tuple(z3.Int(f"{p}dep{i}") for i in r),
            anc=tuple(tuple(z3.Bool(f"{p}anc{i}_{j}") for j in r) for i in r),
        )

    @staticmethod
    def initial(b: RadixBound, cap: z3.ArithRef) -> RState:
        """The empty cache: no page, no lock, every slot free."""
        f, z = z3.BoolVal(False), z3.IntVal(0)
        return RState(
            live=(f,) * b.pages,
            pp=(z3.IntVal(ROOT),) * b.pages,
            tok=(z,) * b.pages,
            head=(f,) * b.pages,
            lock=(z,) * b.pages,
            pub=(z,) * b.pages,
            held=(f,) * b.handles,
            at=(z3.IntVal(ROOT),) * b.handles,
            free=cap,
            cap=cap,
            dep=(z,) * b.pages,
            anc=((f,) * b.pages,) * b.pages,
        )


# ------------------------------------------------------------------ helpers
def sel(xs: Sequence[z3.ExprRef], i: z3.ArithRef | int, default: z3.ExprRef) -> z3.ExprRef:
    """``xs[i]`` for a symbolic index; ``default`` outside the slots (e.g. ROOT)."""
    if isinstance(i, int):
        return xs[i] if 0 <= i < len(xs) else default
    out = default
    for j in reversed(range(len(xs))):
        out = z3.If(i == j, xs[j], out)
    return out


def sel_b(xs: Sequence[z3.BoolRef], i: z3.ArithRef | int, default: bool) -> z3.BoolRef:
    return cast(z3.BoolRef, sel(xs, i, z3.BoolVal(default)))


def sel_i(xs: Sequence[z3.ArithRef], i: z3.ArithRef | int, default: int) -> z3.ArithRef:
    return cast(z3.ArithRef, sel(xs, i, z3.IntVal(default)))


def live_at(S: RState, i: z3.ArithRef | int) -> z3.BoolRef:
    return sel_b(S.live, i, False)


def parent_of(S: RState, i: z3.ArithRef | int) -> z3.ArithRef:
    return sel_i(S.pp, i, ROOT)


def up(S: RState, p: z3.ArithRef | int, k: int) -> z3.ArithRef:
    """The page ``k`` steps above ``p`` (ROOT once the root is reached)."""
    x: z3.ArithRef | int = p
    for _ in range(k):
        x = parent_of(S, x)
    return x if not isinstance(x, int) else z3.IntVal(x)


def is_anc(S: RState, p: z3.ArithRef | int, q: int) -> z3.BoolRef:
    """Page ``q`` is ``p`` or above it on its path (``p`` a page or ROOT), by the ghost."""
    if isinstance(p, int):
        return S.anc[p][q] if 0 <= p < S.n else z3.BoolVal(False)
    return z3.Or([z3.And(p == r, S.anc[r][q]) for r in range(S.n)])


def children(S: RState, e: z3.ArithRef | int) -> list[z3.BoolRef]:
    """Per slot: it is a live child page of ``e``."""
    return [z3.And(S.live[c], S.pp[c] == e) for c in range(S.n)]


def is_tail(S: RState, e: z3.ArithRef | int) -> z3.BoolRef:
    """Every live child page of ``e`` starts a node: ``e`` is a node's last page (or the root)."""
    return z3.And([z3.Implies(ch, S.head[c]) for c, ch in enumerate(children(S, e))])


def in_slots(S: RState, i: z3.ArithRef) -> z3.BoolRef:
    return z3.And(i >= 0, i < S.n)


def page_or_root(S: RState, e: z3.ArithRef) -> z3.BoolRef:
    return z3.Or(e == ROOT, z3.And(in_slots(S, e), live_at(S, e)))


def lock_count(S: RState, p: int) -> z3.ArithRef:
    """Held locks that end at ``p`` or below it."""
    return z3.Sum([z3.If(z3.And(S.held[k], is_anc(S, S.at[k], p)), 1, 0) for k in range(len(S.held))] or [0])


def live_pages(S: RState) -> z3.ArithRef:
    return z3.Sum([z3.If(x, 1, 0) for x in S.live])


# --------------------------------------------------------------- invariants
def inv_tree(S: RState) -> z3.BoolRef:
    """INV-RADIX-TREE: every live page hangs under the root (depth 0) or under
    a page slot one level up (so no path cycles), and the ancestry ghost is
    the reflexive-transitive closure of the parent relation on live pages."""
    out = []
    n = range(S.n)
    for p in n:
        under_root = z3.And(S.pp[p] == ROOT, S.dep[p] == 0)
        under_page = z3.And(in_slots(S, S.pp[p]), S.dep[p] == sel_i(S.dep, S.pp[p], 0) + 1)
        out.append(z3.Implies(S.live[p], z3.And(S.dep[p] >= 0, z3.Or(under_root, under_page))))
        for q in n:
            step_up = z3.Or([z3.And(S.pp[p] == r, S.anc[r][q]) for r in n])
            out.append(S.anc[p][q] == z3.And(S.live[p], z3.Or(z3.BoolVal(p == q), step_up)))
            out.append(z3.Implies(S.anc[p][q], z3.And(S.live[q], S.dep[q] <= S.dep[p])))
            if p != q:
                via = z3.Or([z3.And(S.live[c], S.pp[c] == q, S.anc[p][c]) for c in n])
                out.append(z3.Implies(S.anc[p][q], via))
    return z3.And(out)


def inv_anchor(S: RState) -> z3.BoolRef:
    """INV-RADIX-ANCHOR: the parent page of every live page is live (or the root)."""
    return z3.And([z3.Implies(S.live[p], z3.Or(S.pp[p] == ROOT, live_at(S, S.pp[p]))) for p in range(S.n)])


def inv_no_dup(S: RState) -> z3.BoolRef:
    """INV-RADIX-NO-DUP: no two live pages have one parent and the same tokens."""
    out = []
    for p in range(S.n):
        for q in range(p + 1, S.n):
            out.append(z3.Implies(z3.And(S.live[p], S.live[q], S.pp[p] == S.pp[q]), S.tok[p] != S.tok[q]))
    return z3.And(out) if out else z3.BoolVal(True)


def inv_run(S: RState) -> z3.BoolRef:
    """INV-RADIX-RUN: a page under the root starts a node, and a page that
    continues its node is its parent page's only child (nodes never branch
    inside)."""
    out = []
    for p in range(S.n):
        out.append(z3.Implies(z3.And(S.live[p], S.pp[p] == ROOT), S.head[p]))
        for q in range(S.n):
            if q != p:
                out.append(z3.Implies(z3.And(S.live[p], z3.Not(S.head[p]), S.live[q]), S.pp[q] != S.pp[p]))
    return z3.And(out)


def inv_locks(S: RState) -> z3.BoolRef:
    """INV-RADIX-LOCKS: a page's lock count is the number of held locks ending
    at it or below it; a held lock ends at the root or at a live node's last page."""
    out = [S.lock[p] == lock_count(S, p) for p in range(S.n)]
    for k in range(len(S.held)):
        a = S.at[k]
        out.append(z3.Implies(S.held[k], z3.Or(a == ROOT, z3.And(in_slots(S, a), live_at(S, a), is_tail(S, a)))))
    return z3.And(out)


def inv_router(S: RState) -> z3.BoolRef:
    """INV-RADIX-ROUTER: the router's count of every page is 1 when it is live, else 0."""
    return z3.And([S.pub[p] == z3.If(S.live[p], 1, 0) for p in range(S.n)])


def inv_capacity(S: RState) -> z3.BoolRef:
    """INV-RADIX-CAPACITY: free slots are never negative and free + cached = capacity."""
    return z3.And(S.free >= 0, S.free + live_pages(S) == S.cap)


INVARIANTS: dict[str, Callable[[RState], z3.BoolRef]] = {
    rid("INV-RADIX-TREE"): inv_tree,
    rid("INV-RADIX-ANCHOR"): inv_anchor,
    rid("INV-RADIX-NO-DUP"): inv_no_dup,
    rid("INV-RADIX-RUN"): inv_run,
    rid("INV-RADIX-LOCKS"): inv_locks,
    rid("INV-RADIX-ROUTER"): inv_router,
    rid("INV-RADIX-CAPACITY"): inv_capacity,
}


def all_invariants(S: RState) -> list[z3.BoolRef]:
    return [f(S) for f in INVARIANTS.values()]


def lemma_lock_path(S: RState) -> z3.BoolRef:
    """LEMMA (a consequence, proven from the invariants): lock counts are never
    negative, a locked page's parent page is locked at least as often, and a
    node's pages share one lock count (the model's one ``lock_ref`` per node)."""
    out = []
    for p in range(S.n):
        out.append(S.lock[p] >= 0)
        par = S.pp[p]
        out.append(z3.Implies(z3.And(S.live[p], par != ROOT), sel_i(S.lock, par, 0) >= S.lock[p]))
        out.append(z3.Implies(z3.And(S.live[p], z3.Not(S.head[p])), sel_i(S.lock, par, 0) == S.lock[p]))
    return z3.And(out)


# -------------------------------------------------------------------- steps
@dataclass
class RadixTransition:
    """One step: its guard (``requires``), its successor, its rules and the
    sub-cases the sanity check must find satisfiable."""

    name: str
    pre: RState
    post: RState
    requires: list[z3.BoolRef] = field(default_factory=list)
    rules: tuple[str, ...] = ()
    cases: dict[str, z3.BoolRef] = field(default_factory=dict)


def _set(xs: tuple[z3.ExprRef, ...], i: z3.ArithRef, v: z3.ExprRef) -> tuple:
    return tuple(z3.If(i == j, v, x) for j, x in enumerate(xs))


def choice(name: str) -> z3.ArithRef:
    return z3.Int(f"in_{name}")


def _upper_half(S: RState, p: z3.ArithRef, x: int) -> z3.BoolRef:
    """Page ``x`` is in the node ``p`` continues, above ``p``: on the path from
    ``p``'s parent up to the node's first page, no node start below ``x``."""
    par = parent_of(S, p)
    below = [z3.Implies(z3.And(is_anc(S, par, y), S.anc[y][x]), z3.Not(S.head[y])) for y in range(S.n) if y != x]
    return z3.And(is_anc(S, par, x), *below)


def split(S: RState, tw: frozenset[str]) -> RadixTransition:
    """RADIX-MATCH: a walk that ends inside a node splits it before page ``p``
    (``p`` starts the lower half). RADIX-SPLIT-SILENT: nothing is published."""
    p = choice("p")
    post = replace(S, head=_set(S.head, p, z3.BoolVal(True)))
    if "split-publishes" in tw:
        post = replace(post, pub=_set(S.pub, p, sel_i(S.pub, p, 0) + 1))
    if "split-forgets-lock" in tw:  # the new upper node starts unlocked
        post = replace(post, lock=tuple(z3.If(_upper_half(S, p, x), 0, v) for x, v in enumerate(S.lock)))
    if "split-forgets-parent" in tw:
        post = replace(post, pp=_set(S.pp, p, parent_of(S, parent_of(S, p))))
    step = RadixTransition("split", S, post, [in_slots(S, p), live_at(S, p), z3.Not(sel_b(S.head, p, True))])
    step.rules = (R.RADIX_MATCH, R.RADIX_SPLIT_SILENT)
    step.cases = {
        "one page above, under the root": up(S, p, 2) == ROOT,
        "deeper in the tree": up(S, p, 2) != ROOT,
        "lower half is a leaf": z3.Not(z3.Or(children(S, p))),
        "lower half has children": z3.Or(children(S, p)),
        "split node is locked": sel_i(S.lock, p, 0) > 0,
    }
    return step


def _new_page(S: RState, q: z3.ArithRef, e: z3.ArithRef, t: z3.ArithRef, head: bool, tw: frozenset[str]) -> RState:
    pub = _set(S.pub, q, sel_i(S.pub, q, 0) + 1)
    if "insert-republishes-prefix" in tw:
        pub = tuple(z3.If(e == j, x + 1, x) for j, x in enumerate(pub))
    return replace(
        S,
        live=_set(S.live, q, z3.BoolVal(True)),
        pp=_set(S.pp, q, e),
        tok=_set(S.tok, q, t),
        head=_set(S.head, q, z3.BoolVal(head)),
        lock=_set(S.lock, q, z3.IntVal(0)),
        pub=pub,
        free=S.free if "insert-takes-no-slot" in tw else S.free - 1,
        dep=_set(S.dep, q, z3.If(e == ROOT, 0, sel_i(S.dep, e, 0) + 1)),
        anc=tuple(
            tuple(z3.If(q == p, z3.Or(z3.BoolVal(p == x), is_anc(S, e, x)), S.anc[p][x]) for x in range(S.n))
            for p in range(S.n)
        ),
    )


def add_head(S: RState, tw: frozenset[str]) -> RadixTransition:
    """RADIX-INSERT: the first page of a new leaf, in a free slot ``q``, under
    the node's last page ``e`` the walk stopped at (or the root), with tokens
    ``t`` no child of ``e`` starts with (the walk went as far as it could);
    one slot taken (RADIX-CAPACITY), its Stored anchored at ``e``."""
    q, e, t = choice("q"), choice("e"), choice("t")
    fresh_tokens = z3.And([z3.Implies(ch, S.tok[c] != t) for c, ch in enumerate(children(S, e))])
    req = [in_slots(S, q), z3.Not(live_at(S, q)), page_or_root(S, e), S.free >= 1]
    if "insert-restores-page" not in tw:
        req.append(fresh_tokens)
    if "leaf-under-run" not in tw:
        req.append(is_tail(S, e))
    step = RadixTransition("add_head", S, _new_page(S, q, e, t, True, tw), req)
    step.rules = (R.RADIX_INSERT, R.RADIX_CAPACITY)
    step.cases = {
        "under the root": e == ROOT,
        "under a leaf page": z3.And(e != ROOT, z3.Not(z3.Or(children(S, e)))),
        "beside other children": z3.Or(children(S, e)),
        "under a locked page": z3.And(e != ROOT, sel_i(S.lock, e, 0) > 0),
        "last free slot": S.free == 1,
    }
    return step


def add_cont(S: RState, tw: frozenset[str]) -> RadixTransition:
    """RADIX-INSERT: one more page of the leaf being built, under its last page
    ``e`` (a live unlocked page with no child), in a free slot ``q``."""
    q, e, t = choice("q"), choice("e"), choice("t")
    req = [
        in_slots(S, q),
        z3.Not(live_at(S, q)),
        in_slots(S, e),
        live_at(S, e),
        z3.Not(z3.Or(children(S, e))),
        sel_i(S.lock, e, 0) == 0,
        S.free >= 1,
    ]
    step = RadixTransition("add_cont", S, _new_page(S, q, e, t, False, tw), req)
    step.rules = (R.RADIX_INSERT, R.RADIX_CAPACITY)
    step.cases = {
        "after the leaf's first page": sel_b(S.head, e, False) == True,  # noqa: E712
        "after a continued page": sel_b(S.head, e, True) == False,  # noqa: E712
    }
    return step


def lock(S: RState, tw: frozenset[str]) -> RadixTransition:
    """RADIX-LOCK: handle ``k`` locks the path from ``e`` (a node's last page,
    or the root) up: one more on every page of it."""
    k, e = choice("k"), choice("e")
    if "lock-node-only" in tw:
        lock_ = tuple(z3.If(e == p, x + 1, x) for p, x in enumerate(S.lock))
    else:
        lock_ = tuple(z3.If(is_anc(S, e, p), x + 1, x) for p, x in enumerate(S.lock))
    nk = len(S.held)
    post = replace(S, held=_set(S.held, k, z3.BoolVal(True)), at=_set(S.at, k, e), lock=lock_)
    free_handle = z3.Not(sel_b(S.held, k, True))
    step = RadixTransition("lock", S, post, [k >= 0, k < nk, free_handle, page_or_root(S, e), is_tail(S, e)])
    step.rules = (R.RADIX_LOCK,)
    step.cases = {
        "at the root": e == ROOT,
        "at a page": e != ROOT,
        "on a locked path": z3.And(e != ROOT, sel_i(S.lock, e, 0) > 0),
    }
    return step


def unlock(S: RState, tw: frozenset[str]) -> RadixTransition:
    """RADIX-LOCK: a held handle gives its lock back: one less on every page
    from where it ends up (splits in between change nothing)."""
    k = choice("k")
    e = sel_i(S.at, k, ROOT)
    lock_ = tuple(z3.If(is_anc(S, e, p), x - 1, x) for p, x in enumerate(S.lock))
    post = replace(S, held=_set(S.held, k, z3.BoolVal(False)), lock=lock_)
    step = RadixTransition("unlock", S, post, [k >= 0, k < len(S.held), sel_b(S.held, k, False) == True])  # noqa: E712
    step.rules = (R.RADIX_LOCK,)
    step.cases = {
        "at the root": e == ROOT,
        "at a page": e != ROOT,
        "another lock on the path": z3.And(e != ROOT, sel_i(S.lock, e, 0) >= 2),
    }
    return step


def evict(S: RState, tw: frozenset[str]) -> RadixTransition:
    """RADIX-EVICT-LRU / RADIX-LOCKED-KEPT / RADIX-REMOVE: an unlocked leaf page
    ``t`` (any one: the LRU victim is one of them) goes, its slot freed, its
    Removed published."""
    t = choice("t")
    req = [in_slots(S, t), live_at(S, t)]
    if "evict-inner" not in tw:
        req.append(z3.Not(z3.Or(children(S, t))))
    if "evict-locked" not in tw:
        req.append(sel_i(S.lock, t, 1) == 0)
    post = replace(
        S,
        live=_set(S.live, t, z3.BoolVal(False)),
        head=_set(S.head, t, z3.BoolVal(False)),
        pub=_set(S.pub, t, sel_i(S.pub, t, 0) - 1),
        free=S.free + 1,
        anc=tuple(tuple(z3.And(S.anc[p][x], t != p, t != x) for x in range(S.n)) for p in range(S.n)),
    )
    step = RadixTransition("evict", S, post, req)
    step.rules = (R.RADIX_EVICT_LRU, R.RADIX_LOCKED_KEPT, R.RADIX_REMOVE)
    step.cases = {
        "a node's last page": sel_b(S.head, t, True) == False,  # noqa: E712
        "a node's first page (the node is gone)": sel_b(S.head, t, False) == True,  # noqa: E712
        "parent still locked by another path": z3.And(
            parent_of(S, t) != ROOT,
            sel_i(S.lock, parent_of(S, t), 0) > 0,
        ),
    }
    return step


def reset(S: RState, tw: frozenset[str]) -> RadixTransition:
    """RADIX-RESET: the tree empties, every lock is forgotten, every slot is
    free, and one Cleared sets the router's counts to 0."""
    f, z = z3.BoolVal(False), z3.IntVal(0)
    post = replace(
        S,
        live=(f,) * S.n,
        head=(f,) * S.n,
        lock=(z,) * S.n,
        pub=S.pub if "reset-without-clear" in tw else (z,) * S.n,
        held=S.held if "reset-keeps-locks" in tw else (f,) * len(S.held),
        free=S.cap,
        anc=((f,) * S.n,) * S.n,
    )
    step = RadixTransition("reset", S, post, [])
    step.rules = (R.RADIX_RESET,)
    step.cases = {
        "with pages": z3.Or(S.live),
        "with a lock held": z3.Or(S.held) if S.held else z3.BoolVal(False),
    }
    return step


STEPS: dict[str, Callable[[RState, frozenset[str]], RadixTransition]] = {
    "split": split,
    "add_head": add_head,
    "add_cont": add_cont,
    "lock": lock,
    "unlock": unlock,
    "evict": evict,
    "reset": reset,
}
