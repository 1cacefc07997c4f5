"""Mutants of the G1 model whose bug is in what it publishes (kvbm, atomic).

The state machine underneath stays the reference's; only the events differ,
so these are caught by the differential comparison of events and by the
router view's stream rules.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kvspec.adapters.mutants.edits import first_id, is_device, rebuild_stored, renumber
from kvspec.api import G1Model, Step
from kvspec.reference.g1 import Block
from kvspec.spec.wire import FullBlock, KvEvent, Promote, StorageTier, Use, make_removed


def _placed_refs(op: Use, step: Step) -> list[Any]:
    """The refs of the batch that a Use got through (all of them when ok)."""
    n = step.result.value if isinstance(step.result.value, int) and not isinstance(step.result.value, bool) else 0
    return list(op.blocks[:n])


class _StoredOnHit(G1Model):
    """Publishes an extra Stored, ahead of the batch's own events, for the
    blocks of the batch that were hits of the kind ``_counts``."""

    def _counts(self, owners_before: int) -> bool:
        raise NotImplementedError

    def _use(self, op: Use, prefer: Collection[int]) -> Step:
        before = {s: (b, b.owners) for s, b in self.blocks.items()}
        step = super()._use(op, prefer)
        hits: list[Block] = []
        for ref in op.blocks:
            if not isinstance(ref, FullBlock) or ref.full not in before:
                continue
            old, owners = before[ref.full]
            now = self.blocks.get(ref.full)
            if now is old and now.owners > owners and self._counts(owners) and now not in hits:
                hits.append(now)
        if not hits:
            return step
        start = first_id(step.events, self.next_event_id)
        extra = self._stored([b.seq for b in hits], hits, hits[0].parent_hash)
        return Step(step.result, renumber([extra, *step.events], start))


class StoredOnInactiveHit(_StoredOnHit):
    """Reactivating an inactive block goes through the registration path and
    publishes a Stored for a block the router already holds."""

    def _counts(self, owners_before: int) -> bool:
        return owners_before == 0


class StoredOnActiveHit(_StoredOnHit):
    """A hit on a block another request holds is announced again."""

    def _counts(self, owners_before: int) -> bool:
        return owners_before > 0


class StoredDupInBatch(G1Model):
    """A block that appears twice in one batch is listed twice in the Stored:
    its second occurrence (by then an active block of this very batch) is
    taken for a new one."""

    def _use(self, op: Use, prefer: Collection[int]) -> Step:
        known = set(self.blocks)
        step = super()._use(op, prefer)
        listed: list[int] = []
        for ref in _placed_refs(op, step):
            if isinstance(ref, FullBlock) and ref.full not in known and ref.full in self.blocks:
                listed.append(ref.full)
        if len(listed) == len(set(listed)):
            return step
        events = list(step.events)
        for i, ev in enumerate(events):
            if is_device(ev, "stored"):
                metas = [self.blocks[s] for s in listed]
                toks = [m.token_ids for m in metas if m.token_ids is not None]
                events[i] = rebuild_stored(
                    ev,
                    hashes=listed,
                    tokens_hashes=[m.local_hash for m in metas],
                    token_ids=toks if len(toks) == len(metas) else None,
                )
                break
        return Step(step.result, events)


class ParentFirstReused(G1Model):
    """The Stored is anchored to the first reused block of the batch instead
    of the last one (the anchor is set once and never moved)."""

    def _use(self, op: Use, prefer: Collection[int]) -> Step:
        known = dict(self.blocks)
        step = super()._use(op, prefer)
        first = next(
            (
                r.full
                for r in _placed_refs(op, step)
                if isinstance(r, FullBlock)
                and known.get(r.full) is not None
                and self.blocks.get(r.full) is known[r.full]
            ),
            None,
        )
        if first is None:
            return step
        events = [rebuild_stored(e, parent=first) if is_device(e, "stored") else e for e in step.events]
        return Step(step.result, events)


class ParentAlwaysNone(G1Model):
    """The Stored of a Use never carries a parent: the port forgot to track
    the anchor (last reused block, or the caller's parent)."""

    def _use(self, op: Use, prefer: Collection[int]) -> Step:
        step = super()._use(op, prefer)
        return Step(step.result, [rebuild_stored(e, parent=None) if is_device(e, "stored") else e for e in step.events])


class PromoteParentDropped(G1Model):
    """The Stored published when a partial block is promoted drops the
    parent hash the caller passed."""

    def _promote(self, op: Promote) -> Step:
        step = super()._promote(op)
        return Step(step.result, [rebuild_stored(e, parent=None) if is_device(e, "stored") else e for e in step.events])


class RemovedExtraBlock(G1Model):
    """The Removed also names the policy's next candidate, which was only
    peeked at and is still registered (an off-by-one over the victim list)."""

    def _publish_evictions(self, evicted: list[int]) -> list[KvEvent]:
        events = super()._publish_evictions(evicted)
        peek = self.policy.victim() if len(self.policy) else None
        out: list[KvEvent] = []
        for ev in events:
            if is_device(ev, "removed") and peek is not None and peek not in ev.hashes():
                ev = make_removed(ev.event_id, [*ev.hashes(), peek], dp_rank=ev.dp_rank, tier=ev.storage_tier)
            out.append(ev)
        return out


class RemovedMissingLast(G1Model):
    """The Removed leaves out the last evicted block (a loop over
    ``len - 1``); with a single eviction no Removed is published at all."""

    def _publish_evictions(self, evicted: list[int]) -> list[KvEvent]:
        events = super()._publish_evictions(evicted)
        out: list[KvEvent] = []
        for ev in events:
            if is_device(ev, "removed"):
                kept = ev.hashes()[:-1]
                if not kept:
                    self.next_event_id -= 1  # the Removed was the last event allocated
                    continue
                ev = make_removed(ev.event_id, kept, dp_rank=ev.dp_rank, tier=ev.storage_tier)
            out.append(ev)
        return out


class EventIdSkip(G1Model):
    """The event id counter is advanced twice on the removal path, leaving a
    gap after every Removed."""

    def _removed(self, seqs: list[int], tier: StorageTier = "device") -> KvEvent:
        ev = super()._removed(seqs, tier)
        self.next_event_id += 1
        return ev


class RemovedBeforeStored(G1Model):
    """Evictions are published as they happen, so a Use's Removed comes
    before its Stored (the order of the legacy manager, in a kvbm port)."""

    def _use(self, op: Use, prefer: Collection[int]) -> Step:
        step = super()._use(op, prefer)
        removed = [e for e in step.events if is_device(e, "removed")]
        if not removed or not any(is_device(e, "stored") for e in step.events):
            return step
        rest = [e for e in step.events if not is_device(e, "removed")]
        return Step(step.result, renumber([*removed, *rest], first_id(step.events, self.next_event_id)))


class PromoteExistingStored(G1Model):
    """Promoting a partial block into a block that already exists announces
    that block again."""

    def _promote(self, op: Promote) -> Step:
        existed = op.seq_hash in self.blocks
        step = super()._promote(op)
        if not existed:
            return step
        b = self.blocks[op.seq_hash]
        return Step(step.result, [*step.events, self._stored([b.seq], [b], op.parent_hash)])


class TokensHashIsBlockHash(G1Model):
    """Stored blocks carry their sequence hash where the local (tokens) hash
    belongs."""

    def _stored(self, seqs: list[int], metas: list[Block], parent: int | None) -> KvEvent:
        ev = super()._stored(seqs, metas, parent)
        return rebuild_stored(ev, tokens_hashes=list(seqs))


class RemovedDpRankZero(G1Model):
    """The removal path builds its event with the default dp_rank 0 instead
    of the manager's rank."""

    def _removed(self, seqs: list[int], tier: StorageTier = "device") -> KvEvent:
        return super()._removed(seqs, tier).model_copy(update={"dp_rank": 0})
