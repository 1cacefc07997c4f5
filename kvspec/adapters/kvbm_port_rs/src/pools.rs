//! The inactive pool backends of kvbm-logical's BlockManager, ported:
//! lineage (evict leaves of the inactive forest), LRU and multi-LRU (four LRU
//! levels by a TinyLFU frequency estimate), and the frequency tracker itself.
//!
//! Upstream: ai-dynamo/dynamo lib/kvbm-logical/src/pools/inactive/backends/
//! {lineage.rs, lru_backend.rs, multi_lru_backend.rs} and lib/kvbm-logical/src/tinylfu.rs.

use std::collections::{BTreeMap, HashMap};

use crate::variants::Bugs;

/// A positional lineage hash as the wire carries it: (hash, parent, position).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Plh {
    pub hash: u64,
    pub parent: Option<u64>,
    pub position: u64,
}

/// TinyLFU as the source builds it for multi-LRU: 4-bit saturating counters,
/// decay (every counter halved) once `10 * capacity` increments were added.
/// The source keeps the counters in a count-min sketch whose hashing (xxh3
/// with custom secrets over the packed 128-bit lineage hash) cannot be
/// reproduced from the wire's triple; this port counts per key exactly, which
/// is what the sketch gives whenever its counters do not collide.
pub struct FrequencyTracker {
    counts: HashMap<Plh, u8>,
    size: u32,
    sample_size: u32,
}

impl FrequencyTracker {
    pub fn new(capacity: usize) -> Self {
        let sample = capacity.saturating_mul(10).min(u32::MAX as usize) as u32;
        Self { counts: HashMap::new(), size: 0, sample_size: sample }
    }

    pub fn touch(&mut self, key: Plh) {
        let c = self.counts.entry(key).or_insert(0);
        if *c < 15 {
            *c += 1;
            self.size += 1;
            if self.size >= self.sample_size {
                self.reset();
            }
        }
    }

    fn reset(&mut self) {
        // each key owns four counters in the sketch; the source subtracts a
        // quarter of the odd counters, i.e. one per key with an odd count
        let odd = self.counts.values().filter(|c| **c & 1 == 1).count() as u32;
        for c in self.counts.values_mut() {
            *c >>= 1;
        }
        self.counts.retain(|_, c| *c > 0);
        self.size = (self.size >> 1).saturating_sub(odd);
    }

    pub fn count(&self, key: Plh) -> u32 {
        self.counts.get(&key).copied().unwrap_or(0) as u32
    }
}

/// Least recently inserted first.
#[derive(Default)]
struct Lru {
    next: u64,
    order: BTreeMap<u64, Plh>,
    index: HashMap<Plh, u64>,
}

impl Lru {
    fn insert(&mut self, key: Plh) {
        self.remove(key);
        self.next += 1;
        self.order.insert(self.next, key);
        self.index.insert(key, self.next);
    }
    fn insert_keep(&mut self, key: Plh, stamp: u64) {
        self.order.insert(stamp, key);
        self.index.insert(key, stamp);
    }
    fn remove(&mut self, key: Plh) -> Option<u64> {
        let stamp = self.index.remove(&key)?;
        self.order.remove(&stamp);
        Some(stamp)
    }
    fn pop_lru(&mut self) -> Option<Plh> {
        let (&stamp, &key) = self.order.iter().next()?;
        self.order.remove(&stamp);
        self.index.remove(&key);
        Some(key)
    }
    fn len(&self) -> usize {
        self.order.len()
    }
}

type NodeKey = (u64, u64); // (position, lineage hash)

struct Node {
    real: bool,
    tick: u64,
    parent: Option<NodeKey>,
    children: usize,
}

/// The lineage backend: the inactive blocks form a forest by lineage parent;
/// only a real leaf can be evicted, the oldest (tick, position, hash) first.
/// A node taken out while it has children stays as a ghost; a missing parent
/// is a ghost too; a ghost goes when its last child goes.
#[derive(Default)]
pub struct Lineage {
    tick: u64,
    nodes: HashMap<NodeKey, Node>,
    plhs: HashMap<NodeKey, Plh>,
    pub real: usize,
}

impl Lineage {
    fn key(p: Plh) -> NodeKey {
        (p.position, p.hash)
    }
    fn parent_key(p: Plh) -> Option<NodeKey> {
        match p.parent {
            Some(h) if p.position > 0 => Some((p.position - 1, h)),
            _ => None,
        }
    }

