"""The mutant catalogue: each deliberately broken variant and its model.

What each variant is (``name``, one line on what is wrong, the profiles it
breaks, the rule it is expected to violate, what a configuration needs for
the bug to be reachable) is declared in this adapter's ``manifest.toml`` as
a ``[[variants]]`` table, the format any adapter folder uses to ship its own
mutant zoo. This module maps each name to the model classes that carry the
bug. Under a profile a variant does not list, it runs the unmutated
reference, so that the adapter can declare the reference's capabilities and
the whole suite applies.

``none`` (or no variant at all) is not a mutant: it is the unmutated
reference behind the same adapter, which ``kvspec mutants`` runs first as its
sanity check.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvspec.adapters.mutants import event_bugs as ev
from kvspec.adapters.mutants import legacy_bugs as lg
from kvspec.adapters.mutants import lifecycle_bugs as lc
from kvspec.adapters.mutants import offload_bugs as off
from kvspec.adapters.mutants import policy_bugs as pol
from kvspec.adapters.mutants import request_bugs as rq
from kvspec.api import G1Model, LegacyModel, Model, load_manifest, make_model
from kvspec.spec.config import ManagerConfig, ProfileName
from kvspec.spec.errors import ConfigError
from kvspec.spec.registry import LEGACY_NAME
from kvspec.spec.rules import RuleId

#: the variant name that runs the unmutated reference (the sanity check)
UNMUTATED = "none"

G1Cls = type[G1Model] | None
LegacyCls = type[LegacyModel] | None

#: the broken model classes of each block-level mutant: (G1 profiles, legacy)
MODELS: dict[str, tuple[G1Cls, LegacyCls]] = {
    # what gets announced
    "stored_on_inactive_hit": (ev.StoredOnInactiveHit, None),
    "stored_on_active_hit": (ev.StoredOnActiveHit, None),
    "stored_dup_in_batch": (ev.StoredDupInBatch, None),
    "promote_existing_stored": (ev.PromoteExistingStored, None),
    "legacy_stored_on_failed_use": (None, lg.LegacyStoredOnFailedUse),
    "tokens_hash_is_block_hash": (ev.TokensHashIsBlockHash, None),
    # parents
    "parent_first_reused": (ev.ParentFirstReused, None),
    "parent_always_none": (ev.ParentAlwaysNone, lg.LegacyParentAlwaysNone),
    "promote_parent_dropped": (ev.PromoteParentDropped, None),
    # removals
    "removed_extra_block": (ev.RemovedExtraBlock, None),
    "removed_missing_last": (ev.RemovedMissingLast, None),
    "legacy_destroy_silent": (None, lg.LegacyDestroySilent),
    "legacy_destroy_shared_drops_one_owner": (None, lg.LegacyDestroySharedDropsOneOwner),
    "legacy_destroy_shared_derefs_all": (None, lg.LegacyDestroySharedDerefsAll),
    "legacy_destroy_unheld_accepted": (None, lg.LegacyDestroyUnheldAccepted),
    # event ids, order, source
    "event_id_skip": (ev.EventIdSkip, None),
    "event_id_per_tier": (off.EventIdPerTier, None),
    "removed_before_stored": (ev.RemovedBeforeStored, None),
    "legacy_removed_after_stored": (None, lg.LegacyRemovedAfterStored),
    "removed_dp_rank_zero": (ev.RemovedDpRankZero, None),
    # slots, owners, results
    "evict_active_when_full": (lc.EvictActiveWhenFull, None),
    "deref_inactive_at_one": (lc.DerefInactiveAtOne, None),
    "capacity_one_early": (lc.CapacityOneEarly, None),
    "atomic_half_placed": (lc.AtomicHalfPlaced, None),
    "use_counts_new_only": (lc.UseCountsNewOnly, None),
    "inactive_hit_takes_slot": (lc.InactiveHitTakesSlot, None),
    "partial_leaked_on_deref": (lc.PartialLeakedOnDeref, None),
    "promote_existing_keeps_slot": (lc.PromoteExistingKeepsSlot, None),
    "deref_unknown_ignored": (lc.DerefUnknownIgnored, None),
    "validate_after_mutation": (lc.ValidateAfterMutation, None),
    "active_refs_counts_blocks": (lc.ActiveRefsCountsBlocks, None),
    "capacity_skips_to_hits": (lc.CapacitySkipsToHits, None),
    "deref_applied_before_rejection": (lc.DerefAppliedBeforeRejection, None),
    # eviction policies
    "lineage_parent_first": (pol.LineageParentFirst, None),
    "lru_most_recent_first": (pol.LruMostRecentFirst, None),
    "multi_lru_flat": (pol.MultiLruFlat, None),
    "lineage_no_ghost": (pol.LineageNoGhost, None),
    "active_hit_touches": (pol.ActiveHitTouches, None),
    "legacy_evict_mru": (None, lg.LegacyEvictMru),
    # the offload tier
    "slot_released_at_enqueue": (off.SlotReleasedAtEnqueue, None),
    "quarantine_kept_when_in_g2": (off.QuarantineKeptWhenInG2, None),
    "offload_reports_capacity": (off.OffloadReportsCapacity, None),
    "g2_stored_at_enqueue": (off.G2StoredAtEnqueue, None),
    "g2_evicts_newest": (off.G2EvictsNewest, None),
    "g2_evict_on_device_tier": (off.G2EvictOnDeviceTier, None),
    "device_removed_at_completion": (off.DeviceRemovedAtCompletion, None),
    "tick_backwards_applied": (off.TickBackwardsApplied, None),
    "transfer_due_after_deadline": (off.TransferDueAfterDeadline, None),
    "presence_filter_missing": (off.PresenceFilterMissing, None),
    "swapin_registers_present": (off.SwapInRegistersPresent, None),
    "swapin_parent_dropped": (off.SwapInParentDropped, None),
    "swapin_unpins_before_offload": (off.SwapInUnpinsBeforeOffload, None),
}


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
        cls = self.legacy if config.profile == LEGACY_NAME else self.g1
        if cls is None and self.id in rq.BY_ID:  # a request-level mutant: block level is the reference
            return make_model(config)
        assert cls is not None, f"mutant {self.id} lists profile {config.profile} without a model for it"
        return cls(config)


def _catalogue() -> tuple[Mutant, ...]:
    manifest = load_manifest(Path(__file__).resolve().parent)
    out: list[Mutant] = []
    for v in manifest.mutants():
        assert v.rule is not None  # a mutant names its rule (Variant's validator)
        if v.name not in MODELS and v.name not in rq.BY_ID:
            raise ConfigError(f"mutants/manifest.toml declares variant {v.name!r} that catalogue.py has no model for")
        g1, legacy = MODELS.get(v.name, (None, None))
        profiles = tuple(manifest.variant_profiles(v))
        out.append(Mutant(v.name, v.description, profiles, v.rule, g1, legacy, tuple(v.needs)))
    missing = (set(MODELS) | set(rq.BY_ID)) - {m.id for m in out}
    if missing:
        raise ConfigError(f"catalogue.py has models for {', '.join(sorted(missing))}, not declared in manifest.toml")
    return tuple(out)


CATALOGUE: tuple[Mutant, ...] = _catalogue()
MUTANTS: dict[str, Mutant] = {m.id: m for m in CATALOGUE}


def mutant(name: str) -> Mutant:
    try:
        return MUTANTS[name]
    except KeyError:
        raise ConfigError(f"unknown mutant {name!r}; known: {UNMUTATED}, {', '.join(sorted(MUTANTS))}") from None


def make_mutant_model(name: str | None, config: ManagerConfig) -> Model:
    """The model of mutant ``name`` for ``config`` (``none`` or None: the reference)."""
    if name is None or name == UNMUTATED:
        return make_model(config)
    return mutant(name).model_for(config)
