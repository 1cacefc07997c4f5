"""The router view flags each protocol rule on hand-made streams, and stays
silent on a clean one. Streams are written out event by event so the expected
rule is evident from the stream itself."""

from __future__ import annotations

from typing import Any

from kvspec.reference.router_view import Mode, RouterView
from kvspec.spec.hashing import local_block_hash, sequence_hash
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Stored, make_cleared, make_removed, make_stored


def stored(eid: int, hashes: list[int], parent: int | None = None, **kw: object) -> KvEvent:
    return make_stored(eid, hashes, [0] * len(hashes), parent, **kw)  # type: ignore[arg-type]


def removed(eid: int, hashes: list[int], **kw: object) -> KvEvent:
    return make_removed(eid, hashes, **kw)  # type: ignore[arg-type]


def rules(view: RouterView) -> list[RuleId]:
    return [v.rule for v in view.violations]


def feed(view: RouterView, events: list[KvEvent]) -> list[RuleId]:
    for e in events:
        view.apply(e)
    return rules(view)


def test_clean_stream_has_no_violation_and_tracks_the_set() -> None:
    view = RouterView(strict=True)
    out = feed(view, [stored(0, [1, 2, 3]), stored(1, [4], parent=2), removed(2, [4]), removed(3, [3])])
    assert out == []
    assert view.stored() == {1, 2}


def test_duplicate_stored_is_store_no_dup() -> None:
    view = RouterView()
    assert feed(view, [stored(0, [1, 2]), stored(1, [2], parent=1)]) == [RuleId.STORE_NO_DUP]
    v = view.violations[0]
    assert v.event is not None and v.event.event_id == 1
    assert v.context["stored_by_event"] == 0
    assert "2" in v.message


def test_duplicate_inside_one_stored_is_store_no_dup() -> None:
    assert feed(RouterView(), [stored(0, [5, 5])]) == [RuleId.STORE_NO_DUP]


def test_stored_again_after_removed_is_fine() -> None:
    assert feed(RouterView(), [stored(0, [1]), removed(1, [1]), stored(2, [1])]) == []


def test_removed_of_unknown_block_is_remove_exact() -> None:
    view = RouterView()
    assert feed(view, [stored(0, [1]), removed(1, [9])]) == [RuleId.REMOVE_EXACT]
    assert view.violations[0].context["state"] == "never stored in this tier"


def test_removed_twice_is_remove_exact_and_names_the_first_removal() -> None:
    view = RouterView()
    assert feed(view, [stored(0, [1]), removed(1, [1]), removed(2, [1])]) == [RuleId.REMOVE_EXACT]
    assert view.violations[0].context["already_removed_by_event"] == 1


def test_parent_not_stored_is_parent_anchor() -> None:
    view = RouterView()
    assert feed(view, [stored(0, [1]), stored(1, [3], parent=2)]) == [RuleId.PARENT_ANCHOR]
    assert view.violations[0].context["parent"] == 2


def test_parent_removed_before_the_child_arrives_is_parent_anchor() -> None:
    view = RouterView()
    assert feed(view, [stored(0, [1]), removed(1, [1]), stored(2, [2], parent=1)]) == [RuleId.PARENT_ANCHOR]
    assert view.violations[0].context["parent_removed_by_event"] == 1


def test_parent_that_is_not_the_block_before_is_parent_anchor_when_lineage_is_known() -> None:
    view = RouterView()
    view.expect_parent(7, 5)
    # 6 is stored, so the stream alone looks fine; the lineage says 7 follows 5
    assert feed(view, [stored(0, [5, 6]), stored(1, [7], parent=6)]) == [RuleId.PARENT_ANCHOR]
    assert view.violations[0].context["expected_parent"] == 5


def test_event_id_gap_and_repeat_are_event_id() -> None:
    view = RouterView()
    assert feed(view, [stored(0, [1]), stored(2, [2])]) == [RuleId.EVENT_ID]
    assert view.violations[0].context["expected_id"] == 1
    view2 = RouterView()
    assert feed(view2, [stored(0, [1]), stored(0, [2])]) == [RuleId.EVENT_ID]
    assert "repeat" in view2.violations[0].message


