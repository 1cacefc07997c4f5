//! Single-bug variants: mistakes an outside port author could plausibly make.
//! Each is off in the clean port and switched on by name (`--variant NAME`).
//! The rule each one should be caught under is listed in the adapter's manifest.

#[derive(Clone, Copy, Default, Debug)]
pub struct Bugs {
    /// the blocked-offload batch is extended to `remaining` instead of `1 + remaining` slots
    pub offload_batch_off_by_one: bool,
    /// an active hit (a clone of a held handle) is counted as a multi-LRU touch
    pub touch_on_active_hit: bool,
    /// the Stored of a Use is anchored to the first reused block, not the last
    pub anchor_first_reused: bool,
    /// the Use's device Removed is published before its Stored
    pub removed_before_stored: bool,
    /// the offloading source slots are released when the transfer is queued
    pub quarantine_released_on_enqueue: bool,
    /// a transfer's deadline ignores the transfers already on the link
    pub deadline_ignores_queue: bool,
    /// an offload of a hash G2 already holds publishes a second host Stored
    pub g2_restore_republished: bool,
    /// token list count checked after the batch was placed (a failed Use is half-applied)
    pub validate_after_mutation: bool,
    /// a G2 eviction publishes no host-pinned Removed
    pub g2_eviction_event_missing: bool,
    /// a block that finds no slot is skipped and the batch goes on, instead of stopping
    pub skip_at_capacity: bool,
    /// the lineage pool forgets a node taken out while it has children (no ghost)
    pub lineage_ghost_dropped: bool,
    /// a Deref is applied block by block and stops at the first unknown block
    pub deref_partially_applied: bool,
    /// LRU: a block re-entering the pool keeps its old position instead of becoming newest
    pub lru_reinsert_keeps_position: bool,
    /// host-pinned events count their own event ids
    pub event_id_per_tier: bool,
    /// G3/G4's presence filter ignores what the tier holds, and the tier takes (and announces) it again
    pub tier_held_block_sent_again: bool,
    /// a copy to G3/G4 is announced when it starts, not when it lands
    pub tier_put_published_at_start: bool,
    /// a G3/G4 hit is copied straight into G1, without the G2 hop
    pub tier_onboard_skips_g2: bool,
    /// G3/G4's presence filter and G3's duplicate check see only the worker's own copies, so a
    /// block another worker holds or is copying there is taken (and announced) again
    pub tier_duplicate_across_workers: bool,
    /// a G3 victim's disk Removed is published by the worker whose copy evicted it, not its owner
    pub tier_g3_removed_by_evictor: bool,
}

pub const NAMES: &[&str] = &[
    "offload_batch_off_by_one",
    "touch_on_active_hit",
    "anchor_first_reused",
    "removed_before_stored",
    "quarantine_released_on_enqueue",
    "deadline_ignores_queue",
    "g2_restore_republished",
    "validate_after_mutation",
    "g2_eviction_event_missing",
    "skip_at_capacity",
    "lineage_ghost_dropped",
    "deref_partially_applied",
    "lru_reinsert_keeps_position",
    "event_id_per_tier",
    "tier_held_block_sent_again",
    "tier_put_published_at_start",
    "tier_onboard_skips_g2",
    "tier_duplicate_across_workers",
    "tier_g3_removed_by_evictor",
];

impl Bugs {
    pub fn from_name(name: &str) -> Result<Bugs, String> {
        let mut b = Bugs::default();
        match name {
            "" | "none" | "clean" => {}
            "offload_batch_off_by_one" => b.offload_batch_off_by_one = true,
            "touch_on_active_hit" => b.touch_on_active_hit = true,
            "anchor_first_reused" => b.anchor_first_reused = true,
            "removed_before_stored" => b.removed_before_stored = true,
            "quarantine_released_on_enqueue" => b.quarantine_released_on_enqueue = true,
            "deadline_ignores_queue" => b.deadline_ignores_queue = true,
            "g2_restore_republished" => b.g2_restore_republished = true,
            "validate_after_mutation" => b.validate_after_mutation = true,
            "g2_eviction_event_missing" => b.g2_eviction_event_missing = true,
            "skip_at_capacity" => b.skip_at_capacity = true,
            "lineage_ghost_dropped" => b.lineage_ghost_dropped = true,
            "deref_partially_applied" => b.deref_partially_applied = true,
            "lru_reinsert_keeps_position" => b.lru_reinsert_keeps_position = true,
            "event_id_per_tier" => b.event_id_per_tier = true,
            "tier_held_block_sent_again" => b.tier_held_block_sent_again = true,
            "tier_put_published_at_start" => b.tier_put_published_at_start = true,
            "tier_onboard_skips_g2" => b.tier_onboard_skips_g2 = true,
            "tier_duplicate_across_workers" => b.tier_duplicate_across_workers = true,
            "tier_g3_removed_by_evictor" => b.tier_g3_removed_by_evictor = true,
            other => return Err(format!("unknown variant '{other}' (known: none, {})", NAMES.join(", "))),
        }
        Ok(b)
    }
}
