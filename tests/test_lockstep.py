"""The lockstep checker: it passes the reference, catches each kind of
divergence under the right rule, follows allowed eviction choices, excuses
a profile's known breaks (and only those), and writes a usable report and
replay file."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, cast

import pytest

from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.conformance.block.coverage import use_placed
from kvspec.conformance.block.lockstep import Lockstep, run_ops
from kvspec.conformance.block.stream_check import parent_hints
from kvspec.conformance.run.manifest import Manifest, load_manifest, resolve_adapter_dir
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference import make_model
from kvspec.reference.outcome import Step
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import AdapterError, InvalidOperation
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import (
    Counters,
    Deref,
    ErrorInfo,
    FullBlock,
    KvEvent,
    Operation,
    OpResult,
    PartialBlock,
    Plh,
    Promote,
    StepOutcome,
    Use,
    make_removed,
    make_stored,
)

MANIFEST: Manifest = load_manifest(resolve_adapter_dir("adapters/reference"))


def use(*seqs: int, parent: int | None = None, start: int = 0, partial: str | None = None) -> Use:
    """A Use of a chain of blocks (hash = sequence hash = lineage hash)."""
    blocks: list[Any] = [FullBlock(full=s) for s in seqs]
    if partial is not None:
        blocks.append(PartialBlock(partial=partial))
    plhs, prev = [], parent
    for i, s in enumerate(seqs):
        plhs.append(Plh(hash=s, parent=prev, position=start + i))
        prev = s
    return Use(
        blocks=blocks,
        local_hashes=[s * 10 for s in seqs],
        plhs=plhs,
        parent=FullBlock(full=parent) if parent is not None else None,
    )


def deref(*seqs: int) -> Deref:
    return Deref(blocks=[FullBlock(full=s) for s in seqs])


def cfg(**kw: Any) -> ManagerConfig:
    base: dict[str, Any] = {"profile": "kvbm", "capacity": 4, "eviction": "lru"}
    base.update(kw)
    return ManagerConfig(**base)


class Tweaked(ReferenceImplementation):
    """The reference with its outcome rewritten by ``tweak(op, outcome)``."""

    def __init__(self, config: ManagerConfig, tweak: Callable[[Any, StepOutcome], StepOutcome]) -> None:
        super().__init__(config, MANIFEST)
        self.tweak = tweak

    def step(self, op: Operation) -> StepOutcome:
        return self.tweak(op, super().step(op))


def tweaked(config: ManagerConfig, tweak: Callable[[Any, StepOutcome], StepOutcome]) -> Tweaked:
    return Tweaked(config, tweak)


def replace(out: StepOutcome, **update: Any) -> StepOutcome:
    return out.model_copy(update=update)


# A sequence with hits, a shared prefix, derefs and an eviction at capacity 4:
# request A = 1,2,3; B shares 1,2 and adds 4; A finishes; C = 5 evicts 3.
TRAFFIC: list[Operation] = [use(1, 2, 3), use(1, 2, 4), deref(3, 2, 1), use(5), deref(5)]


@pytest.mark.parametrize("profile", ["kvbm", "atomic", "legacy"])
def test_reference_passes_and_counts_coverage(profile: str) -> None:
    config = cfg(profile=profile)
    ls = run_ops(ReferenceImplementation(config, MANIFEST), config, TRAFFIC, adapter="reference")
    assert len(ls.ops) == len(TRAFFIC)
    assert ls.coverage[RuleId.USE_HIT_ACTIVE] == 2  # B reuses 1 and 2
    assert ls.coverage[RuleId.USE_NEW] >= 4
    assert ls.coverage[RuleId.REMOVE_EXACT] == 1  # C evicts
    assert ls.coverage[RuleId.INV_ROUTER_MATCH] == len(TRAFFIC)


def _fail(config: ManagerConfig, impl: Any, ops: list[Any], **kw: Any) -> ConformanceFailure:
    with pytest.raises(ConformanceFailure) as ei:
        run_ops(impl, config, ops, adapter="broken", **kw)
    return ei.value


def _drop_removed(op: Operation, out: StepOutcome) -> StepOutcome:
    return replace(out, events=[e for e in out.events if e.kind != "removed"])


def test_missing_removed_is_remove_exact_with_a_readable_report(tmp_path: Path) -> None:
    config = cfg()
    path = tmp_path / "r" / "case.jsonl"
    f = _fail(config, tweaked(config, _drop_removed), TRAFFIC, replay_path=path)
    assert f.rule == RuleId.REMOVE_EXACT
    text = f.report
    assert "lockstep divergence at step 3" in text
    assert "step | operation | result | events" in text
    assert "Deref [3, 2, 1]" in text  # the operations, as a table
    assert "expected: #3 Removed[3]" in text and "actual:   (none)" in text
    assert f"replay file: {path}" in text
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["kvspec_replay"] == 2 and lines[0]["adapter"] == "broken"
    assert ManagerConfig.model_validate(lines[0]["config"]) == config
    assert lines[0]["failure"]["rule"] == "REMOVE-EXACT" and lines[0]["failure"]["step"] == 3
    assert len(lines) == 1 + 4  # header + operations up to the failing one
    assert lines[4]["expect"]["events"][-1]["data"] == {"removed": {"block_hashes": [3]}}


def test_long_hashes_get_short_names_in_the_report() -> None:
    big = [10**18 + i for i in range(3)]
    config = cfg(capacity=2)
    ops: list[Operation] = [use(big[0], big[1]), deref(big[1], big[0]), use(big[2])]
    f = _fail(config, tweaked(config, _drop_removed), ops)
    assert "Use [b1, b2]" in f.report
    assert f"b1 = {big[0]}" in f.report and f"b3 = {big[2]}" in f.report


@pytest.mark.parametrize(
    ("tweak", "rule"),
    [
        (
            lambda op, o: replace(o, events=[e.model_copy(update={"event_id": e.event_id + 1}) for e in o.events]),
            RuleId.EVENT_ID,
        ),
        (
            lambda op, o: (
                replace(o, counters=o.counters.model_copy(update={"active_refs": o.counters.active_refs + 1}))
                if isinstance(op, Use)
                else o
            ),
            RuleId.USE_NEW,  # the first rule the model applied that moves active_refs (its labels)
        ),
        (
            lambda op, o: replace(o, result=OpResult(value=0, status="capacity")) if isinstance(op, Use) else o,
            RuleId.USE_CAPACITY,
        ),
        (
            lambda op, o: (
                replace(o, result=None, error=ErrorInfo(rule="DEREF-UNKNOWN", message="no"))
                if isinstance(op, Deref)
                else o
            ),
            RuleId.DEREF_OWNER,
        ),
        (lambda op, o: replace(o, events=[e.model_copy(update={"dp_rank": 7}) for e in o.events]), RuleId.EVENT_SOURCE),
        (
            lambda op, o: (
                replace(
                    o,
                    events=[
                        e.model_copy(update={"event_id": o.events[0].event_id + i})
                        for i, e in enumerate(reversed(o.events))
                    ],
                )
                if o.events
                else o
            ),
            RuleId.EVENT_ORDER,
        ),
    ],
    ids=["event-id", "counters", "result", "rejects-valid", "dp-rank", "removed-first"],
)
def test_each_divergence_names_its_rule(tweak: Any, rule: RuleId) -> None:
    config = cfg()
    ops = [*TRAFFIC, use(6, 7, 8)]  # the last Use stores and evicts in one step
    assert _fail(config, tweaked(config, tweak), ops).rule == rule


def test_stored_again_on_a_hit_is_store_no_dup() -> None:
    """A router-visible violation the model's stream does not have fails
    under the router view's rule."""
    config = cfg()
    next_id = [0]

    def restore(op: Operation, out: StepOutcome) -> StepOutcome:
        if isinstance(op, Use) and not out.events and out.result is not None and out.result.value:
            first = cast(FullBlock, op.blocks[0]).full
            out = replace(out, events=[make_stored(next_id[0], [first], [first * 10], None)])
        next_id[0] += len(out.events)
        return out

    f = _fail(config, tweaked(config, restore), [use(1), use(1)])
    assert f.rule == RuleId.STORE_NO_DUP
    assert "router view: [STORE-NO-DUP]" in f.report


