//! G3 (local disk) and G4 (object store) behind one worker's G2.
//!
//! Upstream: ai-dynamo/dynamo lib/mocker/src/kvbm_offload/ (shared_g3.rs SharedG3Pool: one
//! lineage block manager per process that rejects duplicates, with capacity reservations and
//! a G2<->G3 processor-sharing model per direction; shared_g4.rs SharedG4Store: objects keyed
//! by lineage hash, inserted when a put completes, never evicted; engine.rs prepare_tick: the
//! blocks a G1->G2 transfer brought are chained to G2->G3 and G2->G4, presence-filtered,
//! batch_size per transfer, one G2->G3 transfer at a time, up to batch_size G2->G4;
//! prepare_onboard_prefix / start_onboard_prefix: a swap-in hit past the G2 prefix is staged
//! G3->G2 and G4->G2 first). This port serves one worker, so the shared tiers are its own and
//! a completion is delivered at the tick that completes it. The events (kvspec's option
//! lower_tier_events): none, or a disk / external Stored when a copy lands and a disk Removed
//! of a G3 victim.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::manager::Info;
use crate::pools::{Lineage, Plh};
use crate::variants::Bugs;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lower {
    G3,
    G4,
}

#[derive(Clone, Debug, Default)]
pub struct LowerConfig {
    pub g3_blocks: Option<usize>,
    pub g3_bytes_per_ms: f64,
    pub g4: bool,
    pub g4_bytes_per_ms: f64,
    pub owner_events: bool,
}

impl LowerConfig {
    pub fn on(&self) -> bool {
        self.g3_blocks.is_some() || self.g4
    }
}

/// What the lower tiers tell the G2 engine to publish.
pub enum LowerEvent {
    Stored(Lower, Info),
    Removed(Lower, u64),
}

pub struct Put {
    pub tier: Lower,
    pub blocks: Vec<(Plh, Info)>,
    /// the G2 source blocks the copy pinned
    pub pinned: Vec<(u64, Plh)>,
}

/// A transfer on a lower tier's link.
pub enum Xfer {
    Put(Put),
    /// blocks of swap-in `onboard` coming back into G2
    Stage { entries: Vec<(Plh, Info)>, onboard: u64 },
}

pub struct LowerTiers {
    pub cfg: LowerConfig,
    bugs: Bugs,
    batch_size: usize,
    // G3
    pub g3: HashMap<u64, (Plh, Info)>,
    g3_forest: Lineage,
    g3_dests: usize,
    g3_admitted: usize,
    // G4
    pub g4: HashMap<Plh, Info>,
    pending: HashMap<(Lower, Plh), usize>,
    waiting: HashMap<Lower, VecDeque<Put>>,
    running: HashMap<Lower, usize>,
    pub transfers: HashMap<u64, Xfer>,
    pub events: Vec<LowerEvent>,
}

impl LowerTiers {
    pub fn new(cfg: LowerConfig, batch_size: usize, bugs: Bugs) -> Self {
        Self {
            cfg,
            bugs,
            batch_size: batch_size.max(1),
            g3: HashMap::new(),
            g3_forest: Lineage::default(),
            g3_dests: 0,
            g3_admitted: 0,
            g4: HashMap::new(),
            pending: HashMap::new(),
            waiting: HashMap::new(),
            running: HashMap::new(),
            transfers: HashMap::new(),
            events: Vec::new(),
        }
    }

    fn tier_on(&self, t: Lower) -> bool {
        match t {
            Lower::G3 => self.cfg.g3_blocks.is_some(),
            Lower::G4 => self.cfg.g4,
        }
    }

    fn holds(&self, t: Lower, plh: Plh, seq: u64) -> bool {
        match t {
            Lower::G3 => self.g3.get(&seq).is_some_and(|(p, _)| *p == plh),
            Lower::G4 => self.g4.contains_key(&plh),
        }
    }

    /// The metadata a tier holds for `seq` under `plh`.
    pub fn lookup(&self, t: Lower, seq: u64, plh: Plh) -> Option<Info> {
        match t {
            Lower::G3 => self.g3.get(&seq).filter(|(p, _)| *p == plh).map(|(_, i)| i.clone()),
            Lower::G4 => self.g4.get(&plh).filter(|i| i.seq == seq).cloned(),
        }
    }

