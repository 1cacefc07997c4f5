"""``kvspec watch --metrics-port PORT``: Prometheus metrics of a live check.

The watch loop keeps plain counters (events per worker, dp rank, tier and
kind; findings per rule, worker, dp rank and tier; the publish time of each
worker's last batch) and, a few times a second, swaps in a snapshot with the
router view's live blocks and the gaps, restarts and redeliveries so far.
The HTTP server of ``prometheus_client`` runs in its own thread and reads
only that snapshot (a reference swap), never the view while it changes.

Metric names (all labels strings)::

    kvspec_watch_events_total{worker, dp_rank, tier, kind}    counter
    kvspec_watch_findings_total{rule, worker, dp_rank, tier}  counter
    kvspec_watch_live_blocks{worker, dp_rank, tier}           gauge
    kvspec_watch_lag_seconds{worker}                          gauge: receive time - publish time, last batch
    kvspec_watch_gaps_total{worker}                           counter
    kvspec_watch_restarts_total{worker}                       counter
    kvspec_watch_redelivered_total{worker}                    counter
    kvspec_watch_messages_total                               counter
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvspec.reference.router_view import Notice, RouterView, Violation

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = ["Metrics", "start"]


@dataclass(slots=True)
class _Snapshot:
    events: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    findings: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    live: dict[tuple[str, str, str], int] = field(default_factory=dict)
    lag: dict[str, float] = field(default_factory=dict)
    gaps: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    redelivered: dict[str, int] = field(default_factory=dict)
    messages: int = 0


class Metrics:
    """The counters the watch loop feeds, and the collector that serves them."""

    def __init__(self, view: RouterView) -> None:
        self.view = view
        self.events: Counter[tuple[int, int, str, str]] = Counter()
        self.findings: Counter[tuple[str, int, int, str]] = Counter()
        self.notices: Counter[tuple[str, int]] = Counter()
        self.lag: dict[int, float] = {}
        self.messages = 0
        self.snapshot = _Snapshot()
        self._next = 0.0

    # ------------------------------------------------------- the loop's side
    def event(self, worker: int, dp_rank: int, tier: str, kind: str, n: int = 1) -> None:
        self.events[(worker, dp_rank, tier, kind)] += n

    def published(self, worker: int, published_s: float | None) -> None:
        """A batch of this worker published at ``published_s`` (Unix seconds) arrived now."""
        if published_s is not None and published_s > 0:
            self.lag[worker] = max(0.0, time.time() - published_s)

    def finding(self, v: Violation) -> None:
        self.findings[(str(v.rule), v.source[0], v.source[1], v.tier)] += 1

    def notice(self, n: Notice) -> None:
        self.notices[(n.kind, n.source[0])] += 1

    def refresh(self, force: bool = False) -> None:
        """Swap in a new snapshot (at most every 0.2 s unless ``force``)."""
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + 0.2
        s = _Snapshot()
        s.events = {(str(w), str(d), t, k): n for (w, d, t, k), n in self.events.items()}
        s.findings = {(r, str(w), str(d), t): n for (r, w, d, t), n in self.findings.items()}
        s.live = {(str(w), str(d), t): n for (w, d, t), n in self.view.live_blocks().items()}
        s.lag = {str(w): x for w, x in self.lag.items()}
        s.gaps = {str(w): n for w, n in self.view.gaps.items()}
        s.restarts = {str(w): n for (k, w), n in self.notices.items() if k == "restart"}
        s.redelivered = {str(w): n for (k, w), n in self.notices.items() if k == "redelivered"}
        s.messages = self.messages
        self.snapshot = s

    # ------------------------------------------------------ the server's side
    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.snapshot
        ev = CounterMetricFamily(
            "kvspec_watch_events", "KV events checked", labels=["worker", "dp_rank", "tier", "kind"]
        )
        for k, n in sorted(s.events.items()):
            ev.add_metric(list(k), n)
        yield ev
        fi = CounterMetricFamily(
            "kvspec_watch_findings", "findings by rule id", labels=["rule", "worker", "dp_rank", "tier"]
        )
        for k, n in sorted(s.findings.items()):
            fi.add_metric(list(k), n)
        yield fi
        live = GaugeMetricFamily(
            "kvspec_watch_live_blocks", "blocks the router view holds", labels=["worker", "dp_rank", "tier"]
        )
        for key, n in sorted(s.live.items()):
            live.add_metric(list(key), n)
        yield live
        lag = GaugeMetricFamily(
            "kvspec_watch_lag_seconds", "receive time minus publish time of the last batch", labels=["worker"]
        )
        for w, x in sorted(s.lag.items()):
            lag.add_metric([w], x)
        yield lag
        for name, doc, table in (
            ("kvspec_watch_gaps", "gaps: lost events or batches (each an EVENT-ID finding)", s.gaps),
            ("kvspec_watch_restarts", "publisher restarts", s.restarts),
            ("kvspec_watch_redelivered", "events or batches delivered again and skipped", s.redelivered),
        ):
            c = CounterMetricFamily(name, doc, labels=["worker"])
            for w, n in sorted(table.items()):
                c.add_metric([w], n)
            yield c
        m = CounterMetricFamily("kvspec_watch_messages", "messages received")
        m.add_metric([], s.messages)
        yield m


def start(metrics: Metrics, port: int, host: str = "127.0.0.1") -> CollectorRegistry:
    """Serve ``metrics`` on http://HOST:PORT/metrics (a thread of
    ``prometheus_client``); returns the registry."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    start_http_server(port, addr=host, registry=registry)
    return registry
