"""The router view: a consumer model of the KV event stream.

It applies events the way a router's indexer does (per worker and dp_rank,
per storage tier) and reports every violation of the stream-checkable rules
with the rule id, the offending event and the state it contradicted. The same
object checks a live adapter's events step by step (the lockstep checker,
``apply``/``apply_batch`` with ``KvEvent`` objects) and a recorded or live
engine stream (``kvspec check-log`` and ``kvspec watch``, through the field
level entry points ``on_stored``/``on_removed``/``on_cleared``, which take
the decoded fields so that no event object is built unless a violation needs
one). Both routes run the same rule code. It never raises on a bad stream: it
records and carries on the way a tolerant indexer would, so that one run
reports every problem.

Two counting modes:

- ``set`` (kvbm, atomic, legacy, Dynamo's event plane): a hash is stored or
  not. STORE-NO-DUP and REMOVE-EXACT apply.
- ``copies`` (vllm, SGLang): a hash may be stored in several physical blocks;
  each Stored adds a copy (STORE-COPY) and each Removed takes one away
  (REMOVE-COPY); the hash leaves the view with its last copy.

PARENT-ANCHOR is checked on the tiers in ``anchored_tiers`` (the device tier
by default, as the kvbm offload tier's host-pinned Stored carries its G1
parent; ``None`` checks every tier, as a router indexing each tier as its own
prefix tree needs): the parent must be stored in that tier when the Stored
arrives, and, where the caller knows the true lineage (``expect_parent``), it
must be exactly the block before the event's first block. REMOVE-NO-ORPHAN
is strict and off unless ``strict=True``.

State is proportional to the blocks stored now, not to the stream's length:
per tier one record per stored hash (copies, parent, the event that stored
it), a count of stored children per parent, and a bounded memory of recent
removals (for the "removed by event #N" context of a report). Violations are
counted per rule; ``keep`` bounds how many are kept as objects.

Stored events may also be checked by a ``StoredCheck`` (hashes against
tokens, ``kvspec/streams/hashcheck.py``) or, for the lockstep checker, by
a per-block ``hash_check`` function.

Streams from a live fleet (``resync=True``, what ``check-log`` and ``watch``
use; the lockstep checker keeps every step strict): a tier whose history
before the first event seen is unknown (a capture started mid-stream, a
publisher that joined late, events lost in a gap) is *partial*. In a
partial tier a hash the stream has not shown since is unknown, not absent:
a Removed of it, or a Stored naming it as parent, is no finding (in set
counting such a parent is taken as stored from then on; in copies counting
any hash may still have copies from before, so REMOVE-COPY, PARENT-ANCHOR
and REMOVE-NO-ORPHAN stay silent there until the tier is cleared). A hash
seen removed since (within the recent-removals memory) is known absent, and
the rules apply to it as usual. An event id past the one due is a gap:
reported once (EVENT-ID), then the source's tiers are reset to partial, so
a lost batch costs one finding and no follow-on. An id back at the
producer's first id is a restart: a notice (not a finding), the source's
state reset to empty, checking goes on. Any other id already passed is a
redelivery when the view's state shows that event applied exactly
(a Stored's blocks still stored by that event id under the same parents,
a Removed's blocks removed by it): counted and skipped; otherwise it is an
EVENT-ID finding, and skipped too (applying a stale event would cascade).
``sequential_orphans`` checks REMOVE-NO-ORPHAN after each hash of a Removed
instead of after the whole event.

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

from collections import Counter, deque
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from kvspec.spec.rules import RuleId, rid

if TYPE_CHECKING:  # imported where used: the stream checkers build no event objects unless a finding needs one
    from kvspec.spec.wire import KvEvent

Mode = Literal["set", "copies"]
Source = tuple[int, int]  # (worker_id, dp_rank)
#: one tier of one manager: (worker_id, dp_rank, tier)
TierKey = tuple[int, int, str]
#: what a StoredCheck reports: the rule, a message, and context
Problem = tuple[RuleId, str, dict[str, Any]]
#: where in the input an event came from (a line number, or frame and event
#: index); opaque to the view, formatted by whoever reads the report
At = int | tuple[int, ...] | None

#: how many recent removals each tier remembers for report context
RECENT_REMOVALS = 4096
#: orphan reports that list the orphaned children (each costs a scan of the tier)
ORPHAN_LISTINGS = 1000
#: the event id and stream index of a block taken as stored before the
#: capture (named as a parent in a partial tier)
PRESUMED = -1
#: closed id segments each source remembers (to tell an id applied before from one never seen)
SEGMENTS = 16


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: where in the stream, which event, and why."""

    rule: RuleId
    message: str
    event: KvEvent | None = None
    index: int = -1
    source: Source = (0, 0)
    context: dict[str, Any] = field(default_factory=dict)
    tier: str = "device"
    #: the place in the input (line, or frame and event), when the caller gave one
    at: At = None

    def __str__(self) -> str:
        where = f" at stream index {self.index}" if self.index >= 0 else ""
        ev = f"\n  event: {self.event.brief()}" if self.event is not None else ""
        ctx = "".join(f"\n  {k}: {v}" for k, v in self.context.items())
        return f"[{self.rule}] {self.message}{where}{ev}{ctx}"


