"""``kvspec check-log``: check a recorded KV event stream offline.

The same router view that checks live adapters reads a captured log and
reports every protocol violation with its rule id, the event and the state it
contradicted. Formats:

- ``router`` (default): JSON lines of Dynamo router events
  ``{"worker_id", "storage_tier", "event": KvCacheEvent}``;
- ``kvspec``: JSON lines of kvspec events (``spec/schema/kv_event.json``);
- ``vllm``: a file of concatenated vLLM msgpack ``KVEventBatch`` payloads
  (event ids are assigned in arrival order, so EVENT-ID is not checked).

Exit status: 0 clean, 1 violations found, 2 the log could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import msgpack
from pydantic import ValidationError

from kvspec.reference.router_view import RouterView
from kvspec.spec.codecs import from_router_event, from_vllm_batch
from kvspec.spec.errors import WireError
from kvspec.spec.profiles import PROFILES
from kvspec.spec.wire import KvEvent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=Path, help="the recorded event log")
    parser.add_argument("--format", choices=["router", "kvspec", "vllm"], default="router")
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="kvbm",
        help="the profile the publisher claims (sets the counting mode; known breaks are labelled)",
    )
    parser.add_argument("--strict", action="store_true", help="also check REMOVE-NO-ORPHAN")
    parser.add_argument(
        "--mid-stream", action="store_true", help="the capture started mid-stream: accept any first event id"
    )
    parser.add_argument("--max-report", type=int, default=50, help="violations to print (all are counted)")


def read_events(path: Path, fmt: str) -> Iterator[tuple[int, KvEvent]]:
    """(worker_id, event) pairs; raises WireError naming the bad line."""
    if fmt == "vllm":
        next_id = 0
        with path.open("rb") as f:
            unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False)
            for n, batch in enumerate(unpacker):
                try:
                    _, events = from_vllm_batch(msgpack.packb(batch), first_event_id=next_id)
                except WireError as e:
                    raise WireError(f"{path}: batch {n}: {e}") from None
                next_id += len(events)
                for ev in events:
                    yield 0, ev
        return
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise WireError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            try:
                if fmt == "router":
                    yield from_router_event(data)
                else:
                    yield 0, KvEvent.model_validate(data)
            except (WireError, ValidationError) as e:
                raise WireError(f"{path}:{lineno}: {e}") from None


def run(args: argparse.Namespace) -> int:
    prof = PROFILES[args.profile]
    view = RouterView(
        mode=prof.view_mode,
        strict=args.strict,
        first_event_id=None if args.mid_stream or args.format == "vllm" else 0,
    )
    count = 0
    try:
        for worker, ev in read_events(args.log, args.format):
            view.apply(ev, worker)
            count += 1
    except (OSError, WireError) as e:
        print(f"kvspec check-log: {e}", file=sys.stderr)
        return 2
    shown = 0
    for v in view.violations:
        known = prof.known_break(v.rule)
        if shown < args.max_report:
            print(str(v) + (f"\n  (profile {prof.name} is known to break this: {known})" if known else ""))
            shown += 1
    by_rule: dict[str, int] = {}
    for v in view.violations:
        by_rule[str(v.rule)] = by_rule.get(str(v.rule), 0) + 1
    summary = ", ".join(f"{r} x{n}" for r, n in sorted(by_rule.items())) or "no violations"
    print(f"checked {count} events from {len(view.sources)} manager(s): {summary}")
    return 1 if view.violations else 0
