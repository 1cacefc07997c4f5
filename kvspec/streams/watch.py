"""``kvspec watch tcp://HOST:PORT``: check a live ZMQ KV event feed.

It subscribes to a publisher's PUB socket (vLLM's ``ZmqEventPublisher``,
SGLang's, the ai-dynamo mocker's ``zmq_kv_events_port``, or Dynamo's event
plane, whose four-frame messages are recognised at the first one:
``eventplane.py``) and runs every
message through the same checker as ``kvspec check-log`` (``ZmqFeed`` into
the router view): findings are printed as they happen, and a status line
(events/s, live blocks per worker and tier, findings per rule) goes to
standard error every ``--status-interval`` seconds.

When a sequence number shows batches missing (including at the start, where
a subscriber misses what was sent before its subscription reached the
publisher) and the publisher offers a replay socket (``--replay``), the
missing batches are asked for first (an 8-byte big-endian start sequence;
the publisher answers with the buffered batches and then sequence -1), and
only what the replay cannot supply is reported lost. ``--record FILE`` writes
every message received, replayed ones marked, in the capture format
``check-log`` reads (``capture.py``).

``--metrics-port`` serves Prometheus metrics (``metrics.py``).

It stops on SIGINT (Ctrl-C), after ``--timeout`` seconds, after
``--idle-timeout`` seconds without a message or after ``--max-events``
events, prints the summary and exits 0 (clean), 1 (findings) or 2 (a
message could not be read, nothing was received, or the command line is
wrong).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

import zmq

from kvspec.spec.codecs import REMOVED_TYPES, STORED_TYPES, vllm_tier
from kvspec.spec.errors import WireError
from kvspec.streams.capture import CaptureWriter
from kvspec.streams.check import Checker, UsageError, add_checker_arguments
from kvspec.streams.eventplane import AutoFeed
from kvspec.streams.formats import MAX_RECORD_BYTES
from kvspec.streams.watch_common import check_common, finish, start_metrics
from kvspec.streams.zmqfeed import END_SEQ, ZmqFeed

if TYPE_CHECKING:
    from kvspec.streams.metrics import Metrics

EPILOG = """\
exit status: 0 no findings, 1 findings, 2 unreadable messages, nothing received, or usage error.
examples:
  kvspec watch tcp://127.0.0.1:5557 --replay tcp://127.0.0.1:5558 --record feed.jsonl --timeout 60
  kvspec watch tcp://127.0.0.1:5557 --metrics-port 9400 --stats
  kvspec watch nats://127.0.0.1:4222 --subject 'namespace.dynamo.kv-events' --metrics-port 9400
  kvspec watch nats://127.0.0.1:4222 --subject S --queue-group kvspec --members 2 --member 0 --json w0.json
  (the other watcher: --member 1 --json w1.json; then one verdict: kvspec gate w0.json w1.json --baseline B.json)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "endpoint",
        help="the publisher's PUB socket, e.g. tcp://127.0.0.1:5557: a vLLM-style feed (vLLM, SGLang, Dynamo's "
        "zmq_kv_events_port) or Dynamo's event plane (ZMQ), told apart at the first message; or a NATS server, "
        "nats://127.0.0.1:4222, with --subject: Dynamo's event plane over NATS",
    )
    parser.add_argument(
        "--replay",
        default=None,
        metavar="ENDPOINT",
        help="the publisher's replay (ROUTER) socket: lost batches are asked for there before they are reported",
    )
    parser.add_argument("--topic", default="", help="subscribe to this topic prefix only (default: every topic)")
    parser.add_argument("--record", default=None, metavar="FILE", help="write every message received to FILE")
    parser.add_argument("--timeout", type=float, default=None, metavar="S", help="stop after S seconds")
    parser.add_argument("--max-events", type=int, default=None, metavar="N", help="stop after N events")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        metavar="S",
        help="stop after S seconds without a message, once one has arrived",
    )
    parser.add_argument(
        "--status-interval", type=float, default=2.0, metavar="S", help="seconds between status lines (0: none)"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics: events and findings per rule, worker, "
        "dp rank and tier, lag, gaps, restarts, redeliveries, live blocks (0: a free port, printed)",
    )
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST", help="address to serve metrics on")
    n = parser.add_argument_group("NATS (nats://HOST:PORT endpoints: Dynamo's event plane)")
    n.add_argument("--subject", default=None, help="the subject the workers publish their KV events to (required)")
    n.add_argument(
        "--queue-group",
        default=None,
        metavar="NAME",
        help="share the subject with other watchers: each message reaches one member of the NATS queue group "
        "NAME, which hands it on to the member that owns its worker (worker id mod --members), so no worker is "
        "split across two watchers; each member writes its own --json, merged by kvspec report / kvspec gate",
    )
    n.add_argument("--members", type=int, default=1, metavar="N", help="watchers in the queue group (default 1)")
    n.add_argument("--member", type=int, default=0, metavar="I", help="this watcher's number, 0..N-1 (default 0)")
    n.add_argument(
        "--reorder-wait",
        type=float,
        default=2.0,
        metavar="S",
        help="how long a batch that arrives ahead of its sequence waits for the ones before it before they are "
        "reported lost (default 2; handing on between members may reorder a publisher's batches, by as much as "
        "a busy member lags)",
    )
    parser.add_argument(
        "--max-record-bytes",
        type=int,
        default=MAX_RECORD_BYTES,
        metavar="N",
        help=f"the largest message accepted (default {MAX_RECORD_BYTES}); ZMQ drops a connection that sends more",
    )
    parser.add_argument(
        "--replay-timeout",
        type=float,
        default=2.0,
        metavar="S",
        help="how long to wait for the replay socket's answer (default 2)",
    )
    add_checker_arguments(parser)


