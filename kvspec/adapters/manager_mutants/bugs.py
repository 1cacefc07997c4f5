"""The broken models behind ``adapters/manager_mutants``: one realistic bug each.

Each class is the reference model of its profile with one method changed;
``manifest.toml`` declares each (name, the rule it breaks, what it gets
wrong). Two are the ferrum seed's own paths (a swap-in that copies nothing
back, a write into a shared block in place); the others are the slips a
port of such an allocator is prone to.
"""

from __future__ import annotations

from kvspec.reference.paged import PagedModel, Pool, Seq
from kvspec.reference.session import SessionModel
from kvspec.spec.manager_wire import (
    PagedEvictPrefixes,
    PagedExtend,
    PagedFork,
    PagedFree,
    PagedSwapIn,
    PagedSwapOut,
    PagedWrite,
    Pressure,
    SessionAdmit,
    SessionFinalize,
    SessionOp,
    SessionOutcome,
)

# ---------------------------------------------------------------- paged


class SwapOutFreesShared(PagedModel):
    """swap_out returns every device block to the pool, held by others or not."""

    def swap_out(self, op: PagedSwapOut) -> int:
        shared = [b for b in self.seqs[op.seq].blocks if self.device.refs[b] > 1]
        n = super().swap_out(op)
        for b in shared:
            while b in self.device.refs:
                self.device.drop(b)
        return n


class SwapInLosesData(PagedModel):
    """swap_in takes fresh device blocks but copies nothing back (the seed)."""

    def swap_in(self, op: PagedSwapIn) -> int:
        s = self.seqs[op.seq]
        fresh = [self.device.take() for _ in s.blocks]
        for b in s.blocks:
            self.host.drop(b)
        s.blocks, s.tier = fresh, "device"
        return len(fresh)


class CowInPlace(PagedModel):
    """a write to a shared block writes in place: the other holders see it (the seed's write_kv)."""

    def shared(self, op: PagedWrite) -> bool:
        return False


class CowSourceKept(PagedModel):
    """copy-on-write copies, but the shared block keeps the writer as a holder."""

    def copy_on_write(self, op: PagedWrite) -> int:
        old = self._written(op)
        copied = super().copy_on_write(op)
        self.device.refs[old] += 1
        return copied


class FreeIgnoresHolders(PagedModel):
    """free returns every block of the sequence to the pool, whoever else holds it."""

    def free(self, op: PagedFree) -> int:
        s: Seq = self.seqs.pop(op.seq)
        pool: Pool = self.pool(s.tier)
        n = 0
        for b in s.blocks:
            if b in pool.refs:
                pool.refs[b] = 1
                n += pool.drop(b)
        return n


class ForkWithoutRef(PagedModel):
    """a fork shares the blocks without counting the new holder."""

    def fork(self, op: PagedFork) -> int:
        n = super().fork(op)
        for b in self.seqs[op.dst].blocks:
            self.device.refs[b] -= 1
        return n


class ExtendOneExtra(PagedModel):
    """extend past a full last block takes one block more than it needs."""

    def extend(self, op: PagedExtend) -> int:
        s = self.seqs[op.seq]
        full = s.tokens % self.bs == 0 and op.tokens > 0 and len(self.device.free) > 1
        n = super().extend(op)
        if full and n > 0 and len(self.device.free) > 0:
            s.blocks.append(self.device.take())
            return n + 1
        return n


class PrefixEvictsInUse(PagedModel):
    """evict_prefixes evicts the oldest entries whether a sequence holds them or not."""

    def evict_prefixes(self, op: PagedEvictPrefixes) -> int:
        victims = list(self.prefixes)[: op.count]
        for k in victims:
            self._evict(k)
        return len(victims)


class PressureInclusive(PagedModel):
    """pressure thresholds compared with <= instead of <."""

    def pressure(self) -> Pressure:
        frac = len(self.device.free) / self.config.device_blocks
        if frac <= self.config.critical_below:
            return "critical"
        if frac <= self.config.high_below:
            return "high"
        return "low"


# ---------------------------------------------------------------- session


class ReleaseKeepsGeneration(SessionModel):
    """a release (finalize without keeping, reset) frees the slot but keeps its generation."""

    def _release(self, index: int) -> None:
        super()._release(index)
        self.slots[index].generation -= 1


class FinalizeIgnoresGeneration(SessionModel):
    """finalize acts on a slot the handle names whatever the generation."""

    def step(self, op: SessionOp) -> SessionOutcome:
        if isinstance(op, SessionFinalize) and op.slot < len(self.slots):
            s = self.slots[op.slot]
            if s.generation != op.generation and s.state != "free" and s.session == op.session:
                op = op.model_copy(update={"generation": s.generation})
        return super().step(op)


class LruNewestFirst(SessionModel):
    """with no free slot, the most recently parked idle session loses its slot."""

    def lru_victim(self) -> str:
        return self.idle_lru[-1]


class ColdOwnSlotLive(SessionModel):
    """a cold re-admission onto the session's own idle slot is reported as a live candidate."""

    def lease_own(self, op: SessionAdmit) -> SessionOutcome:
        out = super().lease_own(op)
        assert out.admission is not None
        adm = out.admission.model_copy(update={"candidate": "live", "requires_clear": False})
        return out.model_copy(update={"admission": adm})


class EvictAllKeepsIdle(SessionModel):
    """evict_all releases the leased slots but leaves idle ones parked."""

    def evict_all(self) -> None:
        for i, s in enumerate(self.slots):
            if s.state == "leased":
                self._release(i)


class DrainIgnoresGeneration(SessionModel):
    """drain takes every queued snapshot whose slot is in use, whatever its generation."""

    def drain(self) -> list[tuple[int, int]]:
        taken = [(i, g) for i, g in self.pending if i < len(self.slots) and self.slots[i].state != "free"]
        self.pending = []
        return taken


PAGED_BUGS: dict[str, type[PagedModel]] = {
    "swap_out_frees_shared": SwapOutFreesShared,
    "swap_in_loses_data": SwapInLosesData,
    "cow_in_place": CowInPlace,
    "cow_source_kept": CowSourceKept,
    "free_ignores_holders": FreeIgnoresHolders,
    "fork_without_ref": ForkWithoutRef,
    "extend_one_extra": ExtendOneExtra,
    "prefix_evicts_in_use": PrefixEvictsInUse,
    "pressure_inclusive": PressureInclusive,
}
SESSION_BUGS: dict[str, type[SessionModel]] = {
    "release_keeps_generation": ReleaseKeepsGeneration,
    "finalize_ignores_generation": FinalizeIgnoresGeneration,
    "lru_newest_first": LruNewestFirst,
    "cold_own_slot_live": ColdOwnSlotLive,
    "evict_all_keeps_idle": EvictAllKeepsIdle,
    "drain_ignores_generation": DrainIgnoresGeneration,
}
