"""Eviction policies over the inactive pool (rule EVICT-POLICY).

A policy holds the inactive blocks of one G1 pool and answers two questions:
which blocks may be evicted next (``allowed``), and which one the model picks
when it has no preference (``victim``). Every policy here orders its blocks
completely except ``unordered``, which allows any inactive block; the checker
uses ``allowed`` to accept an implementation's choice on a tie and to follow it.

Blocks are named by their sequence hash; the lineage policy also needs each
block's positional lineage hash (position, hash, parent) to build its forest.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from kvspec.spec.errors import ConfigError

PlhKey = tuple[int, int]  # (position, hash)

#: frequency thresholds of the multi-LRU levels: touched < 3 times is level 0,
#: < 8 level 1, < 15 level 2, otherwise level 3 (hottest).
MULTI_LRU_THRESHOLDS = (3, 8, 15)
#: a frequency counter is 4 bits wide: it stops at 15
FREQUENCY_MAX = 15
#: the counters decay (all halve) after this many counted touches per G1 slot
FREQUENCY_SAMPLE_PER_SLOT = 10


class Frequency:
    """How often each block was touched, as the multi-LRU policy reads it.

    Dynamo's kvbm mocker gives its multi-LRU registry a TinyLFU tracker sized
    to the G1 capacity (ai-dynamo/dynamo lib/kvbm-logical/src/tinylfu.rs,
    ``TinyLFUSketch::increment`` / ``reset``). What a port observes of it, and
    what this counter reproduces:

    - a block is counted under its lineage hash (the registry's key), across
      evictions and re-registrations;
    - a counter saturates at 15 (4 bits): a touch of a saturated block is not
      counted at all;
    - after ``capacity * 10`` counted touches every counter halves (rounding
      down) and the count of touches since the last decay becomes half of
      itself minus the number of counters that were odd.

    The sketch itself is a count-min sketch whose cells are picked by xxh3
    over the 128-bit encoding of the lineage hash; two blocks sharing cells
    can read a higher count than their own. That depends on the encoding's
    bit layout (which the wire protocol does not carry and which changed
    between Dynamo releases), so it is not modelled: kvspec counts each
    lineage hash exactly (SPEC.md, "Multi-LRU").
    """

    __slots__ = ("counts", "sample", "size")

    def __init__(self, capacity: int) -> None:
        self.counts: dict[object, int] = {}
        self.size = 0
        self.sample = capacity * FREQUENCY_SAMPLE_PER_SLOT

    def touch(self, key: object) -> None:
        n = self.counts.get(key, 0)
        if n >= FREQUENCY_MAX:
            return
        self.counts[key] = n + 1
        self.size += 1
        if self.size >= self.sample:
            self._decay()

    def _decay(self) -> None:
        odd = sum(1 for n in self.counts.values() if n & 1)
        self.counts = {k: n >> 1 for k, n in self.counts.items() if n >> 1}
        self.size = max(0, (self.size >> 1) - odd)

    def count(self, key: object) -> int:
        return self.counts.get(key, 0)

    def state(self) -> tuple[object, ...]:
        return (self.size, tuple(sorted(self.counts.items(), key=repr)))

    def copy(self) -> Frequency:
        c = Frequency(0)
        c.counts = dict(self.counts)
        c.size = self.size
        c.sample = self.sample
        return c


class Policy(Protocol):
    name: str

    def insert(self, seq: int, key: PlhKey, parent: PlhKey | None, touches: int) -> None:
        """``seq`` enters the inactive pool (it lost its last owner)."""

    def remove(self, seq: int) -> None:
        """``seq`` leaves the pool without being evicted (it was hit)."""

    def victim(self) -> int | None:
        """The block the policy evicts next, or None when the pool is empty."""

    def allowed(self) -> list[int]:
        """Every block the spec allows as the next victim (victim() first)."""

    def evict(self, seq: int) -> None:
        """Take ``seq`` (one of ``allowed()``) out of the pool as a victim."""

    def __len__(self) -> int: ...

    def __contains__(self, seq: object) -> bool: ...

    def __iter__(self) -> Iterator[int]: ...

    def copy(self) -> Policy: ...


class LruPolicy:
    """Least recently made inactive goes first."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def insert(self, seq: int, key: PlhKey, parent: PlhKey | None, touches: int) -> None:
        self._order[seq] = None

    def remove(self, seq: int) -> None:
        del self._order[seq]

    def victim(self) -> int | None:
        return next(iter(self._order), None)

    def allowed(self) -> list[int]:
        v = self.victim()
        return [] if v is None else [v]

    def evict(self, seq: int) -> None:
        del self._order[seq]

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, seq: object) -> bool:
        return seq in self._order

    def __iter__(self) -> Iterator[int]:
        return iter(self._order)

    def copy(self) -> LruPolicy:
        c = LruPolicy()
        c._order = self._order.copy()
        return c


class UnorderedPolicy(LruPolicy):
    """Any inactive block may be evicted; the model's own pick is the LRU one.

    For implementations that promise no order (a hash map's iteration order):
    the checker accepts whichever inactive block they evict.
    """

    name = "unordered"

    def allowed(self) -> list[int]:
        return list(self._order)

    def copy(self) -> UnorderedPolicy:
        c = UnorderedPolicy()
        c._order = self._order.copy()
        return c


