"""What both ``kvspec watch`` transports share: the option checks, the
metrics server, and the summary, results file and JUnit at the end."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from kvspec.streams.check import Checker, UsageError
from kvspec.streams.junit import junit_xml, write_junit
from kvspec.streams.results import results, write_json

if TYPE_CHECKING:
    from kvspec.streams.metrics import Metrics


def check_common(args: argparse.Namespace) -> None:
    """The options both transports check; raises UsageError."""
    if args.max_events is not None and args.max_events <= 0:
        raise UsageError("--max-events must be positive")
    if args.max_record_bytes <= 0:
        raise UsageError("--max-record-bytes must be positive")
    if args.idle_timeout is not None and args.idle_timeout <= 0:
        raise UsageError("--idle-timeout must be positive")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise UsageError("--metrics-port must be a port number (0: a free one)")


def start_metrics(args: argparse.Namespace, checker: Checker) -> Metrics | None:
    """Serve --metrics-port, wired to the checker's findings and notices."""
    if args.metrics_port is None:
        return None
    try:
        from kvspec.streams.metrics import Metrics, start
    except ImportError as e:  # prometheus_client missing
        raise UsageError(f"--metrics-port needs the prometheus_client package ({e})") from None
    m = Metrics(checker.view)
    checker.on_finding = m.finding
    checker.on_notice = m.notice
    port = args.metrics_port
    if port == 0:
        import socket

        with socket.socket() as sock:
            sock.bind((args.metrics_host, 0))
            port = sock.getsockname()[1]
    try:
        start(m, port, args.metrics_host)
    except OSError as e:
        raise UsageError(f"--metrics-port {port}: cannot serve on it: {e.strerror or e}") from None
    print(f"watch: metrics on http://{args.metrics_host}:{port}/metrics", file=sys.stderr, flush=True)
    return m


def finish(
    args: argparse.Namespace,
    checker: Checker,
    *,
    headline: str,
    counts: dict[str, int],
    error: str | None,
    fmt: str,
    input: dict[str, Any],
    seconds: float,
) -> int:
    """Print the summary, write --json and --junit; returns the exit code."""
    checker.close()
    code = 2 if error is not None else (1 if checker.counts else 0)
    out = sys.stderr if "-" in (args.json, args.findings) else sys.stdout
    notices = checker.view.notices
    counts = {
        **counts,
        "sources": len(checker.view.sources),
        "live_blocks": checker.live_blocks(),
        "restarts": notices["restart"],
        "redelivered": notices["redelivered"],
        "unknown_refs": notices["unknown"],
        "gaps": sum(checker.view.gaps.values()),
    }
    print(headline, file=out)
    if counts["restarts"] or counts["redelivered"] or counts["unknown_refs"]:
        print(
            f"resynchronised: {counts['restarts']} restart(s), {counts['redelivered']} redelivered batch(es) or "
            f"event(s) skipped, {counts['unknown_refs']} reference(s) to blocks stored before the watch joined or a "
            "gap (unknown, not findings)",
            file=out,
        )
    for rid, n in sorted(checker.counts.items()):
        print(f"  {rid:<24} {n}", file=out)
    if args.stats:
        checker.print_statistics(out)
    verdict = {0: "no findings", 1: f"{sum(checker.counts.values())} finding(s)", 2: error}[code]
    print(f"result: {verdict} (exit {code})", file=out)
    if args.json is not None:
        doc = results(
            tool="kvspec watch",
            exit_code=code,
            input={**input, "format": fmt, **checker.settings},
            counts=counts,
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
        write_junit(
            junit_xml(
                tool="kvspec watch",
                fmt=fmt,
                rules=checker.rules_checked(),
                findings_by_rule=checker.counts,
                ignored=checker.ignore,
                findings=checker.findings,
                error=error,
                seconds=seconds,
            ),
            args.junit,
        )
    return code
