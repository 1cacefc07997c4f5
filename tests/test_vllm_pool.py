"""The vllm profile's model (reference/vllm_pool.py): block-pool behaviour,
events and counters, each expectation written out by hand from the profile's
rules (SPEC.md, "vLLM-style pool"), never computed by the model."""

from __future__ import annotations

import pytest

from kvspec.reference import make_model
from kvspec.reference.vllm_pool import HostBlock, PoolVariant, VllmPoolModel
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError, InvalidOperation
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Deref, FullBlock, KvEvent, Operation, PartialBlock, Plh, Promote, Reset, Tick, Use


def cfg(capacity: int = 4, block_size: int = 4) -> ManagerConfig:
    return ManagerConfig(profile="vllm", capacity=capacity, block_size=block_size, eviction="lru")


def use(*blocks: int | str, parent: int | None = None) -> Use:
    """Use of full blocks (ints: hash = local hash) and partial ones (str uuids);
    full block hashes chain in the order given."""
    refs = [FullBlock(full=b) if isinstance(b, int) else PartialBlock(partial=b) for b in blocks]
    fulls = [b for b in blocks if isinstance(b, int)]
    plhs = [Plh(hash=h, parent=fulls[i - 1] if i else parent, position=i) for i, h in enumerate(fulls)]
    return Use(
        blocks=refs,
        local_hashes=[h + 1000 for h in fulls],
        plhs=plhs,
        parent=FullBlock(full=parent) if parent is not None else None,
    )


def deref(*blocks: int | str) -> Deref:
    return Deref(blocks=[FullBlock(full=b) if isinstance(b, int) else PartialBlock(partial=b) for b in blocks])


def promote(uuid: str, seq: int, parent: int | None) -> Promote:
    return Promote(
        uuid=uuid, seq_hash=seq, parent_hash=parent, local_hash=seq + 1000, plh=Plh(hash=seq, parent=parent, position=0)
    )


def brief(events: list[KvEvent]) -> list[tuple[int, str, str, list[int], int | None]]:
    out: list[tuple[int, str, str, list[int], int | None]] = []
    for e in events:
        parent = e.data.stored.parent_hash if e.kind == "stored" else None  # type: ignore[union-attr]
        out.append((e.event_id, e.storage_tier, e.kind, e.hashes(), parent))
    return out


def counters(m: VllmPoolModel) -> tuple[int, int, int, int]:
    c = m.counters()
    assert c.active_blocks + c.inactive_blocks + c.free_blocks == m.capacity  # COUNTERS
    return c.active_blocks, c.active_refs, c.inactive_blocks, c.free_blocks


def test_make_model_builds_the_vllm_pool() -> None:
    assert isinstance(make_model(cfg()), VllmPoolModel)
    with pytest.raises(ConfigError):
        VllmPoolModel(ManagerConfig(profile="kvbm", capacity=4))


def test_new_blocks_one_stored_in_order_then_partial_tail() -> None:
    m = VllmPoolModel(cfg())
    step = m.apply(use(1, 2, "t"))
    assert step.result.value == 0 and step.result.status == "ok"
    assert brief(step.events) == [(0, "device", "stored", [1, 2], None)]
    assert step.events[0].data.stored.blocks[1].tokens_hash == 1002  # type: ignore[union-attr]
    assert counters(m) == (3, 3, 0, 1)


def test_free_publishes_nothing_and_hit_on_freed_block_publishes_nothing() -> None:
    m = VllmPoolModel(cfg())
    m.apply(use(1, 2))
    assert m.apply(deref(2, 1)).events == []  # VLLM-LAZY-REMOVE: freeing is silent
    assert counters(m) == (0, 0, 2, 2)
    step = m.apply(use(1, 2, "t"))  # VLLM-PREFIX-HIT on freed cached blocks
    assert step.result.value == 2 and step.events == []
    assert counters(m) == (3, 3, 0, 1)


def test_eviction_is_lazy_leaf_first_and_hashless_blocks_go_first() -> None:
    m = VllmPoolModel(cfg(capacity=4))
    m.apply(use(1, 2, "a"))
    m.apply(deref("a", 2, 1))  # reverse order: partial back to free, then 2, then 1
    assert m.inactive_order() == [2, 1]
    # two fresh blocks: the free ones (never used + the hashless one) first, nothing evicted
    assert m.apply(use(7, 8)).events[-1].hashes() == [7, 8]
    assert brief(m.apply(use("x")).events) == [(2, "device", "removed", [2], None)]  # leaf 2 before parent 1
    assert brief(m.apply(use("y")).events) == [(3, "device", "removed", [1], None)]
    assert counters(m) == (4, 4, 0, 0)


def test_removed_precedes_stored_and_anchors_to_last_hit() -> None:
    m = VllmPoolModel(cfg(capacity=3))
    m.apply(use(1, 2))
    m.apply(deref(2, 1))
    m.apply(use(5))
    m.apply(deref(5))  # LRU: 2, 1, 5
    step = m.apply(use(1, 3, 4))  # hit 1; 3 and 4 need two blocks: evict 2, then 5
    assert step.result.value == 1
    assert brief(step.events) == [(2, "device", "removed", [2, 5], None), (3, "device", "stored", [3, 4], 1)]


