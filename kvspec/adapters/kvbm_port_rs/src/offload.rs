//! The G1->G2 offload engine behind the KvManager: transfers on a clock that
//! only `tick` moves, the G2 (host pinned) pool, the source slots held until a
//! job's blocks have arrived, and onboard (swap-in) transfers.
//!
//! Upstream: ai-dynamo/dynamo lib/mocker/src/kvbm_offload/ (engine.rs:
//! MockOffloadEngine, its G1->G2 pipeline with a PresenceFilter and a capacity
//! reservation policy, batch_size = max_concurrent_transfers =
//! offload_batch_size; bandwidth_sharing_model.rs: BandwidthSharingModel, the
//! processor-sharing link). kvspec's OffloadConfig names the choices engines
//! differ in; the defaults are Dynamo's (shared link, lineage G2, destinations
//! taken at transfer start, presence filter) and the "legacy" values are the
//! serial FIFO link, LRU G2, allocation at completion and resending.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::rc::Rc;

use crate::lower::{Lower, LowerConfig, LowerEvent, Put, SharedLower, Xfer};
use crate::manager::Info;
use crate::pools::{Lineage, Plh};
use crate::variants::Bugs;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Fifo,
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

/// What a tick returns: nothing (the KvManager's tick_offload_engine), the
/// source slots it gave back (MockOffloadEngine::tick), or the transfers it
/// completed (kvspec's older choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TickResult {
    Nothing,
    ReleasedSlots,
    Transfers,
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
    pub tick_result: TickResult,
    pub lower: LowerConfig,
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
    Lower(LowerEvent),
}

pub enum Completion {
    Offload { released_slots: usize, events: Vec<RouterEvent> },
    /// batches that started in a tick (not a completed transfer)
    Started { released_slots: usize, events: Vec<RouterEvent> },
    Onboard { entries: Vec<SwapEntry>, parent: Option<u64>, slots: usize },
}

/// A processor-sharing link: every active transfer moves at bandwidth / n;
/// the one with the fewest bytes left completes first (the first such in the
/// active list, which a completion reorders by moving the last entry into its
/// place, as the source's `swap_remove` does).
pub struct PsLink {
    bytes_per_ms: f64,
    instant: bool,
    active: Vec<(u64, f64)>,
    last_ms: f64,
}

impl PsLink {
    pub fn new(bytes_per_ms: f64, instant: bool) -> Self {
        Self { bytes_per_ms, instant, active: Vec::new(), last_ms: 0.0 }
    }

    pub fn start(&mut self, now_ms: f64, id: u64, bytes: f64) {
        self.last_ms = self.last_ms.max(now_ms);
        self.active.push((id, if self.instant { 0.0 } else { bytes }));
    }

    fn min_index(&self) -> Option<(usize, f64)> {
        let mut best: Option<(usize, f64)> = None;
        for (i, (_, r)) in self.active.iter().enumerate() {
            if best.is_none_or(|(_, b)| *r < b) {
                best = Some((i, *r));
            }
        }
        best
    }

    /// Advance to `now_ms`; the ids completed on the way, in completion order.
    pub fn advance_to(&mut self, now_ms: f64) -> Vec<u64> {
        let mut done = Vec::new();
        if now_ms < self.last_ms {
            return done;
        }
        loop {
            let Some((imin, rmin)) = self.min_index() else {
                self.last_ms = now_ms;
                break;
            };
            let rate = self.bytes_per_ms / self.active.len() as f64;
            let dt = if self.instant { 0.0 } else { rmin / rate };
            let next = self.last_ms + dt;
            if next > now_ms + 1e-9 {
                let el = now_ms - self.last_ms;
                if !self.instant && el > 0.0 {
                    for t in &mut self.active {
                        t.1 = (t.1 - el * rate).max(0.0);
                    }
                }
                self.last_ms = now_ms;
                break;
            }
            if !self.instant && dt > 0.0 {
                for t in &mut self.active {
                    t.1 = (t.1 - dt * rate).max(0.0);
                }
            }
            self.last_ms = next;
            done.push(self.active.swap_remove(imin).0);
        }
        done
    }

