"""The G2 (host pinned) tier's own state: what it holds and how it evicts.

G2 holds blocks offloaded from G1, with the metadata G1 registered for them
(``G2Entry``: what the host-pinned Stored publishes and what a swap-in
registers again). Its capacity is ``num_g2_blocks`` destinations; a
destination is taken when a block is registered in G2 or, under
``g2_allocation = "at_start"``, when the transfer that carries it starts
(``reserve``), and G2 evicts to make room (``G2-EVICT``):

- ``g2_eviction = "lru"``: the least recently used block goes first (a
  registration, or the start of a swap-in that copies it back, is a use);
- ``g2_eviction = "lineage"`` (Dynamo: the G2 ``BlockManager`` is built with
  its lineage backend, ai-dynamo/dynamo ``lib/mocker/src/kvbm_offload/engine.rs``,
  ``build_g2_block_manager``): G2's unpinned blocks form a lineage forest
  and only a real leaf goes, oldest first, exactly as G1's lineage policy
  (``policies.LineagePolicy``). A swap-in pins the G2 blocks it copies from
  when it starts (they leave the forest, as ghosts when they have children)
  and unpins them when it completes or fails (they re-enter as newest).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvspec.reference.policies import LineagePolicy
from kvspec.spec.wire import Plh


@dataclass(slots=True)
class G2Entry:
    """A block's metadata as it travels to G2 and back: what G1 registered
    (G2-STORE-ON-COMPLETE publishes it; a swap-in registers it again)."""

    seq: int
    plh: Plh
    parent_hash: int | None
    local_hash: int
    token_ids: list[int] | None

    @property
    def pid(self) -> tuple[int, int, int | None]:
        return (self.plh.position, self.plh.hash, self.plh.parent)


class G2Tier:
    """Registered G2 blocks, their eviction order, pins and reserved destinations."""

    def __init__(self, capacity: int, eviction: str) -> None:
        self.capacity = capacity
        self.eviction = eviction
        #: registered blocks by sequence hash (LRU order under "lru")
        self.blocks: OrderedDict[int, G2Entry] = OrderedDict()
        #: lineage: the unpinned registered blocks
        self.pool = LineagePolicy()
        #: lineage: swap-in pins per block
        self.pins: dict[int, int] = {}
        #: destinations allocated for transfers still in flight
        self.reserved = 0
        #: at_start: blocks admitted at enqueue and not arrived yet (Dynamo's
        #: CapacityReservations counter)
        self.admitted = 0
        #: blocks staged back from G3/G4 for a swap-in: registered with no
        #: router metadata, so neither their arrival nor their eviction is
        #: published (Dynamo's G2 event translation finds no metadata for them)
        self.silent: set[int] = set()

    # ---------------------------------------------------------------- queries
    def __contains__(self, seq: object) -> bool:
        return seq in self.blocks

    def get(self, seq: int) -> G2Entry | None:
        return self.blocks.get(seq)

    def holds_lineage(self, pid: tuple[int, int, int | None]) -> bool:
        return any(e.pid == pid for e in self.blocks.values())

    def free(self) -> int:
        return self.capacity - len(self.blocks) - self.reserved

    def available(self) -> int:
        """What Dynamo's G2 ``BlockManager::available_blocks`` counts: the
        destinations free now plus the registered blocks that could be
        evicted (lineage: every unpinned block, leaf or not; lru: every
        block). A destination taken by a transfer in flight is in neither."""
        evictable = len(self.pool) if self.eviction == "lineage" else len(self.blocks)
        return self.free() + evictable

    def admit(self, n: int) -> int:
        """Admit up to ``n`` blocks of one job, in order: as many as
        ``available() - admitted`` allows (``try_reserve_up_to``); the rest
        are dropped by the caller."""
        k = max(0, min(n, self.available() - self.admitted))
        self.admitted += k
        return k

    def state(self) -> tuple[object, ...]:
        pool = sorted((k, n.seq, n.tick, n.parent, n.children) for k, n in self.pool._nodes.items())
        return (
            tuple(self.blocks),
            pool,
            tuple(sorted(self.pins.items())),
            self.reserved,
            self.admitted,
            tuple(sorted(self.silent)),
        )

    # --------------------------------------------------------------- changes
    def evict_one(self) -> int | None:
        """Evict the policy's victim; its sequence hash, or None when every
        block is pinned (or G2 is empty)."""
        if self.eviction == "lru":
            if not self.blocks:
                return None
            seq, _ = self.blocks.popitem(last=False)
            return seq
        victim = self.pool.victim()
        if victim is None:
            return None
        self.pool.evict(victim)
        del self.blocks[victim]
        return victim

    def make_room(self) -> tuple[bool, list[int]]:
        """Free one destination: (got one, the blocks evicted for it)."""
        if self.free() > 0:
            return True, []
        victim = self.evict_one()
        if victim is None:
            return False, []
        return True, [victim]

    def register(self, e: G2Entry) -> None:
        """``e`` becomes a G2 block (its destination is already counted free
        or reserved by the caller)."""
        self.blocks[e.seq] = e
        if self.eviction == "lineage":
            self.pool.insert(e.seq, (e.plh.position, e.plh.hash), e.plh.parent_key(), 0)

    def use(self, seq: int) -> None:
        """LRU: ``seq`` becomes the most recently used block."""
        if self.eviction == "lru":
            self.blocks.move_to_end(seq)

    def pin(self, seqs: list[int]) -> None:
        """A swap-in starts copying ``seqs`` back (lineage: they leave the pool)."""
        if self.eviction != "lineage":
            for s in seqs:
                self.use(s)
            return
        for s in seqs:
            n = self.pins.get(s, 0)
            if n == 0:
                self.pool.remove(s)
            self.pins[s] = n + 1

    def unpin(self, seqs: list[int]) -> None:
        """The swap-in is over: the blocks re-enter the pool (newest), in order."""
        if self.eviction != "lineage":
            return
        for s in seqs:
            if s not in self.pins:
                continue
            n = self.pins[s] - 1
            if n:
                self.pins[s] = n
                continue
            del self.pins[s]
            e = self.blocks[s]
            self.pool.insert(s, (e.plh.position, e.plh.hash), e.plh.parent_key(), 0)
