//! One pod on one port: an HTTP/1.1 server (hyper) around an [`Engine`] driven by a real clock.
//!
//! Per pod there is one accept task, one task per connection and one scheduler task that sleeps
//! until the end of the engine step in flight (or until a request arrives when idle): no busy
//! loop and no per-token timers. Requests reach the engine through a mutex-protected core plus a
//! `Notify`; each request gets its tokens through its own unbounded channel, filled by the
//! scheduler at the end of every step. A request whose client goes away is aborted (its KV
//! blocks are freed) when its response future or body is dropped.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};

use crate::engine::{
    Engine, EngineState, Event, FinishReason, NewRequest, ReqId, SubmitError, Usage,
};
use crate::introspect::{self, Load};
use crate::metrics::{engine_view, render_sglang, render_vllm, Flavor, KvMetricName};
use crate::openai::{anthropic_error_body, error_body, error_body_param, models_body, RespCtx};
use crate::profile::Profile;
use crate::prompt::{self, Api};
use crate::synthetic;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Response header naming the pod that answered.
pub const POD_HEADER: &str = "x-model-sim-pod";
/// How long a `hang` fault holds a request before giving up.
const HANG_LIMIT: Duration = Duration::from_secs(600);
/// Granularity of tokio's timer wheel; the last stretch of a step's sleep is done precisely.
const TIMER_TICK: Duration = Duration::from_millis(1);

/// Tokens a stream sends before a `close_mid_stream` fault cuts it.
const CLOSE_AFTER_TOKENS: u32 = 2;

/// How output lengths are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputLen {
    /// Always `max_tokens` (finish reason `length`).
    Max,
    /// Uniform in `1..=max_tokens` (finish reason `stop` when shorter), unless `ignore_eos`.
    Uniform,
    /// The model stops at its EOS after a lognormal number of tokens (median
    /// [`LOGNORMAL_MEDIAN`], σ [`LOGNORMAL_SIGMA`], independent of the request), capped by
    /// `max_tokens`; `ignore_eos` generates `max_tokens`.
    Lognormal,
}

/// Median output length of `--output-len lognormal`, tokens (see CALIBRATION.md).
pub const LOGNORMAL_MEDIAN: f64 = 184.0;
/// σ of the log of the output length of `--output-len lognormal` (see CALIBRATION.md).
pub const LOGNORMAL_SIGMA: f64 = 1.27;

/// Everything that defines one pod.
#[derive(Debug, Clone)]
pub struct PodConfig {
    /// Address to bind (loopback by default).
    pub host: IpAddr,
    /// Port to bind; 0 picks a free one.
    pub port: u16,
    /// GPU profile (unscaled; `speedup` is applied at start).
    pub profile: Profile,
    /// Metric names to print.
    pub flavor: Flavor,
    /// Divides every engine time.
    pub speedup: f64,
    /// LoRA slots.
    pub max_loras: usize,
    /// CPU LoRA cache (vLLM `--max-cpu-loras`); `None` = `max_loras`.
    pub max_cpu_loras: Option<usize>,
    /// Seed of the output-length generator and synthetic metrics.
    pub seed: u64,
    /// Base model name.
    pub model: String,
    /// Adapters the pod can load; `None` = every name [`looks_like_adapter`].
    pub lora_modules: Option<Vec<String>>,
    /// vLLM KV gauge name(s).
    pub kv_metric: KvMetricName,
    /// Serve synthetic metrics only, without an engine.
    pub metrics_only: bool,
    /// A lying pod: `/metrics` reports an empty engine (no waiting or running requests, KV
    /// cache unused) whatever its real state; inference is served as usual.
    pub lie_metrics: bool,
    /// `max_tokens` when the request has none.
    pub default_max_tokens: u32,
    /// Output length distribution.
    pub output_len: OutputLen,
}

impl PodConfig {
    /// A loopback pod with defaults for `profile`.
    pub fn new(port: u16, profile: Profile) -> Self {
        PodConfig {
            host: IpAddr::from([127, 0, 0, 1]),
            port,
            profile,
            flavor: Flavor::Vllm,
            speedup: 1.0,
            max_loras: 4,
            max_cpu_loras: None,
            seed: 0,
            model: DEFAULT_MODEL.to_string(),
            lora_modules: None,
            kv_metric: KvMetricName::New,
            metrics_only: false,
            lie_metrics: false,
            default_max_tokens: 128,
            output_len: OutputLen::Max,
        }
    }
}

/// Default served model.
pub const DEFAULT_MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// What a request's `model` names on one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// The base model (also when `model` is absent or empty, as vLLM accepts).
    Base,
    /// A LoRA adapter the pod can load.
    Adapter(Arc<str>),
    /// Neither: vLLM answers 404 `The model `X` does not exist.`.
    Unknown,
}

/// Whether `name` looks like one of the harness's adapters (`sql-lora`, `adapter-07`, …): it
/// contains `lora` or starts with `adapter` (ASCII case ignored). A pod without
/// `--lora-modules` loads such names on demand, as vLLM does with a LoRA resolver that finds
/// the adapter on disk; other names are unknown models.
pub fn looks_like_adapter(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("lora") || n.starts_with("adapter")
}

impl PodConfig {
    /// Resolves a request's `model` on this pod: the base model, an adapter it can load (one
    /// of `--lora-modules`, or without them a name that [`looks_like_adapter`]; none with
    /// `--max-loras 0`), or unknown.
    pub fn resolve_model(&self, name: &str) -> ModelRef {
        if name.is_empty() || name == self.model {
            return ModelRef::Base;
        }
        let known = match &self.lora_modules {
            Some(list) => list.iter().any(|a| a == name),
            None => looks_like_adapter(name),
        };
        if self.max_loras > 0 && known {
            ModelRef::Adapter(Arc::from(name))
        } else {
            ModelRef::Unknown
        }
    }
}

