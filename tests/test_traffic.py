"""The traffic generator: its blocks are real token blocks with Dynamo's
hashes, its operations are valid for each profile (and its invalid ones are
rejected with the intended rule, changing nothing), its bookkeeping matches
the model's owners, and its mix actually produces shared prefixes, hits,
evictions, exhaustion and promotions."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.adapters.reference.adapter import outcome_of
from kvspec.conformance.block.traffic import (
    BRANCH,
    PALETTE,
    Digits,
    Planned,
    TokenTree,
    Traffic,
    TrafficError,
    configs,
    palette_tokens,
)
from kvspec.reference import make_model
from kvspec.spec.config import ManagerConfig
from kvspec.spec.hashing import local_block_hash, sequence_hash
from kvspec.spec.wire import Counters, Deref, FullBlock, OpResult, PartialBlock, Promote, StepOutcome, Use


def test_tree_blocks_carry_dynamo_hashes_of_their_tokens() -> None:
    tree = TokenTree(block_size=4)
    a = tree.child(None, 0)
    b = tree.child(a, 0)
    assert a.tokens == palette_tokens(0, 4) and len(a.tokens) == 4
    assert a.local == local_block_hash(list(a.tokens)) and a.seq == a.local  # a root's sequence hash
    assert b.seq == sequence_hash(a.seq, b.local) and b.parent == a.seq and b.position == 1
    assert (b.lineage.hash, b.lineage.parent, b.lineage.position) == (b.seq, a.seq, 1)
    # the same tokens under another parent: same local hash, another sequence hash
    other_root = tree.child(None, len(tree.roots) + 1)  # palette entry 1
    assert other_root.seq != a.seq
    c = tree.child(other_root, len(other_root.children) + 0)  # palette entry 0 below it
    assert c.tokens == b.tokens and c.local == b.local and c.seq != b.seq


def test_tree_choices_reuse_existing_children_first() -> None:
    tree = TokenTree(block_size=2)
    first = tree.child(None, 0)
    assert tree.child(None, 0) is first  # choice 0 with one child: that child
    second = tree.child(None, 1 + 3)  # past the children: palette entry 3
    assert second.tokens == palette_tokens(3, 2) and tree.roots == [first.seq, second.seq]
    assert tree.child(None, 1) is second
    # a palette entry equal to an existing child's tokens is that child
    assert tree.child(None, 2 + 0) is first
    sib = tree.sibling(first)
    assert sib.position == first.position and sib.seq != first.seq
    assert len(BRANCH) == 10 and max(BRANCH) < PALETTE


def test_digits_decode_least_significant_first() -> None:
    d = Digits(1 + 2 * 3 + 5 * 3 * 4)
    assert (d.take(3), d.take(4), d.take(7), d.take(9)) == (1, 2, 5, 0)
    assert Digits(0).branches(1, 6) == [0]


def _check_op(t: Traffic, planned: Planned) -> None:
    """Shape rules every generated operation keeps."""
    op = planned.op
    legacy = t.profile == "legacy"
    if isinstance(op, Use) and planned.expect_error is None:
        fulls = [b.full for b in op.blocks if isinstance(b, FullBlock)]
        assert [p.hash for p in op.plhs] == fulls
        if legacy:
            assert len(op.local_hashes) == len(fulls) and op.parent is None
        if t.profile == "atomic":
            assert len({p.position for p in op.plhs}) == len(op.plhs)
        for i, p in enumerate(op.plhs):
            if op.local_hashes:
                assert p.hash == sequence_hash(p.parent, op.local_hashes[i])
            if op.token_ids is not None:
                assert op.local_hashes and op.local_hashes[i] == local_block_hash(op.token_ids[i])
                assert len(op.token_ids[i]) == t.config.block_size
            if i and len(set(fulls)) == len(fulls):  # a chain (a fork repeats blocks)
                assert p.parent == op.plhs[i - 1].hash and p.position == op.plhs[i - 1].position + 1
        if isinstance(op.parent, FullBlock) and op.plhs:
            assert op.plhs[0].parent == op.parent.full  # chunked prefill anchors to the block before
    if isinstance(op, Promote) and planned.expect_error is None:
        assert op.seq_hash == sequence_hash(op.parent_hash, op.local_hash)
        assert op.plh.hash == op.seq_hash and op.plh.parent == op.parent_hash
        if op.token_ids is not None:
            assert op.local_hash == local_block_hash(op.token_ids)


def _plan(t: Traffic, rng: random.Random) -> Planned | None:
    """One action, picked like the machine does (plain random here)."""
    c = lambda: rng.randrange(256)  # noqa: E731
    br = lambda lo, hi: [rng.choice(BRANCH) for _ in range(rng.randint(lo, hi))]  # noqa: E731
    options: list[Any] = [lambda: t.new_request(br(1, 6), rng.random() < 0.5, rng.randrange(3))] * 4
    if t.extendable():
        options += [lambda: t.extend(t.pick(t.extendable(), c()), br(0, 4), rng.random() < 0.5)] * 3
    if t.promotable():
        options += [lambda: t.promote(t.pick(t.promotable(), c()), rng.choice([0, 0, 1, 5]))] * 3
    if t.requests:
        options += [lambda: t.finish(t.pick(t.requests, c()), rng.random() < 0.25)] * 3
    if t.holding():
        options.append(lambda: t.preempt(t.pick(t.holding(), c())))
    if t.preempted():
        options += [lambda: t.readmit(t.pick(t.preempted(), c()), rng.random() < 0.5)] * 2
    if t.profile != "atomic":
        options.append(lambda: t.fork(br(2, 4), rng.randrange(3)))
    if t.destroyable():
        options.append(lambda: t.destroy(t.pick(t.destroyable(), c())))
    if t.invalid_kinds:
        options.append(lambda: t.invalid(c(), br(1, 4), c()))
    return rng.choice(options)()


def drive(profile: str, policy: str, capacity: int, seed: int, steps: int) -> Counter[str]:
    """Run generated traffic straight into the reference model, checking the
    traffic's invariants after every step; returns what happened."""
    config = ManagerConfig(profile=profile, capacity=capacity, block_size=4, eviction=policy)  # type: ignore[arg-type]
    model = make_model(config)
    t = Traffic(config)
    rng = random.Random(seed)
    seen: Counter[str] = Counter()
    for _ in range(steps):
        planned = _plan(t, rng)
        if planned is None:
            continue
        _check_op(t, planned)
        before: Counters = model.counters()
        fp = model.fingerprint()
        registered = model.registered()
        out: StepOutcome = outcome_of(model, planned.op)
        planned.commit(out, before)  # raises TrafficError on a rejected valid op / accepted invalid op
        seen[planned.kind.split(":")[0]] += 1
        if planned.expect_error is not None:
            assert model.fingerprint() == fp, "a rejected operation changed the model"
            seen[f"rejected {out.error.rule}"] += 1  # type: ignore[union-attr]
        if isinstance(planned.op, Deref) and planned.kind in ("finish", "preempt"):
            seen["deref"] += 1
        if isinstance(planned.op, Use) and out.result is not None:
            fulls = [b.full for b in planned.op.blocks if isinstance(b, FullBlock)]
            seen["hit"] += sum(1 for f in fulls if f in registered)
            if out.result.status == "capacity":
                seen["exhausted"] += 1
            if isinstance(planned.op.parent, FullBlock):
                seen["anchored chunk"] += 1
        if isinstance(planned.op, Promote) and out.error is None:
            seen["promote existing" if planned.op.seq_hash in registered else "promote new"] += 1
        seen["removed"] += sum(1 for e in out.events if e.kind == "removed")
        # the scheduler's bookkeeping is the model's state
        assert t.holds() == model.owners()  # type: ignore[attr-defined]
        partials = {r.partial for r in t.requests if r.partial is not None}
        held = (
            {k[1] for k in model.active if k[0] == "P"}  # type: ignore[attr-defined]
            if profile == "legacy"
            else set(model.partial)  # type: ignore[attr-defined]
        )
        assert partials == held
    return seen