@dataclass(frozen=True, slots=True)
class Notice:
    """Something about the stream that is no finding: a publisher restart,
    an event delivered again."""

    kind: str
    message: str
    source: Source = (0, 0)
    tier: str = "device"
    at: At = None


class StoredCheck(Protocol):
    """Checks a Stored's blocks against what it carries (hashes, tokens).

    ``stored`` returns the problems found (or None); ``gone`` (once per
    Removed, with the hashes that left) and ``cleared`` tell it which blocks
    left the view, so that any state it keeps stays
    proportional to the stored blocks."""

    def stored(
        self,
        key: TierKey,
        parent: int | None,
        hashes: Sequence[int],
        tokens_hashes: Sequence[int] | None,
        token_ids: Sequence[Sequence[int]] | None,
        meta: Any,
    ) -> list[Problem] | None: ...

    def gone(self, key: TierKey, block_hashes: list[int]) -> None: ...

    def cleared(self, key: TierKey) -> None: ...


HashCheckFn = Callable[[int | None, int, int, list[int] | None], str | None]


class _PerBlockCheck:
    """A ``hash_check(parent, block_hash, tokens_hash, token_ids)`` function
    as a StoredCheck: STORE-TOKENS-HASH for each block it has a message for."""

    def __init__(self, fn: HashCheckFn) -> None:
        self.fn = fn

    def stored(
        self,
        key: TierKey,
        parent: int | None,
        hashes: Sequence[int],
        tokens_hashes: Sequence[int] | None,
        token_ids: Sequence[Sequence[int]] | None,
        meta: Any,
    ) -> list[Problem] | None:
        out: list[Problem] | None = None
        prev = parent
        for i, h in enumerate(hashes):
            toks = list(token_ids[i]) if token_ids is not None else None
            msg = self.fn(prev, h, tokens_hashes[i] if tokens_hashes is not None else 0, toks)
            if msg is not None:
                out = out or []
                out.append((rid("STORE-TOKENS-HASH"), msg, {"block": h}))
            prev = h
        return out

    def gone(self, key: TierKey, block_hashes: list[int]) -> None:
        return None

    def cleared(self, key: TierKey) -> None:
        return None


class _Recent:
    """Recent removals of a tier: hash -> (event id, stream index). Two
    generations of at most ``cap`` entries each: the older is dropped when
    the newer fills up, so lookups see between ``cap`` and ``2 * cap`` of
    the latest removals at O(1) per removal."""

    __slots__ = ("cap", "cur", "old")

    def __init__(self, cap: int = RECENT_REMOVALS) -> None:
        self.cap = cap
        self.cur: dict[int, tuple[int, int]] = {}
        self.old: dict[int, tuple[int, int]] = {}

    def put(self, h: int, eid: int, index: int) -> None:
        self.cur[h] = (eid, index)
        if len(self.cur) >= self.cap:
            self.rotate()

    def rotate(self) -> None:
        self.old = self.cur
        self.cur = {}

    def get(self, h: int) -> tuple[int, int] | None:
        r = self.cur.get(h)
        return r if r is not None else self.old.get(h)

    def clear(self) -> None:
        self.cur = {}
        self.old = {}


#: a stored block's record: (copies, parent, event id that stored it, stream index of that event)
Record = tuple[int, int | None, int, int]
#: makers of a tier's two tables (``RouterView.use_tables``)
Tables = tuple[Callable[[], MutableMapping[int, Record]], Callable[[], MutableMapping[int, int]]]


@dataclass(slots=True)
class _Tier:
    #: stored hash -> its record (a dict, or the raw reader's C table: ``RouterView.use_tables``)
    live: MutableMapping[int, Record] = field(default_factory=dict)
    #: parent hash -> how many stored blocks name it as parent
    kids: MutableMapping[int, int] = field(default_factory=dict)
    removed: _Recent = field(default_factory=_Recent)
    #: what the tier held before the first event seen is unknown (see the module docstring)
    partial: bool = False

    def reset(self, partial: bool = False) -> None:
        self.live.clear()
        self.kids.clear()
        self.removed.clear()
        self.partial = partial


