//! kvbm_port_rs: an independent Rust port of Dynamo's kvbm mocker KvManager,
//! served over kvspec's JSON-lines protocol (spec/PROTOCOL.md: version 1, block
//! level, one worker; version 5, several workers of one process sharing G3/G4,
//! each request naming its worker). Standard library only.
//!
//! Usage: kvbm_port_rs [--variant NAME]   (NAME: one single-bug variant, default none)

mod json;
mod lower;
mod manager;
mod offload;
mod pools;
mod variants;

use std::io::{BufRead, Write};

use json::{obj, Json};
use manager::{BlockRef, Counters, EventData, KvManager, Status, Tier, UseArgs};
use lower::LowerConfig;
use offload::{Allocation, Dedup, G2Eviction, Link, OffloadConfig, OffloadEngine, TickResult};
use pools::{Plh, Policy};
use variants::Bugs;

const NAME: &str = "kvbm_port_rs (Rust port of Dynamo's kvbm mocker KvManager)";
/// the most workers one process session serves (the manifest's `workers`)
const MAX_WORKERS: u64 = 4;

/// One session: a worker (version 1) or the workers of one process (version 5).
struct Session {
    mgrs: Vec<KvManager>,
    /// version 5: requests name their worker, replies carry the others' events
    process: bool,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut variant = String::from("none");
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--variant" if i + 1 < args.len() => {
                variant = args[i + 1].clone();
                i += 2;
            }
            other => {
                eprintln!("kvbm_port_rs: unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    let bugs = match Bugs::from_name(&variant) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("kvbm_port_rs: {e}");
            std::process::exit(2);
        }
    };
    eprintln!("kvbm_port_rs: variant {variant}");
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut lines = stdin.lock().lines();
    let mut session: Option<Session> = None;
    let mut started = false;
    loop {
        let Some(Ok(line)) = lines.next() else { break };
        let line = line.trim_end_matches('\r');
        let msg = match json::parse(line) {
            Ok(m) => m,
            Err(e) => {
                if !started {
                    eprintln!("kvbm_port_rs: first line is not JSON: {e}");
                    std::process::exit(1);
                }
                send(&mut out, &error_reply(Json::Null, "malformed_request", &format!("not valid JSON: {e}")));
                continue;
            }
        };
        match msg.get("type").and_then(Json::as_str) {
            Some("hello") => match hello(&msg, bugs) {
                Ok(s) => {
                    let process = s.process;
                    session = Some(s);
                    started = true;
                    send(&mut out, &ready(process));
                }
                Err((code, message)) => {
                    send(
                        &mut out,
                        &obj(vec![
                            ("type", Json::Str("refused".into())),
                            ("error", obj(vec![("code", Json::Str(code.into())), ("message", Json::Str(message))])),
                        ]),
                    );
                    std::process::exit(0);
                }
            },
            Some("bye") => break,
            Some(other) => {
                send(&mut out, &error_reply(Json::Null, "unexpected_message", &format!("unexpected '{other}' message")));
            }
            None => {
                let id = msg.get("id").cloned().unwrap_or(Json::Null);
                let Some(sess) = session.as_mut() else {
                    send(&mut out, &error_reply(id, "unexpected_message", "a request before hello"));
                    continue;
                };
                if !matches!(id, Json::UInt(_)) {
                    send(&mut out, &error_reply(Json::Null, "malformed_request", "request without an integer id"));
                    continue;
                }
                let Some(op) = msg.get("op") else {
                    send(&mut out, &error_reply(id, "malformed_request", "request without op"));
                    continue;
                };
                let worker = match msg.opt("worker") {
                    None => 0,
                    Some(w) if sess.process => match w.as_u64().filter(|w| (*w as usize) < sess.mgrs.len()) {
                        Some(w) => w as usize,
                        None => {
                            send(&mut out, &error_reply(id, "malformed_request", "worker: not a worker of the session"));
                            continue;
                        }
                    },
                    Some(_) => {
                        send(&mut out, &error_reply(id, "malformed_request", "worker: only in a version-5 session"));
                        continue;
                    }
                };
                let reply = match apply(&mut sess.mgrs[worker], op) {
                    Ok(outcome) if sess.process => {
                        obj(vec![("id", id), ("outcome", outcome), ("others", others(&mut sess.mgrs, worker))])
                    }
                    Ok(outcome) => obj(vec![("id", id), ("outcome", outcome)]),
                    Err((code, message)) => error_reply(id, code, &message),
                };
                send(&mut out, &reply);
            }
        }
    }
}

