//! A Rust port (std only) of a radix-tree prefix cache in the manner of
//! SGLang's `RadixCache`, written from kvspec's SPEC.md "Radix prefix cache"
//! and PROTOCOL.md section 11 the way an outside author porting the cache
//! would: an arena of nodes keyed by their first page, lock counts along the
//! path, a set of evictable leaves kept up to date as the tree changes (the
//! way SGLang keeps `evictable_leaves`), and a KV event recorder. Served over the JSON-lines protocol
//! version 4 (profile `radix`).
//!
//! `--variant NAME` turns on one realistic single bug (manifest.toml
//! `[[variants]]`); without one the port follows the spec.

#[path = "../rust_common/json.rs"]
mod json;
mod xxh3;

use json::{obj, Json};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};

const VARIANTS: &[&str] = &[
    "split_upper_unlocked",
    "lock_skips_leaf_status",
    "parent_not_requeued",
    "lru_by_creation",
    "removed_last_page_only",
    "common_not_page_aligned",
    "reset_silent",
    "request_keeps_partial_page",
];

/// Which single bug is on (None: the conforming port).
struct Bugs(Option<String>);

impl Bugs {
    fn on(&self, name: &str) -> bool {
        self.0.as_deref() == Some(name)
    }
}

struct Node {
    tokens: Vec<u32>,
    parent: usize,
    /// (sequence hash, local hash) of each page
    pages: Vec<(u64, u64)>,
    /// children by their first page
    children: BTreeMap<Vec<u32>, usize>,
    lock_ref: u64,
    last_access: u64,
}

enum Event {
    Stored { parent: Option<u64>, pages: Vec<(u64, u64)>, tokens: Vec<Vec<u32>> },
    Removed(Vec<u64>),
    Cleared,
}

struct Rejected {
    rule: &'static str,
    message: String,
}

const ROOT: usize = 0;

struct RadixCache {
    page: usize,
    capacity: u64,
    free: u64,
    nodes: Vec<Option<Node>>,
    evictable_leaves: BTreeSet<usize>,
    clock: u64,
    locks: BTreeMap<String, usize>,
    event_id: u64,
    bugs: Bugs,
}

impl RadixCache {
    fn new(page: usize, capacity: u64, bugs: Bugs) -> Self {
        let mut c = RadixCache {
            page,
            capacity,
            free: capacity,
            nodes: Vec::new(),
            evictable_leaves: BTreeSet::new(),
            clock: 0,
            locks: BTreeMap::new(),
            event_id: 0,
            bugs,
        };
        c.clear_tree();
        c
    }

    fn clear_tree(&mut self) {
        self.nodes.clear();
        // the root holds nothing and is always locked
        self.nodes.push(Some(Node {
            tokens: Vec::new(),
            parent: ROOT,
            pages: Vec::new(),
            children: BTreeMap::new(),
            lock_ref: 1,
            last_access: 0,
        }));
        self.evictable_leaves.clear();
        self.locks.clear();
        self.free = self.capacity;
    }

    fn n(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("live node")
    }

    fn m(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("live node")
    }