/// Fault injected with `POST /admin/fault`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Normal service.
    None,
    /// Inference answers 500.
    Error500,
    /// Inference answers 429 (with `retry-after: 1`).
    Error429,
    /// Inference answers 503, as vLLM does while it cannot take work (before any token).
    Error503,
    /// Inference never answers.
    Hang,
    /// Responses are cut after a couple of tokens (the connection is closed).
    CloseMidStream,
    /// `/metrics` answers 503.
    NoMetrics,
    /// The pod stops: listener closed, connections dropped.
    Die,
}

impl Fault {
    /// Parses the admin API's mode name.
    pub fn parse(s: &str) -> Option<Fault> {
        Some(match s {
            "none" => Fault::None,
            "error500" => Fault::Error500,
            "error429" => Fault::Error429,
            "error503" => Fault::Error503,
            "hang" => Fault::Hang,
            "close_mid_stream" => Fault::CloseMidStream,
            "no_metrics" => Fault::NoMetrics,
            "die" => Fault::Die,
            _ => return None,
        })
    }

    /// The admin API's mode name.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Error500 => "error500",
            Fault::Error429 => "error429",
            Fault::Error503 => "error503",
            Fault::Hang => "hang",
            Fault::CloseMidStream => "close_mid_stream",
            Fault::NoMetrics => "no_metrics",
            Fault::Die => "die",
        }
    }
}

/// Values forced into `/metrics` by `POST /admin/metrics_override`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsOverride {
    /// Waiting requests.
    pub waiting: Option<f64>,
    /// Running requests.
    pub running: Option<f64>,
    /// KV usage 0..=1.
    pub kv_usage: Option<f64>,
    /// Running adapters.
    pub running_adapters: Option<Vec<String>>,
    /// Waiting adapters.
    pub waiting_adapters: Option<Vec<String>>,
}

/// Why an override body was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OverrideError {
    /// Not a JSON object.
    #[error("metrics override must be a JSON object: {0}")]
    NotObject(String),
    /// A field of the wrong type.
    #[error("field `{0}` has the wrong type")]
    BadField(String),
    /// An unknown field.
    #[error("unknown field `{0}` (known: waiting, running, kv_usage, running_adapters, waiting_adapters)")]
    Unknown(String),
}

impl MetricsOverride {
    /// Parses an override body; `{}` means "no overrides".
    pub fn parse(body: &[u8]) -> Result<Self, OverrideError> {
        let v: Value =
            serde_json::from_slice(body).map_err(|e| OverrideError::NotObject(e.to_string()))?;
        let o = v
            .as_object()
            .ok_or_else(|| OverrideError::NotObject("not an object".into()))?;
        let mut out = MetricsOverride::default();
        for (k, v) in o {
            let num = || {
                v.as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| OverrideError::BadField(k.clone()))
            };
            let list = || -> Result<Vec<String>, OverrideError> {
                match v {
                    Value::String(s) => Ok(s
                        .split(',')
                        .filter(|x| !x.is_empty())
                        .map(str::to_string)
                        .collect()),
                    Value::Array(a) => a
                        .iter()
                        .map(|x| {
                            x.as_str()
                                .map(str::to_string)
                                .ok_or_else(|| OverrideError::BadField(k.clone()))
                        })
                        .collect(),
                    _ => Err(OverrideError::BadField(k.clone())),
                }
            };
            match k.as_str() {
                "waiting" => out.waiting = Some(num()?),
                "running" => out.running = Some(num()?),
                "kv_usage" => out.kv_usage = Some(num()?),
                "running_adapters" => out.running_adapters = Some(list()?),
                "waiting_adapters" => out.waiting_adapters = Some(list()?),
                other => return Err(OverrideError::Unknown(other.to_string())),
            }
        }
        Ok(out)
    }
}

/// Errors starting a pod.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The port could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

struct Sink {
    tx: mpsc::UnboundedSender<Event>,
    tokens: bool,
}

struct Core {
    engine: Option<Engine>,
    sinks: HashMap<ReqId, Sink>,
    adapters_seen: BTreeSet<String>,
    /// (running, waiting, unix time last current), oldest first; the last one is current.
    lora_series: Vec<(String, String, f64)>,
    rng: u64,
    thr: (f64, u64, f64),
    /// Σ over steps of how late (wall seconds) each step ended after its planned end.
    late_sum: f64,
    /// Latest step end so far since start or the last stats reset.
    late_max: f64,
}

