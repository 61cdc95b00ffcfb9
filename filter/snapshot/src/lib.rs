//! The fleet snapshot: the one definition of what the sidecar tells the filter.
//!
//! The sidecar (`sidecar-metrics`) scrapes every model-server pod, fills a [`Snapshot`] and
//! POSTs [`Snapshot::encode`]d bytes to the proxy; the filter runs [`Snapshot::decode`], which
//! validates everything before the snapshot may replace the previous one, so a bad push is
//! rejected whole and never half-applied. Both sides use this crate and nothing else for the
//! format.
//!
//! # Wire format, version 1 (all integers little-endian)
//! ```text
//! header   magic "LRSN" (4) | version u16 = 1 | flags u16 = 0 | generation u64 | created_ms u64
//!          | pool_count u16
//! pool     name str16 | cluster str16 | model_count u16 | model str16 * model_count
//!          | pod_count u16 | pod * pod_count
//! pod      address str8 | engine u8 | health u8 | failures u16 | scraped_at_ms u64
//!          | waiting u32 | running u32 | kv_bp u16 | block_size u32 | num_blocks u32
//!          | max_loras u16 | running_adapters list8 | waiting_adapters list8
//!          [ | peer_in_flight u32 | peer_pending_tokens u32 ]   (only with FLAG_PEER_WORK)
//! pool end [ context_count u16 | (key u64 | pod u32 | blocks u32) * context_count ]
//!                                                            (only with FLAG_PEER_CONTEXTS)
//! end      [ rewrites section, see [`rewrites`] ]            (only with FLAG_REWRITES)
//!          [ objectives section, see [`objectives`] ]        (only with FLAG_OBJECTIVES)
//! str8     len u8 | UTF-8 bytes;  str16: len u16 | UTF-8 bytes;  list8: count u16 | str8 * count
//! ```
//! `kv_bp` is the KV-cache use in basis points (0..=10000), `0xFFFF` when the engine has no KV
//! gauge. `max_loras = 0xFFFF` means "no LoRA information". `block_size`/`num_blocks` are 0 when
//! unknown. Nothing may follow the last pool but the rewrites and objectives sections.
//!
//! Flags: [`FLAG_PEER_WORK`] (bit 0) says every pod carries the work *other* gateway replicas
//! have in flight on it ([`PeerWork`], merged by a metrics hub from the replicas' [`tally`]s).
//! [`FLAG_PEER_CONTEXTS`] (bit 1) says every pool ends with the long contexts other replicas
//! recently placed on its pods ([`PeerContext`], from the same tallies).
//! [`FLAG_REWRITES`] (bit 2) says the snapshot ends with the model rewrite rules the filter is
//! to apply instead of its configured ones ([`RewriteRule`]; present even when empty, since "no
//! rules" from a sidecar that manages them differs from "the sidecar says nothing").
//! [`FLAG_OBJECTIVES`] (bit 3) says the snapshot ends with the objectives' priorities the filter
//! is to use instead of its configured `objectives` ([`Objective`]; present even when empty,
//! for the same reason).
//! A snapshot with no peer work, no peer contexts and neither section sets no flag and is
//! byte for byte what filters before the flags read, so a sidecar without a hub keeps working
//! with them.

use std::fmt;
use std::net::SocketAddr;

pub mod auth;
pub mod objectives;
pub mod rewrites;
pub mod tally;
pub use auth::{check_secret, sign, verify, SignatureError, SIGNATURE_HEADER};
pub use objectives::{Objective, MAX_OBJECTIVES};
pub use rewrites::{
    RewriteRule, RewriteSticky, RewriteTarget, MAX_REWRITE_RULES, MAX_REWRITE_TARGETS,
};
pub use tally::{Tally, TallyContext, TallyPod, TallyPool};