    pub fn earliest_finish(&self) -> Option<f64> {
        let (_, r) = self.min_index()?;
        if self.instant {
            return Some(self.last_ms);
        }
        let total: f64 = self.active.iter().map(|(_, x)| x.min(r)).sum();
        Some(self.last_ms + total / self.bytes_per_ms)
    }
}

/// A batch of blocks moving to G2 (shared link) or one block (fifo link).
struct Batch {
    id: u64,
    job: u64,
    blocks: Vec<OffloadBlock>,
    /// fifo only: the fixed deadline and the slots this block releases
    deadline: f64,
    slots: usize,
}

struct Job {
    slots: usize,
    outstanding: usize,
}

struct Onboard {
    id: u64,
    deadline: f64,
    entries: Vec<SwapEntry>,
    parent: Option<u64>,
    slots: usize,
}

struct G2Entry {
    plh: Plh,
    info: Info,
}

pub struct OffloadEngine {
    cfg: OffloadConfig,
    bugs: Bugs,
    clock: f64,
    next_id: u64,
    // fifo links
    offload_free_at: f64,
    onboard_free_at: f64,
    // shared links
    offload_link: PsLink,
    onboard_link: PsLink,
    jobs: HashMap<u64, Job>,
    active: Vec<Batch>,
    waiting: VecDeque<Batch>,
    onboards: Vec<Onboard>,
    // G2
    g2: HashMap<u64, G2Entry>,
    g2_by_plh: HashMap<Plh, u64>,
    g2_order: BTreeMap<u64, u64>,
    g2_stamp: HashMap<u64, u64>,
    g2_next: u64,
    g2_forest: Lineage,
    g2_pins: HashMap<u64, usize>,
    g2_reserved: usize,
    /// at_start: blocks admitted at enqueue that have not arrived (the
    /// capacity policy's reservation counter)
    g2_admitted: usize,
    pending_release: usize,
    // G3 / G4 (lower.rs), shared by every worker of the process
    lower: Option<Rc<RefCell<SharedLower>>>,
    /// this engine's worker id in the process
    worker: usize,
    /// swap-ins waiting for their staged blocks: id -> (entries, parent, slots, stages left)
    staged: HashMap<u64, (Vec<SwapEntry>, Option<u64>, usize, usize)>,
    /// G2 blocks staged back from G3/G4: never announced, so their eviction is not either
    g2_silent: HashSet<u64>,
}

impl OffloadEngine {
    /// The lower tiers of a process of several workers: one `SharedLower` every engine holds.
    pub fn shared_lower(cfg: &OffloadConfig, bugs: Bugs) -> Option<Rc<RefCell<SharedLower>>> {
        let instant = cfg.block_ms() == 0.0;
        cfg.lower
            .on()
            .then(|| Rc::new(RefCell::new(SharedLower::new(cfg.lower.clone(), cfg.batch_size, bugs, instant))))
    }

    /// Worker `worker`'s engine; `lower`: the process's shared tiers (None: its own, if on).
    pub fn new(cfg: OffloadConfig, bugs: Bugs, worker: usize, lower: Option<Rc<RefCell<SharedLower>>>) -> Self {
        let instant = cfg.block_ms() == 0.0;
        let mut cfg = cfg;
        if cfg.link == Link::Fifo {
            // kvspec's serial link is its behaviour from before the options as a
            // whole: destinations taken on arrival, every evicted block sent
            cfg.allocation = Allocation::AtCompletion;
            cfg.dedup = Dedup::Resend;
        }
        let lower = lower.or_else(|| Self::shared_lower(&cfg, bugs));
        Self {
            offload_link: PsLink::new(cfg.bytes_per_ms, instant),
            onboard_link: PsLink::new(cfg.bytes_per_ms, instant),
            cfg,
            bugs,
            clock: 0.0,
            next_id: 0,
            offload_free_at: 0.0,
            onboard_free_at: 0.0,
            jobs: HashMap::new(),
            active: Vec::new(),
            waiting: VecDeque::new(),
            onboards: Vec::new(),
            g2: HashMap::new(),
            g2_by_plh: HashMap::new(),
            g2_order: BTreeMap::new(),
            g2_stamp: HashMap::new(),
            g2_next: 0,
            g2_forest: Lineage::default(),
            g2_pins: HashMap::new(),
            g2_reserved: 0,
            g2_admitted: 0,
            pending_release: 0,
            lower,
            worker,
            staged: HashMap::new(),
            g2_silent: HashSet::new(),
        }
    }