impl Core {
    fn next_rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Uniform in (0, 1].
    fn next_unit(&mut self) -> f64 {
        ((self.next_rand() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// A lognormal output length (Box-Muller), at least 1.
    fn lognormal_len(&mut self) -> u32 {
        let (u1, u2) = (self.next_unit(), self.next_unit());
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let n = (LOGNORMAL_MEDIAN.ln() + LOGNORMAL_SIGMA * z).exp().round();
        n.clamp(1.0, f64::from(u32::MAX)) as u32
    }

    fn note_lora(&mut self, now_unix: f64) {
        let Some(e) = &self.engine else { return };
        let st = e.state();
        let run = st.running_adapters.join(",");
        let wait = st.waiting_adapters.join(",");
        if let Some(last) = self.lora_series.last_mut() {
            if last.0 == run && last.1 == wait {
                return;
            }
            last.2 = now_unix;
        }
        self.lora_series
            .retain(|(r, w, _)| !(*r == run && *w == wait));
        self.lora_series.push((run, wait, now_unix));
        if self.lora_series.len() > 16 {
            self.lora_series.remove(0);
        }
    }

    fn dispatch(&mut self, events: &[Event]) {
        for ev in events {
            match ev {
                Event::Token { id, .. } => {
                    if let Some(s) = self.sinks.get(id) {
                        if s.tokens {
                            let _ = s.tx.send(ev.clone());
                        }
                    }
                }
                Event::Finished { id, .. } => {
                    if let Some(s) = self.sinks.remove(id) {
                        let _ = s.tx.send(ev.clone());
                    }
                }
            }
        }
    }
}

/// A running pod.
pub struct Pod {
    cfg: PodConfig,
    addr: SocketAddr,
    core: Mutex<Core>,
    notify: Notify,
    fault: Mutex<Fault>,
    overrides: Mutex<MetricsOverride>,
    die: watch::Sender<bool>,
    start: Instant,
    start_unix: f64,
    max_model_len: u32,
    /// The server's own work before the engine sees a request (the profile's
    /// `request_overhead_s` at the pod's speed-up; zero on the GPU profiles).
    request_overhead: Duration,
    /// Numbers the render endpoints' request ids.
    renders: AtomicU64,
    /// `GET /metrics` requests answered (any status): the scrape load routers put on the pod.
    metrics_requests: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Pod {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn instant_at(&self, t: f64) -> tokio::time::Instant {
        // Bounded so that absurd profiles (speedup 1e-300) cannot overflow a Duration.
        let t = if t.is_finite() {
            t.clamp(0.0, 1.0e9)
        } else {
            1.0e9
        };
        tokio::time::Instant::from_std(self.start + Duration::from_secs_f64(t))
    }

    /// Address the pod listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The pod's configuration.
    pub fn config(&self) -> &PodConfig {
        &self.cfg
    }

    /// Engine gauges now (all zero for a metrics-only pod).
    pub fn state(&self) -> EngineState {
        lock(&self.core)
            .engine
            .as_ref()
            .map(Engine::state)
            .unwrap_or_default()
    }

    /// Current fault mode.
    pub fn fault(&self) -> Fault {
        *lock(&self.fault)
    }

    /// Sets the fault mode (`Die` stops the pod).
    pub fn set_fault(&self, f: Fault) {
        *lock(&self.fault) = f;
        if f == Fault::Die {
            let _ = self.die.send(true);
        }
    }

    /// Restarts the peak gauges (KV, queue, step lateness) from now; counters keep counting.
    pub fn reset_stats(&self) {
        let mut core = lock(&self.core);
        core.late_max = 0.0;
        if let Some(e) = core.engine.as_mut() {
            e.reset_peaks();
        }
    }

    /// Stops the pod: closes its listener, drops its connections, ends its scheduler.
    pub fn stop(&self) {
        let _ = self.die.send(true);
    }

    /// The load reported to routers (`/get_load`, `/load`, `/server_info`): the engine's, with
    /// the metrics overrides applied and zeros from a lying pod, as `/metrics` reports them.
    pub fn load(&self) -> Load {
        let p = &self.cfg.profile;
        let capacity = f64::from(p.num_gpu_blocks) * f64::from(p.block_size);
        let (mut running, mut waiting, mut kv_usage, waiting_tokens) = if self.cfg.metrics_only {
            let v = synthetic::view(
                self.cfg.seed,
                p,
                &self.cfg.model,
                self.cfg.max_loras,
                self.now(),
                self.start_unix,
            );
            (v.running, v.waiting, v.kv_usage, 0)
        } else {
            let st = self.state();
            let used = f64::from(st.used_blocks) / f64::from(p.num_gpu_blocks.max(1));
            (
                f64::from(st.running),
                f64::from(st.waiting),
                used,
                st.waiting_tokens,
            )
        };
        let ov = lock(&self.overrides).clone();
        running = ov.running.unwrap_or(running);
        waiting = ov.waiting.unwrap_or(waiting);
        kv_usage = ov.kv_usage.unwrap_or(kv_usage);
        if self.cfg.lie_metrics {
            return Load::default();
        }
        let whole = |x: f64| x.max(0.0).round() as u64;
        Load {
            running: whole(running),
            waiting: whole(waiting),
            kv_tokens: whole(kv_usage.clamp(0.0, 1.0) * capacity),
            waiting_tokens,
        }
    }

    /// The `/metrics` text now.
    pub fn metrics_text(&self) -> String {
        let now_unix = unix_now();
        let ov = lock(&self.overrides).clone();
        let mut view = if self.cfg.metrics_only {
            synthetic::view(
                self.cfg.seed,
                &self.cfg.profile,
                &self.cfg.model,
                self.cfg.max_loras,
                self.now(),
                self.start_unix,
            )
        } else {
            let mut core = lock(&self.core);
            let now = self.now();
            let Some(e) = &core.engine else {
                return String::new();
            };
            let gen = e.stats().generation_tokens;
            let (t0, g0, mut rate) = core.thr;
            if now - t0 >= 1.0 {
                rate = (gen - g0) as f64 / (now - t0);
                core.thr = (now, gen, rate);
            }
            let Some(e) = &core.engine else {
                return String::new();
            };
            let mut series = core.lora_series.clone();
            if let Some(last) = series.last_mut() {
                last.2 = now_unix;
            }
            let mut view = engine_view(&self.cfg.model, e, series, rate, self.start_unix);
            view.kv_usage_seconds = e.kv_usage_seconds_at(now);
            view.step_lateness_sum = core.late_sum;
            view.step_lateness_max = core.late_max;
            view
        };
        if let Some(v) = ov.running {
            view.running = v;
        }
        if let Some(v) = ov.waiting {
            view.waiting = v;
        }
        if let Some(v) = ov.kv_usage {
            view.kv_usage = v;
        }
        if self.cfg.lie_metrics {
            view.waiting = 0.0;
            view.running = 0.0;
            view.kv_usage = 0.0;
        }
        if ov.running_adapters.is_some() || ov.waiting_adapters.is_some() {
            let (run, wait) = view
                .lora_series
                .last()
                .map(|(r, w, _)| (r.clone(), w.clone()))
                .unwrap_or_default();
            let run = ov.running_adapters.as_ref().map_or(run, |v| v.join(","));
            let wait = ov.waiting_adapters.as_ref().map_or(wait, |v| v.join(","));
            view.lora_series
                .retain(|(r, w, _)| !(*r == run && *w == wait));
            view.lora_series.push((run, wait, now_unix + 1e-3));
        }
        match self.cfg.flavor {
            Flavor::Vllm => render_vllm(&view, self.cfg.kv_metric),
            Flavor::Sglang => render_sglang(&view),
        }
    }
}

/// A started pod; dropping it stops the pod.
pub struct PodHandle {
    pod: Arc<Pod>,
}

impl PodHandle {
    /// Address the pod listens on.
    pub fn addr(&self) -> SocketAddr {
        self.pod.addr
    }

    /// The pod itself.
    pub fn pod(&self) -> &Arc<Pod> {
        &self.pod
    }

    /// Resolves when the pod has been stopped (by `die` or [`Pod::stop`]).
    pub async fn stopped(&self) {
        let mut rx = self.pod.die.subscribe();
        while !*rx.borrow() {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

impl Drop for PodHandle {
    fn drop(&mut self) {
        self.pod.stop();
    }
}

/// Binds the pod's port and starts its tasks on the current tokio runtime.
pub async fn spawn_pod(cfg: PodConfig) -> Result<PodHandle, ServeError> {
    let bind = SocketAddr::new(cfg.host, cfg.port);
    let listener = TcpListener::bind(bind)
        .await
        .map_err(|source| ServeError::Bind { addr: bind, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr: bind, source })?;
    let scaled = cfg.profile.scaled(cfg.speedup);
    // Bounded, and never NaN: a Duration cannot hold either.
    let overhead = scaled.request_overhead_s;
    let request_overhead = if overhead.is_finite() && overhead > 0.0 {
        Duration::from_secs_f64(overhead.min(60.0))
    } else {
        Duration::ZERO
    };
    let engine = (!cfg.metrics_only).then(|| {
        Engine::with_cpu_loras(
            scaled,
            cfg.max_loras,
            cfg.max_cpu_loras.unwrap_or(cfg.max_loras),
        )
    });
    let start_unix = unix_now();
    let (die, _) = watch::channel(false);
    let pod = Arc::new(Pod {
        max_model_len: cfg.profile.max_model_len,
        request_overhead,
        core: Mutex::new(Core {
            engine,
            sinks: HashMap::new(),
            adapters_seen: BTreeSet::new(),
            lora_series: vec![(String::new(), String::new(), start_unix)],
            rng: cfg.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            thr: (0.0, 0, 0.0),
            late_sum: 0.0,
            late_max: 0.0,
        }),
        cfg,
        addr,
        notify: Notify::new(),
        fault: Mutex::new(Fault::None),
        overrides: Mutex::new(MetricsOverride::default()),
        die,
        start: Instant::now(),
        start_unix,
        renders: AtomicU64::new(0),
        metrics_requests: AtomicU64::new(0),
    });
    if !pod.cfg.metrics_only {
        tokio::spawn(scheduler(pod.clone()));
    }
    tokio::spawn(accept_loop(pod.clone(), listener));
    Ok(PodHandle { pod })
}

async fn accept_loop(pod: Arc<Pod>, listener: TcpListener) {
    let mut die = pod.die.subscribe();
    loop {
        if *die.borrow() {
            return;
        }
        tokio::select! {
            r = listener.accept() => {
                let Ok((stream, _)) = r else {
                    // Out of file descriptors and the like: back off briefly.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let pod = pod.clone();
                let mut die = pod.die.subscribe();
                tokio::spawn(async move {
                    let p = pod.clone();
                    let svc = service_fn(move |req| handle(p.clone(), req));
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc);
                    if *die.borrow() {
                        return;
                    }
                    tokio::select! {
                        _ = conn => {}
                        _ = die.changed() => {}
                    }
                });
            }
            _ = die.changed() => return,
        }
    }
}

/// Lateness up to which the next step starts at the previous step's planned end rather than
/// at the wake-up time. Tokio's timers fire on a 1 ms grid; without this, steps shorter than a
/// millisecond (an H100 at `--speedup 20`) would be stretched to a full tick and a fast profile
/// would lose more speed than a slow one. Events are then late by at most a tick, but the
/// engine's throughput is exactly the modelled one.
const CATCH_UP_S: f64 = 0.005;

async fn scheduler(pod: Arc<Pod>) {
    let mut die = pod.die.subscribe();
    let mut events = Vec::new();
    let mut last_end: Option<f64> = None;
    loop {
        if *die.borrow() {
            return;
        }
        let end = {
            let mut core = lock(&pod.core);
            let now = pod.now();
            let start = match last_end {
                Some(e) if now - e < CATCH_UP_S => e,
                _ => now,
            };
            core.engine.as_mut().and_then(|e| e.begin_step(start))
        };
        match end {
            None => {
                last_end = None;
                tokio::select! {
                    _ = pod.notify.notified() => {}
                    _ = die.changed() => return,
                }
            }
            Some(end) => {
                if end > pod.now() {
                    // Tokio's timer ticks in whole milliseconds: it would wake this step up to
                    // 1 ms late, a lag that swamps a fast pod's 10 ms time to first token. Sleep
                    // on the timer to within a tick, then the rest precisely (nanosleep).
                    let at = pod.instant_at(end);
                    let coarse = at.checked_sub(TIMER_TICK).unwrap_or(at);
                    tokio::select! {
                        _ = tokio::time::sleep_until(coarse) => {}
                        _ = die.changed() => return,
                    }
                    let rest = at.saturating_duration_since(tokio::time::Instant::now());
                    if !rest.is_zero() {
                        std::thread::sleep(rest);
                    }
                } else {
                    // Catching up: let other tasks run between back-to-back steps.
                    tokio::task::yield_now().await;
                }
                let mut core = lock(&pod.core);
                // How late this step ends on the wall clock (a loaded machine lags).
                let late = (pod.now() - end).max(0.0);
                core.late_sum += late;
                core.late_max = core.late_max.max(late);
                events.clear();
                if let Some(e) = core.engine.as_mut() {
                    e.finish_step(end, &mut events);
                }
                core.dispatch(&events);
                core.note_lora(unix_now());
                last_end = Some(end);
            }
        }
    }
}

/// Response body: a whole buffer, an SSE stream fed by the engine, or a cut connection.
pub enum SimBody {
    /// Whole body.
    Full(Option<Bytes>),
    /// Server-sent events.
    Sse(Box<SseStream>),
    /// Sends the given bytes (if any), waits for the timer (so they reach the client), then
    /// fails, so the connection is closed mid-response.
    Cut(Option<Bytes>, Pin<Box<tokio::time::Sleep>>),
}

/// The error a cut body reports to hyper (which then closes the connection).
#[derive(Debug, thiserror::Error)]
#[error("response cut: {0}")]
pub struct BodyCut(&'static str);

impl SimBody {
    fn text(s: impl Into<String>) -> Self {
        SimBody::Full(Some(Bytes::from(s.into())))
    }
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = BodyCut;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyCut>>> {
        match self.get_mut() {
            SimBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Cut(b, timer) => match b.take() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None => match timer.as_mut().poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(()) => Poll::Ready(Some(Err(BodyCut("fault close_mid_stream")))),
                },
            },
            SimBody::Sse(s) => s.poll(cx),
        }
    }
}

/// Aborts the engine request when dropped before it finished.
struct AbortGuard {
    pod: Arc<Pod>,
    id: ReqId,
    done: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut core = lock(&self.pod.core);
        core.sinks.remove(&self.id);
        if let Some(e) = core.engine.as_mut() {
            e.abort(self.id);
        }
    }
}

/// State of one streaming response.
pub struct SseStream {
    rx: mpsc::UnboundedReceiver<Event>,
    guard: AbortGuard,
    ctx: RespCtx,
    finish: &'static str,
    include_usage: bool,
    close_after: Option<u32>,
    sent: u32,
    done: bool,
    cut_timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl SseStream {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyCut>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(t) = self.cut_timer.as_mut() {
            // Let what was sent reach the client, then cut.
            return match t.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(()) => Poll::Ready(Some(Err(BodyCut("fault close_mid_stream")))),
            };
        }
        let mut buf = String::new();
        loop {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(Event::Token { index, last, .. })) => {
                    if self.close_after.is_some_and(|n| self.sent >= n) {
                        self.cut_timer =
                            Some(Box::pin(tokio::time::sleep(Duration::from_millis(50))));
                        if buf.is_empty() {
                            return self.poll(cx);
                        }
                        break;
                    }
                    buf.push_str(&self.ctx.token_events(index, last.then_some(self.finish)));
                    self.sent += 1;
                }
                Poll::Ready(Some(Event::Finished { usage, .. })) => {
                    buf.push_str(&self.ctx.end_events(&usage, self.finish, self.include_usage));
                    self.guard.done = true;
                    self.done = true;
                    break;
                }
                Poll::Ready(None) => {
                    if buf.is_empty() {
                        return Poll::Ready(Some(Err(BodyCut("pod stopped"))));
                    }
                    break;
                }
                Poll::Pending => break,
            }
        }
        if buf.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf)))))
        }
    }
}

