//! A Rust port (std only) of the session KV cache manager of a llama.cpp-based
//! runtime (`KvCacheManager`: admit, finalize_slot, release_slot_for_reset,
//! evict_all_active_and_idle, queue_prefix_snapshot /
//! drain_pending_prefix_snapshots), following that source as it is, served
//! over the kvspec JSON-lines protocol version 3 (profile `session`). The
//! prefix-state cache itself (snapshots of the native runtime) is out of
//! scope: a queued snapshot is its (slot, generation) pair.
//!
//! The glue at the bottom (`serve`) is what an engine adds: it remembers which
//! session leases which slot (the manager does not) so that the state can be
//! reported, and names the rule of a refused admission.

#[path = "../rust_common/json.rs"]
mod json;

use json::{obj, Json};
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Write};

#[derive(Clone, Copy, PartialEq)]
struct ResidentRef {
    seq_id: usize,
    generation: u64,
}

#[derive(Clone, Default)]
struct SessionRecord {
    resident: Option<ResidentRef>,
    in_flight: bool,
}

#[derive(Clone, PartialEq)]
enum SeqState {
    Free,
    Idle(Vec<i64>),
    Leased,
}

struct PhysicalSequence {
    generation: u64,
    state: SeqState,
}

struct Admission {
    seq_id: usize,
    generation: u64,
    mirror: Vec<i64>,
    live: bool,
    requires_kv_clear: bool,
}

struct KvCacheManager {
    sessions: HashMap<String, SessionRecord>,
    idle_lru: VecDeque<String>,
    physical: Vec<PhysicalSequence>,
    pending: Vec<(usize, u64)>,
}

impl KvCacheManager {
    fn new(max_sequences: usize) -> Self {
        let n = max_sequences.max(1);
        KvCacheManager {
            sessions: HashMap::new(),
            idle_lru: VecDeque::new(),
            physical: (0..n).map(|_| PhysicalSequence { generation: 0, state: SeqState::Free }).collect(),
            pending: Vec::new(),
        }
    }

    fn can_admit(&mut self, key: &str) -> bool {
        self.prune_stale_idle_sessions();
        if self.sessions.get(key).is_some_and(|r| r.in_flight) {
            return false;
        }
        if self.sessions.contains_key(key) {
            return self.has_available_sequence();
        }
        if self.sessions.len() >= self.physical.len() && self.first_valid_idle_session_key().is_none() {
            return false;
        }
        self.has_available_sequence()
    }

    fn admit(&mut self, key: &str, warm: bool) -> Option<Admission> {
        if !self.can_admit(key) {
            return None;
        }
        if warm {
            if let Some(a) = self.try_admit_warm(key) {
                return Some(a);
            }
        }
        self.admit_cold(key)
    }

    fn finalize_slot(&mut self, key: &str, seq_id: usize, generation: u64, mirror: Vec<i64>, keep: bool) -> bool {
        if !self.sequence_generation_matches(seq_id, generation) {
            return false;
        }
        if keep {
            self.physical[seq_id].state = SeqState::Idle(mirror);
            self.set_session_idle(key, ResidentRef { seq_id, generation });
        } else {
            self.evict_sequence(seq_id);
            self.clear_session(key);
        }
        true
    }

    fn release_slot_for_reset(&mut self, key: &str, seq_id: usize, generation: u64) -> bool {
        if !self.sequence_generation_matches(seq_id, generation) {
            return false;
        }
        self.evict_sequence(seq_id);
        self.clear_session(key);
        true
    }

    fn evict_all_active_and_idle(&mut self) {
        for p in &mut self.physical {
            p.state = SeqState::Free;
            p.generation = p.generation.saturating_add(1);
        }
        self.sessions.clear();
        self.idle_lru.clear();
        self.pending.clear();
    }

    fn queue_prefix_snapshot(&mut self, seq_id: usize, generation: u64) {
        self.pending.push((seq_id, generation));
    }

    fn drain_pending_prefix_snapshots(&mut self) -> Vec<(usize, u64)> {
        let gens: Vec<u64> = self.physical.iter().map(|p| p.generation).collect();
        let all = std::mem::take(&mut self.pending);
        all.into_iter().filter(|(s, g)| *s < gens.len() && gens[*s] == *g).collect()
    }