@pytest.mark.parametrize("profile", ["kvbm", "atomic", "legacy"])
@given(seed=st.integers(0, 2**32 - 1), capacity=st.integers(4, 16))
@settings(max_examples=25, deadline=None)
def test_generated_traffic_is_valid_and_tracked(profile: str, seed: int, capacity: int) -> None:
    policy = "lru" if profile == "legacy" else random.Random(seed).choice(["lineage", "lru", "multi_lru"])
    drive(profile, policy, capacity, seed, steps=60)


@pytest.mark.parametrize("profile", ["kvbm", "atomic", "legacy"])
def test_traffic_mix_produces_what_the_rules_need(profile: str) -> None:
    """Fixed seeds, counted outcomes: shared prefixes hit, small capacities
    evict and run out, partial blocks get promoted (into new and existing
    blocks), chunks anchor to their parent, requests are preempted and come
    back, invalid operations are rejected."""
    total: Counter[str] = Counter()
    for seed in range(6):
        total += drive(profile, "lru", capacity=6 + seed, seed=seed, steps=150)
    for key in (
        "hit",
        "removed",
        "exhausted",
        "promote new",
        "promote existing",
        "finish",
        "preempt",
        "readmit",
        "extend",
        "deref",
    ):
        assert total[key] > 0, f"{profile}: no {key} in {dict(total)}"
    rejected = [k for k in total if k.startswith("rejected ")]
    assert len(rejected) >= 2, rejected
    if profile != "legacy":
        assert total["anchored chunk"] > 0
        assert total["rejected DEREF-UNKNOWN"] > 0
    if profile != "atomic":
        assert total["fork"] > 0
    if profile == "legacy":
        assert total["destroy"] > 0


