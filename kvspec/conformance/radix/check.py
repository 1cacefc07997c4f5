"""Checking a radix cache step by step against the model (profile ``radix``).

``RadixLockstep`` sends each operation to the implementation and to the
model (``reference.radix``) and compares, in this order, naming the rule of
the first difference:

1. the value or the error (RADIX-MATCH for a match or lock, RADIX-PREFIX-HIT
   for a request, RADIX-INSERT, RADIX-EVICT-LRU, the error's own rule);
2. the events through the router view (set counting, strict): EVENT-ID,
   STORE-NO-DUP, PARENT-ANCHOR, REMOVE-EXACT, REMOVE-NO-ORPHAN (a radix
   cache evicts leaves only, so it never orphans a stored page);
3. the events exactly against the model's: a match or lock that publishes
   anything breaks RADIX-SPLIT-SILENT; a Stored that differs RADIX-INSERT
   (HASH-LOCAL / HASH-SEQUENCE when only its hashes differ); a Removed that
   names a page of a locked node RADIX-LOCKED-KEPT; otherwise, read against
   the pages the implementation's own tree dropped in the op: a Removed that
   names exactly those evicted the wrong leaves (RADIX-EVICT-LRU), one that
   names fewer or other pages misreports its eviction (RADIX-REMOVE); a
   Cleared RADIX-RESET;
4. the state: the tree (shape, tokens, lock counts), the sizes, the free
   slots and the held locks.

Traffic: ``radix_configs`` (small pools, so that requests evict) and two
generators. ``radix_ops`` draws operations blind (tokens from a three-letter
alphabet so that prefixes collide, two lock names). ``radix_op_for`` draws
each operation from the model's state as the run goes (``drive``, what the
lockstep test runs): keys that are a cached path, a cut inside one (a split,
of a locked node too), one extended, or one that diverges inside a page;
locks on exactly a cached leaf; evictions sized to the evictable pages and
beyond while locks are held. Blind traffic misses bugs that need such a
sequence (a split of a locked node, a locked leaf left evictable). One move
in ten (``touch_then_evict``) is a walk that refreshes an old leaf and then
an eviction of one token: without it, a walk that does not refresh the
access time survived about half the seeded runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from kvspec.conformance.radix.interface import RadixImplementation
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference.radix import RadixModel
from kvspec.reference.router_view import RouterView
from kvspec.spec.deviations import Site
from kvspec.spec.hashing import local_block_hash, sequence_hash
from kvspec.spec.radix_wire import (
    RADIX_OP_ADAPTER,
    ExpectedEvent,
    ExpectedNode,
    RadixConfig,
    RadixExpect,
    RadixNode,
    RadixOp,
    RadixOutcome,
    RadixScenario,
)
from kvspec.spec.registry import RADIX
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Removed, Stored

R = RuleId

#: the rule a wrong value of each operation breaks
_VALUE_RULE = {
    "match": R.RADIX_MATCH,
    "lock": R.RADIX_MATCH,
    "insert": R.RADIX_INSERT,
    "evict": R.RADIX_EVICT_LRU,
    "request": R.RADIX_PREFIX_HIT,
    "unlock": R.RADIX_LOCK,
    "reset": R.RADIX_RESET,
}
#: the rule a wrong tree after each operation breaks
_TREE_RULE = {
    "match": R.RADIX_MATCH,
    "lock": R.RADIX_LOCK,
    "unlock": R.RADIX_LOCK,
    "insert": R.RADIX_INSERT,
    "evict": R.RADIX_EVICT_LRU,
    "request": R.RADIX_INSERT,
    "reset": R.RADIX_RESET,
}


def _fail(rule: RuleId, op: RadixOp, message: str) -> ConformanceFailure:
    return ConformanceFailure(rule, message, site=Site(rule, operation=op.op, profile=RADIX))


def _same(a: KvEvent, b: KvEvent) -> bool:
    return a.model_dump() == b.model_dump()


def _locked_hashes(model: RadixModel) -> set[int]:
    return {s for n in model.nodes() if n.lock_ref > 0 for s, _ in n.pages}


def _node_hashes(model: RadixModel) -> list[set[int]]:
    return [{s for s, _ in n.pages} for n in model.nodes()]


def tree_hashes(tree: Sequence[RadixNode], page: int, parent: int | None = None) -> set[int]:
    """The sequence hash of every page a snapshot's tree holds (HASH-SEQUENCE
    chained along each path; a node cut inside a page hashes the part)."""
    out: set[int] = set()
    for n in tree:
        prev = parent
        for i in range(0, len(n.tokens), page):
            prev = sequence_hash(prev, local_block_hash(list(n.tokens[i : i + page])))
            out.add(prev)
        out |= tree_hashes(n.children, page, prev)
    return out


def check_events(
    op: RadixOp,
    got: Sequence[KvEvent],
    want: Sequence[KvEvent],
    locked: set[int],
    nodes: list[set[int]],
    after: set[int],
    held_after: set[int] | None = None,
) -> None:
    """The events exactly as the model's (rules in the module docstring); ``locked``
    and ``nodes`` are the model's locked page hashes and pages per node before the
    op, ``after`` the pages the model holds after it, ``held_after`` those the
    implementation's tree holds after it (None: unknown; a Removed that names only
    part of a node the model held before the op is then RADIX-REMOVE, though a
    request's own split may have cut that node)."""
    if op.op in ("match", "lock", "unlock") and got:
        rule = R.RADIX_SPLIT_SILENT if op.op != "unlock" else R.RADIX_LOCK
        raise _fail(rule, op, f"{op.op} published {[e.brief() for e in got]}; it publishes nothing")
    if len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True)):
        return
    # they differ: a request may evict a page and store it again, so this is only a diagnosis
    before = set().union(*nodes) if nodes else set()
    stored = {h for e in got if e.kind == "stored" for h in e.hashes()}
    removed = {h for e in got if e.kind == "removed" for h in e.hashes()}
    # a page cached before and after the op, announced again (a split republished)
    again = ((stored & before) | (stored & removed)) & after
    if again and op.op != "reset":
        raise _fail(
            R.RADIX_SPLIT_SILENT,
            op,
            f"{[e.brief() for e in got]} announce {len(again)} page(s) the {op.op} left cached and unchanged",
        )
    for i in range(max(len(got), len(want))):
        g = got[i] if i < len(got) else None
        w = want[i] if i < len(want) else None
        if g is not None and w is not None and _same(g, w):
            continue
        show = f"event {i}: got {g.brief() if g else 'nothing'}, expected {w.brief() if w else 'nothing'}"
        first = w if w is not None else g
        assert first is not None
        if first.kind == "cleared" or (g is not None and g.kind == "cleared"):
            raise _fail(R.RADIX_RESET, op, show)
        if isinstance(first.data, Stored):
            if g is not None and w is not None and isinstance(g.data, Stored) and isinstance(w.data, Stored):
                gs, ws = g.data.stored, w.data.stored
                if (
                    g.block_token_ids == w.block_token_ids
                    and gs.blocks == ws.blocks
                    and gs.parent_hash != ws.parent_hash
                ):
                    raise _fail(R.PARENT_ANCHOR, op, f"{show}; the parent is not the page before the first one")
                if g.block_token_ids == w.block_token_ids and gs.parent_hash == ws.parent_hash:
                    for b, toks in zip(gs.blocks, g.block_token_ids or [], strict=False):
                        if b.tokens_hash != local_block_hash(toks):
                            raise _fail(R.HASH_LOCAL, op, f"{show}; tokens_hash of {toks} is not their local hash")
                    prev = gs.parent_hash
                    for b in gs.blocks:
                        if sequence_hash(prev, b.tokens_hash) != b.block_hash:
                            raise _fail(R.HASH_SEQUENCE, op, f"{show}; block_hash does not chain from its parent")
                        prev = b.block_hash
            raise _fail(R.RADIX_INSERT, op, show)
        g_hashes = g.hashes() if g is not None and isinstance(g.data, Removed) else []
        w_hashes = w.hashes() if w is not None and isinstance(w.data, Removed) else []
        if set(g_hashes) & locked:
            raise _fail(R.RADIX_LOCKED_KEPT, op, f"{show}; it removes a page of a locked node")
        del w_hashes
        if held_after is not None:
            # the implementation's own tree says which pages it dropped: a Removed
            # that names exactly those evicted the wrong leaves (RADIX-EVICT-LRU);
            # one that names other pages misreports its eviction (RADIX-REMOVE)
            dropped = before - held_after
            if dropped <= removed <= before | stored:
                raise _fail(R.RADIX_EVICT_LRU, op, f"{show}; it evicts other leaves than the least recently used")
            raise _fail(
                R.RADIX_REMOVE,
                op,
                f"{show}; its Removed names {len(removed)} page(s), its tree dropped {len(dropped)} of them or others",
            )
        partial = [n for n in nodes if n & set(g_hashes) and not n <= set(g_hashes)]
        if partial:
            raise _fail(R.RADIX_REMOVE, op, f"{show}; it names only part of an evicted node's pages")
        raise _fail(R.RADIX_EVICT_LRU, op, show)