    fn now(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn aligned<'a>(&self, key: &'a [u32]) -> &'a [u32] {
        &key[..key.len() / self.page * self.page]
    }

    fn first_page(&self, key: &[u32]) -> Vec<u32> {
        key[..self.page.min(key.len())].to_vec()
    }

    fn update_leaf_status(&mut self, i: usize) {
        let node = self.n(i);
        let candidate = i != ROOT && node.lock_ref == 0 && node.children.is_empty();
        if candidate {
            self.evictable_leaves.insert(i);
        } else {
            self.evictable_leaves.remove(&i);
        }
    }

    /// Split node `i` after its first `at` tokens; the new upper node is returned.
    fn split(&mut self, i: usize, at: usize) -> usize {
        let k = at / self.page;
        let created = self.now();
        let parent = self.n(i).parent;
        let node = self.n(i);
        let lock_ref = if self.bugs.on("split_upper_unlocked") { 0 } else { node.lock_ref };
        let upper = Node {
            tokens: node.tokens[..at].to_vec(),
            parent,
            pages: node.pages[..k].to_vec(),
            children: BTreeMap::new(),
            lock_ref,
            last_access: created,
        };
        let key = self.first_page(&node.tokens);
        let u = self.nodes.len();
        self.nodes.push(Some(upper));
        {
            let child = self.m(i);
            child.tokens.drain(..at);
            child.pages.drain(..k);
            child.parent = u;
        }
        let lower_key = self.first_page(&self.n(i).tokens);
        self.m(u).children.insert(lower_key, i);
        self.m(parent).children.insert(key, u);
        self.update_leaf_status(u);
        u
    }

    /// Tokens `a` shares with `b` from the start, cut to whole pages.
    fn common(&self, a: &[u32], b: &[u32]) -> usize {
        let n = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        if self.bugs.on("common_not_page_aligned") {
            n
        } else {
            n / self.page * self.page
        }
    }

    /// Down the tree along `key`: (tokens matched, the node the walk ends at).
    fn walk(&mut self, key: &[u32]) -> (usize, usize) {
        let t = self.now();
        let lru_by_creation = self.bugs.on("lru_by_creation");
        if !lru_by_creation {
            self.m(ROOT).last_access = t;
        }
        let (mut node, mut pos) = (ROOT, 0);
        while pos < key.len() {
            let Some(&c) = self.n(node).children.get(&self.first_page(&key[pos..])) else { break };
            if !lru_by_creation {
                self.m(c).last_access = t;
            }
            let shared = self.common(&self.n(c).tokens, &key[pos..]);
            pos += shared;
            if shared < self.n(c).tokens.len() {
                node = if shared > 0 { self.split(c, shared) } else { node };
                break;
            }
            node = c;
        }
        (pos, node)
    }

    fn match_prefix(&mut self, key: &[u32]) -> (usize, usize) {
        if key.is_empty() {
            return (0, ROOT);
        }
        self.walk(key)
    }

    fn insert(&mut self, key: &[u32], events: &mut Vec<Event>) -> usize {
        let (pos, node) = self.walk(key);
        if pos < key.len() {
            let rest = key[pos..].to_vec();
            let mut parent_hash = self.n(node).pages.last().map(|p| p.0);
            let anchor = parent_hash;
            let mut pages = Vec::new();
            let mut page_tokens = Vec::new();
            for chunk in rest.chunks(self.page) {
                let local = xxh3::local_hash(chunk);
                let seq = xxh3::chain_hash(parent_hash, local);
                pages.push((seq, local));
                page_tokens.push(chunk.to_vec());
                parent_hash = Some(seq);
            }
            let created = self.now();
            let leaf = self.nodes.len();
            let first = self.first_page(&rest);
            self.nodes.push(Some(Node {
                tokens: rest,
                parent: node,
                pages: pages.clone(),
                children: BTreeMap::new(),
                lock_ref: 0,
                last_access: created,
            }));
            self.m(node).children.insert(first, leaf);
            self.update_leaf_status(node);
            self.update_leaf_status(leaf);
            events.push(Event::Stored { parent: anchor, pages, tokens: page_tokens });
        }
        pos
    }

    fn inc_lock(&mut self, mut i: usize) {
        while i != ROOT {
            self.m(i).lock_ref += 1;
            if !self.bugs.on("lock_skips_leaf_status") {
                self.update_leaf_status(i);
            }
            i = self.n(i).parent;
        }
    }

    fn dec_lock(&mut self, mut i: usize) {
        while i != ROOT {
            let node = self.m(i);
            node.lock_ref = node.lock_ref.saturating_sub(1);
            self.update_leaf_status(i);
            i = self.n(i).parent;
        }
    }

    fn evict(&mut self, want: u64, events: &mut Vec<Event>) -> u64 {
        let mut freed = 0;
        let mut removed = Vec::new();
        while freed < want {
            let Some(&victim) = self.evictable_leaves.iter().min_by_key(|&&i| self.n(i).last_access) else { break };
            // detached from its parent; the arena keeps it (a stale handle stays readable)
            let node = self.n(victim);
            let (parent, key) = (node.parent, self.first_page(&node.tokens));
            let node_pages = node.pages.clone();
            let len = node.tokens.len() as u64;
            self.evictable_leaves.remove(&victim);
            self.m(parent).children.remove(&key);
            freed += len;
            self.free += len;
            if self.bugs.on("removed_last_page_only") {
                removed.extend(node_pages.last().map(|p| p.0));
            } else {
                removed.extend(node_pages.iter().map(|p| p.0));
            }
            if !self.bugs.on("parent_not_requeued") {
                self.update_leaf_status(parent);
            }
        }
        if !removed.is_empty() {
            events.push(Event::Removed(removed));
        }
        freed
    }

    /// Tokens held by unlocked (`locked` false) or locked nodes.
    fn size(&self, locked: bool) -> u64 {
        let mut stack: Vec<usize> = self.n(ROOT).children.values().copied().collect();
        let mut total = 0;
        while let Some(i) = stack.pop() {
            let node = self.n(i);
            if (node.lock_ref > 0) == locked {
                total += node.tokens.len() as u64;
            }
            stack.extend(node.children.values().copied());
        }
        total
    }

    fn path_len(&self, mut i: usize) -> usize {
        let mut n = 0;
        while i != ROOT {
            n += self.n(i).tokens.len();
            i = self.n(i).parent;
        }
        n
    }

    fn apply(&mut self, op: &Op, events: &mut Vec<Event>) -> Result<u64, Rejected> {
        match op {
            Op::Match(tokens) => {
                let key = self.aligned(tokens).to_vec();
                Ok(self.match_prefix(&key).0 as u64)
            }
            Op::Insert(tokens) => {
                let key = self.aligned(tokens).to_vec();
                let need = key.len() as u64;
                if need > self.free {
                    return Err(Rejected {
                        rule: "RADIX-CAPACITY",
                        message: format!("an insert of {need} tokens needs as many free slots; {} are free", self.free),
                    });
                }
                self.free -= need;
                let cached = self.insert(&key, events) as u64;
                self.free += cached;
                Ok(cached)
            }
            Op::Lock(name, tokens) => {
                if self.locks.contains_key(name) {
                    return Err(Rejected { rule: "RADIX-VALIDATE", message: format!("lock {name:?} is already held") });
                }
                let key = self.aligned(tokens).to_vec();
                let (matched, node) = self.match_prefix(&key);
                self.inc_lock(node);
                self.locks.insert(name.clone(), node);
                Ok(matched as u64)
            }
            Op::Unlock(name) => {
                let Some(node) = self.locks.remove(name) else {
                    return Err(Rejected { rule: "RADIX-VALIDATE", message: format!("no lock {name:?} is held") });
                };
                self.dec_lock(node);
                Ok(0)
            }
            Op::Evict(n) => Ok(self.evict(*n, events)),
            Op::Reset => {
                self.clear_tree();
                if !self.bugs.on("reset_silent") {
                    events.push(Event::Cleared);
                }
                Ok(0)
            }
            Op::Request(prompt, output) => self.request(prompt, output, events),
        }
    }

    /// One request as a scheduler runs it: match the prompt but its last token,
    /// lock, take slots (evicting what is missing), insert, give back, unlock.
    fn request(&mut self, prompt: &[u32], output: &[u32], events: &mut Vec<Event>) -> Result<u64, Rejected> {
        let hit_key = self.aligned(&prompt[..prompt.len() - 1]).to_vec();
        let (cached, node) = self.match_prefix(&hit_key);
        self.inc_lock(node);
        let mut seq = prompt.to_vec();
        seq.extend_from_slice(&output[..output.len() - 1]);
        let need = (seq.len() - cached) as u64;
        let evictable = self.size(false);
        if need > self.free + evictable {
            let message = format!("the request needs {need} slots; {} are free and {evictable} evictable", self.free);
            self.dec_lock(node);
            return Err(Rejected { rule: "RADIX-CAPACITY", message });
        }
        if need > self.free {
            let missing = need - self.free;
            self.evict(missing, events);
        }
        self.free -= need;
        let key = self.aligned(&seq).to_vec();
        let found = self.insert(&key, events);
        self.free += found.saturating_sub(cached) as u64;
        if !self.bugs.on("request_keeps_partial_page") {
            self.free += (seq.len() - key.len()) as u64;
        }
        self.dec_lock(node);
        Ok(cached as u64)
    }

    // ------------------------------------------------------------ output
    fn node_json(&self, i: usize) -> Json {
        let node = self.n(i);
        obj(vec![
            ("tokens", tokens_json(&node.tokens)),
            ("lock_ref", Json::Int(node.lock_ref as i64)),
            ("children", Json::Arr(node.children.values().map(|&c| self.node_json(c)).collect())),
        ])
    }

    fn state(&self) -> Json {
        let locks = self.locks.iter().map(|(k, &v)| (k.clone(), Json::Int(self.path_len(v) as i64))).collect();
        obj(vec![
            ("tree", Json::Arr(self.n(ROOT).children.values().map(|&c| self.node_json(c)).collect())),
            ("evictable", Json::Int(self.size(false) as i64)),
            ("protected", Json::Int(self.size(true) as i64)),
            ("free", Json::Int(self.free as i64)),
            ("locks", Json::Obj(locks)),
        ])
    }

    fn event_json(&mut self, ev: &Event) -> Json {
        let id = self.event_id;
        self.event_id += 1;
        let (data, token_ids) = match ev {
            Event::Stored { parent, pages, tokens } => {
                let blocks = pages
                    .iter()
                    .map(|&(s, l)| obj(vec![("block_hash", Json::U64(s)), ("tokens_hash", Json::U64(l))]))
                    .collect();
                let stored = obj(vec![
                    ("parent_hash", parent.map_or(Json::Null, Json::U64)),
                    ("blocks", Json::Arr(blocks)),
                    ("start_position", Json::Null),
                ]);
                (obj(vec![("stored", stored)]), Json::Arr(tokens.iter().map(|t| tokens_json(t)).collect()))
            }
            Event::Removed(hashes) => {
                let removed = obj(vec![("block_hashes", Json::Arr(hashes.iter().map(|&h| Json::U64(h)).collect()))]);
                (obj(vec![("removed", removed)]), Json::Null)
            }
            Event::Cleared => (Json::Str("cleared".into()), Json::Null),
        };
        obj(vec![
            ("event_id", Json::Int(id as i64)),
            ("data", data),
            ("dp_rank", Json::Int(0)),
            ("storage_tier", Json::Str("device".into())),
            ("block_token_ids", token_ids),
        ])
    }
}