def test_invalid_traffic_that_the_model_accepts_is_a_generator_error() -> None:
    """The commit of an invalid operation refuses an accepting outcome (so a
    generator bug cannot pass silently as 'valid traffic')."""
    t = Traffic(ManagerConfig(profile="kvbm", capacity=4))
    planned = t.invalid(t.invalid_kinds.index("deref_unknown"), [0], 0)
    accepted = StepOutcome(
        result=OpResult(), counters=Counters(active_blocks=0, active_refs=0, inactive_blocks=0, free_blocks=4)
    )
    with pytest.raises(TrafficError, match="accepted by the model"):
        planned.commit(accepted, accepted.counters)


def test_finish_derefs_leaf_first_and_partial_first() -> None:
    t = Traffic(ManagerConfig(profile="kvbm", capacity=8))
    model = make_model(t.config)
    planned = t.new_request([0, 0, 0], True, 0)
    before = model.counters()
    planned.commit(outcome_of(model, planned.op), before)
    req = t.requests[0]
    fin = t.finish(req, forward=False)
    assert fin is not None
    assert isinstance(fin.op, Deref)
    refs = fin.op.blocks
    assert isinstance(refs[0], PartialBlock) and [cast(FullBlock, b).full for b in refs[1:]] == [
        n.seq for n in reversed(req.path)
    ]


def test_configs_are_small_and_cover_the_policies() -> None:
    seen: set[str] = set()

    @given(configs("kvbm", ("lineage", "lru")))
    @settings(max_examples=40, deadline=None)
    def check(c: ManagerConfig) -> None:
        assert 4 <= c.capacity <= 16 and c.profile == "kvbm"
        seen.add(c.eviction)

    check()
    assert seen == {"lineage", "lru"}


def test_no_promote_capability_means_no_promote_in_invalid_traffic() -> None:
    assert "promote_unknown" in Traffic(ManagerConfig(capacity=4)).invalid_kinds
    assert "promote_unknown" not in Traffic(ManagerConfig(capacity=4), promote=False).invalid_kinds