    fn try_admit_warm(&mut self, key: &str) -> Option<Admission> {
        let resident = self.sessions.get(key)?.resident?;
        let index = self.valid_resident_index(resident)?;
        let SeqState::Idle(mirror) = std::mem::replace(&mut self.physical[index].state, SeqState::Leased) else {
            return None;
        };
        self.remove_lru_key(key);
        let record = self.sessions.get_mut(key)?;
        record.resident = None;
        record.in_flight = true;
        Some(Admission { seq_id: resident.seq_id, generation: resident.generation, mirror, live: true, requires_kv_clear: false })
    }

    fn admit_cold(&mut self, key: &str) -> Option<Admission> {
        let (seq_id, requires_kv_clear) = self.select_cold_target(key)?;
        self.pending.retain(|(s, _)| *s != seq_id);
        let p = &mut self.physical[seq_id];
        p.state = SeqState::Free;
        p.generation = p.generation.saturating_add(1);
        p.state = SeqState::Leased;
        self.remove_lru_key(key);
        let record = self.sessions.entry(key.to_string()).or_default();
        record.resident = None;
        record.in_flight = true;
        Some(Admission { seq_id, generation: self.physical[seq_id].generation, mirror: vec![], live: false, requires_kv_clear })
    }

    fn select_cold_target(&mut self, key: &str) -> Option<(usize, bool)> {
        if let Some(seq_id) = self.take_own_resident_target(key) {
            return Some((seq_id, true));
        }
        if self.sessions.contains_key(key) || self.sessions.len() < self.physical.len() {
            if let Some(t) = self.first_free_sequence_target() {
                return Some(t);
            }
        }
        if let Some(seq_id) = self.evict_lru_idle_session() {
            return Some((seq_id, true));
        }
        self.first_free_sequence_target()
    }

    fn take_own_resident_target(&mut self, key: &str) -> Option<usize> {
        let resident = self.sessions.get(key)?.resident?;
        let index = self.valid_resident_index(resident)?;
        self.remove_lru_key(key);
        if let Some(r) = self.sessions.get_mut(key) {
            r.resident = None;
        }
        self.physical[index].state = SeqState::Free;
        Some(resident.seq_id)
    }

    fn evict_lru_idle_session(&mut self) -> Option<usize> {
        while let Some(key) = self.idle_lru.pop_front() {
            let Some(record) = self.sessions.get(&key).cloned() else { continue };
            if record.in_flight {
                continue;
            }
            let Some(resident) = record.resident else {
                self.sessions.remove(&key);
                continue;
            };
            let Some(index) = self.valid_resident_index(resident) else {
                self.sessions.remove(&key);
                continue;
            };
            self.sessions.remove(&key);
            self.physical[index].state = SeqState::Free;
            return Some(resident.seq_id);
        }
        None
    }

    fn set_session_idle(&mut self, key: &str, resident: ResidentRef) {
        let record = self.sessions.entry(key.to_string()).or_default();
        record.resident = Some(resident);
        record.in_flight = false;
        self.remove_lru_key(key);
        self.idle_lru.push_back(key.to_string());
    }

    fn clear_session(&mut self, key: &str) {
        self.remove_lru_key(key);
        self.sessions.remove(key);
    }

    fn evict_sequence(&mut self, seq_id: usize) {
        if seq_id >= self.physical.len() {
            return;
        }
        self.pending.retain(|(s, _)| *s != seq_id);
        let p = &mut self.physical[seq_id];
        p.state = SeqState::Free;
        p.generation = p.generation.saturating_add(1);
    }

    fn prune_stale_idle_sessions(&mut self) {
        let mut retained = VecDeque::new();
        while let Some(key) = self.idle_lru.pop_front() {
            let Some(record) = self.sessions.get(&key).cloned() else { continue };
            if record.in_flight {
                continue;
            }
            if record.resident.and_then(|r| self.valid_resident_index(r)).is_some() {
                retained.push_back(key);
            } else {
                self.sessions.remove(&key);
            }
        }
        self.idle_lru = retained;
    }

    fn first_valid_idle_session_key(&self) -> Option<&str> {
        self.idle_lru.iter().find_map(|key| {
            let record = self.sessions.get(key)?;
            if record.in_flight {
                return None;
            }
            record.resident.and_then(|r| self.valid_resident_index(r)).map(|_| key.as_str())
        })
    }