fn response(status: StatusCode, ctype: &'static str, body: SimBody) -> Response<SimBody> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

fn json_response(status: StatusCode, body: String) -> Response<SimBody> {
    response(status, "application/json", SimBody::text(body))
}

fn error_response(status: StatusCode, kind: &str, msg: &str) -> Response<SimBody> {
    json_response(status, error_body(status.as_u16(), kind, msg))
}

async fn handle(pod: Arc<Pod>, req: Request<Incoming>) -> Result<Response<SimBody>, Infallible> {
    let mut resp = route(&pod, req).await;
    if let Ok(v) = HeaderValue::from_str(&pod.addr.to_string()) {
        resp.headers_mut().insert(POD_HEADER, v);
    }
    Ok(resp)
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, Response<SimBody>> {
    match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => Err(error_response(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            &format!("cannot read body: {e}"),
        )),
    }
}

async fn route(pod: &Arc<Pod>, req: Request<Incoming>) -> Response<SimBody> {
    let path = req.uri().path().to_string();
    let vllm = pod.cfg.flavor == Flavor::Vllm;
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/health") => {
            response(StatusCode::OK, "application/json", SimBody::Full(None))
        }
        (Method::GET, "/metrics") => {
            pod.metrics_requests.fetch_add(1, Ordering::Relaxed);
            if pod.fault() == Fault::NoMetrics {
                return response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    SimBody::text("metrics disabled by fault injection\n"),
                );
            }
            response(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                SimBody::text(pod.metrics_text()),
            )
        }
        (Method::GET, "/v1/models") => {
            // vLLM lists every adapter registered with `--lora-modules` from the start, and one
            // loaded on demand once it has been loaded; routers that check a request's model
            // against the workers' lists (SMG) rely on it.
            let mut adapters: BTreeSet<String> = lock(&pod.core).adapters_seen.clone();
            adapters.extend(pod.cfg.lora_modules.iter().flatten().cloned());
            let adapters: Vec<String> = adapters.into_iter().collect();
            json_response(
                StatusCode::OK,
                models_body(
                    &pod.cfg.model,
                    &adapters,
                    pod.max_model_len,
                    pod.start_unix as u64,
                ),
            )
        }
        (Method::POST, "/v1/chat/completions") => infer(pod, Api::Chat, req).await,
        (Method::POST, "/v1/completions") => infer(pod, Api::Completions, req).await,
        (Method::POST, "/v1/responses") => infer(pod, Api::Responses, req).await,
        (Method::POST, "/v1/messages") => infer(pod, Api::Messages, req).await,
        (Method::POST, "/v1/embeddings") => embeddings(pod, req).await,
        (Method::POST, "/v1/chat/completions/render" | "/v1/completions/render") if vllm => {
            render(pod, &path, req).await
        }
        (Method::POST, "/tokenize") => {
            let body = match read_body(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            if let Some(r) = check_model_field(pod, &body) {
                return r;
            }
            answer(introspect::tokenize(&pod.cfg, &body))
        }
        (Method::GET, "/load") if vllm => {
            json_response(StatusCode::OK, introspect::vllm_load(&pod.load()))
        }
        (Method::GET, "/version") if vllm => {
            json_response(StatusCode::OK, introspect::vllm_version())
        }
        (Method::GET, "/get_load") if !vllm => {
            json_response(StatusCode::OK, introspect::sglang_get_load(&pod.load()))
        }
        (Method::GET, "/server_info" | "/get_server_info") if !vllm => json_response(
            StatusCode::OK,
            introspect::sglang_server_info(&pod.cfg, &pod.load()),
        ),
        (Method::GET, "/model_info" | "/get_model_info") if !vllm => {
            json_response(StatusCode::OK, introspect::sglang_model_info(&pod.cfg))
        }
        (Method::POST, "/admin/stats/reset") => {
            pod.reset_stats();
            json_response(StatusCode::OK, json!({"reset": true}).to_string())
        }
        (Method::POST, "/admin/fault") => {
            let body = match read_body(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let mode = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.get("mode").and_then(Value::as_str).and_then(Fault::parse));
            match mode {
                Some(f) => {
                    if f == Fault::Die {
                        // Answer first, then stop.
                        let p = pod.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            p.set_fault(Fault::Die);
                        });
                    } else {
                        pod.set_fault(f);
                    }
                    json_response(StatusCode::OK, json!({"fault": f.as_str()}).to_string())
                }
                None => error_response(
                    StatusCode::BAD_REQUEST,
                    "BadRequestError",
                    "body must be {\"mode\": \"none|error500|error429|error503|hang|close_mid_stream|no_metrics|die\"}",
                ),
            }
        }
        (Method::POST, "/admin/metrics_override") => {
            let body = match read_body(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            match MetricsOverride::parse(&body) {
                Ok(o) => {
                    let cleared = o == MetricsOverride::default();
                    *lock(&pod.overrides) = o;
                    json_response(StatusCode::OK, json!({"override": !cleared}).to_string())
                }
                Err(e) => {
                    error_response(StatusCode::BAD_REQUEST, "BadRequestError", &e.to_string())
                }
            }
        }
        (Method::GET, "/admin/state") => {
            let core = lock(&pod.core);
            let body = match &core.engine {
                Some(e) => {
                    let st = e.state();
                    let s = e.stats();
                    json!({
                        "pod": pod.addr.to_string(), "profile": pod.cfg.profile.name,
                        "fault": pod.fault().as_str(),
                        "running": st.running, "waiting": st.waiting, "kv_usage": st.kv_usage,
                        "used_blocks": st.used_blocks, "num_gpu_blocks": pod.cfg.profile.num_gpu_blocks,
                        "block_size": pod.cfg.profile.block_size,
                        "running_adapters": st.running_adapters, "waiting_adapters": st.waiting_adapters,
                        "resident_adapters": st.resident_adapters, "max_loras": e.max_loras(),
                        "cpu_adapters": st.cpu_adapters, "max_cpu_loras": e.max_cpu_loras(),
                        "lora_loads": e.lora_loads(), "lora_disk_loads": e.lora_disk_loads(),
                        "kv_usage_max": s.kv_usage_max, "num_requests_waiting_max": s.waiting_max,
                        "step_lateness_seconds_sum": core.late_sum,
                        "step_lateness_seconds_max": core.late_max,
                        "prefix_cache_hits": s.prefix_hits, "prefix_cache_queries": s.prefix_queries,
                        "preemptions": s.preemptions, "prompt_tokens": s.prompt_tokens,
                        "generation_tokens": s.generation_tokens, "steps": s.steps,
                        "finished": s.finished_stop + s.finished_length, "aborted": s.aborted,
                        "metrics_requests": pod.metrics_requests.load(Ordering::Relaxed),
                    })
                }
                None => {
                    json!({"pod": pod.addr.to_string(), "profile": pod.cfg.profile.name, "metrics_only": true, "fault": pod.fault().as_str(), "metrics_requests": pod.metrics_requests.load(Ordering::Relaxed)})
                }
            };
            json_response(StatusCode::OK, body.to_string())
        }
        // FastAPI's answer (vLLM and SGLang both serve through it).
        _ => json_response(
            StatusCode::NOT_FOUND,
            json!({"detail": "Not Found"}).to_string(),
        ),
    }
}