def test_invalid_operation_must_be_rejected_with_its_rule_and_change_nothing() -> None:
    config = cfg()
    unknown = deref(42)
    accepts = tweaked(config, lambda op, o: replace(o, error=None, result=OpResult()) if o.error else o)
    f = _fail(config, accepts, [use(1), unknown])
    assert f.rule == RuleId.DEREF_UNKNOWN and "must be rejected" in f.report

    wrong_rule = tweaked(
        config, lambda op, o: replace(o, error=ErrorInfo(rule="USE-VALIDATE", message="x")) if o.error else o
    )
    f = _fail(config, wrong_rule, [use(1), unknown])
    assert f.rule == RuleId.DEREF_UNKNOWN and "wrong rule" in f.report

    def leaky(op: Operation, o: StepOutcome) -> StepOutcome:
        if o.error is None:
            return o
        c = o.counters
        return replace(
            o, counters=c.model_copy(update={"free_blocks": c.free_blocks - 1, "active_blocks": c.active_blocks + 1})
        )

    f = _fail(config, tweaked(config, leaky), [use(1), unknown])
    assert f.rule == RuleId.DEREF_UNKNOWN and "changed the counters" in f.report
    # and the reference passes the same sequence
    run_ops(ReferenceImplementation(config, MANIFEST), config, [use(1), unknown], adapter="reference")


