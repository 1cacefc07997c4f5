//! The kvbm mocker's KvManager, ported: G1 lifecycle (Use / Deref / Promote),
//! the block manager underneath (reset pool, registry by lineage hash, inactive
//! pool), KV events, and the hook into the offload engine (offload.rs).
//!
//! Upstream: ai-dynamo/dynamo lib/mocker/src/kv_manager/ (the kvbm KvManager:
//! process_use, process_deref, process_promote, handle_evictions_with_source_slots,
//! register_swapped_in_blocks, reserve_swap_in_destination_slots). Panics of the
//! source (asserts, `expect`) become typed rejections checked before any change.

use std::collections::HashMap;

use crate::offload::{OffloadBlock, OffloadConfig, OffloadEngine, RouterEvent, SwapEntry};
use crate::pools::{InactivePool, Plh, Policy};
use crate::variants::Bugs;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BlockRef {
    Full(u64),
    Partial(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Device,
    HostPinned,
    Disk,
    External,
}

#[derive(Clone, Debug)]
pub enum EventData {
    Stored { parent: Option<u64>, blocks: Vec<(u64, u64)> },
    Removed(Vec<u64>),
}

#[derive(Clone, Debug)]
pub struct Event {
    pub event_id: u64,
    pub tier: Tier,
    pub data: EventData,
    pub token_ids: Option<Vec<Vec<u32>>>,
}

/// What the mocker remembers about a block it registered, keyed by lineage hash.
#[derive(Clone, Debug)]
pub struct Info {
    pub seq: u64,
    pub parent_hash: Option<u64>,
    pub local_hash: u64,
    pub token_ids: Option<Vec<u32>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    Capacity,
    BlockedOnOffload,
    NoHits,
    Scheduled,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Capacity => "capacity",
            Status::BlockedOnOffload => "blocked_on_offload",
            Status::NoHits => "no_hits",
            Status::Scheduled => "scheduled",
        }
    }
}

pub struct Rejection {
    pub rule: &'static str,
    pub message: String,
}

fn reject<T>(rule: &'static str, message: String) -> Result<T, Rejection> {
    Err(Rejection { rule, message })
}

pub struct Counters {
    pub active_blocks: usize,
    pub active_refs: usize,
    pub inactive_blocks: usize,
    pub free_blocks: usize,
    pub quarantined_blocks: usize,
}

/// kvbm-logical's BlockManager as the KvManager sees it: a reset pool of free
/// slots, registered blocks by lineage hash with their handle counts, and the
/// inactive pool of the configured backend.
pub struct BlockManager {
    pub capacity: usize,
    pub free: usize,
    handles: HashMap<Plh, usize>,
    pub pool: InactivePool,
    lru_stamps: HashMap<Plh, u64>,
}

impl BlockManager {
    fn new(capacity: usize, policy: Policy, bugs: Bugs) -> Self {
        Self {
            capacity,
            free: capacity,
            handles: HashMap::new(),
            pool: InactivePool::new(policy, capacity, bugs),
            lru_stamps: HashMap::new(),
        }
    }

    /// allocate_blocks_with_evictions(1): a reset slot first, else the pool's victim.
    pub fn allocate_one(&mut self) -> Option<Vec<Plh>> {
        if self.free > 0 {
            self.free -= 1;
            return Some(Vec::new());
        }
        let victim = self.pool.evict()?;
        self.handles.remove(&victim);
        self.lru_stamps.remove(&victim);
        Some(vec![victim])
    }

    pub fn release_slot(&mut self, n: usize) {
        self.free += n;
    }

    /// A staged slot becomes a registered block with one handle.
    fn register(&mut self, plh: Plh) {
        self.pool.tracker.touch(plh);
        self.handles.insert(plh, 1);
    }

    /// match_blocks of one lineage hash: a registered block gains a handle;
    /// an inactive one leaves the pool (a touch).
    fn match_plh(&mut self, plh: Plh) -> bool {
        let Some(&n) = self.handles.get(&plh) else {
            return false;
        };
        if n == 0 {
            if let Some(stamp) = self.pool.take(plh) {
                self.lru_stamps.insert(plh, stamp);
            }
            self.pool.tracker.touch(plh);
        }
        self.handles.insert(plh, n + 1);
        true
    }

