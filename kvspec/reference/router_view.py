"""The router view: a consumer model of the KV event stream.

It applies events the way a router's indexer does (per worker and dp_rank,
per storage tier) and reports every violation of the stream-checkable rules
with the rule id, the offending event and the state it contradicted. The same
object checks a live adapter's events step by step and a recorded log
offline; it never raises on a bad stream, it records and carries on the way a
tolerant indexer would, so that one run reports every problem.

Two counting modes:

- ``set`` (kvbm, atomic, legacy): a hash is stored or not. STORE-NO-DUP and
  REMOVE-EXACT apply.
- ``copies`` (vllm): a hash may be stored in several physical blocks; each
  Stored adds a copy (STORE-COPY) and each Removed takes one away
  (REMOVE-COPY); the hash leaves the view with its last copy.

PARENT-ANCHOR is checked on the tiers in ``anchored_tiers`` (the device tier
by default): the parent must be stored in that tier when the Stored arrives,
and, where the caller knows the true lineage (``expect_parent``), it must be
exactly the block before the event's first block. REMOVE-NO-ORPHAN is strict
and off unless ``strict=True``.

Transfer timing (G2-STORE-ON-COMPLETE), only where time is observable: a
caller that knows the manager's clock (the lockstep checker, on every Tick)
calls ``enable_timing(min_transfer_ms)`` and then ``observe_time(now_ms)``;
each event is stamped with the clock as last observed. A device Removed of a
block starts its offload; a host-pinned Stored of that block is flagged if
it arrives before that start plus the minimum transfer time of one block, or
if no device Removed of the block could have started it. Each host-pinned
Stored is paired with the earliest unpaired device Removed of its block, so
the check never flags a stream some transfer order could produce. A view
that is never given a clock (a recorded log without timestamps) skips it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Removed, Stored

Mode = Literal["set", "copies"]
Source = tuple[int, int]  # (worker_id, dp_rank)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: where in the stream, which event, and why."""

    rule: RuleId
    message: str
    event: KvEvent | None = None
    index: int = -1
    source: Source = (0, 0)
    context: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        where = f" at stream index {self.index}" if self.index >= 0 else ""
        ev = f"\n  event: {self.event.brief()}" if self.event is not None else ""
        ctx = "".join(f"\n  {k}: {v}" for k, v in self.context.items())
        return f"[{self.rule}] {self.message}{where}{ev}{ctx}"


@dataclass(slots=True)
class _Tier:
    copies: dict[int, int] = field(default_factory=dict)
    parent_of: dict[int, int | None] = field(default_factory=dict)
    children: dict[int, set[int]] = field(default_factory=dict)
    stored_by: dict[int, int] = field(default_factory=dict)  # hash -> event id that stored it
    removed_by: dict[int, int] = field(default_factory=dict)  # hash -> event id that removed it


@dataclass(slots=True)
class _Source:
    next_id: int | None
    tiers: dict[str, _Tier] = field(default_factory=dict)

    def tier(self, name: str) -> _Tier:
        t = self.tiers.get(name)
        if t is None:
            t = self.tiers[name] = _Tier()
        return t


