"""Evaluating the named conditions of scoped deviations at a failure.

``kvspec.spec.deviations.CONDITIONS`` names and documents the conditions a
manifest may scope a deviation by; this module is where the block-level
checkers (goldens, lockstep) establish which hold for a failure. The
request-level checker establishes its own (``request_check``: the
departures it can follow are exactly the conditions ``event_ids_from_1``,
``copy_store_unannounced``, ``copy_remove_unreported``,
``host_batch_hash_order``, ``full_prompt_hit`` and ``host_write_missing``),
so a condition is only ever claimed where the checker verified it, never
inferred from the rule id alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kvspec.spec.config import ManagerConfig
from kvspec.spec.deviations import Site
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Operation, event_to_json


def context_conditions(config: ManagerConfig) -> set[str]:
    """Conditions that hold for every failure of a run with ``config``."""
    return {"host_tier"} if config.offload is not None else set()


def _key(ev: KvEvent) -> str:
    data = event_to_json(ev)
    data.pop("event_id", None)
    return repr(sorted(data.items()))


def step_conditions(
    rule: RuleId, expected: Sequence[KvEvent], actual: Sequence[KvEvent], *, first_events: bool
) -> set[str]:
    """Conditions established from one step's events.

    - ``host_tier_event``: every event only one side published is on the
      host_pinned tier (and there is at least one);
    - ``event_ids_from_1`` (EVENT-ID only): the events are equal but for
      their ids, each actual id is the expected one plus 1, and these are
      the first events of the run (``first_events``): the implementation
      counts from 1. Later steps are compared with the ids adopted, so a
      further EVENT-ID failure is a different departure.
    """
    out: set[str] = set()
    diff = Counter(map(_key, expected))
    diff.subtract(Counter(map(_key, actual)))
    odd = {k for k, n in diff.items() if n != 0}
    if odd:
        tiers = {ev.storage_tier for ev in [*expected, *actual] if _key(ev) in odd}
        if tiers == {"host_pinned"}:
            out.add("host_tier_event")
    if (
        rule == RuleId.EVENT_ID
        and first_events
        and not odd
        and expected
        and len(expected) == len(actual)
        and all(a.event_id == e.event_id + 1 for e, a in zip(expected, actual, strict=True))
    ):
        out.add("event_ids_from_1")
    return out


def op_kind(op: Operation | None) -> str | None:
    return None if op is None else str(op.op)


def site_of(
    rule: RuleId,
    *,
    config: ManagerConfig,
    op: Operation | None = None,
    scenario: str | None = None,
    conditions: set[str] | frozenset[str] = frozenset(),
) -> Site:
    """The ``Site`` of a block-level failure."""
    return Site(
        rule=rule,
        scenario=scenario,
        operation=op_kind(op),
        conditions=frozenset(context_conditions(config) | set(conditions)),
        profile=config.profile,
    )