/// First bytes of every snapshot.
pub const MAGIC: [u8; 4] = *b"LRSN";
/// The format version this crate writes and reads.
pub const VERSION: u16 = 1;
/// Header flag: every pod carries [`PeerWork`].
pub const FLAG_PEER_WORK: u16 = 0x0001;
/// Header flag: every pool ends with its [`PeerContext`]s.
pub const FLAG_PEER_CONTEXTS: u16 = 0x0002;
/// Header flag: the snapshot ends with its rewrites section ([`Snapshot::rewrites`]).
pub const FLAG_REWRITES: u16 = 0x0004;
/// Header flag: the snapshot ends with its objectives section ([`Snapshot::objectives`]).
pub const FLAG_OBJECTIVES: u16 = 0x0008;
/// Every flag this build reads.
const KNOWN_FLAGS: u16 = FLAG_PEER_WORK | FLAG_PEER_CONTEXTS | FLAG_REWRITES | FLAG_OBJECTIVES;
/// Upper bounds that keep a hostile or corrupt snapshot from costing the proxy memory.
pub const MAX_POOLS: usize = 256;
/// Per pool.
pub const MAX_PODS_PER_POOL: usize = 4096;
/// Per pool.
pub const MAX_MODELS_PER_POOL: usize = 1024;
/// Per pod and list (running or waiting).
pub const MAX_ADAPTERS: usize = 1024;
/// Per pool: other replicas' placed contexts ([`PeerContext`]).
pub const MAX_PEER_CONTEXTS: usize = 4096;
/// KV use in basis points that means "unknown".
/// How far a snapshot's `generation` may run ahead of the receiver's wall clock, in ms. The
/// sidecar's generations are its clock in ms at start, then +1 per push (never faster than the
/// clock), so an honest one is never ahead; a generation further ahead than this (a forged or
/// corrupted `u64::MAX`) would make every later push stale until the proxy restarts, and is
/// refused. Ten minutes leaves room for clocks that disagree between hosts.
pub const MAX_GENERATION_LEAD_MS: u64 = 600_000;

const KV_UNKNOWN: u16 = 0xFFFF;
/// `max_loras` that means "no LoRA information".
const LORA_UNKNOWN: u16 = 0xFFFF;

/// Which model server a pod runs; decides how its metrics were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Engine {
    #[default]
    Unknown,
    Vllm,
    Sglang,
    TrtllmServe,
    TritonTrtllm,
    Tgi,
    LlamaCpp,
}

impl Engine {
    /// Every engine, in wire order.
    pub const ALL: [Engine; 7] = [
        Engine::Unknown,
        Engine::Vllm,
        Engine::Sglang,
        Engine::TrtllmServe,
        Engine::TritonTrtllm,
        Engine::Tgi,
        Engine::LlamaCpp,
    ];

    fn to_wire(self) -> u8 {
        self as u8
    }

    fn from_wire(b: u8) -> Option<Engine> {
        Engine::ALL.get(usize::from(b)).copied()
    }

    /// The name used in configuration files, logs and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Unknown => "unknown",
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::TrtllmServe => "trtllm",
            Engine::TritonTrtllm => "triton",
            Engine::Tgi => "tgi",
            Engine::LlamaCpp => "llamacpp",
        }
    }

    /// Inverse of [`Engine::name`] (also accepts a few common spellings).
    pub fn from_name(s: &str) -> Option<Engine> {
        let s = s.trim().to_ascii_lowercase();
        Some(match s.as_str() {
            "unknown" => Engine::Unknown,
            "vllm" => Engine::Vllm,
            "sglang" => Engine::Sglang,
            "trtllm" | "trtllm-serve" | "tensorrt-llm" => Engine::TrtllmServe,
            "triton" | "triton-trtllm" => Engine::TritonTrtllm,
            "tgi" | "text-generation-inference" => Engine::Tgi,
            "llamacpp" | "llama.cpp" | "llama-cpp" => Engine::LlamaCpp,
            _ => return None,
        })
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the sidecar knows of a pod's reachability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Health {
    /// The last scrape succeeded and is recent.
    #[default]
    Ok,
    /// The last `failures` scrapes failed in a row; the metrics are from the last success.
    Failing,
    /// No recent successful scrape (e.g. the pod is slow to answer); metrics are old.
    Stale,
}