    pub fn tick_result(&self) -> TickResult {
        self.cfg.tick_result
    }

    fn shared(&self) -> bool {
        self.cfg.link == Link::Shared
    }

    pub fn quarantined(&self) -> usize {
        if self.shared() {
            self.jobs.values().map(|j| j.slots).sum()
        } else {
            self.active.iter().map(|b| b.slots).sum()
        }
    }

    pub fn g2_plh(&self, seq: u64) -> Option<Plh> {
        self.g2.get(&seq).map(|e| e.plh)
    }

    // ------------------------------------------------------------------ G2

    fn g2_touch(&mut self, seq: u64) {
        if let Some(old) = self.g2_stamp.remove(&seq) {
            self.g2_order.remove(&old);
        }
        self.g2_next += 1;
        self.g2_order.insert(self.g2_next, seq);
        self.g2_stamp.insert(seq, self.g2_next);
    }

    fn g2_insert(&mut self, plh: Plh, info: Info) {
        let seq = info.seq;
        self.g2_by_plh.insert(plh, seq);
        self.g2.insert(seq, G2Entry { plh, info });
        self.g2_touch(seq);
        if self.cfg.g2_eviction == G2Eviction::Lineage {
            self.g2_forest.insert(plh);
        }
    }

    fn g2_remove(&mut self, seq: u64) {
        if let Some(e) = self.g2.remove(&seq) {
            self.g2_by_plh.remove(&e.plh);
        }
        if let Some(old) = self.g2_stamp.remove(&seq) {
            self.g2_order.remove(&old);
        }
    }

    /// Evict one G2 block by G2's policy (never a pinned one); its seq hash.
    fn g2_evict(&mut self) -> Option<u64> {
        let victim = match self.cfg.g2_eviction {
            G2Eviction::Lru => self.g2_order.values().find(|s| !self.g2_pins.contains_key(s)).copied(),
            G2Eviction::Lineage => {
                let bugs = Bugs::default();
                let plh = self.g2_forest.evict(&bugs)?;
                self.g2_by_plh.get(&plh).copied()
            }
        }?;
        self.g2_remove(victim);
        Some(victim)
    }

    /// What G2's block manager could hand out: free destinations plus the
    /// blocks it could evict (every unpinned block).
    fn g2_available(&self) -> usize {
        let free = self.cfg.num_g2_blocks.saturating_sub(self.g2.len() + self.g2_reserved);
        let evictable = self.g2.keys().filter(|s| !self.g2_pins.contains_key(s)).count();
        free + evictable
    }

    fn g2_full(&self) -> bool {
        self.g2.len() + self.g2_reserved >= self.cfg.num_g2_blocks
    }

    /// Room for one more block: evict if full (events), false if nothing can go.
    fn g2_make_room(&mut self, events: &mut Vec<RouterEvent>) -> bool {
        if !self.g2_full() {
            return true;
        }
        match self.g2_evict() {
            Some(v) => {
                if !self.g2_silent.remove(&v) && !self.bugs.g2_eviction_event_missing {
                    events.push(RouterEvent::Removed(v));
                }
                true
            }
            None => false,
        }
    }

    /// A block arrives in G2.
    fn arrive(&mut self, b: OffloadBlock, events: &mut Vec<RouterEvent>) {
        if self.cfg.allocation == Allocation::AtStart {
            self.g2_reserved -= 1;
            self.g2_admitted -= 1;
        }
        let seq = b.info.seq;
        if self.g2.contains_key(&seq) {
            if self.cfg.g2_eviction == G2Eviction::Lru {
                self.g2_touch(seq);
            }
            if self.bugs.g2_restore_republished {
                events.push(RouterEvent::Stored(b.info));
            }
            return;
        }
        if self.cfg.allocation == Allocation::AtCompletion && !self.g2_make_room(events) {
            return;
        }
        self.g2_insert(b.plh, b.info.clone());
        events.push(RouterEvent::Stored(b.info));
    }

