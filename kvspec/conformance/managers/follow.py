"""Following a declared deviation of a paged or session manager.

The allocator-level counterpart of ``kvspec.conformance.block.follow``
(spec/SPEC.md, "Declared deviations are followed"): at the step where the
lockstep sees the implementation differ, each *follow mode* the model names
(``FOLLOW``: a named condition of ``kvspec.spec.deviations.CONDITIONS``, the
rule its departure breaks and the model's switch that runs it) runs the step
again from the model's copy before it with the switch on. A mode is taken
only when the implementation's whole answer then checks clean against the
model's (the same check every step gets: value, error, sequences, contents,
sharing, reference counts, free blocks, pressure; admissions, slots, idle
order, pending snapshots): the condition is established, never inferred, and
the model after it is the implementation's state. A bug in the same step
makes every mode miss, so it is reported under its own rule.

Nothing here decides whether a deviation covers the step: the lockstep
matches the ``Site`` against the manifest.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference.paged import PagedModel
from kvspec.reference.session import SessionModel
from kvspec.spec.manager_wire import ManagerOp, PagedOutcome, SessionOutcome
from kvspec.spec.rules import RuleId

ManagerModel = PagedModel | SessionModel
Outcome = PagedOutcome | SessionOutcome
#: the lockstep's check of one step: (op, implementation's outcome, model's outcome, model before) -> raises
Check = Callable[[ManagerOp, Outcome, Outcome, ManagerModel], None]


@dataclass(slots=True)
class ManagerFollowed:
    """A way to run the step that gives the implementation's answer: the
    model after it, its outcome, the rule the departure breaks, the named
    condition it establishes and the model's switch of that mode."""

    model: ManagerModel
    outcome: Outcome
    rule: RuleId
    condition: str
    switch: str


def follow_modes(model: ManagerModel) -> dict[str, tuple[RuleId, str]]:
    """The model's follow modes: condition -> (rule, switch attribute)."""
    modes: dict[str, tuple[RuleId, str]] = getattr(model, "FOLLOW", {})
    return modes


def model_step(model: ManagerModel, op: ManagerOp) -> Outcome:
    """``model``'s answer to ``op`` (the lockstep sends each model only its own profile's operations)."""
    return model.step(op)  # type: ignore[arg-type]


def candidates(before: ManagerModel, op: ManagerOp, got: Outcome, check: Check) -> Iterator[ManagerFollowed]:
    """The follow modes under which ``op``, run from ``before`` (left
    untouched), gives ``got`` exactly as ``check`` judges it."""
    for condition, (rule, switch) in follow_modes(before).items():
        alt = copy.deepcopy(before)
        setattr(alt, switch, True)
        try:
            want = model_step(alt, op)
        finally:
            setattr(alt, switch, False)
        try:
            check(op, got, want, before)
        except ConformanceFailure:
            continue
        yield ManagerFollowed(alt, want, rule, condition, switch)


__all__ = ["Check", "ManagerFollowed", "ManagerModel", "Outcome", "candidates", "follow_modes", "model_step"]