    pub fn insert(&mut self, p: Plh) {
        let k = Self::key(p);
        self.tick += 1;
        let tick = self.tick;
        let had_parent_link;
        if let Some(n) = self.nodes.get_mut(&k) {
            if n.real {
                return;
            }
            n.real = true;
            n.tick = tick;
            had_parent_link = n.parent.is_some();
        } else {
            self.nodes.insert(k, Node { real: true, tick, parent: None, children: 0 });
            had_parent_link = false;
        }
        self.plhs.insert(k, p);
        self.real += 1;
        if !had_parent_link {
            if let Some(pk) = Self::parent_key(p) {
                self.nodes.get_mut(&k).unwrap().parent = Some(pk);
                match self.nodes.get_mut(&pk) {
                    Some(parent) => parent.children += 1,
                    None => {
                        self.nodes.insert(pk, Node { real: false, tick: 0, parent: None, children: 1 });
                    }
                }
            }
        }
    }

    /// Take a real node out (a hit or an eviction).
    pub fn remove(&mut self, p: Plh, bugs: &Bugs) -> bool {
        let k = Self::key(p);
        let Some(n) = self.nodes.get_mut(&k) else {
            return false;
        };
        if !n.real {
            return false;
        }
        self.real -= 1;
        self.plhs.remove(&k);
        if n.children > 0 && !bugs.lineage_ghost_dropped {
            n.real = false;
            return true;
        }
        if n.children > 0 {
            // the bug: forget the node and orphan its children (they become roots)
            let orphaned: Vec<NodeKey> =
                self.nodes.iter().filter(|(_, c)| c.parent == Some(k)).map(|(ck, _)| *ck).collect();
            for ck in orphaned {
                self.nodes.get_mut(&ck).unwrap().parent = None;
            }
        }
        self.drop_node(k);
        true
    }

    fn drop_node(&mut self, k: NodeKey) {
        let mut cur = k;
        loop {
            let Some(n) = self.nodes.remove(&cur) else { return };
            let Some(pk) = n.parent else { return };
            let Some(parent) = self.nodes.get_mut(&pk) else { return };
            parent.children -= 1;
            if parent.children == 0 && !parent.real {
                cur = pk;
            } else {
                return;
            }
        }
    }

    pub fn evict(&mut self, bugs: &Bugs) -> Option<Plh> {
        let victim = self
            .nodes
            .iter()
            .filter(|(_, n)| n.real && n.children == 0)
            .map(|(k, n)| (n.tick, k.0, k.1, *k))
            .min()?;
        let p = self.plhs[&victim.3];
        self.remove(p, bugs);
        Some(p)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Lineage,
    Lru,
    MultiLru,
}

pub struct InactivePool {
    policy: Policy,
    lineage: Lineage,
    lru: Lru,
    levels: [Lru; 4],
    level_of: HashMap<Plh, usize>,
    pub tracker: FrequencyTracker,
    bugs: Bugs,
}

const THRESHOLDS: [u32; 3] = [3, 8, 15];

impl InactivePool {
    pub fn new(policy: Policy, capacity: usize, bugs: Bugs) -> Self {
        Self {
            policy,
            lineage: Lineage::default(),
            lru: Lru::default(),
            levels: Default::default(),
            level_of: HashMap::new(),
            tracker: FrequencyTracker::new(capacity),
            bugs,
        }
    }

    pub fn len(&self) -> usize {
        match self.policy {
            Policy::Lineage => self.lineage.real,
            Policy::Lru => self.lru.len(),
            Policy::MultiLru => self.levels.iter().map(|l| l.len()).sum(),
        }
    }

    /// A block whose last handle dropped enters the pool.
    pub fn insert(&mut self, p: Plh, old_stamp: Option<u64>) {
        match self.policy {
            Policy::Lineage => self.lineage.insert(p),
            Policy::Lru => match old_stamp {
                Some(s) if self.bugs.lru_reinsert_keeps_position => self.lru.insert_keep(p, s),
                _ => self.lru.insert(p),
            },
            Policy::MultiLru => {
                let f = self.tracker.count(p);
                let level = THRESHOLDS.iter().filter(|t| f >= **t).count();
                self.levels[level].insert(p);
                self.level_of.insert(p, level);
            }
        }
    }

    /// A hit takes the block out of the pool. Returns the LRU stamp it had.
    pub fn take(&mut self, p: Plh) -> Option<u64> {
        match self.policy {
            Policy::Lineage => {
                let bugs = self.bugs;
                self.lineage.remove(p, &bugs);
                None
            }
            Policy::Lru => self.lru.remove(p),
            Policy::MultiLru => {
                if let Some(level) = self.level_of.remove(&p) {
                    self.levels[level].remove(p);
                }
                None
            }
        }
    }

    pub fn evict(&mut self) -> Option<Plh> {
        match self.policy {
            Policy::Lineage => {
                let bugs = self.bugs;
                self.lineage.evict(&bugs)
            }
            Policy::Lru => self.lru.pop_lru(),
            Policy::MultiLru => {
                for level in 0..4 {
                    if let Some(p) = self.levels[level].pop_lru() {
                        self.level_of.remove(&p);
                        return Some(p);
                    }
                }
                None
            }
        }
    }
}
