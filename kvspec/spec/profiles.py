"""Profiles: the rule sets of known implementation generations, as data.

A profile says which rules apply to an implementation generation and which
protocol rules that generation is known to break (and when). The reference
model reproduces each profile's behaviour, breaks included, so that the suite
can tell which generation an implementation follows; the router view still
reports a known break, and the suite files it under the profile instead of
failing the implementation for it. SPEC.md ("Profiles") is the prose of this
table; a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kvspec.spec.rules import RuleId

R = RuleId


@dataclass(frozen=True, slots=True)
class BlockSemantics:
    """What the block-level profiles without an offload tier (kvbm, atomic, legacy) do differently, one
    field per difference, each with the SPEC.md rule it comes from. The z3 encodings of these profiles
    (``reference/smt/blocks/``) and their checks against the models test these traits, never a
    profile's name (issue 28): a new profile of the same shape declares its traits and is encoded, compared
    and sampled by them. Five of them restate a field of ``Profile`` in the encodings' terms (what a Use's
    steps and the compared state carry); ``Profile.__post_init__`` refuses a declaration where the two
    disagree."""

    #: STORE-NO-DUP (kvbm's known break), INV-KVBM-ANNOUNCED: each registered block carries an
    #: ``announced`` mark (the encoding's ``ann``); a block evicted and registered again in one batch is
    #: left unannounced, and its hits and its next eviction publish nothing
    announced_mark: bool
    #: STORE-NEW-ONLY, REMOVE-EXACT (legacy's known breaks), INV-LEGACY-ANNOUNCED: the blocks a Use that
    #: ran out of slots placed are kept but never Stored (the encoding's ``unann`` set)
    unannounced_set: bool
    #: USE-PARTIAL, DEREF-OWNER, DESTROY-ACTIVE: a partial block is a cache entry with an owner count (the
    #: encoding's ``pown``), active or inactive like a full block; without it a partial block is held
    #: once and its Deref frees its slot (DEREF-PARTIAL)
    partial_owners: bool
    #: COUNTERS: the model keeps a free-slot counter (the encoding's ``free``); without it the room left
    #: is the capacity less the entries
    free_counter: bool
    #: PARENT-ANCHOR, USE-VALIDATE: a Use may name the caller's parent block, which anchors its first Stored
    #: (``Profile.use_shape == "lineage"``); the hash cache's Use names none
    use_parent: bool
    #: DESTROY-ACTIVE: the profile takes Destroy (``"destroy" in Profile.operations``)
    destroy: bool
    #: USE-VALIDATE: a Use that names a partial block already held is refused before anything moves (the
    #: encoding's ``use(validate partial)`` steps)
    validates_held_partials: bool
    #: USE-CAPACITY, INV-ATOMIC-NO-HALF: a Use declares its whole batch and checks the room before it places
    #: any block (the encoding's DECLARE phase and ``use(check)``; ``Profile.use_all_or_nothing``)
    declares_batch: bool
    #: EVENT-ORDER, REMOVE-EXACT: a Use's evictions are published as one Removed after its Stored, so the
    #: hashes of a Use's Removed are compared with the model's (``Profile.removed_timing ==
    #: "after_stored"``); without it each eviction publishes its Removed at once
    removed_per_use: bool
    #: PARENT-ANCHOR, INV-ATOMIC-ANCHOR: a Use's Stored splits at each reused block into groups, each
    #: anchored to the block before it (``Profile.stored_grouping == "split_at_reuse"``), so the encoding
    #: carries the parent of every Stored it publishes (the caller's parent for a Use's first group, a
    #: Promote's parent) and the parents of a Use's Stored events, in order, are compared with the model's
    stored_parents: bool


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    title: str
    source: str
    use_result: Literal["count", "bool", "request"]
    use_all_or_nothing: bool
    stored_grouping: Literal["one_per_use", "split_at_reuse", "one_per_cache_call"]
    removed_timing: Literal["after_stored", "at_eviction", "lazy"]
    policies: tuple[str, ...]
    view_mode: Literal["set", "copies"]
    operations: tuple[str, ...]
    #: rules that do not apply to this profile at all (replaced or absent)
    not_applicable: frozenset[RuleId] = frozenset()
    #: protocol rules this generation is known to break, and when
    known_breaks: dict[RuleId, str] = field(default_factory=dict)
    #: the invariants only this profile has (the lockstep checks them on its steps as well as the common ones)
    own_invariants: frozenset[RuleId] = frozenset()
    #: the invariant its router-match check also is (every registered block announced), if it has one
    announced: RuleId | None = None
    #: a G2 (host-pinned) offload tier can be attached to its manager
    offload_tier: bool = False
    #: how a Use names its blocks: ``lineage`` (a parent lineage hash per block, the caller's parent, local
    #: hashes optional) or ``hash_cache`` (no parent, local hashes always given: the 1.0.2 hash cache)
    use_shape: Literal["lineage", "hash_cache"] = "lineage"
    #: the malformed Uses its source rejects under USE-VALIDATE (kinds of ``conformance.block.traffic``)
    invalid_uses: frozenset[str] = frozenset()
    #: of those, the ones only an adapter declaring ``strict_validation`` is sent (its source accepts them)
    strict_only_uses: frozenset[str] = frozenset()
    #: the traits the block encodings (``reference/smt/blocks/``) test, for a profile they encode
    blocks: BlockSemantics | None = None

    def __post_init__(self) -> None:
        if self.blocks is None:
            return
        said = {
            "use_parent": self.use_shape == "lineage",
            "destroy": "destroy" in self.operations,
            "declares_batch": self.use_all_or_nothing,
            "removed_per_use": self.removed_timing == "after_stored",
            "stored_parents": self.stored_grouping == "split_at_reuse",
        }
        wrong = sorted(k for k, v in said.items() if getattr(self.blocks, k) != v)
        if wrong:
            raise ValueError(f"profile {self.name!r}: its BlockSemantics contradict its rule table on {wrong}")

    def applies(self, rule: RuleId | str) -> bool:
        return RuleId(rule) not in self.not_applicable

    def known_break(self, rule: RuleId | str, policy: str | None = None) -> str | None:
        """The documented reason when this profile is known to break ``rule``."""
        reason = self.known_breaks.get(RuleId(rule))
        if reason is None:
            return None
        # ``policy`` is kept for callers: no break depends on it any more. The
        # lineage policy evicts leaves of the inactive forest only, but a held
        # (active) child is not in that forest, so its inactive parent is a
        # leaf and can go first: REMOVE-NO-ORPHAN is broken under every policy.
        del policy
        return reason


_ORPHAN = (
    "LRU-style policies evict by age, so a parent can go before its still-stored children; under "
    "lineage a parent whose children are all held (active, so not in the inactive forest) is a leaf "
    "and can be evicted under them"
)
#: the rules of the vLLM-style pool, which the G1 profiles do not have
_VLLM_ONLY = frozenset(
    {R.STORE_COPY, R.REMOVE_COPY, R.CLEAR_ALL, R.VLLM_PREFIX_HIT, R.VLLM_FREE_ORDER, R.VLLM_LAZY_REMOVE}
)
_INTERLEAVE = (
    "a batch whose reused block comes after a new block anchors the whole Stored to that "
    "later block, which is not the block before the first stored one"
)

KVBM = Profile(
    name="kvbm",
    title="kvbm mocker (kvbm-logical block manager)",
    source="ai-dynamo/dynamo lib/mocker/src/kv_manager/kvbm_backend.rs (KvManager)",
    use_result="count",
    use_all_or_nothing=False,
    stored_grouping="one_per_use",
    removed_timing="after_stored",
    policies=("lineage", "lru", "multi_lru", "unordered"),
    view_mode="set",
    operations=("use", "deref", "promote", "tick", "swap_in"),
    not_applicable=_VLLM_ONLY | {R.DESTROY_ACTIVE},
    own_invariants=frozenset({R.INV_QUARANTINE, R.INV_KVBM_ANNOUNCED}),
    announced=R.INV_KVBM_ANNOUNCED,
    offload_tier=True,
    blocks=BlockSemantics(
        announced_mark=True,
        unannounced_set=False,
        partial_owners=False,
        free_counter=True,
        use_parent=True,
        destroy=False,
        validates_held_partials=False,
        declares_batch=False,
        removed_per_use=True,
        stored_parents=False,
    ),
    invalid_uses=frozenset({"short_token_lists", "extra_local_hash", "missing_plh", "partial_parent"}),
    known_breaks={
        R.PARENT_ANCHOR: _INTERLEAVE
        + "; and a swap-in whose parent the caller released before it completed anchors its "
        "Stored to a block the router saw removed",
        R.STORE_NO_DUP: (
            "a block evicted by an earlier allocation of the same batch and then registered "
            "again is Stored a second time before the batch's Removed names it; it stays "
            "registered but unannounced (hits publish nothing, its next eviction publishes no "
            "Removed), and a Use after that eviction Stores it anew"
        ),
        R.REMOVE_NO_ORPHAN: _ORPHAN,
        R.USE_VALIDATE: (
            "the source checks only how many lineage hashes, local hashes and token lists a Use "
            "carries: it accepts a token list of any length, and it matches a full block by "
            "sequence hash among the blocks it holds, else by lineage hash alone, so a Use that "
            "names a registered block under another lineage hash, or a registered lineage hash "
            "under another sequence hash, is accepted; kvspec rejects these (capability "
            "strict_validation)"
        ),
    },
)

ATOMIC = Profile(
    name="atomic",
    title="newest mocker generation (all-or-nothing Use, split Stored groups)",
    source="issue #2 (no seed): the generation after the kvbm mocker",
    use_result="count",
    use_all_or_nothing=True,
    stored_grouping="split_at_reuse",
    removed_timing="after_stored",
    policies=("lineage", "lru", "multi_lru", "unordered"),
    view_mode="set",
    operations=("use", "deref", "promote"),
    not_applicable=_VLLM_ONLY | {R.DESTROY_ACTIVE},
    own_invariants=frozenset({R.INV_ATOMIC_NO_HALF, R.INV_ATOMIC_ANCHOR}),
    blocks=BlockSemantics(
        announced_mark=False,
        unannounced_set=False,
        partial_owners=False,
        free_counter=True,
        use_parent=True,
        destroy=False,
        validates_held_partials=False,
        declares_batch=True,
        removed_per_use=True,
        stored_parents=True,
    ),
    invalid_uses=frozenset(
        {
            "short_token_lists",
            "short_block_tokens",
            "extra_local_hash",
            "missing_plh",
            "partial_parent",
            "duplicate_position",
        }
    ),
    known_breaks={R.REMOVE_NO_ORPHAN: _ORPHAN},
)

LEGACY = Profile(
    name="legacy",
    title="dynamo-mocker 1.0.2 (hash cache)",
    source="ai-dynamo/dynamo lib/mocker/src/kv_manager.rs as published in dynamo-mocker 1.0.2",
    use_result="bool",
    use_all_or_nothing=False,
    stored_grouping="one_per_use",
    removed_timing="at_eviction",
    policies=("lru",),
    view_mode="set",
    operations=("use", "deref", "destroy", "promote"),
    not_applicable=_VLLM_ONLY | {R.DEREF_UNKNOWN, R.DEREF_PARTIAL},
    own_invariants=frozenset({R.INV_LEGACY_ANNOUNCED}),
    announced=R.INV_LEGACY_ANNOUNCED,
    use_shape="hash_cache",
    blocks=BlockSemantics(
        announced_mark=False,
        unannounced_set=True,
        partial_owners=True,
        free_counter=False,
        use_parent=False,
        destroy=True,
        validates_held_partials=True,
        declares_batch=False,
        removed_per_use=False,
        stored_parents=False,
    ),
    invalid_uses=frozenset({"short_token_lists", "extra_local_hash", "partial_parent"}),
    strict_only_uses=frozenset({"short_token_lists", "extra_local_hash"}),
    known_breaks={
        R.EVENT_ORDER: "each eviction publishes its Removed at once, before the batch's Stored",
        R.PARENT_ANCHOR: _INTERLEAVE,
        R.STORE_TOKENS_HASH: (
            "the Stored takes the tail of the caller's local hashes, which is misaligned when "
            "a reused block follows a new one"
        ),
        R.STORE_NEW_ONLY: "a Use that runs out of slots keeps the blocks it placed but publishes no Stored",
        R.REMOVE_EXACT: ("blocks placed by a failed Use were never Stored, yet their eviction publishes Removed"),
        R.REMOVE_NO_ORPHAN: _ORPHAN,
        R.USE_VALIDATE: (
            "the source checks none of a Use's list counts: the Stored takes the tail of extra local "
            "hashes, and a token list is read only for a block newly placed, so a Use with more local "
            "hashes than full blocks, or a token list missing for a reused block, is accepted; kvspec "
            "rejects these (capability strict_validation)"
        ),
    },
)

VLLM = Profile(
    name="vllm",
    title="vLLM-style block pool (request level)",
    source="vllm-project/vllm vllm/v1/core/block_pool.py (BlockPool); the ai-dynamo-runtime mocker",
    use_result="request",
    use_all_or_nothing=True,
    stored_grouping="one_per_cache_call",
    removed_timing="lazy",
    policies=("lru",),
    view_mode="copies",
    operations=("use", "deref", "promote", "reset"),
    not_applicable=frozenset({R.STORE_NO_DUP, R.REMOVE_EXACT, R.DESTROY_ACTIVE, R.EVICT_POLICY, R.USE_HIT_INACTIVE}),
    known_breaks={R.REMOVE_NO_ORPHAN: _ORPHAN},
)

#: the block-level profiles' rule sets, by name (the registry, spec/registry.py, lists every profile)
PROFILES: dict[str, Profile] = {p.name: p for p in (KVBM, ATOMIC, LEGACY, VLLM)}


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown profile {name!r}; known: {sorted(PROFILES)}") from None


def block_semantics(name: str) -> BlockSemantics:
    """The traits of ``name`` the block encodings test (a profile they do not encode: KeyError)."""
    blocks = profile(name).blocks
    if blocks is None:
        encoded = sorted(p.name for p in PROFILES.values() if p.blocks is not None)
        raise KeyError(f"profile {name!r} declares no BlockSemantics (the block encodings cover {encoded})")
    return blocks
