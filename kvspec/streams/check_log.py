"""``kvspec check-log``: check a recorded KV event stream offline.

The same router view that checks live adapters reads a recorded stream and
reports every protocol violation with its rule id, where in the file, the
worker, the tier and the state it contradicted. The format is detected from
the first record (``--format`` forces one):

- ``router``: Dynamo RouterEvent JSON lines, as the event plane carries them
  and ``RadixTree.dump_tree_as_events()`` prints them;
- ``kvspec``: kvspec event JSON lines (``spec/schema/kv_event.json``);
- ``zmq``: a ZMQ capture (what ``kvspec watch --record`` writes: one JSON
  line per multipart message; the vLLM-style feed of vLLM, SGLang and
  Dynamo's mocker; SGLang's signed hashes are recognised), with its sequence
  numbers checked for gaps, duplicates and reordering;
- ``eventplane``: a ZMQ capture of Dynamo's event plane (four frames, the
  RouterEvents in a msgpack envelope: ``eventplane.py``);
- ``vllm``: vLLM ``KVEventBatch`` msgpack payloads, concatenated (array or
  map layout).

Inputs (``inputs.py``): files or ``-`` (standard input), gzip recognised by
its bytes, several inputs in one router view, ``--follow`` for a file still
being written.

Speed: Dynamo RouterEvent lines are decoded straight into compact structs
and clean events are applied by a fused path (``streams/formats.py``,
``RouterReader``), whose per-line work is a small C extension built with
the machine's C compiler at first use (``streams/fastview.py``; pure Python
where there is no compiler, said once on stderr, or with
``KVSPEC_FASTVIEW=0``; the verdicts are the same); the C line reader keeps
each tier's blocks in C tables. Any event that may break a rule goes through
the router view's own methods, the reference.

Exit status: 0 clean, 1 findings, 2 the input could not be read or the
command line is wrong. ``--json`` writes the results file
(``kvspec/streams/results.py``), ``--junit`` JUnit XML.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from types import FrameType
from typing import IO

from kvspec.spec.errors import WireError
from kvspec.streams import fastview
from kvspec.streams.check import FORMAT_PRODUCER, Checker, UsageError, add_checker_arguments
from kvspec.streams.eventplane import EventPlaneFeed
from kvspec.streams.formats import (
    FORMATS,
    MAX_RECORD_BYTES,
    CaptureReader,
    KvspecReader,
    PayloadReader,
    Reader,
    RouterReader,
    StreamError,
    describe,
    detect,
)
from kvspec.streams.inputs import Input, open_input
from kvspec.streams.junit import junit_xml, write_junit
from kvspec.streams.producer_names import VLLM_FORMAT
from kvspec.streams.publishers import PublisherTracker
from kvspec.streams.results import results, write_json
from kvspec.streams.zmqfeed import ZmqFeed

EPILOG = """\
output: one line per finding (FILE:LINE: RULE worker W dp D TIER: message (cause)), then a summary per rule.
exit status: 0 no findings, 1 findings, 2 unreadable input or usage error.
examples:
  kvspec check-log trace.router.jsonl                 Dynamo RouterEvents (first event id 1, set counting)
  kvspec check-log capture.zmq.jsonl --json out.json  a vLLM-style ZMQ capture; results file for a gate
  kvspec check-log batches.msgpack --vllm-hash-seed 0 vLLM payloads, block hashes checked with that seed
  kvspec check-log trace.jsonl.gz                     gzip, read as it is
  zcat trace.gz | kvspec check-log -                  standard input
  kvspec check-log w1.jsonl w2.jsonl                  several inputs in one router view
  kvspec check-log capture.zmq.jsonl -f               follow a file a recorder is still writing (Ctrl-C stops)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "logs",
        nargs="+",
        metavar="LOG",
        help="the recorded stream: a file, or '-' for standard input; gzip is read as it is (recognised by its "
        "first bytes). Several inputs are checked in one router view, in the order given (each detected on its "
        "own; feeds that carry no worker id, such as vLLM-style captures, take worker --worker-id + N for the "
        "Nth input, from 0)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="router: Dynamo RouterEvent JSON lines; kvspec: kvspec event JSON lines; zmq: ZMQ capture JSON lines "
        "(vLLM-style feed: vLLM, SGLang, Dynamo's zmq_kv_events_port); eventplane: ZMQ capture of Dynamo's event "
        "plane (RouterEvents in envelopes); vllm: concatenated vLLM KVEventBatch msgpack payloads; auto (default): "
        "from the first record",
    )
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="follow a growing file (the last input): after its end, check what is appended, as tail -f does, "
        "until Ctrl-C or SIGTERM (or --idle-timeout); a line the writer has not finished is checked once it "
        "ends. Not for standard input or gzip",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        metavar="S",
        help="with --follow: stop after S seconds in which nothing was appended",
    )
    parser.add_argument(
        "--max-record-bytes",
        type=int,
        default=MAX_RECORD_BYTES,
        metavar="N",
        help=f"the longest line or msgpack batch accepted (default {MAX_RECORD_BYTES})",
    )
    add_checker_arguments(parser)


