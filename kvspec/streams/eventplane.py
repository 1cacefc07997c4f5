"""Dynamo's event plane over ZMQ: multipart messages into the router view.

Dynamo's runtime (ai-dynamo/dynamo ``lib/runtime/src/transports/event_plane/``,
``zmq_transport.rs`` ``ZmqPubTransport::publish``) sends every event as four
frames:

1. the topic (``kv-events`` for KV events), for the subscriber's filter;
2. the publisher id, 8 bytes big-endian;
3. the publisher's sequence number, 8 bytes big-endian, from 0;
4. a frame: one version byte (1), the length of what follows as 4 bytes
   big-endian, then the ``EventEnvelope`` as a msgpack map (``traits.rs``:
   ``topic``, ``publisher_id``, ``sequence``, ``published_at`` in ms,
   ``payload`` bytes; ``codec.rs`` encodes it with named fields).

For KV events the envelope's payload is a msgpack array of ``RouterEvent``
maps, the same fields as the RouterEvent JSON lines ``check-log`` reads
(``worker_id``, ``storage_tier``, ``event`` with ``event_id``, ``data``,
``dp_rank``): they are applied exactly as a line of that format is
(``formats.apply_router_event``), so the checks are Dynamo's (set
counting, event ids from 1 per worker, the hash chain).

``EventPlaneFeed.feed(frames, at)`` checks the framing (the header, the
envelope's publisher id and sequence against frames 2 and 3) and applies the
events; anything that does not read raises ``WireError`` naming it. The
sequence numbers are recorded per publisher (``publishers``); what a gap, a
repeat or a new publisher means is decided by ``on_envelope`` (by default
every envelope is applied in arrival order: a repeated batch then shows as
the event-id findings it causes).

``AutoFeed`` is what ``kvspec watch`` subscribes with when no replay socket
is named: a ``ZmqFeed`` until the first message shows the event plane's four
frames, from then on an ``EventPlaneFeed``, with the checker switched to
Dynamo's semantics (set counting, event ids from 1) before any event was
applied.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from kvspec.reference.router_view import At, RouterView
from kvspec.spec.codecs import RouterEventMsg, Uint, strip_unknown
from kvspec.spec.errors import WireError
from kvspec.streams.eventplane_frames import looks_like_event_plane, split
from kvspec.streams.formats import apply_router_event
from kvspec.streams.zmqfeed import FeedStats, ZmqFeed

if TYPE_CHECKING:
    from kvspec.streams.check import Checker


class EventEnvelope(msgspec.Struct, gc=False):
    """Dynamo's ``EventEnvelope`` (fields a newer runtime adds are ignored)."""

    publisher_id: Uint
    sequence: Uint
    payload: bytes
    topic: str = ""
    published_at: Uint | None = None


_ENVELOPE = msgspec.msgpack.Decoder(EventEnvelope)
_EVENTS = msgspec.msgpack.Decoder(list[RouterEventMsg])
_ANY = msgspec.msgpack.Decoder()


class EventPlaneFeed:
    def __init__(self, view: RouterView, warn: Callable[[str], None] | None = None) -> None:
        self.view = view
        self.warn = warn or (lambda msg: None)
        self.stats = FeedStats()
        #: publisher id -> (first sequence, last sequence)
        self.publishers: dict[int, tuple[int, int]] = {}
        self.unknown: set[str] = set()
        #: (publisher id, sequence, envelope) -> apply it? (the default applies all)
        self.on_envelope: Callable[[int, int, EventEnvelope, At], bool] | None = None

    def feed(self, frames: list[bytes], at: At = None, *, replayed: bool = False) -> int:
        """Check and apply one message; returns its sequence number."""
        del replayed  # the event plane has no replay socket
        topic, pid, seq, body = split(frames)
        st = self.stats
        st.messages += 1
        if len(st.topics) < 16:
            st.topics.add(topic)
        try:
            env = _ENVELOPE.decode(body)
        except (msgspec.DecodeError, ValueError, RecursionError) as e:
            raise WireError(f"not an event plane envelope: {e}") from None
        if env.publisher_id != pid or env.sequence != seq:
            raise WireError(
                f"the envelope says publisher {env.publisher_id} sequence {env.sequence}, "
                f"its frames publisher {pid} sequence {seq}"
            )
        first = self.publishers.get(pid)
        self.publishers[pid] = (seq if first is None else first[0], seq)
        if st.first_seq is None:
            st.first_seq = seq
        st.last_seq = seq
        if self.on_envelope is not None and not self.on_envelope(pid, seq, env, at):
            return seq
        events = self._events(env.payload)
        st.batches += 1
        base = at if isinstance(at, int) else 0
        for i, m in enumerate(events):
            kind = apply_router_event(self.view, m, (base, i))
            st.events += 1
            if kind == "stored":
                st.stored += 1
            elif kind == "removed":
                st.removed += 1
            else:
                st.cleared += 1
        return seq

    def _events(self, payload: bytes) -> list[RouterEventMsg]:
        try:
            return _EVENTS.decode(payload)
        except msgspec.ValidationError as e:
            if "unknown field" not in str(e):
                raise WireError(f"the envelope's payload is not a list of RouterEvents: {e}") from None
        except (msgspec.DecodeError, ValueError, RecursionError) as e:
            raise WireError(f"the envelope's payload is not msgpack: {e}") from None
        fresh: set[str] = set()
        try:
            obj = strip_unknown_list(_ANY.decode(payload), fresh)
            out = msgspec.convert(obj, list[RouterEventMsg])
        except (msgspec.ValidationError, ValueError, RecursionError, TypeError) as e:
            raise WireError(f"the envelope's payload is not a list of RouterEvents: {e}") from None
        new = fresh - self.unknown
        if new:
            self.unknown |= new
            self.warn(
                f"router events carry field(s) this version does not know: {', '.join(sorted(new))} "
                "(ignored; a newer Dynamo may have added them)"
            )
        return out


def strip_unknown_list(obj: object, fresh: set[str]) -> object:
    if not isinstance(obj, list):
        return obj
    return [strip_unknown(x, fresh) if isinstance(x, dict) else x for x in obj]


class AutoFeed(ZmqFeed):
    """A live subscription whose wire is known at its first message (see the
    module docstring)."""

    def __init__(self, checker: Checker, args: argparse.Namespace) -> None:
        super().__init__(checker.view, worker_id=args.worker_id, mid_stream=args.mid_stream, producer=args.producer)
        self.checker = checker
        self.args = args
        self.plane: EventPlaneFeed | None = None
        self._decided = False

    def feed(self, frames: list[bytes], at: At = None, *, replayed: bool = False) -> int:
        if not self._decided:
            self._decided = True
            if looks_like_event_plane(frames) and self.stats.events == 0:
                self._to_event_plane()
        if self.plane is not None:
            return self.plane.feed(frames, at)
        return super().feed(frames, at, replayed=replayed)

    def _to_event_plane(self) -> None:
        c, args = self.checker, self.args
        self.plane = EventPlaneFeed(c.view, c.warn)
        from kvspec.streams.publishers import PublisherTracker  # it imports this module

        PublisherTracker.attach(self.plane)
        self.stats = self.plane.stats
        c.fmt = "eventplane"
        if args.producer == "auto":
            c.use_producer("dynamo", args)
        c.note("the feed is Dynamo's event plane (RouterEvents in envelopes): Dynamo's semantics")
