"""The reference model of the ``radix`` profile: a radix-tree prefix cache.

Written from the behaviour of SGLang's ``RadixCache``
(``sgl-project/sglang`` ``python/sglang/srt/mem_cache/radix_cache.py``:
``RadixCache.match_prefix``, ``insert``, ``inc_lock_ref`` / ``dec_lock_ref``,
``evict``, ``reset``, ``_split_node``) and of its event recorder
(``python/sglang/srt/mem_cache/events.py``, ``KVCacheEventRecorder``), as
SPEC.md "Radix prefix cache" states it; none of its code.

The tree holds runs of whole pages; the root holds nothing and is always
locked. What the model keeps per node: its tokens, its children (keyed by
their first page), a lock count, the logical time of its last access, and
the kvspec hashes of its pages (``spec.hashing``: HASH-LOCAL over the
page's tokens, HASH-SEQUENCE chained from the page before it on the path).

Time is logical: every operation that walks the tree takes one tick for
the nodes it passes, and every node it creates (a split's upper half, a new
leaf) takes a later tick of its own, in creation order, the order in which
SGLang reads its clock. Two leaves never share a tick (they would be on one
path), so the eviction order is total.

Every operation either applies or is rejected with its rule and changes
nothing, with one documented exception: a request refused for capacity
(RADIX-CAPACITY) keeps the split and the access times of its match.

The model is a transition table (``reference.transitions``): per operation,
the rules in the order they are tried, each with its guard (which reads the
state) and its effect (which changes it and returns the operation's value;
the events it publishes go to the step's list). A rejection is a transition
whose effect returns the error; a transition names, after its deciding rule,
the rules its effect applies on the way (a request matches, locks, evicts and
inserts). Guards and effects are named by method, so a variant (the mutant
zoo's, ``reference.radix_flow``) overrides one method and keeps the table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvspec.reference.transitions import Transition, TransitionModel, always
from kvspec.spec.hashing import local_block_hash, sequence_hash
from kvspec.spec.manager_wire import OpError
from kvspec.spec.radix_wire import (
    RadixConfig,
    RadixEvict,
    RadixInsert,
    RadixLock,
    RadixMatch,
    RadixNode,
    RadixOp,
    RadixOutcome,
    RadixRequest,
    RadixReset,
    RadixSnapshot,
    RadixUnlock,
)
from kvspec.spec.wire import KvEvent, make_cleared, make_removed, make_stored


@dataclass(eq=False)
class RadixTreeNode:
    """One node: its own tokens (whole pages) and the hashes of its pages."""

    tokens: list[int]
    parent: RadixTreeNode | None
    #: (sequence hash, local hash) of each page, in order
    pages: list[tuple[int, int]] = field(default_factory=list)
    children: dict[tuple[int, ...], RadixTreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0

    def last_hash(self) -> int | None:
        """The sequence hash a child's first page chains from (None: the root)."""
        return self.pages[-1][0] if self.pages else None


def _reject(rule: str, message: Callable[[RadixModel, Any], str]) -> Callable[[RadixModel, Any], OpError]:
    """The effect of a rejection: nothing changes, the error names the rule."""
    return lambda m, op: OpError(rule=rule, message=message(m, op))


