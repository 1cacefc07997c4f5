"""Check several workers of one process (sharing G3/G4) through an adapter.

An adapter that declares ``workers = N`` is opened with several workers and
stepped with ``Implementation.step_on(worker, op)``: each step returns the
stepped worker's outcome and the events every other worker published during
it (a shared tier's event comes from the worker that owns the block,
TIER-EVENTS). ``ProcessChecker`` compares each step with the reference
``Process`` (reference/process.py) run beside it, and feeds every worker's
events to one router view that keeps a view per worker and per tier, with
the lower tiers declared shared (a hash live in G3 under one worker must
not be Stored there by another: TIER-DEDUP). The goldens of
``spec/scenarios/tiers/`` (``run_process_scenario``) and the two-worker
lockstep (``machine_workers.py``) both use it, so a mistake is named by the
same rule in both.

The rule of a difference is the model's label of the event or result
(``block.diff``); an event missing from the worker that owns it and
published by another worker instead is TIER-EVENTS.
"""

from __future__ import annotations

from collections.abc import Callable

from kvspec.conformance.block.diff import (
    Divergence,
    counters_divergence,
    deadline_divergence,
    event_divergence,
    op_rule,
    result_divergence,
)
from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.run.deviation_scope import site_of
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference.labels import StepLabels
from kvspec.reference.process import Process, ProcessStep
from kvspec.reference.router_view import RouterView
from kvspec.spec.config import ManagerConfig
from kvspec.spec.display import format_ops
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.process_scenario import ProcessScenario
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Operation, OpResult, ProcessOutcome, StepOutcome

#: the tiers every worker of a process shares (their events are checked across workers)
SHARED_TIERS = ("disk", "external")


def _sig(e: KvEvent) -> tuple[str, str, tuple[int, ...]]:
    return (e.storage_tier, e.kind, tuple(e.hashes()))


def worker_events_divergence(
    expected: dict[int, list[KvEvent]], got: ProcessOutcome, stepped: int, workers: int, labels: StepLabels | None
) -> tuple[int, Divergence] | None:
    """The first worker whose events differ, with the difference. An event
    the owner should have published that another worker published instead
    breaks TIER-EVENTS."""
    for w in range(workers):
        want = expected.get(w, [])
        actual = got.events_of(w, stepped)
        d = event_divergence(want, actual, labels if w == stepped else None)
        if d is None:
            continue
        elsewhere = {_sig(e) for v in range(workers) if v != w for e in got.events_of(v, stepped)}
        owed = {_sig(e) for v in range(workers) if v != w for e in expected.get(v, [])}
        moved = [e for e in want if _sig(e) not in {_sig(a) for a in actual} and _sig(e) in elsewhere - owed]
        moved += [e for e in actual if _sig(e) not in {_sig(x) for x in want} and _sig(e) in owed]
        if moved:
            d = Divergence(RuleId.TIER_EVENTS, f"{d.what}: published by the wrong worker", d.expected, d.actual)
        return w, d
    return None