def test_recomputed_copy_has_its_own_stored_and_removed() -> None:
    m = VllmPoolModel(cfg(capacity=4))
    m.apply(use(1, 2))
    m.apply(deref(2, 1))
    m.apply(use(1, "c"))  # a block-aligned repeat: 1 hits, block 2 is recomputed into a fresh block
    step = m.apply(promote("c", 2, 1))
    assert brief(step.events) == [(1, "device", "stored", [2], 1)]  # STORE-COPY: a second copy, announced
    assert m.copy_counts() == {1: 1, 2: 2}
    assert m.event_labels[1].copies == frozenset({2})
    m.apply(deref("c", 1))  # LRU: old copy of 2, copy of 2, 1
    step = m.apply(use("p", "q", "r"))  # one free block, then two evictions: both copies of 2
    assert brief(step.events) == [(2, "device", "removed", [2, 2], None)]  # REMOVE-COPY: one per copy
    assert m.event_labels[2].copies == frozenset({2})  # the first of them left a copy behind
    assert m.copy_counts() == {1: 1}


def test_variants_follow_visible_copies_and_first_id() -> None:
    m = VllmPoolModel(cfg(capacity=4), variant=PoolVariant(first_event_id=1, store_copies=False, remove_copies=False))
    assert brief(m.apply(use(1, 2)).events) == [(1, "device", "stored", [1, 2], None)]
    m.apply(deref(2, 1))
    m.apply(use(1, "c"))
    assert m.apply(promote("c", 2, 1)).events == []  # the copy is cached silently
    m.apply(deref("c", 1))
    step = m.apply(use("p", "q", "r"))
    assert brief(step.events) == [(2, "device", "removed", [2], None)]  # only the last copy is reported


def test_capacity_is_all_or_nothing_and_pinned_hits_are_not_evictable() -> None:
    m = VllmPoolModel(cfg(capacity=3))
    m.apply(use(1, 2))
    m.apply(deref(2, 1))
    before = m.fingerprint()
    step = m.apply(use(1, 2, 3, "a"))  # hits 1, 2 (pinned); 3 and a need 2 blocks, 1 free
    assert step.result.status == "capacity" and step.result.value == 0 and step.events == []
    assert m.fingerprint() == before
    assert m.apply(use(1, 2, 3)).result.status == "ok"


@pytest.mark.parametrize(
    ("op", "rule"),
    [
        (deref(9), RuleId.DEREF_UNKNOWN),
        (deref("nope"), RuleId.DEREF_UNKNOWN),
        (promote("nope", 5, None), RuleId.PROMOTE_UNKNOWN),
        (use("a", 1), RuleId.USE_VALIDATE),
        (use("a", "a"), RuleId.USE_PARTIAL),
        (Use(blocks=[FullBlock(full=1)], plhs=[]), RuleId.USE_VALIDATE),
        (Use(blocks=[FullBlock(full=1)], plhs=[Plh(hash=1)], token_ids=[[1, 2]]), RuleId.USE_VALIDATE),
        (Tick(now_ms=1.0), RuleId.USE_VALIDATE),
    ],
)
def test_invalid_operations_raise_their_rule_and_change_nothing(op: Operation, rule: RuleId) -> None:
    m = VllmPoolModel(cfg(capacity=4))
    m.apply(use(1, "held"))
    m.apply(use(2))
    m.apply(deref(2))
    before = m.fingerprint()
    with pytest.raises(InvalidOperation) as e:
        m.apply(op)
    assert e.value.rule == rule
    assert m.fingerprint() == before


def test_promote_twice_is_rejected() -> None:
    m = VllmPoolModel(cfg())
    m.apply(use("a"))
    m.apply(promote("a", 5, None))
    with pytest.raises(InvalidOperation) as e:
        m.apply(promote("a", 6, None))
    assert e.value.rule == RuleId.PROMOTE_UNKNOWN


def test_reset_needs_every_block_free_then_clears_once() -> None:
    m = VllmPoolModel(cfg())
    m.apply(use(1, "a"))
    assert m.apply(Reset()).result.value is False  # CLEAR-ALL: a block is in use
    m.apply(deref("a", 1))
    step = m.apply(Reset())
    assert step.result.value is True
    assert brief(step.events) == [(1, "device", "cleared", [], None)]
    assert m.registered() == set() and counters(m) == (0, 0, 0, 4)
    assert m.apply(use(1)).events[0].hashes() == [1]  # Stored again: the cache was cleared


def host_blocks(*seqs: int) -> list[HostBlock]:
    return [HostBlock(s, s + 1000, i) for i, s in enumerate(seqs)]


