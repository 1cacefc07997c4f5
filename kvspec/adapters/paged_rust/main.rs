//! A Rust port (std only) of the ferrum engine's paged KV cache manager
//! (sizzlecar/ferrum-infer-rs crates/ferrum-kv/src/managers/paged.rs,
//! `PagedKvCacheManager`, over `blocks/pool.rs` `BlockPool`), served over the
//! kvspec JSON-lines protocol, version 3 (profile `paged`).
//!
//! Without a variant the port does what SPEC.md "Paged allocator" says. Each
//! `--variant NAME` puts back one of the seed's own paths exactly as the seed
//! has it (`seed_exact`: all of them), so that the suite shows what each one
//! breaks (README, "Findings in the allocator ports").

#[path = "../rust_common/json.rs"]
mod json;

use json::{obj, Json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufRead, Write};

#[derive(Default, Clone, Copy)]
struct Seed {
    /// block tables use physical id 0 as "no block" (PagedKvCacheHandle::add_block / num_blocks)
    block_zero_absent: bool,
    /// write_kv writes into the physical block, shared or not (no copy-on-write)
    write_in_place: bool,
    /// swap_out / swap_in take blocks in the other pool and copy nothing
    swap_without_copy: bool,
    /// allocate_blocks keeps the blocks it took when the pool runs out
    partial_allocation: bool,
    /// the prefix cache keeps a copy of the handle, not references to its blocks
    prefix_keeps_handle: bool,
    /// write_kv checks only that the block exists, not the sequence's length
    write_past_tokens: bool,
    /// check_pressure counts only returned blocks as free (never-used ones are not)
    pressure_returned_only: bool,
}

impl Seed {
    fn from_variant(name: &str) -> Result<Seed, String> {
        let mut s = Seed::default();
        match name {
            "block_zero_absent" => s.block_zero_absent = true,
            "write_in_place" => s.write_in_place = true,
            "swap_without_copy" => s.swap_without_copy = true,
            "partial_allocation" => s.partial_allocation = true,
            "prefix_keeps_handle" => s.prefix_keeps_handle = true,
            "write_past_tokens" => s.write_past_tokens = true,
            "pressure_returned_only" => s.pressure_returned_only = true,
            "seed_exact" => {
                s = Seed {
                    block_zero_absent: true,
                    write_in_place: true,
                    swap_without_copy: true,
                    partial_allocation: true,
                    prefix_keeps_handle: true,
                    write_past_tokens: true,
                    pressure_returned_only: true,
                }
            }
            other => return Err(format!("unknown variant {other:?}")),
        }
        Ok(s)
    }
}

/// ferrum's BlockPool: blocks created on demand up to max_blocks, a free queue,
/// a reference count per block; deallocate frees a block when its count is 0.
struct BlockPool {
    max_blocks: usize,
    block_size: usize,
    free: VecDeque<u32>,
    next_id: u32,
    refs: HashMap<u32, u64>,
    data: HashMap<u32, Vec<i64>>,
}

impl BlockPool {
    fn new(max_blocks: usize, block_size: usize) -> Self {
        BlockPool { max_blocks, block_size, free: VecDeque::new(), next_id: 0, refs: HashMap::new(), data: HashMap::new() }
    }
    fn available(&self) -> usize {
        self.free.len() + (self.max_blocks - self.next_id as usize)
    }
    fn allocate(&mut self) -> Result<u32, String> {
        let id = if let Some(id) = self.free.pop_front() {
            id
        } else if (self.next_id as usize) < self.max_blocks {
            self.next_id += 1;
            self.data.insert(self.next_id - 1, vec![0; self.block_size]);
            self.next_id - 1
        } else {
            return Err(format!("Block pool exhausted: {}/{} blocks allocated", self.max_blocks, self.max_blocks));
        };
        *self.refs.entry(id).or_insert(0) += 1;
        Ok(id)
    }
    fn add_ref(&mut self, id: u32) {
        *self.refs.entry(id).or_insert(0) += 1;
    }
    fn deallocate(&mut self, id: u32) {
        if let Some(r) = self.refs.get_mut(&id) {
            if *r > 0 {
                *r -= 1;
                if *r == 0 {
                    self.free.push_back(id);
                }
            }
        }
    }
    fn in_use(&self) -> BTreeMap<u32, u64> {
        self.refs.iter().filter(|(_, r)| **r > 0).map(|(k, r)| (*k, *r)).collect()
    }
}

