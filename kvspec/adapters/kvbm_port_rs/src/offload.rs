//! The G1->G2 offload engine behind the KvManager: transfers with deadlines
//! on a clock that only `tick` moves, the G2 (host pinned) pool, the source
//! slots held until a transfer completes, and onboard (swap-in) jobs.
//!
//! Upstream: ai-dynamo/dynamo lib/mocker/src/kvbm_offload/ (engine.rs:
//! MockOffloadEngine; bandwidth_sharing_model.rs: the link). How transfers share
//! the link, G2's eviction, when G2 allocates and whether blocks already in G2
//! are sent again are options of the configuration (kvspec's OffloadConfig).

use std::collections::{BTreeMap, HashMap};

use crate::manager::Info;
use crate::pools::Plh;
use crate::variants::Bugs;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// one block at a time, in queue order (deadlines fixed at queue time)
    Fifo,
    /// one transfer per enqueue (batches of at most `batch_size` blocks); concurrent
    /// transfers share the bandwidth equally (processor sharing)
    Shared,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum G2Eviction {
    Lru,
    Lineage,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    AtCompletion,
    AtStart,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dedup {
    Resend,
    Filter,
}

#[derive(Clone, Debug)]
pub struct OffloadConfig {
    pub num_g2_blocks: usize,
    /// bytes of one block (0: transfers are instant)
    pub block_bytes: f64,
    /// link throughput in bytes per millisecond
    pub bytes_per_ms: f64,
    pub link: Link,
    pub g2_eviction: G2Eviction,
    pub allocation: Allocation,
    pub dedup: Dedup,
    pub batch_size: usize,
}

impl OffloadConfig {
    fn block_ms(&self) -> f64 {
        if self.block_bytes <= 0.0 {
            0.0
        } else {
            self.block_bytes / self.bytes_per_ms
        }
    }
}

pub struct OffloadBlock {
    pub plh: Plh,
    pub info: Info,
}

#[derive(Clone, Debug)]
pub struct SwapEntry {
    pub seq: u64,
    pub plh: Plh,
    pub local_hash: u64,
    pub token_ids: Option<Vec<u32>>,
}

pub enum RouterEvent {
    Stored(Info),
    Removed(u64),
}

pub enum Completion {
    Offload { released_slots: usize, events: Vec<RouterEvent> },
    Onboard { entries: Vec<SwapEntry>, parent: Option<u64>, slots: usize },
}

enum Kind {
    Offload { blocks: Vec<OffloadBlock>, slots: usize },
    Onboard { entries: Vec<SwapEntry>, parent: Option<u64>, slots: usize },
}

struct Pending {
    seq_no: u64,
    /// fixed deadline (fifo links)
    deadline: f64,
    /// bytes still to move (shared link)
    remaining: f64,
    kind: Kind,
}

struct G2Entry {
    plh: Plh,
    info: Info,
}

pub struct OffloadEngine {
    cfg: OffloadConfig,
    bugs: Bugs,
    clock: f64,
    next_seq: u64,
    offload_free_at: f64,
    onboard_free_at: f64,
    offloads: Vec<Pending>,
    onboards: Vec<Pending>,
    g2: HashMap<u64, G2Entry>,
    g2_order: BTreeMap<u64, u64>,
    g2_stamp: HashMap<u64, u64>,
    g2_next: u64,
    /// destinations allocated for transfers in flight (allocation at start)
    g2_reserved: usize,
    pending_release: usize,
}

impl OffloadEngine {
    pub fn new(cfg: OffloadConfig, bugs: Bugs) -> Self {
        Self {
            cfg,
            bugs,
            clock: 0.0,
            next_seq: 0,
            offload_free_at: 0.0,
            onboard_free_at: 0.0,
            offloads: Vec::new(),
            onboards: Vec::new(),
            g2: HashMap::new(),
            g2_order: BTreeMap::new(),
            g2_stamp: HashMap::new(),
            g2_next: 0,
            g2_reserved: 0,
            pending_release: 0,
        }
    }

    pub fn quarantined(&self) -> usize {
        self.offloads
            .iter()
            .map(|p| match &p.kind {
                Kind::Offload { slots, .. } => *slots,
                Kind::Onboard { .. } => 0,
            })
            .sum()
    }

    pub fn g2_plh(&self, seq: u64) -> Option<Plh> {
        self.g2.get(&seq).map(|e| e.plh)
    }

    fn g2_touch(&mut self, seq: u64) {
        if let Some(old) = self.g2_stamp.remove(&seq) {
            self.g2_order.remove(&old);
        }
        self.g2_next += 1;
        self.g2_order.insert(self.g2_next, seq);
        self.g2_stamp.insert(seq, self.g2_next);
    }

    fn g2_remove(&mut self, seq: u64) {
        self.g2.remove(&seq);
        if let Some(old) = self.g2_stamp.remove(&seq) {
            self.g2_order.remove(&old);
        }
    }

    /// G2's victim: the least recently used entry (lru), or the least recently
    /// used leaf among G2's lineage (lineage: an entry no other entry names as parent).
    fn g2_victim(&self) -> Option<u64> {
        match self.cfg.g2_eviction {
            G2Eviction::Lru => self.g2_order.values().next().copied(),
            G2Eviction::Lineage => {
                let parents: std::collections::HashSet<(u64, u64)> = self
                    .g2
                    .values()
                    .filter_map(|e| e.plh.parent.filter(|_| e.plh.position > 0).map(|p| (e.plh.position - 1, p)))
                    .collect();
                self.g2_order
                    .values()
                    .find(|seq| {
                        let e = &self.g2[*seq];
                        !parents.contains(&(e.plh.position, e.plh.hash))
                    })
                    .copied()
            }
        }
    }

    pub fn earliest_deadline(&self) -> Option<f64> {
        let fifo = self.offloads.iter().chain(self.onboards.iter()).map(|p| self.deadline_of(p));
        fifo.fold(None, |acc: Option<f64>, d| Some(acc.map_or(d, |a| a.min(d))))
    }

    fn deadline_of(&self, p: &Pending) -> f64 {
        if self.cfg.link == Link::Fifo || matches!(p.kind, Kind::Onboard { .. }) {
            return p.deadline;
        }
        // processor sharing: every transfer with no more bytes left than this
        // one moves at the shared rate until this one is done
        if self.cfg.block_ms() == 0.0 {
            return self.clock;
        }
        let total: f64 = self.offloads.iter().map(|o| o.remaining.min(p.remaining)).sum();
        self.clock + total / self.cfg.bytes_per_ms
    }

    /// Queue the offload of evicted blocks, holding `slots` source slots until
    /// it completes. Returns the host-pinned events published at once.
    pub fn enqueue_offload(&mut self, blocks: Vec<OffloadBlock>, slots: usize) -> Vec<RouterEvent> {
        let mut events = Vec::new();
        let mut blocks = blocks;
        let mut free_slots = 0usize;
        if self.cfg.dedup == Dedup::Filter {
            let in_flight: std::collections::HashSet<u64> = self
                .offloads
                .iter()
                .flat_map(|p| match &p.kind {
                    Kind::Offload { blocks, .. } => blocks.iter().map(|b| b.info.seq).collect::<Vec<_>>(),
                    Kind::Onboard { .. } => Vec::new(),
                })
                .collect();
            let before = blocks.len();
            blocks.retain(|b| !self.g2.contains_key(&b.info.seq) && !in_flight.contains(&b.info.seq));
            free_slots += before - blocks.len();
        }
        if self.cfg.allocation == Allocation::AtStart {
            // destinations are allocated now: G2 evicts for them (host Removed now);
            // a block with no destination left is not sent
            let mut kept = Vec::new();
            for b in blocks {
                if self.g2.len() + self.g2_reserved >= self.cfg.num_g2_blocks {
                    match self.g2_victim() {
                        Some(v) => {
                            self.g2_remove(v);
                            if !self.bugs.g2_eviction_event_missing {
                                events.push(RouterEvent::Removed(v));
                            }
                        }
                        None => {
                            free_slots += 1;
                            continue;
                        }
                    }
                }
                self.g2_reserved += 1;
                kept.push(b);
            }
            blocks = kept;
        }
        let held = slots.saturating_sub(free_slots.min(slots));
        let _released = slots - held;
        if blocks.is_empty() {
            self.pending_release += slots;
            return events;
        }
        self.pending_release += slots - held;
        let t = self.cfg.block_ms();
        match self.cfg.link {
            Link::Fifo => {
                let n = blocks.len();
                let mut left = held;
                for (i, b) in blocks.into_iter().enumerate() {
                    let start = if self.bugs.deadline_ignores_queue { self.clock } else { self.clock.max(self.offload_free_at) };
                    let deadline = start + t;
                    self.offload_free_at = deadline;
                    let s = if i + 1 == n { left } else { left.min(1) };
                    left -= s;
                    self.next_seq += 1;
                    self.offloads.push(Pending {
                        seq_no: self.next_seq,
                        deadline,
                        remaining: 0.0,
                        kind: Kind::Offload { blocks: vec![b], slots: s },
                    });
                }
            }
            Link::Shared => {
                let mut left = held;
                let mut chunks: Vec<Vec<OffloadBlock>> = Vec::new();
                for b in blocks {
                    match chunks.last_mut() {
                        Some(c) if c.len() < self.cfg.batch_size.max(1) => c.push(b),
                        _ => chunks.push(vec![b]),
                    }
                }
                let n = chunks.len();
                for (i, c) in chunks.into_iter().enumerate() {
                    let s = if i + 1 == n { left } else { left.min(c.len()) };
                    left -= s;
                    let bytes = if self.bugs.deadline_ignores_queue { self.cfg.block_bytes } else { self.cfg.block_bytes * c.len() as f64 };
                    self.next_seq += 1;
                    self.offloads.push(Pending {
                        seq_no: self.next_seq,
                        deadline: self.clock,
                        remaining: if t == 0.0 { 0.0 } else { bytes },
                        kind: Kind::Offload { blocks: c, slots: s },
                    });
                }
            }
        }
        events
    }

    /// Source slots the engine gave back without a transfer (filtered, no destination).
    pub fn take_released(&mut self) -> usize {
        std::mem::take(&mut self.pending_release)
    }

    /// How many leading blocks G2 holds under the same lineage hash.
    pub fn g2_prefix(&self, blocks: &[(u64, Plh)]) -> usize {
        blocks.iter().take_while(|(seq, plh)| self.g2.get(seq).is_some_and(|e| e.plh == *plh)).count()
    }

    pub fn start_onboard(&mut self, blocks: &[(u64, Plh)], parent: Option<u64>, slots: usize) {
        let mut entries = Vec::new();
        for (seq, _) in blocks {
            let e = &self.g2[seq];
            entries.push(SwapEntry {
                seq: *seq,
                plh: e.plh,
                local_hash: e.info.local_hash,
                token_ids: e.info.token_ids.clone(),
            });
            self.g2_touch(*seq);
        }
        let t = self.cfg.block_ms() * entries.len() as f64;
        let start = self.clock.max(self.onboard_free_at);
        let deadline = start + t;
        self.onboard_free_at = deadline;
        self.next_seq += 1;
        self.onboards.push(Pending {
            seq_no: self.next_seq,
            deadline,
            remaining: 0.0,
            kind: Kind::Onboard { entries, parent, slots },
        });
    }

    fn complete_offload(&mut self, blocks: Vec<OffloadBlock>) -> Vec<RouterEvent> {
        let mut events = Vec::new();
        for b in blocks {
            let seq = b.info.seq;
            if self.cfg.allocation == Allocation::AtStart {
                self.g2_reserved -= 1;
            }
            if self.g2.contains_key(&seq) {
                self.g2_touch(seq);
                if self.bugs.g2_restore_republished {
                    events.push(RouterEvent::Stored(b.info.clone()));
                }
                continue;
            }
            if self.cfg.allocation == Allocation::AtCompletion && self.g2.len() >= self.cfg.num_g2_blocks {
                match self.g2_victim() {
                    Some(v) => {
                        self.g2_remove(v);
                        if !self.bugs.g2_eviction_event_missing {
                            events.push(RouterEvent::Removed(v));
                        }
                    }
                    None => continue,
                }
            }
            self.g2.insert(seq, G2Entry { plh: b.plh, info: b.info.clone() });
            self.g2_touch(seq);
            events.push(RouterEvent::Stored(b.info));
        }
        events
    }

    /// Move the clock to `now_ms` (never back) and complete every transfer due.
    pub fn tick(&mut self, now_ms: f64) -> Vec<Completion> {
        let mut out = Vec::new();
        if now_ms < self.clock {
            return out;
        }
        let mut due: Vec<(f64, u64, bool)> = Vec::new();
        match self.cfg.link {
            Link::Fifo => {
                for p in &self.offloads {
                    if p.deadline <= now_ms {
                        due.push((p.deadline, p.seq_no, true));
                    }
                }
            }
            Link::Shared => {
                // processor sharing from the last update to now
                let mut t = self.clock;
                loop {
                    let active: Vec<usize> = (0..self.offloads.len())
                        .filter(|i| !due.iter().any(|d| d.1 == self.offloads[*i].seq_no))
                        .collect();
                    if active.is_empty() {
                        break;
                    }
                    let n = active.len() as f64;
                    let rate = self.cfg.bytes_per_ms / n;
                    let (imin, rmin) = active
                        .iter()
                        .map(|i| (*i, self.offloads[*i].remaining))
                        .fold((usize::MAX, f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
                    let dt = if self.cfg.block_ms() == 0.0 { 0.0 } else { rmin / rate };
                    if t + dt > now_ms + 1e-9 {
                        let el = now_ms - t;
                        for i in &active {
                            self.offloads[*i].remaining = (self.offloads[*i].remaining - el * rate).max(0.0);
                        }
                        break;
                    }
                    for i in &active {
                        self.offloads[*i].remaining = (self.offloads[*i].remaining - dt * rate).max(0.0);
                    }
                    t += dt;
                    due.push((t, self.offloads[imin].seq_no, true));
                }
            }
        }
        for p in &self.onboards {
            if p.deadline <= now_ms {
                due.push((p.deadline, p.seq_no, false));
            }
        }
        self.clock = now_ms;
        if std::env::var("KVBM_PORT_SPEC_CHECKS").is_ok_and(|v| v == "1") {
            due.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then(a.1.cmp(&b.1)));
        } else {
            due.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then((!a.2).cmp(&!b.2)).then(a.1.cmp(&b.1)));
        }
        for (_, seq_no, is_offload) in due {
            if is_offload {
                let i = self.offloads.iter().position(|p| p.seq_no == seq_no).unwrap();
                let p = self.offloads.remove(i);
                if let Kind::Offload { blocks, slots } = p.kind {
                    let events = self.complete_offload(blocks);
                    out.push(Completion::Offload { released_slots: slots, events });
                }
            } else {
                let i = self.onboards.iter().position(|p| p.seq_no == seq_no).unwrap();
                let p = self.onboards.remove(i);
                if let Kind::Onboard { entries, parent, slots } = p.kind {
                    out.push(Completion::Onboard { entries, parent, slots });
                }
            }
        }
        out
    }
}
