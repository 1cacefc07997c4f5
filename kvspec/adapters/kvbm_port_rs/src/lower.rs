//! G3 (local disk) and G4 (object store) behind one worker's G2.
//!
//! Upstream: ai-dynamo/dynamo lib/mocker/src/kvbm_offload/ (shared_g3.rs SharedG3Pool: one
//! lineage block manager per process that rejects duplicates, with capacity reservations and
//! a G2<->G3 processor-sharing model per direction; shared_g4.rs SharedG4Store: objects keyed
//! by lineage hash, inserted when a put completes, never evicted; engine.rs prepare_tick: the
//! blocks a G1->G2 transfer brought are chained to G2->G3 and G2->G4, presence-filtered,
//! batch_size per transfer, one G2->G3 transfer at a time, up to batch_size G2->G4;
//! prepare_onboard_prefix / start_onboard_prefix: a swap-in hit past the G2 prefix is staged
//! G3->G2 and G4->G2 first). One `SharedLower` serves every worker of the process (a
//! protocol-version-5 session drives several): the G3 pool, the G4 store, their four links
//! (advanced by whichever worker ticks), the presence filter and pending tracker shared by all;
//! the waiting and running puts per worker and tier; a completed transfer waits for the worker
//! that started it, which takes its completions in order when it ticks (worker.rs,
//! drain_completions_ordered). The events (kvspec's option lower_tier_events): none, or a disk /
//! external Stored when a copy lands (the copying worker's) and a disk Removed of a G3 victim
//! (the worker that put the victim there), each queued for the worker that publishes it.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::manager::Info;
use crate::offload::PsLink;
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
    /// the worker whose G2 the blocks come from (it takes the completion)
    pub worker: usize,
    pub tier: Lower,
    pub blocks: Vec<(Plh, Info)>,
    /// the G2 source blocks the copy pinned
    pub pinned: Vec<(u64, Plh)>,
}

/// A transfer on a lower tier's link.
pub enum Xfer {
    Put(Put),
    /// blocks of swap-in `onboard` coming back into G2
    Stage { worker: usize, entries: Vec<(Plh, Info)>, onboard: u64 },
}

impl Xfer {
    fn worker(&self) -> usize {
        match self {
            Xfer::Put(p) => p.worker,
            Xfer::Stage { worker, .. } => *worker,
        }
    }
}

/// The lower tiers of one process, shared by its workers, with their links
/// (g3 put, g4 put, g3 get, g4 get) and the completions each worker has not taken.
pub struct SharedLower {
    pub tiers: LowerTiers,
    pub links: Vec<PsLink>,
    pub clock: f64,
    next_id: u64,
    /// worker -> (time of the advance that completed it, transfer id), in completion order
    done: HashMap<usize, Vec<(f64, u64)>>,
}

impl SharedLower {
    pub fn new(cfg: LowerConfig, batch_size: usize, bugs: Bugs, instant: bool) -> Self {
        let links = vec![
            PsLink::new(cfg.g3_bytes_per_ms, instant),
            PsLink::new(cfg.g4_bytes_per_ms, instant),
            PsLink::new(cfg.g3_bytes_per_ms, instant),
            PsLink::new(cfg.g4_bytes_per_ms, instant),
        ];
        Self { tiers: LowerTiers::new(cfg, batch_size, bugs), links, clock: 0.0, next_id: 0, done: HashMap::new() }
    }

    /// Start a transfer on link `link` at the tiers' clock.
    pub fn start(&mut self, link: usize, bytes: f64, x: Xfer) {
        self.next_id += 1;
        let id = self.next_id;
        let now = self.clock;
        self.links[link].start(now, id, bytes);
        self.tiers.transfers.insert(id, x);
    }

    /// Move the links to `now` (never back); completed transfers wait for their worker.
    pub fn advance(&mut self, now: f64) {
        if now < self.clock {
            return;
        }
        self.clock = now;
        for l in 0..self.links.len() {
            for id in self.links[l].advance_to(now) {
                let w = self.tiers.transfers.get(&id).map_or(0, Xfer::worker);
                self.done.entry(w).or_default().push((now, id));
            }
        }
    }

    /// `worker`'s completed transfers, in completion order.
    pub fn take_done(&mut self, worker: usize) -> Vec<u64> {
        self.done.remove(&worker).unwrap_or_default().into_iter().map(|(_, id)| id).collect()
    }

