"""The mutant catalogue: every deliberately broken variant, as data.

Each entry names the bug (``id``, snake_case), says in one line what is
wrong, which profiles it breaks (the model classes that carry the bug), the
rule it is expected to violate, and what a configuration needs for the bug to
be reachable at all (capability names as in the adapter manifest). Under a
profile it does not list, a mutant runs the unmutated reference, so that the
adapter can declare the reference's capabilities and the whole suite applies.

``none`` is not a mutant: it is the unmutated reference behind the same
adapter, which ``kvspec mutants`` runs first as its sanity check.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.reference import G1Model, LegacyModel, Model, make_model
from kvspec.spec.config import ManagerConfig, ProfileName
from kvspec.spec.errors import ConfigError
from kvspec.spec.rules import RuleId

from . import event_bugs as ev
from . import legacy_bugs as lg
from . import lifecycle_bugs as lc
from . import offload_bugs as off
from . import policy_bugs as pol
from . import request_bugs as rq

R = RuleId
G1: tuple[ProfileName, ...] = ("kvbm", "atomic")
KVBM: tuple[ProfileName, ...] = ("kvbm",)
ATOMIC: tuple[ProfileName, ...] = ("atomic",)
LEGACY: tuple[ProfileName, ...] = ("legacy",)

#: the variant name that runs the unmutated reference (the sanity check)
UNMUTATED = "none"


@dataclass(frozen=True, slots=True)
class Mutant:
    id: str
    description: str
    profiles: tuple[ProfileName, ...]
    rule: RuleId
    g1: type[G1Model] | None = None
    legacy: type[LegacyModel] | None = None
    #: capabilities a configuration needs for the bug to be reachable
    needs: tuple[str, ...] = ()

    def model_for(self, config: ManagerConfig) -> Model:
        """The broken model under the profiles the bug lives in, else the reference."""
        if config.profile not in self.profiles:
            return make_model(config)
        cls = self.legacy if config.profile == "legacy" else self.g1
        if cls is None and self.id in rq.BY_ID:  # a request-level mutant: block level is the reference
            return make_model(config)
        assert cls is not None, f"mutant {self.id} lists profile {config.profile} without a model for it"
        return cls(config)


def _m(
    id: str,
    description: str,
    profiles: tuple[ProfileName, ...],
    rule: RuleId,
    g1: type[G1Model] | None = None,
    legacy: type[LegacyModel] | None = None,
    needs: tuple[str, ...] = (),
) -> Mutant:
    return Mutant(id, description, profiles, rule, g1, legacy, needs)


CATALOGUE: tuple[Mutant, ...] = (
    # -- what gets announced --------------------------------------------------
    _m(
        "stored_on_inactive_hit",
        "a reactivated inactive block is Stored again",
        G1,
        R.STORE_NEW_ONLY,
        g1=ev.StoredOnInactiveHit,
    ),
    _m(
        "stored_on_active_hit",
        "a hit on an active block is Stored again",
        G1,
        R.STORE_NEW_ONLY,
        g1=ev.StoredOnActiveHit,
    ),
    _m(
        "stored_dup_in_batch",
        "a block placed twice in one batch is listed twice in the Stored",
        KVBM,
        R.STORE_NO_DUP,
        g1=ev.StoredDupInBatch,
    ),
    _m(
        "promote_existing_stored",
        "promoting into an existing block announces it again",
        G1,
        R.STORE_NEW_ONLY,
        g1=ev.PromoteExistingStored,
        needs=("promote", "partial_blocks"),
    ),
    _m(
        "legacy_stored_on_failed_use",
        "legacy: a Use that runs out of slots still Stores what it placed",
        LEGACY,
        R.STORE_NEW_ONLY,
        legacy=lg.LegacyStoredOnFailedUse,
    ),
    _m(
        "tokens_hash_is_block_hash",
        "Stored blocks carry the sequence hash as their tokens hash",
        G1,
        R.STORE_TOKENS_HASH,
        g1=ev.TokensHashIsBlockHash,
    ),
    # -- parents -------------------------------------------------------------------
    _m(
        "parent_first_reused",
        "the Stored is anchored to the first reused block, not the last",
        KVBM,
        R.PARENT_ANCHOR,
        g1=ev.ParentFirstReused,
    ),
    _m(
        "parent_always_none",
        "the Stored of a Use never carries a parent",
        (*G1, "legacy"),
        R.PARENT_ANCHOR,
        g1=ev.ParentAlwaysNone,
        legacy=lg.LegacyParentAlwaysNone,
    ),
    _m(
        "promote_parent_dropped",
        "the Stored of a promoted block drops the caller's parent",
        G1,
        R.PARENT_ANCHOR,
        g1=ev.PromoteParentDropped,
        needs=("promote", "partial_blocks"),
    ),
    # -- removals ------------------------------------------------------------------
    _m(
        "removed_extra_block",
        "the Removed also names the next candidate, which was not evicted",
        G1,
        R.REMOVE_EXACT,
        g1=ev.RemovedExtraBlock,
    ),
    _m(
        "removed_missing_last",
        "the Removed leaves out the last evicted block",
        G1,
        R.REMOVE_EXACT,
        g1=ev.RemovedMissingLast,
    ),
    _m(
        "legacy_destroy_silent",
        "legacy: Destroy publishes no Removed",
        LEGACY,
        R.DESTROY_ACTIVE,
        legacy=lg.LegacyDestroySilent,
        needs=("destroy",),
    ),
    # -- event ids, order, source ----------------------------------------------------
    _m("event_id_skip", "the event id jumps by two after every Removed", G1, R.EVENT_ID, g1=ev.EventIdSkip),
    _m(
        "event_id_per_tier",
        "host-pinned events count their ids from 0 on their own",
        KVBM,
        R.EVENT_ID,
        g1=off.EventIdPerTier,
        needs=("offload",),
    ),
    _m(
        "removed_before_stored",
        "a Use publishes its Removed before its Stored",
        G1,
        R.EVENT_ORDER,
        g1=ev.RemovedBeforeStored,
    ),
    _m(
        "legacy_removed_after_stored",
        "legacy: evictions published after the Stored, not before",
        LEGACY,
        R.EVENT_ORDER,
        legacy=lg.LegacyRemovedAfterStored,
    ),
    _m(
        "removed_dp_rank_zero",
        "Removed events carry dp_rank 0 instead of the manager's rank",
        G1,
        R.EVENT_SOURCE,
        g1=ev.RemovedDpRankZero,
    ),
    # -- slots, owners, results -----------------------------------------------------
    _m(
        "evict_active_when_full",
        "with no inactive block left, the oldest active block is evicted",
        KVBM,
        R.EVICT_POLICY,
        g1=lc.EvictActiveWhenFull,
    ),
    _m(
        "deref_inactive_at_one",
        "a block with two owners goes inactive on the first Deref",
        G1,
        R.DEREF_OWNER,
        g1=lc.DerefInactiveAtOne,
    ),
    _m("capacity_one_early", "the last free slot is never handed out", KVBM, R.USE_CAPACITY, g1=lc.CapacityOneEarly),
    _m(
        "atomic_half_placed",
        "atomic: a Use that does not fit keeps the blocks it placed",
        ATOMIC,
        R.USE_CAPACITY,
        g1=lc.AtomicHalfPlaced,
    ),
    _m(
        "use_counts_new_only",
        "a Use returns only the newly allocated blocks, not the hits",
        G1,
        R.USE_CAPACITY,
        g1=lc.UseCountsNewOnly,
    ),
    _m(
        "inactive_hit_takes_slot",
        "reactivating an inactive block also takes a free slot",
        KVBM,
        R.USE_HIT_INACTIVE,
        g1=lc.InactiveHitTakesSlot,
    ),
    _m(
        "partial_leaked_on_deref",
        "a dropped partial block's slot is never freed",
        G1,
        R.DEREF_PARTIAL,
        g1=lc.PartialLeakedOnDeref,
        needs=("partial_blocks",),
    ),
    _m(
        "promote_existing_keeps_slot",
        "promoting into an existing block never frees the partial slot",
        G1,
        R.PROMOTE_EXISTING,
        g1=lc.PromoteExistingKeepsSlot,
        needs=("promote", "partial_blocks"),
    ),
    _m(
        "deref_unknown_ignored",
        "a Deref of a block not held is skipped instead of rejected",
        G1,
        R.DEREF_UNKNOWN,
        g1=lc.DerefUnknownIgnored,
        needs=("typed_errors",),
    ),
    _m(
        "validate_after_mutation",
        "short token ids are rejected only after the blocks were placed",
        G1,
        R.USE_VALIDATE,
        g1=lc.ValidateAfterMutation,
        needs=("typed_errors", "event_token_ids"),
    ),
    _m(
        "active_refs_counts_blocks",
        "active_refs counts active blocks instead of owner references",
        G1,
        R.COUNTERS,
        g1=lc.ActiveRefsCountsBlocks,
    ),
    # -- eviction policies ------------------------------------------------------------
    _m(
        "lineage_parent_first",
        "lineage evicts the oldest block even when it still has inactive children",
        G1,
        R.EVICT_POLICY,
        g1=pol.LineageParentFirst,
        needs=("policy:lineage",),
    ),
    _m(
        "lru_most_recent_first",
        "LRU evicts the most recently released block first",
        G1,
        R.EVICT_POLICY,
        g1=pol.LruMostRecentFirst,
        needs=("policy:lru",),
    ),
    _m(
        "multi_lru_flat",
        "multi-LRU puts every block in the coldest level (plain LRU)",
        G1,
        R.EVICT_POLICY,
        g1=pol.MultiLruFlat,
        needs=("policy:multi_lru",),
    ),
    _m(
        "legacy_evict_mru",
        "legacy: the inactive list is popped from the newest end",
        LEGACY,
        R.EVICT_POLICY,
        legacy=lg.LegacyEvictMru,
    ),
    # -- the offload tier ----------------------------------------------------------------
    _m(
        "slot_released_at_enqueue",
        "an evicted slot is freed when its offload is queued, not at completion",
        KVBM,
        R.QUARANTINE_HOLD,
        g1=off.SlotReleasedAtEnqueue,
        needs=("offload",),
    ),
    _m(
        "quarantine_kept_when_in_g2",
        "the slot of a block G2 already holds is never released",
        KVBM,
        R.QUARANTINE_RELEASE,
        g1=off.QuarantineKeptWhenInG2,
        needs=("offload",),
    ),
    _m(
        "offload_reports_capacity",
        "a Use stopped by an offload reports capacity, not blocked_on_offload",
        KVBM,
        R.OFFLOAD_BLOCKS_USE,
        g1=off.OffloadReportsCapacity,
        needs=("offload",),
    ),
    _m(
        "g2_stored_at_enqueue",
        "the host-pinned Stored is published when the offload is queued",
        KVBM,
        R.G2_STORE_ON_COMPLETE,
        g1=off.G2StoredAtEnqueue,
        needs=("offload", "tier:host_pinned"),
    ),
    _m(
        "g2_evicts_newest",
        "a full G2 evicts its newest block instead of its least recently used",
        KVBM,
        R.G2_EVICT,
        g1=off.G2EvictsNewest,
        needs=("offload", "tier:host_pinned"),
    ),
    _m(
        "device_removed_at_completion",
        "the device Removed of an offloaded block waits for the transfer",
        KVBM,
        R.DEVICE_REMOVE_IMMEDIATE,
        g1=off.DeviceRemovedAtCompletion,
        needs=("offload",),
    ),
    _m(
        "tick_backwards_applied",
        "a tick earlier than the clock moves the clock back",
        KVBM,
        R.TIME_MONOTONIC,
        g1=off.TickBackwardsApplied,
        needs=("offload",),
    ),
    _m(
        "swapin_registers_present",
        "swap-in registers (and Stores) blocks G1 already holds",
        KVBM,
        R.SWAPIN_SKIP_PRESENT,
        g1=off.SwapInRegistersPresent,
        needs=("offload", "swap_in"),
    ),
    _m(
        "swapin_parent_dropped",
        "swapped-in blocks are Stored without the swap-in's parent",
        KVBM,
        R.SWAPIN_ANCHOR,
        g1=off.SwapInParentDropped,
        needs=("offload", "swap_in"),
    ),
    *(_m(m.id, m.description, ("vllm",), m.rule, needs=m.needs) for m in rq.REQUEST_MUTANTS),  # request_bugs.py
)

MUTANTS: dict[str, Mutant] = {m.id: m for m in CATALOGUE}


def mutant(name: str) -> Mutant:
    try:
        return MUTANTS[name]
    except KeyError:
        raise ConfigError(f"unknown mutant {name!r}; known: {UNMUTATED}, {', '.join(sorted(MUTANTS))}") from None


def make_mutant_model(name: str, config: ManagerConfig) -> Model:
    """The model of mutant ``name`` for ``config`` (``none``: the reference)."""
    if name == UNMUTATED:
        return make_model(config)
    return mutant(name).model_for(config)
