"""Mutants of the G1 model whose bug is in the block lifecycle itself: slots,
owners, validation and what a Use returns (kvbm, atomic)."""

from __future__ import annotations

from collections.abc import Collection

from kvspec.api import G1Model, Step
from kvspec.reference.g1 import Block, plh_id
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Counters, Deref, FullBlock, OpResult, PartialBlock, Promote, Use


class EvictActiveWhenFull(G1Model):
    """When the inactive pool is empty the allocator still finds a victim:
    the oldest active block, owners and all, instead of reporting capacity."""

    def _pick_victim(self, prefer: Collection[int]) -> int | None:
        victim = super()._pick_victim(prefer)
        if victim is None:
            victim = next((s for s, b in self.blocks.items() if b.owners > 0), None)
        return victim

    def _evict(self, seq: int) -> None:
        b = self.blocks[seq]
        if b.owners == 0:
            super()._evict(seq)
            return
        del self.blocks[seq]
        del self.by_plh[plh_id(b.plh)]
        self.active_full -= 1
        self.refs -= b.owners
        self._evicted_meta[seq] = b


class DerefInactiveAtOne(G1Model):
    """The release check tests the owner count before decrementing it, so a
    block with two owners goes inactive (owners 0) on the first Deref."""

    def _deref(self, op: Deref) -> Step:
        before = {
            r.full: self.blocks[r.full].owners for r in op.blocks if isinstance(r, FullBlock) and r.full in self.blocks
        }
        step = super()._deref(op)
        for seq, owners in before.items():
            b = self.blocks.get(seq)
            if b is not None and owners >= 2 and b.owners == 1:
                b.owners = 0
                self.refs -= 1
                self.active_full -= 1
                self.policy.insert(b.seq, (b.plh.position, b.plh.hash), b.plh.parent_key(), self.touches[b.seq])
        return step


class CapacityOneEarly(G1Model):
    """The free-slot test is ``free > 1``: the last free slot is never handed
    out, so the pool evicts (or reports capacity) one slot early."""

    def _take_slot(self, prefer: Collection[int]) -> tuple[bool, int | None]:
        if self.free != 1:
            return super()._take_slot(prefer)
        self.free = 0
        try:
            return super()._take_slot(prefer)
        finally:
            self.free += 1


class AtomicHalfPlaced(G1Model):
    """The atomic profile without its capacity pre-check: a Use that cannot
    place every block places what fits and keeps it, as the kvbm profile does."""

    def _use_atomic(self, op: Use, prefer: Collection[int]) -> Step:
        step = super()._use_atomic(op, prefer)
        if step.result.status != "capacity":
            return step
        self.atomic = False
        try:
            return self._use(op, prefer)
        finally:
            self.atomic = True


class PartialLeakedOnDeref(G1Model):
    """Dropping a partial block forgets to return its slot to the free list."""

    def _deref(self, op: Deref) -> Step:
        step = super()._deref(op)
        self.free -= sum(1 for r in op.blocks if isinstance(r, PartialBlock))
        return step


class ValidateAfterMutation(G1Model):
    """The token-length check of a Use runs after the blocks were placed: the
    Use is rejected, but its blocks stay placed (and their events are lost)."""

    _late_check = False

    def _short_tokens(self, op: Use) -> str | None:
        n = sum(1 for b in op.blocks if isinstance(b, FullBlock))
        if op.token_ids is None or len(op.token_ids) != n or len(op.plhs) != n:
            return None
        for i, toks in enumerate(op.token_ids):
            if len(toks) != self.block_size:
                return f"token_ids[{i}] has {len(toks)} tokens; a full block has {self.block_size}"
        return None

    def _validate_use(self, op: Use) -> None:
        super()._validate_use(op.model_copy(update={"token_ids": None}) if self._late_check else op)

    def _use(self, op: Use, prefer: Collection[int]) -> Step:
        bad = self._short_tokens(op)
        if bad is None:
            return super()._use(op, prefer)
        self._late_check = True
        try:
            super()._use(op, prefer)
        finally:
            self._late_check = False
        raise InvalidOperation(RuleId.USE_VALIDATE, bad)


class PromoteExistingKeepsSlot(G1Model):
    """Promoting into an existing block joins it but never frees the partial
    block's slot."""

    def _promote(self, op: Promote) -> Step:
        existed = op.seq_hash in self.blocks
        step = super()._promote(op)
        if existed:
            self.free -= 1
        return step


class DerefUnknownIgnored(G1Model):
    """A Deref of a block that is unknown, inactive or not held is skipped
    silently instead of being rejected."""

    def _deref(self, op: Deref) -> Step:
        keep = []
        need: dict[int, int] = {}
        seen: set[str] = set()
        for ref in op.blocks:
            if isinstance(ref, FullBlock):
                need[ref.full] = need.get(ref.full, 0) + 1
                b = self.blocks.get(ref.full)
                if b is None or need[ref.full] > b.owners:
                    continue
            elif ref.partial not in self.partial or ref.partial in seen:
                continue
            else:
                seen.add(ref.partial)
            keep.append(ref)
        return super()._deref(Deref(blocks=keep))


class ActiveRefsCountsBlocks(G1Model):
    """``active_refs`` reports the number of active blocks, not the number of
    owner references."""

    def counters(self) -> Counters:
        c = super().counters()
        return c.model_copy(update={"active_refs": len(self.partial) + self.active_full})


class InactiveHitTakesSlot(G1Model):
    """Reactivating an inactive block also takes a free slot, as if the block
    were new; the slot is never given back."""

    def _hit(self, b: Block) -> None:
        if b.owners == 0 and self.free:
            self.free -= 1
        super()._hit(b)


class UseCountsNewOnly(G1Model):
    """A Use returns how many blocks it newly allocated, leaving out the hits
    it placed."""

    def _use(self, op: Use, prefer: Collection[int]) -> Step:
        known = set(self.blocks)
        held = set(self.partial)
        step = super()._use(op, prefer)
        placed = step.result.value if isinstance(step.result.value, int) else 0
        hits = sum(
            1
            for r in op.blocks[:placed]
            if (isinstance(r, FullBlock) and r.full in known) or (isinstance(r, PartialBlock) and r.partial in held)
        )
        if not hits:
            return step
        return Step(OpResult(value=placed - hits, status=step.result.status), step.events)


class CapacitySkipsToHits(G1Model):
    """A Use that finds no slot for a block skips it and goes on placing the
    blocks after it that need none (hits on registered blocks), instead of
    stopping there."""

    def _use(self, op: Use, prefer: Collection[int]) -> Step:
        step = super()._use(op, prefer)
        if self.atomic or step.result.status != "capacity":
            return step
        placed = int(step.result.value or 0)
        extra = 0
        for ref in op.blocks[placed + 1 :]:
            if isinstance(ref, FullBlock) and ref.full in self.blocks:
                self._hit(self.blocks[ref.full])
                extra += 1
        return Step(OpResult(value=placed + extra, status="capacity"), step.events)


class DerefAppliedBeforeRejection(G1Model):
    """A Deref that names a block it may not release first releases the
    blocks listed before it, then rejects (validation after mutation)."""

    def _deref(self, op: Deref) -> Step:
        try:
            return super()._deref(op)
        except InvalidOperation:
            for ref in op.blocks:
                try:
                    super()._deref(Deref(blocks=[ref]))
                except InvalidOperation:
                    break
            raise