impl Health {
    fn to_wire(self) -> u8 {
        match self {
            Health::Ok => 0,
            Health::Failing => 1,
            Health::Stale => 2,
        }
    }

    fn from_wire(b: u8) -> Option<Health> {
        match b {
            0 => Some(Health::Ok),
            1 => Some(Health::Failing),
            2 => Some(Health::Stale),
            _ => None,
        }
    }

    /// Lower-case name for logs and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Health::Ok => "ok",
            Health::Failing => "failing",
            Health::Stale => "stale",
        }
    }
}

/// LoRA adapters as the engine reports them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoraState {
    /// Adapters loaded and serving requests now.
    pub running: Vec<String>,
    /// Adapters that requests are waiting for.
    pub waiting: Vec<String>,
    /// Adapter slots (`max_lora`); a free slot means a new adapter loads without eviction.
    pub max_loras: u16,
}

/// Work that other gateway replicas have sent to a pod and that has not finished, as their
/// tallies said when the hub last merged them (never this replica's own: the receiving sidecar
/// leaves its own tally out). The engine's gauges count the same requests once it has them;
/// these count them from the moment a replica routes them, and the prompt tokens still to
/// prefill, which no gauge shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerWork {
    /// Requests in flight from other replicas.
    pub in_flight: u32,
    /// Their estimated prompt tokens without a first response byte yet.
    pub pending_tokens: u32,
}

impl PeerWork {
    /// No work from other replicas.
    pub fn is_none(&self) -> bool {
        self.in_flight == 0 && self.pending_tokens == 0
    }
}

/// A long context another gateway replica placed on a pod: the chained block hash of its
/// prompt at the anchor depth (the same key every replica computes for a prompt that shares
/// that much), the pod (its prefix-index id, a hash of its address every replica computes
/// alike) and how many blocks the placing prompt had. A replica that has not seen the context
/// credits that pod with it instead of guessing where the others put it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord, Hash)]
pub struct PeerContext {
    pub key: u64,
    pub pod: u32,
    pub blocks: u32,
}

/// Writes `count u16 | (key u64 | pod u32 | blocks u32) * count`: a pool's contexts, in the
/// snapshot and in a tally alike. At most [`MAX_PEER_CONTEXTS`].
fn write_contexts(w: &mut Writer, list: &[PeerContext], what: &str) -> Result<(), EncodeError> {
    if list.len() > MAX_PEER_CONTEXTS {
        return Err(EncodeError(format!("too many {what}: {}", list.len())));
    }
    w.len16(list.len(), what)?;
    for c in list {
        w.u64(c.key);
        w.u32(c.pod);
        w.u32(c.blocks);
    }
    Ok(())
}