    fn drop_handle(&mut self, plh: Plh) {
        let n = self.handles.get_mut(&plh).expect("handle of an unregistered block");
        *n -= 1;
        if *n == 0 {
            let stamp = self.lru_stamps.remove(&plh);
            self.pool.insert(plh, stamp);
        }
    }

    /// check_presence in G1: registered, active or inactive.
    pub fn present(&self, plh: Plh) -> bool {
        self.handles.contains_key(&plh)
    }

    /// A registered block whose last handle is dropped at once (swap-in registration).
    fn register_inactive(&mut self, plh: Plh) {
        self.register(plh);
        self.drop_handle(plh);
    }
}

pub struct KvManager {
    pub bm: BlockManager,
    /// the source stages blocks of this size; the wire's token lists are not checked against it (nor are they there)
    #[allow(dead_code)]
    block_size: usize,
    dp_rank: u64,
    next_event_id: u64,
    next_host_event_id: u64,
    active_partial: HashMap<String, ()>,
    active_full: HashMap<u64, Vec<Plh>>,
    registered_blocks: HashMap<Plh, Info>,
    pub offload: Option<OffloadEngine>,
    pub events: Vec<Event>,
    bugs: Bugs,
}

pub struct UseArgs<'a> {
    pub blocks: &'a [BlockRef],
    pub local_hashes: &'a [u64],
    pub plhs: &'a [Plh],
    pub token_ids: Option<&'a [Vec<u32>]>,
    pub parent: Option<&'a BlockRef>,
}

impl KvManager {
    pub fn new(
        capacity: usize,
        block_size: usize,
        dp_rank: u64,
        policy: Policy,
        offload: Option<OffloadConfig>,
        bugs: Bugs,
        worker: usize,
        lower: Option<std::rc::Rc<std::cell::RefCell<crate::lower::SharedLower>>>,
    ) -> Self {
        Self {
            bm: BlockManager::new(capacity, policy, bugs),
            block_size,
            dp_rank,
            next_event_id: 0,
            next_host_event_id: 0,
            active_partial: HashMap::new(),
            active_full: HashMap::new(),
            registered_blocks: HashMap::new(),
            offload: offload.map(|c| OffloadEngine::new(c, bugs, worker, lower)),
            events: Vec::new(),
            bugs,
        }
    }

    /// Publish the lower-tier events this worker owes (after each step of any
    /// worker of the process: a G3 victim's Removed is its owner's to publish).
    pub fn publish_lower(&mut self) {
        let Some(engine) = self.offload.as_mut() else { return };
        let events = engine.take_lower_events();
        self.publish_router_events(events);
    }

    pub fn dp_rank(&self) -> u64 {
        self.dp_rank
    }

    pub fn counters(&self) -> Counters {
        let inactive = self.bm.pool.len();
        Counters {
            active_blocks: self.bm.capacity - self.bm.free - inactive,
            active_refs: self.active_partial.len() + self.active_full.values().map(|v| v.len()).sum::<usize>(),
            inactive_blocks: inactive,
            free_blocks: self.bm.free,
            quarantined_blocks: self.offload.as_ref().map_or(0, |o| o.quarantined()),
        }
    }

    pub fn earliest_deadline(&self) -> Option<f64> {
        self.offload.as_ref().and_then(|o| o.earliest_deadline())
    }

    fn publish(&mut self, tier: Tier, data: EventData, token_ids: Option<Vec<Vec<u32>>>) {
        let event_id = if tier == Tier::HostPinned && self.bugs.event_id_per_tier {
            self.next_host_event_id += 1;
            self.next_host_event_id - 1
        } else {
            self.next_event_id += 1;
            self.next_event_id - 1
        };
        self.events.push(Event { event_id, tier, data, token_ids });
    }

