"""The lockstep and the goldens of any profile: model and implementation, one operation at a time.

A profile of the ``generic`` family (``spec.registry``) needs no checker of
its own: its reference model (``spec.model.TaggedModel``: ``step(op)`` and
the rules behind the step) and the implementation under test (anything with
``step(op) -> outcome``) answer each operation, and the two outcomes must be
equal, whole. A difference breaks the rule of the model's step, the first of
its ``last_rules``: a model written as a transition table
(``reference.transitions``) names it by the transition it took.

``GenericLockstep`` counts the rules each step exercised (``exercised``),
which is how a run shows that it asked the implementation about a rule at
all. ``run_golden`` reads a golden scenario of the profile (the format of
the allocator-level goldens: ``name``, ``rules``, ``config``, ``steps`` of
``op`` and ``expect``) with the types the registry entry names, holds every
step to its hand-written ``expect`` and, in lockstep, to the model.

This module imports the spec layer only; the model comes through the
registry entry's factory.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from kvspec.spec.model import TaggedModel
from kvspec.spec.registry import ProfileEntry
from kvspec.spec.rules import known


class RuleBroken(AssertionError):
    """The implementation broke rule ``rule`` (an id of the catalogue or of an
    outside profile's spec document); ``str()`` is ``[RULE] report``."""

    def __init__(self, rule: str, report: str) -> None:
        super().__init__(f"[{rule}] {report}")
        self.rule = rule
        self.report = report


class GoldenError(ValueError):
    """A golden scenario file that cannot be read as its profile's (names the file and what is wrong)."""


def _resolve(ref: Any) -> Any:
    """A type given as itself or as ``module:attr``."""
    if isinstance(ref, str):
        module, _, attr = ref.partition(":")
        return getattr(import_module(module), attr)
    return ref


def make_tagged_model(entry: ProfileEntry, config: Any) -> TaggedModel[Any, Any]:
    """The profile's model for ``config``; refused when it does not name the rules of its steps."""
    model = entry.resolve_model()(config)
    if not isinstance(model, TaggedModel):
        raise TypeError(
            f"profile {entry.name!r}: its model {type(model).__name__} has no last_rules, so a difference "
            "could not be named by the rule it breaks (spec.model.TaggedModel)"
        )
    return model


@dataclass
class GenericLockstep:
    """One implementation and its profile's model, driven together (module doc)."""

    #: the implementation under test: anything with ``step(op) -> outcome``
    impl: Any
    model: TaggedModel[Any, Any]
    #: how often each rule was exercised by a step both sides agreed on
    exercised: Counter[str] = field(default_factory=Counter)
    log: list[str] = field(default_factory=list)

    def step(self, op: Any) -> Any:
        """Send ``op`` to both; the implementation's outcome, or ``RuleBroken`` naming the rule."""
        got = self.impl.step(op)
        self.log.append(repr(op))
        want = self.model.step(op)
        rules = self.model.last_rules
        unknown = [r for r in rules if not known(r)]
        if not rules or unknown:
            raise ValueError(
                f"{type(self.model).__name__} stepped {op!r} under {list(rules) or 'no rule'}: every step of a model "
                "names rules of the catalogue or of its profile's registered spec document"
            )
        if got != want:
            raise RuleBroken(rules[0], self._report(op, got, want))
        self.exercised.update(rules)
        return got

    def _report(self, op: Any, got: Any, want: Any) -> str:
        trail = "\n".join(f"  {i + 1:>3}. {line}" for i, line in enumerate(self.log[-40:]))
        return (
            f"step {len(self.log)}: {op!r}\n  implementation: {got!r}\n  model:          {want!r}\noperations:\n{trail}"
        )


@dataclass(frozen=True, slots=True)
class GenericGolden:
    """A golden scenario of a generic profile, read with the profile's types."""

    name: str
    rules: tuple[str, ...]
    config: Any
    steps: tuple[tuple[Any, Any], ...]


def load_golden(entry: ProfileEntry, path: Path) -> GenericGolden:
    """Read ``path`` as a golden of ``entry`` (GoldenError naming the file and the fault)."""
    try:
        raw = json.loads(path.read_text())
        config = TypeAdapter(_resolve(entry.config_type)).validate_python(raw["config"])
        op_t, out_t = TypeAdapter(_resolve(entry.op_type)), TypeAdapter(_resolve(entry.outcome_type))
        steps = tuple((op_t.validate_python(s["op"]), out_t.validate_python(s["expect"])) for s in raw["steps"])
        rules = tuple(str(r) for r in raw["rules"])
    except (OSError, ValueError, KeyError, TypeError, ValidationError) as e:
        raise GoldenError(f"{path}: not a golden of profile {entry.name!r}: {e}") from None
    unknown = [r for r in rules if not known(r)]
    if unknown:
        raise GoldenError(f"{path}: names unknown rules {', '.join(unknown)}")
    return GenericGolden(str(raw.get("name", path.stem)), rules, config, steps)


def goldens(entry: ProfileEntry) -> list[Path]:
    """Every golden file of the profile, sorted, from its registered folders."""
    return sorted(p for d in entry.scenario_folders() for p in d.glob("*.json"))


def run_golden(entry: ProfileEntry, path: Path, open_impl: Callable[[Any], Any]) -> GenericLockstep:
    """Every step of the golden against its ``expect`` and, in lockstep, the model;
    ``open_impl(config)`` starts the implementation. The lockstep is returned (its
    ``exercised`` rules); a failure is ``RuleBroken`` naming the golden and the step."""
    golden = load_golden(entry, path)
    ls = GenericLockstep(open_impl(golden.config), make_tagged_model(entry, golden.config))
    for i, (op, expect) in enumerate(golden.steps):
        try:
            got = ls.step(op)
        except RuleBroken as e:
            raise RuleBroken(e.rule, f"{entry.name}/{golden.name} step {i + 1}: {e.report}") from None
        if got != expect:
            rule = ls.model.last_rules[0]
            raise RuleBroken(
                rule, f"{entry.name}/{golden.name} step {i + 1}: {op!r}\n  got:      {got!r}\n  expected: {expect!r}"
            )
    return ls


__all__ = [
    "GenericGolden",
    "GenericLockstep",
    "GoldenError",
    "RuleBroken",
    "goldens",
    "load_golden",
    "make_tagged_model",
    "run_golden",
]