def _usage(args: argparse.Namespace) -> None:
    if args.max_record_bytes <= 0 or args.max_report < 0:
        raise UsageError("--max-record-bytes must be positive and --max-report non-negative")
    if args.logs.count("-") > 1:
        raise UsageError("standard input ('-') can be read once only")
    if args.idle_timeout is not None and (not args.follow or args.idle_timeout <= 0):
        raise UsageError("--idle-timeout needs --follow and a positive number of seconds")
    if args.follow and args.logs[-1] == "-":
        raise UsageError("--follow reads a growing file; standard input is read until it closes anyway")


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    names: list[str] = args.logs
    label = names[0] if len(names) == 1 else f"{len(names)} inputs"
    fmt = args.format
    error: str | None = None
    checker: Checker | None = None
    readers: list[Reader] = []
    try:
        _usage(args)
        for i, name in enumerate(names):
            error, checker = _check_one(args, i, name, readers, checker)
            if error is not None:
                break
    except UsageError as e:
        print(f"kvspec check-log: {e}", file=sys.stderr)
        return 2
    if checker is not None:
        fmt = checker.fmt
        checker.settle_producer()
    code = 2 if error is not None else (1 if checker is not None and checker.counts else 0)
    if error is not None:
        print(f"kvspec check-log: {error}", file=sys.stderr)
    if checker is not None:
        checker.close()
        out = sys.stderr if "-" in (args.json, args.findings) else sys.stdout
        _summary(checker, readers, fmt, error, code, out)
        if args.stats:
            checker.print_statistics(out)
        _outputs(checker, readers, args, fmt, error, code, time.perf_counter() - t0)
    elif args.json is not None:
        doc = results(
            tool="kvspec check-log",
            exit_code=code,
            input={"path": label, "format": fmt},
            counts={},
            findings_by_rule={},
            ignored_by_rule={},
            findings=[],
            warnings=[],
            error=error,
        )
        write_json(doc, args.json)
    return code


def _check_one(
    args: argparse.Namespace, index: int, name: str, readers: list[Reader], checker: Checker | None
) -> tuple[str | None, Checker | None]:
    """Read input ``index`` into the run's checker (made from the first
    input's format): the error that ended it, if any, and the checker."""
    inp: Input | None = None
    where = "<stdin>" if name == "-" else name
    last = index == len(args.logs) - 1
    try:
        inp = open_input(name)
        if args.follow and last and inp.gzip:
            raise UsageError("--follow reads a growing file, not a gzip stream")
        fmt = args.format if args.format != "auto" else detect(inp.head)
        if checker is None:
            checker = Checker(args, fmt, where=where)
            checker.multi = len(args.logs) > 1
        elif args.producer == "auto" and FORMAT_PRODUCER.get(fmt) != FORMAT_PRODUCER.get(checker.fmt):
            raise UsageError(
                f"{where} is {describe(fmt)} and {args.logs[0]} {describe(checker.fmt)}: inputs of different "
                "producers do not share one router view (check them apart, or name the semantics with --producer)"
            )
        checker.where, checker.fmt = where, fmt
        reader = _reader(fmt, checker, args, args.worker_id + index)
        readers.append(reader)
        if args.follow and last:
            inp.follow, inp.idle_timeout, inp.lines = True, args.idle_timeout, fmt != VLLM_FORMAT
            with _stopping(inp):
                reader.run(inp, checker.view)
            if inp.pending:
                checker.note(f"{where}: the last {inp.pending} byte(s) were not read: a line the writer had not ended")
        else:
            reader.run(inp, checker.view)
        if reader.stats.records == 0:
            raise StreamError("the input holds no events (only blank lines)")
        return None, checker
    except StreamError as e:
        # compiler style for lines, as the findings
        line_based = e.at is not None and e.at.startswith("line ")
        error = f"{where}:{(e.at or '')[5:]}: {e.reason}" if line_based else f"{where}: {e}"
    except WireError as e:
        error = f"{where}: {e}"
    except OSError as e:
        error = f"{where}: cannot read it: {e.strerror or e}"
    except MemoryError:
        error = f"{where}: out of memory while reading the input"
    except UsageError:
        raise
    except Exception as e:  # a bug: still no traceback for the user, and exit 2
        error = f"{where}: internal error {type(e).__name__}: {e} (a bug in kvspec: please report it with the input)"
    finally:
        if inp is not None:
            inp.close()
    return error, checker


@contextlib.contextmanager
def _stopping(inp: Input) -> Iterator[None]:
    """SIGINT and SIGTERM end a follow (the summary is still printed); the
    findings are printed as they are found."""

    def stop(signum: int, frame: FrameType | None) -> None:
        inp.stop()

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


_slow_path_noted = False


def _note_slow_path(checker: Checker) -> None:
    """Say it (once) when the C fast paths could not be built: the Python
    path gives the same verdicts, several times slower, and an operator who
    sees the slowdown should know why (``KVSPEC_FASTVIEW=0``, asked for,
    is not noted)."""
    global _slow_path_noted
    if _slow_path_noted or fastview.module() is not None or fastview.status().startswith("off"):
        return
    _slow_path_noted = True
    checker.note(
        f"C fast paths unavailable: {fastview.status()}; checking on the Python path "
        "(the same verdicts, several times slower)"
    )


