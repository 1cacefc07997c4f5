"""In-process adapter over the reference model.

It is the first implementation the suite runs against, and the base that the
JSON-lines server, the mutants and the replay tool reuse: a rejected
operation comes back as a typed error with its rule id, never as an exception.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.api import Implementation, Manifest, Model, Process, make_model
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError, InvalidOperation
from kvspec.spec.wire import ErrorInfo, Operation, ProcessOutcome, StepOutcome, WorkerEvents


def outcome_of(model: Model, op: Operation) -> StepOutcome:
    """Apply ``op`` to ``model`` and package the outcome as the wire reports it."""
    try:
        step = model.apply(op)
    except InvalidOperation as e:
        return StepOutcome(
            error=ErrorInfo(rule=str(e.rule), message=e.message),
            counters=model.counters(),
            events=[],
            earliest_deadline_ms=model.earliest_deadline(),
        )
    return StepOutcome.model_construct(
        result=step.result,
        error=None,
        counters=model.counters(),
        events=step.events,
        earliest_deadline_ms=model.earliest_deadline(),
    )


def process_outcome_of(process: Process, worker: int, op: Operation) -> ProcessOutcome:
    """Apply ``op`` to ``worker`` of ``process`` and package it as a version-5 reply carries it."""
    if not 0 <= worker < len(process.workers):
        raise ConfigError(f"worker {worker} is not one of the process's {len(process.workers)} workers")
    me = process.workers[worker]
    try:
        out = process.apply(worker, op)
    except InvalidOperation as e:
        error = ErrorInfo(rule=str(e.rule), message=e.message)
        return ProcessOutcome(
            outcome=StepOutcome(
                error=error, counters=me.counters(), events=[], earliest_deadline_ms=me.earliest_deadline()
            )
        )
    outcome = StepOutcome.model_construct(
        result=out.step.result,
        error=None,
        counters=me.counters(),
        events=out.step.events,
        earliest_deadline_ms=me.earliest_deadline(),
    )
    others = [WorkerEvents(worker=w, events=evs) for w, evs in sorted(out.others.items()) if evs]
    return ProcessOutcome.model_construct(outcome=outcome, others=others)


class ReferenceImplementation(Implementation):
    def __init__(self, config: ManagerConfig, manifest: Manifest, workers: int = 1) -> None:
        self.config = config
        self.manifest = manifest
        self.workers = workers
        #: several workers: one ``Process`` sharing G3/G4; one: the profile's model
        self.process = Process(config, workers) if workers > 1 else None
        self.model = self.process.workers[0] if self.process is not None else make_model(config)

    def step(self, op: Operation) -> StepOutcome:
        if self.process is not None:
            return self.step_on(0, op).outcome
        return outcome_of(self.model, op)

    def step_on(self, worker: int, op: Operation) -> ProcessOutcome:
        if self.process is None:
            return super().step_on(worker, op)
        return process_outcome_of(self.process, worker, op)


def open_reference(
    config: ManagerConfig, manifest: Manifest, adapter_dir: Path, workers: int = 1
) -> ReferenceImplementation:
    return ReferenceImplementation(config, manifest, workers)