class PreferNewest(ReferenceImplementation):
    """Evicts the most recently released inactive block whenever the policy
    lets it choose (the model's ``prefer``)."""

    def __init__(self, config: ManagerConfig) -> None:
        super().__init__(config, MANIFEST)
        # whatever the configured policy, this implementation may pick any victim
        self.model = make_model(config.model_copy(update={"eviction": "unordered"}))
        self.released: list[int] = []

    def step(self, op: Operation) -> StepOutcome:
        if isinstance(op, Deref):
            self.released.extend(b.full for b in op.blocks if isinstance(b, FullBlock))
        prefer: Collection[int] = set(self.released[-1:])
        try:
            step: Step = self.model.apply(op, prefer=prefer)
        except InvalidOperation as e:
            return StepOutcome(error=ErrorInfo(rule=str(e.rule), message=e.message), counters=self.model.counters())
        return StepOutcome(result=step.result, counters=self.model.counters(), events=step.events)


def test_an_allowed_tie_is_followed_and_a_disallowed_choice_is_evict_policy() -> None:
    ops: list[Operation] = [
        use(1),
        use(2),
        deref(1),
        deref(2),
        use(3),
        use(4),
        use(5),
    ]  # capacity 2: 3 evicts, 4 evicts
    ok = cfg(capacity=2, eviction="unordered")
    ls = run_ops(PreferNewest(ok), ok, ops, adapter="prefer-newest")
    removed = [e.hashes() for o in ls.actual for e in o.events if e.kind == "removed"]
    assert removed == [[2], [1]]  # not the model's own (LRU) order: it followed the implementation
    strict = cfg(capacity=2, eviction="lru")
    assert _fail(strict, PreferNewest(strict), ops).rule == RuleId.EVICT_POLICY


def test_known_break_of_the_profile_is_coverage_not_failure() -> None:
    """kvbm under LRU evicts a parent before its child (REMOVE-NO-ORPHAN, a
    known break of the profile): excused and counted. Under lineage the same
    traffic evicts the leaf, and an implementation that orphans fails."""
    ops: list[Operation] = [use(1, 2), deref(1, 2), use(3)]  # capacity 2; root first deref: 1 is oldest
    lru = cfg(capacity=2, eviction="lru")
    ls = run_ops(ReferenceImplementation(lru, MANIFEST), lru, ops, adapter="reference")
    assert ls.known_breaks == {"REMOVE-NO-ORPHAN": 1}

    lineage = cfg(capacity=2, eviction="lineage")
    ls = run_ops(ReferenceImplementation(lineage, MANIFEST), lineage, ops, adapter="reference")
    assert not ls.known_breaks
    orphaning = tweaked(
        lineage,
        lambda op, o: replace(
            o, events=[make_removed(e.event_id, [1]) if e.kind == "removed" else e for e in o.events]
        ),
    )
    f = _fail(lineage, orphaning, ops)
    assert f.rule == RuleId.EVICT_POLICY  # the root cause, with the router's complaint in the report
    assert "REMOVE-NO-ORPHAN" in f.report


def _one_stored_per_block(op: Operation, out: StepOutcome) -> StepOutcome:
    """Splits every Stored into one event per block (router-equivalent), and
    renumbers the events of the step from the first id."""
    if not out.events:
        return out
    first_id = out.events[0].event_id
    events: list[KvEvent] = []
    for e in out.events:
        if e.kind == "stored":
            data = e.data.stored  # type: ignore[union-attr]
            parent = data.parent_hash
            for b in data.blocks:
                events.append(
                    KvEvent.model_validate(
                        {
                            "event_id": 0,
                            "dp_rank": e.dp_rank,
                            "data": {"stored": {"parent_hash": parent, "blocks": [b.model_dump()]}},
                        }
                    )
                )
                parent = b.block_hash
        else:
            events.append(e)
    return replace(out, events=[e.model_copy(update={"event_id": first_id + i}) for i, e in enumerate(events)])


