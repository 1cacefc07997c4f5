"""In-process adapter over the reference model.

It is the first implementation the suite runs against, and the base that the
JSON-lines server, the mutants and the replay tool reuse: a rejected
operation comes back as a typed error with its rule id, never as an exception.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.api import Implementation, Manifest, Model, make_model
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.wire import ErrorInfo, Operation, StepOutcome


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


class ReferenceImplementation(Implementation):
    def __init__(self, config: ManagerConfig, manifest: Manifest) -> None:
        self.config = config
        self.manifest = manifest
        self.model = make_model(config)

    def step(self, op: Operation) -> StepOutcome:
        return outcome_of(self.model, op)


def open_reference(config: ManagerConfig, manifest: Manifest, adapter_dir: Path) -> ReferenceImplementation:
    return ReferenceImplementation(config, manifest)
