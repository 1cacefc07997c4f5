"""The INV-RADIX-* invariants for any number of pages, tokens and locks.

``radix_encoding.py`` names every page slot and lock handle, so its proofs
are for one universe (5 pages, 2 locks). Here the same steps are written
over two **uninterpreted sorts**, ``RPage`` and ``RHandle`` (any number of
elements, finite or not), with unbounded integer tokens and capacity. One
distinguished element ``root`` of ``RPage`` stands for the tree's root: it
is never live and never chosen as a new page. Per-page and per-handle fields
are z3 arrays, updated by ``Store`` or ``Lambda``; every invariant is a
universally quantified formula stated *locally*: about one page and its
parent (depth, anchor, router count, capacity), two pages with one parent
(no duplicate, runs do not branch), or the ancestry ghost.

Ghost state, with its meaning fixed by construction:

- ``dep`` -- a page's depth: 0 under the root, its parent's plus one
  otherwise (INV-RADIX-TREE); a well-founded measure, so no path cycles.
- ``anc(p, q)`` -- ``q`` is ``p`` or above it on its path. Stated locally
  as the fixpoint ``anc(p, q) = live(p) and (p = q or anc(parent(p), q))``,
  which with ``dep`` has exactly one solution: the reflexive-transitive
  closure of the parent relation; transitivity and "a strict ancestor is
  reached through one of its children" are kept as invariants too.
- ``lc(p)`` -- the census of the lock handles held at ``p`` or below it,
  ``|{k : held(k) and anc(at(k), p)}|``; ``npages`` -- the census of live
  pages. They are *not* written by the steps: every step names the one
  handle (``hk``) and the one page (``pg``) it changes, or that it empties
  everything (``wipe``), and the ghost follows by the point-update identity
  |S'| = |S| - [k in S] + [k in S'] (``_finish``). Each step's proof
  obligation for INV-RADIX-LOCKS (INV-RADIX-CAPACITY) includes the *frame*:
  no other handle changes membership (no other page changes liveness), so a
  step that changed more than it names is refuted, not silently accepted.
  The facts assumed of them in the pre-state hold of every finite state
  (``census_facts``): counts are >= 0, a member makes the count >= 1, a
  count >= 1 has a member, and (for the lemma) a subset has a count no larger.

The model's field ``lock`` (SGLang's ``lock_ref`` per node, here per page)
is written by the steps; INV-RADIX-LOCKS says it equals the census.

The steps are ``radix_encoding.STEPS`` one for one (same names, rules,
sub-cases and mutants, the tweak names of ``profile_radix.MUTANTS``).
``unsat`` of "invariants, census facts, guard, not invariant'" is a proof for
every number of pages, tokens and handles at once.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import z3

from kvspec.reference.smt import solving
from kvspec.spec.rules import RuleId as R
from kvspec.spec.rules import rid

Page = z3.DeclareSort("RPage")
Handle = z3.DeclareSort("RHandle")
Int, Bool = z3.IntSort(), z3.BoolSort()
ROOT = z3.Const("root", Page)
Tweaks = frozenset[str]
LEMMA_ID = "LEMMA-RADIX-LOCK-PATH"


def _ind(c: z3.BoolRef) -> z3.ArithRef:
    return z3.If(c, 1, 0)


@dataclass(frozen=True)
class UR:
    """One state of the page tree over the sorts ``RPage`` and ``RHandle``."""

    live: z3.ArrayRef  # Page -> Bool
    pp: z3.ArrayRef  # Page -> Page (the parent page, or root)
    tok: z3.ArrayRef  # Page -> Int
    head: z3.ArrayRef  # Page -> Bool (starts a node)
    lock: z3.ArrayRef  # Page -> Int (the model's lock count)
    pub: z3.ArrayRef  # Page -> Int (router: Stored minus Removed)
    held: z3.ArrayRef  # Handle -> Bool
    at: z3.ArrayRef  # Handle -> Page (a node's last page, or root)
    free: z3.ArithRef
    cap: z3.ArithRef
    dep: z3.ArrayRef  # ghost: Page -> Int
    #: ghost: Page x Page -> Bool, a function term builder (no array Lambda:
    #: E-matching sees the pre-state's uninterpreted function directly)
    anc: Callable[[z3.ExprRef, z3.ExprRef], z3.BoolRef]
    lc: z3.ArrayRef  # ghost census: Page -> Int
    npages: z3.ArithRef  # ghost census of live pages

    @staticmethod
    def fresh(p: str) -> UR:
        return UR(
            live=z3.Array(f"{p}live", Page, Bool),
            pp=z3.Array(f"{p}pp", Page, Page),
            tok=z3.Array(f"{p}tok", Page, Int),
            head=z3.Array(f"{p}head", Page, Bool),
            lock=z3.Array(f"{p}lock", Page, Int),
            pub=z3.Array(f"{p}pub", Page, Int),
            held=z3.Array(f"{p}held", Handle, Bool),
            at=z3.Array(f"{p}at", Handle, Page),
            free=z3.Int(f"{p}free"),
            cap=z3.Int(f"{p}cap"),
            dep=z3.Array(f"{p}dep", Page, Int),
            anc=z3.Function(f"{p}anc", Page, Page, Bool),
            lc=z3.Array(f"{p}lc", Page, Int),
            npages=z3.Int(f"{p}npages"),
        )

    @staticmethod
    def initial(cap: z3.ArithRef) -> UR:
        """The empty cache: no page, no lock, every slot free."""
        f, z = z3.BoolVal(False), z3.IntVal(0)
        return UR(
            live=z3.K(Page, f),
            pp=z3.K(Page, ROOT),
            tok=z3.K(Page, z),
            head=z3.K(Page, f),
            lock=z3.K(Page, z),
            pub=z3.K(Page, z),
            held=z3.K(Handle, f),
            at=z3.K(Handle, ROOT),
            free=cap,
            cap=cap,
            dep=z3.K(Page, z),
            anc=lambda _p, _q: z3.BoolVal(False),
            lc=z3.K(Page, z),
            npages=z,
        )

    # queries
    def a(self, p: z3.ExprRef, q: z3.ExprRef) -> z3.BoolRef:
        return self.anc(p, q)

    def member(self, k: z3.ExprRef, p: z3.ExprRef) -> z3.BoolRef:
        """Handle ``k`` is held and ends at ``p`` or below it."""
        return z3.And(self.held[k], self.a(self.at[k], p))

    def child(self, c: z3.ExprRef, e: z3.ExprRef) -> z3.BoolRef:
        return z3.And(self.live[c], self.pp[c] == e)


def _v(name: str, sort: z3.SortRef = Page) -> z3.ExprRef:
    return z3.Const(name, sort)


def leaf(S: UR, e: z3.ExprRef) -> z3.BoolRef:
    c = _v("c_leaf")
    return z3.ForAll([c], z3.Not(S.child(c, e)))


def is_tail(S: UR, e: z3.ExprRef) -> z3.BoolRef:
    """Every live child of ``e`` starts a node: ``e`` is a node's last page (or the root)."""
    c = _v("c_tail")
    return z3.ForAll([c], z3.Implies(S.child(c, e), S.head[c]))