def _tree_text(nodes: Sequence[RadixNode], indent: int = 0) -> str:
    out = []
    for n in nodes:
        out.append(f"{' ' * indent}{n.tokens} ref={n.lock_ref}")
        out.append(_tree_text(n.children, indent + 2))
    return "\n".join(x for x in out if x)


def check_state(op: RadixOp, got: RadixOutcome, want: RadixOutcome) -> None:
    g, w = got.state, want.state
    if [n.model_dump() for n in g.tree] != [n.model_dump() for n in w.tree]:
        rule = _TREE_RULE[op.op]
        gl = [_strip_refs(n) for n in g.tree]
        wl = [_strip_refs(n) for n in w.tree]
        if gl == wl and op.op not in ("lock", "unlock"):
            rule = R.RADIX_LOCK  # same shape, other lock counts
        if op.op == "evict" and _contains_locked_loss(w.tree, g.tree):
            rule = R.RADIX_LOCKED_KEPT
        raise _fail(
            rule, op, f"the tree after {op.op} differs:\ngot:\n{_tree_text(g.tree)}\nexpected:\n{_tree_text(w.tree)}"
        )
    if (g.evictable, g.protected) != (w.evictable, w.protected):
        raise _fail(
            R.RADIX_LOCK,
            op,
            f"evictable/protected sizes {g.evictable}/{g.protected}, expected {w.evictable}/{w.protected}",
        )
    if g.locks != w.locks:
        raise _fail(R.RADIX_LOCK, op, f"held locks {g.locks}, expected {w.locks}")
    if g.free != w.free:
        raise _fail(R.RADIX_CAPACITY, op, f"{g.free} free slots, expected {w.free}")


