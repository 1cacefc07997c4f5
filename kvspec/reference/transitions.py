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
``tests/test_toy_profile.py`` are written this way.

Block operations (``BlockModel``). An operation of a block-level model
(kvbm, atomic) touches several blocks: a Use places each of its blocks, a
Deref releases each one, an eviction picks each victim. So the model has an
operation table (``OPERATIONS``: which effect runs an operation, and the
rule its result answers to when no block decides it) and per-block tables:
for each block of the operation, ``take(table, block)`` fires the first
transition of ``table`` whose guard holds. The step's rules are the rules of
every transition taken, in the order taken (a rule applied to three blocks
is named three times), so a checker blames the first applied rule that moves
what differs.

Event labels follow from rules, not the other way round. An event names
blocks some transition decided (a Use's Stored names the blocks USE-NEW
placed; a device Removed names the victims EVICT-POLICY chose), so the
checkers' reading of the event (``labels.EventLabel``: the rule that it is
published at all, which blocks it names, its parent, its tokens, which
victims) is a property of that transition (``Transition.publishes``) and the
model publishes an event with ``publish(event, transition)``: the label is
the transition's, never typed at the call. A transition whose rule decides
the step's result (a Use stopped by an offload answers to OFFLOAD-BLOCKS-USE,
not to the operation's rule) says so (``Transition.result``); an operation
under which an unexpected event of some kind breaks a given rule says so
(``BlockOperation.silent``). An effect may take a further table (a placed
block's slot may evict: EVICT-POLICY); the rules of a transition are
applied before its effect, so they come before the rules of the tables its
effect takes. A variant of the model (the mutant zoos') overrides a helper
that takes a table (``_hit``, ``_evict``) or an effect, and keeps the tables.

The G1 model of the ``kvbm`` and ``atomic`` profiles (``reference.g1``), the
``legacy`` model (``reference.legacy``) and the ``vllm`` pool
(``reference.vllm_pool``) are block models. The lower tiers
(``reference.lower_tiers``), shared by the workers of a process, are
``Tables`` whose rules go to the step of the worker they serve.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Generic, TypeVar

from kvspec.reference.labels import EventLabel, StepLabels, default_label
from kvspec.spec.rules import RuleId, RuleName, rid
from kvspec.spec.wire import KvEvent

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
    #: block models: the label of the events that name the blocks this transition decided (the
    #: checkers' reading of each aspect of such an event); None: its blocks are in no event
    publishes: EventLabel | None = None
    #: block models: the step's result answers to this rule (not to the operation's own rule)
    result: bool = False
    #: block models: the block it decides is one more physical copy of a resident hash (vllm), so
    #: an event names it as such (``EventLabel.copies``; ``BlockModel.publish_blocks``)
    copy: bool = False

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


@dataclass(frozen=True, slots=True)
class BlockOperation:
    """One operation of a block model: the effect that walks its blocks through the per-block tables."""

    #: the operation class (or classes)
    op: type | tuple[type, ...]
    #: the name of a model method (or a function of (model, op, *args)) applying the operation
    effect: Callable[..., Any] | str
    #: the rule the operation's result answers to when no transition of its blocks decides it
    rule: RuleName
    #: (storage tier, event kind, rule): under this operation an event of that kind that the model
    #: did not publish breaks the rule
    silent: tuple[tuple[str, str, RuleName], ...] = ()


class Tables:
    """Fires per-block transitions: ``take(table, block)``. Where the rules go is the subclass's
    (``BlockModel``: the step's labels; the lower tiers: the step of the worker they serve)."""

    def _apply_rules(self, t: Transition[Any, Any]) -> None:
        raise NotImplementedError

    def which(self, table: Sequence[Transition[Any, Any]], item: Any) -> Transition[Any, Any]:
        """The first transition of ``table`` for ``item`` whose guard holds (nothing fired)."""
        for t in table:
            if isinstance(item, t.op) and self._holds(t.guard, item):
                return t
        raise NoTransition(f"{type(self).__name__}: no transition applies to {item!r}")

    def take(self, table: Sequence[Transition[Any, Any]], item: Any) -> Any:
        """Fire the first transition of ``table`` whose guard holds for ``item``: its rules are
        applied (in order, before its effect's own transitions), its effect's result returned."""
        return self.taken(table, item)[1]

    def taken(self, table: Sequence[Transition[Any, Any]], item: Any) -> tuple[Transition[Any, Any], Any]:
        """``take``, and which transition it fired (to publish the block's event with its label)."""
        t = self.which(table, item)
        self._apply_rules(t)
        f = t.effect
        return t, (getattr(self, f)(item) if isinstance(f, str) else f(self, item))

    def _holds(self, guard: Callable[[Any, Any], bool] | str, item: Any) -> bool:
        return bool(getattr(self, guard)(item) if isinstance(guard, str) else guard(self, item))


def merged_label(decided: Sequence[tuple[Transition[Any, Any], int]]) -> EventLabel:
    """The label of an event naming the blocks ``decided`` (transition, hash): the copies are the
    hashes a copy transition decided; the label is the copy transition's when every hash is one
    of those, else the first other transition's (``BlockModel.publish_blocks``)."""
    copies = frozenset(h for t, h in decided if t.copy)
    lead = next((t for t, h in decided if not t.copy), None)
    if lead is None or (copies and {h for _t, h in decided} <= copies):
        lead = next(t for t, _h in decided if t.copy)
    assert lead.publishes is not None, f"{lead.rule} publishes no event"
    return replace(lead.publishes, copies=copies)


class BlockModel(Tables):
    """The base of a block model: per operation an effect, per block the first applicable transition.

    ``apply`` finds the operation's entry in ``OPERATIONS`` and runs its effect; the effect calls
    ``take(TABLE, block)`` for each block it touches and ``publish(event, transition)`` for each
    event. ``step_labels`` are what the step fired (``labels.StepLabels``, read by the block
    checkers)."""

    OPERATIONS: ClassVar[Sequence[BlockOperation]] = ()
    #: every per-block table of the model (``rules``, ``check_tables``)
    TABLES: ClassVar[Sequence[Sequence[Transition[Any, Any]]]] = ()

    _fired: list[RuleId]
    _published: dict[int, EventLabel]
    _result_rule: RuleId | None
    _silent: dict[tuple[str, str], RuleId]

    def begin_step(self) -> None:
        """Forget what the previous step fired."""
        self._fired = []
        self._published = {}
        self._result_rule = None
        self._silent = {}

    def run_operation(self, op: Any, *args: Any) -> Any:
        """The effect of ``op``'s entry in ``OPERATIONS`` (extra ``args`` passed on)."""
        for entry in self.OPERATIONS:
            if isinstance(op, entry.op):
                for tier, kind, rule in entry.silent:
                    self._silent[(tier, kind)] = rid(rule)
                f = entry.effect
                return getattr(self, f)(op, *args) if isinstance(f, str) else f(self, op, *args)
        raise NoTransition(f"{type(self).__name__}: no operation entry for {type(op).__name__}")

    def _apply_rules(self, t: Transition[Any, Any]) -> None:
        fired = self._fired
        for r in t.rules:
            fired.append(_BY_NAME[r])
        if t.result:
            self._result_rule = _BY_NAME[t.rule]

    def publish(self, ev: KvEvent, by: Transition[Any, Any]) -> KvEvent:
        """Publish ``ev``, which names blocks the transition ``by`` decided: its label is ``by``'s."""
        assert by.publishes is not None, f"{by.rule} publishes no event"
        self._published[ev.event_id] = by.publishes
        return ev

    def publish_blocks(self, ev: KvEvent, decided: Sequence[tuple[Transition[Any, Any], int]]) -> KvEvent:
        """Publish ``ev``, which names the blocks ``decided`` (transition, hash), in order. Their
        transitions agree on the label but for copies (``Transition.copy``): the event names as
        copies the hashes a copy transition decided (``EventLabel.copies``), and is published
        under the copy transition's rule only when every hash it names is one of those (else under
        its first other block's)."""
        self._published[ev.event_id] = merged_label(decided)
        return ev

    def applied(self, rule: str) -> None:
        """A rule applied by a part of the model that keeps no table of its own (the lower tiers,
        ``reference.lower_tiers``)."""
        self._fired.append(_BY_NAME[rule])

    def step_labels(self, events: list[KvEvent]) -> StepLabels:
        """What the step that published ``events`` fired (an event this model did not publish gets
        its kind's default label)."""
        got = self._published
        return StepLabels(
            list(self._fired),
            [got.get(e.event_id) or default_label(e.storage_tier, e.kind) for e in events],
            self._result_rule,
            dict(self._silent),
        )

    @classmethod
    def rules(cls) -> tuple[str, ...]:
        """Every rule of the per-block tables, in table order, each once."""
        return tuple(dict.fromkeys(r for table in cls.TABLES for t in table for r in t.rules))

    @classmethod
    def named_rules(cls) -> frozenset[str]:
        """Every rule the model names: its transitions' rules, the rules of the labels of the
        events they publish, and its operations' result and silent rules."""
        out = set(cls.rules())
        for table in cls.TABLES:
            for t in table:
                lab = t.publishes
                if lab is not None:
                    out.update(str(r) for r in (lab.published, lab.blocks, lab.parent, lab.tokens, lab.choice) if r)
        for e in cls.OPERATIONS:
            out.add(e.rule)
            out.update(rule for _tier, _kind, rule in e.silent)
        return frozenset(out)

    @classmethod
    def check_tables(cls) -> None:
        """Every guard and effect named by a string is a method of the model."""
        named = [e.effect for e in cls.OPERATIONS] + [f for tb in cls.TABLES for t in tb for f in (t.guard, t.effect)]
        missing = [f for f in named if isinstance(f, str) and not hasattr(cls, f)]
        if missing:
            raise NoTransition(f"{cls.__name__}: the tables name methods it does not have: {', '.join(missing)}")


_BY_NAME: dict[str, RuleId] = {r.value: r for r in RuleId}

__all__ = [
    "BlockModel",
    "BlockOperation",
    "NoTransition",
    "Tables",
    "Transition",
    "TransitionModel",
    "always",
    "merged_label",
]