def has_child(S: UR, e: z3.ExprRef) -> z3.BoolRef:
    c = _v("c_has")
    return z3.Exists([c], S.child(c, e))


def page_or_root(S: UR, e: z3.ExprRef) -> z3.BoolRef:
    return z3.Or(e == ROOT, S.live[e])


# --------------------------------------------------------------- invariants
def inv_tree(S: UR) -> z3.BoolRef:
    """INV-RADIX-TREE: the root is no page; a live page hangs under the root
    at depth 0 or under a page one level up; ``anc`` is the fixpoint of the
    parent relation (so, with the depth, its reflexive-transitive closure),
    transitive, and reaches a strict ancestor through one of its children."""
    p, q, x, c = _v("p"), _v("q"), _v("x"), _v("c")
    return z3.And(
        z3.Not(S.live[ROOT]),
        z3.ForAll(
            [p],
            z3.Implies(
                S.live[p],
                z3.And(
                    S.dep[p] >= 0,
                    z3.Or(
                        z3.And(S.pp[p] == ROOT, S.dep[p] == 0),
                        z3.And(S.pp[p] != ROOT, S.dep[p] == S.dep[S.pp[p]] + 1),
                    ),
                ),
            ),
        ),
        z3.ForAll([p, q], S.a(p, q) == z3.And(S.live[p], z3.Or(p == q, S.a(S.pp[p], q)))),
        z3.ForAll([p, q], z3.Implies(S.a(p, q), z3.And(S.live[q], S.dep[q] <= S.dep[p]))),
        z3.ForAll([p, q, x], z3.Implies(z3.And(S.a(p, q), S.a(q, x)), S.a(p, x))),
        z3.ForAll(
            [p, q],
            z3.Implies(z3.And(S.a(p, q), p != q), z3.Exists([c], z3.And(S.child(c, q), S.a(p, c)))),
        ),
    )