/// Reads what [`write_contexts`] wrote.
fn read_contexts(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<PeerContext>, DecodeError> {
    let n = r.count(what, MAX_PEER_CONTEXTS)?;
    let mut list = Vec::with_capacity(n);
    for _ in 0..n {
        list.push(PeerContext {
            key: r.u64("context key")?,
            pod: r.u32("context pod")?,
            blocks: r.u32("context blocks")?,
        });
    }
    Ok(list)
}

/// Reads one pool (its pods, and its peer contexts when the flag says so).
fn read_pool(
    r: &mut Reader<'_>,
    peer_work: bool,
    peer_contexts: bool,
) -> Result<Pool, DecodeError> {
    let name = r.str16("pool name")?;
    let cluster = r.str16("cluster name")?;
    let model_count = r.count("models", MAX_MODELS_PER_POOL)?;
    let mut models = Vec::with_capacity(model_count);
    for _ in 0..model_count {
        models.push(r.str16("model name")?);
    }
    let pod_count = r.count("pods", MAX_PODS_PER_POOL)?;
    let mut pods = Vec::with_capacity(pod_count);
    for _ in 0..pod_count {
        pods.push(read_pod(r, peer_work)?);
    }
    let contexts = if peer_contexts {
        read_contexts(r, "peer contexts")?
    } else {
        Vec::new()
    };
    Ok(Pool {
        name,
        cluster,
        models,
        pods,
        peer_contexts: contexts,
    })
}

/// Reads one pod (with its peers' work when the flag says so).
fn read_pod(r: &mut Reader<'_>, peer_work: bool) -> Result<Pod, DecodeError> {
    let address = r.str8("pod address")?;
    let engine_b = r.u8("engine")?;
    let engine = Engine::from_wire(engine_b).ok_or(DecodeError::BadEnum {
        what: "engine",
        value: engine_b,
    })?;
    let health_b = r.u8("health")?;
    let health = Health::from_wire(health_b).ok_or(DecodeError::BadEnum {
        what: "health",
        value: health_b,
    })?;
    let failures = r.u16("failures")?;
    let scraped_at_ms = r.u64("scraped_at_ms")?;
    let waiting = r.u32("waiting")?;
    let running = r.u32("running")?;
    let kv_bp = r.u16("kv usage")?;
    let kv_usage = match kv_bp {
        KV_UNKNOWN => None,
        bp if bp <= 10_000 => Some(f32::from(bp) / 10_000.0),
        bp => {
            return Err(DecodeError::Invalid(format!(
                "pod {address}: KV use {bp} basis points is above 10000"
            )))
        }
    };
    let block_size = r.u32("block_size")?;
    let num_blocks = r.u32("num_blocks")?;
    let lora = read_lora(r, &address)?;
    let peers = if peer_work {
        PeerWork {
            in_flight: r.u32("peer in flight")?,
            pending_tokens: r.u32("peer pending tokens")?,
        }
    } else {
        PeerWork::default()
    };
    Ok(Pod {
        address,
        engine,
        health,
        failures,
        scraped_at_ms,
        waiting,
        running,
        kv_usage,
        block_size,
        num_blocks,
        lora,
        peers,
    })
}

/// Reads a pod's `max_loras | running list8 | waiting list8`: `None` for "no LoRA
/// information", which may list no adapter.
fn read_lora(r: &mut Reader<'_>, address: &str) -> Result<Option<LoraState>, DecodeError> {
    let max_loras = r.u16("max_loras")?;
    let running = r.list8("running adapters")?;
    let waiting = r.list8("waiting adapters")?;
    if max_loras != LORA_UNKNOWN {
        return Ok(Some(LoraState {
            running,
            waiting,
            max_loras,
        }));
    }
    if !running.is_empty() || !waiting.is_empty() {
        return Err(DecodeError::Invalid(format!(
            "pod {address}: adapters listed without LoRA information"
        )));
    }
    Ok(None)
}

/// One encoding per snapshot: a peer flag is set exactly when what it announces is there.
fn check_flags_announce_content(
    pools: &[Pool],
    peer_work: bool,
    peer_contexts: bool,
) -> Result<(), DecodeError> {
    if peer_work
        && pools
            .iter()
            .flat_map(|p| &p.pods)
            .all(|p| p.peers.is_none())
    {
        return Err(DecodeError::Invalid(
            "flag FLAG_PEER_WORK set but no pod carries other replicas' work".into(),
        ));
    }
    if peer_contexts && pools.iter().all(|p| p.peer_contexts.is_empty()) {
        return Err(DecodeError::Invalid(
            "flag FLAG_PEER_CONTEXTS set but no pool lists a context".into(),
        ));
    }
    Ok(())
}

/// The live state of one model-server pod.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pod {
    /// `ip:port` exactly as the Envoy cluster lists the endpoint.
    pub address: String,
    pub engine: Engine,
    pub health: Health,
    /// Consecutive failed scrapes (0 when healthy).
    pub failures: u16,
    /// Unix time (ms) of the last successful scrape; 0 if never.
    pub scraped_at_ms: u64,
    /// Requests queued, not yet running.
    pub waiting: u32,
    /// Requests in the running batch.
    pub running: u32,
    /// KV-cache use in [0, 1], `None` when the engine exports no KV gauge.
    pub kv_usage: Option<f32>,
    /// Tokens per KV block (0 = unknown).
    pub block_size: u32,
    /// KV blocks on the device (0 = unknown).
    pub num_blocks: u32,
    /// `None` when the engine reports nothing about LoRA.
    pub lora: Option<LoraState>,
    /// Other gateway replicas' work in flight here (zero without a hub that merges tallies).
    pub peers: PeerWork,
}