def _strip_refs(n: RadixNode) -> Any:
    return (tuple(n.tokens), tuple(_strip_refs(c) for c in n.children))


def _paths(nodes: Sequence[RadixNode], prefix: tuple[int, ...] = ()) -> dict[tuple[int, ...], int]:
    out: dict[tuple[int, ...], int] = {}
    for n in nodes:
        p = prefix + tuple(n.tokens)
        out[p] = n.lock_ref
        out.update(_paths(n.children, p))
    return out


def _contains_locked_loss(want: Sequence[RadixNode], got: Sequence[RadixNode]) -> bool:
    """Does ``got`` miss a locked path the expected tree keeps?"""
    gp = _paths(got)
    covered = {p[:i] for p in gp for i in range(len(p) + 1)}
    return any(ref > 0 and p not in covered for p, ref in _paths(want).items())


@dataclass
class RadixLockstep:
    """One implementation and its model, driven together."""

    impl: RadixImplementation
    config: RadixConfig
    model: RadixModel = field(init=False)
    view: RouterView = field(init=False)
    log: list[str] = field(default_factory=list)
    #: page tokens of every hash the implementation stored (for golden expectations)
    pages: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model = RadixModel(self.config)
        self.view = RouterView(mode="set", strict=True)

    def step(self, op: RadixOp) -> RadixOutcome:
        got = self.impl.step(op)
        self.log.append(op.model_dump_json())
        try:
            locked, nodes = _locked_hashes(self.model), _node_hashes(self.model)
            want = self.model.step(op)
            self._check(op, got, want, locked, nodes)
        except ConformanceFailure as e:
            trail = "\n".join(f"  {i + 1:>3}. {line}" for i, line in enumerate(self.log[-40:]))
            raise ConformanceFailure(e.rule, f"{e.report}\noperations (last 40):\n{trail}", site=e.site) from None
        for ev in got.events:
            if isinstance(ev.data, Stored) and ev.block_token_ids is not None:
                for b, toks in zip(ev.data.stored.blocks, ev.block_token_ids, strict=True):
                    self.pages[b.block_hash] = tuple(toks)
        return got

    def _check(self, op: RadixOp, got: RadixOutcome, want: RadixOutcome, locked: set[int], nodes: Any) -> None:
        if (got.error is None) != (want.error is None) or (
            got.error is not None and want.error is not None and got.error.rule != want.error.rule
        ):
            w = want.error.rule if want.error else None
            g = got.error.rule if got.error else None
            known = {r.value for r in RuleId}
            rule = RuleId(w) if w else (RuleId(g) if g is not None and g in known else R.RADIX_VALIDATE)
            raise _fail(rule, op, f"{op.op}: error {got.error}, expected {want.error} (value {want.value})")
        # a request's value is its hit: checked first; another op's value follows from its events
        if op.op == "request" and got.value != want.value:
            raise _fail(_VALUE_RULE[op.op], op, f"{op.op} returned {got.value}, expected {want.value}")
        for v in self.view.apply_batch(got.events):
            raise _fail(v.rule, op, f"the stream: {v}")
        after = {s for n in self.model.nodes() for s, _ in n.pages}
        held = tree_hashes(got.state.tree, self.config.page_size)
        check_events(op, got.events, want.events, locked, nodes, after, held)
        if got.value != want.value:
            raise _fail(_VALUE_RULE[op.op], op, f"{op.op} returned {got.value}, expected {want.value}")
        check_state(op, got, want)