def inv_anchor(S: UR) -> z3.BoolRef:
    """INV-RADIX-ANCHOR: the parent of every live page is live or the root."""
    p = _v("p")
    return z3.ForAll([p], z3.Implies(S.live[p], page_or_root(S, S.pp[p])))


def inv_no_dup(S: UR) -> z3.BoolRef:
    """INV-RADIX-NO-DUP: two live pages with one parent and the same tokens are one page."""
    p, q = _v("p"), _v("q")
    same = z3.And(S.live[p], S.live[q], S.pp[p] == S.pp[q], S.tok[p] == S.tok[q])
    return z3.ForAll([p, q], z3.Implies(same, p == q))


def inv_run(S: UR) -> z3.BoolRef:
    """INV-RADIX-RUN: a page under the root starts a node; a page that
    continues its node is its parent's only live child."""
    p, q = _v("p"), _v("q")
    return z3.And(
        z3.ForAll([p], z3.Implies(S.child(p, ROOT), S.head[p])),
        z3.ForAll(
            [p, q],
            z3.Implies(z3.And(S.live[p], z3.Not(S.head[p]), S.live[q], q != p), S.pp[q] != S.pp[p]),
        ),
    )


def inv_locks(S: UR) -> z3.BoolRef:
    """INV-RADIX-LOCKS: a page's lock count is the census of held handles
    ending at it or below it; a held handle ends at the root or at a live
    node's last page."""
    p, k = _v("p"), _v("k", Handle)
    e = S.at[k]
    return z3.And(
        z3.ForAll([p], S.lock[p] == S.lc[p]),
        z3.ForAll([k], z3.Implies(S.held[k], z3.Or(e == ROOT, z3.And(S.live[e], is_tail(S, e))))),
    )


def inv_router(S: UR) -> z3.BoolRef:
    """INV-RADIX-ROUTER: the router's count of every page is 1 when it is live, else 0."""
    p = _v("p")
    return z3.ForAll([p], S.pub[p] == _ind(S.live[p]))


def inv_capacity(S: UR) -> z3.BoolRef:
    """INV-RADIX-CAPACITY: free slots are never negative and free + live pages = capacity."""
    return z3.And(S.free >= 0, S.free + S.npages == S.cap)


INVARIANTS: dict[str, Callable[[UR], z3.BoolRef]] = {
    rid("INV-RADIX-TREE"): inv_tree,
    rid("INV-RADIX-ANCHOR"): inv_anchor,
    rid("INV-RADIX-NO-DUP"): inv_no_dup,
    rid("INV-RADIX-RUN"): inv_run,
    rid("INV-RADIX-LOCKS"): inv_locks,
    rid("INV-RADIX-ROUTER"): inv_router,
    rid("INV-RADIX-CAPACITY"): inv_capacity,
}


