"""The hash checks of engine streams (kvspec/streams/hashcheck.py), one
situation each: what a block's hashes must follow from, and when the
checker cannot know and must stay silent."""

from __future__ import annotations

from kvspec.spec.hashing import (
    chain,
    local_block_hash,
    local_hashes,
    vllm_block_hash,
    vllm_external,
    vllm_none_hash,
)
from kvspec.spec.rules import RuleId
from kvspec.streams.hashcheck import LEARN_LIMIT, HashCheck, StoredMeta

KEY = (1, 0, "device")


def rules(problems: list | None) -> list[RuleId]:
    return [p[0] for p in problems or []]


def test_dynamo_chain_from_tokens_hash() -> None:
    hc = HashCheck("auto")
    h1 = chain(None, 11)
    h2 = chain(h1, 12)
    assert hc.stored(KEY, None, [h1, h2], [11, 12], None, None) is None
    assert rules(hc.stored(KEY, h2, [chain(h2, 13) ^ 1], [13], None, None)) == [RuleId.HASH_SEQUENCE]
    assert HashCheck("none").stored(KEY, h2, [5], [13], None, None) is None


def test_eagle_block_is_checked_when_its_next_token_arrives() -> None:
    toks = list(range(1, 13))  # three blocks of 4
    loc = local_hashes(toks, 4, is_eagle=True)  # two complete Eagle windows (the third needs token 13)
    hc = HashCheck("none", is_eagle=True)
    # kvspec-style events with tokens and tokens hashes: the first carries blocks 0 and 1
    h0, h1 = 100, 101
    assert hc.stored(KEY, None, [h0, h1], [loc[0], loc[1]], [toks[0:4], toks[4:8]], None) is None
    assert h1 in hc.pending[KEY]  # block 1's window needs block 2's first token
    # block 2 arrives under block 1: block 1 is checked now, and is right
    assert hc.stored(KEY, h1, [102], [0], [toks[8:12]], None) is None
    assert h1 not in hc.pending[KEY]
    # a wrong tokens_hash on a block whose window is complete in its own event
    bad = HashCheck("none", is_eagle=True)
    assert rules(bad.stored(KEY, None, [h0, h1], [loc[0] ^ 1, loc[1]], [toks[0:4], toks[4:8]], None)) == [
        RuleId.STORE_TOKENS_HASH
    ]
    # a pending block that leaves the view is forgotten
    bad.gone(KEY, [h1])
    assert h1 not in bad.pending[KEY]
    # a wrong tokens_hash on the block that waited for its next token shows when the token comes
    late = HashCheck("none", is_eagle=True)
    assert late.stored(KEY, None, [h0, h1], [loc[0], loc[1] ^ 1], [toks[0:4], toks[4:8]], None) is None
    assert rules(late.stored(KEY, h1, [102], [0], [toks[8:12]], None)) == [RuleId.STORE_TOKENS_HASH]


def test_vllm_feed_with_byte_hashes_needs_no_seed_below_the_root() -> None:
    none = vllm_none_hash("sha256")
    f1 = vllm_block_hash("sha256", none, [1, 2], None)
    f2 = vllm_block_hash("sha256", f1, [3, 4], None)
    hc = HashCheck("vllm-sha256", vllm_seed="some-other-seed")  # the root cannot be checked with it
    meta = StoredMeta(flat_tokens=[3, 4], block_size=2, full_hashes=[f2], full_parent=f1)
    assert hc.stored(KEY, vllm_external(f1), [vllm_external(f2)], None, None, meta) is None
    wrong = StoredMeta(flat_tokens=[3, 5], block_size=2, full_hashes=[f2], full_parent=f1)
    assert rules(hc.stored(KEY, vllm_external(f1), [vllm_external(f2)], None, None, wrong)) == [RuleId.HASH_SEQUENCE]


def test_tokens_per_block_against_block_size() -> None:
    hc = HashCheck("auto")
    meta = StoredMeta(flat_tokens=[1, 2, 3], block_size=2)
    assert rules(hc.stored(KEY, None, [5, 6], None, None, meta)) == [RuleId.STORE_TOKENS_HASH]


def test_learning_gives_up_with_a_warning() -> None:
    warnings: list[str] = []
    hc = HashCheck("auto", warn=warnings.append)
    for i in range(LEARN_LIMIT):
        meta = StoredMeta(flat_tokens=[i, i + 1], block_size=2)
        assert hc.stored(KEY, None, [i + 7], None, None, meta) is None  # nothing reproduces these: silent
    assert hc.scheme is None and len(warnings) == 1 and "not checked" in warnings[0]


def test_learning_finds_dynamo_and_then_checks() -> None:
    notes: list[str] = []
    hc = HashCheck("auto", note=notes.append)
    good = local_block_hash([1, 2])
    assert hc.stored(KEY, None, [good], None, None, StoredMeta(flat_tokens=[1, 2], block_size=2)) is None
    assert hc.learned == "dynamo" and "dynamo" in notes[0]
    bad = rules(hc.stored(KEY, good, [12345], None, None, StoredMeta(flat_tokens=[3, 4], block_size=2)))
    assert bad == [RuleId.HASH_SEQUENCE]