# ----------------------------------------------------------------- goldens


def _expected_event_text(e: ExpectedEvent) -> str:
    return e.model_dump_json(exclude_defaults=True)


def check_expect(ls: RadixLockstep, op: RadixOp, got: RadixOutcome, expect: RadixExpect) -> None:
    """A golden step's hand-written expectation (keys left out are not checked)."""
    rules = {"match": R.RADIX_MATCH, "request": R.RADIX_PREFIX_HIT}
    if expect.error is not None:
        if got.error is None or got.error.rule != expect.error:
            raise _fail(expect.error, op, f"expected rejection under {expect.error}, got {got.error or got.value}")
    elif got.error is not None:
        raise _fail(RuleId(got.error.rule), op, f"unexpected rejection: {got.error.message}")
    if expect.value is not None and got.value != expect.value:
        raise _fail(rules.get(op.op, _VALUE_RULE[op.op]), op, f"value {got.value}, expected {expect.value}")
    if expect.events is not None:
        actual = [_as_expected(ls, e) for e in got.events]
        if [_expected_event_text(e) for e in actual] != [_expected_event_text(e) for e in expect.events]:
            raise _fail(
                _TREE_RULE[op.op] if op.op != "match" else R.RADIX_SPLIT_SILENT,
                op,
                f"events {[_expected_event_text(e) for e in actual]}, "
                f"expected {[_expected_event_text(e) for e in expect.events]}",
            )
    if expect.tree is not None:
        want = [_as_node(n) for n in expect.tree]
        if [n.model_dump() for n in got.state.tree] != [n.model_dump() for n in want]:
            raise _fail(
                _TREE_RULE[op.op],
                op,
                f"tree\n{_tree_text(got.state.tree)}\nexpected\n{_tree_text(want)}",
            )
    for key, rule in (("evictable", R.RADIX_LOCK), ("protected", R.RADIX_LOCK), ("free", R.RADIX_CAPACITY)):
        w = getattr(expect, key)
        if w is not None and getattr(got.state, key) != w:
            raise _fail(rule, op, f"{key} {getattr(got.state, key)}, expected {w}")


def _as_node(n: ExpectedNode) -> RadixNode:
    return RadixNode(tokens=n.tokens, lock_ref=n.lock_ref, children=[_as_node(c) for c in n.children])


def _as_expected(ls: RadixLockstep, ev: KvEvent) -> ExpectedEvent:
    if isinstance(ev.data, Stored):
        parent = ev.data.stored.parent_hash
        return ExpectedEvent(
            kind="stored",
            pages=[list(t) for t in ev.block_token_ids or []],
            parent=None if parent is None else list(ls.pages.get(parent, (-1,))),
        )
    if isinstance(ev.data, Removed):
        return ExpectedEvent(kind="removed", pages=[list(ls.pages.get(h, (-1,))) for h in ev.hashes()])
    return ExpectedEvent(kind="cleared")