    fn publish_stored(
        &mut self,
        tier: Tier,
        seqs: Vec<u64>,
        locals: &[u64],
        parent: Option<u64>,
        token_ids: Option<Vec<Vec<u32>>>,
    ) {
        if seqs.is_empty() {
            return;
        }
        let blocks = seqs.iter().enumerate().map(|(i, s)| (*s, locals.get(i).copied().unwrap_or(0))).collect();
        self.publish(tier, EventData::Stored { parent, blocks }, token_ids);
    }

    fn publish_router_events(&mut self, events: Vec<RouterEvent>) {
        for e in events {
            match e {
                RouterEvent::Stored(info) => {
                    let tokens = info.token_ids.map(|t| vec![t]);
                    self.publish_stored(Tier::HostPinned, vec![info.seq], &[info.local_hash], info.parent_hash, tokens);
                }
                RouterEvent::Removed(seq) => {
                    self.publish(Tier::HostPinned, EventData::Removed(vec![seq]), None);
                }
                RouterEvent::Lower(ev) => {
                    let tier = |t: crate::lower::Lower| match t {
                        crate::lower::Lower::G3 => Tier::Disk,
                        crate::lower::Lower::G4 => Tier::External,
                    };
                    match ev {
                        crate::lower::LowerEvent::Stored(t, info) => {
                            let tokens = info.token_ids.map(|x| vec![x]);
                            self.publish_stored(tier(t), vec![info.seq], &[info.local_hash], info.parent_hash, tokens);
                        }
                        crate::lower::LowerEvent::Removed(t, seq) => {
                            self.publish(tier(t), EventData::Removed(vec![seq]), None);
                        }
                    }
                }
            }
        }
    }

    fn offload_attached(&self) -> bool {
        self.offload.is_some()
    }

    /// One slot for a Use or a reservation: Ok((allocated?, evicted)) or Err(evicted) when the
    /// eviction must wait for an offload (the slot then stays held as a source slot).
    fn allocate_one_g1_slot(&mut self) -> Option<Result<Vec<Plh>, Vec<Plh>>> {
        let evicted = self.bm.allocate_one()?;
        if self.offload_attached() && !evicted.is_empty() {
            return Some(Err(evicted));
        }
        Some(Ok(evicted))
    }

    fn full_block_present_in_g1(&self, seq: u64, plh: Plh) -> bool {
        self.active_full.contains_key(&seq) || self.bm.present(plh)
    }

    fn pending_use_allocations(&self, blocks: &[BlockRef], plhs: &[Plh], mut plh_idx: usize) -> usize {
        let mut n = 0;
        for b in blocks {
            match b {
                BlockRef::Full(seq) => {
                    let Some(plh) = plhs.get(plh_idx).copied() else { break };
                    plh_idx += 1;
                    if !self.full_block_present_in_g1(*seq, plh) {
                        n += 1;
                    }
                }
                BlockRef::Partial(u) => {
                    if !self.active_partial.contains_key(u) {
                        n += 1;
                    }
                }
            }
        }
        n
    }

    fn extend_blocked_batch(&mut self, evicted: &mut Vec<Plh>, slots: &mut usize, max_slots: usize) {
        while *slots < max_slots {
            let Some(more) = self.bm.allocate_one() else { return };
            if more.is_empty() {
                // a free slot: no offload needed for it, give it back and stop
                self.bm.release_slot(1);
                return;
            }
            evicted.extend(more);
            *slots += 1;
        }
    }

    fn validate_use(&self, a: &UseArgs, check_tokens: bool) -> Result<(), Rejection> {
        let full = a.blocks.iter().filter(|b| matches!(b, BlockRef::Full(_))).count();
        if a.plhs.len() != full {
            return reject("USE-VALIDATE", format!("plhs has {} entries for {} full blocks", a.plhs.len(), full));
        }
        if !a.local_hashes.is_empty() && a.local_hashes.len() != full {
            return reject(
                "USE-VALIDATE",
                format!("local_hashes has {} entries for {} full blocks", a.local_hashes.len(), full),
            );
        }
        if check_tokens {
            if let Some(t) = a.token_ids {
                if t.len() != full {
                    return reject("USE-VALIDATE", format!("token_ids has {} lists for {} full blocks", t.len(), full));
                }
            }
        }
        if let Some(BlockRef::Partial(u)) = a.parent {
            return reject("USE-VALIDATE", format!("the parent of a Use cannot be a partial block ({u})"));
        }
        Ok(())
    }