class Watch:
    def __init__(self, args: argparse.Namespace, checker: Checker, feed: ZmqFeed) -> None:
        self.args = args
        self.checker = checker
        self.feed = feed
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, 1_000_000)
        self.sub.setsockopt(zmq.MAXMSGSIZE, args.max_record_bytes)  # a larger message drops the connection
        self.sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
        self._monitor = self.sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.sub.connect(args.endpoint)
        self.writer: CaptureWriter | None = None
        self._record: IO[str] | None = None
        if args.record:
            self._record = open(args.record, "w")  # noqa: SIM115 - closed in close()
            self.writer = CaptureWriter(self._record)
        self.stop = False
        self.messages = 0
        self.unreadable = 0
        self.replay_requests = 0
        self.metrics: Metrics | None = None
        self.last_message: float | None = None

    def close(self) -> None:
        if self._record is not None:
            self._record.close()
        self.sub.disable_monitor()
        self._monitor.close(0)
        self.sub.close(0)
        self.ctx.term()

    def start(self, wait_s: float) -> bool:
        """Wait (up to ``wait_s``) for the connection to the publisher, then,
        where a replay socket is offered, fetch what was published before we
        subscribed. Returns whether the connection was made."""
        connected = bool(self._monitor.poll(int(wait_s * 1000)))
        if connected:
            time.sleep(0.05)  # the subscription travels to the publisher after the handshake
        if self.args.replay is not None and not self.feed.mid_stream:
            for frames in self._replay(self.feed.first_seq):
                if self.writer is not None:
                    self.writer.write(frames, replayed=True)
                self._apply(frames, replayed=True)
        return connected

    # ------------------------------------------------------------ replay
    def _replay(self, start: int) -> Iterator[list[bytes]]:
        """The batches the replay socket returns from ``start`` on."""
        self.replay_requests += 1
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.args.replay)
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + self.args.replay_timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not dealer.poll(int(left * 1000)):
                    self.checker.warn(f"the replay socket did not finish answering within {self.args.replay_timeout} s")
                    return
                frames = dealer.recv_multipart()
                if len(frames) >= 2 and frames[-2] == END_SEQ.to_bytes(8, "big", signed=True):
                    return
                yield frames
        finally:
            dealer.close(0)

    def _fill(self, seq: int) -> None:
        """Before applying a message with sequence ``seq``: if batches before
        it are missing, ask the replay socket for them."""
        nxt = self.feed.next_seq
        want = self.feed.first_seq if nxt is None else nxt
        if self.args.replay is None or seq <= want or (nxt is None and self.feed.mid_stream):
            return
        for frames in self._replay(want):
            try:
                _, rseq, _ = ZmqFeed.split(frames)
            except WireError:
                continue
            if rseq >= seq:
                break
            if self.writer is not None:
                self.writer.write(frames, replayed=True)
            self._apply(frames, replayed=True)

    # ------------------------------------------------------------- main
    def _apply(self, frames: list[bytes], *, replayed: bool = False) -> None:
        at = self.messages
        self.messages += 1
        if self.metrics is not None:
            self.metrics.messages += 1
        try:
            self.feed.feed(frames, at, replayed=replayed)
        except WireError as e:
            self.unreadable += 1
            print(f"{self.args.endpoint} message {at}: unreadable: {e}", file=self.checker.out)

    def on_message(self, frames: list[bytes]) -> None:
        try:
            _, seq, _ = ZmqFeed.split(frames)
        except WireError:
            seq = -1
        if seq >= 0:
            self._fill(seq)
        if self.writer is not None:
            self.writer.write(frames)
        self._apply(frames)

    def run(self) -> None:
        args = self.args
        t0 = time.monotonic()
        end = None if args.timeout is None else t0 + args.timeout
        next_status = t0 + args.status_interval if args.status_interval > 0 else None
        last_events, last_t = 0, t0
        while not self.stop:
            now = time.monotonic()
            if end is not None and now >= end:
                break
            if args.max_events is not None and self.feed.stats.events >= args.max_events:
                break
            idle = args.idle_timeout
            if idle is not None and self.last_message is not None and now - self.last_message >= idle:
                break
            if self.metrics is not None:
                self.metrics.refresh()
            if next_status is not None and now >= next_status:
                ev = self.feed.stats.events
                self.status(ev - last_events, now - last_t)
                last_events, last_t = ev, now
                next_status = now + args.status_interval
            wait = 100 if end is None else max(0, min(100, int((end - now) * 1000)))
            if not self.sub.poll(wait):
                continue
            while not self.stop:
                try:
                    frames = self.sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.on_message(frames)
                self.last_message = time.monotonic()
                if args.max_events is not None and self.feed.stats.events >= args.max_events:
                    break
            if self.writer is not None:
                self.writer.flush()
        if next_status is not None:  # a last status line: the state the watch stopped in
            now = time.monotonic()
            self.status(self.feed.stats.events - last_events, now - last_t)

    def status(self, events: int, seconds: float) -> None:
        live = self.checker.view.live_blocks()
        blocks = " ".join(f"w{w}/dp{d}/{t}={n}" for (w, d, t), n in sorted(live.items())) or "-"
        found = " ".join(f"{r}={n}" for r, n in sorted(self.checker.counts.items())) or "none"
        rate = events / seconds if seconds > 0 else 0.0
        st = self.feed.stats
        print(
            f"watch: {st.events} events ({rate:,.0f}/s), {self.messages} messages; live blocks {blocks}; "
            f"findings {found}",
            file=sys.stderr,
            flush=True,
        )