class RouterView:
    def __init__(
        self,
        *,
        mode: Mode = "set",
        strict: bool = False,
        first_event_id: int | None = 0,
        expect_dp_rank: int | None = None,
        anchored_tiers: Iterable[str] = ("device",),
        hash_check: Callable[[int | None, int, int, list[int] | None], str | None] | None = None,
    ) -> None:
        """``first_event_id``: the id a manager's first event must carry (None:
        accept whatever comes first, for logs captured mid-stream).
        ``hash_check(parent, block_hash, tokens_hash, token_ids)`` returns a
        message when a stored block's hashes do not follow from its tokens."""
        self.mode = mode
        self.strict = strict
        self.first_event_id = first_event_id
        self.expect_dp_rank = expect_dp_rank
        self.anchored_tiers = frozenset(anchored_tiers)
        self.hash_check = hash_check
        self.sources: dict[Source, _Source] = {}
        self.violations: list[Violation] = []
        self.expected_parents: dict[int, int | None] = {}
        self.index = 0
        self._timing: _Timing | None = None

    # ------------------------------------------------------------------ state
    def _source(self, key: Source) -> _Source:
        s = self.sources.get(key)
        if s is None:
            s = self.sources[key] = _Source(next_id=self.first_event_id)
        return s

    def stored(self, tier: str = "device", worker_id: int = 0, dp_rank: int = 0) -> set[int]:
        """The hashes this view holds for one manager and tier."""
        src = self.sources.get((worker_id, dp_rank))
        if src is None or tier not in src.tiers:
            return set()
        return set(src.tiers[tier].copies)

    def copies(self, tier: str = "device", worker_id: int = 0, dp_rank: int = 0) -> dict[int, int]:
        src = self.sources.get((worker_id, dp_rank))
        if src is None or tier not in src.tiers:
            return {}
        return dict(src.tiers[tier].copies)

    def expect_parent(self, block_hash: int, parent_hash: int | None) -> None:
        """Tell the view the true parent of a block (from the operations)."""
        self.expected_parents[block_hash] = parent_hash

    # ------------------------------------------------------------- applying
    def apply_batch(
        self, events: Iterable[KvEvent], worker_id: int = 0, *, stored_first: bool = False
    ) -> list[Violation]:
        """Apply the events of one operation. With ``stored_first`` a Removed
        followed by a Stored in the batch breaks EVENT-ORDER."""
        out: list[Violation] = []
        seen_removed: KvEvent | None = None
        for ev in events:
            if stored_first and ev.kind == "removed" and ev.storage_tier == "device":
                seen_removed = seen_removed or ev
            if stored_first and ev.kind == "stored" and ev.storage_tier == "device" and seen_removed is not None:
                out.append(
                    self._flag(
                        RuleId.EVENT_ORDER,
                        f"Stored published after Removed event #{seen_removed.event_id} within one operation",
                        ev,
                        (worker_id, ev.dp_rank),
                    )
                )
            out.extend(self.apply(ev, worker_id))
        return out

    def apply(self, ev: KvEvent, worker_id: int = 0) -> list[Violation]:
        key = (worker_id, ev.dp_rank)
        src = self._source(key)
        out: list[Violation] = []
        if self.expect_dp_rank is not None and ev.dp_rank != self.expect_dp_rank:
            out.append(
                self._flag(
                    RuleId.EVENT_SOURCE,
                    f"event carries dp_rank {ev.dp_rank}",
                    ev,
                    key,
                    expected_dp_rank=self.expect_dp_rank,
                )
            )
        if src.next_id is not None and ev.event_id != src.next_id:
            what = "a gap" if ev.event_id > src.next_id else "a repeat or step back"
            out.append(
                self._flag(RuleId.EVENT_ID, f"event id {ev.event_id} is {what}", ev, key, expected_id=src.next_id)
            )
        src.next_id = ev.event_id + 1
        tier = src.tier(ev.storage_tier)
        if isinstance(ev.data, Stored):
            out.extend(self._stored(ev, tier, key))
        elif isinstance(ev.data, Removed):
            out.extend(self._removed(ev, tier, key))
        else:
            tier.copies.clear()
            tier.parent_of.clear()
            tier.children.clear()
        if self._timing is not None:
            out.extend(self._check_timing(ev, key))
        self.index += 1
        return out

    def _flag(self, rule: RuleId, message: str, ev: KvEvent | None, key: Source, **context: Any) -> Violation:
        v = Violation(rule, message, ev, self.index, key, context)
        self.violations.append(v)
        return v

    def _stored(self, ev: KvEvent, tier: _Tier, key: Source) -> list[Violation]:
        assert isinstance(ev.data, Stored)
        data = ev.data.stored
        out: list[Violation] = []
        blocks = data.blocks
        if ev.storage_tier in self.anchored_tiers:
            parent = data.parent_hash
            if parent is not None and tier.copies.get(parent, 0) == 0:
                ctx: dict[str, Any] = {"parent": parent}
                if parent in tier.removed_by:
                    ctx["parent_removed_by_event"] = tier.removed_by[parent]
                else:
                    ctx["parent_state"] = "never stored in this tier"
                out.append(self._flag(RuleId.PARENT_ANCHOR, f"parent {parent} is not stored", ev, key, **ctx))
            first = blocks[0].block_hash
            if first in self.expected_parents and self.expected_parents[first] != parent:
                out.append(
                    self._flag(
                        RuleId.PARENT_ANCHOR,
                        f"parent {parent} is not the block before {first}",
                        ev,
                        key,
                        expected_parent=self.expected_parents[first],
                    )
                )
        prev = data.parent_hash
        seen: set[int] = set()
        for i, b in enumerate(blocks):
            h = b.block_hash
            if self.hash_check is not None:
                toks = ev.block_token_ids[i] if ev.block_token_ids is not None else None
                msg = self.hash_check(prev, h, b.tokens_hash, toks)
                if msg is not None:
                    out.append(self._flag(RuleId.STORE_TOKENS_HASH, msg, ev, key, block=h))
            if h in seen and self.mode == "set":
                out.append(self._flag(RuleId.STORE_NO_DUP, f"block {h} appears twice in one Stored", ev, key))
                prev = h
                continue
            seen.add(h)
            n = tier.copies.get(h, 0)
            if n and self.mode == "set":
                out.append(
                    self._flag(
                        RuleId.STORE_NO_DUP,
                        f"block {h} is already stored",
                        ev,
                        key,
                        stored_by_event=tier.stored_by.get(h),
                    )
                )
            else:
                tier.copies[h] = n + 1
                tier.stored_by[h] = ev.event_id
                if n == 0:
                    old = tier.parent_of.get(h)
                    if old is not None and h in tier.children.get(old, ()):
                        tier.children[old].discard(h)
                    tier.parent_of[h] = prev
                    if prev is not None:
                        tier.children.setdefault(prev, set()).add(h)
            prev = h
        return out

    def _removed(self, ev: KvEvent, tier: _Tier, key: Source) -> list[Violation]:
        assert isinstance(ev.data, Removed)
        out: list[Violation] = []
        gone: list[int] = []
        rule = RuleId.REMOVE_EXACT if self.mode == "set" else RuleId.REMOVE_COPY
        seen: set[int] = set()
        for h in ev.data.removed.block_hashes:
            if self.mode == "set" and h in seen:
                out.append(self._flag(rule, f"block {h} appears twice in one Removed", ev, key))
                continue
            seen.add(h)
            n = tier.copies.get(h, 0)
            if n == 0:
                ctx: dict[str, Any] = {}
                if h in tier.removed_by:
                    ctx["already_removed_by_event"] = tier.removed_by[h]
                else:
                    ctx["state"] = "never stored in this tier"
                out.append(self._flag(rule, f"block {h} is not stored in tier {ev.storage_tier}", ev, key, **ctx))
                continue
            if n == 1:
                del tier.copies[h]
                tier.removed_by[h] = ev.event_id
                parent = tier.parent_of.pop(h, None)
                if parent is not None:
                    kids = tier.children.get(parent)
                    if kids is not None:
                        kids.discard(h)
                gone.append(h)
            else:
                tier.copies[h] = n - 1
        if self.strict:
            for h in gone:
                orphans = sorted(c for c in tier.children.get(h, ()) if c in tier.copies)
                if orphans:
                    out.append(
                        self._flag(
                            RuleId.REMOVE_NO_ORPHAN,
                            f"removing {h} leaves its stored children {orphans} without a parent",
                            ev,
                            key,
                        )
                    )
        return out

    # ------------------------------------------------------ transfer timing
    def enable_timing(self, min_transfer_ms: float, now_ms: float = 0.0, *, from_start: bool | None = None) -> None:
        """Check G2-STORE-ON-COMPLETE against the clock from now on.

        ``min_transfer_ms``: the least time one block's G1 -> G2 transfer can
        take (``OffloadConfig.transfer_ms()``; 0 for instant transfers, which
        still need the device Removed first). ``from_start``: no device
        Removed was applied before this call (default: no event was), so a
        host-pinned Stored with no device Removed before it is flagged;
        otherwise such a Stored is skipped (its transfer may predate the clock)."""
        if min_transfer_ms < 0:
            raise ValueError("min_transfer_ms must be >= 0")
        self._timing = _Timing(
            float(min_transfer_ms), float(now_ms), self.index == 0 if from_start is None else from_start
        )

    def observe_time(self, now_ms: float) -> None:
        """The manager's clock is now ``now_ms``: events applied from here on
        happen at that time. A time earlier than the last one is ignored (the
        manager's clock does not go back either, TIME-MONOTONIC)."""
        t = self._timing
        if t is not None and now_ms > t.now_ms:
            t.now_ms = float(now_ms)

    @property
    def now_ms(self) -> float | None:
        """The clock as last observed (None: timing is not observable)."""
        return None if self._timing is None else self._timing.now_ms

    def _check_timing(self, ev: KvEvent, key: Source) -> list[Violation]:
        t = self._timing
        assert t is not None
        out: list[Violation] = []
        if ev.storage_tier == "device" and isinstance(ev.data, Removed):
            for h in ev.data.removed.block_hashes:
                t.started.setdefault((key, h), deque()).append(t.now_ms)
        elif ev.storage_tier == "host_pinned" and isinstance(ev.data, Stored):
            for b in ev.data.stored.blocks:
                q = t.started.get((key, b.block_hash))
                if not q:
                    if t.from_start:
                        out.append(
                            self._flag(
                                RuleId.G2_STORE_ON_COMPLETE,
                                f"host-pinned Stored of block {b.block_hash} at {t.now_ms} ms, but no device "
                                "Removed of it started a transfer",
                                ev,
                                key,
                                block=b.block_hash,
                                now_ms=t.now_ms,
                            )
                        )
                    continue
                start = q.popleft()
                if not q:
                    del t.started[(key, b.block_hash)]
                earliest = start + t.min_transfer_ms
                if t.now_ms + _TIME_EPS * max(1.0, abs(earliest)) < earliest:
                    out.append(
                        self._flag(
                            RuleId.G2_STORE_ON_COMPLETE,
                            f"host-pinned Stored of block {b.block_hash} at {t.now_ms} ms: its transfer started "
                            f"at {start} ms (device Removed) and takes at least {t.min_transfer_ms} ms",
                            ev,
                            key,
                            block=b.block_hash,
                            now_ms=t.now_ms,
                            transfer_started_ms=start,
                            earliest_completion_ms=earliest,
                        )
                    )
        return out


#: slack for clocks computed another way (e.g. seconds times 1000)
_TIME_EPS = 1e-9


@dataclass(slots=True)
class _Timing:
    """The clock of a timed view and the transfers its stream has started."""

    min_transfer_ms: float
    now_ms: float
    #: every device Removed since the stream began was seen with a time
    from_start: bool
    #: (source, block) -> times of its device Removed not yet paired with a
    #: host-pinned Stored, oldest first
    started: dict[tuple[Source, int], deque[float]] = field(default_factory=dict)