fn send(out: &mut impl Write, msg: &Json) {
    let mut line = msg.to_string();
    line.push('\n');
    if out.write_all(line.as_bytes()).and_then(|_| out.flush()).is_err() {
        std::process::exit(0);
    }
}

fn error_reply(id: Json, code: &str, message: &str) -> Json {
    obj(vec![
        ("id", id),
        ("error", obj(vec![("code", Json::Str(code.into())), ("message", Json::Str(message.into()))])),
    ])
}

/// The events the other workers published during a step (their shared-tier
/// events), as a version-5 reply's `others`.
fn others(mgrs: &mut [KvManager], stepped: usize) -> Json {
    let mut out = Vec::new();
    for (w, m) in mgrs.iter_mut().enumerate() {
        if w == stepped {
            continue;
        }
        m.publish_lower();
        if m.events.is_empty() {
            continue;
        }
        let dp = m.dp_rank();
        let events: Vec<Json> = m.events.drain(..).map(|e| event_json(&e, dp)).collect();
        out.push(obj(vec![("worker", Json::UInt(w as u64)), ("events", Json::Arr(events))]));
    }
    Json::Arr(out)
}

type Refusal = (&'static str, String);

fn hello(msg: &Json, bugs: Bugs) -> Result<Session, Refusal> {
    let versions = msg.get("versions").and_then(Json::as_arr).ok_or(("unsupported_version", "no versions".to_string()))?;
    let workers = match msg.opt("workers") {
        None => 1,
        Some(w) => w
            .as_u64()
            .filter(|w| (2..=MAX_WORKERS).contains(w))
            .ok_or(("unsupported_config", format!("workers: 2..{MAX_WORKERS}")))?,
    };
    let want = if workers > 1 { 5 } else { 1 };
    if !versions.iter().any(|v| v.as_u64() == Some(want)) {
        return Err((
            "unsupported_version",
            format!("speaks version 1 (one worker) and 5 (workers), offered {}", Json::Arr(versions.clone()).to_string()),
        ));
    }
    if msg.opt("engine").is_some() {
        return Err(("unsupported_config", "no request level (block-level sessions only)".into()));
    }
    let cfg = msg.get("config").ok_or(("unsupported_config", "hello without config".to_string()))?;
    let bad = |m: &str| ("unsupported_config", m.to_string());
    let profile = cfg.opt("profile").and_then(Json::as_str).unwrap_or("kvbm");
    if profile != "kvbm" {
        return Err(bad(&format!("profile {profile}: this port is the kvbm KvManager only")));
    }
    let capacity = cfg.get("capacity").and_then(Json::as_u64).ok_or(bad("capacity missing"))? as usize;
    if capacity == 0 {
        return Err(bad("capacity 0"));
    }
    let block_size = cfg.opt("block_size").and_then(Json::as_u64).unwrap_or(16) as usize;
    let dp_rank = cfg.opt("dp_rank").and_then(Json::as_u64).unwrap_or(0);
    let policy = match cfg.opt("eviction").and_then(Json::as_str).unwrap_or("lineage") {
        "lineage" => Policy::Lineage,
        "lru" => Policy::Lru,
        "multi_lru" => Policy::MultiLru,
        other => return Err(bad(&format!("eviction policy {other} is not one of the source's backends"))),
    };
    let offload = match cfg.opt("offload") {
        None => None,
        Some(o) => Some(offload_config(o)?),
    };
    // one G3/G4 per process, shared by its workers
    let lower = offload.as_ref().and_then(|c| OffloadEngine::shared_lower(c, bugs));
    let mgrs = (0..workers as usize)
        .map(|w| KvManager::new(capacity, block_size, dp_rank, policy.clone(), offload.clone(), bugs, w, lower.clone()))
        .collect();
    Ok(Session { mgrs, process: workers > 1 })
}

fn offload_config(o: &Json) -> Result<OffloadConfig, Refusal> {
    let bad = |m: String| ("unsupported_config", m);
    let num = o.get("num_g2_blocks").and_then(Json::as_u64).ok_or(bad("num_g2_blocks missing".into()))? as usize;
    let bytes = o.opt("block_size_bytes").and_then(Json::as_f64).unwrap_or(0.0);
    let gbps = o.opt("bandwidth_gbps").and_then(Json::as_f64).unwrap_or(1.0);
    let s = |k: &str, d: &'static str| o.opt(k).and_then(Json::as_str).unwrap_or(d).to_string();
    let link = match s("link", "fifo").as_str() {
        "fifo" => Link::Fifo,
        "shared" => Link::Shared,
        v => return Err(bad(format!("link {v}"))),
    };
    let g2_eviction = match s("g2_eviction", "lru").as_str() {
        "lru" => G2Eviction::Lru,
        "lineage" => G2Eviction::Lineage,
        v => return Err(bad(format!("g2_eviction {v}"))),
    };
    let allocation = match s("g2_allocation", "at_completion").as_str() {
        "at_completion" => Allocation::AtCompletion,
        "at_start" => Allocation::AtStart,
        v => return Err(bad(format!("g2_allocation {v}"))),
    };
    let dedup = match s("dedup", "resend").as_str() {
        "resend" => Dedup::Resend,
        "filter" => Dedup::Filter,
        v => return Err(bad(format!("dedup {v}"))),
    };
    let tick_result = match s("tick_result", "transfers").as_str() {
        "none" => TickResult::Nothing,
        "released_slots" => TickResult::ReleasedSlots,
        "transfers" => TickResult::Transfers,
        v => return Err(bad(format!("tick_result {v}"))),
    };
    let lower = LowerConfig {
        g3_blocks: o.opt("num_g3_blocks").and_then(Json::as_u64).map(|n| n as usize),
        g3_bytes_per_ms: o.opt("bandwidth_g3_gbps").and_then(Json::as_f64).unwrap_or(1.0) * 1e6,
        g4: matches!(o.opt("g4"), Some(Json::Bool(true))),
        g4_bytes_per_ms: o.opt("bandwidth_g4_gbps").and_then(Json::as_f64).unwrap_or(1.0) * 1e6,
        owner_events: match s("lower_tier_events", "none").as_str() {
            "none" => false,
            "owner" => true,
            v => return Err(bad(format!("lower_tier_events {v}"))),
        },
    };
    if lower.on() && link != Link::Shared {
        return Err(bad("G3/G4 need the shared link".into()));
    }
    let batch_size = o.opt("batch_size").and_then(Json::as_u64).unwrap_or(32) as usize;
    Ok(OffloadConfig {
        num_g2_blocks: num,
        block_bytes: bytes,
        bytes_per_ms: gbps * 1e6,
        link,
        g2_eviction,
        allocation,
        dedup,
        batch_size,
        tick_result,
        lower,
    })
}

fn strs(v: &[&str]) -> Json {
    Json::Arr(v.iter().map(|s| Json::Str((*s).into())).collect())
}

fn ready(process: bool) -> Json {
    obj(vec![
        ("type", Json::Str("ready".into())),
        ("name", Json::Str(NAME.into())),
        ("protocol", Json::UInt(if process { 5 } else { 1 })),
        ("profile", Json::Str("kvbm".into())),
        (
            "capabilities",
            obj(vec![
                ("block_level", Json::Bool(true)),
                ("request_level", Json::Bool(false)),
                ("partial_blocks", Json::Bool(true)),
                ("promote", Json::Bool(true)),
                ("typed_errors", Json::Bool(true)),
                ("offload", Json::Bool(true)),
                ("swap_in", Json::Bool(true)),
                ("tiers", strs(&["device", "host_pinned", "disk", "external"])),
                ("event_token_ids", Json::Bool(true)),
                ("profiles", strs(&["kvbm"])),
                ("policies", strs(&["lineage", "lru", "multi_lru"])),
                ("destroy", Json::Bool(false)),
                ("reset", Json::Bool(false)),
                ("max_capacity", Json::UInt(1_000_000)),
                ("workers", Json::UInt(MAX_WORKERS)),
            ]),
        ),
        ("implementation_version", Json::Str("0.1.0".into())),
        ("multi_session", Json::Bool(true)),
    ])
}

type OpError = (&'static str, String);

fn malformed(m: &str) -> OpError {
    ("malformed_request", m.to_string())
}

fn u64_of(v: Option<&Json>, what: &str) -> Result<u64, OpError> {
    v.and_then(Json::as_u64).ok_or_else(|| malformed(&format!("{what}: expected an unsigned integer")))
}

fn block_ref(v: &Json) -> Result<BlockRef, OpError> {
    if let Some(h) = v.get("full") {
        return Ok(BlockRef::Full(u64_of(Some(h), "full")?));
    }
    if let Some(u) = v.get("partial").and_then(Json::as_str) {
        return Ok(BlockRef::Partial(u.to_string()));
    }
    Err(malformed("block reference must be {\"full\": u64} or {\"partial\": str}"))
}

fn block_refs(v: Option<&Json>) -> Result<Vec<BlockRef>, OpError> {
    v.and_then(Json::as_arr).ok_or_else(|| malformed("blocks: expected a list"))?.iter().map(block_ref).collect()
}

fn plh_of(v: &Json) -> Result<Plh, OpError> {
    Ok(Plh {
        hash: u64_of(v.get("hash"), "plh.hash")?,
        parent: match v.opt("parent") {
            None => None,
            Some(p) => Some(u64_of(Some(p), "plh.parent")?),
        },
        position: v.opt("position").map_or(Ok(0), |p| u64_of(Some(p), "plh.position"))?,
    })
}

fn tokens_of(v: &Json) -> Result<Vec<u32>, OpError> {
    v.as_arr()
        .ok_or_else(|| malformed("token ids: expected a list"))?
        .iter()
        .map(|t| t.as_u64().filter(|x| *x <= u32::MAX as u64).map(|x| x as u32).ok_or_else(|| malformed("token id")))
        .collect()
}

fn apply(mgr: &mut KvManager, op: &Json) -> Result<Json, OpError> {
    let kind = op.get("op").and_then(Json::as_str).ok_or_else(|| malformed("op without kind"))?;
    mgr.events.clear();
    let result: Result<(Json, Status), manager::Rejection> = match kind {
        "use" => {
            let blocks = block_refs(op.get("blocks"))?;
            let locals: Vec<u64> = match op.opt("local_hashes") {
                None => Vec::new(),
                Some(l) => l
                    .as_arr()
                    .ok_or_else(|| malformed("local_hashes"))?
                    .iter()
                    .map(|x| u64_of(Some(x), "local_hashes"))
                    .collect::<Result<_, _>>()?,
            };
            let plhs: Vec<Plh> = match op.opt("plhs") {
                None => Vec::new(),
                Some(l) => l.as_arr().ok_or_else(|| malformed("plhs"))?.iter().map(plh_of).collect::<Result<_, _>>()?,
            };
            let token_ids: Option<Vec<Vec<u32>>> = match op.opt("token_ids") {
                None => None,
                Some(l) => {
                    Some(l.as_arr().ok_or_else(|| malformed("token_ids"))?.iter().map(tokens_of).collect::<Result<_, _>>()?)
                }
            };
            let parent = match op.opt("parent") {
                None => None,
                Some(p) => Some(block_ref(p)?),
            };
            mgr.process_use(UseArgs {
                blocks: &blocks,
                local_hashes: &locals,
                plhs: &plhs,
                token_ids: token_ids.as_deref(),
                parent: parent.as_ref(),
            })
            .map(|(n, st)| (Json::UInt(n as u64), st))
        }
        "deref" => {
            let blocks = block_refs(op.get("blocks"))?;
            mgr.process_deref(&blocks).map(|_| (Json::Null, Status::Ok))
        }
        "promote" => {
            let uuid = op.get("uuid").and_then(Json::as_str).ok_or_else(|| malformed("uuid"))?.to_string();
            let seq = u64_of(op.get("seq_hash"), "seq_hash")?;
            let parent = match op.opt("parent_hash") {
                None => None,
                Some(p) => Some(u64_of(Some(p), "parent_hash")?),
            };
            let local = op.opt("local_hash").map_or(Ok(0), |l| u64_of(Some(l), "local_hash"))?;
            let plh = plh_of(op.get("plh").ok_or_else(|| malformed("plh"))?)?;
            let tokens = match op.opt("token_ids") {
                None => None,
                Some(t) => Some(tokens_of(t)?),
            };
            mgr.process_promote(&uuid, seq, parent, local, plh, tokens).map(|_| (Json::Null, Status::Ok))
        }
        "tick" => {
            let now = op.get("now_ms").and_then(Json::as_f64).filter(|t| t.is_finite() && *t >= 0.0);
            let now = now.ok_or_else(|| malformed("now_ms: expected a finite number >= 0"))?;
            let (transfers, released) = mgr.tick(now);
            let value = match mgr.offload.as_ref().map(|e| e.tick_result()) {
                Some(TickResult::Nothing) => Json::Null,
                Some(TickResult::ReleasedSlots) => Json::UInt(released as u64),
                _ => Json::UInt(transfers as u64),
            };
            Ok((value, Status::Ok))
        }
        "swap_in" => {
            let entries = op.get("blocks").and_then(Json::as_arr).ok_or_else(|| malformed("blocks"))?;
            let mut blocks = Vec::new();
            for e in entries {
                let seq = u64_of(e.get("seq_hash"), "seq_hash")?;
                let plh = plh_of(e.get("plh").ok_or_else(|| malformed("plh"))?)?;
                blocks.push((seq, plh));
            }
            let parent = match op.opt("parent") {
                None => None,
                Some(p) => Some(u64_of(Some(p), "parent")?),
            };
            mgr.process_swap_in(&blocks, parent).map(|(n, st)| (Json::UInt(n as u64), st))
        }
        other => return Err(("unsupported_op", format!("operation '{other}' is not implemented by this port"))),
    };
    let mut items: Vec<(&str, Json)> = Vec::new();
    match result {
        Ok((value, status)) => {
            items.push(("result", obj(vec![("value", value), ("status", Json::Str(status.name().into()))])));
        }
        Err(r) => {
            items.push((
                "error",
                obj(vec![("rule", Json::Str(r.rule.into())), ("message", Json::Str(r.message))]),
            ));
        }
    }
    items.push(("counters", counters_json(&mgr.counters())));
    mgr.publish_lower();
    let dp = mgr.dp_rank();
    let events: Vec<Json> = mgr.events.drain(..).map(|e| event_json(&e, dp)).collect();
    items.push(("events", Json::Arr(events)));
    items.push(("earliest_deadline_ms", mgr.earliest_deadline().map_or(Json::Null, Json::Float)));
    Ok(obj(items))
}

fn counters_json(c: &Counters) -> Json {
    obj(vec![
        ("active_blocks", Json::UInt(c.active_blocks as u64)),
        ("active_refs", Json::UInt(c.active_refs as u64)),
        ("inactive_blocks", Json::UInt(c.inactive_blocks as u64)),
        ("free_blocks", Json::UInt(c.free_blocks as u64)),
        ("quarantined_blocks", Json::UInt(c.quarantined_blocks as u64)),
    ])
}

fn event_json(e: &manager::Event, dp_rank: u64) -> Json {
    let data = match &e.data {
        EventData::Stored { parent, blocks } => obj(vec![(
            "stored",
            obj(vec![
                ("parent_hash", parent.map_or(Json::Null, Json::UInt)),
                (
                    "blocks",
                    Json::Arr(
                        blocks
                            .iter()
                            .map(|(h, t)| obj(vec![("block_hash", Json::UInt(*h)), ("tokens_hash", Json::UInt(*t))]))
                            .collect(),
                    ),
                ),
                ("start_position", Json::Null),
            ]),
        )]),
        EventData::Removed(hashes) => obj(vec![(
            "removed",
            obj(vec![("block_hashes", Json::Arr(hashes.iter().map(|h| Json::UInt(*h)).collect()))]),
        )]),
    };
    let tokens = match &e.token_ids {
        Some(t) if matches!(e.data, EventData::Stored { .. }) => {
            Json::Arr(t.iter().map(|l| Json::Arr(l.iter().map(|x| Json::UInt(*x as u64)).collect())).collect())
        }
        _ => Json::Null,
    };
    obj(vec![
        ("event_id", Json::UInt(e.event_id)),
        ("data", data),
        ("dp_rank", Json::UInt(dp_rank)),
        (
            "storage_tier",
            Json::Str(
                match e.tier {
                    Tier::Device => "device",
                    Tier::HostPinned => "host_pinned",
                    Tier::Disk => "disk",
                    Tier::External => "external",
                }
                .into(),
            ),
        ),
        ("block_token_ids", tokens),
    ])
}
