"""What a publisher id and its sequence numbers say on Dynamo's event plane.

Every envelope carries the publisher id (random per publisher, new when a
worker's process restarts) and the publisher's sequence number (from 0).
``PublisherTracker.on_envelope`` is the ``EventPlaneFeed.on_envelope`` hook
that decides, before the envelope's events reach the router view, what a
router must make of it (spec/SPEC.md, EVENT-ID, "Resynchronising"):

- the sequence due: applied;
- a sequence past the one due: the batches between are lost: one EVENT-ID
  finding, and the state of the publisher's workers is unknown from there
  (``RouterView.reset_worker`` with ``partial``), so no follow-on finding;
- a sequence already applied with the same payload bytes (xxh3): a
  redelivery (the event plane delivers at least once): counted, skipped;
  with other bytes: an EVENT-ID finding, not applied;
- a sequence reported lost that arrives after all: counted as late and
  skipped (the gap was its finding; applied now it would be out of order);
- sequence 0 again under the same id: the publisher restarted;
- a new publisher id for a worker seen under another: that worker restarted
  (a notice; its state starts empty when the new publisher is seen from
  sequence 0, unknown otherwise). The event ids in the envelopes restart
  too; the view takes them from there without a second report.

A worker is named by the RouterEvents in the payload, decoded here only for
a publisher's first envelope.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import xxhash

from kvspec.reference.router_view import At, RouterView
from kvspec.spec.codecs import RouterEventMsg
from kvspec.spec.rules import RuleId
from kvspec.streams.zmqfeed import FeedStats

#: payload digests remembered per publisher (to tell a redelivery from another batch)
DIGESTS = 4096

_xxh = xxhash.xxh3_64_intdigest
_WORKERS = msgspec.msgpack.Decoder(list[RouterEventMsg])


class EnvelopeView(Protocol):
    """What the tracker reads of an envelope (``eventplane.EventEnvelope``)."""

    payload: bytes


@dataclass(slots=True)
class _Publisher:
    next_seq: int
    workers: list[int]
    digests: OrderedDict[int, int] = field(default_factory=OrderedDict)
    #: sequences reported lost (a late arrival of one is no second finding)
    lost: OrderedDict[int, None] = field(default_factory=OrderedDict)


class PublisherTracker:
    """Sequencing per publisher for an ``EventPlaneFeed`` (see the module docstring)."""

    def __init__(self, view: RouterView, stats: FeedStats | None = None, *, first_seq: int = 0) -> None:
        self.view = view
        #: the feed's counts: lost, gaps, duplicates, restarts, redelivered
        self.stats = stats if stats is not None else FeedStats()
        self.first_seq = first_seq
        self.publishers: dict[int, _Publisher] = {}
        #: worker id -> the publisher id it was last seen under
        self.worker_publisher: dict[int, int] = {}

    @classmethod
    def attach(cls, feed: Any) -> PublisherTracker:
        """Install a tracker as an ``eventplane.EventPlaneFeed``'s envelope hook."""
        t = cls(feed.view, feed.stats)
        feed.on_envelope = t.on_envelope
        return t

    def workers_of(self, payload: bytes) -> list[int]:
        """The worker ids a payload's RouterEvents name (empty when it does not read: the feed reports it)."""
        try:
            events = _WORKERS.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
            return []
        return sorted({m.worker_id for m in events})

    def on_envelope(self, pid: int, seq: int, env: EnvelopeView, at: At) -> bool:
        """Whether the envelope's events are to be applied."""
        pub = self.publishers.get(pid)
        digest = _xxh(env.payload)
        if pub is None:
            return self._first(pid, seq, env, digest, at)
        nxt = pub.next_seq
        if seq == nxt:
            self._remember(pub, seq, digest)
            pub.next_seq = seq + 1
            return True
        worker = pub.workers[0] if pub.workers else 0
        if seq > nxt:
            self.stats.gaps += 1
            self.stats.lost += seq - nxt
            for s in range(max(nxt, seq - DIGESTS), seq):
                pub.lost[s] = None
            while len(pub.lost) > DIGESTS:
                pub.lost.popitem(last=False)
            for w in pub.workers:
                self.view.gaps[w] += 1
                self.view.reset_worker(w, partial=True)  # what the lost batches did is unknown
            self.view.report(
                RuleId.EVENT_ID,
                f"publisher {pid} sequence {seq} where {nxt} was due: {seq - nxt} batch(es) lost",
                worker,
                0,
                "device",
                at,
                publisher=pid,
                first_missing=nxt,
            )
            self._remember(pub, seq, digest)
            pub.next_seq = seq + 1
            return True
        seen = pub.digests.get(seq)
        if seen == digest:
            self.stats.redelivered += 1
            self.view.notice("redelivered", f"publisher {pid} sequence {seq} delivered again (skipped)", worker, 0)
            return False
        if seq in pub.lost:
            # reported lost, arriving after all: the gap was its one finding and the worker's state is
            # unknown since; applied now it would be out of order
            del pub.lost[seq]
            self.stats.late += 1
            self.view.notice("late", f"publisher {pid} sequence {seq} arrived after it was taken as lost", worker, 0)
            return False
        if seq == self.first_seq:
            self.stats.restarts += 1
            for w in pub.workers:
                self.view.reset_worker(w, partial=False)
            self.view.notice(
                "restart",
                f"publisher {pid} sequence {seq} after {nxt - 1}: the publisher restarted (its state starts empty)",
                worker,
                0,
                at=at,
            )
            pub.digests.clear()
            self._remember(pub, seq, digest)
            pub.next_seq = seq + 1
            return True
        self.stats.duplicates += 1
        what = "with a different payload" if seen is not None else "(too long ago to compare)"
        self.view.report(
            RuleId.EVENT_ID,
            f"publisher {pid} sequence {seq} was already received {what}: not applied",
            worker,
            0,
            "device",
            at,
            publisher=pid,
            sequence=seq,
        )
        return False

    def _first(self, pid: int, seq: int, env: EnvelopeView, digest: int, at: At) -> bool:
        workers = self.workers_of(env.payload)
        pub = self.publishers[pid] = _Publisher(seq + 1, workers)
        self._remember(pub, seq, digest)
        for w in workers:
            old = self.worker_publisher.get(w)
            self.worker_publisher[w] = pid
            if old is not None and old != pid:
                self.stats.restarts += 1
                fresh = seq == self.first_seq
                self.view.reset_worker(w, partial=not fresh)
                self.view.notice(
                    "restart",
                    f"worker {w} now publishes as {pid} (was {old}) from sequence {seq}: a restart"
                    + ("" if fresh else "; its first batches were missed: its state is unknown"),
                    w,
                    0,
                    at=at,
                )
        return True

    @staticmethod
    def _remember(pub: _Publisher, seq: int, digest: int) -> None:
        pub.digests[seq] = digest
        if len(pub.digests) > DIGESTS:
            pub.digests.popitem(last=False)
