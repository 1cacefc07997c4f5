"""Mutants of the legacy model (dynamo-mocker 1.0.2 behaviour).

A port that claims the legacy profile must reproduce its quirks too (Removed
before Stored, no Stored after a failed Use); "fixing" one of them without
declaring a deviation is a divergence the suite must report.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from kvspec.adapters.mutants.edits import first_id, is_device, rebuild_stored, renumber
from kvspec.reference.legacy import Key, LegacyModel, key_of
from kvspec.reference.outcome import Step
from kvspec.spec.config import ManagerConfig
from kvspec.spec.wire import Destroy, FullBlock, Use, make_stored


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
