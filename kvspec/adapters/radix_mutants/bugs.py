"""Radix models with one realistic bug each (the variants of ``manifest.toml``).

Each class overrides the one method of ``reference.radix.RadixModel`` where
the bug lives; the docstring says what a real radix cache would get wrong.
"""

from __future__ import annotations

from kvspec.api import RadixModel
from kvspec.reference.radix import RadixTreeNode
from kvspec.spec.radix_wire import RadixOp, RadixOutcome, RadixReset
from kvspec.spec.wire import KvEvent, make_cleared, make_removed, make_stored


class EvictNewestFirst(RadixModel):
    """The eviction heap ordered the wrong way round (MRU)."""

    def _evict(self, tokens: int, events: list[KvEvent]) -> int:
        for n in self.nodes():
            n.last_access = -n.last_access
        try:
            return super()._evict(tokens, events)
        finally:
            for n in self.nodes():
                n.last_access = -n.last_access


class EvictIgnoresLocks(RadixModel):
    """Leaf candidates are every leaf, locked or not (a lock taken only on the last node)."""

    def _evict(self, tokens: int, events: list[KvEvent]) -> int:
        saved = {n: n.lock_ref for n in self.nodes()}
        for n in saved:
            n.lock_ref = 0
        try:
            return super()._evict(tokens, events)
        finally:
            for n, ref in saved.items():
                n.lock_ref = ref


class SplitRepublishes(RadixModel):
    """A split announces the split node again: Removed of its pages, then Stored of both halves."""

    def _split(self, child: RadixTreeNode, n: int) -> RadixTreeNode:
        pages = [s for s, _ in child.pages]
        upper = super()._split(child, n)
        evs = self._pending
        evs.append(make_removed(self._event_id(), pages))
        self._emit_stored(upper, evs)
        self._emit_stored(child, evs)
        return upper

    _pending: list[KvEvent] = []

    def step(self, op: RadixOp) -> RadixOutcome:
        self._pending = []
        out = super().step(op)
        if self._pending and out.error is None:
            out = out.model_copy(update={"events": [*self._pending, *out.events]})
        return out


class StoredAnchoredAtRoot(RadixModel):
    """A new leaf's Stored names no parent (the recorder reads the parent's hash before it was split off)."""

    def _emit_stored(self, node: RadixTreeNode, events: list[KvEvent]) -> None:
        pages = [node.tokens[i : i + self.page] for i in range(0, len(node.tokens), self.page)]
        events.append(
            make_stored(
                self._event_id(), [s for s, _ in node.pages], [loc for _, loc in node.pages], None, token_ids=pages
            )
        )


class RemovedFirstPageOnly(RadixModel):
    """record_remove names only the first page of each evicted node."""

    def _removed_pages(self, node: RadixTreeNode) -> list[int]:
        return [s for s, _ in node.pages[:1]]


class ResetKeepsTree(RadixModel):
    """reset publishes Cleared and forgets the locks but keeps the tree."""

    def reset(self, op: RadixReset) -> int:
        self.locks.clear()
        for n in self.nodes():
            n.lock_ref = 0
        self._events.append(make_cleared(self._event_id()))
        return 0


class HitIncludesLastToken(RadixModel):
    """A request matches its whole prompt (no ``input_len - 1`` cap)."""

    def _hit_key(self, prompt: list[int]) -> list[int]:
        return self._aligned(prompt)


class UnlockLastNodeOnly(RadixModel):
    """dec_lock_ref releases only the node it is given, not its ancestors."""

    def _lock(self, node: RadixTreeNode, delta: int) -> None:
        if delta > 0:
            super()._lock(node, delta)
        elif node.parent is not None:
            node.lock_ref += delta


class MatchDoesNotTouch(RadixModel):
    """A match does not refresh the access time of the nodes it passes."""

    def _match(self, key: list[int]) -> tuple[int, RadixTreeNode]:
        saved = {n: n.last_access for n in self.nodes()}
        out = super()._match(key)
        for n, t in saved.items():
            n.last_access = t
        return out


class SplitLosesLock(RadixModel):
    """A split's new upper node starts unlocked instead of taking the split node's count."""

    def _split(self, child: RadixTreeNode, n: int) -> RadixTreeNode:
        upper = super()._split(child, n)
        upper.lock_ref = 0
        return upper


BUGS: dict[str, type[RadixModel]] = {
    "evict_newest_first": EvictNewestFirst,
    "evict_ignores_locks": EvictIgnoresLocks,
    "split_republishes": SplitRepublishes,
    "stored_anchored_at_root": StoredAnchoredAtRoot,
    "removed_first_page_only": RemovedFirstPageOnly,
    "reset_keeps_tree": ResetKeepsTree,
    "hit_includes_last_token": HitIncludesLastToken,
    "unlock_last_node_only": UnlockLastNodeOnly,
    "match_does_not_touch": MatchDoesNotTouch,
    "split_loses_lock": SplitLosesLock,
}