    pub fn process_use(&mut self, a: UseArgs) -> Result<(usize, Status), Rejection> {
        self.validate_use(&a, !self.bugs.validate_after_mutation)?;
        let blocks = a.blocks;
        let mut blocks_stored: Vec<u64> = Vec::new();
        let mut stored_locals: Vec<u64> = Vec::new();
        let mut stored_tokens: Option<Vec<Vec<u32>>> = a.token_ids.map(|_| Vec::new());
        let mut evicted: Vec<Plh> = Vec::new();
        let mut blocked_evicted: Vec<Plh> = Vec::new();
        let mut blocked_slots = 0usize;
        let mut parent_block: Option<u64> = match a.parent {
            Some(BlockRef::Full(h)) => Some(*h),
            _ => None,
        };
        let mut reused_seen = false;
        let mut metadata_parent = parent_block;
        let mut plh_idx = 0usize;
        let mut allocated = 0usize;
        let mut status = Status::Ok;
        for (i, block) in blocks.iter().enumerate() {
            let mut new_store = false;
            match block {
                BlockRef::Full(seq) => {
                    let full_idx = plh_idx;
                    if let Some(v) = self.active_full.get_mut(seq) {
                        let first = v[0];
                        v.push(first);
                        let first_handle = first;
                        plh_idx += 1;
                        self.bm.handles_add(first_handle);
                        if self.bugs.touch_on_active_hit {
                            self.bm.pool.tracker.touch(first_handle);
                        }
                    } else {
                        let plh = a.plhs[plh_idx];
                        plh_idx += 1;
                        if self.bm.match_plh(plh) {
                            self.active_full.entry(*seq).or_default().push(plh);
                        } else {
                            let Some(alloc) = self.allocate_one_g1_slot() else {
                                if self.bugs.skip_at_capacity {
                                    status = Status::Capacity;
                                    continue;
                                }
                                status = Status::Capacity;
                                break;
                            };
                            match alloc {
                                Ok(ev) => evicted.extend(ev),
                                Err(ev) => {
                                    blocked_evicted.extend(ev);
                                    blocked_slots += 1;
                                    let remaining = self.pending_use_allocations(&blocks[i + 1..], a.plhs, plh_idx);
                                    let bound = if self.bugs.offload_batch_off_by_one { remaining } else { 1 + remaining };
                                    self.extend_blocked_batch(&mut blocked_evicted, &mut blocked_slots, bound);
                                    status = Status::BlockedOnOffload;
                                    break;
                                }
                            }
                            self.bm.register(plh);
                            self.active_full.entry(*seq).or_default().push(plh);
                            self.registered_blocks.insert(
                                plh,
                                Info {
                                    seq: *seq,
                                    parent_hash: metadata_parent,
                                    local_hash: a.local_hashes.get(full_idx).copied().unwrap_or(0),
                                    token_ids: a.token_ids.and_then(|t| t.get(full_idx).cloned()),
                                },
                            );
                            new_store = true;
                            blocks_stored.push(*seq);
                            if let Some(lh) = a.local_hashes.get(full_idx) {
                                stored_locals.push(*lh);
                            }
                            if let (Some(st), Some(t)) = (stored_tokens.as_mut(), a.token_ids) {
                                if let Some(list) = t.get(full_idx) {
                                    st.push(list.clone());
                                }
                            }
                        }
                    }
                    if !new_store && !(self.bugs.anchor_first_reused && reused_seen) {
                        parent_block = Some(*seq);
                        reused_seen = true;
                    }
                    metadata_parent = Some(*seq);
                }
                BlockRef::Partial(uuid) => {
                    if !self.active_partial.contains_key(uuid) {
                        let Some(alloc) = self.allocate_one_g1_slot() else {
                            if self.bugs.skip_at_capacity {
                                status = Status::Capacity;
                                continue;
                            }
                            status = Status::Capacity;
                            break;
                        };
                        match alloc {
                            Ok(ev) => evicted.extend(ev),
                            Err(ev) => {
                                blocked_evicted.extend(ev);
                                blocked_slots += 1;
                                let remaining = self.pending_use_allocations(&blocks[i + 1..], a.plhs, plh_idx);
                                let bound = if self.bugs.offload_batch_off_by_one { remaining } else { 1 + remaining };
                                self.extend_blocked_batch(&mut blocked_evicted, &mut blocked_slots, bound);
                                status = Status::BlockedOnOffload;
                                break;
                            }
                        }
                        self.active_partial.insert(uuid.clone(), ());
                    }
                }
            }
            allocated += 1;
        }
        if self.bugs.validate_after_mutation {
            self.validate_use(&a, true)?;
        }
        if self.bugs.removed_before_stored {
            self.handle_evictions(evicted, 0);
            self.handle_evictions(blocked_evicted, blocked_slots);
            self.publish_stored(Tier::Device, blocks_stored, &stored_locals, parent_block, stored_tokens);
        } else {
            self.publish_stored(Tier::Device, blocks_stored, &stored_locals, parent_block, stored_tokens);
            self.handle_evictions(evicted, 0);
            self.handle_evictions(blocked_evicted, blocked_slots);
        }
        Ok((allocated, status))
    }