def run_golden(scenario: RadixScenario, impl: RadixImplementation) -> None:
    """Every step against its ``expect`` and, in lockstep, against the model."""
    ls = RadixLockstep(impl, scenario.config)
    for i, s in enumerate(scenario.steps):
        # the page tokens of what this step removes are known from earlier steps
        out = ls.step(s.op)
        try:
            check_expect(ls, s.op, out, s.expect)
        except ConformanceFailure as e:
            site = Site(e.rule, scenario=f"{RADIX}/{scenario.name}", operation=s.op.op, profile=RADIX)
            raise ConformanceFailure(e.rule, f"{scenario.name} step {i + 1}: {e.report}", site=site) from None


# ----------------------------------------------------------------- traffic

LOCK_NAMES = ("a", "b")


def radix_configs() -> st.SearchStrategy[RadixConfig]:
    """Small pools (requests evict); page size 1 in half the configs (a split
    of a locked node is drawn most often there; a fifth killed fewer of those
    variants, ``benchmarks/radix_traffic_kills.py``)."""
    return st.builds(RadixConfig, page_size=st.sampled_from((1, 1, 2, 3)), capacity=st.integers(6, 24))


#: a few sequences whose prefixes the traffic draws, so that keys share long
#: prefixes, stop inside nodes (splits) and come back to locked paths
BASES = ((1, 2, 3, 1, 2, 3, 1, 2, 3), (1, 2, 1, 2, 3, 3, 1, 1, 2), (2, 3, 1, 2, 3, 1, 1, 1, 1), (1, 2, 3, 3, 2, 1))


def _tokens(max_size: int = 9) -> st.SearchStrategy[list[int]]:
    prefix = st.tuples(st.sampled_from(BASES), st.integers(0, max_size)).map(lambda t: list(t[0][: t[1]]))
    return prefix | prefix | st.lists(st.sampled_from((1, 2, 3)), max_size=max_size)


def radix_ops() -> st.SearchStrategy[dict[str, Any]]:
    name = st.sampled_from(LOCK_NAMES)
    return st.one_of(
        st.fixed_dictionaries({"op": st.just("match"), "tokens": _tokens()}),
        st.fixed_dictionaries({"op": st.just("insert"), "tokens": _tokens()}),
        st.fixed_dictionaries({"op": st.just("lock"), "name": name, "tokens": _tokens()}),
        st.fixed_dictionaries({"op": st.just("unlock"), "name": name}),
        st.fixed_dictionaries({"op": st.just("evict"), "tokens": st.integers(0, 8)}),
        st.fixed_dictionaries({"op": st.just("reset")}),
        st.fixed_dictionaries(
            {
                "op": st.just("request"),
                "prompt": _tokens().filter(bool),
                "output": st.lists(st.sampled_from((4, 5)), min_size=1, max_size=4),
            }
        ),
    ) | st.fixed_dictionaries(
        {
            "op": st.just("request"),
            "prompt": st.lists(st.sampled_from((1, 2, 3)), min_size=1, max_size=9),
            "output": st.lists(st.sampled_from((4, 5)), min_size=1, max_size=4),
        }
    )


# ------------------------------------------------- traffic from the model's state

#: operation kinds, repeated for weight (the first ones are what shrinking keeps)
_KINDS = (
    "insert",
    "insert",
    "insert",
    "lock",
    "lock",
    "match",
    "unlock",
    "evict",
    "evict",
    "request",
    "request",
    "reset",
)