def test_first_event_must_be_zero_unless_capture_started_midway() -> None:
    assert feed(RouterView(), [stored(3, [1])]) == [RuleId.EVENT_ID]
    assert feed(RouterView(first_event_id=None), [stored(3, [1]), stored(4, [2])]) == []


def test_event_ids_count_across_tiers_per_manager() -> None:
    view = RouterView()
    events = [stored(0, [1]), stored(1, [1], tier="host_pinned"), removed(2, [1]), stored(3, [2])]
    assert feed(view, events) == []
    assert view.stored("device") == {2}
    assert view.stored("host_pinned") == {1}


def test_each_worker_and_dp_rank_has_its_own_ids_and_blocks() -> None:
    view = RouterView()
    view.apply(stored(0, [1]), worker_id=1)
    view.apply(stored(0, [1]), worker_id=2)
    view.apply(stored(0, [1], dp_rank=1), worker_id=2)
    assert view.violations == []
    assert view.stored(worker_id=2, dp_rank=1) == {1}


def test_orphaning_removed_is_flagged_only_when_strict() -> None:
    events = [stored(0, [1, 2, 3]), removed(1, [2])]
    assert feed(RouterView(strict=False), events) == []
    strict = RouterView(strict=True)
    assert feed(strict, events) == [RuleId.REMOVE_NO_ORPHAN]
    assert "[3]" in strict.violations[0].message


def test_removing_leaves_first_is_not_orphaning() -> None:
    assert feed(RouterView(strict=True), [stored(0, [1, 2, 3]), removed(1, [3, 2, 1])]) == []


def test_removed_before_stored_within_one_operation_is_event_order() -> None:
    view = RouterView()
    out = view.apply_batch([stored(0, [1])])
    assert out == []
    out = view.apply_batch([removed(1, [1]), stored(2, [2])], stored_first=True)
    assert [v.rule for v in out] == [RuleId.EVENT_ORDER]
    view2 = RouterView()
    view2.apply_batch([stored(0, [1])])
    assert view2.apply_batch([removed(1, [1]), stored(2, [2])], stored_first=False) == []


def test_copies_mode_counts_physical_copies() -> None:
    view = RouterView(mode="copies")
    assert feed(view, [stored(0, [1]), stored(1, [1]), removed(2, [1])]) == []
    assert view.copies() == {1: 1}
    feed(view, [removed(3, [1]), removed(4, [1])])
    assert rules(view) == [RuleId.REMOVE_COPY]
    assert view.stored() == set()


def test_cleared_empties_the_tier() -> None:
    view = RouterView()
    assert feed(view, [stored(0, [1, 2]), make_cleared(1), stored(2, [1])]) == []
    assert view.stored() == {1}


def test_dp_rank_expectation_is_event_source() -> None:
    view = RouterView(expect_dp_rank=0)
    assert feed(view, [stored(0, [1], dp_rank=3)]) == [RuleId.EVENT_SOURCE]


def test_anchoring_is_checked_on_the_device_tier_only_by_default() -> None:
    # a G2 Stored carries its G1 parent, which need not be in G2
    view = RouterView()
    assert feed(view, [stored(0, [2], parent=1, tier="host_pinned")]) == []
    view2 = RouterView(anchored_tiers=("device", "host_pinned"))
    assert feed(view2, [stored(0, [2], parent=1, tier="host_pinned")]) == [RuleId.PARENT_ANCHOR]


def _dynamo_hash_check(parent: int | None, block: int, tokens_hash: int, toks: list[int] | None) -> str | None:
    if toks is None:
        return None
    if local_block_hash(toks) != tokens_hash:
        return "tokens_hash is not the local hash of the block's tokens"
    if sequence_hash(parent, tokens_hash) != block:
        return "block_hash does not chain from the parent"
    return None


def test_hash_check_flags_wrong_tokens_hash() -> None:
    toks = [[1, 2, 3, 4], [5, 6, 7, 8]]
    l0, l1 = local_block_hash(toks[0]), local_block_hash(toks[1])
    s0 = sequence_hash(None, l0)
    s1 = sequence_hash(s0, l1)
    good = make_stored(0, [s0, s1], [l0, l1], None, token_ids=toks)
    bad = make_stored(1, [s1 + 1], [l1], s0, token_ids=[toks[1]])
    view = RouterView(hash_check=_dynamo_hash_check)
    assert feed(view, [good]) == []
    assert feed(view, [bad]) == [RuleId.STORE_TOKENS_HASH]


