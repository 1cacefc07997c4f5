"""The stream checker shared by ``kvspec check-log`` and ``kvspec watch``.

It builds one router view for the stream's producer, with the semantics of
that producer's source:

- ``dynamo`` (RouterEvent lines): set counting (Dynamo's event plane
  announces a hash once: its mocker's pool publishes a hash's first copy
  only); first event id 1 (Dynamo numbers a worker's events from 1);
  PARENT-ANCHOR in every tier (the router keeps each tier as its own prefix
  tree); hashes: the chain of ``block_hash`` from the parent and
  ``tokens_hash``.
- ``vllm``, ``sglang`` (ZMQ feeds, msgpack payloads): copies counting
  (vLLM's ``BlockPool`` may cache one hash in several physical blocks, each
  with its own Stored and Removed); no event ids (the transport sequence is
  checked instead); PARENT-ANCHOR in every tier; hashes: tokens per block,
  and the block hash by the scheme learned from the stream (Dynamo's or
  vLLM's).
- ``kvspec`` (kvspec event lines): set counting, or the profile's; first
  event id 0 (SPEC.md, EVENT-ID); PARENT-ANCHOR on the device tier only (a
  kvbm host-pinned Stored carries its G1 parent); token ids against
  ``tokens_hash`` when carried.

Every rule runs per worker, dp_rank and tier, REMOVE-NO-ORPHAN included, and
each finding names its cause as the stream shows it (which event removed the
parent, which stored the block). ``--profile`` names the implementation
generation the stream comes from: its documented known breaks are labelled
on the findings (they are still findings).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, TextIO

from kvspec.reference.router_view import Notice, RouterView, Violation
from kvspec.spec.profiles import PROFILES, Profile
from kvspec.spec.rules import RULES, RuleId
from kvspec.streams.hashcheck import SCHEMES, HashCheck
from kvspec.streams.producer_names import VLLM_FORMAT, VLLM_PRODUCER
from kvspec.streams.results import finding_json, format_at

PRODUCERS = ("auto", "dynamo", VLLM_PRODUCER, "sglang", "kvspec")
#: the producer a format implies
FORMAT_PRODUCER = {
    "router": "dynamo",
    "kvspec": "kvspec",
    "zmq": VLLM_PRODUCER,
    VLLM_FORMAT: VLLM_PRODUCER,
    "live": VLLM_PRODUCER,
    "eventplane": "dynamo",
}
#: notices (restarts, redeliveries) printed at most, after --max-report findings
NOTICES_SHOWN = 50


@dataclass(frozen=True, slots=True)
class Semantics:
    counting: str
    first_event_id: int | None
    anchor_all_tiers: bool
    hash_scheme: str


SEMANTICS: dict[str, Semantics] = {
    "dynamo": Semantics("set", 1, True, "auto"),
    VLLM_PRODUCER: Semantics("copies", None, True, "auto"),
    "sglang": Semantics("copies", None, True, "sglang"),
    "kvspec": Semantics("set", 0, False, "none"),
}


#: what ``--strict`` says: it once switched the strict rules on, which every
#: check now runs; a flag that does nothing is refused rather than accepted
STRICT_REMOVED = (
    "--strict does nothing any more: every rule, the strict ones (REMOVE-NO-ORPHAN) included, is checked "
    "by default; remove the flag (to leave a rule out of the report write --ignore RULE)"
)


class _Removed(argparse.Action):
    """An option that no longer does anything: giving it is a usage error
    (exit 2) whose message says what to write instead."""

    def __init__(self, *args: Any, message: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.message = message

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any, opt: Any = None) -> None:
        parser.error(self.message)


def add_checker_arguments(p: argparse.ArgumentParser) -> None:
    """The options ``check-log`` and ``watch`` share."""
    g = p.add_argument_group("semantics (defaults follow the producer)")
    g.add_argument(
        "--producer",
        choices=PRODUCERS,
        default="auto",
        help="who published the stream; auto: from the format (RouterEvent lines: dynamo, ZMQ feeds and msgpack: "
        "vllm, kvspec lines: kvspec). Sets the counting mode, the first event id, the anchored tiers and the hash "
        "scheme (see the table in kvspec/streams/check.py)",
    )
    g.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=None,
        help="the kvspec profile the publisher claims: sets the counting mode and labels the findings the profile "
        "is documented to break (they still count)",
    )
    g.add_argument(
        "--counting",
        choices=["set", "copies"],
        default=None,
        help="set: a hash is stored once per tier (STORE-NO-DUP, REMOVE-EXACT); copies: each Stored adds a "
        "physical copy (STORE-COPY, REMOVE-COPY). Default: the producer's",
    )
    g.add_argument(
        "--first-event-id",
        type=int,
        default=None,
        metavar="N",
        help="the id a worker's first event must carry (default: 1 for dynamo, 0 for kvspec)",
    )
    g.add_argument(
        "--mid-stream",
        action="store_true",
        help="the capture started mid-stream: accept any first event id and first ZMQ sequence number, and take "
        "what was stored before the first event seen as unknown (a Removed of it, or a parent naming it, is no "
        "finding). Without it a late start is one EVENT-ID finding, with the same unknown state after it",
    )
    g.add_argument(
        "--anchor-tiers",
        choices=["all", "device"],
        default=None,
        help="tiers where a Stored's parent must be stored (PARENT-ANCHOR); default: all, device for kvspec",
    )
    g.add_argument(
        "--shared-tier",
        action="append",
        choices=["disk", "external"],
        default=[],
        metavar="TIER",
        help="a tier the stream's workers share, as the kvbm mocker's G3 (disk) and G4 (external) are shared by the "
        "workers of one process (repeatable): a block live there under one worker must not be Stored there by "
        "another (TIER-DEDUP). Default: none (each worker's tiers are its own)",
    )
    g.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="RULE",
        help="do not report this rule (repeatable), e.g. --ignore REMOVE-NO-ORPHAN",
    )
    g.add_argument(
        "--sequential-orphans",
        action="store_true",
        help="REMOVE-NO-ORPHAN after each hash of a Removed, in the order it lists them (a parent listed before its "
        "child is a finding); default: after the whole Removed, as a router applying it at once sees it. Slower: "
        "the fast paths are off",
    )
    g.add_argument("--strict", action=_Removed, nargs=0, help=argparse.SUPPRESS, message=STRICT_REMOVED)
    g.add_argument(
        "--worker-id",
        type=int,
        default=0,
        help="worker id for feeds that carry none (vLLM-style ZMQ feeds, msgpack payloads); default 0",
    )
    h = p.add_argument_group("hashes")
    h.add_argument(
        "--hash-scheme",
        choices=SCHEMES,
        default=None,
        help="how block hashes follow from tokens. auto: Dynamo's chain for RouterEvents, learned from the first "
        "blocks for token-carrying feeds; dynamo; vllm-ALGO (vLLM's prefix_caching_hash_algo); none: no hash "
        "checks. Default: auto (none for kvspec lines, which check token ids against tokens_hash only)",
    )
    h.add_argument(
        "--vllm-hash-seed",
        default=None,
        metavar="SEED",
        help="vLLM's PYTHONHASHSEED (default: vLLM's own default seed, which applies to sha256 and sha256_cbor)",
    )
    h.add_argument("--lora-name", default=None, help="LoRA name salting Dynamo's local hashes (when tokens travel)")
    h.add_argument("--cache-namespace", default=None, help="cache namespace salting Dynamo's local hashes")
    h.add_argument(
        "--eagle", action="store_true", help="Dynamo's Eagle hashing: each block's hash covers the next block's token"
    )
    o = p.add_argument_group("output")
    o.add_argument("--max-report", type=int, default=50, help="findings to print (all are counted); default 50")
    o.add_argument(
        "--json",
        default=None,
        metavar="FILE",
        help="write the results JSON here ('-': stdout), with every finding (memory grows with their number) and "
        "the per-worker and per-tier statistics",
    )
    o.add_argument(
        "--findings",
        default=None,
        metavar="FILE",
        help="stream every finding as it is found to FILE, one JSON object per line ('-': stdout), in constant memory",
    )
    o.add_argument(
        "--stats",
        action="store_true",
        help="print per-worker (events, gaps, restarts, redeliveries, findings, live blocks) and per-tier statistics",
    )
    o.add_argument("--junit", default=None, metavar="FILE", help="write JUnit XML here ('-': stdout)")
    o.add_argument("--quiet", action="store_true", help="print only the summary")


class UsageError(Exception):
    pass


class Checker:
    """One router view, its hash check, and the report of what it finds."""

    def __init__(self, args: argparse.Namespace, fmt: str, *, out: TextIO | None = None, where: str = "") -> None:
        producer = args.producer if args.producer != "auto" else FORMAT_PRODUCER.get(fmt, "kvspec")
        #: the producer follows from the format, and a feed may show it is SGLang's (``settle_producer``)
        self.auto_producer = args.producer == "auto"
        sem = SEMANTICS[producer]
        self.producer = producer
        self.fmt = fmt
        self.out = out if out is not None else sys.stdout
        self.where = where
        self.profile: Profile | None = PROFILES[args.profile] if args.profile else None
        counting = args.counting or (self.profile.view_mode if self.profile else sem.counting)
        if args.mid_stream:
            first_id = None
        elif args.first_event_id is not None:
            if args.first_event_id < 0:
                raise UsageError("--first-event-id must be >= 0")
            first_id = args.first_event_id
        else:
            first_id = sem.first_event_id
        start_id = args.first_event_id if args.first_event_id is not None else sem.first_event_id
        anchor_all = sem.anchor_all_tiers if args.anchor_tiers is None else args.anchor_tiers == "all"
        self.ignore: set[str] = set()
        for r in args.ignore:
            try:
                self.ignore.add(str(RuleId(r)))
            except ValueError:
                raise UsageError(f"--ignore: unknown rule id {r!r}") from None
        self.warnings: list[str] = []
        self.hashes = HashCheck(
            args.hash_scheme or sem.hash_scheme,
            lora_name=args.lora_name,
            cache_namespace=args.cache_namespace,
            is_eagle=args.eagle,
            vllm_seed=args.vllm_hash_seed,
            warn=self.warn,
            note=self.note,
        )
        self.view = RouterView(
            mode="copies" if counting == "copies" else "set",
            strict=True,
            first_event_id=first_id,
            anchored_tiers=None if anchor_all else ("device",),
            stored_check=self.hashes,
            keep=0,
            on_violation=self._on_violation,
            shared_tiers=getattr(args, "shared_tier", ()),
            resync=True,
            start_event_id=start_id,
            sequential_orphans=bool(getattr(args, "sequential_orphans", False)),
            on_notice=self._on_notice,
        )
        self.settings = {
            "producer": producer,
            "profile": args.profile,
            "counting": counting,
            "first_event_id": first_id,
            "anchored_tiers": "all" if anchor_all else "device",
            "shared_tiers": sorted(set(getattr(args, "shared_tier", ()))),
            "hash_scheme": args.hash_scheme or sem.hash_scheme,
        }
        self.max_report = args.max_report
        self.quiet = args.quiet
        self.counts: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()
        self.findings: list[dict[str, Any]] = []
        #: every finding is kept for the results file and JUnit (when asked for)
        self.keep_findings = args.json is not None or args.junit is not None
        #: findings per (worker, dp rank, tier)
        self.by_tier: Counter[tuple[int, int, str]] = Counter()
        self.shown = 0
        self.notices_shown = 0
        self.on_finding: Callable[[Violation], None] | None = None
        self.feed: Any = None  # the ZmqFeed of feed formats (the latest input's)
        self.feeds: list[Any] = []  # every input's ZmqFeed
        #: several inputs: a finding's place in the results names its input
        self.multi = False
        self.on_notice: Callable[[Notice], None] | None = None
        self._stream: IO[str] | None = None
        self._stream_owned = False
        dest = getattr(args, "findings", None)
        if dest == "-":
            self._stream = sys.stdout
        elif dest is not None:
            try:
                self._stream = open(dest, "w")  # noqa: SIM115 - closed in close()
            except OSError as e:
                raise UsageError(f"--findings {dest}: cannot write it: {e.strerror or e}") from None
            self._stream_owned = True

    def close(self) -> None:
        """Flush and close the findings stream."""
        if self._stream is not None:
            self._stream.flush()
            if self._stream_owned:
                self._stream.close()
            self._stream = None

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)
        print(f"kvspec: warning: {msg}", file=sys.stderr)

    def note(self, msg: str) -> None:
        print(f"kvspec: note: {msg}", file=sys.stderr)

    def _on_violation(self, v: Violation) -> None:
        rid = str(v.rule)
        if rid in self.ignore:
            self.ignored[rid] += 1
            return
        self.counts[rid] += 1
        self.by_tier[(v.source[0], v.source[1], v.tier)] += 1
        at = format_at(v.at, self.fmt)
        if self.keep_findings or self._stream is not None:
            doc = finding_json(v, f"{self.where} {at}" if self.multi else at)
            if self.keep_findings:
                self.findings.append(doc)
            if self._stream is not None:
                self._stream.write(json.dumps(doc) + "\n")
                self._stream.flush()
        if not self.quiet and self.shown < self.max_report:
            self.shown += 1
            print(self.line(v, at), file=self.out)
        if self.on_finding is not None:
            self.on_finding(v)

    def _on_notice(self, n: Notice) -> None:
        if not self.quiet and self.notices_shown < NOTICES_SHOWN:
            self.notices_shown += 1
            at = format_at(n.at, self.fmt)
            place = f"{self.where} {at}" if self.where else at
            print(f"{place}: note: {n.kind} worker {n.source[0]} dp {n.source[1]} {n.tier}: {n.message}", file=self.out)
        if self.on_notice is not None:
            self.on_notice(n)

    def line(self, v: Violation, at: str) -> str:
        """One finding on one line: place, rule, source, tier, message, cause."""
        ctx = ", ".join(f"{k.replace('_', ' ')} {_short(x)}" for k, x in v.context.items())
        tail = f" ({ctx})" if ctx else ""
        if self.profile is not None:
            known = self.profile.known_break(v.rule)
            if known:
                tail += f" [known break of profile {self.profile.name}: {known}]"
        if at.startswith("line "):  # compiler style, so editors can jump to it
            place = f"{self.where}:{at[5:]}" if self.where else at
        else:
            place = f"{self.where} {at}" if self.where else at
        return f"{place}: {v.rule} worker {v.source[0]} dp {v.source[1]} {v.tier}: {v.message}{tail}"

    def rules_checked(self) -> list[str]:
        """The stream-checkable rules this configuration runs."""
        copies = self.view.mode == "copies"
        out = {str(r) for r, rule in RULES.items() if rule.stream_checkable}
        out |= {str(RuleId.HASH_SEQUENCE)}
        out -= (
            {str(RuleId.STORE_NO_DUP), str(RuleId.REMOVE_EXACT)}
            if copies
            else {
                str(RuleId.STORE_COPY),
                str(RuleId.REMOVE_COPY),
            }
        )
        out -= {str(RuleId.CLEAR_ALL), str(RuleId.G2_EVICT)}  # need the operations, not only the stream
        return sorted(out)

    def use_producer(self, producer: str, args: argparse.Namespace) -> None:
        """Take ``producer``'s semantics before any event was applied (``watch``
        learns at its first message that a feed is Dynamo's event plane); the
        options the user gave still win, as in ``__init__``."""
        sem = SEMANTICS[producer]
        self.producer = producer
        counting = args.counting or (self.profile.view_mode if self.profile else sem.counting)
        self.view.mode = "copies" if counting == "copies" else "set"
        if not args.mid_stream and args.first_event_id is None:
            self.view.first_event_id = sem.first_event_id
        if args.first_event_id is None:
            self.view.start_event_id = sem.first_event_id
        if args.anchor_tiers is None:
            self.view.anchored_tiers = None if sem.anchor_all_tiers else frozenset(("device",))
        self.settings.update(
            producer=producer,
            counting=counting,
            first_event_id=self.view.first_event_id,
            anchored_tiers="all" if self.view.anchored_tiers is None else "device",
        )

    def settle_producer(self) -> None:
        """A feed read as vLLM's by default that showed SGLang's signed hashes
        or hash scheme is SGLang's: the summary and the results say so."""
        if self.auto_producer and self.producer == VLLM_PRODUCER:
            signed = any(getattr(f, "signed", None) for f in self.feeds)
            if signed or self.hashes.learned == "sglang":
                self.producer = self.settings["producer"] = "sglang"

    def live_blocks(self) -> int:
        return sum(self.view.live_blocks().values())

    def statistics(self) -> dict[str, Any]:
        """Per worker (and dp rank) and per tier: events, gaps, restarts,
        redeliveries, findings and live blocks. Events come from the event
        ids where the stream carries them, else from the feed's count."""
        feeds = list(self.feeds) or ([self.feed] if self.feed is not None else [])
        fed: dict[tuple[int, int], int] = {}
        by_worker: dict[int, Any] = {}  # the id-less feed of each worker: its transport counts
        for feed in feeds:
            w = getattr(feed, "worker_id", None)
            if isinstance(w, int):
                for dp, n in (getattr(feed, "per_dp", None) or {}).items():
                    fed[(w, dp)] = fed.get((w, dp), 0) + n
            if isinstance(getattr(feed, "worker_id", None), int) and getattr(feed, "plane", None) is None:
                by_worker[feed.worker_id] = feed.stats
        workers: list[dict[str, Any]] = []
        tiers: dict[str, dict[str, int]] = {}
        for (w, dp), src in sorted(self.view.sources.items()):
            events = src.events()
            if events is None:
                events = fed.get((w, dp))
            per_tier: dict[str, dict[str, Any]] = {}
            for name, t in sorted(src.tiers.items()):
                n = self.by_tier.get((w, dp, name), 0)
                per_tier[name] = {"live_blocks": len(t.live), "findings": n, "partial": t.partial}
                agg = tiers.setdefault(name, {"sources": 0, "live_blocks": 0, "findings": 0})
                agg["sources"] += 1
                agg["live_blocks"] += len(t.live)
                agg["findings"] += n
            entry: dict[str, Any] = {
                "worker_id": w,
                "dp_rank": dp,
                "events": events,
                "next_event_id": src.next_id,
                "gaps": src.gaps,
                "restarts": src.restarts,
                "redelivered": src.redelivered,
                "findings": sum(n for (ww, dd, _), n in self.by_tier.items() if (ww, dd) == (w, dp)),
                "tiers": per_tier,
            }
            fst = by_worker.get(w)
            if fst is not None and src.seg_start is None:  # the feed's sequence numbers stand for the ids
                entry["feed"] = {"lost": fst.lost, "duplicates": fst.duplicates, "late": fst.late}
                entry["restarts"] += fst.restarts
                entry["redelivered"] += fst.redelivered
                entry["gaps"] += fst.gaps
            workers.append(entry)
        return {"workers": workers, "tiers": tiers}

    def print_statistics(self, out: IO[str]) -> None:
        st = self.statistics()
        print("per worker (worker dp: events, gaps, restarts, redelivered, findings; live blocks per tier):", file=out)
        for e in st["workers"]:
            live = " ".join(
                f"{name}={t['live_blocks']}{' (partial)' if t['partial'] else ''}" for name, t in e["tiers"].items()
            )
            ev = "?" if e["events"] is None else e["events"]
            print(
                f"  {e['worker_id']} dp {e['dp_rank']}: {ev} events, {e['gaps']} gaps, {e['restarts']} restarts, "
                f"{e['redelivered']} redelivered, {e['findings']} findings; {live or '-'}",
                file=out,
            )
        print("per tier (tier: sources, live blocks, findings):", file=out)
        for name, t in sorted(st["tiers"].items()):
            print(
                f"  {name}: {t['sources']} source(s), {t['live_blocks']} live blocks, {t['findings']} findings",
                file=out,
            )


def _short(x: Any) -> str:
    s = str(x)
    return s if len(s) <= 200 else s[:197] + "..."
