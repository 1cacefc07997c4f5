"""The rules behind a model step: which rule of spec/SPEC.md produced each
effect and each event.

A checker that finds a difference between an implementation and the model
should not have to guess which rule it breaks from the shape of the
difference: the model knows which rule it applied. The block models (G1:
kvbm, atomic; legacy; vllm; the lower tiers) are written as transition
tables (``reference.transitions.BlockModel``: per block of an operation the
first transition whose guard holds), and a step's labels (``StepLabels``)
are what its transitions say:

- ``rules``: the rules of the transitions taken, in order; a counter that
  differs is attributed to the first applied rule that moves it (``MOVES``),
  COUNTERS when none does.
- ``events``: per event, the label (``EventLabel``) of the transition that
  decided its blocks (``Transition.publishes``): per aspect of the event,
  the rule that decides it (that it is published at all, which blocks it
  names, which victims among those the policy allowed, its parent, its
  tokens hashes, which of its blocks are extra physical copies).
- ``result``: the rule behind the result, when a transition decides it
  (``Transition.result``) rather than the operation's own rule.
- ``silent``: per (tier, kind), the rule an operation breaks by publishing an
  event of that kind that it was not due to publish
  (``BlockOperation.silent``; default: ``default_label(...).published``).

The models of the small-operation profiles (paged, session, radix) are
transition tables per operation (``TransitionModel``); their checkers
attribute a difference by what differs.

Rules are written as text (``RuleName``): ``grep RULE-ID kvspec/reference``
finds the place, and mypy checks the spelling. ``tests/test_rule_map.py``
keeps the map complete: every rule has a labelled place and tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvspec.spec.rules import RuleId, RuleName, rid
from kvspec.spec.wire import KvEvent


@dataclass(frozen=True, slots=True)
class EventLabel:
    """The rules behind one event, aspect by aspect."""

    #: that the event is published in this operation (a missing one breaks it)
    published: RuleId
    #: which blocks it names
    blocks: RuleId
    #: Stored: its parent_hash
    parent: RuleId | None = None
    #: Stored: its blocks' tokens_hash
    tokens: RuleId | None = None
    #: Removed: which victims, among the blocks the policy allowed
    choice: RuleId | None = None
    #: hashes it names as one more physical copy of a resident hash (vllm)
    copies: frozenset[int] = frozenset()


def label(
    published: RuleName,
    blocks: RuleName | None = None,
    *,
    parent: RuleName | None = None,
    tokens: RuleName | None = None,
    choice: RuleName | None = None,
    copies: frozenset[int] = frozenset(),
) -> EventLabel:
    """An event's label written with rule names (``blocks`` defaults to ``published``)."""
    return EventLabel(
        rid(published),
        rid(blocks or published),
        rid(parent) if parent else None,
        rid(tokens) if tokens else None,
        rid(choice) if choice else None,
        copies,
    )


#: what an event the model made without a label stands for (a mutant's, say)
_DEFAULTS: dict[tuple[str, str], EventLabel] = {
    ("device", "stored"): label("STORE-NEW-ONLY", parent="PARENT-ANCHOR", tokens="STORE-TOKENS-HASH"),
    ("device", "removed"): label("REMOVE-EXACT", choice="EVICT-POLICY"),
    ("host_pinned", "stored"): label(
        "G2-STORE-ON-COMPLETE", parent="G2-STORE-ON-COMPLETE", tokens="G2-STORE-ON-COMPLETE"
    ),
    ("host_pinned", "removed"): label("G2-EVICT", choice="G2-EVICT"),
    # the lower tiers' events (lower_tier_events = "owner")
    ("disk", "stored"): label("TIER-EVENTS", parent="TIER-EVENTS", tokens="TIER-EVENTS"),
    ("disk", "removed"): label("TIER-EVENTS", choice="TIER-EVICT"),
    ("external", "stored"): label("TIER-EVENTS", parent="TIER-EVENTS", tokens="TIER-EVENTS"),
}
_CLEARED = label("CLEAR-ALL")


def default_label(tier: str, kind: str) -> EventLabel:
    """The label of an unlabelled event of this tier and kind."""
    return _DEFAULTS.get((tier, kind), _CLEARED)


#: the counters each rule moves (Counters field names)
_MOVES: dict[RuleName, str] = {
    "USE-HIT-ACTIVE": "active_refs",
    "USE-HIT-INACTIVE": "active_blocks active_refs inactive_blocks",
    "USE-NEW": "active_blocks active_refs free_blocks",
    "USE-PARTIAL": "active_blocks active_refs free_blocks",
    "EVICT-POLICY": "inactive_blocks free_blocks",
    "QUARANTINE-HOLD": "quarantined_blocks active_blocks",
    "QUARANTINE-RELEASE": "quarantined_blocks active_blocks free_blocks",
    "DEREF-OWNER": "active_blocks active_refs inactive_blocks",
    "DEREF-PARTIAL": "active_blocks active_refs free_blocks inactive_blocks",
    "DESTROY-ACTIVE": "active_blocks active_refs free_blocks",
    "PROMOTE-NEW": "active_blocks",
    "PROMOTE-EXISTING": "active_blocks active_refs free_blocks inactive_blocks",
    "SWAPIN-RESERVE": "active_blocks free_blocks",
    "SWAPIN-SKIP-PRESENT": "active_blocks free_blocks",
    "SWAPIN-ANCHOR": "active_blocks inactive_blocks",
    "CLEAR-ALL": "inactive_blocks free_blocks",
    "VLLM-PREFIX-HIT": "active_blocks active_refs inactive_blocks",
    "VLLM-FREE-ORDER": "active_blocks active_refs inactive_blocks",
    "VLLM-LAZY-REMOVE": "inactive_blocks free_blocks",
}
MOVES: dict[RuleId, frozenset[str]] = {rid(k): frozenset(v.split()) for k, v in _MOVES.items()}


@dataclass(slots=True)
class StepLabels:
    """The rules behind one step (see the module docstring)."""

    #: every rule applied, in order
    rules: list[RuleId] = field(default_factory=list)
    #: one per event of the step, in order
    events: list[EventLabel] = field(default_factory=list)
    #: the rule behind the result (None: the operation's own rule)
    result: RuleId | None = None
    #: (tier, kind) -> the rule an unexpected event of that kind breaks
    silent: dict[tuple[str, str], RuleId] = field(default_factory=dict)

    def unexpected(self, ev: KvEvent) -> RuleId:
        """The rule broken by publishing ``ev`` where the model published nothing like it."""
        key = (ev.storage_tier, ev.kind)
        return self.silent.get(key) or default_label(*key).published

    def counter(self, name: str) -> RuleId | None:
        """The first applied rule that moves the counter ``name``."""
        return next((r for r in self.rules if name in MOVES.get(r, ())), None)

    def counters_rule(self, names: Iterable[str]) -> RuleId:
        """The rule behind differing counters ``names`` (looked at in order):
        the first applied rule that moves one of them, else the conservation
        rule that ties them together."""
        found = (r for r in map(self.counter, names) if r is not None)
        return next(found, rid("COUNTERS"))
