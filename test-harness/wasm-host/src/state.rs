//! Host state: what one VM (one wasmtime store, one Envoy worker thread) holds, and what all VMs
//! of one [`crate::Host`] share (shared data, queues, metrics, the clock), as Envoy shares them
//! between worker threads. Nothing is global, so tests run in parallel.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use wasmtime::{Memory, TypedFunc};

use crate::abi::{LogLevel, MetricType, Pairs};

/// Unix time the clock starts at unless a test sets it: 2026-01-01T00:00:00Z.
pub const DEFAULT_START_NS: u64 = 1_767_225_600_000_000_000;

/// State every VM of one host sees.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Wall clock in ns since the Unix epoch; only tests move it.
    pub clock_ns: u64,
    /// `(vm_id, key) -> (value, cas)`, exactly Envoy's shared data.
    pub data: HashMap<(String, String), (Vec<u8>, u32)>,
    pub next_cas: u32,
    /// Queue id `n` is `queues[n - 1]`.
    pub queues: Vec<Queue>,
    /// Metrics by name (Envoy stats are process-wide).
    pub metrics: BTreeMap<String, Metric>,
    pub next_vm: usize,
}

impl Shared {
    pub fn new() -> Shared {
        Shared {
            clock_ns: DEFAULT_START_NS,
            data: HashMap::new(),
            next_cas: 1,
            queues: Vec::new(),
            metrics: BTreeMap::new(),
            next_vm: 0,
        }
    }

    /// Envoy's `SharedData::nextCas`: never 0, which means "no CAS".
    pub fn next_cas(&mut self) -> u32 {
        let cas = self.next_cas;
        self.next_cas = self.next_cas.wrapping_add(1);
        if self.next_cas == 0 {
            self.next_cas = 1;
        }
        cas
    }
}

/// Locks shared state; a poisoned lock (a panicking test thread) still yields the data.
pub(crate) fn lock(shared: &Arc<Mutex<Shared>>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// A shared queue and who is told when it gets data.
#[derive(Debug)]
pub(crate) struct Queue {
    pub vm_id: String,
    pub name: String,
    pub owner_vm: usize,
    pub owner_ctx: u32,
    pub items: VecDeque<Vec<u8>>,
    /// Enqueues not yet announced to the owner with `proxy_on_queue_ready`.
    pub unannounced: usize,
}

/// One metric as Envoy keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub kind: MetricType,
    /// Counter or gauge value (gauges may go below zero through increments).
    pub value: i64,
    /// Every recorded histogram value, in order.
    pub samples: Vec<u64>,
}

/// A line the module logged with `proxy_log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// The context that was current when it logged.
    pub ctx: u32,
    pub level: LogLevel,
    pub message: String,
}

/// What the module passed to `proxy_send_local_response`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    pub status: u32,
    pub details: String,
    pub body: Vec<u8>,
    pub headers: Vec<(String, String)>,
    pub grpc_status: i32,
}

impl LocalResponse {
    /// First value of a header (name compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy).
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// An outgoing `proxy_http_call` waiting for the test to answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCall {
    pub token: u32,
    /// The context that made the call (gets `proxy_on_http_call_response`).
    pub ctx: u32,
    pub upstream: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub trailers: Vec<(String, String)>,
    pub timeout_ms: u32,
}

/// A `proxy_call_foreign_function` the module made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignCall {
    pub ctx: u32,
    pub name: String,
    pub args: Vec<u8>,
}

/// The readable record of every crossing between host and module.
#[derive(Debug)]
pub(crate) struct Trace {
    pub enabled: bool,
    pub lines: VecDeque<String>,
    pub cap: usize,
    pub dropped: usize,
}

impl Trace {
    pub fn new(enabled: bool) -> Trace {
        Trace {
            enabled,
            lines: VecDeque::new(),
            cap: 20_000,
            dropped: 0,
        }
    }

    pub fn push(&mut self, line: impl FnOnce() -> String) {
        if !self.enabled {
            return;
        }
        if self.lines.len() == self.cap {
            self.lines.pop_front();
            self.dropped += 1;
        }
        self.lines.push_back(line());
    }

    /// The last `n` lines, oldest first.
    pub fn tail(&self, n: usize) -> String {
        let skip = self.lines.len().saturating_sub(n);
        let mut out = String::new();
        if skip > 0 || self.dropped > 0 {
            out.push_str(&format!("... ({} earlier lines)\n", skip + self.dropped));
        }
        for l in self.lines.iter().skip(skip) {
            out.push_str(l);
            out.push('\n');
        }
        out
    }
}

/// Where one HTTP stream is; decides which maps and buffers the module may touch.
#[derive(Debug, Default)]
pub(crate) struct StreamState {
    /// Per-request properties (set by the test, or by the module with `proxy_set_property`).
    pub properties: HashMap<String, Vec<u8>>,
    pub request_headers: Option<Pairs>,
    pub request_trailers: Option<Pairs>,
    pub response_headers: Option<Pairs>,
    pub response_trailers: Option<Pairs>,
    /// The request body the module sees now (buffered chunks plus the current one).
    pub request_body: Option<Vec<u8>>,
    pub response_body: Option<Vec<u8>>,
    /// True once the request headers went on upstream; later edits cannot reach the upstream.
    pub request_headers_sent: bool,
    pub response_headers_sent: bool,
    /// True during an `on_request_body` with end_of_stream (Envoy then lets the module add
    /// trailers).
    pub request_body_eos: bool,
    pub response_body_eos: bool,
    pub local_response: Option<LocalResponse>,
    /// `proxy_continue_stream` calls not yet acted upon.
    pub resume_request: bool,
    pub resume_response: bool,
    /// `proxy_close_stream` (a reset) asked for.
    pub reset: bool,
    pub foreign_calls: Vec<ForeignCall>,
    /// Things Envoy would not let happen, or would do differently (a sign of a filter bug).
    pub violations: Vec<String>,
}