    /// handle_evictions_with_source_slots: forget what the mocker knew of each
    /// evicted block, queue the offload (holding the source slots), publish the
    /// device Removed, then whatever the offload engine published.
    fn handle_evictions(&mut self, evicted: Vec<Plh>, source_slots: usize) {
        if evicted.is_empty() {
            self.bm.release_slot(source_slots);
            return;
        }
        let mut seqs = Vec::new();
        let mut offload_blocks = Vec::new();
        for plh in evicted {
            let Some(info) = self.registered_blocks.remove(&plh) else { continue };
            seqs.push(info.seq);
            offload_blocks.push(OffloadBlock { plh, info });
        }
        let mut router_events = Vec::new();
        let mut release_now = source_slots;
        if let Some(engine) = self.offload.as_mut() {
            if !offload_blocks.is_empty() {
                let held = if self.bugs.quarantine_released_on_enqueue { 0 } else { source_slots };
                router_events = engine.enqueue_offload(offload_blocks, held);
                release_now = source_slots - held + engine.take_released();
            }
        }
        self.bm.release_slot(release_now);
        if !seqs.is_empty() {
            self.publish(Tier::Device, EventData::Removed(seqs), None);
        }
        self.publish_router_events(router_events);
    }

    pub fn process_deref(&mut self, blocks: &[BlockRef]) -> Result<(), Rejection> {
        if !self.bugs.deref_partially_applied {
            // what the source would find part-way (a panic) is checked first
            let mut partial_seen: HashMap<&str, ()> = HashMap::new();
            let mut drops: HashMap<u64, usize> = HashMap::new();
            for b in blocks {
                match b {
                    BlockRef::Partial(u) => {
                        if !self.active_partial.contains_key(u) || partial_seen.insert(u, ()).is_some() {
                            return reject("DEREF-UNKNOWN", format!("Deref of partial block {u}, which is not held"));
                        }
                    }
                    BlockRef::Full(h) => {
                        let n = drops.entry(*h).or_insert(0);
                        *n += 1;
                        let have = self.active_full.get(h).map_or(0, |v| v.len());
                        if *n > have {
                            return reject(
                                "DEREF-UNKNOWN",
                                format!("Deref of full block {h} drops more owners than it has ({have})"),
                            );
                        }
                    }
                }
            }
        }
        for b in blocks {
            match b {
                BlockRef::Partial(u) => {
                    if self.active_partial.remove(u).is_none() {
                        return reject("DEREF-UNKNOWN", format!("Deref of partial block {u}, which is not held"));
                    }
                    self.bm.release_slot(1);
                }
                BlockRef::Full(h) => {
                    let Some(v) = self.active_full.get_mut(h) else {
                        return reject("DEREF-UNKNOWN", format!("Deref of full block {h}, which is not active"));
                    };
                    let plh = v.pop().expect("non-empty handle list");
                    if v.is_empty() {
                        self.active_full.remove(h);
                    }
                    self.bm.drop_handle(plh);
                }
            }
        }
        Ok(())
    }