def lemma_lock_path(S: UR) -> z3.BoolRef:
    """LEMMA-RADIX-LOCK-PATH: lock counts are never negative, a page's parent
    page is locked at least as often, a node's pages share one lock count."""
    p = _v("p")
    par = S.pp[p]
    return z3.ForAll(
        [p],
        z3.And(
            S.lock[p] >= 0,
            z3.Implies(z3.And(S.live[p], par != ROOT), S.lock[par] >= S.lock[p]),
            z3.Implies(z3.And(S.live[p], z3.Not(S.head[p])), S.lock[par] == S.lock[p]),
        ),
    )


def census_facts(S: UR, subsets: bool = False) -> list[z3.BoolRef]:
    """What every finite state's censuses satisfy (``subsets``: a subset's count is no larger)."""
    p, q, k = _v("p"), _v("q"), _v("k", Handle)
    out = [
        S.npages >= 0,
        z3.ForAll([p], z3.Implies(S.live[p], S.npages >= 1)),
        z3.Implies(S.npages >= 1, z3.Exists([p], S.live[p])),
        z3.ForAll([p], S.lc[p] >= 0),
        z3.ForAll([k, p], z3.Implies(S.member(k, p), S.lc[p] >= 1)),
        z3.ForAll([p], z3.Implies(S.lc[p] >= 1, z3.Exists([k], S.member(k, p)))),
    ]
    if subsets:
        j = _v("j", Handle)
        sub = z3.ForAll([j], z3.Implies(S.member(j, p), S.member(j, q)))
        out.append(z3.ForAll([p, q], z3.Implies(sub, S.lc[p] <= S.lc[q])))
    return out


def hypothesis(S: UR) -> list[z3.BoolRef]:
    return [S.cap >= 0, *census_facts(S), *(f(S) for f in INVARIANTS.values())]


# -------------------------------------------------------------------- steps
@dataclass
class URStep:
    """One step: guard, successor, rules, sub-cases, and what it changes (for the censuses)."""

    name: str
    pre: UR
    post: UR
    requires: list[z3.BoolRef] = field(default_factory=list)
    rules: tuple[str, ...] = ()
    cases: dict[str, z3.BoolRef] = field(default_factory=dict)
    hk: z3.ExprRef | None = None  # the one handle whose membership may change
    pg: z3.ExprRef | None = None  # the one page whose liveness may change
    wipe: bool = False  # every handle and page is dropped (reset)
    frame_locks: z3.BoolRef = field(default_factory=lambda: z3.BoolVal(True))
    frame_pages: z3.BoolRef = field(default_factory=lambda: z3.BoolVal(True))

    def enabled(self) -> z3.BoolRef:
        return z3.And(self.requires) if self.requires else z3.BoolVal(True)


def _finish(step: URStep) -> URStep:
    """The census ghosts of the successor by the point-update identity, and
    the frame obligations that make the identity exact."""
    S, P = step.pre, step.post
    j, p = _v("j_fr", Handle), _v("p_fr")
    if step.wipe:
        lc, npages = z3.K(Page, z3.IntVal(0)), z3.IntVal(0)
        step.frame_locks = z3.ForAll([j, p], z3.Not(P.member(j, p)))
        step.frame_pages = z3.ForAll([p], z3.Not(P.live[p]))
    else:
        if step.hk is None:
            lc = S.lc
            step.frame_locks = z3.ForAll([j, p], P.member(j, p) == S.member(j, p))
        else:
            k = step.hk
            x = _v("x_lc")
            lc = z3.Lambda([x], S.lc[x] + _ind(P.member(k, x)) - _ind(S.member(k, x)))
            step.frame_locks = z3.ForAll([j, p], z3.Implies(j != k, P.member(j, p) == S.member(j, p)))
        if step.pg is None:
            npages = S.npages
            step.frame_pages = z3.ForAll([p], P.live[p] == S.live[p])
        else:
            g = step.pg
            npages = S.npages + _ind(P.live[g]) - _ind(S.live[g])
            step.frame_pages = z3.ForAll([p], z3.Implies(p != g, P.live[p] == S.live[p]))
    step.post = replace(P, lc=lc, npages=npages)
    return step