/// Per-VM (per-store) state.
pub(crate) struct HostState {
    pub shared: Arc<Mutex<Shared>>,
    pub vm_index: usize,
    pub vm_id: String,
    pub root_id: String,
    pub memory: Option<Memory>,
    pub alloc: Option<TypedFunc<u32, u32>>,
    pub root_ctx: u32,
    pub effective_ctx: u32,
    pub vm_config: Vec<u8>,
    pub plugin_config: Vec<u8>,
    /// Which configuration buffer is readable now (Envoy offers each only in its callback).
    pub in_vm_start: bool,
    pub in_configure: bool,
    /// VM-wide properties, dotted paths.
    pub properties: HashMap<String, Vec<u8>>,
    pub streams: HashMap<u32, StreamState>,
    pub logs: Vec<LogEntry>,
    pub trace: Trace,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub log_level: LogLevel,
    /// Tick period (ms) and next deadline (ns), for the root context.
    pub tick: Option<(u32, u64)>,
    pub http_calls: Vec<HttpCall>,
    pub next_token: u32,
    /// Answer of the http call being delivered: headers, body, trailers.
    pub call_response: Option<(Pairs, Vec<u8>, Pairs)>,
    /// Metric id `n` is `metric_ids[n - 1]`.
    pub metric_ids: Vec<(String, MetricType)>,
    pub foreign_calls: Vec<ForeignCall>,
    /// Violations outside any stream.
    pub violations: Vec<String>,
    pub rng: u64,
    /// Count of host calls made by the module (cheap, always on; the bench reports it).
    pub host_calls: u64,
    /// Per-kind counts of host calls and bytes copied across the boundary, while switched on
    /// with [`crate::Vm::count_calls`] (costs a formatted trace line per call).
    pub call_counts: Option<BTreeMap<String, CallCount>>,
    /// Bytes the host copied out of the module since the last traced call (attributed to the
    /// call that traces next: every host function reads its arguments before it traces).
    pub pending_in: std::cell::Cell<u64>,
    /// The kind of the last traced call (bytes handed to the module after it count there).
    pub last_kind: Option<String>,
    /// WASI command-line arguments (command modules only).
    pub args: Vec<Vec<u8>>,
    /// The environment the module sees through WASI `environ_get` (`KEY=VALUE` each), as
    /// Envoy passes `vm_config.environment_variables` into the VM.
    pub env: Vec<Vec<u8>>,
    /// Write stdout/stderr through to this process instead of capturing them.
    pub passthrough_output: bool,
}

/// The key under which [`crate::Vm::call_counts`] counts the host's calls into the module's
/// allocator (each host call that returns data makes one).
pub const ALLOCATE: &str = "proxy_on_memory_allocate";

/// Host calls of one kind and the bytes they copied across the Wasm boundary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallCount {
    pub calls: u64,
    /// Bytes copied from module memory into the host (keys, values, headers, bodies).
    pub bytes_in: u64,
    /// Bytes the host handed to the module (values, headers, bodies).
    pub bytes_out: u64,
}

impl HostState {
    /// Counts one host call, with its kind parsed from its trace line when counting is on.
    pub(crate) fn count_call(&mut self, line: &str) {
        self.host_calls += 1;
        let pending = self.pending_in.take();
        if let Some(counts) = &mut self.call_counts {
            let kind = line.split('(').next().unwrap_or(line).to_string();
            let c = counts.entry(kind.clone()).or_default();
            c.calls += 1;
            c.bytes_in += pending;
            self.last_kind = Some(kind);
        }
    }

    /// Counts one call into the module's `proxy_on_memory_allocate`, made to hand it data (a
    /// crossing of the boundary like a host call, but the other way), when counting is on.
    pub(crate) fn count_allocation(&mut self) {
        if let Some(counts) = &mut self.call_counts {
            counts.entry(ALLOCATE.to_string()).or_default().calls += 1;
        }
    }

    /// Counts bytes handed to the module by the call traced last.
    pub(crate) fn count_out(&mut self, n: usize) {
        if let (Some(counts), Some(kind)) = (&mut self.call_counts, &self.last_kind) {
            if let Some(c) = counts.get_mut(kind) {
                c.bytes_out += n as u64;
            }
        }
    }

    pub fn now_ns(&self) -> u64 {
        lock(&self.shared).clock_ns
    }

    /// splitmix64: deterministic "randomness" for `random_get`, so runs repeat.
    pub fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn violation(&mut self, what: String) {
        let ctx = self.effective_ctx;
        self.trace
            .push(|| format!("[host] VIOLATION (ctx={ctx}): {what}"));
        match self.streams.get_mut(&ctx) {
            Some(s) => s.violations.push(what),
            None => self.violations.push(what),
        }
    }
}
