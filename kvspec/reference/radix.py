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

Every operation either applies or raises ``InvalidOperation`` with its rule
and changes nothing, with one documented exception: a request refused for
capacity (RADIX-CAPACITY) keeps the split and the access times of its match.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from kvspec.reference.labels import applies
from kvspec.spec.errors import InvalidOperation
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
from kvspec.spec.rules import rid
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


class RadixModel:
    """The radix profile as a pure, deterministic state machine."""

    def __init__(self, config: RadixConfig) -> None:
        self.config = config
        self.page = config.page_size
        self.clock = 0
        self.next_event_id = 0
        self.free = config.capacity
        self.root = self._new_root()
        self.locks: dict[str, RadixTreeNode] = {}

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
    @applies("RADIX-MATCH", "RADIX-SPLIT-SILENT")
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

    @applies("RADIX-MATCH")
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

    @applies("RADIX-INSERT")
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

    @applies("RADIX-LOCK")
    def _lock(self, node: RadixTreeNode, delta: int) -> None:
        while node.parent is not None:
            node.lock_ref += delta
            node = node.parent

    def evictable_size(self) -> int:
        return sum(len(n.tokens) for n in self.nodes() if n.lock_ref == 0)

    @applies("RADIX-EVICT-LRU", "RADIX-LOCKED-KEPT", "RADIX-REMOVE")
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

    @applies("RADIX-REMOVE")
    def _removed_pages(self, node: RadixTreeNode) -> list[int]:
        """The hashes a Removed names for an evicted node: all its pages (RADIX-REMOVE)."""
        return [s for s, _ in node.pages]

    def _hit_key(self, prompt: list[int]) -> list[int]:
        """What a request matches: its prompt but the last token, cut to whole pages."""
        return self._aligned(prompt[:-1])

    # ------------------------------------------------------------ operations
    def step(self, op: RadixOp) -> RadixOutcome:
        """Apply one operation; a rejected one changes nothing and returns its error."""
        events: list[KvEvent] = []
        try:
            value = self._apply(op, events)
        except InvalidOperation as e:
            return RadixOutcome(error=OpError(rule=str(e.rule), message=e.message), state=self.snapshot())
        return RadixOutcome(value=value, events=events, state=self.snapshot())

    @applies("RADIX-VALIDATE", "RADIX-CAPACITY", "RADIX-LOCK", "RADIX-RESET")
    def _apply(self, op: RadixOp, events: list[KvEvent]) -> int:
        if isinstance(op, RadixMatch):
            return self._match(self._aligned(op.tokens))[0]
        if isinstance(op, RadixInsert):
            key = self._aligned(op.tokens)
            if len(key) > self.free:
                raise InvalidOperation(
                    rid("RADIX-CAPACITY"), f"insert of {len(key)} tokens needs as many free slots; {self.free} are free"
                )
            self.free -= len(key)
            cached, _ = self._insert(key, events)
            self.free += cached  # the slots of what was already cached go back
            return cached
        if isinstance(op, RadixLock):
            if op.name in self.locks:
                raise InvalidOperation(rid("RADIX-VALIDATE"), f"lock {op.name!r} is already held")
            n, node = self._match(self._aligned(op.tokens))
            self._lock(node, +1)
            self.locks[op.name] = node
            return n
        if isinstance(op, RadixUnlock):
            held = self.locks.pop(op.name, None)
            if held is None:
                raise InvalidOperation(rid("RADIX-VALIDATE"), f"no lock {op.name!r} is held")
            self._lock(held, -1)
            return 0
        if isinstance(op, RadixEvict):
            return self._evict(op.tokens, events)
        if isinstance(op, RadixReset):
            self.root = self._new_root()
            self.locks.clear()
            self.free = self.config.capacity
            events.append(make_cleared(self._event_id()))
            return 0
        assert isinstance(op, RadixRequest)
        return self._request(op, events)

    @applies("RADIX-PREFIX-HIT", "RADIX-CAPACITY")
    def _request(self, op: RadixRequest, events: list[KvEvent]) -> int:
        """Match the prompt but its last token (RADIX-PREFIX-HIT), lock, take
        slots for the rest (evicting what is missing), insert prompt and output
        but the last output token, free the duplicates and the partial page, unlock."""
        cached, node = self._match(self._hit_key(op.prompt))
        self._lock(node, +1)
        seq = op.prompt + op.output[:-1]
        need = len(seq) - cached
        if need > self.free + self.evictable_size():
            self._lock(node, -1)
            raise InvalidOperation(
                rid("RADIX-CAPACITY"),
                f"the request needs {need} slots; {self.free} are free and {self.evictable_size()} evictable",
            )
        if need > self.free:
            self._evict(need - self.free, events)
        self.free -= need
        key = self._aligned(seq)
        prefix, _ = self._insert(key, events)
        self.free += (prefix - cached) + (len(seq) - len(key))
        self._lock(node, -1)
        return cached

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
