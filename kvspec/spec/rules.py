"""The rule catalogue: every rule of the spec, by its stable id.

SPEC.md explains each rule in prose; this module is the same list as data, so
that the model, the router view, the checker, the tests and the reports can
name a rule by one identifier. A test keeps the two in step (every id here has
a section in SPEC.md and every id SPEC.md defines is here).

A profile declared outside kvspec (``spec.registry.register``) brings its
rules in a spec document of its own, headed the way SPEC.md heads them;
``register_rules`` reads them from there into ``OUTSIDE_RULES``, so that
they too are named by the id a document defines, and ``known`` answers for
both lists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal


class RuleId(StrEnum):
    """Stable rule ids. The string value is the id used everywhere."""

    # -- operations on the G1 lifecycle ------------------------------------
    USE_VALIDATE = "USE-VALIDATE"
    USE_HIT_ACTIVE = "USE-HIT-ACTIVE"
    USE_HIT_INACTIVE = "USE-HIT-INACTIVE"
    USE_NEW = "USE-NEW"
    USE_PARTIAL = "USE-PARTIAL"
    USE_CAPACITY = "USE-CAPACITY"
    DEREF_OWNER = "DEREF-OWNER"
    DEREF_UNKNOWN = "DEREF-UNKNOWN"
    DEREF_PARTIAL = "DEREF-PARTIAL"
    DESTROY_ACTIVE = "DESTROY-ACTIVE"
    PROMOTE_NEW = "PROMOTE-NEW"
    PROMOTE_EXISTING = "PROMOTE-EXISTING"
    PROMOTE_UNKNOWN = "PROMOTE-UNKNOWN"
    EVICT_POLICY = "EVICT-POLICY"
    COUNTERS = "COUNTERS"
    # -- the event protocol -------------------------------------------------
    STORE_NEW_ONLY = "STORE-NEW-ONLY"
    STORE_NO_DUP = "STORE-NO-DUP"
    STORE_TOKENS_HASH = "STORE-TOKENS-HASH"
    PARENT_ANCHOR = "PARENT-ANCHOR"
    REMOVE_EXACT = "REMOVE-EXACT"
    REMOVE_NO_ORPHAN = "REMOVE-NO-ORPHAN"
    EVENT_ID = "EVENT-ID"
    EVENT_ORDER = "EVENT-ORDER"
    EVENT_SOURCE = "EVENT-SOURCE"
    # -- the vLLM-style pool ------------------------------------------------
    STORE_COPY = "STORE-COPY"
    REMOVE_COPY = "REMOVE-COPY"
    CLEAR_ALL = "CLEAR-ALL"
    VLLM_PREFIX_HIT = "VLLM-PREFIX-HIT"
    VLLM_FREE_ORDER = "VLLM-FREE-ORDER"
    VLLM_LAZY_REMOVE = "VLLM-LAZY-REMOVE"
    # -- the offload tier (G2) ----------------------------------------------
    QUARANTINE_HOLD = "QUARANTINE-HOLD"
    QUARANTINE_RELEASE = "QUARANTINE-RELEASE"
    OFFLOAD_BLOCKS_USE = "OFFLOAD-BLOCKS-USE"
    G2_STORE_ON_COMPLETE = "G2-STORE-ON-COMPLETE"
    G2_EVICT = "G2-EVICT"
    DEVICE_REMOVE_IMMEDIATE = "DEVICE-REMOVE-IMMEDIATE"
    TIME_MONOTONIC = "TIME-MONOTONIC"
    SWAPIN_RESERVE = "SWAPIN-RESERVE"
    SWAPIN_SKIP_PRESENT = "SWAPIN-SKIP-PRESENT"
    SWAPIN_ANCHOR = "SWAPIN-ANCHOR"
    # -- the lower tiers (G3 disk, G4 object store), shared by workers -------
    TIER_CASCADE = "TIER-CASCADE"
    TIER_DEDUP = "TIER-DEDUP"
    TIER_ADMIT = "TIER-ADMIT"
    TIER_EVICT = "TIER-EVICT"
    TIER_OWNER = "TIER-OWNER"
    TIER_ONBOARD = "TIER-ONBOARD"
    TIER_EVENTS = "TIER-EVENTS"
    # -- hashing ------------------------------------------------------------
    HASH_LOCAL = "HASH-LOCAL"
    HASH_SEQUENCE = "HASH-SEQUENCE"
    # -- proven invariants (z3) ---------------------------------------------
    INV_CONSERVE = "INV-CONSERVE"
    INV_OWNERS = "INV-OWNERS"
    INV_ROUTER_MATCH = "INV-ROUTER-MATCH"
    INV_NO_DUP = "INV-NO-DUP"
    INV_QUARANTINE = "INV-QUARANTINE"
    INV_ANCHOR = "INV-ANCHOR"
    INV_PARTIAL_UUID = "INV-PARTIAL-UUID"
    INV_VLLM_COPIES = "INV-VLLM-COPIES"
    INV_VLLM_OWNER_SAFE = "INV-VLLM-OWNER-SAFE"
    INV_KVBM_ANNOUNCED = "INV-KVBM-ANNOUNCED"
    INV_LEGACY_ANNOUNCED = "INV-LEGACY-ANNOUNCED"
    INV_ATOMIC_NO_HALF = "INV-ATOMIC-NO-HALF"
    INV_ATOMIC_ANCHOR = "INV-ATOMIC-ANCHOR"
    INV_PAGED_REFS = "INV-PAGED-REFS"
    INV_SESSION_FENCE = "INV-SESSION-FENCE"
    INV_RADIX_TREE = "INV-RADIX-TREE"
    INV_RADIX_ANCHOR = "INV-RADIX-ANCHOR"
    INV_RADIX_NO_DUP = "INV-RADIX-NO-DUP"
    INV_RADIX_RUN = "INV-RADIX-RUN"
    INV_RADIX_LOCKS = "INV-RADIX-LOCKS"
    INV_RADIX_ROUTER = "INV-RADIX-ROUTER"
    INV_RADIX_CAPACITY = "INV-RADIX-CAPACITY"
    ORDER_STAMPS = "ORDER-STAMPS"
    ORDER_LRU = "ORDER-LRU"
    ORDER_MULTI_LRU = "ORDER-MULTI-LRU"
    ORDER_LINEAGE = "ORDER-LINEAGE"
    ORDER_VLLM_FREE = "ORDER-VLLM-FREE"
    ORDER_RADIX_LRU = "ORDER-RADIX-LRU"
    EQUIV_VLLM = "EQUIV-VLLM"
    EQUIV_KVBM = "EQUIV-KVBM"
    EQUIV_LEGACY = "EQUIV-LEGACY"
    EQUIV_ATOMIC = "EQUIV-ATOMIC"
    EQUIV_KVBM_OFFLOAD = "EQUIV-KVBM-OFFLOAD"
    EQUIV_RADIX = "EQUIV-RADIX"
    EQUIV_PAGED = "EQUIV-PAGED"
    EQUIV_SESSION = "EQUIV-SESSION"
    EQUIV_ORDER = "EQUIV-ORDER"
    INV_HOST_ANCHOR = "INV-HOST-ANCHOR"
    BIND_VLLM_STEPS = "BIND-VLLM-STEPS"
    PROGRESS_NO_DEADLOCK = "PROGRESS-NO-DEADLOCK"
    PROGRESS_USE_FITS = "PROGRESS-USE-FITS"
    PROGRESS_QUARANTINE = "PROGRESS-QUARANTINE"
    PROGRESS_RADIX_EVICTABLE = "PROGRESS-RADIX-EVICTABLE"
    PROGRESS_SESSION_ADMIT = "PROGRESS-SESSION-ADMIT"
    # -- the paged allocator (profile paged) --------------------------------
    PAGED_VALIDATE = "PAGED-VALIDATE"
    PAGED_CONSERVE = "PAGED-CONSERVE"
    PAGED_REFCOUNT = "PAGED-REFCOUNT"
    PAGED_NO_REUSE = "PAGED-NO-REUSE"
    PAGED_EXTEND = "PAGED-EXTEND"
    PAGED_SHARE = "PAGED-SHARE"
    PAGED_COW = "PAGED-COW"
    PAGED_SWAP = "PAGED-SWAP"
    PAGED_FREE = "PAGED-FREE"
    PAGED_PREFIX_EVICT = "PAGED-PREFIX-EVICT"
    PAGED_PRESSURE = "PAGED-PRESSURE"
    # -- session slot leases (profile session) ------------------------------
    SESSION_VALIDATE = "SESSION-VALIDATE"
    SESSION_LEASE = "SESSION-LEASE"
    SESSION_FENCE = "SESSION-FENCE"
    SESSION_LRU = "SESSION-LRU"
    SESSION_CANDIDATE = "SESSION-CANDIDATE"
    SESSION_RELEASE = "SESSION-RELEASE"
    # -- the radix prefix cache (profile radix) -----------------------------
    RADIX_VALIDATE = "RADIX-VALIDATE"
    RADIX_MATCH = "RADIX-MATCH"
    RADIX_SPLIT_SILENT = "RADIX-SPLIT-SILENT"
    RADIX_INSERT = "RADIX-INSERT"
    RADIX_LOCK = "RADIX-LOCK"
    RADIX_LOCKED_KEPT = "RADIX-LOCKED-KEPT"
    RADIX_EVICT_LRU = "RADIX-EVICT-LRU"
    RADIX_REMOVE = "RADIX-REMOVE"
    RADIX_RESET = "RADIX-RESET"
    RADIX_PREFIX_HIT = "RADIX-PREFIX-HIT"
    RADIX_CAPACITY = "RADIX-CAPACITY"


class Concern(StrEnum):
    LIFECYCLE = "lifecycle"
    PROTOCOL = "protocol"
    VLLM = "vllm pool"
    OFFLOAD = "offload"
    HASHING = "hashing"
    INVARIANT = "invariant"
    PAGED = "paged"
    SESSION = "session"
    RADIX = "radix"
    TIERS = "shared tiers"


@dataclass(frozen=True, slots=True)
class Rule:
    id: RuleId
    concern: Concern
    title: str
    #: True when a consumer of the event stream alone (the router view) can
    #: check the rule; False when it needs the operations (the lockstep checker).
    stream_checkable: bool = False
    #: Strict rules are off by default in the router view and switched on by
    #: the caller (they are router-safety properties some profiles do not keep).
    strict: bool = False


_L, _P, _V, _O, _H, _I = (
    Concern.LIFECYCLE,
    Concern.PROTOCOL,
    Concern.VLLM,
    Concern.OFFLOAD,
    Concern.HASHING,
    Concern.INVARIANT,
)
_PG, _SE, _RX, _T = Concern.PAGED, Concern.SESSION, Concern.RADIX, Concern.TIERS

RULES: dict[RuleId, Rule] = {
    r.id: r
    for r in [
        Rule(RuleId.USE_VALIDATE, _L, "a malformed Use is rejected before any state changes"),
        Rule(RuleId.USE_HIT_ACTIVE, _L, "an active full block in Use gains one owner"),
        Rule(RuleId.USE_HIT_INACTIVE, _L, "an inactive full block in Use is reactivated with one owner"),
        Rule(RuleId.USE_NEW, _L, "an unknown full block in Use takes a slot and is registered"),
        Rule(RuleId.USE_PARTIAL, _L, "a partial block in Use takes a slot unless already held"),
        Rule(RuleId.USE_CAPACITY, _L, "what a Use returns and keeps when slots run out"),
        Rule(RuleId.DEREF_OWNER, _L, "Deref drops one owner; at zero the block becomes inactive"),
        Rule(RuleId.DEREF_UNKNOWN, _L, "Deref of a block that is not active is an error"),
        Rule(RuleId.DEREF_PARTIAL, _L, "Deref of a partial block returns its slot to free"),
        Rule(RuleId.DESTROY_ACTIVE, _L, "Destroy (legacy) removes an active block and reports it"),
        Rule(RuleId.PROMOTE_NEW, _L, "a promoted partial block that is new is registered in place"),
        Rule(RuleId.PROMOTE_EXISTING, _L, "a promoted partial block that exists joins the existing block"),
        Rule(RuleId.PROMOTE_UNKNOWN, _L, "Promote of a partial block that is not held is an error"),
        Rule(RuleId.EVICT_POLICY, _L, "victims are inactive blocks chosen by the configured policy"),
        Rule(RuleId.COUNTERS, _L, "active + inactive + free slots = capacity, refs >= active full"),
        Rule(RuleId.STORE_NEW_ONLY, _P, "Stored names exactly the newly registered blocks, in order"),
        Rule(RuleId.STORE_NO_DUP, _P, "no hash is Stored twice in a tier without a Removed between", True),
        Rule(RuleId.STORE_TOKENS_HASH, _P, "a stored block's tokens_hash is its own local hash", True),
        Rule(RuleId.PARENT_ANCHOR, _P, "a Stored's parent is the block before its first block, and stored", True),
        Rule(RuleId.REMOVE_EXACT, _P, "Removed names exactly the evicted blocks, each stored in the tier", True),
        Rule(RuleId.REMOVE_NO_ORPHAN, _P, "a Removed leaves no stored child of a removed block", True, True),
        Rule(RuleId.EVENT_ID, _P, "event ids start at 0 and increase by 1 per event, per manager", True),
        Rule(RuleId.EVENT_ORDER, _P, "within one operation, Stored before Removed (per profile)"),
        Rule(RuleId.EVENT_SOURCE, _P, "every event carries the manager's dp_rank and a storage tier", True),
        Rule(RuleId.STORE_COPY, _V, "vllm: each Stored of a hash adds one physical copy", True),
        Rule(RuleId.REMOVE_COPY, _V, "vllm: each Removed takes away one stored copy of the hash", True),
        Rule(RuleId.CLEAR_ALL, _V, "vllm: a reset succeeds only with every block free and emits one Cleared", True),
        Rule(RuleId.VLLM_PREFIX_HIT, _V, "vllm: a prompt hits whole cached blocks, at most num_tokens - 1"),
        Rule(RuleId.VLLM_FREE_ORDER, _V, "vllm: freed blocks queue in reverse; hashless blocks reused first"),
        Rule(RuleId.VLLM_LAZY_REMOVE, _V, "vllm: a cached block is Removed only when its slot is reused"),
        Rule(RuleId.QUARANTINE_HOLD, _O, "an offloading G1 slot stays unavailable until its transfer completes"),
        Rule(RuleId.QUARANTINE_RELEASE, _O, "at completion the slot returns to free exactly once"),
        Rule(RuleId.OFFLOAD_BLOCKS_USE, _O, "a Use whose eviction starts an offload stops there"),
        Rule(RuleId.G2_STORE_ON_COMPLETE, _O, "host-pinned Stored is published at transfer completion"),
        Rule(RuleId.G2_EVICT, _O, "a full G2 evicts by its policy and publishes host-pinned Removed", True),
        Rule(RuleId.DEVICE_REMOVE_IMMEDIATE, _O, "device Removed is published at eviction, not at completion"),
        Rule(RuleId.TIME_MONOTONIC, _O, "time moves only through tick; a tick backwards changes nothing"),
        Rule(RuleId.SWAPIN_RESERVE, _O, "swap-in reserves destination slots before anything else"),
        Rule(RuleId.SWAPIN_SKIP_PRESENT, _O, "swap-in skips blocks already in G1"),
        Rule(RuleId.SWAPIN_ANCHOR, _O, "swapped-in blocks are registered inactive, Stored anchored to the prefix"),
        Rule(RuleId.TIER_CASCADE, _T, "a block that reaches G2 is copied on to G3 and G4, each once"),
        Rule(
            RuleId.TIER_DEDUP,
            Concern.TIERS,
            "a shared tier holds a block once: one held or on its way there is not sent again",
        ),
        Rule(
            RuleId.TIER_ADMIT,
            Concern.TIERS,
            "lower-tier copies are admitted against shared room and pin their G2 source",
        ),
        Rule(RuleId.TIER_EVICT, _T, "a full G3 evicts a lineage leaf when a copy starts; G4 never evicts"),
        Rule(
            RuleId.TIER_OWNER,
            Concern.TIERS,
            "a shared-tier transfer takes effect when the worker that started it ticks",
        ),
        Rule(RuleId.TIER_ONBOARD, _T, "a swap-in hit in G3 or G4 goes through G2: staged first, then G2 to G1"),
        Rule(
            RuleId.TIER_EVENTS,
            Concern.TIERS,
            "lower-tier events: none, or the owning worker's, never before completion",
        ),
        Rule(RuleId.HASH_LOCAL, _H, "local hash = xxh3-64, seed 1337, over the tokens as little-endian u32"),
        Rule(RuleId.HASH_SEQUENCE, _H, "sequence hash chains the parent's sequence hash with the local hash"),
        Rule(RuleId.INV_CONSERVE, _I, "free + partial + active + inactive + quarantined = capacity"),
        Rule(RuleId.INV_OWNERS, _I, "a block is active iff it has an owner"),
        Rule(RuleId.INV_ROUTER_MATCH, _I, "the router view per tier equals the registered blocks"),
        Rule(RuleId.INV_NO_DUP, _I, "no block hash is registered in two G1 slots"),
        Rule(RuleId.INV_QUARANTINE, _I, "a quarantined slot is never free, registered, or allocated"),
        Rule(RuleId.INV_ANCHOR, _I, "every Stored's parent is registered (or the root) when emitted"),
        Rule(RuleId.INV_PARTIAL_UUID, _I, "no partial-block uuid is held by two G1 slots"),
        Rule(RuleId.INV_VLLM_COPIES, _I, "vllm: the router's copy count of every hash equals its cached copies"),
        Rule(RuleId.INV_VLLM_OWNER_SAFE, _I, "vllm: a cached copy with an owner is never evicted"),
        Rule(RuleId.INV_KVBM_ANNOUNCED, _I, "kvbm: the router's view is the registered blocks still marked announced"),
        Rule(RuleId.INV_LEGACY_ANNOUNCED, _I, "legacy: the router view is the registered blocks no failed Use placed"),
        Rule(RuleId.INV_ATOMIC_NO_HALF, _I, "atomic: a Use that passed its capacity check places every block"),
        Rule(RuleId.INV_ATOMIC_ANCHOR, _I, "atomic: every Stored's parent is the block before it, held by the router"),
        Rule(RuleId.INV_PAGED_REFS, _I, "paged: pools conserve blocks and every reference count equals its holders"),
        Rule(RuleId.INV_SESSION_FENCE, _I, "session: a handle of an older generation never matches a slot"),
        Rule(RuleId.INV_RADIX_TREE, _I, "radix: the live pages form one tree under the root, without cycles"),
        Rule(
            RuleId.INV_RADIX_ANCHOR, _I, "radix: the parent page of every live page is live: every Stored is anchored"
        ),
        Rule(
            RuleId.INV_RADIX_NO_DUP, _I, "radix: no two live pages share a parent and tokens: no page is stored twice"
        ),
        Rule(
            RuleId.INV_RADIX_RUN, _I, "radix: a node's run never branches inside; a page under the root starts a node"
        ),
        Rule(RuleId.INV_RADIX_LOCKS, _I, "radix: a page's lock count is the held locks ending at or below it"),
        Rule(RuleId.INV_RADIX_ROUTER, _I, "radix: the router counts every live page once and no other page"),
        Rule(RuleId.INV_RADIX_CAPACITY, _I, "radix: free slots are never negative and free + cached pages = capacity"),
        Rule(
            RuleId.ORDER_STAMPS,
            _I,
            "eviction order: every entry's recency stamp is distinct, below the clock, and in history order",
        ),
        Rule(
            RuleId.ORDER_LRU, _I, "eviction order, lru: the victim entered the pool before every other inactive block"
        ),
        Rule(
            RuleId.ORDER_MULTI_LRU,
            _I,
            "eviction order, multi_lru: the victim is the oldest block of the coldest non-empty level",
        ),
        Rule(
            RuleId.ORDER_LINEAGE,
            _I,
            "eviction order, lineage: the victim is a real leaf, the oldest by (tick, position, hash)",
        ),
        Rule(
            RuleId.ORDER_VLLM_FREE, _I, "eviction order, vllm: a fresh block is taken from the head of the free queue"
        ),
        Rule(
            RuleId.ORDER_RADIX_LRU, _I, "eviction order, radix: the victim is the unlocked leaf accessed least recently"
        ),
        Rule(RuleId.EQUIV_VLLM, _I, "vllm: the model and the operation encoding have the same successors at the bound"),
        Rule(RuleId.EQUIV_KVBM, _I, "kvbm: the model and the step encoding have the same successors at the bound"),
        Rule(RuleId.EQUIV_LEGACY, _I, "legacy: the model and the step encoding have the same successors at the bound"),
        Rule(RuleId.EQUIV_ATOMIC, _I, "atomic: the model and the step encoding have the same successors at the bound"),
        Rule(RuleId.EQUIV_KVBM_OFFLOAD, _I, "kvbm with offload: the model and the encoding have the same successors"),
        Rule(RuleId.EQUIV_RADIX, _I, "radix: the model's recency order and the order encoding agree at the bound"),
        Rule(RuleId.EQUIV_PAGED, _I, "paged: the model and the INV-PAGED-REFS encoding have the same successors"),
        Rule(
            RuleId.EQUIV_SESSION, _I, "session: the model and the INV-SESSION-FENCE encoding have the same successors"
        ),
        Rule(RuleId.INV_HOST_ANCHOR, _I, "every host-pinned Stored names its block's parent as G1 recorded it"),
        Rule(RuleId.EQUIV_ORDER, _I, "lru, multi-LRU, lineage, vllm free queue: order encoding and Python code agree"),
        Rule(
            RuleId.BIND_VLLM_STEPS,
            _I,
            "vllm: every operation-encoding step is matched by 0-2 steps of the copy encoding",
        ),
        Rule(RuleId.PROGRESS_NO_DEADLOCK, _I, "progress: while work is held or pending, some operation is accepted"),
        Rule(RuleId.PROGRESS_USE_FITS, _I, "progress: a Use whose blocks fit is accepted"),
        Rule(RuleId.PROGRESS_QUARANTINE, _I, "progress: a quarantined slot is released by its deadline"),
        Rule(RuleId.PROGRESS_RADIX_EVICTABLE, _I, "progress: an unlocked radix page is evicted by evictions"),
        Rule(RuleId.PROGRESS_SESSION_ADMIT, _I, "progress: a session admitted with a slot not leased gets a lease"),
        Rule(RuleId.PAGED_VALIDATE, _PG, "paged: a malformed operation is rejected before any state changes"),
        Rule(RuleId.PAGED_CONSERVE, _PG, "paged: free + in-use blocks = the pool's size, per pool"),
        Rule(RuleId.PAGED_REFCOUNT, _PG, "paged: a block's reference count equals its holders"),
        Rule(RuleId.PAGED_NO_REUSE, _PG, "paged: no block is freed or handed out again while referenced"),
        Rule(RuleId.PAGED_EXTEND, _PG, "paged: allocate and extend take exactly the blocks needed, or nothing"),
        Rule(RuleId.PAGED_SHARE, _PG, "paged: a fork shares its prefix blocks, one more holder each"),
        Rule(RuleId.PAGED_COW, _PG, "paged: writing a shared block gives the writer a private copy"),
        Rule(RuleId.PAGED_SWAP, _PG, "paged: swap out and in restores the contents and frees the source"),
        Rule(RuleId.PAGED_FREE, _PG, "paged: free drops one holder per block; at zero the block is free"),
        Rule(RuleId.PAGED_PREFIX_EVICT, _PG, "paged: a prefix entry is evicted only when no sequence holds it"),
        Rule(RuleId.PAGED_PRESSURE, _PG, "paged: pressure follows the device pool's free fraction"),
        Rule(RuleId.SESSION_VALIDATE, _SE, "session: a handle naming no slot is rejected; nothing changes"),
        Rule(RuleId.SESSION_LEASE, _SE, "session: a slot is leased to at most one session, a session holds one"),
        Rule(RuleId.SESSION_FENCE, _SE, "session: a handle from an older generation never acts"),
        Rule(RuleId.SESSION_LRU, _SE, "session: free slots first, then idle slots in LRU order"),
        Rule(RuleId.SESSION_CANDIDATE, _SE, "session: a live cache candidate is only the session's own idle slot"),
        Rule(RuleId.SESSION_RELEASE, _SE, "session: reset and evict-all release what they name, generation up"),
        Rule(RuleId.RADIX_VALIDATE, _RX, "radix: an unknown or already held lock name is rejected; nothing changes"),
        Rule(RuleId.RADIX_MATCH, _RX, "radix: a match is the longest cached page-aligned prefix; it splits a node"),
        Rule(RuleId.RADIX_SPLIT_SILENT, _RX, "radix: a node split publishes nothing"),
        Rule(RuleId.RADIX_INSERT, _RX, "radix: insert adds the uncached pages as one leaf, one Stored of its pages"),
        Rule(RuleId.RADIX_LOCK, _RX, "radix: lock and unlock count one reference on every node of the path"),
        Rule(RuleId.RADIX_LOCKED_KEPT, _RX, "radix: a locked node and its ancestors are never evicted"),
        Rule(RuleId.RADIX_EVICT_LRU, _RX, "radix: evict takes whole unlocked leaves, least recently accessed first"),
        Rule(RuleId.RADIX_REMOVE, _RX, "radix: one Removed per eviction names every page of the evicted leaves"),
        Rule(RuleId.RADIX_RESET, _RX, "radix: reset empties the tree, forgets every lock and publishes one Cleared"),
        Rule(
            RuleId.RADIX_PREFIX_HIT,
            _RX,
            "radix: a request hits the cached whole pages of its prompt but the last token",
        ),
        Rule(RuleId.RADIX_CAPACITY, _RX, "radix: free + cached slots = capacity; a request that cannot fit is refused"),
    ]
}

assert set(RULES) == set(RuleId), "every RuleId needs a catalogue entry"


def rules_of(concern: Concern) -> tuple[str, ...]:
    """The ids of one concern's rules, in catalogue order (what a test of
    that concern lists in its ``kvspec_rules`` marker)."""
    return tuple(r.id.value for r in RULES.values() if r.concern == concern)


@dataclass(frozen=True, slots=True)
class OutsideRule:
    """A rule of a profile declared outside kvspec, as its own spec document heads it."""

    id: str
    title: str
    #: the document whose heading defines it
    spec: Path


#: the rules of profiles declared outside kvspec (``register_rules``), by id
OUTSIDE_RULES: dict[str, OutsideRule] = {}

#: a rule's heading, as SPEC.md writes it: ``### `RULE-ID` — title``
_RULE_HEADING = re.compile(r"^#{2,6}[ \t]+`([A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*)`[ \t]+—[ \t]+(.+?)[ \t]*$", re.MULTILINE)


def register_rules(spec: Path) -> tuple[str, ...]:
    """Register the rules ``spec`` (a Markdown document) heads ``### `RULE-ID` — title``;
    their ids, in document order. Refused, with nothing registered, when the
    document defines no rule, defines one twice, or reuses a known id."""
    found = [(m.group(1), m.group(2)) for m in _RULE_HEADING.finditer(spec.read_text())]
    if not found:
        raise ValueError(f"{spec}: no rule heading (### `RULE-ID` — title)")
    ids = [i for i, _ in found]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ValueError(f"{spec}: rules defined twice: {', '.join(twice)}")
    taken = [i for i in ids if known(i)]
    if taken:
        raise ValueError(f"{spec}: rule ids already defined elsewhere: {', '.join(taken)}")
    OUTSIDE_RULES.update((i, OutsideRule(i, t, spec)) for i, t in found)
    return tuple(ids)


def unregister_rules(ids: Iterable[str]) -> None:
    """Forget outside rules ``register_rules`` registered (catalogue rules stay)."""
    for i in ids:
        OUTSIDE_RULES.pop(i, None)


def known(rule_id: str) -> bool:
    """Whether ``rule_id`` names a rule: of the catalogue, or registered with an outside profile."""
    return rule_id in RuleId._value2member_map_ or rule_id in OUTSIDE_RULES


def rule(rule_id: str | RuleId) -> Rule:
    """Look a rule up by id; raises KeyError naming the unknown id."""
    try:
        return RULES[RuleId(rule_id)]
    except ValueError:
        raise KeyError(f"unknown rule id {rule_id!r}") from None


#: every rule id as text: a label written ``"USE-NEW"`` is found by grep and
#: checked by mypy (a test keeps this list equal to ``RuleId``)
RuleName = Literal[
    "USE-VALIDATE",
    "USE-HIT-ACTIVE",
    "USE-HIT-INACTIVE",
    "USE-NEW",
    "USE-PARTIAL",
    "USE-CAPACITY",
    "DEREF-OWNER",
    "DEREF-UNKNOWN",
    "DEREF-PARTIAL",
    "DESTROY-ACTIVE",
    "PROMOTE-NEW",
    "PROMOTE-EXISTING",
    "PROMOTE-UNKNOWN",
    "EVICT-POLICY",
    "COUNTERS",
    "STORE-NEW-ONLY",
    "STORE-NO-DUP",
    "STORE-TOKENS-HASH",
    "PARENT-ANCHOR",
    "REMOVE-EXACT",
    "REMOVE-NO-ORPHAN",
    "EVENT-ID",
    "EVENT-ORDER",
    "EVENT-SOURCE",
    "STORE-COPY",
    "REMOVE-COPY",
    "CLEAR-ALL",
    "VLLM-PREFIX-HIT",
    "VLLM-FREE-ORDER",
    "VLLM-LAZY-REMOVE",
    "QUARANTINE-HOLD",
    "QUARANTINE-RELEASE",
    "OFFLOAD-BLOCKS-USE",
    "G2-STORE-ON-COMPLETE",
    "G2-EVICT",
    "DEVICE-REMOVE-IMMEDIATE",
    "TIME-MONOTONIC",
    "SWAPIN-RESERVE",
    "SWAPIN-SKIP-PRESENT",
    "SWAPIN-ANCHOR",
    "TIER-CASCADE",
    "TIER-DEDUP",
    "TIER-ADMIT",
    "TIER-EVICT",
    "TIER-OWNER",
    "TIER-ONBOARD",
    "TIER-EVENTS",
    "HASH-LOCAL",
    "HASH-SEQUENCE",
    "INV-CONSERVE",
    "INV-OWNERS",
    "INV-ROUTER-MATCH",
    "INV-NO-DUP",
    "INV-QUARANTINE",
    "INV-ANCHOR",
    "INV-PARTIAL-UUID",
    "INV-VLLM-COPIES",
    "INV-VLLM-OWNER-SAFE",
    "INV-KVBM-ANNOUNCED",
    "INV-LEGACY-ANNOUNCED",
    "INV-ATOMIC-NO-HALF",
    "INV-ATOMIC-ANCHOR",
    "INV-PAGED-REFS",
    "INV-SESSION-FENCE",
    "INV-RADIX-TREE",
    "INV-RADIX-ANCHOR",
    "INV-RADIX-NO-DUP",
    "INV-RADIX-RUN",
    "INV-RADIX-LOCKS",
    "INV-RADIX-ROUTER",
    "INV-RADIX-CAPACITY",
    "ORDER-STAMPS",
    "ORDER-LRU",
    "ORDER-MULTI-LRU",
    "ORDER-LINEAGE",
    "ORDER-VLLM-FREE",
    "ORDER-RADIX-LRU",
    "EQUIV-VLLM",
    "EQUIV-KVBM",
    "EQUIV-LEGACY",
    "EQUIV-ATOMIC",
    "EQUIV-KVBM-OFFLOAD",
    "EQUIV-RADIX",
    "EQUIV-PAGED",
    "EQUIV-SESSION",
    "EQUIV-ORDER",
    "INV-HOST-ANCHOR",
    "BIND-VLLM-STEPS",
    "PROGRESS-NO-DEADLOCK",
    "PROGRESS-USE-FITS",
    "PROGRESS-QUARANTINE",
    "PROGRESS-RADIX-EVICTABLE",
    "PROGRESS-SESSION-ADMIT",
    "PAGED-VALIDATE",
    "PAGED-CONSERVE",
    "PAGED-REFCOUNT",
    "PAGED-NO-REUSE",
    "PAGED-EXTEND",
    "PAGED-SHARE",
    "PAGED-COW",
    "PAGED-SWAP",
    "PAGED-FREE",
    "PAGED-PREFIX-EVICT",
    "PAGED-PRESSURE",
    "SESSION-VALIDATE",
    "SESSION-LEASE",
    "SESSION-FENCE",
    "SESSION-LRU",
    "SESSION-CANDIDATE",
    "SESSION-RELEASE",
    "RADIX-VALIDATE",
    "RADIX-MATCH",
    "RADIX-SPLIT-SILENT",
    "RADIX-INSERT",
    "RADIX-LOCK",
    "RADIX-LOCKED-KEPT",
    "RADIX-EVICT-LRU",
    "RADIX-REMOVE",
    "RADIX-RESET",
    "RADIX-PREFIX-HIT",
    "RADIX-CAPACITY",
]


def rid(name: RuleName) -> RuleId:
    """The ``RuleId`` of a rule written as text (``rid("USE-NEW")``)."""
    return RuleId(name)