    pub fn process_promote(
        &mut self,
        uuid: &str,
        seq: u64,
        parent_hash: Option<u64>,
        local_hash: u64,
        plh: Plh,
        token_ids: Option<Vec<u32>>,
    ) -> Result<(), Rejection> {
        if self.active_partial.remove(uuid).is_none() {
            return reject("PROMOTE-UNKNOWN", format!("Promote of {uuid}, which is not a held partial block"));
        }
        let is_new = if let Some(v) = self.active_full.get_mut(&seq) {
            let first = v[0];
            v.push(first);
            self.bm.handles_add(first);
            self.bm.release_slot(1);
            false
        } else if self.bm.match_plh(plh) {
            self.bm.release_slot(1);
            self.active_full.insert(seq, vec![plh]);
            false
        } else {
            self.bm.register(plh);
            self.active_full.insert(seq, vec![plh]);
            self.registered_blocks
                .insert(plh, Info { seq, parent_hash, local_hash, token_ids: token_ids.clone() });
            true
        };
        if is_new {
            self.publish_stored(Tier::Device, vec![seq], &[local_hash], parent_hash, token_ids.map(|t| vec![t]));
        }
        Ok(())
    }

    /// Tick the offload engine: (transfers completed, source slots given back).
    pub fn tick(&mut self, now_ms: f64) -> (usize, usize) {
        let Some(engine) = self.offload.as_mut() else { return (0, 0) };
        let completions = engine.tick(now_ms);
        let mut n = 0;
        let mut released = 0;
        for c in completions {
            n += 1;
            match c {
                crate::offload::Completion::Offload { released_slots, events } => {
                    released += released_slots;
                    self.bm.release_slot(released_slots);
                    self.publish_router_events(events);
                }
                crate::offload::Completion::Started { released_slots, events } => {
                    n -= 1;
                    released += released_slots;
                    self.bm.release_slot(released_slots);
                    self.publish_router_events(events);
                }
                crate::offload::Completion::Onboard { entries, parent, slots } => {
                    self.register_swapped_in_blocks(entries, parent, slots);
                }
            }
        }
        (n, released)
    }

    fn register_swapped_in_blocks(&mut self, entries: Vec<SwapEntry>, parent: Option<u64>, slots: usize) {
        let mut stored_seqs = Vec::new();
        let mut stored_locals = Vec::new();
        let mut stored_tokens: Vec<Vec<u32>> = Vec::new();
        let mut stored_parent = parent;
        let mut metadata_parent = parent;
        let mut slots_left = slots;
        for e in entries {
            if slots_left == 0 {
                break;
            }
            slots_left -= 1;
            if self.active_full.contains_key(&e.seq) || self.bm.present(e.plh) {
                self.bm.release_slot(1);
                self.flush_swap_in_group(&mut stored_seqs, &mut stored_locals, &mut stored_tokens, stored_parent);
                stored_parent = Some(e.seq);
                metadata_parent = Some(e.seq);
                continue;
            }
            self.bm.register_inactive(e.plh);
            if let Some(t) = &e.token_ids {
                stored_tokens.push(t.clone());
            }
            self.registered_blocks.insert(
                e.plh,
                Info { seq: e.seq, parent_hash: metadata_parent, local_hash: e.local_hash, token_ids: e.token_ids },
            );
            stored_seqs.push(e.seq);
            stored_locals.push(e.local_hash);
            metadata_parent = Some(e.seq);
        }
        self.bm.release_slot(slots_left);
        self.flush_swap_in_group(&mut stored_seqs, &mut stored_locals, &mut stored_tokens, stored_parent);
    }