/// A group of interchangeable pods serving the same models, behind one Envoy cluster.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pool {
    pub name: String,
    /// The Envoy cluster whose members are `pods`.
    pub cluster: String,
    /// Model names (base models) the pool serves.
    pub models: Vec<String>,
    pub pods: Vec<Pod>,
    /// Long contexts other gateway replicas recently placed on these pods, by key (empty
    /// without a hub that merges tallies).
    pub peer_contexts: Vec<PeerContext>,
}

/// Everything the filter needs to know about the fleet at one instant.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// Increases with every snapshot a sidecar produces (restarts start from the clock).
    pub generation: u64,
    /// Unix time (ms) when the sidecar assembled this snapshot.
    pub created_ms: u64,
    pub pools: Vec<Pool>,
    /// The model rewrite rules the filter applies instead of its configured `rewrites`;
    /// `None` (no section) leaves the configured ones in force.
    pub rewrites: Option<Vec<RewriteRule>>,
    /// The objectives' priorities the filter uses instead of its configured `objectives`;
    /// `None` (no section) leaves the configured ones in force.
    pub objectives: Option<Vec<Objective>>,
}

/// Why bytes are not a valid snapshot. Each variant says where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    BadMagic,
    UnsupportedVersion(u16),
    UnsupportedFlags(u16),
    Truncated {
        at: usize,
        wanted: &'static str,
    },
    TrailingBytes {
        at: usize,
        extra: usize,
    },
    TooMany {
        what: &'static str,
        count: usize,
        max: usize,
    },
    BadUtf8 {
        at: usize,
    },
    BadEnum {
        what: &'static str,
        value: u8,
    },
    Invalid(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::BadMagic => write!(f, "not a snapshot: magic bytes are not \"LRSN\""),
            DecodeError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "snapshot version {v} is not supported (this build reads {VERSION})"
                )
            }
            DecodeError::UnsupportedFlags(v) => write!(f, "unknown snapshot flags {v:#06x}"),
            DecodeError::Truncated { at, wanted } => {
                write!(f, "snapshot truncated at byte {at} while reading {wanted}")
            }
            DecodeError::TrailingBytes { at, extra } => {
                write!(
                    f,
                    "{extra} unexpected bytes after the snapshot end at byte {at}"
                )
            }
            DecodeError::TooMany { what, count, max } => {
                write!(
                    f,
                    "snapshot has {count} {what}, more than the limit of {max}"
                )
            }
            DecodeError::BadUtf8 { at } => write!(f, "string at byte {at} is not UTF-8"),
            DecodeError::BadEnum { what, value } => write!(f, "unknown {what} value {value}"),
            DecodeError::Invalid(msg) => write!(f, "invalid snapshot: {msg}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a snapshot cannot be written (a string or list too long for its length field, or the
/// snapshot fails the same validation the reader applies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodeError(pub String);

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot encode snapshot: {}", self.0)
    }
}

impl std::error::Error for EncodeError {}