def test_protocol_only_mode_accepts_router_equivalent_streams() -> None:
    """Splitting a Stored per block changes the events (full mode fails) but
    not what a router learns: protocol-only mode passes. Event ids drift
    from the model's after a split, which only full mode checks."""
    config = cfg(capacity=8)
    ops = [use(1, 2, 3), deref(3, 2, 1), use(1, 4)]
    assert _fail(config, tweaked(config, _one_stored_per_block), ops).rule == RuleId.STORE_NEW_ONLY


def test_protocol_only_mode_catches_a_router_mismatch() -> None:
    config = cfg(capacity=8)
    ops: list[Operation] = [use(1, 2, 3), deref(3, 2, 1), use(1, 4)]
    ls = Lockstep(tweaked(config, _one_stored_per_block), config, adapter="split", protocol_only=True)
    with pytest.raises(ConformanceFailure) as ei:
        for op in ops:
            ls.step(op)
    # the split renumbers ids, so the next step's first event id repeats: a
    # router rule, found by the router view alone
    assert ei.value.rule == RuleId.EVENT_ID

    silent = tweaked(config, lambda op, o: replace(o, events=[]))
    f = _fail(config, silent, ops, protocol_only=True)
    assert f.rule == RuleId.INV_ROUTER_MATCH and "missing [1, 2, 3]" in f.report


def test_adapter_errors_propagate_with_the_operations_so_far() -> None:
    config = cfg()

    def crash(op: Operation, out: StepOutcome) -> StepOutcome:
        if isinstance(op, Deref):
            raise AdapterError("child exited", exit_status=3)
        return out

    with pytest.raises(AdapterError) as ei:
        run_ops(tweaked(config, crash), config, TRAFFIC, adapter="crashy")
    notes = "\n".join(getattr(ei.value, "__notes__", []))
    assert "Use [1, 2, 3]" in notes and "Deref [3, 2, 1]" in notes


def test_parent_hints_follow_the_batch_and_keep_a_repeated_blocks_first_parent() -> None:
    assert list(parent_hints(use(5, 6, parent=4, start=1))) == [(5, 4), (6, 5)]
    fork = Use(
        blocks=[FullBlock(full=h) for h in (1, 2, 1, 3)],
        plhs=[Plh(hash=1), Plh(hash=2, parent=1, position=1), Plh(hash=1), Plh(hash=3, parent=1, position=1)],
    )
    assert list(parent_hints(fork)) == [(1, None), (2, 1), (3, 1)]
    promote = Promote(uuid="u", seq_hash=9, parent_hash=8, plh=Plh(hash=9, parent=8, position=3))
    assert list(parent_hints(promote)) == [(9, 8)]


def test_use_placed_reads_counts_and_legacy_booleans() -> None:
    op = use(1, 2, 3)
    assert use_placed(op, OpResult(value=2, status="capacity"), 99) == 2
    assert use_placed(op, OpResult(value=True), 0) == 3
    assert use_placed(op, OpResult(value=False, status="capacity"), 1) == 1


def test_counters_of_a_rejected_step_are_compared_with_the_state_before() -> None:
    """The model's counters before a rejected step are what the implementation
    must still report (checked against a hand-computed value)."""
    config = cfg()
    ls = Lockstep(ReferenceImplementation(config, MANIFEST), config, adapter="reference")
    ls.step(use(1, 2))
    exp = ls.step(deref(9))
    assert exp.error is not None and exp.error.rule == "DEREF-UNKNOWN"
    assert exp.counters == Counters(active_blocks=2, active_refs=2, inactive_blocks=0, free_blocks=2)


def test_an_implementation_without_event_token_ids_is_compared_without_them() -> None:
    config = cfg()

    def strip() -> Tweaked:
        return tweaked(
            config, lambda op, o: replace(o, events=[e.model_copy(update={"block_token_ids": None}) for e in o.events])
        )

    toks = [[1, 2, 3, 4] * 4]
    from kvspec.spec.hashing import local_block_hash

    op = Use(blocks=[FullBlock(full=7)], local_hashes=[local_block_hash(toks[0])], plhs=[Plh(hash=7)], token_ids=toks)
    assert _fail(config, strip(), [op]).rule == RuleId.STORE_NEW_ONLY  # token ids are part of the event
    ls = Lockstep(strip(), config, adapter="no-token-ids", event_token_ids=False)
    assert ls.step(op).events[0].block_token_ids is None