def choice(name: str, sort: z3.SortRef = Page) -> z3.ExprRef:
    return z3.Const(f"in_{name}", sort)


def split(S: UR, tw: Tweaks) -> URStep:
    """RADIX-MATCH / RADIX-SPLIT-SILENT: page ``p`` starts the lower half of a split node; nothing published."""
    p = choice("p")
    post = replace(S, head=z3.Store(S.head, p, True))
    if "split-publishes" in tw:
        post = replace(post, pub=z3.Store(S.pub, p, S.pub[p] + 1))
    if "split-forgets-lock" in tw:  # the new upper node starts unlocked
        x, y = _v("x_up"), _v("y_up")
        par = S.pp[p]
        inside = z3.ForAll([y], z3.Implies(z3.And(y != x, S.a(par, y), S.a(y, x)), z3.Not(S.head[y])))
        post = replace(post, lock=z3.Lambda([x], z3.If(z3.And(S.a(par, x), inside), 0, S.lock[x])))
    if "split-forgets-parent" in tw:
        post = replace(post, pp=z3.Store(S.pp, p, S.pp[S.pp[p]]))
    step = URStep("split", S, post, [S.live[p], z3.Not(S.head[p])], (R.RADIX_MATCH, R.RADIX_SPLIT_SILENT))
    step.cases = {
        "one page above, under the root": z3.And(S.pp[p] != ROOT, S.pp[S.pp[p]] == ROOT),
        "deeper in the tree": z3.And(S.pp[p] != ROOT, S.pp[S.pp[p]] != ROOT),
        "lower half is a leaf": leaf(S, p),
        "lower half has children": has_child(S, p),
        "split node is locked": S.lock[p] > 0,
    }
    return _finish(step)


def _anc_add(S: UR, q: z3.ExprRef, e: z3.ExprRef) -> Callable[[z3.ExprRef, z3.ExprRef], z3.BoolRef]:
    return lambda a, b: z3.If(a == q, z3.Or(a == b, S.a(e, b)), S.a(a, b))


def _new_page(S: UR, q: z3.ExprRef, e: z3.ExprRef, t: z3.ArithRef, head: bool, tw: Tweaks) -> UR:
    pub = z3.Store(S.pub, q, S.pub[q] + 1)
    if "insert-republishes-prefix" in tw:
        pub = z3.If(e == ROOT, pub, z3.Store(pub, e, pub[e] + 1))
    return replace(
        S,
        live=z3.Store(S.live, q, True),
        pp=z3.Store(S.pp, q, e),
        tok=z3.Store(S.tok, q, t),
        head=z3.Store(S.head, q, head),
        lock=z3.Store(S.lock, q, 0),
        pub=pub,
        free=S.free if "insert-takes-no-slot" in tw else S.free - 1,
        dep=z3.Store(S.dep, q, z3.If(e == ROOT, 0, S.dep[e] + 1)),
        anc=_anc_add(S, q, e),
    )


def add_head(S: UR, tw: Tweaks) -> URStep:
    """RADIX-INSERT / RADIX-CAPACITY: a new leaf's first page ``q`` under a
    node's last page ``e`` (or the root), with tokens ``t`` no child of ``e`` holds."""
    q, e, t = choice("q"), choice("e"), z3.Int("in_t")
    c = _v("c_fresh")
    fresh_tokens = z3.ForAll([c], z3.Implies(S.child(c, e), S.tok[c] != t))
    req = [q != ROOT, z3.Not(S.live[q]), page_or_root(S, e), S.free >= 1]
    if "insert-restores-page" not in tw:
        req.append(fresh_tokens)
    if "leaf-under-run" not in tw:
        req.append(is_tail(S, e))
    step = URStep("add_head", S, _new_page(S, q, e, t, True, tw), req, (R.RADIX_INSERT, R.RADIX_CAPACITY), pg=q)
    step.cases = {
        "under the root": e == ROOT,
        "under a leaf page": z3.And(e != ROOT, leaf(S, e)),
        "beside other children": has_child(S, e),
        "under a locked page": z3.And(e != ROOT, S.lock[e] > 0),
        "last free slot": S.free == 1,
    }
    return _finish(step)


