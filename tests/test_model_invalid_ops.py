"""Invalid operations never change the model's state (USE-VALIDATE,
DEREF-UNKNOWN, PROMOTE-UNKNOWN, DESTROY-ACTIVE): a rejected operation raises
InvalidOperation with a rule id and leaves the state exactly as it was."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.reference import make_model
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Deref, Destroy, FullBlock, Operation, PartialBlock, Plh, Promote, Use

BS = 4
UNIVERSE = range(8)
UUIDS = ["a", "b", "c"]


def plh(s: int) -> Plh:
    pos = s % 4
    return Plh(hash=s, parent=s - 1 if pos else None, position=pos)


def toks(s: int) -> list[int]:
    return [s, s, s, s]


@st.composite
def use_ops(draw: st.DrawFn, profile: str) -> Use:
    fulls = draw(st.lists(st.sampled_from(list(UNIVERSE)), max_size=5, unique=profile == "atomic"))
    if profile == "atomic":  # one block per position in a batch
        seen: set[int] = set()
        fulls = [s for s in fulls if s % 4 not in seen and not seen.add(s % 4)]  # type: ignore[func-returns-value]
    blocks: list[Any] = [FullBlock(full=s) for s in fulls]
    if draw(st.booleans()):
        blocks.append(PartialBlock(partial=draw(st.sampled_from(UUIDS))))
    plhs = [plh(s) for s in fulls]
    local = [1000 + s for s in fulls] if profile == "legacy" or draw(st.booleans()) else []
    token_ids = [toks(s) for s in fulls] if draw(st.booleans()) else None
    # malformations, each drawn rarely
    kind = draw(st.sampled_from(["ok"] * 6 + ["plhs", "local", "tokens", "short", "parent", "identity"]))
    if kind == "plhs":
        plhs = [*plhs, plh(7)]
    elif kind == "local":
        local = [*local, 1] if local else [1]
    elif kind == "tokens":
        token_ids = [*(token_ids or []), [1, 2, 3, 4]]
    elif kind == "short" and fulls:
        token_ids = [[1]] * len(fulls)
    elif kind == "identity" and fulls:
        plhs = [Plh(hash=999, position=3), *plhs[1:]]
    parent = PartialBlock(partial="a") if kind == "parent" else None
    return Use(blocks=blocks, plhs=plhs, local_hashes=local, token_ids=token_ids, parent=parent)


@st.composite
def any_op(draw: st.DrawFn, profile: str) -> Any:
    which = draw(st.sampled_from(["use", "use", "deref", "promote", "destroy"]))
    if which == "use":
        return draw(use_ops(profile))
    refs = draw(
        st.lists(
            st.one_of(
                st.builds(FullBlock, full=st.sampled_from(list(UNIVERSE))),
                st.builds(PartialBlock, partial=st.sampled_from(UUIDS)),
            ),
            min_size=1,
            max_size=4,
        )
    )
    if which == "deref":
        return Deref(blocks=refs)
    if which == "destroy":
        return Destroy(blocks=refs)
    s = draw(st.sampled_from(list(UNIVERSE)))
    return Promote(
        uuid=draw(st.sampled_from(UUIDS)),
        seq_hash=s,
        parent_hash=s - 1 if s % 4 else None,
        local_hash=1000 + s,
        plh=plh(s),
        token_ids=toks(s) if draw(st.booleans()) else None,
    )


@settings(max_examples=200, deadline=None)  # a step budget, not a timing claim: no deadline under load
@given(st.data())
def test_rejected_operations_change_nothing(data: st.DataObject) -> None:
    profile: Any = data.draw(st.sampled_from(["kvbm", "atomic", "legacy"]), label="profile")
    policy: Any = "lru" if profile == "legacy" else data.draw(st.sampled_from(["lineage", "lru", "multi_lru"]))
    cfg = ManagerConfig(profile=profile, capacity=data.draw(st.integers(2, 6)), block_size=BS, eviction=policy)
    model = make_model(cfg)
    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        held: list[Any] = sorted(model.owners())  # type: ignore[attr-defined]
        if held and bool(data.draw(st.booleans())):
            # a Deref that starts with blocks really held, then maybe one that is not:
            # the valid prefix must not be applied when the tail is rejected
            refs: list[Any] = [FullBlock(full=s) for s in data.draw(st.lists(st.sampled_from(held), min_size=1))]
            if data.draw(st.booleans()):
                refs.append(data.draw(st.sampled_from([FullBlock(full=7), PartialBlock(partial="zz")])))
            op: Operation = Deref(blocks=refs)
        else:
            op = data.draw(any_op(profile))
        before = model.fingerprint()
        try:
            model.apply(op)
        except InvalidOperation as e:
            assert isinstance(e.rule, RuleId)
            assert model.fingerprint() == before, f"{op!r} was rejected under {e.rule} but changed the state"


MALFORMED = [
    ("plh count", Use(blocks=[FullBlock(full=1)], plhs=[]), RuleId.USE_VALIDATE),
    ("local hash count", Use(blocks=[FullBlock(full=1)], plhs=[plh(1)], local_hashes=[1, 2]), RuleId.USE_VALIDATE),
    (
        "token id count",
        Use(blocks=[FullBlock(full=1), FullBlock(full=2)], plhs=[plh(1), plh(2)], token_ids=[toks(1)]),
        RuleId.USE_VALIDATE,
    ),
    ("short block", Use(blocks=[FullBlock(full=1)], plhs=[plh(1)], token_ids=[[1, 2]]), RuleId.USE_VALIDATE),
    (
        "partial parent",
        Use(blocks=[FullBlock(full=1)], plhs=[plh(1)], parent=PartialBlock(partial="a")),
        RuleId.USE_VALIDATE,
    ),
    ("unknown deref", Deref(blocks=[FullBlock(full=5)]), RuleId.DEREF_UNKNOWN),
    ("deref of inactive", Deref(blocks=[FullBlock(full=0)]), RuleId.DEREF_UNKNOWN),
    ("double deref", Deref(blocks=[FullBlock(full=2), FullBlock(full=2)]), RuleId.DEREF_UNKNOWN),
    ("unknown partial deref", Deref(blocks=[PartialBlock(partial="zz")]), RuleId.DEREF_UNKNOWN),
    ("unknown promote", Promote(uuid="zz", seq_hash=9, plh=plh(1)), RuleId.PROMOTE_UNKNOWN),
    ("identity clash", Use(blocks=[FullBlock(full=2)], plhs=[Plh(hash=77, position=0)]), RuleId.USE_VALIDATE),
    ("destroy in kvbm", Destroy(blocks=[FullBlock(full=2)]), RuleId.DESTROY_ACTIVE),
]


@pytest.mark.parametrize(("name", "op", "rule"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_each_malformation_is_rejected_with_its_rule(name: str, op: Operation, rule: RuleId) -> None:
    model = make_model(ManagerConfig(capacity=4, block_size=BS))
    model.apply(Use(blocks=[FullBlock(full=0), FullBlock(full=1), FullBlock(full=2)], plhs=[plh(0), plh(1), plh(2)]))
    model.apply(Deref(blocks=[FullBlock(full=0)]))  # 0 inactive, 1 and 2 active once... 0 was deref'd
    before = model.fingerprint()
    with pytest.raises(InvalidOperation) as e:
        model.apply(op)
    assert e.value.rule == rule
    assert model.fingerprint() == before


def test_legacy_rejects_destroy_of_an_inactive_block_and_ignores_unknown_deref() -> None:
    model = make_model(ManagerConfig(profile="legacy", capacity=4, block_size=BS, eviction="lru"))
    model.apply(Use(blocks=[FullBlock(full=1)], local_hashes=[11]))
    model.apply(Deref(blocks=[FullBlock(full=1)]))
    before = model.fingerprint()
    with pytest.raises(InvalidOperation) as e:
        model.apply(Destroy(blocks=[FullBlock(full=1)]))
    assert e.value.rule == RuleId.DESTROY_ACTIVE and model.fingerprint() == before
    model.apply(Deref(blocks=[FullBlock(full=42)]))  # legacy: silently ignored
    assert model.fingerprint() == before
