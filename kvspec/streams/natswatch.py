"""``kvspec watch nats://HOST:PORT --subject S``: Dynamo's event plane over NATS.

Dynamo's runtime publishes each KV event batch on NATS as the msgpack
``EventEnvelope`` itself (ai-dynamo/dynamo
``lib/runtime/src/transports/event_plane/nats_transport.rs``,
``NatsTransport::publish``; the envelope as ``codec.rs`` encodes it, its
payload a msgpack array of RouterEvents). Each message goes through the
same ``EventPlaneFeed`` as the ZMQ event plane, with the same checks, and a
``PublisherTracker`` sequences each publisher (gaps, redeliveries,
restarts).

A fleet outgrows one watcher. ``--queue-group G --members N --member I``
runs N watchers that share the subject: each message reaches one member of
the NATS queue group G (the intake), which reads the worker id of its
RouterEvents and hands the message on, unchanged, to the member that owns
that worker (worker id mod N) on the subject ``_kvspec.G.<member>``; the
owner checks it. So every worker is checked by exactly one watcher, with
its whole state. Two intakes may hand on a publisher's batches out of
order, so each watcher holds a batch that arrives ahead of its sequence
for up to ``--reorder-wait`` seconds for the ones before it, and only then
takes them as lost. Each watcher writes its own results file; ``kvspec
report`` and ``kvspec gate`` merge them (``results.merge``). A watcher that
stops leaves its workers unchecked: the members are fixed, not rebalanced.

The client is ``nats-py`` (asyncio); the loop, the reorder buffer and the
checks run in one thread.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from kvspec.spec.codecs import RouterEventMsg
from kvspec.spec.errors import WireError
from kvspec.streams.check import Checker, UsageError
from kvspec.streams.eventplane import EventPlaneFeed
from kvspec.streams.eventplane_frames import FRAME_VERSION
from kvspec.streams.publishers import PublisherTracker
from kvspec.streams.watch_common import check_common, finish, start_metrics

if TYPE_CHECKING:
    from kvspec.streams.metrics import Metrics

__all__ = ["run"]

_ENVELOPE_HEAD = msgspec.msgpack.Decoder(dict[str, Any])
_EVENTS = msgspec.msgpack.Decoder(list[RouterEventMsg])


def handoff_subject(group: str, member: int) -> str:
    """Where the intake hands on the messages of a member's workers."""
    return f"_kvspec.{group}.{member}"


def envelope_key(data: bytes) -> tuple[int, int, bytes]:
    """(publisher id, sequence, payload) of an envelope; raises WireError."""
    try:
        env = _ENVELOPE_HEAD.decode(data)
        pid, seq, payload = env["publisher_id"], env["sequence"], env["payload"]
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError, ValueError, RecursionError) as e:
        raise WireError(f"not an event plane envelope: {e}") from None
    if not isinstance(pid, int) or not isinstance(seq, int) or not isinstance(payload, bytes) or pid < 0 or seq < 0:
        raise WireError("the envelope's publisher_id, sequence or payload has the wrong type")
    return pid, seq, payload


def worker_of(payload: bytes) -> int | None:
    try:
        events = _EVENTS.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
        return None
    return events[0].worker_id if events else None


@dataclass(slots=True)
class _Held:
    """A publisher's batches waiting for the sequence due."""

    next_seq: int | None = None
    #: sequence -> [(arrival time, message)], oldest first
    waiting: dict[int, list[tuple[float, bytes]]] = field(default_factory=dict)
    first_seen: float = 0.0