    // ------------------------------------------------------------------ offload

    pub fn earliest_deadline(&self) -> Option<f64> {
        let mut all: Vec<f64> = Vec::new();
        if self.shared() {
            all.extend(self.offload_link.earliest_finish());
            all.extend(self.onboard_link.earliest_finish());
            if let Some(l) = &self.lower {
                all.extend(l.borrow().earliest(self.worker));
            }
        } else {
            all.extend(self.active.iter().map(|b| b.deadline));
            all.extend(self.onboards.iter().map(|o| o.deadline));
        }
        all.into_iter().reduce(f64::min)
    }

    fn in_flight(&self, plh: Plh) -> bool {
        self.active.iter().chain(self.waiting.iter()).any(|b| b.blocks.iter().any(|x| x.plh == plh))
    }

    /// Queue the offload of evicted blocks, holding `slots` source slots until
    /// they have arrived. Returns the host-pinned events published at once.
    pub fn enqueue_offload(&mut self, blocks: Vec<OffloadBlock>, slots: usize) -> Vec<RouterEvent> {
        let mut events = Vec::new();
        let mut blocks = blocks;
        if self.cfg.dedup == Dedup::Filter {
            let mut seen = HashSet::new();
            let kept: Vec<OffloadBlock> = blocks
                .into_iter()
                .filter(|b| !self.g2_by_plh.contains_key(&b.plh) && !self.in_flight(b.plh) && seen.insert(b.plh))
                .collect();
            blocks = kept;
        }
        if self.shared() && self.cfg.allocation == Allocation::AtStart {
            // the capacity policy admits the job now, in order, as far as G2
            // has room for it; the rest is dropped
            let room = self.g2_available().saturating_sub(self.g2_admitted);
            blocks.truncate(room);
            self.g2_admitted += blocks.len();
        }
        if blocks.is_empty() {
            self.pending_release += slots;
            return events;
        }
        if self.shared() {
            self.next_id += 1;
            let job = self.next_id;
            self.jobs.insert(job, Job { slots, outstanding: blocks.len() });
            let size = self.cfg.batch_size.max(1);
            let mut it = blocks.into_iter().peekable();
            while it.peek().is_some() {
                let chunk: Vec<OffloadBlock> = it.by_ref().take(size).collect();
                self.next_id += 1;
                let batch = Batch { id: self.next_id, job, blocks: chunk, deadline: 0.0, slots: 0 };
                self.waiting.push_back(batch);
            }
            let released = self.start_waiting(&mut events);
            self.pending_release += released;
        } else {
            let t = self.cfg.block_ms();
            let n = blocks.len();
            let mut left = slots;
            for (i, b) in blocks.into_iter().enumerate() {
                let mut evs = Vec::new();
                if self.cfg.allocation == Allocation::AtStart {
                    if !self.g2_make_room(&mut evs) {
                        events.extend(evs);
                        continue;
                    }
                    self.g2_reserved += 1;
                }
                events.extend(evs);
                let start =
                    if self.bugs.deadline_ignores_queue { self.clock } else { self.clock.max(self.offload_free_at) };
                let deadline = start + t;
                self.offload_free_at = deadline;
                let s = if i + 1 == n { left } else { left.min(1) };
                left -= s;
                self.next_id += 1;
                self.active.push(Batch { id: self.next_id, job: 0, blocks: vec![b], deadline, slots: s });
            }
            self.pending_release += left;
        }
        events
    }

    /// Start waiting batches while the link has room; returns source slots of
    /// jobs that ended without sending anything.
    fn start_waiting(&mut self, events: &mut Vec<RouterEvent>) -> usize {
        let mut released = 0;
        while self.active.len() < self.cfg.batch_size.max(1) {
            let Some(mut batch) = self.waiting.pop_front() else { break };
            if self.cfg.allocation == Allocation::AtStart {
                let mut kept = Vec::new();
                for b in batch.blocks {
                    if self.g2_make_room(events) {
                        self.g2_reserved += 1;
                        kept.push(b);
                    } else {
                        self.g2_admitted -= 1;
                        released += self.arrived(batch.job, 1);
                    }
                }
                batch.blocks = kept;
            }
            if batch.blocks.is_empty() {
                continue;
            }
            let n = if self.bugs.deadline_ignores_queue { 1.0 } else { batch.blocks.len() as f64 };
            self.offload_link.start(self.clock, batch.id, self.cfg.block_bytes * n);
            self.active.push(batch);
        }
        released
    }