def add_cont(S: UR, tw: Tweaks) -> URStep:
    """RADIX-INSERT: one more page ``q`` of the leaf being built, under its last page ``e``."""
    q, e, t = choice("q"), choice("e"), z3.Int("in_t")
    req = [q != ROOT, z3.Not(S.live[q]), S.live[e], leaf(S, e), S.lock[e] == 0, S.free >= 1]
    step = URStep("add_cont", S, _new_page(S, q, e, t, False, tw), req, (R.RADIX_INSERT, R.RADIX_CAPACITY), pg=q)
    step.cases = {
        "after the leaf's first page": S.head[e] == True,  # noqa: E712
        "after a continued page": S.head[e] == False,  # noqa: E712
    }
    return _finish(step)


def lock(S: UR, tw: Tweaks) -> URStep:
    """RADIX-LOCK: handle ``k`` locks the path from ``e`` (a node's last page, or the root) up."""
    k, e = choice("k", Handle), choice("e")
    x = _v("x_lock")
    if "lock-node-only" in tw:
        lock_ = z3.Lambda([x], z3.If(x == e, S.lock[x] + 1, S.lock[x]))
    else:
        lock_ = z3.Lambda([x], z3.If(S.a(e, x), S.lock[x] + 1, S.lock[x]))
    post = replace(S, held=z3.Store(S.held, k, True), at=z3.Store(S.at, k, e), lock=lock_)
    req = [z3.Not(S.held[k]), page_or_root(S, e), is_tail(S, e)]
    step = URStep("lock", S, post, req, (R.RADIX_LOCK,), hk=k)
    step.cases = {
        "at the root": e == ROOT,
        "at a page": e != ROOT,
        "on a locked path": z3.And(e != ROOT, S.lock[e] > 0),
    }
    return _finish(step)


def unlock(S: UR, tw: Tweaks) -> URStep:
    """RADIX-LOCK: a held handle gives its lock back, one less on every page of its path."""
    k = choice("k", Handle)
    e = S.at[k]
    x = _v("x_unlock")
    lock_ = z3.Lambda([x], z3.If(S.a(e, x), S.lock[x] - 1, S.lock[x]))
    post = replace(S, held=z3.Store(S.held, k, False), lock=lock_)
    step = URStep("unlock", S, post, [S.held[k]], (R.RADIX_LOCK,), hk=k)
    step.cases = {
        "at the root": e == ROOT,
        "at a page": e != ROOT,
        "another lock on the path": z3.And(e != ROOT, S.lock[e] >= 2),
    }
    return _finish(step)


def evict(S: UR, tw: Tweaks) -> URStep:
    """RADIX-EVICT-LRU / RADIX-LOCKED-KEPT / RADIX-REMOVE: an unlocked leaf page ``t`` goes."""
    t = choice("t")
    req = [S.live[t]]
    if "evict-inner" not in tw:
        req.append(leaf(S, t))
    if "evict-locked" not in tw:
        req.append(S.lock[t] == 0)
    post = replace(
        S,
        live=z3.Store(S.live, t, False),
        head=z3.Store(S.head, t, False),
        pub=z3.Store(S.pub, t, S.pub[t] - 1),
        free=S.free + 1,
        anc=lambda a, b: z3.And(S.a(a, b), a != t, b != t),
    )
    step = URStep("evict", S, post, req, (R.RADIX_EVICT_LRU, R.RADIX_LOCKED_KEPT, R.RADIX_REMOVE), pg=t)
    step.cases = {
        "a node's last page": S.head[t] == False,  # noqa: E712
        "a node's first page (the node is gone)": S.head[t] == True,  # noqa: E712
        "parent still locked by another path": z3.And(S.pp[t] != ROOT, S.lock[S.pp[t]] > 0),
    }
    return _finish(step)