    /// When something of `worker`'s can next change: a link's next completion,
    /// or at once when a completion waits for it.
    pub fn earliest(&self, worker: usize) -> Option<f64> {
        let mut all: Vec<f64> = self.links.iter().filter_map(|l| l.earliest_finish()).collect();
        all.extend(self.done.get(&worker).into_iter().flatten().map(|(t, _)| *t));
        all.into_iter().reduce(f64::min)
    }

    /// The lower-tier events `worker` owes, in the order they happened.
    pub fn take_events(&mut self, worker: usize) -> Vec<LowerEvent> {
        self.tiers.outbox.remove(&worker).unwrap_or_default()
    }
}

pub struct LowerTiers {
    pub cfg: LowerConfig,
    bugs: Bugs,
    batch_size: usize,
    // G3: block -> (lineage hash, metadata, the worker that put it)
    pub g3: HashMap<u64, (Plh, Info, usize)>,
    g3_forest: Lineage,
    g3_dests: usize,
    g3_admitted: usize,
    // G4
    pub g4: HashMap<Plh, Info>,
    /// (tier, lineage hash, worker) -> copies in flight; shared by the process
    /// (the worker is part of the key only so that a variant can forget it)
    pending: HashMap<(Lower, Plh, usize), usize>,
    waiting: HashMap<(usize, Lower), VecDeque<Put>>,
    running: HashMap<(usize, Lower), usize>,
    pub transfers: HashMap<u64, Xfer>,
    /// worker -> the events it publishes
    pub outbox: HashMap<usize, Vec<LowerEvent>>,
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
            outbox: HashMap::new(),
        }
    }

    fn emit(&mut self, worker: usize, ev: LowerEvent) {
        self.outbox.entry(worker).or_default().push(ev);
    }

    /// Is `plh` on its way to tier `t`, as the filter of `worker` sees it?
    fn in_flight(&self, t: Lower, plh: Plh, worker: usize) -> bool {
        if self.bugs.tier_duplicate_across_workers {
            return self.pending.contains_key(&(t, plh, worker));
        }
        self.pending.keys().any(|(x, p, _)| *x == t && *p == plh)
    }

    fn tier_on(&self, t: Lower) -> bool {
        match t {
            Lower::G3 => self.cfg.g3_blocks.is_some(),
            Lower::G4 => self.cfg.g4,
        }
    }

    fn holds(&self, t: Lower, plh: Plh, seq: u64, worker: usize) -> bool {
        match t {
            Lower::G3 => self.g3.get(&seq).is_some_and(|(p, _, w)| {
                *p == plh && (!self.bugs.tier_duplicate_across_workers || *w == worker)
            }),
            Lower::G4 => self.g4.contains_key(&plh),
        }
    }

    /// The metadata a tier holds for `seq` under `plh`.
    pub fn lookup(&self, t: Lower, seq: u64, plh: Plh) -> Option<Info> {
        match t {
            Lower::G3 => self.g3.get(&seq).filter(|(p, _, _)| *p == plh).map(|(_, i, _)| i.clone()),
            Lower::G4 => self.g4.get(&plh).filter(|i| i.seq == seq).cloned(),
        }
    }

    /// Blocks that just reached `worker`'s G2 are enqueued for G3 and G4; the
    /// puts to start now are returned (the engine pins their sources and starts them).
    pub fn cascade(&mut self, worker: usize, blocks: &[(Plh, Info)]) -> Vec<Put> {
        let mut starts = Vec::new();
        for t in [Lower::G3, Lower::G4] {
            if !self.tier_on(t) || blocks.is_empty() {
                continue;
            }
            let mut seen = HashSet::new();
            let mut kept: Vec<(Plh, Info)> = Vec::new();
            for (plh, info) in blocks {
                let held = self.holds(t, *plh, info.seq, worker) && !self.bugs.tier_held_block_sent_again;
                if held || self.in_flight(t, *plh, worker) || !seen.insert(*plh) {
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
                *self.pending.entry((t, *plh, worker)).or_insert(0) += 1;
            }
            let queue = self.waiting.entry((worker, t)).or_default();
            let mut it = kept.into_iter().peekable();
            while it.peek().is_some() {
                let chunk: Vec<(Plh, Info)> = it.by_ref().take(self.batch_size).collect();
                queue.push_back(Put { worker, tier: t, blocks: chunk, pinned: Vec::new() });
            }
            starts.extend(self.startable(worker, t));
        }
        starts
    }

    fn cap(&self, t: Lower) -> usize {
        match t {
            Lower::G3 => 1,
            Lower::G4 => self.batch_size,
        }
    }

    /// `worker`'s waiting puts of tier `t` that may start now (G3 destinations
    /// taken, evicting as needed); each counts as running from here.
    fn startable(&mut self, worker: usize, t: Lower) -> Vec<Put> {
        let mut out = Vec::new();
        loop {
            if *self.running.get(&(worker, t)).unwrap_or(&0) >= self.cap(t) {
                break;
            }
            let Some(mut put) = self.waiting.get_mut(&(worker, t)).and_then(|q| q.pop_front()) else { break };
            if t == Lower::G3 {
                let mut kept = Vec::new();
                for (plh, info) in put.blocks {
                    if self.g3_make_room(worker) {
                        self.g3_dests += 1;
                        kept.push((plh, info));
                    } else {
                        self.g3_admitted -= 1;
                        self.settle(t, plh, worker);
                    }
                }
                put.blocks = kept;
                if put.blocks.is_empty() {
                    continue;
                }
            }
            *self.running.entry((worker, t)).or_insert(0) += 1;
            if self.bugs.tier_put_published_at_start && self.cfg.owner_events {
                for (_, info) in &put.blocks {
                    self.emit(worker, LowerEvent::Stored(t, info.clone()));
                }
            }
            out.push(put);
        }
        if self.waiting.get(&(worker, t)).is_some_and(|q| q.is_empty()) {
            self.waiting.remove(&(worker, t));
        }
        out
    }

    /// Room in G3 for one more destination; a victim's disk Removed goes to the
    /// worker that put it there (`evictor`: the worker whose copy needs the room).
    fn g3_make_room(&mut self, evictor: usize) -> bool {
        let cap = self.cfg.g3_blocks.unwrap_or(0);
        if self.g3.len() + self.g3_dests < cap {
            return true;
        }
        let Some(plh) = self.g3_forest.evict(&Bugs::default()) else { return false };
        let Some(seq) = self.g3.iter().find(|(_, (p, _, _))| *p == plh).map(|(s, _)| *s) else { return false };
        let (_, _, owner) = self.g3.remove(&seq).expect("a G3 block");
        if self.cfg.owner_events {
            let publisher = if self.bugs.tier_g3_removed_by_evictor { evictor } else { owner };
            self.emit(publisher, LowerEvent::Removed(Lower::G3, seq));
        }
        true
    }

    fn settle(&mut self, t: Lower, plh: Plh, worker: usize) {
        if let Some(n) = self.pending.get_mut(&(t, plh, worker)) {
            *n -= 1;
            if *n == 0 {
                self.pending.remove(&(t, plh, worker));
            }
        }
    }

    /// A put landed: register and announce its blocks; the puts of the same
    /// worker that may start now are returned.
    pub fn landed(&mut self, put: &Put) -> Vec<Put> {
        let w = put.worker;
        for (plh, info) in &put.blocks {
            self.settle(put.tier, *plh, w);
            match put.tier {
                Lower::G3 => {
                    self.g3_dests -= 1;
                    self.g3_admitted -= 1;
                    let dup = match self.g3.get(&info.seq) {
                        None => false,
                        Some((_, _, owner)) => {
                            !self.bugs.tier_held_block_sent_again
                                && !(self.bugs.tier_duplicate_across_workers && *owner != w)
                        }
                    };
                    if dup {
                        continue; // a duplicate is rejected
                    }
                    if self.g3.insert(info.seq, (*plh, info.clone(), w)).is_none() {
                        self.g3_forest.insert(*plh);
                    }
                }
                Lower::G4 => {
                    if self.g4.contains_key(plh) {
                        continue;
                    }
                    self.g4.insert(*plh, info.clone());
                }
            }
            if self.cfg.owner_events && !self.bugs.tier_put_published_at_start {
                self.emit(w, LowerEvent::Stored(put.tier, info.clone()));
            }
        }
        let t = put.tier;
        if let Some(n) = self.running.get_mut(&(w, t)) {
            *n -= 1;
            if *n == 0 {
                self.running.remove(&(w, t));
            }
        }
        self.startable(w, t)
    }
}