def _reader(fmt: str, checker: Checker, args: argparse.Namespace, worker_id: int) -> Reader:
    limit = args.max_record_bytes
    if fmt in ("router", "zmq", VLLM_FORMAT):
        _note_slow_path(checker)
    if fmt == "router":
        return RouterReader(checker.warn, limit)
    if fmt == "kvspec":
        return KvspecReader(checker.warn, limit, worker_id=args.worker_id)
    if fmt == "eventplane":
        plane = EventPlaneFeed(checker.view, checker.warn)
        PublisherTracker.attach(plane)
        checker.feeds.append(plane)
        return CaptureReader(plane, limit)
    feed = ZmqFeed(checker.view, worker_id=worker_id, mid_stream=args.mid_stream, producer=args.producer)
    checker.feeds.append(feed)
    checker.feed = feed
    if fmt == "zmq":
        return CaptureReader(feed, limit)
    return PayloadReader(feed, limit)


def _counts(checker: Checker, readers: list[Reader]) -> dict[str, int]:
    out = {
        "records": sum(r.stats.records for r in readers),
        "events": sum(r.stats.events for r in readers),
        "stored": sum(r.stats.stored for r in readers),
        "removed": sum(r.stats.removed for r in readers),
        "cleared": sum(r.stats.cleared for r in readers),
        "sources": len(checker.view.sources),
        "live_blocks": checker.live_blocks(),
        "hash_checked_blocks": checker.hashes.checked_blocks,
        "restarts": checker.view.notices["restart"],
        "redelivered": checker.view.notices["redelivered"],
        "unknown_refs": checker.view.notices["unknown"],
    }
    feeds: list[ZmqFeed | EventPlaneFeed] = checker.feeds
    if feeds:
        out.update(
            messages=sum(f.stats.messages for f in feeds),
            batches=sum(f.stats.batches for f in feeds),
            lost=sum(f.stats.lost for f in feeds),
            duplicates=sum(f.stats.duplicates for f in feeds),
            late=sum(f.stats.late for f in feeds),
        )
        publishers = sum(len(f.publishers) for f in feeds if isinstance(f, EventPlaneFeed))
        if publishers:
            out["publishers"] = publishers
    return out


def _summary(checker: Checker, readers: list[Reader], fmt: str, error: str | None, code: int, out: IO[str]) -> None:
    c = _counts(checker, readers)
    tiers = sorted({t for (_, _, t) in checker.view.live_blocks()})
    workers = sorted({w for (w, _) in checker.view.sources})
    print(
        f"checked {c['events']} events ({c['stored']} stored, {c['removed']} removed, {c['cleared']} cleared) "
        f"from {len(workers)} worker(s), {c['sources']} source(s), tiers: {', '.join(tiers) or '-'} "
        f"[{describe(fmt)}; producer {checker.producer}, {checker.view.mode} counting; "
        f"hashes: {checker.hashes.describe()}, {c['hash_checked_blocks']} blocks]",
        file=out,
    )
    if c["restarts"] or c["redelivered"] or c["unknown_refs"]:
        print(
            f"resynchronised: {c['restarts']} restart(s), {c['redelivered']} redelivered event(s) or batch(es) "
            f"skipped, {c['unknown_refs']} reference(s) to blocks stored before the capture or a gap (unknown, "
            "not findings)",
            file=out,
        )
    if checker.counts:
        shown = min(checker.shown, sum(checker.counts.values()))
        print(f"findings by rule ({shown} shown, --max-report to see more):", file=out)
        for rid, n in sorted(checker.counts.items()):
            print(f"  {rid:<24} {n}", file=out)
    for rid, n in sorted(checker.ignored.items()):
        print(f"  (ignored) {rid:<14} {n}", file=out)
    verdict = {0: "no findings", 1: f"{sum(checker.counts.values())} finding(s)", 2: "input unreadable"}[code]
    print(f"result: {verdict} (exit {code})", file=out)


def _outputs(
    checker: Checker, readers: list[Reader], args: argparse.Namespace, fmt: str, error: str | None, code: int, s: float
) -> None:
    if args.json is not None:
        doc = results(
            tool="kvspec check-log",
            exit_code=code,
            input={"path": args.logs[0] if len(args.logs) == 1 else args.logs, "format": fmt, **checker.settings},
            counts=_counts(checker, readers),
            findings_by_rule=checker.counts,
            ignored_by_rule=checker.ignored,
            findings=checker.findings,
            warnings=checker.warnings,
            error=error,
            checked=checker.rules_checked(),
            ignored=checker.ignore,
            statistics=checker.statistics(),
        )
        write_json(doc, args.json)
    if args.junit is not None:
        data = junit_xml(
            tool="kvspec check-log",
            fmt=fmt,
            rules=checker.rules_checked(),
            findings_by_rule=checker.counts,
            ignored=checker.ignore,
            findings=checker.findings,
            error=error,
            seconds=s,
        )
        write_junit(data, args.junit)