def reset(S: UR, tw: Tweaks) -> URStep:
    """RADIX-RESET: the tree empties, every lock is forgotten, one Cleared zeroes the router."""
    f, z = z3.BoolVal(False), z3.IntVal(0)
    post = replace(
        S,
        live=z3.K(Page, f),
        head=z3.K(Page, f),
        lock=z3.K(Page, z),
        pub=S.pub if "reset-without-clear" in tw else z3.K(Page, z),
        held=S.held if "reset-keeps-locks" in tw else z3.K(Handle, f),
        free=S.cap,
        anc=lambda a, b: f,
    )
    p, k = _v("p_rs"), _v("k_rs", Handle)
    step = URStep("reset", S, post, [], (R.RADIX_RESET,), wipe=True)
    step.cases = {
        "with pages": z3.Exists([p], S.live[p]),
        "with a lock held": z3.Exists([k], S.held[k]),
    }
    return _finish(step)


STEPS: dict[str, Callable[[UR, Tweaks], URStep]] = {
    "split": split,
    "add_head": add_head,
    "add_cont": add_cont,
    "lock": lock,
    "unlock": unlock,
    "evict": evict,
    "reset": reset,
}


def goal(pid: str, step: URStep) -> z3.BoolRef:
    """The post-state obligation for ``pid``: the invariant, plus the census frame it rests on."""
    body = INVARIANTS[pid](step.post)
    if pid == rid("INV-RADIX-LOCKS"):
        return z3.And(step.frame_locks, body)
    if pid == rid("INV-RADIX-CAPACITY"):
        return z3.And(step.frame_pages, body)
    return body


# ------------------------------------------------------------------- proofs
@dataclass
class URProof:
    """One invariant: proven for every step (and initially) for any number of pages and handles."""

    property_id: str
    verdict: str  # "proven" | "refuted" | "unknown"
    seconds: float
    failed_at: list[str]


def _solver(timeout_ms: int, seed: int = 0) -> z3.Solver:
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    if seed:
        s.set("random_seed", seed)
    return s


#: z3's quantifier instantiation is sensitive to its random seed: a query
#: one seed leaves ``unknown`` another closes in milliseconds. An ``unsat``
#: from any seed is a proof; ``sat`` (a counterexample) is reported at once.
SEEDS = (0, 1, 2, 3)


def conjuncts(f: z3.BoolRef) -> list[z3.BoolRef]:
    """The top-level conjuncts of ``f`` (proven one at a time: each negation is one existential)."""
    if z3.is_and(f):
        return [c for x in f.children() for c in conjuncts(x)]
    return [f]


#: ground instances are added for a universal fact of k variables only while
#: (terms of its sorts)^k stays under this many
MAX_INSTANCES = 1000


def _ground_terms(fs: list[z3.ExprRef]) -> dict[z3.SortRef, list[z3.ExprRef]]:
    """The page- and handle-sorted subterms of ``fs`` outside quantifiers, and ``root``."""
    found: dict[int, z3.ExprRef] = {ROOT.get_id(): ROOT}
    seen: set[int] = set()
    todo = list(fs)
    while todo:
        e = todo.pop()
        if e.get_id() in seen or z3.is_quantifier(e) or z3.is_var(e):
            continue
        seen.add(e.get_id())
        if e.sort() in (Page, Handle):
            found[e.get_id()] = e
        todo.extend(e.children())
    out: dict[z3.SortRef, list[z3.ExprRef]] = {Page: [], Handle: []}
    for e in found.values():
        out[e.sort()].append(e)
    return out