impl Snapshot {
    /// Serialises the snapshot. Fails when it would not pass [`Snapshot::decode`].
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        self.validate().map_err(|e| EncodeError(e.to_string()))?;
        let mut w = Writer {
            out: Vec::with_capacity(64 + self.pools.len() * 256),
        };
        let peer_work = self
            .pools
            .iter()
            .flat_map(|p| &p.pods)
            .any(|pod| !pod.peers.is_none());
        let peer_contexts = self.pools.iter().any(|p| !p.peer_contexts.is_empty());
        let mut flags = 0;
        if peer_work {
            flags |= FLAG_PEER_WORK;
        }
        if peer_contexts {
            flags |= FLAG_PEER_CONTEXTS;
        }
        if self.rewrites.is_some() {
            flags |= FLAG_REWRITES;
        }
        if self.objectives.is_some() {
            flags |= FLAG_OBJECTIVES;
        }
        w.out.extend_from_slice(&MAGIC);
        w.u16(VERSION);
        w.u16(flags);
        w.u64(self.generation);
        w.u64(self.created_ms);
        w.len16(self.pools.len(), "pools")?;
        for pool in &self.pools {
            w.str16(&pool.name, "pool name")?;
            w.str16(&pool.cluster, "cluster name")?;
            w.len16(pool.models.len(), "models")?;
            for m in &pool.models {
                w.str16(m, "model name")?;
            }
            w.len16(pool.pods.len(), "pods")?;
            for pod in &pool.pods {
                w.str8(&pod.address, "pod address")?;
                w.out.push(pod.engine.to_wire());
                w.out.push(pod.health.to_wire());
                w.u16(pod.failures);
                w.u64(pod.scraped_at_ms);
                w.u32(pod.waiting);
                w.u32(pod.running);
                w.u16(match pod.kv_usage {
                    // validate() checked the range, so the cast cannot saturate.
                    Some(kv) => (kv * 10_000.0).round() as u16,
                    None => KV_UNKNOWN,
                });
                w.u32(pod.block_size);
                w.u32(pod.num_blocks);
                match &pod.lora {
                    None => {
                        w.u16(LORA_UNKNOWN);
                        w.u16(0);
                        w.u16(0);
                    }
                    Some(l) => {
                        w.u16(l.max_loras);
                        w.list8(&l.running, "running adapters")?;
                        w.list8(&l.waiting, "waiting adapters")?;
                    }
                }
                if peer_work {
                    w.u32(pod.peers.in_flight);
                    w.u32(pod.peers.pending_tokens);
                }
            }
            if peer_contexts {
                write_contexts(&mut w, &pool.peer_contexts, "peer contexts")?;
            }
        }
        if let Some(rules) = &self.rewrites {
            rewrites::write_rewrites(&mut w, rules)?;
        }
        if let Some(list) = &self.objectives {
            objectives::write_objectives(&mut w, list)?;
        }
        Ok(w.out)
    }

    /// The generation in the header of bytes written by [`Snapshot::encode`], without decoding
    /// the rest (a proxy checking a push against the stored snapshot needs no more of it).
    /// `None` when the header is not a snapshot's of this version.
    pub fn peek_generation(bytes: &[u8]) -> Option<u64> {
        let mut r = Reader { buf: bytes, pos: 0 };
        if r.take(4, "magic").ok()? != MAGIC || r.u16("version").ok()? != VERSION {
            return None;
        }
        r.u16("flags").ok()?;
        r.u64("generation").ok()
    }

    /// Parses and validates bytes written by [`Snapshot::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Snapshot, DecodeError> {
        let mut r = Reader { buf: bytes, pos: 0 };
        if r.take(4, "magic")? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u16("version")?;
        if version != VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let flags = r.u16("flags")?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(DecodeError::UnsupportedFlags(flags));
        }
        let peer_work = flags & FLAG_PEER_WORK != 0;
        let peer_contexts = flags & FLAG_PEER_CONTEXTS != 0;
        let generation = r.u64("generation")?;
        let created_ms = r.u64("created_ms")?;
        let pool_count = r.count("pools", MAX_POOLS)?;
        let mut pools = Vec::with_capacity(pool_count);
        for _ in 0..pool_count {
            pools.push(read_pool(&mut r, peer_work, peer_contexts)?);
        }
        let rewrites = if flags & FLAG_REWRITES != 0 {
            Some(rewrites::read_rewrites(&mut r)?)
        } else {
            None
        };
        let objectives = if flags & FLAG_OBJECTIVES != 0 {
            Some(objectives::read_objectives(&mut r)?)
        } else {
            None
        };
        check_flags_announce_content(&pools, peer_work, peer_contexts)?;
        r.end()?;
        let snap = Snapshot {
            generation,
            created_ms,
            pools,
            rewrites,
            objectives,
        };
        snap.validate()?;
        Ok(snap)
    }

    /// The rules every snapshot obeys: non-empty unique pool names, a cluster per pool,
    /// rewrites and objectives sections within their limits ([`rewrites`], [`objectives`]),
    /// `ip:port` pod addresses unique within a pool, KV use within [0, 1].
    pub fn validate(&self) -> Result<(), DecodeError> {
        let bad = |m: String| Err(DecodeError::Invalid(m));
        if self.pools.len() > MAX_POOLS {
            return Err(DecodeError::TooMany {
                what: "pools",
                count: self.pools.len(),
                max: MAX_POOLS,
            });
        }
        for (i, pool) in self.pools.iter().enumerate() {
            if pool.name.is_empty() {
                return bad(format!("pool #{i} has an empty name"));
            }
            if pool.cluster.is_empty() {
                return bad(format!("pool {:?} has an empty cluster name", pool.name));
            }
            if self.pools.iter().take(i).any(|p| p.name == pool.name) {
                return bad(format!("pool {:?} appears twice", pool.name));
            }
            if pool.pods.len() > MAX_PODS_PER_POOL {
                return Err(DecodeError::TooMany {
                    what: "pods",
                    count: pool.pods.len(),
                    max: MAX_PODS_PER_POOL,
                });
            }
            if pool.peer_contexts.len() > MAX_PEER_CONTEXTS {
                return Err(DecodeError::TooMany {
                    what: "peer contexts",
                    count: pool.peer_contexts.len(),
                    max: MAX_PEER_CONTEXTS,
                });
            }
            // A set, linear in the pool's size (a list searched per pod made a 4,096-pod push
            // cost 8 million string comparisons: 85 ms of a push into Envoy).
            let mut seen: std::collections::HashSet<&str> =
                std::collections::HashSet::with_capacity(pool.pods.len());
            for pod in &pool.pods {
                if pod.address.parse::<SocketAddr>().is_err() {
                    return bad(format!(
                        "pool {:?}: pod address {:?} is not ip:port",
                        pool.name, pod.address
                    ));
                }
                if !seen.insert(&pod.address) {
                    return bad(format!(
                        "pool {:?}: pod {} appears twice",
                        pool.name, pod.address
                    ));
                }
                if let Some(kv) = pod.kv_usage {
                    if !(0.0..=1.0).contains(&kv) {
                        return bad(format!(
                            "pod {}: KV use {kv} is outside [0, 1]",
                            pod.address
                        ));
                    }
                }
                if let Some(l) = &pod.lora {
                    if l.max_loras == LORA_UNKNOWN {
                        return bad(format!(
                            "pod {}: max_loras {} is reserved",
                            pod.address, l.max_loras
                        ));
                    }
                }
            }
        }
        if let Some(rules) = &self.rewrites {
            rewrites::validate_rewrites(rules)?;
        }
        if let Some(list) = &self.objectives {
            objectives::validate_objectives(list)?;
        }
        Ok(())
    }

    /// True when both snapshots describe the same fleet state, ignoring when it was observed
    /// (`generation`, `created_ms`, `scraped_at_ms`). The sidecar pushes only on a change.
    pub fn same_state(&self, other: &Snapshot) -> bool {
        self.rewrites == other.rewrites
            && self.objectives == other.objectives
            && self.pools.len() == other.pools.len()
            && self.pools.iter().zip(&other.pools).all(|(a, b)| {
                a.name == b.name
                    && a.cluster == b.cluster
                    && a.models == b.models
                    && a.peer_contexts == b.peer_contexts
                    && a.pods.len() == b.pods.len()
                    && a.pods.iter().zip(&b.pods).all(|(p, q)| {
                        Pod {
                            scraped_at_ms: 0,
                            ..p.clone()
                        } == Pod {
                            scraped_at_ms: 0,
                            ..q.clone()
                        }
                    })
            })
    }

    /// The pool with this name.
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// Number of pods over all pools.
    pub fn pod_count(&self) -> usize {
        self.pools.iter().map(|p| p.pods.len()).sum()
    }
}