def run(args: argparse.Namespace) -> int:
    if args.endpoint.startswith("nats://"):
        from kvspec.streams.natswatch import run as run_nats

        return run_nats(args)
    t0 = time.perf_counter()
    try:
        check_common(args)
        if not args.endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise UsageError(
                f"endpoint {args.endpoint!r} is not a ZMQ endpoint (tcp://HOST:PORT) nor NATS (nats://HOST:PORT)"
            )
        if args.subject is not None or args.queue_group is not None:
            raise UsageError("--subject and --queue-group are for nats:// endpoints")
        checker = Checker(args, "live", where=args.endpoint)
        feed = (
            ZmqFeed(checker.view, worker_id=args.worker_id, mid_stream=args.mid_stream, producer=args.producer)
            if args.replay is not None  # a replay socket: the vLLM-style feed
            else AutoFeed(checker, args)  # or Dynamo's event plane, told by the first message
        )
        checker.feed = feed
        checker.feeds.append(feed)
        metrics = start_metrics(args, checker)
        if metrics is not None:
            feed.on_batch = _batch_metrics(metrics)
        watch = Watch(args, checker, feed)
        watch.metrics = metrics
    except (UsageError, zmq.ZMQError, OSError) as e:
        print(f"kvspec watch: {e}", file=sys.stderr)
        return 2

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        watch.stop = True

    old: Any = signal.signal(signal.SIGINT, on_sigint)
    try:
        connected = watch.start(min(5.0, args.timeout) if args.timeout is not None else 5.0)
        state = "connected" if connected else "not connected yet"
        print(
            f"watch: subscribed to {args.endpoint} ({state}; {feed.stats.replayed} batch(es) fetched by replay)",
            file=sys.stderr,
            flush=True,
        )
        watch.run()
    finally:
        signal.signal(signal.SIGINT, old)
        with contextlib.suppress(Exception):
            watch.close()
    st = feed.stats
    checker.settle_producer()
    error = None
    if watch.unreadable:
        error = f"{watch.unreadable} message(s) could not be read"
    elif st.messages == 0:
        error = "no message received"
    headline = (
        f"watched {args.endpoint}: {st.messages} messages ({st.replayed} replayed to fill gaps, "
        f"{watch.replay_requests} replay request(s)), {st.events} events ({st.stored} stored, {st.removed} removed, "
        f"{st.cleared} cleared), sequence {st.first_seq}..{st.last_seq}, lost {st.lost}, duplicates {st.duplicates}, "
        f"out of order {st.late}; hashes: {checker.hashes.describe()}"
    )
    counts = {
        "messages": st.messages,
        "events": st.events,
        "stored": st.stored,
        "removed": st.removed,
        "cleared": st.cleared,
        "lost": st.lost,
        "duplicates": st.duplicates,
        "late": st.late,
        "replayed": st.replayed,
        "unreadable": watch.unreadable,
    }
    return finish(
        args,
        checker,
        headline=headline,
        counts=counts,
        error=error,
        fmt="eventplane" if checker.fmt == "eventplane" else "zmq",
        input={"endpoint": args.endpoint, "replay": args.replay},
        seconds=time.perf_counter() - t0,
    )


def _batch_metrics(metrics: Metrics) -> Callable[[int, int, Any], None]:
    """The feed's per-batch hook that counts a vLLM-style batch's events by tier and kind."""

    def on_batch(w: int, dp: int, batch: Any) -> None:
        ts = getattr(batch, "ts", None)
        metrics.published(w, float(ts) if isinstance(ts, int | float) else None)
        for ev in batch.events:
            if isinstance(ev, STORED_TYPES):
                metrics.event(w, dp, vllm_tier(ev.medium, ev.group_idx), "stored")
            elif isinstance(ev, REMOVED_TYPES):
                metrics.event(w, dp, vllm_tier(ev.medium, ev.group_idx), "removed")
            else:
                metrics.event(w, dp, "device", "cleared")
        metrics.refresh()

    return on_batch