fn answer((status, body): introspect::Answer) -> Response<SimBody> {
    json_response(status, body)
}

/// vLLM's 404 for a `model` this pod does not serve, in the shape of `api`.
fn unknown_model(api: Api, name: &str) -> Response<SimBody> {
    let msg = format!("The model `{name}` does not exist.");
    match api {
        Api::Messages => json_response(StatusCode::NOT_FOUND, anthropic_error_body(404, &msg)),
        _ => json_response(
            StatusCode::NOT_FOUND,
            error_body_param(404, "NotFoundError", &msg, Some("model")),
        ),
    }
}

/// The 404 for a body whose `model` (a string, if present) the pod does not serve.
fn check_model_field(pod: &Pod, body: &[u8]) -> Option<Response<SimBody>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let name = v.get("model").and_then(Value::as_str)?;
    (pod.cfg.resolve_model(name) == ModelRef::Unknown).then(|| unknown_model(Api::Chat, name))
}

/// `/v1/chat/completions/render` and `/v1/completions/render` (vLLM pods).
async fn render(pod: &Arc<Pod>, path: &str, req: Request<Incoming>) -> Response<SimBody> {
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let id = pod.renders.fetch_add(1, Ordering::Relaxed);
    let chat = path.starts_with("/v1/chat/");
    let api = if chat { Api::Chat } else { Api::Completions };
    // Parse errors first, then the model, as vLLM validates the body before the model.
    if let Err(e) = prompt::parse(api, &body) {
        return error_response(StatusCode::BAD_REQUEST, "BadRequestError", &e.to_string());
    }
    if let Some(r) = check_model_field(pod, &body) {
        return r;
    }
    answer(if chat {
        introspect::render_chat(&pod.cfg, &body, id)
    } else {
        introspect::render_completion(&pod.cfg, &body, id)
    })
}

