"""The one protocol every profile's reference model satisfies.

Whatever its family, a reference model is built from its profile's config
and answers one operation at a time: ``step(op)`` applies the operation and
returns what the implementation under test must answer (a block model's
``Step``: result, events and the rules behind them; an allocator-level or
radix model's outcome with its state snapshot; an outside profile's own
outcome). A rejected operation leaves the model exactly as it was.

The registry (``spec.registry``) types its model factories with this
protocol, so a profile declared anywhere, in kvspec or outside it (the toy
profile of ``tests/test_toy_profile.py``), is driven the same way; the
families' checkers use their own richer views on top (the block lockstep's
``reference.outcome.Model`` adds counters, tiers and ``prefer``).

It lives in the spec layer, which imports nothing above it: the registry may
name the protocol without importing a single model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

OpT = TypeVar("OpT", contravariant=True)
OutcomeT = TypeVar("OutcomeT", covariant=True)


@runtime_checkable
class ProfileModel(Protocol[OpT, OutcomeT]):
    """A profile's reference model: pure, deterministic, no I/O (module doc)."""

    #: the profile configuration it was built from
    config: Any

    def step(self, op: OpT) -> OutcomeT:
        """Apply ``op``; what the implementation must answer to it."""
        ...


@runtime_checkable
class TaggedModel(ProfileModel[OpT, OutcomeT], Protocol[OpT, OutcomeT]):
    """A model that names the rules behind each step (``reference.transitions``
    builds them): a checker that finds a difference blames the first of them."""

    #: the rules the last ``step`` applied, the deciding one first
    last_rules: tuple[str, ...]


#: what a registry entry's model names: a callable from the profile's config to its model
ModelFactory = Callable[[Any], ProfileModel[Any, Any]]

__all__ = ["ModelFactory", "ProfileModel", "TaggedModel"]