#[derive(Clone)]
struct Handle {
    on_device: bool,
    tokens: usize,
    table: Vec<u32>,
}

struct Manager {
    seed: Seed,
    bs: usize,
    device: BlockPool,
    host: BlockPool,
    handles: BTreeMap<String, Handle>,
    prefixes: Vec<(String, Vec<u32>)>,
    max_prefixes: usize,
    high_below: f64,
    critical_below: f64,
}

struct Reject(&'static str, String);

fn validate(msg: String) -> Reject {
    Reject("PAGED-VALIDATE", msg)
}

impl Manager {
    fn blocks(&self, h: &Handle) -> Vec<u32> {
        // the seed's get_physical_blocks: ids > 0 only
        h.table.iter().copied().filter(|&b| !(self.seed.block_zero_absent && b == 0)).collect()
    }
    fn pool(&mut self, device: bool) -> &mut BlockPool {
        if device {
            &mut self.device
        } else {
            &mut self.host
        }
    }
    fn seq(&self, name: &str, device: Option<bool>) -> Result<Handle, Reject> {
        let h = self.handles.get(name).ok_or_else(|| validate(format!("no sequence {name:?}")))?;
        if let Some(d) = device {
            if h.on_device != d {
                return Err(validate(format!("sequence {name:?} is in the other pool")));
            }
        }
        Ok(h.clone())
    }
    fn new_name(&self, name: &str) -> Result<(), Reject> {
        if self.handles.contains_key(name) {
            return Err(validate(format!("sequence {name:?} already exists")));
        }
        Ok(())
    }
    /// allocate_blocks: n blocks appended to the table, all or nothing (seed: keeps what it took)
    fn allocate_blocks(&mut self, name: &str, n: usize, rule: &'static str) -> Result<(), Reject> {
        if !self.seed.partial_allocation && n > self.device.available() {
            return Err(Reject(rule, format!("needs {n} free blocks, {} free", self.device.available())));
        }
        for _ in 0..n {
            match self.device.allocate() {
                Ok(b) => self.handles.get_mut(name).unwrap().table.push(b),
                Err(e) => return Err(Reject(rule, e)),
            }
        }
        Ok(())
    }
    fn num_blocks(&self, h: &Handle) -> usize {
        self.blocks(h).len()
    }

    fn apply(&mut self, op: &Json) -> Result<i64, Reject> {
        let kind = op.str_of("op").map_err(validate)?;
        let s = |k: &str| op.str_of(k).map_err(validate);
        let n = |k: &str| op.int_of(k).map_err(validate);
        match kind.as_str() {
            "allocate" => {
                let name = s("seq")?;
                self.new_name(&name)?;
                let tokens = n("tokens")? as usize;
                let need = tokens.div_ceil(self.bs);
                self.handles.insert(name.clone(), Handle { on_device: true, tokens: 0, table: vec![] });
                if let Err(e) = self.allocate_blocks(&name, need, "PAGED-EXTEND") {
                    // (the seed returns before registering the handle: what it took stays taken)
                    self.handles.remove(&name);
                    return Err(e);
                }
                self.handles.get_mut(&name).unwrap().tokens = tokens;
                Ok(need as i64)
            }
            "extend" => {
                let name = s("seq")?;
                let h = self.seq(&name, Some(true))?;
                let add = n("tokens")? as usize;
                let required = (h.tokens + add).div_ceil(self.bs);
                let current = self.num_blocks(&h);
                let need = required.saturating_sub(current);
                self.allocate_blocks(&name, need, "PAGED-EXTEND")?;
                self.handles.get_mut(&name).unwrap().tokens = h.tokens + add;
                Ok(need as i64)
            }
            "fork" => {
                let src = self.seq(&s("src")?, Some(true))?;
                let dst = s("dst")?;
                self.new_name(&dst)?;
                let blocks = self.blocks(&src);
                let count = op.opt_int("blocks").map_err(validate)?.map(|b| b as usize).unwrap_or(blocks.len());
                let k = count.min(blocks.len());
                for &b in &blocks[..k] {
                    self.device.add_ref(b);
                }
                let tokens = src.tokens.min(k * self.bs);
                self.handles.insert(dst, Handle { on_device: true, tokens, table: blocks[..k].to_vec() });
                Ok(k as i64)
            }
            "write" => {
                let name = s("seq")?;
                let h = self.seq(&name, Some(true))?;
                let pos = n("position")? as usize;
                let value = n("value")?;
                let i = pos / self.bs;
                let blocks = self.blocks(&h);
                let past = if self.seed.write_past_tokens { i >= blocks.len() } else { pos >= h.tokens };
                if past {
                    return Err(validate(format!("No physical block for logical block {i} (token {pos})")));
                }
                let mut b = blocks[i];
                let mut copied = 0;
                if !self.seed.write_in_place && self.device.refs[&b] > 1 {
                    if self.device.available() == 0 {
                        return Err(Reject("PAGED-COW", format!("no free block to copy block {b}")));
                    }
                    let nb = self.device.allocate().map_err(|e| Reject("PAGED-COW", e))?;
                    let contents = self.device.data[&b].clone();
                    self.device.data.insert(nb, contents);
                    self.device.deallocate(b);
                    let t = &mut self.handles.get_mut(&name).unwrap().table;
                    let at = t.iter().position(|&x| x == b).unwrap();
                    t[at] = nb;
                    b = nb;
                    copied = 1;
                }
                self.device.data.get_mut(&b).unwrap()[pos % self.bs] = value;
                Ok(copied)
            }
            "swap_out" | "swap_in" => {
                let out = kind == "swap_out";
                let name = s("seq")?;
                let h = self.seq(&name, Some(out))?;
                let blocks = self.blocks(&h);
                if blocks.len() > self.pool(!out).available() {
                    return Err(Reject("PAGED-SWAP", format!("{} blocks needed in the other pool", blocks.len())));
                }
                let mut moved = Vec::new();
                for &b in &blocks {
                    let nb = self.pool(!out).allocate().map_err(|e| Reject("PAGED-SWAP", e))?;
                    if !self.seed.swap_without_copy {
                        let contents = self.pool(out).data[&b].clone();
                        self.pool(!out).data.insert(nb, contents);
                    }
                    moved.push(nb);
                }
                for &b in &blocks {
                    self.pool(out).deallocate(b);
                }
                let hm = self.handles.get_mut(&name).unwrap();
                hm.on_device = !out;
                hm.table = moved;
                Ok(blocks.len() as i64)
            }
            "free" => {
                let name = s("seq")?;
                let h = self.seq(&name, None)?;
                self.handles.remove(&name);
                let mut freed = 0;
                for b in self.blocks(&h) {
                    let pool = self.pool(h.on_device);
                    pool.deallocate(b);
                    if pool.refs.get(&b).copied().unwrap_or(0) == 0 {
                        freed += 1;
                    }
                }
                Ok(freed)
            }
            "store_prefix" => {
                let key = s("key")?;
                let h = self.seq(&s("seq")?, Some(true))?;
                let count = n("blocks")? as usize;
                if self.prefixes.iter().any(|(k, _)| *k == key) {
                    return Err(validate(format!("prefix {key:?} is already cached")));
                }
                let blocks = self.blocks(&h);
                if count > blocks.len() {
                    return Err(validate(format!("the sequence has {} blocks, not {count}", blocks.len())));
                }
                if self.max_prefixes == 0 {
                    return Err(validate("the prefix cache is disabled".into()));
                }
                let mut evicted = 0;
                if self.prefixes.len() >= self.max_prefixes {
                    let victim = self.evictable().into_iter().next().ok_or_else(|| {
                        Reject("PAGED-PREFIX-EVICT", "prefix cache full and every entry is in use".into())
                    })?;
                    self.evict(victim);
                    evicted = 1;
                }
                let kept = blocks[..count].to_vec();
                if !self.seed.prefix_keeps_handle {
                    for &b in &kept {
                        self.device.add_ref(b);
                    }
                }
                self.prefixes.push((key, kept));
                Ok(evicted)
            }
            "match_prefix" => {
                let key = s("key")?;
                let at = self
                    .prefixes
                    .iter()
                    .position(|(k, _)| *k == key)
                    .ok_or_else(|| validate(format!("no cached prefix {key:?}")))?;
                let dst = s("dst")?;
                self.new_name(&dst)?;
                let entry = self.prefixes.remove(at);
                for &b in &entry.1 {
                    self.device.add_ref(b);
                }
                let blocks = entry.1.clone();
                self.prefixes.push(entry);
                let tokens = blocks.len() * self.bs;
                let k = blocks.len() as i64;
                self.handles.insert(dst, Handle { on_device: true, tokens, table: blocks });
                Ok(k)
            }
            "evict_prefixes" => {
                let count = n("count")? as usize;
                let victims: Vec<usize> = self.evictable().into_iter().take(count).collect();
                for (done, at) in victims.iter().enumerate() {
                    self.evict(at - done);
                }
                Ok(victims.len() as i64)
            }
            other => Err(Reject("", format!("unsupported op {other:?}"))),
        }
    }

    /// indices of prefix entries no live device sequence holds a block of, oldest use first
    fn evictable(&self) -> Vec<usize> {
        let held: Vec<u32> =
            self.handles.values().filter(|h| h.on_device).flat_map(|h| self.blocks(h)).collect();
        (0..self.prefixes.len()).filter(|&i| !self.prefixes[i].1.iter().any(|b| held.contains(b))).collect()
    }
    fn evict(&mut self, at: usize) {
        let (_, blocks) = self.prefixes.remove(at);
        if !self.seed.prefix_keeps_handle {
            for b in blocks {
                self.device.deallocate(b);
            }
        }
    }

    fn pressure(&self) -> &'static str {
        let free = if self.seed.pressure_returned_only { self.device.free.len() } else { self.device.available() };
        let frac = free as f64 / self.device.max_blocks.max(1) as f64;
        if frac < self.critical_below {
            "critical"
        } else if frac < self.high_below {
            "high"
        } else {
            "low"
        }
    }

    fn snapshot(&self) -> Json {
        let mut seqs = Vec::new();
        for (name, h) in &self.handles {
            let pool = if h.on_device { &self.device } else { &self.host };
            let blocks = self.blocks(h);
            let data: Vec<Json> = (0..h.tokens)
                .map(|p| match blocks.get(p / self.bs) {
                    Some(b) => Json::Int(pool.data[b][p % self.bs]),
                    None => Json::Null,
                })
                .collect();
            seqs.push((
                name.clone(),
                obj(vec![
                    ("tier", Json::Str(if h.on_device { "device" } else { "host" }.into())),
                    ("tokens", Json::Int(h.tokens as i64)),
                    ("blocks", Json::Arr(blocks.iter().map(|&b| Json::Int(b as i64)).collect())),
                    ("data", Json::Arr(data)),
                ]),
            ));
        }
        let dev = self.device.in_use();
        let host = self.host.in_use();
        obj(vec![
            ("sequences", Json::Obj(seqs)),
            ("device_refs", json::int_map(&dev)),
            ("host_refs", json::int_map(&host)),
            ("free_device", Json::Int((self.device.max_blocks - dev.len()) as i64)),
            ("free_host", Json::Int((self.host.max_blocks - host.len()) as i64)),
            (
                "prefixes",
                Json::Arr(
                    self.prefixes
                        .iter()
                        .map(|(k, b)| {
                            obj(vec![
                                ("key", Json::Str(k.clone())),
                                ("blocks", Json::Arr(b.iter().map(|&x| Json::Int(x as i64)).collect())),
                            ])
                        })
                        .collect(),
                ),
            ),
            ("pressure", Json::Str(self.pressure().into())),
        ])
    }
}