/// Answers the inference faults (`error500`, `error429`, `error503`, `hang`); `None` means "go
/// on".
async fn inference_fault(pod: &Arc<Pod>, fault: Fault) -> Option<Response<SimBody>> {
    match fault {
        Fault::Error500 => Some(error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            "injected fault: error500",
        )),
        Fault::Error429 => {
            let mut r = error_response(
                StatusCode::TOO_MANY_REQUESTS,
                "RateLimitError",
                "injected fault: error429",
            );
            r.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
            Some(r)
        }
        Fault::Error503 => Some(error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            "injected fault: error503",
        )),
        Fault::Hang => {
            let mut die = pod.die.subscribe();
            tokio::select! {
                _ = tokio::time::sleep(HANG_LIMIT) => {}
                _ = die.changed() => {}
            }
            Some(error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailableError",
                "injected fault: hang ended",
            ))
        }
        _ => None,
    }
}

/// `/v1/embeddings`: answered at once (the emulator gives embeddings no GPU cost), with the
/// same token counting and the inference faults.
async fn embeddings(pod: &Arc<Pod>, req: Request<Incoming>) -> Response<SimBody> {
    if let Some(r) = inference_fault(pod, pod.fault()).await {
        return r;
    }
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                &format!("request body is not valid JSON: {e}"),
            )
        }
    };
    let inputs: Vec<u32> = match v.get("input") {
        Some(Value::String(s)) => vec![prompt::count_tokens(s)],
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_number) => {
            vec![a.len() as u32]
        }
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|x| match x {
                Value::String(s) => prompt::count_tokens(s),
                Value::Array(ids) => ids.len().max(1) as u32,
                _ => 1,
            })
            .collect(),
        _ => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                "field `input` is required",
            )
        }
    };
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&pod.cfg.model)
        .to_string();
    if pod.cfg.resolve_model(&model) == ModelRef::Unknown {
        return unknown_model(Api::Chat, &model);
    }
    let total: u32 = inputs.iter().fold(0u32, |a, b| a.saturating_add(*b));
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let e: Vec<f64> = (0..8)
                .map(|k| (((*n as usize + i * 7 + k) % 17) as f64 - 8.0) / 8.0)
                .collect();
            json!({"object": "embedding", "index": i, "embedding": e})
        })
        .collect();
    let out = json!({
        "id": format!("embd-{:08x}", pod.addr.port()), "object": "list", "created": unix_now() as u64,
        "model": model, "data": data, "usage": {"prompt_tokens": total, "total_tokens": total}
    });
    json_response(StatusCode::OK, out.to_string())
}

