"""Eviction policies (EVICT-POLICY) in isolation: which block goes next."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvspec.reference.policies import LineagePolicy, LruPolicy, MultiLruPolicy, UnorderedPolicy, make_policy


def chain(policy: LineagePolicy, ids: list[int], parent_of: dict[int, int | None], pos: dict[int, int]) -> None:
    for i in ids:
        p = parent_of[i]
        policy.insert(i, (pos[i], i), None if p is None else (pos[i] - 1, p), 1)


def test_lru_evicts_least_recently_inactivated() -> None:
    p = LruPolicy()
    for s in (3, 1, 2):
        p.insert(s, (0, s), None, 1)
    assert p.allowed() == [3]
    p.remove(3)  # a hit takes it out; its later deref makes it newest
    p.insert(3, (0, 3), None, 1)
    assert p.victim() == 1
    p.evict(1)
    assert list(p) == [2, 3]


def test_unordered_allows_every_inactive_block() -> None:
    p = UnorderedPolicy()
    for s in (5, 6, 7):
        p.insert(s, (0, s), None, 1)
    assert sorted(p.allowed()) == [5, 6, 7]
    assert p.victim() == 5


def test_multi_lru_coldest_level_first() -> None:
    p = MultiLruPolicy()
    p.insert(1, (0, 1), None, 20)  # level 3
    p.insert(2, (0, 2), None, 3)  # level 1
    p.insert(3, (0, 3), None, 1)  # level 0
    p.insert(4, (0, 4), None, 8)  # level 2
    order = []
    while len(p):
        v = p.victim()
        assert v is not None
        order.append(v)
        p.evict(v)
    assert order == [3, 2, 4, 1]


def test_multi_lru_levels_follow_thresholds() -> None:
    assert [MultiLruPolicy.level(n) for n in (0, 2, 3, 7, 8, 14, 15, 100)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_lineage_only_leaves_are_evicted_oldest_first() -> None:
    p = LineagePolicy()
    # 0 <- 1 <- 2 and 0 <- 3; inserted leaf-first like a request freeing in reverse
    parent_of = {0: None, 1: 0, 2: 1, 3: 0}
    pos = {0: 0, 1: 1, 2: 2, 3: 1}
    chain(p, [2, 1, 3, 0], parent_of, pos)
    assert p.allowed() == [2]
    p.evict(2)
    # 1 becomes a leaf again but keeps the tick it got when it entered the pool
    assert p.victim() == 1
    p.evict(1)
    assert p.victim() == 3
    p.evict(3)
    assert p.victim() == 0


def test_lineage_reactivated_parent_stays_as_ghost_and_blocks_nothing() -> None:
    p = LineagePolicy()
    parent_of = {0: None, 1: 0, 2: 1}
    pos = {0: 0, 1: 1, 2: 2}
    chain(p, [2, 1, 0], parent_of, pos)
    p.remove(1)  # hit: 1 leaves the pool but 2 still hangs below it
    assert 1 not in p and p.ghosts() == [(1, 1)]
    assert p.victim() == 2  # 0 is not a leaf: the ghost 1 is its child
    p.evict(2)
    assert p.ghosts() == []  # the ghost went with its last child
    assert p.victim() == 0


def test_lineage_missing_parent_is_a_ghost() -> None:
    p = LineagePolicy()
    p.insert(5, (3, 5), (2, 4), 1)
    assert p.ghosts() == [(2, 4)]
    p.insert(4, (2, 4), (1, 3), 1)  # the parent arrives: a ghost becomes real, keeping its child
    assert p.victim() == 5
    p.evict(5)
    assert p.victim() == 4


def test_lineage_ties_break_on_position_then_hash_only_when_ticks_equal() -> None:
    p = LineagePolicy()
    for s in (9, 8, 7):
        p.insert(s, (0, s), None, 1)
    assert p.victim() == 9  # ticks are unique: insertion order decides


@given(st.lists(st.tuples(st.sampled_from(["ins", "hit", "evict"]), st.integers(0, 11)), max_size=80))
def test_lineage_victim_is_always_a_real_leaf(script: list[tuple[str, int]]) -> None:
    # a fixed forest of 12 nodes: node i's parent is (i - 1) // 2. As in real
    # traffic a block is registered only while its parent is registered
    # (inactive here, or active = taken out by a hit), so every link is known;
    # a hit takes the whole prefix out of the pool (a prefix match cannot skip
    # a block), and a request gives its blocks back tail first (a held block
    # returns only once the blocks it holds below it have).
    p = LineagePolicy()
    inside: set[int] = set()
    active: set[int] = set()
    for action, n in script:
        registered_parent = n == 0 or ((n - 1) // 2) in inside | active
        held_below = any(_is_descendant(k, n) for k in active)
        if action == "ins" and n not in inside and registered_parent and not held_below:
            active.discard(n)
            par = (n - 1) // 2 if n else None
            depth = 0 if n == 0 else len(bin(n + 1)) - 3
            p.insert(n, (depth, n), None if par is None else (depth - 1, par), 1)
            inside.add(n)
        elif action == "hit" and n in inside:
            for k in _prefix(n):
                if k in inside:
                    p.remove(k)
                    inside.discard(k)
                    active.add(k)
        elif action == "evict":
            v = p.victim()
            if v is None:
                assert not inside
                continue
            assert v in inside
            kids = {2 * v + 1, 2 * v + 2}
            # no inactive descendant may remain below an evicted block
            below = {k for k in inside if _is_descendant(k, v)}
            assert not below, (v, below, kids)
            p.evict(v)
            inside.discard(v)
            # an evicted block's active descendants would be orphans: the
            # scheduler holds prefixes, so drop them from the script's world
            active -= {k for k in active if _is_descendant(k, v)}
        assert set(p) == inside


def _prefix(n: int) -> list[int]:
    """``n`` and its ancestors in the script's forest, root first."""
    chain = [n]
    while chain[-1] > 0:
        chain.append((chain[-1] - 1) // 2)
    return chain[::-1]


def _is_descendant(k: int, v: int) -> bool:
    while k > v:
        k = (k - 1) // 2
        if k == v:
            return True
    return False


def test_make_policy_rejects_unknown_names() -> None:
    import pytest

    from kvspec.spec.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown eviction policy 'fifo'"):
        make_policy("fifo")