fn tokens_json(t: &[u32]) -> Json {
    Json::Arr(t.iter().map(|&x| Json::Int(x as i64)).collect())
}

enum Op {
    Match(Vec<u32>),
    Insert(Vec<u32>),
    Lock(String, Vec<u32>),
    Unlock(String),
    Evict(u64),
    Reset,
    Request(Vec<u32>, Vec<u32>),
}

fn tokens_of(op: &Json, key: &str, min: usize) -> Result<Vec<u32>, String> {
    let Some(Json::Arr(items)) = op.get(key) else { return Err(format!("field {key:?} must be a list of token ids")) };
    if items.len() < min || items.len() > 4096 {
        return Err(format!("field {key:?} must hold {min} to 4096 token ids, not {}", items.len()));
    }
    items
        .iter()
        .map(|x| match x {
            Json::Int(i) if (0..=u32::MAX as i64).contains(i) => Ok(*i as u32),
            _ => Err(format!("field {key:?} holds a token id that is not an unsigned 32-bit integer")),
        })
        .collect()
}

fn name_of(op: &Json) -> Result<String, String> {
    let name = op.str_of("name")?;
    if name.is_empty() || name.chars().count() > 64 {
        return Err("field \"name\" must be 1 to 64 characters".into());
    }
    Ok(name)
}

