"""Rules as transitions: per operation, rule -> guard -> effect.

The way a model tags its rules that the z3 transitions and h11's
``_state.py`` use: a model is a table of transitions, each one rule of the
spec, the operation it handles, the guard under which it applies and its
effect. ``step`` takes the first transition of the operation whose guard
holds, so the rule of every step is the rule of the transition taken (no
``trace.did`` to forget, no method label to keep next to the right branch),
and the table itself is the list of the model's rules, in the order they
are tried.

A guard reads the state and never changes it; an effect changes the state
and returns the step's outcome. A rejection is a transition too (its rule is
the rule that refuses the operation, its effect returns the error outcome
and changes nothing), so a rejected operation leaves the model as it was.

A guard or an effect is a function of (model, operation), or the name of a
method of the model taking the operation: named, it is looked up on the
instance, so a variant of the model (the mutant zoos') overrides the one
method it breaks and keeps the table.

``TransitionModel`` is the base of a model written this way; it satisfies
``spec.model.TaggedModel`` (the one model protocol, plus the rules behind
the last step), which ``conformance.generic`` needs to name the rule a
difference breaks. The models of the ``session``, ``paged`` and ``radix``
profiles (``reference.session``, ``reference.paged``, ``reference.radix``
and its scheduler-flow variant) and the toy profile of
``tests/test_toy_profile.py`` are written this way. The block-level models
(kvbm, legacy, vllm) still name their rules inline (``reference.labels``:
``trace.did``), per block within an operation, with event labels the block
checkers read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

S = TypeVar("S")
Out = TypeVar("Out")


@dataclass(frozen=True, slots=True)
class Transition(Generic[S, Out]):
    """One rule of one operation: when ``guard(state, op)`` holds, ``effect(state, op)`` is the step."""

    #: the rule id (a heading of the profile's spec document)
    rule: str
    #: the operation class (or classes) it handles
    op: type | tuple[type, ...]
    #: a function of (model, op), or the name of a model method taking op
    guard: Callable[[S, Any], bool] | str
    effect: Callable[[S, Any], Out] | str
    #: the further rules its effect applies, after the deciding ``rule`` (a z3 step's
    #: ``rules`` tuple: an allocation also keeps the pool's conservation, say)
    also: tuple[str, ...] = ()

    @property
    def rules(self) -> tuple[str, ...]:
        """The rules of a step that takes this transition, the deciding one first."""
        return (self.rule, *self.also)


def always(state: object, op: object) -> bool:
    """The guard of an operation's last transition (what applies when nothing before it did)."""
    return True


class NoTransition(LookupError):
    """No transition of the table applies: the table is incomplete for this operation."""


class TransitionModel(Generic[Out]):
    """A model whose ``step`` fires the first applicable transition of ``TRANSITIONS``.

    Subclasses set ``TRANSITIONS`` (a class attribute) and ``config``;
    ``last_rules`` names the rules of the last step, the deciding one first
    (``spec.model.TaggedModel``)."""

    TRANSITIONS: ClassVar[Sequence[Transition[Any, Any]]] = ()
    config: Any
    last_rules: tuple[str, ...] = ()

    def step(self, op: Any) -> Out:
        out: Out = self.fire(op)
        return out

    def fire(self, op: Any) -> Any:
        """Take the first transition of ``op`` whose guard holds: its effect's result. A model whose
        effects return a value rather than the whole answer overrides ``step`` to wrap it (the paged
        and radix models add the state after the step)."""
        for t in self.TRANSITIONS:
            if isinstance(op, t.op) and self._call(t.guard, op):
                self.last_rules = t.rules
                return self._call(t.effect, op)
        raise NoTransition(f"{type(self).__name__}: no transition applies to {op!r}")

    def _call(self, f: Callable[[Any, Any], Any] | str, op: Any) -> Any:
        return getattr(self, f)(op) if isinstance(f, str) else f(self, op)

    @classmethod
    def rules(cls) -> tuple[str, ...]:
        """Every rule the model applies, in table order, each once."""
        return tuple(dict.fromkeys(r for t in cls.TRANSITIONS for r in t.rules))

    @classmethod
    def rules_of(cls, op: type) -> tuple[str, ...]:
        """The rules of one operation class, in the order they are tried."""
        return tuple(dict.fromkeys(r for t in cls.TRANSITIONS if issubclass(op, t.op) for r in t.rules))

    @classmethod
    def check_table(cls) -> None:
        """Every guard and effect named by a string is a method of the model (a typo fails here,
        not at the first operation that reaches it)."""
        missing = [
            f for t in cls.TRANSITIONS for f in (t.guard, t.effect) if isinstance(f, str) and not hasattr(cls, f)
        ]
        if missing:
            raise NoTransition(f"{cls.__name__}: the table names methods it does not have: {', '.join(missing)}")


__all__ = ["NoTransition", "Transition", "TransitionModel", "always"]
