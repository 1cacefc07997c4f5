"""Mutants of the legacy model (dynamo-mocker 1.0.2 behaviour).

A port that claims the legacy profile must reproduce its quirks too (Removed
before Stored, no Stored after a failed Use); "fixing" one of them without
declaring a deviation is a divergence the suite must report.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from kvspec.adapters.mutants.edits import first_id, is_device, rebuild_stored, renumber
from kvspec.api import LegacyModel, Step
from kvspec.reference.legacy import Key, key_of
from kvspec.spec.config import ManagerConfig
from kvspec.spec.wire import BlockRef, Destroy, FullBlock, OpResult, Use, make_stored


class LegacyStoredOnFailedUse(LegacyModel):
    """A Use that runs out of slots publishes the Stored for the blocks it
    placed before failing (the published manager publishes none)."""

    def _use(self, op: Use) -> Step:
        pre = set(self.active) | set(self.inactive)
        step = super()._use(op)
        if step.result.value is not False:
            return step
        parent: int | None = None
        new: list[int] = []
        hashes: list[int] = []
        toks: list[list[int]] = []
        fi = 0
        for ref in op.blocks:
            k: Key = key_of(ref)
            idx = fi
            if isinstance(ref, FullBlock):
                fi += 1
            if k not in self.active:
                break  # where the Use ran out of slots
            if not isinstance(ref, FullBlock):
                continue
            if k in pre:
                parent = ref.full
            elif ref.full not in new:
                new.append(ref.full)
                hashes.append(op.local_hashes[idx])
                if op.token_ids is not None:
                    toks.append(op.token_ids[idx])
        if not new:
            return step
        ev = make_stored(
            self._event_id(),
            new,
            hashes,
            parent,
            dp_rank=self.dp_rank,
            token_ids=toks if op.token_ids is not None else None,
        )
        self.unannounced.difference_update(new)
        return Step(step.result, [*step.events, ev])


class LegacyDestroySilent(LegacyModel):
    """Destroy drops the blocks without publishing their Removed."""

    def _destroy(self, op: Destroy) -> Step:
        step = super()._destroy(op)
        self.next_event_id -= len(step.events)
        return Step(step.result, [])


class LegacyDestroySharedDropsOneOwner(LegacyModel):
    """Destroy treats a block several requests hold as one more Deref: it
    loses one owner and stays active (and is not in the Removed); a block
    with one owner is destroyed as it should be."""

    def _destroy(self, op: Destroy) -> Step:
        shared = [k for k in map(key_of, op.blocks) if self.active.get(k, 0) > 1]
        if not shared:
            return super()._destroy(op)
        for k in shared:
            self.active[k] -= 1
        rest = [r for r in op.blocks if key_of(r) not in shared]
        if not rest:
            return Step(OpResult(value=True), [])
        return super()._destroy(Destroy(blocks=rest))


class LegacyDestroySharedDerefsAll(LegacyModel):
    """Destroy of a block several requests hold drops every owner: the block
    becomes inactive (cached, evictable later, no Removed now) instead of
    being removed outright; a block with one owner is destroyed as it should be."""

    def _destroy(self, op: Destroy) -> Step:
        shared = [k for k in map(key_of, op.blocks) if self.active.get(k, 0) > 1]
        if not shared:
            return super()._destroy(op)
        for k in shared:
            del self.active[k]
            self.inactive[k] = None
        rest = [r for r in op.blocks if key_of(r) not in shared]
        if not rest:
            return Step(OpResult(value=True), [])
        return super()._destroy(Destroy(blocks=rest))


class LegacyDestroyUnheldAccepted(LegacyModel):
    """Destroy ignores the blocks it cannot destroy (not active, or named a
    second time) and destroys the rest, where the whole Destroy must be
    rejected before anything changes."""

    def _destroy(self, op: Destroy) -> Step:
        keep: list[BlockRef] = []
        seen: set[Key] = set()
        for r in op.blocks:
            k = key_of(r)
            if k in self.active and k not in seen:
                seen.add(k)
                keep.append(r)
        if not keep:
            return Step(OpResult(value=True), [])
        return super()._destroy(Destroy(blocks=keep))


class _NewestFirst(OrderedDict[Any, None]):
    """An inactive list whose ``popitem`` takes from the wrong end."""

    def popitem(self, last: bool = True) -> tuple[Any, None]:
        return super().popitem(last=not last)


class LegacyEvictMru(LegacyModel):
    """The inactive list is popped from the wrong end: the most recently
    released block is evicted first."""

    def __init__(self, config: ManagerConfig) -> None:
        super().__init__(config)
        self.inactive = _NewestFirst()


class LegacyRemovedAfterStored(LegacyModel):
    """Evictions are published after the batch's Stored, as in the kvbm
    manager: a legacy port that reordered its events without saying so."""

    def _use(self, op: Use) -> Step:
        step = super()._use(op)
        removed = [e for e in step.events if is_device(e, "removed")]
        stored = [e for e in step.events if not is_device(e, "removed")]
        if not removed or not stored:
            return step
        return Step(step.result, renumber([*stored, *removed], first_id(step.events, self.next_event_id)))


class LegacyParentAlwaysNone(LegacyModel):
    """The legacy Stored never carries a parent (the last hit is not tracked)."""

    def _use(self, op: Use) -> Step:
        step = super()._use(op)
        return Step(step.result, [rebuild_stored(e, parent=None) if is_device(e, "stored") else e for e in step.events])