fn parse_op(op: &Json) -> Result<Op, (&'static str, String)> {
    let bad = |e: String| ("malformed_request", e);
    let kind = op.str_of("op").map_err(bad)?;
    Ok(match kind.as_str() {
        "match" => Op::Match(tokens_of(op, "tokens", 0).map_err(bad)?),
        "insert" => Op::Insert(tokens_of(op, "tokens", 0).map_err(bad)?),
        "lock" => Op::Lock(name_of(op).map_err(bad)?, tokens_of(op, "tokens", 0).map_err(bad)?),
        "unlock" => Op::Unlock(name_of(op).map_err(bad)?),
        "evict" => {
            let n = op.int_of("tokens").map_err(bad)?;
            if n < 0 {
                return Err(bad("field \"tokens\" must be >= 0".into()));
            }
            Op::Evict(n as u64)
        }
        "reset" => Op::Reset,
        "request" => Op::Request(tokens_of(op, "prompt", 1).map_err(bad)?, tokens_of(op, "output", 1).map_err(bad)?),
        other => return Err(("unsupported_op", format!("unknown radix operation {other:?}"))),
    })
}

fn send(out: &mut impl Write, v: &Json) {
    let mut line = json::to_string(v);
    line.push('\n');
    if out.write_all(line.as_bytes()).and_then(|_| out.flush()).is_err() {
        std::process::exit(0); // the parent went away
    }
}

fn error_reply(id: Json, code: &str, message: String) -> Json {
    obj(vec![("id", id), ("error", obj(vec![("code", Json::Str(code.into())), ("message", Json::Str(message))]))])
}