class MultiLruPolicy:
    """Four LRU levels by touch count; the coldest non-empty level goes first.

    A block's level is fixed when it enters the pool, from its ``Frequency``
    count at that moment (thresholds 3, 8, 15).
    """

    name = "multi_lru"

    def __init__(self) -> None:
        self._levels: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(4)]
        self._level_of: dict[int, int] = {}

    @staticmethod
    def level(touches: int) -> int:
        return sum(1 for t in MULTI_LRU_THRESHOLDS if touches >= t)

    def insert(self, seq: int, key: PlhKey, parent: PlhKey | None, touches: int) -> None:
        lvl = self.level(touches)
        self._levels[lvl][seq] = None
        self._level_of[seq] = lvl

    def remove(self, seq: int) -> None:
        lvl = self._level_of.pop(seq)
        del self._levels[lvl][seq]

    def victim(self) -> int | None:
        for lvl in self._levels:
            if lvl:
                return next(iter(lvl))
        return None

    def allowed(self) -> list[int]:
        v = self.victim()
        return [] if v is None else [v]

    evict = remove

    def __len__(self) -> int:
        return len(self._level_of)

    def __contains__(self, seq: object) -> bool:
        return seq in self._level_of

    def __iter__(self) -> Iterator[int]:
        for lvl in self._levels:
            yield from lvl

    def copy(self) -> MultiLruPolicy:
        c = MultiLruPolicy()
        c._levels = [lvl.copy() for lvl in self._levels]
        c._level_of = dict(self._level_of)
        return c


@dataclass(slots=True)
class _Node:
    seq: int | None  # None: a ghost (placeholder for a block not in the pool)
    tick: int
    parent: PlhKey | None  # the parent's key, once known and attached
    children: int = 0


@dataclass(slots=True)
class LineagePolicy:
    """Evict real leaves of the inactive forest, oldest first.

    The inactive blocks form a forest through the parent in their positional
    lineage hash. A block taken out of the pool while inactive children still
    hang below it stays as a ghost, and so does a missing parent; a ghost goes
    when its last child goes. Only a real leaf (no child at all, ghost or not)
    may be evicted; among leaves the victim has the smallest (tick, position,
    hash), the tick being taken when the block entered the pool.
    """

    name: str = "lineage"
    _nodes: dict[PlhKey, _Node] = field(default_factory=dict)
    _key_of: dict[int, PlhKey] = field(default_factory=dict)
    _heap: list[tuple[int, int, int, int]] = field(default_factory=list)  # tick, pos, hash, seq
    _tick: int = 0

    def insert(self, seq: int, key: PlhKey, parent: PlhKey | None, touches: int) -> None:
        tick = self._tick
        self._tick += 1
        node = self._nodes.get(key)
        if node is None:
            node = _Node(seq=seq, tick=tick, parent=None)
            self._nodes[key] = node
        else:  # a ghost becomes real again, keeping its children
            node.seq = seq
            node.tick = tick
        if node.parent is None and parent is not None:
            node.parent = parent
            pnode = self._nodes.get(parent)
            if pnode is None:
                pnode = _Node(seq=None, tick=-1, parent=None)
                self._nodes[parent] = pnode
            pnode.children += 1
        self._key_of[seq] = key
        if node.children == 0:
            heapq.heappush(self._heap, (tick, key[0], key[1], seq))

    def _drop(self, key: PlhKey) -> None:
        """Delete a childless node and walk up: ghosts without children go,
        real parents that become leaves rejoin the heap with their old tick."""
        while True:
            node = self._nodes.pop(key)
            parent = node.parent
            if parent is None:
                return
            pnode = self._nodes[parent]
            pnode.children -= 1
            if pnode.children > 0:
                return
            if pnode.seq is not None:
                heapq.heappush(self._heap, (pnode.tick, parent[0], parent[1], pnode.seq))
                return
            key = parent

    def remove(self, seq: int) -> None:
        key = self._key_of.pop(seq)
        node = self._nodes[key]
        if node.children > 0:
            node.seq = None  # stays as a ghost
        else:
            self._drop(key)

    def _valid(self, entry: tuple[int, int, int, int]) -> bool:
        tick, pos, h, seq = entry
        node = self._nodes.get((pos, h))
        return node is not None and node.seq == seq and node.tick == tick and node.children == 0

    def victim(self) -> int | None:
        heap = self._heap
        while heap and not self._valid(heap[0]):
            heapq.heappop(heap)
        return heap[0][3] if heap else None

    def allowed(self) -> list[int]:
        v = self.victim()
        return [] if v is None else [v]

    def evict(self, seq: int) -> None:
        key = self._key_of.pop(seq)
        node = self._nodes[key]
        if node.children != 0:
            raise AssertionError(f"lineage: block {seq} is not a leaf")
        self._drop(key)

    def leaves(self) -> list[int]:
        return [n.seq for n in self._nodes.values() if n.seq is not None and n.children == 0]

    def ghosts(self) -> list[PlhKey]:
        return [k for k, n in self._nodes.items() if n.seq is None]

    def __len__(self) -> int:
        return len(self._key_of)

    def __contains__(self, seq: object) -> bool:
        return seq in self._key_of

    def __iter__(self) -> Iterator[int]:
        return iter(self._key_of)

    def copy(self) -> LineagePolicy:
        return LineagePolicy(
            name=self.name,
            _nodes={k: _Node(n.seq, n.tick, n.parent, n.children) for k, n in self._nodes.items()},
            _key_of=dict(self._key_of),
            _heap=list(self._heap),
            _tick=self._tick,
        )


POLICIES: dict[str, type] = {
    "lru": LruPolicy,
    "unordered": UnorderedPolicy,
    "multi_lru": MultiLruPolicy,
    "lineage": LineagePolicy,
}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ConfigError(f"unknown eviction policy {name!r}; known: {sorted(POLICIES)}") from None


def policy_names() -> Iterable[str]:
    return POLICIES.keys()
