"""The offload tier in the lockstep machine: ticks, swap-ins, Uses that wait.

``OffloadGroup`` is a rule group (``conformance/block/machine.py``) mixed into the
lockstep machine of the ``kvbm`` profile for adapters that declare the
``offload`` capability (swap-in actions also need ``swap_in``). Per example
it attaches a G2 tier half of the time (the other half keeps plain kvbm
traffic, whose Use semantics differ: with an offload tier an eviction blocks
the Use), drawing G2's capacity and the transfer time of a block (instant,
1 ms, 1.5 ms), so that quarantined slots, FIFO deadlines and G2 evictions all
occur within a few dozen steps.

Actions (each a swarm kind, so some examples never tick backwards, others
never swap in):

- ``tick``: a Tick to the earliest pending deadline (the one the model
  reports; an implementation must report the same), or to an arbitrary
  later time (past several deadlines, or between two);
- ``tick_back``: a Tick earlier than the clock: nothing may change
  (TIME-MONOTONIC);
- ``swap_in``: a SwapIn of the G2-resident part of a request's path, as a
  scheduler does it: the blocks a running request has not placed yet (or
  its next chunk, a child of its last block that G2 holds), anchored to the
  last block it holds; or, for a preempted request, the rest of its path
  after it takes back (a Use of hits only) the part G1 still has. The same
  kind also waits for an in-flight swap-in (a Tick to its deadline), or
  races it: the request places those blocks itself (a Use), so that the
  onboard finds them present;
- ``wait_retry``: a request whose Use was stopped by an offload waits for
  the transfer (a Tick to the earliest deadline) and retries the rest of its
  path (a Use anchored to its last block): Uses that evict under offload
  and then succeed.

Scheduler discipline the actions keep, so that the traffic is one a real
scheduler would send: a block anchoring an in-flight swap-in stays held
until the swap-in completes (a release of it first waits for the onboard:
a Tick to its deadline), as the seed pins the G1 prefix of a swap-in.

Timing in the router view: the lockstep's router views (of the
implementation's stream and of the model's) get the transfer clock
(``RouterView.enable_timing`` with the configured time of one block) and
see every Tick's time before its events, so that a host-pinned Stored
earlier than its device Removed plus one block's transfer time is flagged as
G2-STORE-ON-COMPLETE from the stream alone.

The group reads two things beyond the public interfaces, both inside
kvspec: the reference model's swap-ins in flight (``G1Model.onboards()``, to
know when a swap-in is in flight) and the traffic's Use builder
(``Traffic._use`` / ``_placed``, for the prefix a preempted request takes
back).

Coverage: besides what the lockstep counts for every step, the group counts
SWAPIN-ANCHOR (an onboard registered blocks), SWAPIN-SKIP-PRESENT (an
onboard found one of its blocks already in G1) and TIME-MONOTONIC for ticks
backwards, into the same per-rule counters the suite's summary shows.
"""

from __future__ import annotations

from typing import Any, ClassVar

from hypothesis import strategies as st

from kvspec.conformance.block.machine import Digits, RuleGroup, action
from kvspec.conformance.block.traffic import Planned, TrafficError, TrafficRequest, TreeBlock
from kvspec.spec import registry
from kvspec.spec.config import SEMANTICS, ManagerConfig, OffloadConfig
from kvspec.spec.profiles import profile as get_profile
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Counters, Deref, FullBlock, StepOutcome, SwapIn, SwapInBlock, Tick

#: (G2 capacity, block size in bytes, link bandwidth in GB/s): drawn per example
G2_CAPACITIES = (1, 2, 4, 8)
TRANSFERS: tuple[tuple[int | None, float], ...] = ((None, 1.0), (1_000_000, 1.0), (3_000_000, 2.0))
#: blocks per transfer on a shared link: Dynamo's default, and a small one
#: that splits a job into several transfers and caps how many run at once
BATCH_SIZES = (32, 2)
#: how far a later tick moves the clock (ms)
LATER_MS = (0.0, 0.25, 0.5, 1.0, 1.5, 3.0, 10.0)
#: how far back a backward tick goes (ms)
BACK_MS = (0.1, 0.5, 1.0, 1000.0)