fn send(out: &mut impl Write, v: &Json) {
    let _ = writeln!(out, "{}", json::to_string(v));
    let _ = out.flush();
}

fn error_reply(id: Json, code: &str, message: String) -> Json {
    obj(vec![("id", id), ("error", obj(vec![("code", Json::Str(code.into())), ("message", Json::Str(message))]))])
}

fn handshake(line: &str, seed: Seed) -> Result<Manager, (String, String)> {
    let hello = json::parse(line).map_err(|e| ("unsupported_config".to_string(), e))?;
    let offered = match hello.get("versions") {
        Some(Json::Arr(v)) => v.contains(&Json::Int(3)),
        _ => false,
    };
    if !offered {
        return Err(("unsupported_version".into(), "speaks version 3 (allocator-level sessions) only".into()));
    }
    let m = hello.get("manager").ok_or(("unsupported_config".to_string(), "no manager in hello".to_string()))?;
    if m.str_of("kind").ok().as_deref() != Some("paged") {
        return Err(("unsupported_config".into(), "this port runs the paged profile only".into()));
    }
    let get = |k: &str, d: i64| m.opt_int(k).map(|v| v.unwrap_or(d) as usize).map_err(|e| ("unsupported_config".to_string(), e));
    let bs = get("block_size", 4)?;
    Ok(Manager {
        seed,
        bs,
        device: BlockPool::new(get("device_blocks", 0)?, bs),
        host: BlockPool::new(get("host_blocks", 0)?, bs),
        handles: BTreeMap::new(),
        prefixes: Vec::new(),
        max_prefixes: get("max_prefixes", 4)?,
        high_below: m.num_of("high_below", 0.3).map_err(|e| ("unsupported_config".to_string(), e))?,
        critical_below: m.num_of("critical_below", 0.1).map_err(|e| ("unsupported_config".to_string(), e))?,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seed = match args.iter().position(|a| a == "--variant") {
        Some(i) => match args.get(i + 1).map(|v| Seed::from_variant(v)) {
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                eprintln!("{e}");
                std::process::exit(2)
            }
            None => std::process::exit(2),
        },
        None => Seed::default(),
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut manager: Option<Manager> = None;
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let msg = match json::parse(&line) {
            Ok(m) => m,
            Err(e) => {
                send(&mut out, &error_reply(Json::Null, "malformed_request", e));
                continue;
            }
        };
        match msg.get("type").and_then(|t| if let Json::Str(s) = t { Some(s.as_str()) } else { None }) {
            Some("bye") => return,
            Some("hello") => match handshake(&line, seed) {
                Ok(m) => {
                    manager = Some(m);
                    let caps = obj(vec![
                        ("block_level", Json::Bool(false)),
                        ("profiles", Json::Arr(vec![Json::Str("paged".into())])),
                    ]);
                    send(
                        &mut out,
                        &obj(vec![
                            ("type", Json::Str("ready".into())),
                            ("name", Json::Str("ferrum paged KV cache manager, Rust port".into())),
                            ("protocol", Json::Int(3)),
                            ("profile", Json::Str("paged".into())),
                            ("capabilities", caps),
                            ("multi_session", Json::Bool(true)),
                        ]),
                    );
                }
                Err((code, message)) => {
                    let err = obj(vec![("code", Json::Str(code)), ("message", Json::Str(message))]);
                    send(&mut out, &obj(vec![("type", Json::Str("refused".into())), ("error", err)]));
                    return;
                }
            },
            Some(other) => send(&mut out, &error_reply(Json::Null, "unexpected_message", format!("{other:?}"))),
            None => {
                let id = msg.get("id").cloned().unwrap_or(Json::Null);
                let (Some(m), Some(op)) = (manager.as_mut(), msg.get("op")) else {
                    send(&mut out, &error_reply(id, "malformed_request", "a request needs a session and an op".into()));
                    continue;
                };
                let outcome = match m.apply(op) {
                    Ok(v) => obj(vec![("value", Json::Int(v)), ("state", m.snapshot())]),
                    Err(Reject("", message)) => {
                        send(&mut out, &error_reply(id, "unsupported_op", message));
                        continue;
                    }
                    Err(Reject(rule, message)) => obj(vec![
                        ("error", obj(vec![("rule", Json::Str(rule.into())), ("message", Json::Str(message))])),
                        ("state", m.snapshot()),
                    ]),
                };
                send(&mut out, &obj(vec![("id", id), ("outcome", outcome)]));
            }
        }
    }
}