def test_violation_str_names_rule_event_and_context() -> None:
    view = RouterView()
    feed(view, [stored(0, [1]), stored(1, [1])])
    text = str(view.violations[0])
    assert text.startswith("[STORE-NO-DUP]")
    assert "#1 Stored[1]" in text and "stored_by_event: 0" in text


# ------------------------------------------- field-level entry, bounds, reports


def test_anchoring_in_every_tier_flags_a_host_parent_evicted_from_the_host_tier() -> None:
    view = RouterView(anchored_tiers=None)
    events = [
        stored(0, [1, 2], tier="host_pinned"),
        removed(1, [2], tier="host_pinned"),
        stored(2, [3], parent=2, tier="host_pinned"),
    ]
    assert feed(view, events) == [RuleId.PARENT_ANCHOR]
    assert view.violations[0].tier == "host_pinned"
    assert view.violations[0].context["parent_removed_by_event"] == 1


def test_field_entry_and_object_entry_report_the_same() -> None:
    import random

    rng = random.Random(3)
    for _ in range(50):
        evs = []
        for eid in range(rng.randint(1, 30)):
            hs = [rng.randrange(8) for _ in range(rng.randint(1, 3))]
            tier = rng.choice(["device", "host_pinned"])
            if rng.random() < 0.5:
                evs.append(stored(eid + rng.choice([0, 0, 1]), hs, parent=rng.choice([None, 1, 2]), tier=tier))
            else:
                evs.append(removed(eid, hs, tier=tier))
        modes: tuple[Mode, ...] = ("set", "copies")
        for mode in modes:
            a = RouterView(mode=mode, strict=True, anchored_tiers=None)
            b = RouterView(mode=mode, strict=True, anchored_tiers=None)
            for e in evs:
                a.apply(e, 4)
                if isinstance(e.data, Stored):
                    d = e.data.stored
                    b.on_stored(
                        4, e.dp_rank, e.storage_tier, e.event_id, d.parent_hash, e.hashes(), [0] * len(e.hashes())
                    )
                else:
                    b.on_removed(4, e.dp_rank, e.storage_tier, e.event_id, e.hashes())
            assert [(v.rule, v.message, v.tier) for v in a.violations] == [
                (v.rule, v.message, v.tier) for v in b.violations
            ]
            assert b.violations == [] or all(v.event is not None for v in b.violations)


def test_violations_are_counted_even_when_none_are_kept() -> None:
    seen: list[Any] = []
    view = RouterView(keep=0, on_violation=seen.append)
    feed(view, [stored(0, [1]), stored(1, [1]), removed(2, [7])])
    assert view.violations == []
    assert view.counts == {RuleId.STORE_NO_DUP: 1, RuleId.REMOVE_EXACT: 1}
    assert [v.rule for v in seen] == [RuleId.STORE_NO_DUP, RuleId.REMOVE_EXACT]
    v = view.report(RuleId.EVENT_ID, "sequence gap", 4, 0, "device", at=17)
    assert v.at == 17 and view.counts[RuleId.EVENT_ID] == 1 and seen[-1] is v


def test_state_stays_proportional_to_the_stored_blocks() -> None:
    """200k events over at most 64 stored blocks: what the view keeps does
    not grow with the stream (removals are remembered in a bounded window)."""
    from kvspec.reference.router_view import RECENT_REMOVALS

    view = RouterView(strict=True, first_event_id=None, anchored_tiers=None)
    eid = 0
    for i in range(50_000):
        base = i * 4
        view.on_stored(1, 0, "device", eid, None, [base, base + 1], [0, 0])
        view.on_stored(1, 0, "device", eid + 1, base + 1, [base + 2, base + 3], [0, 0])
        eid += 2
        if i >= 16:
            old = (i - 16) * 4
            view.on_removed(1, 0, "device", eid, [old + 3, old + 2, old + 1, old])
            eid += 1
    tier = view.sources[(1, 0)].tiers["device"]
    assert len(tier.live) == 64
    assert len(tier.kids) <= 64
    assert len(tier.removed.cur) + len(tier.removed.old) <= 2 * RECENT_REMOVALS
    assert view.violations == []