class RadixModel(TransitionModel[RadixOutcome]):
    """The radix profile as a pure, deterministic state machine (module docstring)."""

    def __init__(self, config: RadixConfig) -> None:
        self.config = config
        self.page = config.page_size
        self.clock = 0
        self.next_event_id = 0
        self.free = config.capacity
        self.root = self._new_root()
        self.locks: dict[str, RadixTreeNode] = {}
        #: the events of the step being applied
        self._events: list[KvEvent] = []

    # ----------------------------------------------------------- helpers
    @staticmethod
    def _new_root() -> RadixTreeNode:
        return RadixTreeNode(tokens=[], parent=None, lock_ref=1)

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _aligned(self, tokens: list[int]) -> list[int]:
        return tokens[: len(tokens) // self.page * self.page]

    def _child_key(self, tokens: list[int], pos: int) -> tuple[int, ...]:
        return tuple(tokens[pos : pos + self.page])

    def _common(self, node_tokens: list[int], key: list[int], pos: int) -> int:
        """Tokens ``node_tokens`` shares with ``key[pos:]``, rounded down to whole pages."""
        n = 0
        limit = min(len(node_tokens), len(key) - pos)
        while n < limit and node_tokens[n] == key[pos + n]:
            n += 1
        return n // self.page * self.page

    def _hash_pages(self, parent: int | None, tokens: list[int]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for start in range(0, len(tokens), self.page):
            local = local_block_hash(tokens[start : start + self.page])
            parent = sequence_hash(parent, local)
            out.append((parent, local))
        return out

    def nodes(self) -> Iterator[RadixTreeNode]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def path_len(self, node: RadixTreeNode) -> int:
        n = 0
        while node.parent is not None:
            n += len(node.tokens)
            node = node.parent
        return n

    def _emit_stored(self, node: RadixTreeNode, events: list[KvEvent]) -> None:
        assert node.parent is not None
        pages = [node.tokens[i : i + self.page] for i in range(0, len(node.tokens), self.page)]
        events.append(
            make_stored(
                self._event_id(),
                [s for s, _ in node.pages],
                [loc for _, loc in node.pages],
                node.parent.last_hash(),
                token_ids=pages,
            )
        )

    def _event_id(self) -> int:
        self.next_event_id += 1
        return self.next_event_id - 1

    # ------------------------------------------------------ tree operations
    def _split(self, child: RadixTreeNode, n: int) -> RadixTreeNode:
        """Split ``child`` after its first ``n`` tokens; returns the new upper node
        (RADIX-MATCH). Publishes nothing (RADIX-SPLIT-SILENT)."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.tokens)
        k = n // self.page
        upper = RadixTreeNode(
            tokens=child.tokens[:n],
            parent=parent,
            pages=child.pages[:k],
            lock_ref=child.lock_ref,
            last_access=self._tick(),
        )
        parent.children[self._child_key(child.tokens, 0)] = upper
        child.tokens, child.pages, child.parent = child.tokens[n:], child.pages[k:], upper
        upper.children[self._child_key(child.tokens, 0)] = child
        return upper

    def _match(self, key: list[int]) -> tuple[int, RadixTreeNode]:
        """Longest cached prefix of the page-aligned ``key``: its length and the
        node it ends at, splitting the node the match ends inside."""
        if not key:
            return 0, self.root
        return self._walk(key)

    def _walk(self, key: list[int]) -> tuple[int, RadixTreeNode]:
        """One clock tick, then down the tree along ``key``, touching every node
        passed and splitting the node the walk ends inside (SGLang's match and
        insert loops stop at the same place)."""
        now = self._tick()
        node, pos = self.root, 0
        node.last_access = now
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            child.last_access = now
            n = self._common(child.tokens, key, pos)
            pos += n
            if n < len(child.tokens):
                node = self._split(child, n)
                break
            node = child
        return pos, node

    def _insert(self, key: list[int], events: list[KvEvent]) -> tuple[int, RadixTreeNode]:
        """Cache the page-aligned ``key``: how much of it was cached, and its last node."""
        pos, node = self._walk(key)
        if pos < len(key):
            rest = key[pos:]
            leaf = RadixTreeNode(
                tokens=rest,
                parent=node,
                pages=self._hash_pages(node.last_hash(), rest),
                last_access=self._tick(),
            )
            node.children[self._child_key(rest, 0)] = leaf
            self._emit_stored(leaf, events)
            node = leaf
        return pos, node

    def _lock(self, node: RadixTreeNode, delta: int) -> None:
        while node.parent is not None:
            node.lock_ref += delta
            node = node.parent

    def evictable_size(self) -> int:
        return sum(len(n.tokens) for n in self.nodes() if n.lock_ref == 0)

    def _evict(self, tokens: int, events: list[KvEvent]) -> int:
        """Evict unlocked leaves, least recently accessed first, until ``tokens``
        tokens are freed or none is left (RADIX-EVICT-LRU, RADIX-LOCKED-KEPT);
        one Removed names every page evicted (RADIX-REMOVE)."""
        evicted = 0
        removed: list[int] = []
        while evicted < tokens:
            leaves = [n for n in self.nodes() if not n.children and n.lock_ref == 0]
            if not leaves:
                break
            victim = min(leaves, key=lambda n: n.last_access)
            assert victim.parent is not None
            del victim.parent.children[self._child_key(victim.tokens, 0)]
            evicted += len(victim.tokens)
            self.free += len(victim.tokens)
            removed.extend(self._removed_pages(victim))
        if removed:
            events.append(make_removed(self._event_id(), removed))
        return evicted

    def _removed_pages(self, node: RadixTreeNode) -> list[int]:
        """The hashes a Removed names for an evicted node: all its pages (RADIX-REMOVE)."""
        return [s for s, _ in node.pages]

    def _hit_key(self, prompt: list[int]) -> list[int]:
        """What a request matches: its prompt but the last token, cut to whole pages."""
        return self._aligned(prompt[:-1])

    def _probe(self, key: list[int]) -> tuple[int, int]:
        """What a match of the page-aligned ``key`` would find, the tree untouched: the
        cached length, and the tokens of unlocked nodes it passes (a lock on the match
        takes them out of the evictable ones)."""
        node, pos, unlocked = self.root, 0, 0
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._common(child.tokens, key, pos)
            pos += n
            if child.lock_ref == 0:
                unlocked += n
            if n < len(child.tokens):
                break
            node = child
        return pos, unlocked

    def _request_need(self, op: RadixRequest, cached: int) -> int:
        """The free slots a request takes beyond its cached prefix: prompt and output but the last token."""
        return len(op.prompt) + len(op.output) - 1 - cached

    # ------------------------------------------------------------ guards
    def insert_does_not_fit(self, op: RadixInsert) -> bool:
        return len(self._aligned(op.tokens)) > self.free

    def lock_held(self, op: RadixLock) -> bool:
        return op.name in self.locks

    def lock_not_held(self, op: RadixUnlock) -> bool:
        return op.name not in self.locks

    def request_does_not_fit(self, op: RadixRequest) -> bool:
        """The request, holding its match, needs more slots than are free or evictable."""
        cached, unlocked = self._probe(self._hit_key(op.prompt))
        return self._request_need(op, cached) > self.free + self.evictable_size() - unlocked

    # ------------------------------------------------------------ effects
    def match(self, op: RadixMatch) -> int:
        return self._match(self._aligned(op.tokens))[0]

    def insert(self, op: RadixInsert) -> int:
        key = self._aligned(op.tokens)
        self.free -= len(key)
        cached, _ = self._insert(key, self._events)
        self.free += cached  # the slots of what was already cached go back
        return cached

    def lock(self, op: RadixLock) -> int:
        n, node = self._match(self._aligned(op.tokens))
        self._lock(node, +1)
        self.locks[op.name] = node
        return n

    def unlock(self, op: RadixUnlock) -> int:
        self._lock(self.locks.pop(op.name), -1)
        return 0

    def evict(self, op: RadixEvict) -> int:
        return self._evict(op.tokens, self._events)

    def reset(self, op: RadixReset) -> int:
        self.root = self._new_root()
        self.locks.clear()
        self.free = self.config.capacity
        self._events.append(make_cleared(self._event_id()))
        return 0

    def refuse_request(self, op: RadixRequest) -> OpError:
        """The request matches and holds its match while it is measured, then gives up:
        the split and the access times of the match stay (module docstring)."""
        cached, node = self._match(self._hit_key(op.prompt))
        self._lock(node, +1)
        self._lock(node, -1)
        message = (
            f"the request needs {self._request_need(op, cached)} slots; "
            f"{self.free} are free and {self.evictable_size()} evictable"
        )
        return OpError(rule="RADIX-CAPACITY", message=message)

    def request(self, op: RadixRequest) -> int:
        """Match the prompt but its last token (RADIX-PREFIX-HIT), lock, take
        slots for the rest (evicting what is missing), insert prompt and output
        but the last output token, free the duplicates and the partial page, unlock."""
        events = self._events
        cached, node = self._match(self._hit_key(op.prompt))
        self._lock(node, +1)
        seq = op.prompt + op.output[:-1]
        need = len(seq) - cached
        if need > self.free:
            self._evict(need - self.free, events)
        self.free -= need
        key = self._aligned(seq)
        prefix, _ = self._insert(key, events)
        self.free += (prefix - cached) + (len(seq) - len(key))
        self._lock(node, -1)
        return cached

    # ------------------------------------------------------------ the table
    TRANSITIONS: ClassVar[Sequence[Transition[Any, Any]]] = (
        Transition("RADIX-MATCH", RadixMatch, always, "match", also=("RADIX-SPLIT-SILENT",)),
        Transition(
            "RADIX-CAPACITY",
            RadixInsert,
            "insert_does_not_fit",
            _reject(
                "RADIX-CAPACITY",
                lambda m, op: (
                    f"insert of {len(m._aligned(op.tokens))} tokens needs as many free slots; {m.free} are free"
                ),
            ),
        ),
        Transition(
            "RADIX-INSERT",
            RadixInsert,
            always,
            "insert",
            also=("RADIX-MATCH", "RADIX-SPLIT-SILENT", "RADIX-CAPACITY"),
        ),
        Transition(
            "RADIX-VALIDATE",
            RadixLock,
            "lock_held",
            _reject("RADIX-VALIDATE", lambda m, op: f"lock {op.name!r} is already held"),
        ),
        Transition("RADIX-LOCK", RadixLock, always, "lock", also=("RADIX-MATCH", "RADIX-SPLIT-SILENT")),
        Transition(
            "RADIX-VALIDATE",
            RadixUnlock,
            "lock_not_held",
            _reject("RADIX-VALIDATE", lambda m, op: f"no lock {op.name!r} is held"),
        ),
        Transition("RADIX-LOCK", RadixUnlock, always, "unlock"),
        Transition("RADIX-EVICT-LRU", RadixEvict, always, "evict", also=("RADIX-LOCKED-KEPT", "RADIX-REMOVE")),
        Transition("RADIX-RESET", RadixReset, always, "reset"),
        Transition(
            "RADIX-CAPACITY",
            RadixRequest,
            "request_does_not_fit",
            "refuse_request",
            also=("RADIX-MATCH", "RADIX-SPLIT-SILENT"),
        ),
        Transition(
            "RADIX-PREFIX-HIT",
            RadixRequest,
            always,
            "request",
            also=(
                "RADIX-MATCH",
                "RADIX-SPLIT-SILENT",
                "RADIX-LOCK",
                "RADIX-EVICT-LRU",
                "RADIX-LOCKED-KEPT",
                "RADIX-REMOVE",
                "RADIX-INSERT",
                "RADIX-CAPACITY",
            ),
        ),
    )

    def step(self, op: RadixOp) -> RadixOutcome:
        """Apply one operation: its value and events, or its error (and no events), then the state."""
        self._events = []
        answer = self.fire(op)
        if isinstance(answer, OpError):
            return RadixOutcome(error=answer, state=self.snapshot())
        return RadixOutcome(value=answer, events=self._events, state=self.snapshot())

    # ------------------------------------------------------------- snapshot
    def _view(self, node: RadixTreeNode) -> RadixNode:
        kids = [self._view(c) for _, c in sorted(node.children.items())]
        return RadixNode.model_construct(tokens=list(node.tokens), lock_ref=node.lock_ref, children=kids)

    def snapshot(self) -> RadixSnapshot:
        protected = sum(len(n.tokens) for n in self.nodes() if n.lock_ref > 0)
        return RadixSnapshot(
            tree=[self._view(c) for _, c in sorted(self.root.children.items())],
            evictable=self.evictable_size(),
            protected=protected,
            free=self.free,
            locks={name: self.path_len(n) for name, n in sorted(self.locks.items())},
        )