def test_host_write_through_stores_missing_runs_anchored_to_the_block_before() -> None:
    m = VllmPoolModel(cfg(), host_blocks=4)
    ev = m.host_write_through(host_blocks(1, 2))
    assert brief(ev) == [(0, "host_pinned", "stored", [1, 2], None)]
    assert ev[0].data.stored.start_position == 0  # type: ignore[union-attr]
    assert m.host is not None
    del m.host.entries[2]  # a gap inside a prefix that is otherwise on the host
    ev = m.host_write_through(host_blocks(1, 2, 3))
    assert brief(ev) == [(1, "host_pinned", "stored", [2, 3], 1)]
    assert ev[0].data.stored.start_position == 1  # type: ignore[union-attr]
    m.host.entries.pop(2)
    ev = m.host_write_through(host_blocks(1, 2, 3, 4))  # missing 2 and 4: two runs
    assert brief(ev) == [(2, "host_pinned", "stored", [2], 1), (3, "host_pinned", "stored", [4], 3)]


def test_host_evicts_oldest_batch_leaf_first_and_refresh_protects() -> None:
    m = VllmPoolModel(cfg(), host_blocks=4)
    m.host_write_through(host_blocks(10, 11))
    m.host_write_through(host_blocks(20, 21))
    assert m.host_write_through(host_blocks(10, 11)) == []  # present: refreshed only
    ev = m.host_write_through(host_blocks(30))
    assert brief(ev) == [(2, "host_pinned", "removed", [21], None), (3, "host_pinned", "stored", [30], None)]
    ev = m.host_write_through(host_blocks(40, 41))  # oldest batch now (10, 11), then 20
    assert brief(ev)[0] == (4, "host_pinned", "removed", [20, 11], None)


def test_host_hash_order_variant_and_batches_that_do_not_fit() -> None:
    m = VllmPoolModel(cfg(), host_blocks=3, variant=PoolVariant(host_order="hash"))
    m.host_write_through(host_blocks(7, 3, 9))
    ev = m.host_write_through(host_blocks(50, 51))
    assert brief(ev)[0] == (1, "host_pinned", "removed", [3, 7], None)  # ascending hash, not leaf first
    assert m.host_write_through(host_blocks(60, 61, 62, 63)) == []  # larger than the tier: not stored
    assert m.registered("host_pinned") == {9, 50, 51}


def test_host_refreshes_present_blocks_deepest_first_before_storing_the_rest() -> None:
    # what the wheel was seen to do: a request finding blocks 1, 2 on the host and storing 3, 4
    # evicts later in the order 2, 1 (refreshed deepest first), then the new batch
    for order, batch_order in (("leaf_first", [40, 30]), ("hash", [30, 40])):
        m = VllmPoolModel(cfg(), host_blocks=8, variant=PoolVariant(host_order=order))  # type: ignore[arg-type]
        m.host_write_through([HostBlock(10, 0, 0), HostBlock(20, 0, 1)])
        m.host_write_through([HostBlock(10, 0, 0), HostBlock(20, 0, 1), HostBlock(30, 0, 2), HostBlock(40, 0, 3)])
        assert m.host is not None
        assert m.host.victims_order() == [20, 10, *batch_order]


def test_host_refresh_happens_even_when_the_batch_does_not_fit() -> None:
    m = VllmPoolModel(cfg(), host_blocks=3)
    m.host_write_through(host_blocks(1))
    m.host_write_through(host_blocks(5, 6))
    assert m.host_write_through(host_blocks(1, 2, 3, 4)) == []  # 3 missing, only 2 evictable: not stored
    assert m.host is not None and m.host.victims_order() == [6, 5, 1]  # but 1 was refreshed by the lookup


def test_promoted_block_is_not_freed_by_its_hash_while_held_by_uuid() -> None:
    """A promoted block is held under its uuid: naming its hash in a Deref
    would free the one physical block twice (DEREF-UNKNOWN). Before the fix
    the hash Deref took that owner, so the uuid Deref left the copy with -1
    owners."""
    m = VllmPoolModel(cfg())
    m.apply(use("a"))
    m.apply(promote("a", 5, None))
    before = m.fingerprint()
    with pytest.raises(InvalidOperation) as e:
        m.apply(deref(5, "a"))
    assert e.value.rule == RuleId.DEREF_UNKNOWN
    assert m.fingerprint() == before
    m.apply(deref("a"))
    assert counters(m) == (0, 0, 1, 3)


def test_hash_deref_takes_a_hit_owner_and_leaves_the_uuid_owner() -> None:
    """Another request's prefix hit on a promoted copy is an owner the hash
    may release; the promoting request's own owner stays with its uuid, so
    the copy is never evicted while that uuid is held."""
    m = VllmPoolModel(cfg(capacity=2))
    m.apply(use("a"))
    m.apply(promote("a", 5, None))
    m.apply(use(5))  # a prefix hit on the promoted copy: 2 owners
    m.apply(deref(5))  # the hit's owner goes, the uuid's stays
    with pytest.raises(InvalidOperation) as e:
        m.apply(deref(5))
    assert e.value.rule == RuleId.DEREF_UNKNOWN
    assert m.apply(use(6, 7)).result.status == "capacity"  # copy 5 is still held: one block free
    assert m.apply(Reset()).result.value is False
    m.apply(deref("a"))
    assert m.apply(Reset()).result.value is True