    /// Blocks that just reached G2 are enqueued for G3 and G4; the puts to
    /// start now are returned (the engine pins their sources and starts them).
    pub fn cascade(&mut self, blocks: &[(Plh, Info)]) -> Vec<Put> {
        let mut starts = Vec::new();
        for t in [Lower::G3, Lower::G4] {
            if !self.tier_on(t) || blocks.is_empty() {
                continue;
            }
            let mut seen = HashSet::new();
            let mut kept: Vec<(Plh, Info)> = Vec::new();
            for (plh, info) in blocks {
                let held = self.holds(t, *plh, info.seq) && !self.bugs.tier_held_block_sent_again;
                if held || self.pending.contains_key(&(t, *plh)) || !seen.insert(*plh) {
                    continue;
                }
                kept.push((*plh, info.clone()));
            }
            if t == Lower::G3 && !kept.is_empty() {
                // CapacityReservationPolicy: available (free + held, all evictable) less admitted
                let cap = self.cfg.g3_blocks.unwrap_or(0);
                let room = cap.saturating_sub(self.g3_dests + self.g3_admitted);
                kept.truncate(room);
                self.g3_admitted += kept.len();
            }
            for (plh, _) in &kept {
                *self.pending.entry((t, *plh)).or_insert(0) += 1;
            }
            let queue = self.waiting.entry(t).or_default();
            let mut it = kept.into_iter().peekable();
            while it.peek().is_some() {
                let chunk: Vec<(Plh, Info)> = it.by_ref().take(self.batch_size).collect();
                queue.push_back(Put { tier: t, blocks: chunk, pinned: Vec::new() });
            }
            starts.extend(self.startable(t));
        }
        starts
    }

    fn cap(&self, t: Lower) -> usize {
        match t {
            Lower::G3 => 1,
            Lower::G4 => self.batch_size,
        }
    }

    /// The waiting puts of tier `t` that may start now (G3 destinations taken,
    /// evicting as needed); each counts as running from here.
    fn startable(&mut self, t: Lower) -> Vec<Put> {
        let mut out = Vec::new();
        loop {
            if *self.running.get(&t).unwrap_or(&0) >= self.cap(t) {
                break;
            }
            let Some(mut put) = self.waiting.get_mut(&t).and_then(|q| q.pop_front()) else { break };
            if t == Lower::G3 {
                let mut kept = Vec::new();
                for (plh, info) in put.blocks {
                    if self.g3_make_room() {
                        self.g3_dests += 1;
                        kept.push((plh, info));
                    } else {
                        self.g3_admitted -= 1;
                        self.settle(t, plh);
                    }
                }
                put.blocks = kept;
                if put.blocks.is_empty() {
                    continue;
                }
            }
            *self.running.entry(t).or_insert(0) += 1;
            if self.bugs.tier_put_published_at_start && self.cfg.owner_events {
                for (_, info) in &put.blocks {
                    self.events.push(LowerEvent::Stored(t, info.clone()));
                }
            }
            out.push(put);
        }
        out
    }

    fn g3_make_room(&mut self) -> bool {
        let cap = self.cfg.g3_blocks.unwrap_or(0);
        if self.g3.len() + self.g3_dests < cap {
            return true;
        }
        let Some(plh) = self.g3_forest.evict(&Bugs::default()) else { return false };
        let Some(seq) = self.g3.iter().find(|(_, (p, _))| *p == plh).map(|(s, _)| *s) else { return false };
        self.g3.remove(&seq);
        if self.cfg.owner_events {
            self.events.push(LowerEvent::Removed(Lower::G3, seq));
        }
        true
    }

    fn settle(&mut self, t: Lower, plh: Plh) {
        if let Some(n) = self.pending.get_mut(&(t, plh)) {
            *n -= 1;
            if *n == 0 {
                self.pending.remove(&(t, plh));
            }
        }
    }

    /// A put landed: register and announce its blocks; the puts that may
    /// start now are returned.
    pub fn landed(&mut self, put: &Put) -> Vec<Put> {
        for (plh, info) in &put.blocks {
            self.settle(put.tier, *plh);
            match put.tier {
                Lower::G3 => {
                    self.g3_dests -= 1;
                    self.g3_admitted -= 1;
                    if self.g3.contains_key(&info.seq) && !self.bugs.tier_held_block_sent_again {
                        continue; // a duplicate is rejected
                    }
                    self.g3.insert(info.seq, (*plh, info.clone()));
                    self.g3_forest.insert(*plh);
                }
                Lower::G4 => {
                    if self.g4.contains_key(plh) {
                        continue;
                    }
                    self.g4.insert(*plh, info.clone());
                }
            }
            if self.cfg.owner_events && !self.bugs.tier_put_published_at_start {
                self.events.push(LowerEvent::Stored(put.tier, info.clone()));
            }
        }
        let t = put.tier;
        if let Some(n) = self.running.get_mut(&t) {
            *n -= 1;
        }
        self.startable(t)
    }
}