pub(crate) struct Writer {
    pub(crate) out: Vec<u8>,
}

impl Writer {
    fn u16(&mut self, v: u16) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn len16(&mut self, n: usize, what: &str) -> Result<(), EncodeError> {
        let n = u16::try_from(n).map_err(|_| EncodeError(format!("too many {what}: {n}")))?;
        self.u16(n);
        Ok(())
    }
    fn str8(&mut self, s: &str, what: &str) -> Result<(), EncodeError> {
        let n = u8::try_from(s.len())
            .map_err(|_| EncodeError(format!("{what} longer than 255 bytes: {s:?}")))?;
        self.out.push(n);
        self.out.extend_from_slice(s.as_bytes());
        Ok(())
    }
    fn str16(&mut self, s: &str, what: &str) -> Result<(), EncodeError> {
        self.len16(s.len(), what)?;
        self.out.extend_from_slice(s.as_bytes());
        Ok(())
    }
    fn list8(&mut self, items: &[String], what: &str) -> Result<(), EncodeError> {
        if items.len() > MAX_ADAPTERS {
            return Err(EncodeError(format!("too many {what}: {}", items.len())));
        }
        self.len16(items.len(), what)?;
        for s in items {
            self.str8(s, what)?;
        }
        Ok(())
    }
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn end(&self) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                at: self.pos,
                extra: self.buf.len() - self.pos,
            })
        }
    }
    fn take(&mut self, n: usize, wanted: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end.and_then(|e| self.buf.get(self.pos..e)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(DecodeError::Truncated {
                at: self.pos,
                wanted,
            }),
        }
    }
    fn array<const N: usize>(&mut self, wanted: &'static str) -> Result<[u8; N], DecodeError> {
        let at = self.pos;
        self.take(N, wanted)?
            .try_into()
            .map_err(|_| DecodeError::Truncated { at, wanted })
    }
    fn u8(&mut self, wanted: &'static str) -> Result<u8, DecodeError> {
        Ok(u8::from_le_bytes(self.array(wanted)?))
    }
    fn u16(&mut self, wanted: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(wanted)?))
    }
    fn u32(&mut self, wanted: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(wanted)?))
    }
    fn u64(&mut self, wanted: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(wanted)?))
    }
    fn count(&mut self, what: &'static str, max: usize) -> Result<usize, DecodeError> {
        let n = usize::from(self.u16(what)?);
        if n > max {
            return Err(DecodeError::TooMany {
                what,
                count: n,
                max,
            });
        }
        Ok(n)
    }
    fn string(&mut self, n: usize, wanted: &'static str) -> Result<String, DecodeError> {
        let at = self.pos;
        let bytes = self.take(n, wanted)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| DecodeError::BadUtf8 { at })
    }
    fn str8(&mut self, wanted: &'static str) -> Result<String, DecodeError> {
        let n = usize::from(self.u8(wanted)?);
        self.string(n, wanted)
    }
    fn str16(&mut self, wanted: &'static str) -> Result<String, DecodeError> {
        let n = usize::from(self.u16(wanted)?);
        self.string(n, wanted)
    }
    fn list8(&mut self, what: &'static str) -> Result<Vec<String>, DecodeError> {
        let n = self.count(what, MAX_ADAPTERS)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.str8(what)?);
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests;