class ProcessChecker:
    """The reference process beside an implementation of several workers."""

    def __init__(
        self,
        impl: Implementation,
        config: ManagerConfig,
        workers: int,
        *,
        record: Callable[[str, int], None] | None = None,
    ) -> None:
        #: ``record(rule, n)``: counts the rules the model applied in each step (coverage)
        self.record = record
        self.impl = impl
        self.config = config
        self.workers = workers
        self.model = Process(config, workers)
        self.view = RouterView(shared_tiers=SHARED_TIERS, expect_dp_rank=config.dp_rank)
        self.ops: list[tuple[int, Operation]] = []

    def fail(self, d: Divergence, worker: int, op: Operation, where: str) -> ConformanceFailure:
        lines = format_ops([o for _w, o in self.ops])
        workers = " ".join(str(w) for w, _o in self.ops)
        return ConformanceFailure(
            d.rule,
            f"{where} (worker {worker}, {op.op})\n{lines}\nworkers of those operations: {workers}\n"
            f"first divergence: {d.describe()}",
            site=site_of(d.rule, config=self.config, op=op),
        )

    def step(self, worker: int, op: Operation, where: str) -> tuple[ProcessOutcome, ProcessStep | None]:
        """Step ``worker`` of both; raise ConformanceFailure at a difference
        the model's run names (the caller checks a golden's own expectations)."""
        self.ops.append((worker, op))
        got = self.impl.step_on(worker, op)
        try:
            want: ProcessStep | None = self.model.apply(worker, op)
        except InvalidOperation as e:
            want = None
            out = got.outcome
            if out.error is None or out.error.rule != str(e.rule):
                actual = "a result" if out.error is None else out.error.rule
                raise self.fail(
                    Divergence(e.rule, "the operation must be rejected", e.rule, actual), worker, op, where
                ) from None
        if want is not None and want.step.labels is not None and self.record is not None:
            for rule in dict.fromkeys(want.step.labels.rules):
                self.record(str(rule), 1)
        if want is not None:
            d = self._compare(worker, op, got, want)
            if d is not None:
                raise self.fail(d[1], d[0], op, where)
        self._apply_view(worker, got, op, where)
        return got, want

    def _compare(
        self, worker: int, op: Operation, got: ProcessOutcome, want: ProcessStep
    ) -> tuple[int, Divergence] | None:
        out: StepOutcome = got.outcome
        labels = want.step.labels
        if out.error is not None:
            return worker, Divergence(op_rule(op), "the operation was rejected", "a result", out.error.rule)
        assert out.result is not None
        me = self.model.workers[worker]
        d = result_divergence(want.step.result, out.result, op, labels)
        if d is not None:
            return worker, d
        expected = {w: want.events_of(w) for w in range(self.workers)}
        found = worker_events_divergence(expected, got, worker, self.workers, labels)
        if found is not None:
            return found
        d = counters_divergence(me.counters(), out.counters, labels)
        if d is not None:
            return worker, d
        if out.earliest_deadline_ms != me.earliest_deadline():
            d = deadline_divergence(me.earliest_deadline(), out.earliest_deadline_ms, labels)
            return worker, d
        return None

    def _apply_view(self, worker: int, got: ProcessOutcome, op: Operation, where: str) -> None:
        for w in range(self.workers):
            for ev in got.events_of(w, worker):
                bad = self.view.apply(ev, worker_id=w)
                if bad:
                    v = bad[0]
                    raise self.fail(
                        Divergence(v.rule, "the event stream", "a stream a router can follow", str(v)), w, op, where
                    )

    def shared_contents(self, tier: str) -> set[int]:
        """What the router view holds in shared ``tier``, over every worker."""
        return {h for w in range(self.workers) for h in self.view.stored(tier, worker_id=w)}


def run_process_scenario(s: ProcessScenario, impl: Implementation) -> None:
    """Run a several-worker golden through ``impl``; raise ConformanceFailure
    at the first difference from the file or from the model."""
    check = ProcessChecker(impl, s.config, s.workers)
    owner_events = s.config.offload is not None and s.config.offload.lower_tier_events == "owner"
    for i, step in enumerate(s.steps):
        exp = step.expect
        where = f"scenario {s.name!r} diverged at step {i}" + (f" ({step.note})" if step.note else "")
        got, want_step = check.step(step.worker, step.op, where)
        labels = want_step.step.labels if want_step is not None else None
        out = got.outcome

        def fail(
            d: Divergence, worker: int = step.worker, op: Operation = step.op, at: str = where
        ) -> ConformanceFailure:
            return check.fail(d, worker, op, at)

        if exp.error is not None:
            if out.error is None or out.error.rule != exp.error:
                actual = "a result" if out.error is None else out.error.rule
                raise fail(Divergence(exp.error, "rejected under the wrong rule", exp.error, actual))
            continue
        if out.result is None:
            raise fail(Divergence(op_rule(step.op), "the operation was rejected", "a result", out.error))
        has_result = "result" in exp.model_fields_set
        if has_result or exp.status is not None:
            want = OpResult(
                value=exp.result if has_result else out.result.value,
                status=exp.status if exp.status is not None else out.result.status,
            )
            d = result_divergence(want, out.result, step.op, None)
            if d is not None:
                raise fail(d)
        if exp.events is not None:
            expected = {int(k): v for k, v in exp.events.items()}
            found = worker_events_divergence(expected, got, step.worker, s.workers, None)
            if found is not None:
                raise fail(found[1], found[0])
        if "earliest_deadline_ms" in exp.model_fields_set and out.earliest_deadline_ms != exp.earliest_deadline_ms:
            raise fail(deadline_divergence(exp.earliest_deadline_ms, out.earliest_deadline_ms, labels))
        # what a router sees of the shared tiers: only when the tiers publish
        for tier, name, blocks in (("disk", "g3", exp.g3), ("external", "g4", exp.g4)):
            if owner_events and blocks is not None and check.shared_contents(tier) != set(blocks):
                rule = RuleId.TIER_EVICT if name == "g3" else RuleId.TIER_CASCADE
                got_blocks = sorted(check.shared_contents(tier))
                raise fail(
                    Divergence(rule, f"{name} as the router view sees it ({tier} events)", sorted(blocks), got_blocks)
                )