    fn flush_swap_in_group(
        &mut self,
        seqs: &mut Vec<u64>,
        locals: &mut Vec<u64>,
        tokens: &mut Vec<Vec<u32>>,
        parent: Option<u64>,
    ) {
        if seqs.is_empty() {
            return;
        }
        let s = std::mem::take(seqs);
        let l = std::mem::take(locals);
        let t = if tokens.len() == s.len() { Some(std::mem::take(tokens)) } else { None };
        tokens.clear();
        self.publish_stored(Tier::Device, s, &l, parent, t);
    }

    /// SwapIn (the scenario format's one operation for the source's
    /// try_batch_swap_in + register_swapped_in_blocks).
    pub fn process_swap_in(&mut self, blocks: &[(u64, Plh)], parent: Option<u64>) -> Result<(usize, Status), Rejection> {
        for (seq, plh) in blocks {
            if let Some(v) = self.active_full.get(seq) {
                if v[0] != *plh {
                    return reject("USE-VALIDATE", format!("swap-in block {seq} is active in G1 under another lineage hash"));
                }
            }
            if let Some(info) = self.registered_blocks.get(plh) {
                if info.seq != *seq {
                    return reject("USE-VALIDATE", format!("swap-in lineage hash of {seq} is registered for block {}", info.seq));
                }
            }
            if let Some(engine) = self.offload.as_ref() {
                if let Some(g2_plh) = engine.g2_plh(*seq) {
                    if g2_plh != *plh {
                        return reject("USE-VALIDATE", format!("swap-in block {seq} is held by G2 under another lineage hash"));
                    }
                }
            }
        }
        let Some(engine) = self.offload.as_mut() else { return Ok((0, Status::NoHits)) };
        let g2_run = engine.g2_prefix(blocks);
        // prepare_onboard_prefix: past the G2 prefix, the G3 run then the G4 run, staged
        // only if G2 can take them all now (the staging reservation)
        let staged = engine.reserve_staging(blocks, g2_run);
        let run = g2_run + staged.len();
        if run == 0 {
            return Ok((0, Status::NoHits));
        }
        // prepare_onboard_prefix: the G2 blocks found are held from here on
        self.offload.as_mut().unwrap().pin_prefix(&blocks[..g2_run]);
        // reserve_swap_in_destination_slots
        let mut reserved = 0usize;
        while reserved < run {
            let Some(alloc) = self.allocate_one_g1_slot() else {
                self.bm.release_slot(reserved);
                let engine = self.offload.as_mut().unwrap();
                engine.release_pins(&blocks[..g2_run]);
                engine.release_staging(staged.len());
                return Ok((0, Status::NoHits));
            };
            match alloc {
                Ok(_) => reserved += 1,
                Err(ev) => {
                    let mut blocked_evicted = ev;
                    let mut blocked_slots = 1usize;
                    let remaining = run - reserved;
                    let bound = if self.bugs.offload_batch_off_by_one { remaining - 1 } else { remaining };
                    self.extend_blocked_batch(&mut blocked_evicted, &mut blocked_slots, bound);
                    self.bm.release_slot(reserved);
                    // the staging reservation goes first; the G2 prefix stays pinned
                    // while the evictions are offloaded
                    self.offload.as_mut().unwrap().release_staging(staged.len());
                    self.handle_evictions(blocked_evicted, blocked_slots);
                    self.offload.as_mut().unwrap().release_pins(&blocks[..g2_run]);
                    return Ok((0, Status::BlockedOnOffload));
                }
            }
        }
        let engine = self.offload.as_mut().unwrap();
        if staged.is_empty() {
            engine.start_onboard(&blocks[..run], parent, reserved);
        } else {
            engine.start_staged_onboard(&blocks[..g2_run], staged, parent, reserved);
        }
        Ok((run, Status::Scheduled))
    }
}

impl BlockManager {
    /// Another handle to a registered block (cloning an ImmutableBlock).
    fn handles_add(&mut self, plh: Plh) {
        *self.handles.get_mut(&plh).expect("clone of an unregistered block") += 1;
    }
}