/// An error in the shape of `api` (Anthropic's for `/v1/messages`, vLLM's otherwise).
fn api_error(api: Api, status: StatusCode, kind: &str, msg: &str) -> Response<SimBody> {
    match api {
        Api::Messages => json_response(status, anthropic_error_body(status.as_u16(), msg)),
        _ => error_response(status, kind, msg),
    }
}

async fn infer(pod: &Arc<Pod>, api: Api, req: Request<Incoming>) -> Response<SimBody> {
    let fault = pod.fault();
    if let Some(r) = inference_fault(pod, fault).await {
        return r;
    }
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let parsed = match prompt::parse(api, &body) {
        Ok(p) => p,
        Err(e) => {
            return api_error(
                api,
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                &e.to_string(),
            )
        }
    };
    let cfg = &pod.cfg;
    let adapter: Option<Arc<str>> = match cfg.resolve_model(&parsed.model) {
        ModelRef::Base => None,
        ModelRef::Adapter(a) => Some(a),
        ModelRef::Unknown => return unknown_model(api, &parsed.model),
    };
    let max_tokens = parsed.max_tokens.unwrap_or(cfg.default_max_tokens);
    if max_tokens == 0 {
        return api_error(
            api,
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            "max_tokens must be at least 1, got 0.",
        );
    }
    if !pod.request_overhead.is_zero() {
        tokio::time::sleep(pod.request_overhead).await;
    }
    let prompt_tokens = parsed.tokens.len().clamp(1, u32::MAX as usize) as u32;
    let block_hashes =
        prompt::block_hashes(&parsed.tokens, cfg.profile.block_size, adapter.as_deref());
    let model_json = serde_json::to_string(if parsed.model.is_empty() {
        &cfg.model
    } else {
        &parsed.model
    })
    .unwrap_or_else(|_| "\"\"".into());
    let created = unix_now() as u64;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (id, output_tokens) = {
        let mut core = lock(&pod.core);
        let output_tokens = match cfg.output_len {
            OutputLen::Uniform if !parsed.ignore_eos => {
                1 + (core.next_rand() % u64::from(max_tokens)) as u32
            }
            OutputLen::Lognormal if !parsed.ignore_eos => core.lognormal_len().min(max_tokens),
            _ => max_tokens,
        };
        let new = NewRequest {
            prompt_tokens,
            output_tokens,
            max_tokens,
            block_hashes,
            adapter: adapter.clone(),
        };
        let now = pod.now();
        let res = match core.engine.as_mut() {
            Some(e) => e.submit(new, now).map(Some),
            None => Ok(None),
        };
        match res {
            Ok(Some(id)) => {
                core.sinks.insert(
                    id,
                    Sink {
                        tx,
                        tokens: parsed.stream,
                    },
                );
                if let Some(a) = &adapter {
                    // Bounded: clients choose these names.
                    if core.adapters_seen.len() < 256 && !core.adapters_seen.contains(&**a) {
                        core.adapters_seen.insert(a.to_string());
                    }
                }
                core.note_lora(unix_now());
                (id, output_tokens)
            }
            Ok(None) => (0, output_tokens),
            Err(e) => {
                drop(core);
                let (status, kind) = match e {
                    SubmitError::NoLora { .. } => (StatusCode::NOT_FOUND, "NotFoundError"),
                    _ => (StatusCode::BAD_REQUEST, "BadRequestError"),
                };
                return api_error(api, status, kind, &e.to_string());
            }
        }
    };
    let finish = if output_tokens >= max_tokens {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    let prefix = match api {
        Api::Chat => "chatcmpl-",
        Api::Completions => "cmpl-",
        Api::Responses => "resp_",
        Api::Messages => "msg_",
    };
    let ctx = RespCtx {
        api,
        id: format!("{prefix}{:08x}{:08x}", pod.addr.port(), id),
        model_json,
        created,
        req: id,
        prompt_tokens,
    };
    if id == 0 {
        // Metrics-only pod: answer at once, no engine.
        let usage = Usage {
            prompt_tokens,
            completion_tokens: output_tokens,
            cached_tokens: 0,
        };
        return if parsed.stream {
            let mut s = String::new();
            for i in 1..=output_tokens {
                s.push_str(&ctx.token_events(i, (i == output_tokens).then_some(finish.as_str())));
            }
            s.push_str(&ctx.end_events(&usage, finish.as_str(), parsed.include_usage));
            response(StatusCode::OK, "text/event-stream", SimBody::text(s))
        } else {
            json_response(StatusCode::OK, ctx.full_body(&usage, finish.as_str()))
        };
    }
    pod.notify.notify_one();
    let mut guard = AbortGuard {
        pod: pod.clone(),
        id,
        done: false,
    };
    let cut = fault == Fault::CloseMidStream;
    if parsed.stream {
        let s = SseStream {
            rx,
            guard,
            ctx,
            finish: finish.as_str(),
            include_usage: parsed.include_usage,
            close_after: cut.then_some(CLOSE_AFTER_TOKENS),
            sent: 0,
            done: false,
            cut_timer: None,
        };
        return response(
            StatusCode::OK,
            "text/event-stream",
            SimBody::Sse(Box::new(s)),
        );
    }
    if cut {
        // Wait for the first token, then send the head of the JSON body and cut.
        let _ = tokio::time::timeout(HANG_LIMIT, rx.recv()).await;
        let full = ctx.full_body(
            &Usage {
                prompt_tokens,
                completion_tokens: output_tokens,
                cached_tokens: 0,
            },
            finish.as_str(),
        );
        let full = Bytes::from(full);
        let half = full.slice(..full.len().min(40));
        return response(
            StatusCode::OK,
            "application/json",
            SimBody::Cut(
                Some(half),
                Box::pin(tokio::time::sleep(Duration::from_millis(50))),
            ),
        );
    }
    let mut die = pod.die.subscribe();
    loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Some(Event::Finished { usage, reason, .. }) => {
                    guard.done = true;
                    return json_response(StatusCode::OK, ctx.full_body(&usage, reason.as_str()));
                }
                Some(_) => continue,
                None => break,
            },
            _ = die.changed() => break,
        }
    }
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailableError",
        "pod stopped",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_parse() {
        let o = MetricsOverride::parse(
            br#"{"waiting": 2, "running_adapters": "a,b", "waiting_adapters": []}"#,
        );
        assert_eq!(
            o,
            Ok(MetricsOverride {
                waiting: Some(2.0),
                running_adapters: Some(vec!["a".into(), "b".into()]),
                waiting_adapters: Some(vec![]),
                ..MetricsOverride::default()
            })
        );
        assert_eq!(
            MetricsOverride::parse(b"{}"),
            Ok(MetricsOverride::default())
        );
        assert!(MetricsOverride::parse(b"{\"kv\": 1}").is_err());
        assert!(MetricsOverride::parse(b"[1]").is_err());
        assert!(MetricsOverride::parse(b"{\"running_adapters\": [1]}").is_err());
        assert_eq!(
            Fault::parse("close_mid_stream").map(Fault::as_str),
            Some("close_mid_stream")
        );
        assert_eq!(Fault::parse("boom"), None);
    }

    #[test]
    fn seeded_random_override_bodies_never_panic() {
        let base = br#"{"waiting": 7, "running": 3, "kv_usage": 0.5, "running_adapters": ["a","b"], "waiting_adapters": "c"}"#;
        let mut s: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut ok = 0;
        for _ in 0..5000 {
            let mut body = base.to_vec();
            for _ in 0..(next() % 5) {
                let pos = (next() as usize) % body.len().max(1);
                match next() % 3 {
                    0 => body[pos] = (next() & 0xff) as u8,
                    1 => {
                        body.remove(pos);
                    }
                    _ => body.insert(pos, b"{}[]\":,0-e.n"[(next() % 12) as usize]),
                }
                if body.is_empty() {
                    body.push(b'{');
                }
            }
            if let Ok(o) = MetricsOverride::parse(&body) {
                ok += 1;
                assert!(o.kv_usage.is_none_or(f64::is_finite));
            }
        }
        assert!(ok > 0);
    }
}
