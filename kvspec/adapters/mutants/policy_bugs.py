"""Mutants of the eviction policies (rule EVICT-POLICY), and the G1 models
that use them when the configuration picks that policy."""

from __future__ import annotations

from kvspec.api import G1Model
from kvspec.reference.g1 import Block
from kvspec.reference.policies import LineagePolicy, LruPolicy, MultiLruPolicy, _Node
from kvspec.spec.config import ManagerConfig


class AgeOnlyLineage(LineagePolicy):
    """The lineage policy without its leaf condition: the oldest inactive
    block goes first even when inactive children still hang below it."""

    def victim(self) -> int | None:
        real = [(n.tick, k[0], k[1], n.seq) for k, n in self._nodes.items() if n.seq is not None]
        return min(real)[3] if real else None

    def allowed(self) -> list[int]:
        v = self.victim()
        return [] if v is None else [v]

    def evict(self, seq: int) -> None:
        if self._nodes[self._key_of[seq]].children:
            self.remove(seq)  # a parent with children stays behind as a ghost
        else:
            super().evict(seq)

    def copy(self) -> AgeOnlyLineage:
        c = AgeOnlyLineage()
        c._nodes = {k: _Node(n.seq, n.tick, n.parent, n.children) for k, n in self._nodes.items()}
        c._key_of = dict(self._key_of)
        c._heap = list(self._heap)
        c._tick = self._tick
        return c


class MostRecentLru(LruPolicy):
    """LRU read from the wrong end: the most recently released block goes
    first."""

    def victim(self) -> int | None:
        return next(reversed(self._order), None)

    def copy(self) -> MostRecentLru:
        c = MostRecentLru()
        c._order = self._order.copy()
        return c


class FlatMultiLru(MultiLruPolicy):
    """Multi-LRU whose frequency levels were never wired up: every block
    lands in the coldest level, so it is plain LRU."""

    @staticmethod
    def level(touches: int) -> int:
        return 0

    def copy(self) -> FlatMultiLru:
        c = FlatMultiLru()
        c._levels = [lvl.copy() for lvl in self._levels]
        c._level_of = dict(self._level_of)
        return c


class LineageParentFirst(G1Model):
    def __init__(self, config: ManagerConfig) -> None:
        super().__init__(config)
        if config.eviction == "lineage":
            self.policy = AgeOnlyLineage()


class LruMostRecentFirst(G1Model):
    def __init__(self, config: ManagerConfig) -> None:
        super().__init__(config)
        if config.eviction == "lru":
            self.policy = MostRecentLru()


class MultiLruFlat(G1Model):
    def __init__(self, config: ManagerConfig) -> None:
        super().__init__(config)
        if config.eviction == "multi_lru":
            self.policy = FlatMultiLru()


class NoGhostLineage(LineagePolicy):
    """Lineage without the ghosts of blocks taken out: a block a hit takes out
    of the pool is forgotten even while inactive children hang below it, so
    its inactive parent becomes a leaf (and can be evicted) before them."""

    def remove(self, seq: int) -> None:
        key = self._key_of.pop(seq)
        node = self._nodes[key]
        if node.children == 0:
            self._drop(key)
            return
        # the bug: forget the node; its children become roots
        for n in self._nodes.values():
            if n.parent == key:
                n.parent = None
        node.children = 0
        self._drop(key)

    def copy(self) -> NoGhostLineage:
        c = NoGhostLineage()
        c._nodes = {k: _Node(n.seq, n.tick, n.parent, n.children) for k, n in self._nodes.items()}
        c._key_of = dict(self._key_of)
        c._heap = list(self._heap)
        c._tick = self._tick
        return c


class LineageNoGhost(G1Model):
    def __init__(self, config: ManagerConfig) -> None:
        super().__init__(config)
        if config.eviction == "lineage":
            self.policy = NoGhostLineage()


class ActiveHitTouches(G1Model):
    """An active hit counts as a multi-LRU touch (as if the block manager were
    asked for a block the mocker already holds), so a block shared by
    running requests climbs the frequency levels."""

    def _hit(self, b: Block) -> None:
        if b.owners > 0:
            self.freq.touch(b.pid)
        super()._hit(b)