fn refuse(out: &mut impl Write, code: &str, message: &str) {
    let err = obj(vec![("code", Json::Str(code.into())), ("message", Json::Str(message.into()))]);
    send(out, &obj(vec![("type", Json::Str("refused".into())), ("error", err)]));
}

/// Answer a hello: the cache it configures, or None after a refusal.
fn handshake(msg: &Json, variant: &Option<String>, out: &mut impl Write) -> Option<RadixCache> {
    let v4 = matches!(msg.get("versions"), Some(Json::Arr(v)) if v.contains(&Json::Int(4)));
    if !v4 {
        refuse(out, "unsupported_version", "speaks version 4 (radix sessions) only");
        return None;
    }
    let Some(radix) = msg.get("radix").filter(|r| r.str_of("kind").ok().as_deref() == Some("radix")) else {
        refuse(out, "unsupported_config", "this port runs the radix profile only (a hello with radix)");
        return None;
    };
    let page = radix.opt_int("page_size").ok().flatten().unwrap_or(1);
    let capacity = radix.opt_int("capacity").ok().flatten().unwrap_or(64);
    if !(1..=64).contains(&page) || !(1..=1 << 20).contains(&capacity) {
        refuse(out, "unsupported_config", "page_size must be 1..64 and capacity 1..1048576");
        return None;
    }
    let caps = obj(vec![("block_level", Json::Bool(false)), ("profiles", Json::Arr(vec![Json::Str("radix".into())]))]);
    send(
        out,
        &obj(vec![
            ("type", Json::Str("ready".into())),
            ("name", Json::Str("radix prefix cache, Rust port".into())),
            ("protocol", Json::Int(4)),
            ("profile", Json::Str("radix".into())),
            ("capabilities", caps),
            ("implementation_version", Json::Str(format!("radix_rust {}", variant.as_deref().unwrap_or("conforming")))),
            ("multi_session", Json::Bool(true)),
        ]),
    );
    Some(RadixCache::new(page as usize, capacity as u64, Bugs(variant.clone())))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let variant = args.iter().position(|a| a == "--variant").and_then(|i| args.get(i + 1)).cloned();
    if let Some(v) = &variant {
        if !VARIANTS.contains(&v.as_str()) {
            eprintln!("radix_rust: unknown variant {v:?}; known: {}", VARIANTS.join(", "));
            std::process::exit(2);
        }
    }
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut cache: Option<RadixCache> = None;
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let msg = match json::parse(&line) {
            Ok(m) => m,
            Err(e) => {
                send(&mut out, &error_reply(Json::Null, "malformed_request", format!("not valid JSON: {e}")));
                continue;
            }
        };
        match msg.get("type").and_then(|t| if let Json::Str(s) = t { Some(s.clone()) } else { None }).as_deref() {
            Some("bye") => return,
            Some("hello") => {
                cache = handshake(&msg, &variant, &mut out);
                if cache.is_none() {
                    return;
                }
            }
            Some(other) => {
                send(&mut out, &error_reply(Json::Null, "unexpected_message", format!("unexpected {other:?} message")))
            }
            None => {
                let id = match msg.get("id") {
                    Some(Json::Int(i)) if *i >= 1 => Json::Int(*i),
                    _ => Json::Null,
                };
                let (Some(c), Some(op)) = (cache.as_mut(), msg.get("op")) else {
                    send(&mut out, &error_reply(id, "malformed_request", "a request needs a session and an op".into()));
                    continue;
                };
                let op = match parse_op(op) {
                    Ok(op) => op,
                    Err((code, message)) => {
                        send(&mut out, &error_reply(id, code, message));
                        continue;
                    }
                };
                let mut events = Vec::new();
                let mut fields = match c.apply(&op, &mut events) {
                    Ok(value) => vec![("value", Json::Int(value as i64)), ("error", Json::Null)],
                    Err(r) => {
                        events.clear();
                        let err = obj(vec![("rule", Json::Str(r.rule.into())), ("message", Json::Str(r.message))]);
                        vec![("value", Json::Null), ("error", err)]
                    }
                };
                let evs = events.iter().map(|e| c.event_json(e)).collect();
                fields.push(("events", Json::Arr(evs)));
                fields.push(("state", c.state()));
                send(&mut out, &obj(vec![("id", id), ("outcome", obj(fields))]));
            }
        }
    }
}