def _instances(fact: z3.BoolRef, terms: dict[z3.SortRef, list[z3.ExprRef]]) -> list[z3.BoolRef]:
    """Ground instances of a universal ``fact`` over ``terms`` (none if too many)."""
    if not (z3.is_quantifier(fact) and fact.is_forall()):
        return []
    n = fact.num_vars()
    doms = [terms.get(fact.var_sort(i), []) for i in range(n)]
    total = 1
    for d in doms:
        total *= len(d)
    if total == 0 or total > MAX_INSTANCES:
        return []
    out = []
    for combo in itertools.product(*doms):
        out.append(z3.substitute_vars(fact.body(), *reversed(combo)))
    return out


def _skolem(part: z3.BoolRef) -> z3.BoolRef:
    """``part`` with its outer universal variables replaced by fresh constants."""
    if not (z3.is_quantifier(part) and part.is_forall()):
        return part
    sks = [z3.FreshConst(part.var_sort(i), "sk") for i in range(part.num_vars())]
    return z3.substitute_vars(part.body(), *reversed(sks))


def check(
    hyp: list[z3.BoolRef], target: z3.BoolRef, timeout_ms: int = 20_000, seeds: tuple[int, ...] = SEEDS
) -> z3.CheckSatResult:
    """``unsat``: ``hyp`` implies ``target``, conjunct by conjunct, trying the seeds in turn.

    Each conjunct's universal variables are skolemized, and the hypothesis's
    universal facts are also given as ground instances over the page and
    handle terms of the query (instances of true facts: sound hints that
    spare z3's instantiation heuristics the search; the quantified facts stay)."""
    facts = [c for h in hyp for c in conjuncts(h)]
    for part in conjuncts(target):
        ground = _skolem(part)
        terms = _ground_terms([ground, *(f for f in facts if not z3.is_quantifier(f))])
        inst = [i for f in facts for i in _instances(f, terms)]
        verdict = z3.unknown
        for seed in seeds:
            s = _solver(timeout_ms, seed)
            s.add(*facts, *inst, z3.Not(ground))
            r = solving.check(s, timeout_ms=timeout_ms, seeds=()).result  # the seeds are this loop's
            if r != z3.unknown:
                verdict = r
                break
        if verdict != z3.unsat:
            return verdict
    return z3.unsat


def check_step(pid: str, step: URStep, timeout_ms: int = 20_000, seeds: tuple[int, ...] = SEEDS) -> z3.CheckSatResult:
    """``unsat``: the step preserves ``pid`` from every state satisfying the invariants."""
    return check([*hypothesis(step.pre), *step.requires], goal(pid, step), timeout_ms, seeds)


def prove_radix_unbounded(
    tw: Tweaks = frozenset(),
    timeout_ms: int = 20_000,
    only: list[str] | None = None,
    steps: list[str] | None = None,
    seeds: tuple[int, ...] = SEEDS,
    on_result: Callable[[URProof], None] | None = None,
) -> list[URProof]:
    """Every INV-RADIX-* (and the lemma): true in the empty cache, preserved by every step."""
    ids = only or [*INVARIANTS, LEMMA_ID]
    out = []
    for pid in ids:
        t0 = time.perf_counter()
        failed: list[str] = []
        unknown: list[str] = []
        if pid == LEMMA_ID:
            S = UR.fresh("pre_")
            r = check([*hypothesis(S), *census_facts(S, subsets=True)], lemma_lock_path(S), timeout_ms)
            (failed if r == z3.sat else unknown if r == z3.unknown else []).append("the invariants")
        else:
            cap = z3.Int("cap0")
            if check([cap >= 0], INVARIANTS[pid](UR.initial(cap)), timeout_ms) != z3.unsat:
                failed.append("initial state")
            for name, make in STEPS.items():
                if steps is not None and name not in steps:
                    continue
                r = check_step(pid, make(UR.fresh("pre_"), tw), timeout_ms, seeds)
                if r == z3.sat:
                    failed.append(name)
                elif r == z3.unknown:
                    unknown.append(name)
        verdict = "refuted" if failed else ("unknown" if unknown else "proven")
        res = URProof(pid, verdict, time.perf_counter() - t0, failed + [f"{u} (unknown)" for u in unknown])
        if on_result:
            on_result(res)
        out.append(res)
    return out