    fn has_available_sequence(&self) -> bool {
        self.first_free_sequence_target().is_some() || self.first_valid_idle_session_key().is_some()
    }

    fn first_free_sequence_target(&self) -> Option<(usize, bool)> {
        self.physical.iter().enumerate().find(|(_, p)| p.state == SeqState::Free).map(|(i, p)| (i, p.generation > 0))
    }

    fn valid_resident_index(&self, r: ResidentRef) -> Option<usize> {
        let p = self.physical.get(r.seq_id)?;
        (p.generation == r.generation && matches!(p.state, SeqState::Idle(_))).then_some(r.seq_id)
    }

    fn sequence_generation_matches(&self, seq_id: usize, generation: u64) -> bool {
        self.physical.get(seq_id).is_some_and(|p| p.generation == generation)
    }

    fn remove_lru_key(&mut self, key: &str) {
        if let Some(i) = self.idle_lru.iter().position(|k| k == key) {
            self.idle_lru.remove(i);
        }
    }
}

// ------------------------------------------------------------------ the glue

struct Engine {
    m: KvCacheManager,
    /// which session each slot is leased to (the manager keeps no such record)
    leased_by: Vec<Option<String>>,
}

impl Engine {
    fn state(&self) -> Json {
        let mut idle_owner: HashMap<usize, String> = HashMap::new();
        for (k, r) in &self.m.sessions {
            if let Some(res) = r.resident {
                idle_owner.insert(res.seq_id, k.clone());
            }
        }
        let slots = self
            .m
            .physical
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (state, session) = match &p.state {
                    SeqState::Free => ("free", None),
                    SeqState::Idle(_) => ("idle", idle_owner.get(&i).cloned()),
                    SeqState::Leased => ("leased", self.leased_by[i].clone()),
                };
                obj(vec![
                    ("state", Json::Str(state.into())),
                    ("generation", Json::Int(p.generation as i64)),
                    ("session", session.map(Json::Str).unwrap_or(Json::Null)),
                ])
            })
            .collect();
        let mut in_flight: Vec<&String> = self.m.sessions.iter().filter(|(_, r)| r.in_flight).map(|(k, _)| k).collect();
        in_flight.sort();
        let pair = |(s, g): &(usize, u64)| Json::Arr(vec![Json::Int(*s as i64), Json::Int(*g as i64)]);
        obj(vec![
            ("slots", Json::Arr(slots)),
            ("idle_lru", Json::Arr(self.m.idle_lru.iter().map(|k| Json::Str(k.clone())).collect())),
            ("in_flight", Json::Arr(in_flight.into_iter().map(|k| Json::Str(k.clone())).collect())),
            ("pending", Json::Arr(self.m.pending.iter().map(pair).collect())),
        ])
    }

    fn apply(&mut self, op: &Json) -> Result<Vec<(&'static str, Json)>, String> {
        let kind = op.str_of("op")?;
        let slot_gen = || -> Result<(usize, u64), String> { Ok((op.int_of("slot")? as usize, op.int_of("generation")? as u64)) };
        Ok(match kind.as_str() {
            "admit" => {
                let key = op.str_of("session")?;
                let in_flight = self.m.sessions.get(&key).is_some_and(|r| r.in_flight);
                match self.m.admit(&key, op.bool_of("warm", true)?) {
                    Some(a) => {
                        self.leased_by[a.seq_id] = Some(key);
                        vec![(
                            "admission",
                            obj(vec![
                                ("slot", Json::Int(a.seq_id as i64)),
                                ("generation", Json::Int(a.generation as i64)),
                                ("candidate", Json::Str(if a.live { "live" } else { "none" }.into())),
                                ("requires_clear", Json::Bool(a.requires_kv_clear)),
                                ("tokens", Json::Arr(a.mirror.into_iter().map(Json::Int).collect())),
                            ]),
                        )]
                    }
                    None => vec![("refused", Json::Str(if in_flight { "SESSION-LEASE" } else { "SESSION-LRU" }.into()))],
                }
            }
            "finalize" => {
                let (slot, generation) = slot_gen()?;
                let tokens = match op.get("tokens") {
                    Some(Json::Arr(v)) => v.iter().map(|t| if let Json::Int(i) = t { *i } else { 0 }).collect(),
                    _ => vec![],
                };
                let keep = op.bool_of("keep", true)?;
                let applied = self.m.finalize_slot(&op.str_of("session")?, slot, generation, tokens, keep);
                if applied && slot < self.leased_by.len() {
                    self.leased_by[slot] = None;
                }
                vec![("applied", Json::Bool(applied))]
            }
            "reset" => {
                let (slot, generation) = slot_gen()?;
                let applied = self.m.release_slot_for_reset(&op.str_of("session")?, slot, generation);
                if applied && slot < self.leased_by.len() {
                    self.leased_by[slot] = None;
                }
                vec![("applied", Json::Bool(applied))]
            }
            "evict_all" => {
                self.m.evict_all_active_and_idle();
                self.leased_by.iter_mut().for_each(|s| *s = None);
                vec![("applied", Json::Bool(true))]
            }
            "snapshot" => {
                let (slot, generation) = slot_gen()?;
                self.m.queue_prefix_snapshot(slot, generation);
                vec![("applied", Json::Bool(true))]
            }
            "drain" => {
                let taken = self.m.drain_pending_prefix_snapshots();
                let pairs = taken.iter().map(|(s, g)| Json::Arr(vec![Json::Int(*s as i64), Json::Int(*g as i64)])).collect();
                vec![("drained", Json::Arr(pairs))]
            }
            other => return Err(format!("unsupported op {other:?}")),
        })
    }
}