class NatsWatch:
    def __init__(self, args: argparse.Namespace, checker: Checker, metrics: Metrics | None) -> None:
        self.args = args
        self.checker = checker
        self.metrics = metrics
        self.plane = EventPlaneFeed(checker.view, checker.warn)
        self.tracker = PublisherTracker.attach(self.plane)
        if metrics is not None:
            inner = self.plane.on_envelope
            assert inner is not None

            def counted(pid: int, seq: int, env: Any, at: Any) -> bool:
                ok = inner(pid, seq, env, at)
                if ok:
                    self._count(env)
                return ok

            self.plane.on_envelope = counted
        self.held: dict[int, _Held] = {}
        self.messages = 0
        self.handed_on = 0
        self.unreadable = 0
        self.stop = False
        self.last_message: float | None = None

    # ------------------------------------------------------------ messages
    def _count(self, env: Any) -> None:
        m = self.metrics
        assert m is not None
        try:
            events = _EVENTS.decode(env.payload)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
            return
        for e in events:
            data = e.event.data
            kind = data if isinstance(data, str) else ("stored" if data.stored is not None else "removed")
            m.event(e.worker_id, e.event.dp_rank, e.storage_tier, kind)
        if events and env.published_at:
            m.published(events[0].worker_id, env.published_at / 1000.0)

    def owned(self, data: bytes) -> None:
        """A message of one of this watcher's workers: held in sequence, then applied."""
        self.last_message = time.monotonic()
        try:
            pid, seq, _ = envelope_key(data)
        except WireError as e:
            self._unreadable(e)
            return
        h = self.held.get(pid)
        now = time.monotonic()
        if h is None:
            h = self.held[pid] = _Held(first_seen=now)
        if h.next_seq is not None and seq < h.next_seq:
            self._apply(pid, seq, data)  # behind: a redelivery or a repeat, for the tracker to judge
            return
        h.waiting.setdefault(seq, []).append((now, data))
        self.release(pid, h, now)

    def release(self, pid: int, h: _Held, now: float, *, flush: bool = False) -> None:
        """Apply what is due; past the reorder wait, take the missing as lost."""
        wait = self.args.reorder_wait
        while h.waiting:
            if h.next_seq is None:  # the first batches seen of a publisher: from 0, or the lowest after the wait
                if 0 not in h.waiting and not flush and now - h.first_seen < wait:
                    return
                h.next_seq = min(h.waiting)
            if h.next_seq in h.waiting:
                seq = h.next_seq
            else:
                oldest = min(t for items in h.waiting.values() for t, _ in items)
                if not flush and now - oldest < wait:
                    return
                seq = min(h.waiting)  # the ones before it are lost: the tracker reports the gap
            for _, data in h.waiting.pop(seq):
                self._apply(pid, seq, data)
            h.next_seq = seq + 1

    def release_all(self, *, flush: bool = False) -> None:
        now = time.monotonic()
        for pid, h in self.held.items():
            self.release(pid, h, now, flush=flush)

    def _apply(self, pid: int, seq: int, data: bytes) -> None:
        at = self.messages
        self.messages += 1
        if self.metrics is not None:
            self.metrics.messages += 1
        # the envelope as the ZMQ event plane frames it: one reader for both transports
        frames = [
            b"",
            pid.to_bytes(8, "big"),
            seq.to_bytes(8, "big"),
            bytes([FRAME_VERSION]) + len(data).to_bytes(4, "big") + data,
        ]
        try:
            self.plane.feed(frames, at)
        except WireError as e:
            self._unreadable(e, at)

    def _unreadable(self, e: WireError, at: int | None = None) -> None:
        self.unreadable += 1
        where = f" message {at}" if at is not None else ""
        print(f"{self.args.endpoint}{where}: unreadable: {e}", file=self.checker.out)

    # ---------------------------------------------------------------- loop
    async def main(self) -> bool:
        """Subscribe, check until a stop condition; False when the server cannot be reached."""
        import nats
        from nats.errors import NoServersError

        args = self.args
        try:
            nc = await nats.connect(
                args.endpoint,
                connect_timeout=min(5.0, args.timeout) if args.timeout else 5.0,
                max_reconnect_attempts=3,
                allow_reconnect=True,
            )
        except (TimeoutError, NoServersError, OSError) as e:
            print(f"kvspec watch: cannot reach {args.endpoint}: {e or type(e).__name__}", file=sys.stderr)
            return False
        group, members, me = args.queue_group, args.members, args.member

        async def on_owned(msg: Any) -> None:
            self.owned(msg.data)

        async def on_intake(msg: Any) -> None:
            data = msg.data
            try:
                _, _, payload = envelope_key(data)
            except WireError as e:
                self._unreadable(e)
                return
            w = worker_of(payload)
            owner = me if w is None else w % members  # an unreadable payload is reported where it lands
            if owner == me:
                self.owned(data)
            else:
                self.handed_on += 1
                await nc.publish(handoff_subject(group, owner), data)

        try:
            if group is None:
                await nc.subscribe(args.subject, cb=on_owned)
            else:
                await nc.subscribe(handoff_subject(group, me), cb=on_owned)
                await nc.subscribe(args.subject, queue=group, cb=on_intake)
            await nc.flush(timeout=5)
            role = f"; member {me} of {members} in queue group {group}" if group is not None else ""
            print(f"watch: subscribed to {args.endpoint} subject {args.subject}{role}", file=sys.stderr, flush=True)
            await self._loop()
        finally:
            with contextlib.suppress(Exception):
                await nc.drain()
            with contextlib.suppress(Exception):
                await nc.close()
        self.release_all(flush=True)
        return True

    async def _loop(self) -> None:
        args = self.args
        t0 = time.monotonic()
        end = None if args.timeout is None else t0 + args.timeout
        interval = args.status_interval
        next_status = t0 + interval if interval > 0 else None
        while not self.stop:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            self.release_all()
            if self.metrics is not None:
                self.metrics.refresh()
            if end is not None and now >= end:
                break
            if args.max_events is not None and self.plane.stats.events >= args.max_events:
                break
            idle = args.idle_timeout
            if idle is not None and self.last_message is not None and now - self.last_message >= idle:
                break
            if next_status is not None and now >= next_status:
                next_status = now + interval
                found = " ".join(f"{r}={n}" for r, n in sorted(self.checker.counts.items())) or "none"
                print(
                    f"watch: {self.plane.stats.events} events, {self.messages} messages, {self.handed_on} handed "
                    f"on; findings {found}",
                    file=sys.stderr,
                    flush=True,
                )


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    try:
        check_common(args)
        if not args.subject:
            raise UsageError("a nats:// endpoint needs --subject (the subject the workers publish KV events to)")
        if args.replay is not None or args.record is not None:
            raise UsageError("--replay and --record are for ZMQ endpoints")
        if args.members < 1 or not 0 <= args.member < args.members:
            raise UsageError("--member must be between 0 and --members - 1")
        if args.members > 1 and args.queue_group is None:
            raise UsageError("--members above 1 needs --queue-group")
        if args.reorder_wait < 0:
            raise UsageError("--reorder-wait must be >= 0")
        try:
            import nats  # noqa: F401
        except ImportError as e:
            raise UsageError(f"nats:// endpoints need the nats-py package ({e})") from None
        checker = Checker(args, "eventplane", where=args.endpoint)  # Dynamo's semantics unless told otherwise
        metrics = start_metrics(args, checker)
        watch = NatsWatch(args, checker, metrics)
        checker.feeds.append(watch.plane)
    except (UsageError, OSError) as e:
        print(f"kvspec watch: {e}", file=sys.stderr)
        return 2

    def on_sigint(signum: int, frame: Any) -> None:
        watch.stop = True

    old: Any = signal.signal(signal.SIGINT, on_sigint)
    try:
        reached = asyncio.run(watch.main())
    finally:
        signal.signal(signal.SIGINT, old)
    st = watch.plane.stats
    error = None
    if not reached:
        error = f"cannot reach the NATS server at {args.endpoint}"
    elif watch.unreadable:
        error = f"{watch.unreadable} message(s) could not be read"
    elif watch.messages == 0 and watch.handed_on == 0:
        error = "no message received"
    group = f", queue group {args.queue_group} member {args.member} of {args.members}" if args.queue_group else ""
    headline = (
        f"watched {args.endpoint} subject {args.subject}{group}: {watch.messages} messages checked "
        f"({watch.handed_on} handed on), {len(watch.tracker.publishers)} publisher(s), {st.events} events "
        f"({st.stored} stored, {st.removed} removed, {st.cleared} cleared), lost {st.lost}, duplicates "
        f"{st.duplicates}; hashes: {checker.hashes.describe()}"
    )
    counts = {
        "messages": watch.messages,
        "handed_on": watch.handed_on,
        "publishers": len(watch.tracker.publishers),
        "events": st.events,
        "stored": st.stored,
        "removed": st.removed,
        "cleared": st.cleared,
        "lost": st.lost,
        "duplicates": st.duplicates,
        "unreadable": watch.unreadable,
    }
    return finish(
        args,
        checker,
        headline=headline,
        counts=counts,
        error=error,
        fmt="eventplane",
        input={
            "endpoint": args.endpoint,
            "subject": args.subject,
            "queue_group": args.queue_group,
            "members": args.members,
            "member": args.member,
        },
        seconds=time.perf_counter() - t0,
    )