def _ok(kind: str) -> Any:
    def commit(out: StepOutcome, before: Counters) -> None:
        if out.error is not None:
            raise TrafficError(f"valid {kind} rejected: [{out.error.rule}] {out.error.message}")

    return commit


#: the options a fifo link ignores (its one behaviour is their legacy value)
FIFO_FIXED = ("g2_allocation", "dedup")
#: the options that only matter with G3/G4 on (the lockstep has neither)
NO_LOWER_TIER_FIXED = ("lower_tier_events",)


class OffloadGroup(RuleGroup):
    """Ticks, swap-ins and waiting Uses for adapters with an offload tier."""

    #: swarm kinds (each enabled in half of the examples)
    kinds = ("swap_in", "tick", "wait_retry", "tick_back")
    requires = ("offload",)
    profiles = tuple(p for p in registry.names("block", stateful=True) if get_profile(p).offload_tier)

    #: set per example
    _clock: float
    _anchors: set[int]
    _inflight: list[TrafficRequest]
    _skip_due: bool
    _onboard_due: bool
    setup: ClassVar[Any]

    @classmethod
    def kind_available(cls, kind: str) -> bool:
        if kind == "swap_in" and not cls.setup.manifest.capabilities.swap_in:
            return False
        return super().kind_available(kind)

    # ------------------------------------------------------------------ hooks
    def configure(self, config: ManagerConfig, data: Any) -> ManagerConfig:
        config = super().configure(config, data)
        if not get_profile(config.profile).offload_tier:
            return config
        # one draw: bit 0 attaches the tier, the rest pick capacity and timing
        x = data.draw(st.integers(0, 2 * len(G2_CAPACITIES) * len(TRANSFERS) - 1), label="offload tier")
        if x % 2 == 0:
            return config
        x //= 2
        g2 = G2_CAPACITIES[x % len(G2_CAPACITIES)]
        size, bandwidth = TRANSFERS[x // len(G2_CAPACITIES)]
        # the semantics options: each among the values the adapter declares,
        # drawn only where it means something: a fifo link has one behaviour
        # for g2_allocation and dedup (SPEC.md, "Offload semantics options"),
        # so they are not drawn for it and equivalent configs are not told apart
        caps = self.setup.manifest.capabilities
        options: dict[str, Any] = {"link": data.draw(st.sampled_from(caps.supported("link")), label="link")}
        for name, opt in SEMANTICS.items():
            if opt.scope != "offload" or name in options:
                continue
            values = caps.supported(name)
            if name in NO_LOWER_TIER_FIXED:
                # the lockstep never turns G3/G4 on: the option has no effect, so it
                # is not drawn (a draw would only reshuffle every example after it)
                options[name] = opt.legacy if opt.legacy in values else values[0]
            elif options["link"] == "fifo" and name in FIFO_FIXED:
                options[name] = opt.legacy if opt.legacy in values else values[0]
            else:
                options[name] = data.draw(st.sampled_from(values), label=name)
        if options["link"] == "shared":
            options["batch_size"] = data.draw(st.sampled_from(BATCH_SIZES), label="batch_size")
        off = OffloadConfig(num_g2_blocks=g2, block_size_bytes=size, bandwidth_gbps=bandwidth, **options)
        return config.model_copy(update={"offload": off})

    def start(self, config: ManagerConfig, swarm: frozenset[str]) -> None:
        super().start(config, swarm)
        self._clock = 0.0
        self._anchors = set()
        self._inflight = []
        self._skip_due = False
        self._onboard_due = False
        assert self.check is not None
        if config.offload is not None:
            for view in (self.check.view, self.check.model_view):
                view.enable_timing(config.offload.transfer_ms(), 0.0)

    def after_step(self, planned: Planned, expected: StepOutcome) -> None:
        super().after_step(planned, expected)
        if self.check is None or expected.error is not None:
            return
        cov = self.check.coverage
        if isinstance(planned.op, Tick):
            if planned.kind == "tick_back":
                cov[RuleId.TIME_MONOTONIC] += 1
            if self._onboard_due and any(e.kind == "stored" and e.storage_tier == "device" for e in expected.events):
                cov[RuleId.SWAPIN_ANCHOR] += 1
            if self._skip_due:
                cov[RuleId.SWAPIN_SKIP_PRESENT] += 1
            self._skip_due = self._onboard_due = False
        if not self._onboard_deadlines():
            self._anchors.clear()
            self._inflight.clear()

    def run(self, planned: Planned | None) -> StepOutcome | None:
        """A release of a block that anchors an in-flight swap-in first waits
        for the swap-in (the scheduler keeps its prefix pinned until then)."""
        if (
            planned is not None
            and isinstance(planned.op, Deref)
            and self._anchors
            and any(isinstance(b, FullBlock) and b.full in self._anchors for b in planned.op.blocks)
        ):
            pending = self._onboard_deadlines()
            if pending:
                super().run(self._tick(max(pending), "tick_next"))
        return super().run(planned)

    # ---------------------------------------------------------------- helpers
    def _offload_on(self) -> bool:
        return self.check is not None and self.check.config.offload is not None

    def _onboard_deadlines(self) -> list[float]:
        """Deadlines of the model's pending onboards (the reference G1 model)."""
        if self.check is None:
            return []
        onboards = getattr(self.check.model, "onboards", None)
        return [at for at, _job in onboards()] if onboards is not None else []

    def _tick(self, now: float, kind: str) -> Planned:
        """A Tick to ``now``; the router views see the clock first."""
        assert self.check is not None
        model = self.check.model
        self._clock = max(self._clock, now)
        for view in (self.check.view, self.check.model_view):
            view.observe_time(now)
        # what the tick will complete, for the coverage of the onboard rules
        registered = model.registered()
        for at, job in model.onboards() if hasattr(model, "onboards") else ():
            if at <= now:
                self._onboard_due = True
                if any(seq in registered for seq, *_ in job.blocks):
                    self._skip_due = True
        return Planned(Tick(now_ms=now), kind, _ok(kind))

    def _deadline(self) -> float | None:
        return self.check.model.earliest_deadline() if self.check is not None else None

    def _swap_candidates(self) -> list[tuple[TrafficRequest, int, TreeBlock | None]]:
        """(request, index of the first block to swap in, block to append):
        the first block a running request has not placed; a child of the
        last block of a running request that placed its whole path (its next
        chunk, cached in G2); or the first block of a preempted request's
        path that G1 lacks. Only blocks G2 holds."""
        if self.check is None or self.traffic is None:
            return []
        g2 = self.check.model.registered("host_pinned")
        if not g2:
            return []
        g1 = self.check.model.registered()
        nodes = self.traffic.tree.nodes
        out: list[tuple[TrafficRequest, int, TreeBlock | None]] = []
        for r in self.traffic.requests:
            if r.forked or r.partial is not None:
                continue
            if r.running:
                start = r.held
                if start == len(r.path) and r.path:
                    out.extend((r, start, nodes[k]) for k in r.path[-1].children if k in g2)
                    continue
            else:
                start = next((i for i, n in enumerate(r.path) if n.seq not in g1), len(r.path))
            if start < len(r.path) and r.path[start].seq in g2:
                out.append((r, start, None))
        return out

    def _retry_candidates(self) -> list[TrafficRequest]:
        if self.traffic is None:
            return []
        return [r for r in self.traffic.extendable() if r.held < len(r.path)]

    # ---------------------------------------------------------------- actions
    @action("tick", weight=3, ready=lambda self: self._offload_on() and self._deadline() is not None)
    def tick_next(self, d: Digits) -> Planned | None:
        """Time advances to the earliest pending transfer deadline."""
        deadline = self._deadline()
        assert deadline is not None, "ready only with a pending transfer"
        return self._tick(deadline, "tick_next")

    @action("tick", weight=2, ready=lambda self: self._offload_on())
    def tick_later(self, d: Digits) -> Planned | None:
        """Time advances to an arbitrary later time."""
        return self._tick(self._clock + LATER_MS[d.take(len(LATER_MS))], "tick_later")

    @action("tick_back", weight=1, ready=lambda self: self._offload_on() and self._clock > 0)
    def tick_back(self, d: Digits) -> Planned | None:
        """A tick earlier than the clock: it must change nothing."""
        now = max(0.0, self._clock - BACK_MS[d.take(len(BACK_MS))])
        assert self.check is not None
        return Planned(Tick(now_ms=now), "tick_back", _ok("tick_back"))

    @action("swap_in", weight=10, ready=lambda self: self._offload_on() and bool(self._swap_candidates()))
    def swap_in(self, d: Digits) -> Planned | None:
        """Swap in the G2-resident part of a request's path, anchored to the
        last block it holds. A preempted request first takes back the part
        of its path G1 still has (a Use of hits only: the scheduler pins the
        G1 prefix before it swaps in the rest)."""
        t = self.t
        cands = self._swap_candidates()
        req, start, nxt = cands[d.take(64) % len(cands)]
        if nxt is not None:
            req.path.append(nxt)  # the request continues with that block
        if not req.running:
            if start:
                pin = t._use(req.path[:start], req.meta, req.base, None)
                self.run(Planned(pin, "readmit", t._placed(req, pin, start, None)))
                if self.traffic is None or req.held < start:
                    return None
            else:
                req.running = True
        nodes = req.path[start:]
        base = req.path[start - 1] if start else req.base
        anchor = base.seq if base is not None else None
        op = SwapIn(blocks=[SwapInBlock(seq_hash=n.seq, plh=n.lineage) for n in nodes], parent=anchor)

        def commit(out: StepOutcome, before: Counters) -> None:
            _ok("swap_in")(out, before)
            assert out.result is not None
            if out.result.status == "scheduled":
                self._inflight.append(req)
                if anchor is not None:
                    self._anchors.add(anchor)

        return Planned(op, "swap_in", commit)

    @action(
        "wait_retry",
        weight=2,
        ready=lambda self: self._offload_on() and self._deadline() is not None and bool(self._retry_candidates()),
    )
    def wait_retry(self, d: Digits) -> Planned | None:
        """A request stopped short waits for the earliest transfer and
        retries the rest of its path, anchored to its last block."""
        cands = self._retry_candidates()
        req = cands[d.take(64) % len(cands)]
        deadline = self._deadline()
        assert deadline is not None, "a waiting request waits for a pending transfer"
        self.run(self._tick(deadline, "tick_next"))
        if self.traffic is None or req not in self.traffic.requests:
            return None
        return self.traffic.extend(req, [], partial=False)

    def _racing(self) -> list[TrafficRequest]:
        if self.traffic is None:
            return []
        ext = self.traffic.extendable()
        return [r for r in self._inflight if r in ext and r.held < len(r.path)]

    @action("swap_in", weight=2, ready=lambda self: self._offload_on() and bool(self._racing()))
    def swap_race(self, d: Digits) -> Planned | None:
        """A request does not wait for its swap-in: it places the blocks being
        swapped in itself (a Use anchored to its last block), so that the
        onboard finds them in G1 when it completes (SWAPIN-SKIP-PRESENT)."""
        cands = self._racing()
        return self.t.extend(cands[d.take(64) % len(cands)], [], partial=False)

    @action("swap_in", weight=3, ready=lambda self: self._offload_on() and bool(self._inflight))
    def swap_wait(self, d: Digits) -> Planned | None:
        """A request waits for its swap-in: time advances to the onboard's
        deadline, which registers the swapped-in blocks (SWAPIN-ANCHOR)."""
        pending = self._onboard_deadlines()
        return self._tick(min(pending), "tick_next") if pending else None