fn send(out: &mut impl Write, v: &Json) {
    let _ = writeln!(out, "{}", json::to_string(v));
    let _ = out.flush();
}

fn error_reply(id: Json, code: &str, message: String) -> Json {
    obj(vec![("id", id), ("error", obj(vec![("code", Json::Str(code.into())), ("message", Json::Str(message))]))])
}

fn main() {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut engine: Option<Engine> = None;
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let msg = match json::parse(&line) {
            Ok(m) => m,
            Err(e) => {
                send(&mut out, &error_reply(Json::Null, "malformed_request", e));
                continue;
            }
        };
        match msg.get("type").and_then(|t| if let Json::Str(s) = t { Some(s.clone()) } else { None }).as_deref() {
            Some("bye") => return,
            Some("hello") => {
                let v3 = matches!(msg.get("versions"), Some(Json::Arr(v)) if v.contains(&Json::Int(3)));
                let slots = msg.get("manager").filter(|m| m.str_of("kind").ok().as_deref() == Some("session")).and_then(|m| m.int_of("slots").ok());
                match (v3, slots) {
                    (true, Some(n)) => {
                        let m = KvCacheManager::new(n as usize);
                        let len = m.physical.len();
                        engine = Some(Engine { m, leased_by: vec![None; len] });
                        let caps = obj(vec![("block_level", Json::Bool(false)), ("profiles", Json::Arr(vec![Json::Str("session".into())]))]);
                        send(
                            &mut out,
                            &obj(vec![
                                ("type", Json::Str("ready".into())),
                                ("name", Json::Str("llama.cpp-runtime session KV cache manager, Rust port".into())),
                                ("protocol", Json::Int(3)),
                                ("profile", Json::Str("session".into())),
                                ("capabilities", caps),
                                ("multi_session", Json::Bool(true)),
                            ]),
                        );
                    }
                    (v3, _) => {
                        let (code, message) = if v3 { ("unsupported_config", "this port runs the session profile only") } else { ("unsupported_version", "speaks version 3 only") };
                        let err = obj(vec![("code", Json::Str(code.into())), ("message", Json::Str(message.into()))]);
                        send(&mut out, &obj(vec![("type", Json::Str("refused".into())), ("error", err)]));
                        return;
                    }
                }
            }
            Some(other) => send(&mut out, &error_reply(Json::Null, "unexpected_message", format!("{other:?}"))),
            None => {
                let id = msg.get("id").cloned().unwrap_or(Json::Null);
                let (Some(e), Some(op)) = (engine.as_mut(), msg.get("op")) else {
                    send(&mut out, &error_reply(id, "malformed_request", "a request needs a session and an op".into()));
                    continue;
                };
                match e.apply(op) {
                    Ok(mut fields) => {
                        fields.push(("state", e.state()));
                        send(&mut out, &obj(vec![("id", id), ("outcome", obj(fields))]));
                    }
                    Err(message) => send(&mut out, &error_reply(id, "unsupported_op", message)),
                }
            }
        }
    }
}