    /// `n` blocks of a job arrived (or will never be sent): the job's slots
    /// when it is complete.
    fn arrived(&mut self, job: u64, n: usize) -> usize {
        let j = self.jobs.get_mut(&job).expect("a job of a batch");
        j.outstanding -= n;
        if j.outstanding == 0 {
            return self.jobs.remove(&job).map_or(0, |j| j.slots);
        }
        0
    }

    /// Source slots the engine gave back without a transfer.
    pub fn take_released(&mut self) -> usize {
        std::mem::take(&mut self.pending_release)
    }

    // ------------------------------------------------------------------ onboard

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
            if self.cfg.g2_eviction == G2Eviction::Lru {
                self.g2_touch(*seq);
            }
        }
        self.next_id += 1;
        let id = self.next_id;
        let n = entries.len() as f64;
        let deadline = if self.shared() {
            self.onboard_link.start(self.clock, id, self.cfg.block_bytes * n);
            0.0
        } else {
            let start = self.clock.max(self.onboard_free_at);
            self.onboard_free_at = start + self.cfg.block_ms() * n;
            self.onboard_free_at
        };
        self.onboards.push(Onboard { id, deadline, entries, parent, slots });
    }

    /// Under a lineage G2 a swap-in holds the G2 blocks it found from the lookup on
    /// (they leave the forest); `release_pins` puts them back as newest.
    pub fn pin_prefix(&mut self, blocks: &[(u64, Plh)]) {
        if self.cfg.g2_eviction != G2Eviction::Lineage {
            return;
        }
        for (seq, plh) in blocks {
            let pins = self.g2_pins.entry(*seq).or_insert(0);
            *pins += 1;
            if *pins == 1 {
                self.g2_forest.remove(*plh, &Bugs::default());
            }
        }
    }

    pub fn release_pins(&mut self, blocks: &[(u64, Plh)]) {
        let entries: Vec<SwapEntry> =
            blocks.iter().map(|(seq, plh)| SwapEntry { seq: *seq, plh: *plh, local_hash: 0, token_ids: None }).collect();
        self.unpin(&entries);
    }

    fn unpin(&mut self, entries: &[SwapEntry]) {
        if self.cfg.g2_eviction != G2Eviction::Lineage {
            return;
        }
        for e in entries {
            let Some(p) = self.g2_pins.get_mut(&e.seq) else { continue };
            *p -= 1;
            if *p == 0 {
                self.g2_pins.remove(&e.seq);
                if self.g2.contains_key(&e.seq) {
                    self.g2_forest.insert(e.plh);
                }
            }
        }
    }

    // ------------------------------------------------------------------ G3 / G4

    fn start_puts(&mut self, puts: Vec<Put>) {
        for mut put in puts {
            // the G2 sources stay pinned (lineage) or are used (LRU) while copied
            let srcs: Vec<(u64, Plh)> =
                put.blocks.iter().filter(|(_, i)| self.g2.contains_key(&i.seq)).map(|(p, i)| (i.seq, *p)).collect();
            if self.cfg.g2_eviction == G2Eviction::Lineage {
                self.pin_prefix(&srcs);
            } else {
                for (seq, _) in &srcs {
                    self.g2_touch(*seq);
                }
            }
            put.pinned = srcs;
            let link = if put.tier == Lower::G3 { 0 } else { 1 };
            let bytes = self.cfg.block_bytes * put.blocks.len() as f64;
            self.lower.as_ref().unwrap().borrow_mut().start(link, bytes, Xfer::Put(put));
        }
    }

    /// Take this worker's lower-tier completions, in order: copies land in
    /// G3/G4, staged blocks land in G2 (and a swap-in whose blocks are all
    /// there starts its G2->G1 copy). The events to publish, in order.
    fn deliver_lower(&mut self, now_ms: f64) -> Vec<RouterEvent> {
        let mut host = Vec::new();
        let done = self.lower.as_ref().unwrap().borrow_mut().take_done(self.worker);
        for id in done {
            let Some(x) = self.lower.as_ref().unwrap().borrow_mut().tiers.transfers.remove(&id) else { continue };
            match x {
                Xfer::Put(put) => {
                    let next = self.lower.as_ref().unwrap().borrow_mut().tiers.landed(&put);
                    self.release_pins(&put.pinned);
                    self.start_puts(next);
                }
                Xfer::Stage { entries, onboard, .. } => {
                    self.g2_admitted -= entries.len();
                    for (plh, info) in &entries {
                        if !self.g2.contains_key(&info.seq) {
                            if !self.g2_make_room(&mut host) {
                                continue;
                            }
                            self.g2_insert(*plh, info.clone());
                            self.g2_silent.insert(info.seq);
                        }
                        if self.cfg.g2_eviction == G2Eviction::Lineage {
                            self.pin_prefix(&[(info.seq, *plh)]);
                        }
                    }
                    let last = {
                        let st = self.staged.get_mut(&onboard).expect("a staged swap-in");
                        st.3 -= 1;
                        st.3 == 0
                    };
                    if last {
                        let (entries, parent, slots, _) = self.staged.remove(&onboard).unwrap();
                        self.onboard_link.start(now_ms, onboard, self.cfg.block_bytes * entries.len() as f64);
                        self.onboards.push(Onboard { id: onboard, deadline: 0.0, entries, parent, slots });
                    }
                }
            }
        }
        host
    }

    /// The lower-tier events this worker publishes (its copies that landed,
    /// the G3 victims it had put there), in order; the process asks every
    /// worker after each step.
    pub fn take_lower_events(&mut self) -> Vec<RouterEvent> {
        let Some(l) = &self.lower else { return Vec::new() };
        l.borrow_mut().take_events(self.worker).into_iter().map(RouterEvent::Lower).collect()
    }

    /// Past the G2 prefix, the run G3 holds then the run G4 holds, taken only
    /// if G2 has room for all of it now (its staging reservation).
    pub fn reserve_staging(&mut self, blocks: &[(u64, Plh)], start: usize) -> Vec<(Lower, Plh, Info)> {
        let Some(shared) = self.lower.as_ref() else { return Vec::new() };
        let shared = shared.borrow();
        let lower = &shared.tiers;
        let mut run = Vec::new();
        let mut i = start;
        for t in [Lower::G3, Lower::G4] {
            while i < blocks.len() {
                let (seq, plh) = blocks[i];
                let Some(info) = lower.lookup(t, seq, plh) else { break };
                run.push((t, plh, info));
                i += 1;
            }
        }
        if run.is_empty() || self.g2_available().saturating_sub(self.g2_admitted) < run.len() {
            return Vec::new();
        }
        self.g2_admitted += run.len();
        run
    }

    pub fn release_staging(&mut self, n: usize) {
        self.g2_admitted -= n;
    }

    /// A swap-in with a G2 prefix and staged blocks: stage them (G3->G2, G4->G2)
    /// now; the G2->G1 copy of the whole run starts when they have landed.
    pub fn start_staged_onboard(
        &mut self,
        prefix: &[(u64, Plh)],
        staged: Vec<(Lower, Plh, Info)>,
        parent: Option<u64>,
        slots: usize,
    ) {
        let mut entries = Vec::new();
        for (seq, _) in prefix {
            let e = &self.g2[seq];
            entries.push(SwapEntry { seq: *seq, plh: e.plh, local_hash: e.info.local_hash, token_ids: e.info.token_ids.clone() });
            if self.cfg.g2_eviction == G2Eviction::Lru {
                self.g2_touch(*seq);
            }
        }
        for (_, plh, info) in &staged {
            entries.push(SwapEntry { seq: info.seq, plh: *plh, local_hash: info.local_hash, token_ids: info.token_ids.clone() });
        }
        if self.bugs.tier_onboard_skips_g2 {
            // one hop from G3/G4 into G1, on the G2->G1 link
            self.g2_admitted -= staged.len();
            self.next_id += 1;
            let id = self.next_id;
            self.onboard_link.start(self.clock, id, self.cfg.block_bytes * entries.len() as f64);
            self.onboards.push(Onboard { id, deadline: 0.0, entries, parent, slots });
            return;
        }
        self.next_id += 1;
        let onboard = self.next_id;
        let mut stages = 0;
        for (t, link) in [(Lower::G3, 2usize), (Lower::G4, 3usize)] {
            let part: Vec<(Plh, Info)> =
                staged.iter().filter(|(x, _, _)| *x == t).map(|(_, p, i)| (*p, i.clone())).collect();
            if part.is_empty() {
                continue;
            }
            stages += 1;
            let bytes = self.cfg.block_bytes * part.len() as f64;
            let x = Xfer::Stage { worker: self.worker, entries: part, onboard };
            self.lower.as_ref().unwrap().borrow_mut().start(link, bytes, x);
        }
        self.staged.insert(onboard, (entries, parent, slots, stages));
    }

    // ------------------------------------------------------------------ tick

    /// Move the clock to `now_ms` (never back) and complete every transfer due.
    pub fn tick(&mut self, now_ms: f64) -> Vec<Completion> {
        let mut out = Vec::new();
        if now_ms < self.clock {
            return out;
        }
        if self.shared() {
            // the lower tiers' links first; their completions are taken after this
            // worker's own G1<->G2 completions (the owner's ordered drain)
            if let Some(l) = &self.lower {
                l.borrow_mut().advance(now_ms);
            }
            let done = self.offload_link.advance_to(now_ms);
            let onboards_done = self.onboard_link.advance_to(now_ms);
            self.clock = now_ms;
            for id in done {
                let i = self.active.iter().position(|b| b.id == id).expect("an active batch");
                let batch = self.active.remove(i);
                let mut events = Vec::new();
                let n = batch.blocks.len();
                let chain: Vec<(Plh, Info)> = batch.blocks.iter().map(|b| (b.plh, b.info.clone())).collect();
                for b in batch.blocks {
                    self.arrive(b, &mut events);
                }
                let released = self.arrived(batch.job, n);
                out.push(Completion::Offload { released_slots: released, events });
                if self.lower.is_some() {
                    let in_g2: Vec<(Plh, Info)> =
                        chain.into_iter().filter(|(_, i)| self.g2.contains_key(&i.seq)).collect();
                    let puts = self.lower.as_ref().unwrap().borrow_mut().tiers.cascade(self.worker, &in_g2);
                    self.start_puts(puts);
                }
            }
            // batches waiting for a transfer slot start after this tick's completions
            let mut events = Vec::new();
            let released = self.start_waiting(&mut events);
            if !events.is_empty() || released > 0 {
                out.push(Completion::Started { released_slots: released, events });
            }
            for id in onboards_done {
                let i = self.onboards.iter().position(|o| o.id == id).expect("an onboard");
                let o = self.onboards.remove(i);
                self.unpin(&o.entries);
                out.push(Completion::Onboard { entries: o.entries, parent: o.parent, slots: o.slots });
            }
            if self.lower.is_some() {
                let events = self.deliver_lower(now_ms);
                if !events.is_empty() {
                    out.push(Completion::Started { released_slots: 0, events });
                }
            }
            return out;
        }
        // fifo: deadline order, queue order on a tie, offloads and onboards together
        let mut due: Vec<(f64, u64)> = Vec::new();
        due.extend(self.active.iter().filter(|b| b.deadline <= now_ms).map(|b| (b.deadline, b.id)));
        due.extend(self.onboards.iter().filter(|o| o.deadline <= now_ms).map(|o| (o.deadline, o.id)));
        due.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then(a.1.cmp(&b.1)));
        self.clock = now_ms;
        for (_, id) in due {
            if let Some(i) = self.active.iter().position(|b| b.id == id) {
                let batch = self.active.remove(i);
                let mut events = Vec::new();
                for b in batch.blocks {
                    self.arrive(b, &mut events);
                }
                out.push(Completion::Offload { released_slots: batch.slots, events });
            } else if let Some(i) = self.onboards.iter().position(|o| o.id == id) {
                let o = self.onboards.remove(i);
                self.unpin(&o.entries);
                out.push(Completion::Onboard { entries: o.entries, parent: o.parent, slots: o.slots });
            }
        }
        out
    }
}