@dataclass(slots=True)
class _Source:
    next_id: int | None
    tiers: dict[str, _Tier] = field(default_factory=dict)
    #: tiers made from here on start partial
    partial: bool = False
    #: events counted in closed id segments (a gap, a restart or a step back closes one)
    counted: int = 0
    #: the first id of the current segment (None: the stream carries no ids)
    seg_start: int | None = None
    gaps: int = 0
    restarts: int = 0
    redelivered: int = 0
    #: the id ranges [first, next) of the last closed segments
    history: list[tuple[int, int]] = field(default_factory=list)
    #: the makers of new tiers' tables (None: dicts)
    tables: Tables | None = None

    def tier(self, name: str) -> _Tier:
        t = self.tiers.get(name)
        if t is None:
            if self.tables is None:
                t = _Tier(partial=self.partial)
            else:
                t = _Tier(live=self.tables[0](), kids=self.tables[1](), partial=self.partial)
            self.tiers[name] = t
        return t

    def events(self) -> int | None:
        """Events applied, from the ids (None: the stream carries none)."""
        if self.seg_start is None or self.next_id is None:
            return None
        return self.counted + self.next_id - self.seg_start

    def new_segment(self, event_id: int) -> None:
        if self.seg_start is not None and self.next_id is not None:
            self.counted += self.next_id - self.seg_start
            self.history.append((self.seg_start, self.next_id))
            if len(self.history) > SEGMENTS:
                del self.history[0]
        self.seg_start = event_id

    def applied(self, event_id: int) -> bool:
        """Whether an event under this id was applied (in the recent id segments)."""
        if self.seg_start is not None and self.next_id is not None and self.seg_start <= event_id < self.next_id:
            return True
        return any(a <= event_id < b for a, b in self.history)


