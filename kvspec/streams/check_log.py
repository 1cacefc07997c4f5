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
  Dynamo's mocker), with its sequence numbers checked for gaps, duplicates
  and reordering;
- ``vllm``: vLLM ``KVEventBatch`` msgpack payloads, concatenated (array or
  map layout).

Speed: Dynamo RouterEvent lines are decoded straight into compact structs
and clean events are applied by a fused path (``streams/formats.py``,
``RouterReader``), whose per-line work is a small C extension built with
the machine's C compiler at first use (``streams/fastview.py``; pure Python
where there is no compiler, or with ``KVSPEC_FASTVIEW=0``); any event that
may break a rule goes through the router view's own methods, the reference.

Exit status: 0 clean, 1 findings, 2 the input could not be read or the
command line is wrong. ``--json`` writes the results file
(``kvspec/streams/results.py``), ``--junit`` JUnit XML.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import IO

from kvspec.spec.errors import WireError
from kvspec.streams.check import Checker, UsageError, add_checker_arguments
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
from kvspec.streams.junit import junit_xml, write_junit
from kvspec.streams.results import results, write_json
from kvspec.streams.zmqfeed import ZmqFeed

EPILOG = """\
output: one line per finding (FILE:LINE: RULE worker W dp D TIER: message (cause)), then a summary per rule.
exit status: 0 no findings, 1 findings, 2 unreadable input or usage error.
examples:
  kvspec check-log trace.router.jsonl                 Dynamo RouterEvents (first event id 1, set counting)
  kvspec check-log capture.zmq.jsonl --json out.json  a vLLM-style ZMQ capture; results file for a gate
  kvspec check-log batches.msgpack --vllm-hash-seed 0 vLLM payloads, block hashes checked with that seed
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("log", type=Path, help="the recorded stream ('-' is not supported: give a file)")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="router: Dynamo RouterEvent JSON lines; kvspec: kvspec event JSON lines; zmq: ZMQ capture JSON lines; "
        "vllm: concatenated vLLM KVEventBatch msgpack payloads; auto (default): from the first record",
    )
    parser.add_argument(
        "--max-record-bytes",
        type=int,
        default=MAX_RECORD_BYTES,
        metavar="N",
        help=f"the longest line or msgpack batch accepted (default {MAX_RECORD_BYTES})",
    )
    add_checker_arguments(parser)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    path: Path = args.log
    fmt = args.format
    error: str | None = None
    checker: Checker | None = None
    reader: Reader | None = None
    try:
        if args.max_record_bytes <= 0 or args.max_report < 0:
            raise UsageError("--max-record-bytes must be positive and --max-report non-negative")
        if fmt == "auto":
            fmt = detect(path)
        checker = Checker(args, fmt, where=str(path))
        reader = _reader(fmt, checker, args)
        with path.open("rb") as f:
            reader.run(f, checker.view)
        if reader.stats.records == 0:
            raise StreamError("the input holds no events (only blank lines)")
    except UsageError as e:
        print(f"kvspec check-log: {e}", file=sys.stderr)
        return 2
    except StreamError as e:
        # compiler style for lines, as the findings
        line_based = e.at is not None and e.at.startswith("line ")
        error = f"{path}:{(e.at or '')[5:]}: {e.reason}" if line_based else f"{path}: {e}"
    except WireError as e:
        error = f"{path}: {e}"
    except OSError as e:
        error = f"{path}: cannot read it: {e.strerror or e}"
    except MemoryError:
        error = f"{path}: out of memory while reading the input"
    except Exception as e:  # a bug: still no traceback for the user, and exit 2
        error = f"{path}: internal error {type(e).__name__}: {e} (a bug in kvspec: please report it with the input)"
    code = 2 if error is not None else (1 if checker is not None and checker.counts else 0)
    if error is not None:
        print(f"kvspec check-log: {error}", file=sys.stderr)
    if checker is not None:
        _summary(checker, reader, fmt, error, code, sys.stderr if args.json == "-" else sys.stdout)
        _outputs(checker, reader, args, fmt, error, code, time.perf_counter() - t0)
    elif args.json is not None:
        doc = results(
            tool="kvspec check-log",
            exit_code=code,
            input={"path": str(path), "format": fmt},
            counts={},
            findings_by_rule={},
            ignored_by_rule={},
            findings=[],
            warnings=[],
            error=error,
        )
        write_json(doc, args.json)
    return code


def _reader(fmt: str, checker: Checker, args: argparse.Namespace) -> Reader:
    limit = args.max_record_bytes
    if fmt == "router":
        return RouterReader(checker.warn, limit)
    if fmt == "kvspec":
        return KvspecReader(checker.warn, limit, worker_id=args.worker_id)
    feed = ZmqFeed(checker.view, worker_id=args.worker_id, mid_stream=args.mid_stream)
    checker.feed = feed
    if fmt == "zmq":
        return CaptureReader(feed, limit)
    return PayloadReader(feed, limit)


def _counts(checker: Checker, reader: Reader | None) -> dict[str, int]:
    st = reader.stats if reader is not None else None
    out = {
        "records": st.records if st else 0,
        "events": st.events if st else 0,
        "stored": st.stored if st else 0,
        "removed": st.removed if st else 0,
        "cleared": st.cleared if st else 0,
        "sources": len(checker.view.sources),
        "live_blocks": checker.live_blocks(),
        "hash_checked_blocks": checker.hashes.checked_blocks,
    }
    feed: ZmqFeed | None = getattr(checker, "feed", None)
    if feed is not None:
        fs = feed.stats
        out.update(messages=fs.messages, batches=fs.batches, lost=fs.lost, duplicates=fs.duplicates, late=fs.late)
    return out


def _summary(checker: Checker, reader: Reader | None, fmt: str, error: str | None, code: int, out: IO[str]) -> None:
    c = _counts(checker, reader)
    tiers = sorted({t for (_, _, t) in checker.view.live_blocks()})
    workers = sorted({w for (w, _) in checker.view.sources})
    print(
        f"checked {c['events']} events ({c['stored']} stored, {c['removed']} removed, {c['cleared']} cleared) "
        f"from {len(workers)} worker(s), {c['sources']} source(s), tiers: {', '.join(tiers) or '-'} "
        f"[{describe(fmt)}; producer {checker.producer}, {checker.view.mode} counting; "
        f"hashes: {checker.hashes.describe()}, {c['hash_checked_blocks']} blocks]",
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
    checker: Checker, reader: Reader | None, args: argparse.Namespace, fmt: str, error: str | None, code: int, s: float
) -> None:
    if args.json is not None:
        doc = results(
            tool="kvspec check-log",
            exit_code=code,
            input={"path": str(args.log), "format": fmt, **checker.settings},
            counts=_counts(checker, reader),
            findings_by_rule=checker.counts,
            ignored_by_rule=checker.ignored,
            findings=checker.findings,
            warnings=checker.warnings,
            error=error,
            checked=checker.rules_checked(),
            ignored=checker.ignore,
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
