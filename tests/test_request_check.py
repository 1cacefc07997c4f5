"""The request-level checks (conformance/requests/check.py) catch each kind of
departure and name the right rule: an "implementation" here is the reference
driver's output for a seed workload, run with a model variant or edited by
hand, so every expected rule follows from the edit that was made."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import kvspec.adapters.rust_mocker as rust_mocker_pkg
from kvspec.conformance.requests.api import ConcurrentRun, RequestOutcome
from kvspec.conformance.requests.check import check_run
from kvspec.conformance.requests.workloads import Workload, load_workload, seed_workloads, setup_of
from kvspec.reference.requests import RequestSpec, SyntheticDecode, interleave, run_sequential
from kvspec.reference.vllm_pool import SPEC_VARIANT, PoolVariant
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Removed, RemovedData, Stored, StoredBlock, StoredData

R = RuleId
SEEDS = seed_workloads()
COPIES, DECODE, HOST = SEEDS[0], SEEDS[1], SEEDS[2]


def first_rule(found: tuple[RuleId, int, str] | None) -> RuleId | None:
    return None if found is None else found[0]


def impl_run(w: Workload, variant: PoolVariant = SPEC_VARIANT, salt: int = 7) -> list[RequestOutcome]:
    """What an implementation following ``variant`` would report (its own decode tokens)."""
    res = run_sequential(
        w.setup, w.requests, decode=SyntheticDecode(w.setup.manager.block_size, salt=salt), variant=variant
    )
    return [RequestOutcome(cached_tokens=r.cached_tokens, events=r.events) for r in res]


def edit(outcomes: list[RequestOutcome], fn: Callable[[KvEvent], KvEvent | None]) -> list[RequestOutcome]:
    """Apply ``fn`` to every event (None drops it), renumbering nothing."""
    out = []
    for o in outcomes:
        evs = [e2 for e in o.events if (e2 := fn(e)) is not None]
        out.append(o.model_copy(update={"events": evs}))
    return out


def rules(w: Workload, outcomes: list[RequestOutcome] | ConcurrentRun) -> set[RuleId]:
    return {f.rule for f in check_run(w, outcomes).findings}


def test_the_reference_passes_every_seed() -> None:
    for w in SEEDS:
        if w.concurrent:
            results, stream = interleave(w.setup, w.requests)
            run: list[RequestOutcome] | ConcurrentRun = ConcurrentRun(
                outcomes=[RequestOutcome(cached_tokens=r.cached_tokens) for r in results], events=stream
            )
        else:
            run = impl_run(w)
        checked = check_run(w, run)
        assert checked.findings == [], [f.report() for f in checked.findings]
        assert sum(checked.exercised.values()) > 0


def test_ids_from_one_are_event_id_and_followed() -> None:
    checked = check_run(DECODE, impl_run(DECODE, PoolVariant(first_event_id=1)))
    assert {f.rule for f in checked.findings} == {R.EVENT_ID}
    assert checked.variant.first_event_id == 1


def test_visible_copies_are_store_copy_then_remove_copy() -> None:
    checked = check_run(COPIES, impl_run(COPIES, PoolVariant(store_copies=False, remove_copies=False)))
    assert [f.rule for f in checked.findings] == [R.STORE_COPY, R.REMOVE_COPY]
    assert checked.findings[0].request == 2  # the block-aligned repeat
    assert checked.variant == PoolVariant(store_copies=False, remove_copies=False)  # both followed to the end


def test_hash_ordered_host_batches_are_g2_evict() -> None:
    assert rules(HOST, impl_run(HOST, PoolVariant(host_order="hash"))) == {R.G2_EVICT}


def test_wrong_cached_tokens_is_prefix_hit() -> None:
    out = impl_run(COPIES)
    out[2] = out[2].model_copy(update={"cached_tokens": 0})  # one cached block is due
    assert rules(COPIES, out) == {R.VLLM_PREFIX_HIT}
    out[2] = out[2].model_copy(update={"cached_tokens": 8})  # the whole aligned prompt: beyond num_tokens - 1
    found = check_run(COPIES, out).findings
    assert found[0].rule == R.VLLM_PREFIX_HIT and "full_prompt_hit" in found[0].site().conditions
    # followed as a real full hit (no recomputed copy), so the recompute's own events now stand out
    assert R.VLLM_PREFIX_HIT in {f.rule for f in found}


def test_a_full_prompt_hit_is_prefix_hit_and_followed() -> None:
    checked = check_run(COPIES, impl_run(COPIES, PoolVariant(full_prompt_hit=True)))
    assert {f.rule for f in checked.findings} == {R.VLLM_PREFIX_HIT}
    assert all("full_prompt_hit" in f.site().conditions for f in checked.findings)
    assert checked.variant.full_prompt_hit  # followed to the end: the rest of the run matched


def test_eviction_in_another_order_is_free_order() -> None:
    def swap(e: KvEvent) -> KvEvent:
        if isinstance(e.data, Removed) and len(e.data.removed.block_hashes) == 2 and e.storage_tier == "device":
            h = e.data.removed.block_hashes
            return e.model_copy(update={"data": Removed(removed=RemovedData(block_hashes=[h[1], h[0]]))})
        return e

    assert rules(COPIES, edit(impl_run(COPIES), swap)) == {R.VLLM_FREE_ORDER}


def test_a_missing_removed_is_lazy_remove() -> None:
    out = impl_run(COPIES)
    dropped = out[4].events[0]
    assert dropped.kind == "removed"
    assert rules(COPIES, edit(out, lambda e: None if e is dropped else e)) >= {R.VLLM_LAZY_REMOVE, R.EVENT_ID}


def test_a_wrong_tokens_hash_breaks_the_hash_rules() -> None:
    def corrupt(e: KvEvent) -> KvEvent:
        if isinstance(e.data, Stored) and e.event_id == 0:
            blocks = [StoredBlock(block_hash=b.block_hash, tokens_hash=b.tokens_hash ^ 1) for b in e.data.stored.blocks]
            return e.model_copy(update={"data": Stored(stored=StoredData(parent_hash=None, blocks=blocks))})
        return e

    assert rules(COPIES, edit(impl_run(COPIES), corrupt)) == {R.HASH_LOCAL, R.HASH_SEQUENCE, R.STORE_TOKENS_HASH}


def test_an_engine_that_does_not_finish_a_request_is_use_capacity() -> None:
    out = impl_run(COPIES)
    out[0] = out[0].model_copy(update={"finish": '{"error": "rejected"}'})
    assert R.USE_CAPACITY in rules(COPIES, out)


def test_decode_hashes_are_followed_but_their_chain_is_checked() -> None:
    out = impl_run(DECODE, salt=99)  # other hidden decode tokens than the checker's model would draw
    assert rules(DECODE, out) == set()

    def rechain(e: KvEvent) -> KvEvent:
        d = e.data.stored if isinstance(e.data, Stored) else None
        if d is not None and len(d.blocks) == 1 and d.parent_hash is not None and e.event_id == 1:
            b = d.blocks[0]
            blocks = [StoredBlock(block_hash=b.block_hash, tokens_hash=b.tokens_hash ^ 1)]
            return e.model_copy(update={"data": Stored(stored=StoredData(parent_hash=d.parent_hash, blocks=blocks))})
        return e

    assert rules(DECODE, edit(out, rechain)) == {R.HASH_SEQUENCE}


def test_a_decode_block_under_the_wrong_parent_is_reported() -> None:
    out = impl_run(DECODE)

    def reparent(e: KvEvent) -> KvEvent:
        d = e.data.stored if isinstance(e.data, Stored) else None
        if d is not None and len(d.blocks) == 1 and e.event_id == 1:
            return e.model_copy(update={"data": Stored(stored=StoredData(parent_hash=12345, blocks=d.blocks))})
        return e

    checked = check_run(DECODE, edit(out, reparent))
    found = {f.rule for f in checked.findings}
    assert R.PARENT_ANCHOR in found  # the router view: parent 12345 is not stored
    assert R.STORE_NEW_ONLY in found  # the differential: the decode block the model expects never came
    assert any("no matching implementation Stored" in f.detail for f in checked.findings)


def test_concurrent_runs_get_protocol_and_hash_checks_only() -> None:
    w = Workload(setup=setup_of(12, 2), requests=[RequestSpec(prompt=[1, 2, 3], max_tokens=3)] * 2, concurrent=True)
    results, stream = interleave(w.setup, w.requests)
    shifted = [e.model_copy(update={"event_id": e.event_id + 1}) for e in stream]
    assert (
        rules(
            w, ConcurrentRun(outcomes=[RequestOutcome(cached_tokens=r.cached_tokens) for r in results], events=stream)
        )
        == set()
    )
    run = ConcurrentRun(outcomes=[RequestOutcome(cached_tokens=4), RequestOutcome(cached_tokens=0)], events=shifted)
    assert rules(w, run) == {R.EVENT_ID, R.VLLM_PREFIX_HIT}  # 4 cached tokens of a 3-token prompt


def test_consecutive_missing_copy_removals_are_remove_copy_not_event_order() -> None:
    from kvspec.conformance.requests.check import attribute
    from kvspec.reference.vllm_pool import removed_label
    from kvspec.spec.wire import make_removed, make_stored

    expected = [make_removed(5, [11]), make_removed(6, [12]), make_stored(7, [13], [1], 12)]
    actual = [make_stored(5, [13], [1], 12)]
    notes = {5: removed_label([11], {11}), 6: removed_label([12], {12})}  # both left another copy behind
    assert attribute(expected, actual, notes) == (R.REMOVE_COPY, 0, f"missing {expected[0].brief()}")
    assert first_rule(attribute(expected, actual, {})) == R.VLLM_LAZY_REMOVE  # not copies: a missing eviction
    assert first_rule(attribute(actual, expected, {})) == R.VLLM_LAZY_REMOVE  # the other way round: an extra one
    swapped = [make_stored(5, [13], [1], 12), make_removed(6, [11])]
    assert first_rule(attribute([make_removed(5, [11]), make_stored(6, [13], [1], 12)], swapped, {})) == R.EVENT_ORDER


def test_one_of_two_copies_missing_from_a_removed_list_is_remove_copy() -> None:
    from kvspec.conformance.requests.check import attribute
    from kvspec.reference.vllm_pool import removed_label
    from kvspec.spec.wire import make_removed

    rule = attribute([make_removed(3, [1, 2, 2])], [make_removed(3, [1, 2])], {3: removed_label([1, 2, 2], {2})})
    assert rule is not None and rule[0] == R.REMOVE_COPY
    rule = attribute([make_removed(3, [1, 2, 2])], [make_removed(3, [1, 2])], {})
    assert rule is not None and rule[0] == R.VLLM_FREE_ORDER


def test_a_missing_copy_removal_before_a_stored_is_not_a_swap() -> None:
    from kvspec.conformance.requests.check import attribute
    from kvspec.reference.vllm_pool import removed_label
    from kvspec.spec.wire import make_removed, make_stored

    expected = [make_removed(6, [9]), make_stored(7, [13], [1], 12), make_removed(8, [9])]
    actual = [make_stored(6, [13], [1], 12), make_removed(7, [9])]
    rule = attribute(expected, actual, {6: removed_label([9], {9})})
    assert rule is not None and rule[0] == R.REMOVE_COPY


def test_streams_split_by_tier_keep_their_order() -> None:
    from kvspec.conformance.requests.api import by_tier

    events = [e for o in impl_run(HOST) for e in o.events]
    tiers = by_tier(events)
    assert set(tiers) == {"device", "host_pinned"}
    assert sum(map(len, tiers.values())) == len(events)
    for evs in tiers.values():
        assert [e.event_id for e in evs] == sorted(e.event_id for e in evs)
        assert len({e.storage_tier for e in evs}) == 1


#: a workload whose fourth request hits a block on the device that the host
#: tier no longer holds (the rust mocker's finding g2_host_write_missing),
#: and the mocker's two host departures (batches in hash order; device hits
#: not written through)
HOST_HIT = load_workload(Path(rust_mocker_pkg.__file__).parent / "findings" / "g2_host_write_missing.jsonl")
NO_HOST_HITS = PoolVariant(host_order="hash", host_writes_hits=False)
HASH_ORDER = (R.G2_EVICT, 2, frozenset({"host_batch_hash_order"}))


def test_a_host_write_missing_departure_is_followed_to_the_end() -> None:
    checked = check_run(HOST_HIT, impl_run(HOST_HIT, NO_HOST_HITS))
    assert [(f.rule, f.request, f.conditions) for f in checked.findings] == [
        HASH_ORDER,
        (R.G2_EVICT, 3, frozenset({"host_write_missing"})),
    ]
    assert checked.variant == NO_HOST_HITS  # followed, and the rest of the run matched


def test_a_bug_after_a_host_write_missing_departure_is_still_found() -> None:
    """The departure at request 3, then request 5's device evictions in the
    wrong order: before the checker followed host_write_missing it stopped
    comparing at request 3 and this bug went unseen."""
    out = impl_run(HOST_HIT, NO_HOST_HITS)
    late = next(e for e in out[5].events if isinstance(e.data, Removed) and len(e.data.removed.block_hashes) == 2)

    def swap(e: KvEvent) -> KvEvent:
        if e is late:
            h = late.data.removed.block_hashes  # type: ignore[union-attr]
            return e.model_copy(update={"data": Removed(removed=RemovedData(block_hashes=[h[1], h[0]]))})
        return e

    found = [(f.rule, f.request, f.conditions) for f in check_run(HOST_HIT, edit(out, swap)).findings]
    assert found == [
        HASH_ORDER,
        (R.G2_EVICT, 3, frozenset({"host_write_missing"})),
        (R.VLLM_FREE_ORDER, 5, frozenset()),
    ]