class RouterView:
    def __init__(
        self,
        *,
        mode: Mode = "set",
        strict: bool = False,
        first_event_id: int | None = 0,
        expect_dp_rank: int | None = None,
        anchored_tiers: Iterable[str] | None = ("device",),
        hash_check: HashCheckFn | None = None,
        stored_check: StoredCheck | None = None,
        keep: int | None = None,
        on_violation: Callable[[Violation], None] | None = None,
        shared_tiers: Iterable[str] = (),
        resync: bool = False,
        start_event_id: int | None = None,
        sequential_orphans: bool = False,
        on_notice: Callable[[Notice], None] | None = None,
    ) -> None:
        """``first_event_id``: the id a manager's first event must carry (None:
        accept whatever comes first, for logs captured mid-stream).
        ``anchored_tiers``: where PARENT-ANCHOR's "parent is stored" applies
        (None: every tier). ``hash_check(parent, block_hash, tokens_hash,
        token_ids)`` returns a message when a stored block's hashes do not
        follow from its tokens; ``stored_check`` is the general form (one of
        the two). ``keep``: how many violations to keep in ``violations``
        (all are counted in ``counts``); ``on_violation`` sees each as it
        happens. ``shared_tiers``: tiers one process shares among its workers
        (the kvbm lower tiers, ``disk`` and ``external``): a hash live there
        under one worker must not be Stored there by another (TIER-DEDUP).

        ``resync``: the stream semantics of a live fleet (module docstring):
        partial tiers, gaps reported once, restarts, redeliveries skipped.
        ``start_event_id``: the id a publisher's first event carries, which
        tells a restart and a source seen from its start (default:
        ``first_event_id``). ``on_notice`` sees restarts and redeliveries."""
        if hash_check is not None and stored_check is not None:
            raise ValueError("give hash_check or stored_check, not both")
        self.mode = mode
        self.strict = strict
        self.first_event_id = first_event_id
        self.expect_dp_rank = expect_dp_rank
        self.anchored_tiers = None if anchored_tiers is None else frozenset(anchored_tiers)
        self.hash_check = hash_check
        self.check: StoredCheck | None = _PerBlockCheck(hash_check) if hash_check is not None else stored_check
        self.keep = keep
        self.on_violation = on_violation
        self.sources: dict[Source, _Source] = {}
        self.violations: list[Violation] = []
        self.counts: Counter[RuleId] = Counter()
        self.expected_parents: dict[int, int | None] = {}
        self.index = 0
        #: the makers of new tiers' tables (``use_tables``; None: dicts)
        self.tables: Tables | None = None
        self._timing: _Timing | None = None
        self._collect: list[Violation] | None = None
        self._orphan_listings = 0
        self.shared_tiers = frozenset(shared_tiers)
        #: shared tier -> hash -> the manager whose Stored of it is live
        self._shared: dict[str, dict[int, Source]] = {t: {} for t in self.shared_tiers}
        self.resync = resync
        self.start_event_id = first_event_id if start_event_id is None else start_event_id
        self.sequential_orphans = sequential_orphans
        self.on_notice = on_notice
        #: notices by kind (restart, redelivered, unknown)
        self.notices: Counter[str] = Counter()
        #: workers whose sources start partial when made (an id-less feed joined late or lost batches)
        self.start_unknown: set[int] = set()
        #: gaps (lost events or batches) per worker, each also an EVENT-ID finding
        self.gaps: Counter[int] = Counter()

    # ------------------------------------------------------------------ state
    def _source(self, key: Source) -> _Source:
        s = self.sources.get(key)
        if s is None:
            s = self.sources[key] = _Source(
                next_id=self.first_event_id, partial=key[0] in self.start_unknown, tables=self.tables
            )
        return s

    def use_tables(self, tables: Tables) -> None:
        """Hold every tier's live blocks and child counts in the mappings
        these make (the raw reader's C tables, ``fastview``), the tiers that
        exist moved over: the same contents, so the same findings; only the
        iteration order differs, which no check or report depends on."""
        self.tables = tables
        make_live, make_kids = tables
        for src in self.sources.values():
            src.tables = tables
            for t in src.tiers.values():
                live, kids = make_live(), make_kids()
                for h, rec in t.live.items():
                    live[h] = rec
                for h, n in t.kids.items():
                    kids[h] = n
                t.live, t.kids = live, kids

    def reset_worker(self, worker: int, *, partial: bool) -> None:
        """Forget what this worker's sources hold (a restart seen by the
        transport, ``partial`` False; or batches lost, ``partial`` True):
        their tiers start over, the next event id is taken as it comes, and
        sources of the worker made later start ``partial`` too."""
        if partial:
            self.start_unknown.add(worker)
        else:
            self.start_unknown.discard(worker)
        for key, src in self.sources.items():
            if key[0] == worker:
                self._reset_source(key, src, partial)
                if src.seg_start is not None and src.next_id is not None:  # close the id segment
                    src.new_segment(src.next_id)
                src.seg_start = None
                # from its start (a restart seen from sequence 0): the first id; else whatever comes
                src.next_id = None if partial else self.start_event_id

    def _reset_source(self, key: Source, src: _Source, partial: bool) -> None:
        src.partial = partial
        for name, t in src.tiers.items():
            t.reset(partial)
            if self.check is not None:
                self.check.cleared((key[0], key[1], name))
            holders = self._shared.get(name)
            if holders:
                for h in [h for h, k in holders.items() if k == key]:
                    del holders[h]

    def notice(self, kind: str, message: str, worker: int, dp_rank: int, tier: str = "device", at: At = None) -> None:
        """Record something the operator should know that is no finding (a
        restart, a redelivery): counted by kind, passed to ``on_notice``."""
        self.notices[kind] += 1
        if self.on_notice is not None:
            self.on_notice(Notice(kind, message, (worker, dp_rank), tier, at))

    def stored(self, tier: str = "device", worker_id: int = 0, dp_rank: int = 0) -> set[int]:
        """The hashes this view holds for one manager and tier."""
        src = self.sources.get((worker_id, dp_rank))
        if src is None or tier not in src.tiers:
            return set()
        return set(src.tiers[tier].live)

    def copies(self, tier: str = "device", worker_id: int = 0, dp_rank: int = 0) -> dict[int, int]:
        src = self.sources.get((worker_id, dp_rank))
        if src is None or tier not in src.tiers:
            return {}
        return {h: rec[0] for h, rec in src.tiers[tier].live.items()}

    def live_blocks(self) -> dict[TierKey, int]:
        """How many hashes each (worker, dp_rank, tier) holds now."""
        return {(w, d, name): len(t.live) for (w, d), s in self.sources.items() for name, t in s.tiers.items()}

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
                        rid("EVENT-ORDER"),
                        f"Stored published after Removed event #{seen_removed.event_id} within one operation",
                        (worker_id, ev.dp_rank),
                        ev.storage_tier,
                        ev,
                    )
                )
            out.extend(self.apply(ev, worker_id))
        return out

    def apply(self, ev: KvEvent, worker_id: int = 0) -> list[Violation]:
        """Apply one event object; returns the violations it caused."""
        from kvspec.spec.wire import Removed, Stored

        out: list[Violation] = []
        self._collect = out
        try:
            d = ev.data
            if isinstance(d, Stored):
                s = d.stored
                self.on_stored(
                    worker_id,
                    ev.dp_rank,
                    ev.storage_tier,
                    ev.event_id,
                    s.parent_hash,
                    [b.block_hash for b in s.blocks],
                    [b.tokens_hash for b in s.blocks],
                    ev.block_token_ids,
                    ev=ev,
                )
            elif isinstance(d, Removed):
                self.on_removed(worker_id, ev.dp_rank, ev.storage_tier, ev.event_id, d.removed.block_hashes, ev=ev)
            else:
                self.on_cleared(worker_id, ev.dp_rank, ev.storage_tier, ev.event_id, ev=ev)
        finally:
            self._collect = None
        return out

    def _begin(self, worker: int, dp_rank: int, tier: str, event_id: int | None, ev: Any) -> tuple[_Source | None, int]:
        """EVENT-SOURCE and EVENT-ID, shared by the three kinds; returns the
        source and the event id to record (the stream index when the stream
        carries none); the source is None for a redelivery, to be skipped."""
        key = (worker, dp_rank)
        src = self.sources.get(key)
        if src is None:
            src = self._source(key)
            if self.resync and event_id is not None:
                # seen from its start, or joined late: what it held before is unknown
                start = self.start_event_id
                src.partial = start is None or event_id != start
        if self.expect_dp_rank is not None and dp_rank != self.expect_dp_rank:
            self._flag(
                rid("EVENT-SOURCE"),
                f"event carries dp_rank {dp_rank}",
                key,
                tier,
                ev,
                expected_dp_rank=self.expect_dp_rank,
            )
        if event_id is None:
            return src, self.index
        nxt = src.next_id
        if nxt is not None and event_id != nxt:
            if self.resync:
                if not self._resync(key, src, tier, event_id, nxt, ev):
                    return None, event_id
            else:
                what = "a gap" if event_id > nxt else "a repeat or step back"
                self._flag(rid("EVENT-ID"), f"event id {event_id} is {what}", key, tier, ev, expected_id=nxt)
        if src.seg_start is None or (nxt is not None and event_id != nxt):
            src.new_segment(event_id)
        src.next_id = event_id + 1
        return src, event_id

    def _resync(self, key: Source, src: _Source, tier: str, event_id: int, nxt: int, ev: Any) -> bool:
        """An event id other than the one due, in a live fleet's stream:
        False when the event is a redelivery to skip."""
        if event_id > nxt:
            src.gaps += 1
            self.gaps[key[0]] += 1
            self._flag(rid("EVENT-ID"), f"event id {event_id} is a gap", key, tier, ev, expected_id=nxt)
            self._reset_source(key, src, True)  # what the lost events did is unknown
            return True
        if self._same_as_applied(src, ev, event_id):
            src.redelivered += 1
            self.notice("redelivered", f"event id {event_id} delivered again (skipped)", key[0], key[1], tier)
            return False
        start = self.start_event_id
        if start is not None and event_id == start:
            src.restarts += 1
            self._reset_source(key, src, False)
            self.notice(
                "restart",
                f"event id {event_id} after {nxt - 1}: the publisher restarted (its state starts empty)",
                key[0],
                key[1],
                tier,
            )
            return True
        if src.applied(event_id):
            # an id applied before, with other content (or content the state no longer shows): one
            # finding, not applied, the ids go on from where they were
            self._flag(
                rid("EVENT-ID"),
                f"event id {event_id} is a repeat or step back, other than the event applied under it (not applied)",
                key,
                tier,
                ev,
                expected_id=nxt,
            )
            return False
        # back into ids never applied (the ids moved): one finding; not applied, the ids go on from it
        # and the worker's state is unknown from here
        self._flag(
            rid("EVENT-ID"),
            f"event id {event_id} is a step back to an id never seen (not applied; the state is unknown from here)",
            key,
            tier,
            ev,
            expected_id=nxt,
        )
        self._reset_source(key, src, True)
        src.new_segment(event_id + 1)
        src.next_id = event_id + 1
        return False

    @staticmethod
    def _same_as_applied(src: _Source, ref: Any, event_id: int) -> bool:
        """Whether an event under an id already passed is the one applied
        under it, as far as the state shows: a Stored whose blocks are all
        still stored by that id with the same parents, a Removed whose
        blocks were all removed by that id and not stored since."""
        if not isinstance(ref, tuple):
            return False
        kind, _, tname, parent, hashes, _, _ = ref
        tier = src.tiers.get(tname)
        if tier is None or not hashes:
            return False
        if kind == "stored":
            prev = parent
            for h in hashes:
                rec = tier.live.get(h)
                if rec is None or rec[2] != event_id or rec[1] != prev:
                    return False
                prev = h
            return True
        if kind == "removed":
            for h in hashes:
                gone = tier.removed.get(h)
                if h in tier.live or gone is None or gone[0] != event_id:
                    return False
            return True
        return False

    def on_stored(
        self,
        worker: int,
        dp_rank: int,
        tier_name: str,
        event_id: int | None,
        parent: int | None,
        hashes: Sequence[int],
        tokens_hashes: Sequence[int] | None = None,
        token_ids: Sequence[Sequence[int]] | None = None,
        meta: Any = None,
        at: At = None,
        ev: KvEvent | None = None,
    ) -> None:
        """Apply a Stored given as fields (``event_id`` None: the stream
        carries no ids; ``tokens_hashes``/``token_ids`` when it carries them;
        ``meta`` is passed to the StoredCheck)."""
        ref: Any = ev if ev is not None else ("stored", event_id, tier_name, parent, hashes, tokens_hashes, at)
        key = (worker, dp_rank)
        src: _Source | None = self.sources.get(key)
        if src is None or event_id is None or src.next_id != event_id or self.expect_dp_rank is not None:
            src, eid = self._begin(worker, dp_rank, tier_name, event_id, ref)
            if src is None:  # delivered again: applied already
                self.index += 1
                return
        else:  # the common case: the id expected, nothing else to check
            src.next_id = event_id + 1
            eid = event_id
        tier = src.tiers.get(tier_name)
        if tier is None:
            tier = src.tier(tier_name)
        live = tier.live
        anchored = self.anchored_tiers
        if parent is not None and (anchored is None or tier_name in anchored) and parent not in live:
            gone = tier.removed.get(parent)
            if tier.partial and (gone is None or self.mode != "set"):
                # stored before the capture (or the gap): unknown, not missing
                self.notices["unknown"] += 1
                if self.mode == "set":
                    live[parent] = (1, None, PRESUMED, PRESUMED)
            else:
                ctx: dict[str, Any] = {"parent": parent}
                if gone is not None:
                    ctx["parent_removed_by_event"] = gone[0]
                else:
                    ctx["parent_state"] = f"never stored in tier {tier_name}"
                self._flag(rid("PARENT-ANCHOR"), f"parent {parent} is not stored", key, tier_name, ref, **ctx)
        if self.expected_parents and (anchored is None or tier_name in anchored) and hashes:
            first = hashes[0]
            if first in self.expected_parents and self.expected_parents[first] != parent:
                self._flag(
                    rid("PARENT-ANCHOR"),
                    f"parent {parent} is not the block before {first}",
                    key,
                    tier_name,
                    ref,
                    expected_parent=self.expected_parents[first],
                )
        check = self.check
        if check is not None:
            problems = check.stored((worker, dp_rank, tier_name), parent, hashes, tokens_hashes, token_ids, meta)
            if problems:
                for rule, msg, pctx in problems:
                    self._flag(rule, msg, key, tier_name, ref, **pctx)
        kids = tier.kids
        index = self.index
        set_mode = self.mode == "set"
        prev = parent
        setdefault = live.setdefault
        for h in hashes:
            new = (1, prev, eid, index)
            rec = setdefault(h, new)
            if rec is new:
                if prev is not None:
                    kids[prev] = kids.get(prev, 0) + 1
            elif set_mode:
                if rec[3] == index:
                    self._flag(rid("STORE-NO-DUP"), f"block {h} appears twice in one Stored", key, tier_name, ref)
                else:
                    self._flag(
                        rid("STORE-NO-DUP"),
                        f"block {h} is already stored",
                        key,
                        tier_name,
                        ref,
                        stored_by_event=rec[2] if rec[2] != PRESUMED else "before the capture (named as a parent)",
                    )
            else:
                live[h] = (rec[0] + 1, rec[1], eid, index)
            prev = h
        if self._timing is not None and tier_name == "host_pinned":
            self._check_timing("stored", tier_name, hashes, key, ref)
        if tier_name in self.shared_tiers:
            self._shared_stored(key, tier_name, hashes, ref)
        self.index = index + 1

    def on_removed(
        self,
        worker: int,
        dp_rank: int,
        tier_name: str,
        event_id: int | None,
        hashes: Sequence[int],
        at: At = None,
        ev: KvEvent | None = None,
    ) -> None:
        """Apply a Removed given as fields."""
        ref: Any = ev if ev is not None else ("removed", event_id, tier_name, None, hashes, None, at)
        key = (worker, dp_rank)
        src: _Source | None = self.sources.get(key)
        if src is None or event_id is None or src.next_id != event_id or self.expect_dp_rank is not None:
            src, eid = self._begin(worker, dp_rank, tier_name, event_id, ref)
            if src is None:  # delivered again: applied already
                self.index += 1
                return
        else:
            src.next_id = event_id + 1
            eid = event_id
        tier = src.tiers.get(tier_name)
        if tier is None:
            tier = src.tier(tier_name)
        live = tier.live
        kids = tier.kids
        removed = tier.removed
        recent = removed.cur
        index = self.index
        mark = (eid, index)
        set_mode = self.mode == "set"
        check = self.check
        gone: list[int] = []
        sequential = self.sequential_orphans and self.strict
        for h in hashes:
            rec = live.pop(h, None) if set_mode else live.get(h)
            if rec is None:
                self._not_stored(h, key, tier_name, tier, ref, index, set_mode)
                continue
            if set_mode or rec[0] == 1:
                if not set_mode:
                    del live[h]
                recent[h] = mark
                p = rec[1]
                if p is not None:
                    k = kids.get(p)
                    if k == 1:
                        del kids[p]
                    elif k:
                        kids[p] = k - 1
                gone.append(h)
                if sequential and kids.get(h):  # per hash, in the order the Removed lists them
                    self._orphaned(h, kids[h], key, tier_name, tier, ref)
            else:
                live[h] = (rec[0] - 1, rec[1], rec[2], rec[3])
        if len(recent) >= removed.cap:
            removed.rotate()
        if gone:
            if check is not None:
                check.gone((worker, dp_rank, tier_name), gone)
            if self.strict and not sequential:
                for h in gone:
                    n_orphans = kids.get(h, 0)
                    if n_orphans:
                        self._orphaned(h, n_orphans, key, tier_name, tier, ref)
        if self._timing is not None and tier_name == "device":
            self._check_timing("removed", tier_name, hashes, key, ref)
        if gone and tier_name in self.shared_tiers:
            holders = self._shared[tier_name]
            for h in gone:
                if holders.get(h) == key:
                    del holders[h]
        self.index = index + 1

    def on_cleared(
        self,
        worker: int,
        dp_rank: int,
        tier_name: str,
        event_id: int | None,
        at: At = None,
        ev: KvEvent | None = None,
    ) -> None:
        """Apply a Cleared: the tier forgets everything it held for the source."""
        ref: Any = ev if ev is not None else ("cleared", event_id, tier_name, None, (), None, at)
        src, _ = self._begin(worker, dp_rank, tier_name, event_id, ref)
        if src is None:
            self.index += 1
            return
        src.tier(tier_name).reset()  # known empty from here on
        if tier_name in self.shared_tiers:
            key = (worker, dp_rank)
            holders = self._shared[tier_name]
            for h in [h for h, k in holders.items() if k == key]:
                del holders[h]
        if self.check is not None:
            self.check.cleared((worker, dp_rank, tier_name))
        self.index += 1

    def _not_stored(
        self, h: int, key: Source, tier_name: str, tier: _Tier, ref: Any, index: int, set_mode: bool
    ) -> None:
        rule = rid("REMOVE-EXACT") if set_mode else rid("REMOVE-COPY")
        gone = tier.removed.get(h)
        if set_mode and gone is not None and gone[1] == index:
            self._flag(rule, f"block {h} appears twice in one Removed", key, tier_name, ref)
            return
        if tier.partial and (gone is None or not set_mode):
            # stored before the capture (or the gap): unknown, not missing; known absent from here on
            self.notices["unknown"] += 1
            if set_mode:
                tier.removed.cur[h] = (ref[1] if isinstance(ref, tuple) and ref[1] is not None else -1, index)
            return
        ctx: dict[str, Any] = {}
        if gone is not None:
            ctx["already_removed_by_event"] = gone[0]
        else:
            ctx["state"] = "never stored in this tier"
        self._flag(rule, f"block {h} is not stored in tier {tier_name}", key, tier_name, ref, **ctx)

    def _orphaned(self, h: int, n: int, key: Source, tier_name: str, tier: _Tier, ref: Any) -> None:
        if tier.partial and self.mode != "set":
            return  # copies of h from before the capture may remain
        ctx: dict[str, Any] = {}
        if self._orphan_listings < ORPHAN_LISTINGS:
            self._orphan_listings += 1
            kids = sorted(c for c, rec in tier.live.items() if rec[1] == h)
            ctx["children_stored_by_events"] = sorted({tier.live[c][2] for c in kids})
            what = f"its stored children {kids}"
        else:
            what = f"{n} stored child(ren)"
        self._flag(
            rid("REMOVE-NO-ORPHAN"),
            f"removing {h} leaves {what} without a parent in tier {tier_name}",
            key,
            tier_name,
            ref,
            **ctx,
        )

    def report(
        self, rule: RuleId, message: str, worker: int, dp_rank: int, tier: str, at: At = None, **context: Any
    ) -> Violation:
        """Record a violation found outside the view (for example a lost or
        repeated transport sequence number), counted with the others."""
        v = Violation(rule, message, None, self.index, (worker, dp_rank), context, tier, at)
        self._keep(v)
        return v

    def _keep(self, v: Violation) -> None:
        self.counts[v.rule] += 1
        if self.keep is None or len(self.violations) < self.keep:
            self.violations.append(v)
        if self._collect is not None:
            self._collect.append(v)
        if self.on_violation is not None:
            self.on_violation(v)

    def _shared_stored(self, key: Source, tier_name: str, hashes: Sequence[int], ref: Any) -> None:
        """TIER-DEDUP across workers: a shared tier holds a block once."""
        holders = self._shared[tier_name]
        for h in hashes:
            holder = holders.setdefault(h, key)
            if holder != key:
                self._flag(
                    rid("TIER-DEDUP"),
                    f"block {h} is in the shared {tier_name} tier already, Stored by worker {holder[0]}",
                    key,
                    tier_name,
                    ref,
                    holder=holder,
                )

    def _flag(self, rule: RuleId, message: str, key: Source, tier: str, ref: Any, **context: Any) -> Violation:
        if isinstance(ref, tuple):
            ev, at = _event_of(ref, key[1]), ref[6]
        else:
            ev, at = ref, None
        v = Violation(rule, message, ev, self.index, key, context, tier, at)
        self._keep(v)
        return v

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

    def _check_timing(self, kind: str, tier: str, hashes: Sequence[int], key: Source, ref: Any) -> None:
        t = self._timing
        assert t is not None
        if kind == "removed":
            for h in hashes:
                t.started.setdefault((key, h), deque()).append(t.now_ms)
            return
        for h in hashes:
            q = t.started.get((key, h))
            if not q:
                if t.from_start:
                    self._flag(
                        rid("G2-STORE-ON-COMPLETE"),
                        f"host-pinned Stored of block {h} at {t.now_ms} ms, but no device Removed of it started a "
                        "transfer",
                        key,
                        tier,
                        ref,
                        block=h,
                        now_ms=t.now_ms,
                    )
                continue
            start = q.popleft()
            if not q:
                del t.started[(key, h)]
            earliest = start + t.min_transfer_ms
            if t.now_ms + _TIME_EPS * max(1.0, abs(earliest)) < earliest:
                self._flag(
                    rid("G2-STORE-ON-COMPLETE"),
                    f"host-pinned Stored of block {h} at {t.now_ms} ms: its transfer started at {start} ms (device "
                    f"Removed) and takes at least {t.min_transfer_ms} ms",
                    key,
                    tier,
                    ref,
                    block=h,
                    now_ms=t.now_ms,
                    transfer_started_ms=start,
                    earliest_completion_ms=earliest,
                )


def _event_of(ref: tuple[Any, ...], dp_rank: int) -> KvEvent:
    """The event object of one given as fields ``(kind, event_id, tier,
    parent, hashes, tokens_hashes, at)``, made only when a violation needs
    it for its report."""
    from kvspec.spec.wire import make_cleared, make_removed, make_stored

    kind, event_id, tier, parent, hashes, tokens_hashes, _ = ref
    eid = -1 if event_id is None else event_id
    if kind == "stored":
        th = list(tokens_hashes) if tokens_hashes is not None else [0] * len(hashes)
        return make_stored(eid, list(hashes), th, parent, dp_rank=dp_rank, tier=tier)
    if kind == "removed":
        return make_removed(eid, list(hashes), dp_rank=dp_rank, tier=tier)
    return make_cleared(eid, dp_rank=dp_rank, tier=tier)


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
