"""Small rewrites of published event lists, shared by the mutants.

Most event bugs are easiest to express as "the reference's events, then
changed": dropped, reordered, re-parented. Event ids must stay consecutive
after such a change unless the bug is about the ids, so every rewrite that
adds or drops an event renumbers what follows.
"""

from __future__ import annotations

from enum import Enum

from kvspec.spec.wire import KvEvent, Stored, make_stored


class _Keep(Enum):
    """A field ``rebuild_stored`` leaves as it was (None is a value there)."""

    KEEP = 0


_KEEP = _Keep.KEEP


def renumber(events: list[KvEvent], start: int) -> list[KvEvent]:
    """The same events with ids ``start, start + 1, ...``."""
    return [
        e if e.event_id == start + i else e.model_copy(update={"event_id": start + i}) for i, e in enumerate(events)
    ]


def first_id(events: list[KvEvent], fallback: int) -> int:
    return events[0].event_id if events else fallback


def rebuild_stored(
    ev: KvEvent,
    *,
    hashes: list[int] | None = None,
    tokens_hashes: list[int] | None = None,
    parent: int | _Keep | None = _KEEP,
    token_ids: list[list[int]] | _Keep | None = _KEEP,
) -> KvEvent:
    """A copy of the Stored ``ev`` with some of its fields replaced."""
    assert isinstance(ev.data, Stored), "rebuild_stored takes a Stored event"
    d = ev.data.stored
    new_hashes = hashes if hashes is not None else [b.block_hash for b in d.blocks]
    new_tokens = tokens_hashes if tokens_hashes is not None else [b.tokens_hash for b in d.blocks]
    return make_stored(
        ev.event_id,
        new_hashes,
        new_tokens,
        d.parent_hash if isinstance(parent, _Keep) else parent,
        dp_rank=ev.dp_rank,
        tier=ev.storage_tier,
        token_ids=ev.block_token_ids if isinstance(token_ids, _Keep) else token_ids,
    )


def is_device(ev: KvEvent, kind: str) -> bool:
    return ev.storage_tier == "device" and ev.kind == kind