def cached_paths(model: RadixModel) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The path (tokens from the root) to the end of every node, of the locked
    nodes and of the leaves, each sorted (a replay draws the same ops)."""
    paths: dict[int, tuple[int, ...]] = {}
    out: list[tuple[int, ...]] = []
    locked: list[tuple[int, ...]] = []
    leaves: list[tuple[int, ...]] = []
    for n in model.nodes():  # parents before children
        assert n.parent is not None
        p = paths.get(id(n.parent), ()) + tuple(n.tokens)
        paths[id(n)] = p
        out.append(p)
        if n.lock_ref > 0:
            locked.append(p)
        if not n.children:
            leaves.append(p)
    return sorted(out), sorted(locked), sorted(leaves)


@st.composite
def _near(draw: st.DrawFn, paths: Sequence[tuple[int, ...]], page: int) -> list[int]:
    """A key related to one of ``paths``: the whole path, a cut inside it (a
    split), the path and more tokens, or a key that leaves it at some token,
    inside a page or at its start (a split at the last whole page)."""
    path = list(draw(st.sampled_from(paths)))
    how = draw(st.sampled_from(("exact", "cut", "extend", "diverge")))
    tail = draw(st.lists(st.sampled_from((1, 2, 3)), max_size=2 * page + 1))
    if how == "exact":
        return path
    if how == "extend":
        return [*path, draw(st.sampled_from((1, 2, 3))), *tail]
    at = draw(st.integers(1 if how == "cut" else 0, len(path) - 1)) if len(path) > 1 else 0
    if how == "cut":
        return path[:at] + (tail if draw(st.booleans()) else [])
    other = draw(st.sampled_from([t for t in (1, 2, 3, 4) if t != path[at]]))
    return [*path[:at], other, *tail]


def _keys(model: RadixModel, *, lock: bool = False) -> st.SearchStrategy[list[int]]:
    """Keys for the next operation: near a cached path, a locked one (a split
    of a locked node), a leaf (a lock on exactly a leaf: ``lock``), or blind."""
    paths, locked, leaves = cached_paths(model)
    page = model.config.page_size
    choices = [_tokens()]
    if paths:
        choices = [_near(paths, page), _near(paths, page), *choices]
    if locked:
        choices = [_near(locked, page), *choices]
    if lock and leaves:
        choices = [st.sampled_from(leaves).map(list), *choices]
    return st.one_of(choices)


def radix_op_for(model: RadixModel) -> st.SearchStrategy[dict[str, Any]]:
    """One operation drawn from ``model``'s current state (what it caches and
    locks, how much is evictable, which lock names are held)."""
    held = sorted(model.locks)
    free_names = [n for n in LOCK_NAMES if n not in model.locks]
    names = st.sampled_from(free_names) if free_names else st.sampled_from(LOCK_NAMES)
    evictable, capacity = model.evictable_size(), model.config.capacity
    # beyond what is evictable while a lock is held: a locked leaf must stay
    beyond = st.sampled_from(sorted({evictable + 1, capacity}))
    amount = st.sampled_from(sorted({1, evictable, evictable + 1, capacity})) | st.integers(0, capacity)
    if held:
        amount = beyond | amount
    output = st.lists(st.sampled_from((4, 5)), min_size=1, max_size=4)
    keys = _keys(model)

    def op(kind: str) -> st.SearchStrategy[dict[str, Any]]:
        if kind in ("insert", "match"):
            return st.fixed_dictionaries({"op": st.just(kind), "tokens": keys})
        if kind == "lock":
            return st.fixed_dictionaries({"op": st.just("lock"), "name": names, "tokens": _keys(model, lock=True)})
        if kind == "unlock":
            who = st.sampled_from(held) if held else st.sampled_from(LOCK_NAMES)
            return st.fixed_dictionaries({"op": st.just("unlock"), "name": who})
        if kind == "evict":
            return st.fixed_dictionaries({"op": st.just("evict"), "tokens": amount})
        if kind == "reset":
            return st.just({"op": "reset"})
        prompt = keys.map(lambda k: k or [1])
        return st.fixed_dictionaries({"op": st.just("request"), "prompt": prompt, "output": output})

    return st.sampled_from(_KINDS).flatmap(op)


def leaves_by_access(model: RadixModel) -> list[tuple[int, ...]]:
    """The path of every unlocked leaf, least recently accessed first (the
    order the model evicts them in, RADIX-EVICT-LRU)."""
    paths: dict[int, tuple[int, ...]] = {}
    leaves: list[tuple[int, tuple[int, ...]]] = []
    for n in model.nodes():  # parents before children
        assert n.parent is not None
        p = paths.get(id(n.parent), ()) + tuple(n.tokens)
        paths[id(n)] = p
        if not n.children and n.lock_ref == 0:
            leaves.append((n.last_access, p))
    return [p for _, p in sorted(leaves)]


def _touch(model: RadixModel, key: st.SearchStrategy[list[int]]) -> st.SearchStrategy[list[dict[str, Any]]]:
    """A walk down ``key`` that refreshes its nodes: a match, or a lock and its unlock."""
    walks = [key.map(lambda k: [{"op": "match", "tokens": k}])]
    free_names = [n for n in LOCK_NAMES if n not in model.locks]
    if free_names:
        walks.append(
            st.tuples(st.sampled_from(free_names), key).map(
                lambda t: [{"op": "lock", "name": t[0], "tokens": t[1]}, {"op": "unlock", "name": t[0]}]
            )
        )
    return st.one_of(walks)


#: the first token of the leaves ``touch_then_evict`` builds (outside the traffic's alphabet: always new)
FRESH = 6


def _fresh_leaves(model: RadixModel) -> list[dict[str, Any]] | None:
    """Operations that leave exactly two unlocked leaves, the older first: evict
    every unlocked page, insert ``A`` (two pages), then a key that shares its
    first page and leaves it at the last token of its second (a split at the
    page boundary, RADIX-MATCH: a cache that counts the shared prefix in tokens
    splits inside the page; ``A``'s leaf hangs below another node), or, in a
    pool too small for that, a key of its own. None: the locked pages leave no
    room for two leaves."""
    page = model.config.page_size
    room = model.free + model.evictable_size()
    first = [FRESH] * page
    if room >= 4 * page:  # an insert needs free slots for its whole key, cached or not
        a, b = [*first, *[1] * page], [*first, *[1] * (page - 1), 2]
    elif room >= 2 * page:
        a, b = first, [FRESH + 1] * page
    else:
        return None
    clear = [{"op": "evict", "tokens": model.evictable_size()}] if model.evictable_size() else []
    return [*clear, {"op": "insert", "tokens": a}, {"op": "insert", "tokens": b}]


def touch_then_evict(model: RadixModel) -> st.SearchStrategy[list[dict[str, Any]]]:
    """A walk that refreshes an old unlocked leaf (a match, or a lock and its
    unlock), then an eviction of one token: the model now evicts another leaf,
    so a cache whose walk does not refresh the access time (or that orders by
    creation) evicts the touched one (RADIX-EVICT-LRU), and the unlock of a leaf
    below another node checks that the lock leaves its ancestors (RADIX-LOCK).
    The leaf is one of the two least recently used, or, when fewer than two
    leaves are unlocked, the older of two fresh ones (``_fresh_leaves``, which
    evicts every unlocked page first: drawn whenever possible it cleared the
    locked traffic other variants need). Random traffic rarely draws such a
    sequence."""
    evict = {"op": "evict", "tokens": 1}
    forms: list[st.SearchStrategy[list[dict[str, Any]]]] = []
    old = leaves_by_access(model)[:2]
    if len(old) == 2:
        forms.append(_touch(model, st.sampled_from(old).map(list)).map(lambda ops: [*ops, evict]))
    setup = _fresh_leaves(model)
    if setup is not None and len(old) < 2:
        a = setup[-2]["tokens"]
        forms.append(_touch(model, st.just(a)).map(lambda ops: [*setup, *ops, evict]))
    if not forms:
        return radix_op_for(model).map(lambda o: [o])
    return st.one_of(forms)


#: one move in ten is a touch then an eviction (``touch_then_evict``): one in six
#: displaced enough locked traffic that locked-split variants escaped 3 to 6 seeds in 10
_MOVES = ("op",) * 9 + ("touch",)


def radix_move_for(model: RadixModel) -> st.SearchStrategy[list[dict[str, Any]]]:
    """The next operations drawn from ``model``'s state: one (``radix_op_for``)
    or a touch of an old leaf and an eviction (``touch_then_evict``)."""
    return st.sampled_from(_MOVES).flatmap(
        lambda m: radix_op_for(model).map(lambda o: [o]) if m == "op" else touch_then_evict(model)
    )


def drive(data: st.DataObject, ls: RadixLockstep, max_steps: int) -> None:
    """8 to ``max_steps`` operations (fewer leave no room for a lock, a split
    and an eviction past it; a move of several may end past it), each move
    drawn from the model's state after the previous one (``radix_move_for``)
    and stepped in lockstep (Hypothesis prints each draw of a failing run: a
    short replay once shrunk)."""
    count = data.draw(st.integers(min(8, max_steps), max(1, max_steps)), label="operations")
    done = 0
    while done < count:
        for raw in data.draw(radix_move_for(ls.model), label=f"op {done + 1}"):
            ls.step(RADIX_OP_ADAPTER.validate_python(raw))
            done += 1
