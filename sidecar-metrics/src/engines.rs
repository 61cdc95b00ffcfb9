//! Turns one pod's `/metrics` text into the load figures the snapshot carries, per engine.
//!
//! Each engine names the same ideas differently (see shared PRIOR-ART.md): queue, running batch,
//! KV-cache use, cache geometry and LoRA residency. One pass over the text collects every name we
//! know from every engine (the names do not overlap), then the engine — configured, or detected
//! from the metric-name prefixes — decides which of them count. Several series of one gauge (data
//! parallel engines, several models in one Triton) are summed for counts and the highest is taken
//! for KV use, so a pod is never reported less loaded than its busiest part.

use std::collections::BTreeSet;

use llm_router_snapshot::{Engine, LoraState};
use serde::Serialize;

use crate::prom::{self, Line, LineError, Sample};

/// The normalised state of one pod, as `parse` prints it and the snapshot stores it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodMetrics {
    #[serde(serialize_with = "ser_engine")]
    pub engine: Engine,
    /// True when the engine came from the metric names rather than the configuration.
    pub engine_detected: bool,
    pub waiting: u32,
    pub running: u32,
    pub kv_usage: Option<f32>,
    pub block_size: u32,
    pub num_blocks: u32,
    #[serde(serialize_with = "ser_lora")]
    pub lora: Option<LoraState>,
    /// `model_name` (or Triton `model`) label values seen on the load gauges.
    pub models: Vec<String>,
    /// Load figures this text did not carry (reported as 0 / unknown).
    pub missing: Vec<&'static str>,
    /// Lines that were not valid exposition format and were skipped.
    #[serde(serialize_with = "ser_errors")]
    pub bad_lines: Vec<LineError>,
}

fn ser_engine<S: serde::Serializer>(e: &Engine, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(e.name())
}

fn ser_lora<S: serde::Serializer>(l: &Option<LoraState>, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct L<'a> {
        running: &'a [String],
        waiting: &'a [String],
        max_loras: u16,
    }
    l.as_ref()
        .map(|l| L {
            running: &l.running,
            waiting: &l.waiting,
            max_loras: l.max_loras,
        })
        .serialize(s)
}

fn ser_errors<S: serde::Serializer>(e: &[LineError], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(e.iter().map(|e| e.to_string()))
}

/// Why a text gives no usable pod state.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NormaliseError {
    #[error("no metric of a known model server (vLLM, SGLang, TensorRT-LLM, Triton, TGI, llama.cpp) found{}", bad_hint(*.bad_lines, *.first_bad))]
    UnknownEngine {
        bad_lines: usize,
        first_bad: Option<usize>,
    },
    #[error("{engine} metrics found, but none of the load gauges it should export ({expected})")]
    NoLoadGauges {
        engine: &'static str,
        expected: &'static str,
    },
}

fn bad_hint(n: usize, first: Option<usize>) -> String {
    match first {
        Some(l) if n > 0 => format!(" ({n} malformed lines, the first at line {l})"),
        _ => String::new(),
    }
}

/// Metric names the normaliser reads (every engine at once; the sets are disjoint).
fn wanted(name: &str) -> bool {
    matches!(
        name,
        "vllm:num_requests_waiting"
            | "vllm:num_requests_running"
            | "vllm:kv_cache_usage_perc"
            | "vllm:gpu_cache_usage_perc"
            | "vllm:cache_config_info"
            | "vllm:lora_requests_info"
            | "sglang:num_queue_reqs"
            | "sglang:num_running_reqs"
            | "sglang:token_usage"
            | "sglang:cache_config_info"
            | "trtllm_num_requests_waiting"
            | "trtllm_num_requests_running"
            | "trtllm_kv_cache_utilization"
            | "trtllm_kv_cache_tokens_per_block"
            | "trtllm_kv_cache_max_blocks"
            | "nv_trt_llm_request_metrics"
            | "nv_trt_llm_kv_cache_block_metrics"
            | "nv_inference_pending_request_count"
            | "tgi_queue_size"
            | "tgi_batch_current_size"
            | "llamacpp:requests_deferred"
            | "llamacpp:requests_processing"
    )
}

/// Every metric family the normaliser reads, with its engine (the same set as [`wanted`]).
pub const WANTED: [(&str, Engine); 22] = [
    ("vllm:num_requests_waiting", Engine::Vllm),
    ("vllm:num_requests_running", Engine::Vllm),
    ("vllm:kv_cache_usage_perc", Engine::Vllm),
    ("vllm:gpu_cache_usage_perc", Engine::Vllm),
    ("vllm:cache_config_info", Engine::Vllm),
    ("vllm:lora_requests_info", Engine::Vllm),
    ("sglang:num_queue_reqs", Engine::Sglang),
    ("sglang:num_running_reqs", Engine::Sglang),
    ("sglang:token_usage", Engine::Sglang),
    ("sglang:cache_config_info", Engine::Sglang),
    ("trtllm_num_requests_waiting", Engine::TrtllmServe),
    ("trtllm_num_requests_running", Engine::TrtllmServe),
    ("trtllm_kv_cache_utilization", Engine::TrtllmServe),
    ("trtllm_kv_cache_tokens_per_block", Engine::TrtllmServe),
    ("trtllm_kv_cache_max_blocks", Engine::TrtllmServe),
    ("nv_trt_llm_request_metrics", Engine::TritonTrtllm),
    ("nv_trt_llm_kv_cache_block_metrics", Engine::TritonTrtllm),
    ("nv_inference_pending_request_count", Engine::TritonTrtllm),
    ("tgi_queue_size", Engine::Tgi),
    ("tgi_batch_current_size", Engine::Tgi),
    ("llamacpp:requests_deferred", Engine::LlamaCpp),
    ("llamacpp:requests_processing", Engine::LlamaCpp),
];

/// The query that asks a `prometheus_client` server (vLLM, SGLang, trtllm-serve) for only the
/// families we read: `name[]=a&name[]=b…`. Servers that do not know it ignore it and send
/// everything, which the reader handles anyway. `None` = every engine's names (auto-detect).
pub fn name_filter_query(engine: Option<Engine>) -> String {
    let mut q = String::new();
    for (name, e) in WANTED {
        if engine.is_none_or(|want| want == e || want == Engine::Unknown) {
            if !q.is_empty() {
                q.push('&');
            }
            q.push_str("name%5B%5D=");
            q.push_str(&crate::kube::query_escape(name));
        }
    }
    q
}

/// The engine a metric name belongs to, by prefix.
pub fn engine_of(name: &str) -> Option<Engine> {
    let b = name.as_bytes();
    // Cheap first-byte dispatch: this runs on every line of every scrape when detecting.
    match b.first()? {
        b'v' if name.starts_with("vllm:") => Some(Engine::Vllm),
        b's' if name.starts_with("sglang:") => Some(Engine::Sglang),
        b't' if name.starts_with("trtllm_") => Some(Engine::TrtllmServe),
        b't' if name.starts_with("tgi_") => Some(Engine::Tgi),
        b'n' if name.starts_with("nv_trt_llm_") || name.starts_with("nv_inference_") => {
            Some(Engine::TritonTrtllm)
        }
        b'l' if name.starts_with("llamacpp:") => Some(Engine::LlamaCpp),
        _ => None,
    }
}

/// A gauge summed over its series, remembering whether it was seen at all.
#[derive(Default, Clone, Copy)]
struct Sum {
    seen: bool,
    total: f64,
}

impl Sum {
    fn add(&mut self, v: f64) {
        self.seen = true;
        if v.is_finite() && v > 0.0 {
            self.total += v;
        }
    }
    fn count(self) -> Option<u32> {
        // `as` saturates: a absurd count becomes u32::MAX rather than wrapping.
        self.seen.then(|| self.total.round() as u32)
    }
}

/// The highest value over series (for KV use), clamped to [0, 1].
#[derive(Default, Clone, Copy)]
struct Max {
    value: Option<f64>,
}

impl Max {
    fn add(&mut self, v: f64) {
        if v.is_nan() {
            return;
        }
        let v = v.clamp(0.0, 1.0);
        self.value = Some(self.value.map_or(v, |m| m.max(v)));
    }
}

#[derive(Default)]
struct Acc {
    votes: [u32; 7],
    vllm_waiting: Sum,
    vllm_running: Sum,
    vllm_kv_new: Max,
    vllm_kv_old: Max,
    vllm_block: (u32, u32),
    vllm_lora: Option<(f64, LoraState)>,
    sgl_waiting: Sum,
    sgl_running: Sum,
    sgl_kv: Max,
    sgl_block: (u32, u32),
    trt_waiting: Sum,
    trt_running: Sum,
    trt_kv: Max,
    trt_block_size: Option<u32>,
    trt_blocks: Option<u32>,
    triton_waiting: Sum,
    triton_running: Sum,
    triton_pending: Sum,
    triton_kv: Max,
    triton_block_size: Option<u32>,
    triton_blocks: Option<u32>,
    tgi_waiting: Sum,
    tgi_running: Sum,
    llama_waiting: Sum,
    llama_running: Sum,
    models: BTreeSet<String>,
}

fn engine_index(e: Engine) -> usize {
    Engine::ALL.iter().position(|x| *x == e).unwrap_or(0)
}

/// Reads a label holding an unsigned integer ("16", "81767"); "None" or garbage gives 0.
fn label_u32(s: &Sample<'_>, key: &str) -> u32 {
    s.label(key)
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(0)
}

/// A non-negative gauge value as u32 (saturating), None for NaN.
fn value_u32(v: f64) -> Option<u32> {
    (!v.is_nan()).then(|| v.max(0.0).round() as u32)
}

/// A comma list of adapter names. Names the snapshot cannot carry (over 255 bytes) and entries
/// past its per-list limit are dropped, so one odd label never makes the snapshot unencodable.
fn adapters(list: Option<std::borrow::Cow<'_, str>>) -> Vec<String> {
    list.map(|l| {
        l.split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty() && a.len() <= 255)
            .take(llm_router_snapshot::MAX_ADAPTERS)
            .map(str::to_owned)
            .collect()
    })
    .unwrap_or_default()
}

impl Acc {
    fn sample(&mut self, s: &Sample<'_>, collect_models: bool) {
        let v = s.value;
        if collect_models {
            if let Some(m) = s.label("model_name").or_else(|| s.label("model")) {
                if !self.models.contains(m.as_ref()) {
                    self.models.insert(m.into_owned());
                }
            }
        }
        match s.name {
            "vllm:num_requests_waiting" => self.vllm_waiting.add(v),
            "vllm:num_requests_running" => self.vllm_running.add(v),
            "vllm:kv_cache_usage_perc" => self.vllm_kv_new.add(v),
            "vllm:gpu_cache_usage_perc" => self.vllm_kv_old.add(v),
            "vllm:cache_config_info" => {
                self.vllm_block = (label_u32(s, "block_size"), label_u32(s, "num_gpu_blocks"))
            }
            "vllm:lora_requests_info" => {
                // The value is the time the series was last updated: the newest one is current.
                if self.vllm_lora.as_ref().is_some_and(|(t, _)| *t >= v) || v.is_nan() {
                    return;
                }
                let max = s
                    .label("max_lora")
                    .and_then(|m| m.trim().parse::<u32>().ok())
                    .unwrap_or(0)
                    .min(u32::from(u16::MAX - 1)) as u16;
                let running = adapters(s.label("running_lora_adapters"));
                let mut waiting = adapters(s.label("waiting_lora_adapters"));
                // vLLM V1 (checked on 0.32) fills both labels from one table: the adapters
                // whose requests have been scheduled and have not ended (a request waiting for
                // a slot is in neither; fixture `vllm-0.32-cpu-local-lora-slot-wait.prom`).
                // Equal lists say nothing about waiting: the filter learns the slot waiters
                // from its own requests in flight.
                if waiting == running {
                    waiting.clear();
                }
                let state = LoraState {
                    running,
                    waiting,
                    max_loras: max,
                };
                self.vllm_lora = Some((v, state));
            }
            "sglang:num_queue_reqs" => self.sgl_waiting.add(v),
            "sglang:num_running_reqs" => self.sgl_running.add(v),
            "sglang:token_usage" => self.sgl_kv.add(v),
            "sglang:cache_config_info" => {
                self.sgl_block = (label_u32(s, "page_size"), label_u32(s, "num_pages"))
            }
            "trtllm_num_requests_waiting" => self.trt_waiting.add(v),
            "trtllm_num_requests_running" => self.trt_running.add(v),
            "trtllm_kv_cache_utilization" => self.trt_kv.add(v),
            "trtllm_kv_cache_tokens_per_block" => self.trt_block_size = value_u32(v),
            "trtllm_kv_cache_max_blocks" => self.trt_blocks = value_u32(v),
            "nv_trt_llm_request_metrics" => match s.label("request_type").as_deref() {
                Some("waiting") => self.triton_waiting.add(v),
                Some("scheduled") => self.triton_running.add(v),
                _ => {}
            },
            "nv_trt_llm_kv_cache_block_metrics" => {
                match s.label("kv_cache_block_type").as_deref() {
                    Some("fraction") => self.triton_kv.add(v),
                    Some("tokens_per") => self.triton_block_size = value_u32(v),
                    Some("max") => self.triton_blocks = value_u32(v),
                    _ => {}
                }
            }
            "nv_inference_pending_request_count" => self.triton_pending.add(v),
            "tgi_queue_size" => self.tgi_waiting.add(v),
            "tgi_batch_current_size" => self.tgi_running.add(v),
            "llamacpp:requests_deferred" => self.llama_waiting.add(v),
            "llamacpp:requests_processing" => self.llama_running.add(v),
            _ => {}
        }
    }

    fn vote(&mut self, name: &str) {
        if let Some(e) = engine_of(name) {
            if let Some(v) = self.votes.get_mut(engine_index(e)) {
                *v += 1;
            }
        }
    }

    /// The engine with the most names in the text; ties go to the earlier engine in wire order.
    fn detected(&self) -> Option<Engine> {
        let mut best: Option<(Engine, u32)> = None;
        for (e, &n) in Engine::ALL.iter().zip(&self.votes) {
            if n > 0 && best.is_none_or(|(_, b)| n > b) {
                best = Some((*e, n));
            }
        }
        best.map(|(e, _)| e)
    }
}

/// Options for [`normalise`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// The configured engine; `None` (or `Some(Unknown)`) detects it from the names.
    pub engine: Option<Engine>,
    /// Collect model names and every bad line (the `parse` command); the scrape loop skips it.
    pub detailed: bool,
}

/// Reads one pod's exposition text.
pub fn normalise(text: &str, opts: Options) -> Result<PodMetrics, NormaliseError> {
    let configured = opts.engine.filter(|e| *e != Engine::Unknown);
    let Pass {
        mut acc,
        bad_lines,
        bad_count,
    } = read(text, configured.is_none(), opts.detailed);
    // In fast mode skipped samples are not voted on; detection still sees every HELP/TYPE line
    // and every wanted sample, which is enough for all known engines.
    let engine = match configured.or_else(|| acc.detected()) {
        Some(e) => e,
        None => {
            return Err(NormaliseError::UnknownEngine {
                bad_lines: bad_count,
                first_bad: bad_lines.first().map(|e| e.line),
            })
        }
    };
    let f = acc.figures(engine);
    if f.waiting.is_none() && f.running.is_none() && f.kv.is_none() {
        return Err(NormaliseError::NoLoadGauges {
            engine: engine.name(),
            expected: load_gauges(engine),
        });
    }
    let missing = [
        ("waiting", f.waiting.is_none()),
        ("running", f.running.is_none()),
        ("kv_usage", f.kv.is_none()),
    ];
    Ok(PodMetrics {
        engine,
        engine_detected: configured.is_none(),
        waiting: f.waiting.unwrap_or(0),
        running: f.running.unwrap_or(0),
        kv_usage: f.kv.map(|k| k as f32),
        block_size: f.block_size,
        num_blocks: f.num_blocks,
        lora: f.lora,
        models: acc.models.iter().cloned().collect(),
        missing: missing
            .iter()
            .filter(|(_, m)| *m)
            .map(|(n, _)| *n)
            .collect(),
        bad_lines,
    })
}

/// What one pass over a text found.
struct Pass {
    acc: Acc,
    /// Every bad line in detailed mode, else only the first.
    bad_lines: Vec<LineError>,
    bad_count: usize,
}

/// The pass over the text: wanted samples accumulated, the engine voted on (`detect`), bad
/// lines counted; `detailed` reads every sample in full (so every bad line is reported) and
/// collects model names.
fn read(text: &str, detect: bool, detailed: bool) -> Pass {
    let mut acc = Acc::default();
    let mut bad_lines = Vec::new();
    let mut bad_count = 0usize;
    prom::for_each_line(
        text,
        |name| {
            // In detailed mode every sample is checked so that every bad line is reported.
            detailed || wanted(name)
        },
        |line| match line {
            Line::Sample(s) => {
                if detect {
                    acc.vote(s.name);
                }
                if wanted(s.name) {
                    acc.sample(&s, detailed);
                }
            }
            Line::Meta { name } => {
                if detect {
                    acc.vote(name)
                }
            }
            Line::Skip | Line::Eof | Line::Unwanted { .. } => {}
        },
        |e| {
            bad_count += 1;
            if detailed || bad_lines.is_empty() {
                bad_lines.push(e);
            }
        },
    );
    Pass {
        acc,
        bad_lines,
        bad_count,
    }
}

/// One engine's figures, taken from its own gauges in [`Acc`].
#[derive(Default)]
struct Figures {
    waiting: Option<u32>,
    running: Option<u32>,
    kv: Option<f64>,
    block_size: u32,
    num_blocks: u32,
    lora: Option<LoraState>,
}

/// The load gauges each engine should export, named when a text carries none of them.
const LOAD_GAUGES: [(Engine, &str); 6] = [
    (
        Engine::Vllm,
        "vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc",
    ),
    (
        Engine::Sglang,
        "sglang:num_queue_reqs, sglang:num_running_reqs, sglang:token_usage",
    ),
    (
        Engine::TrtllmServe,
        "trtllm_num_requests_waiting, trtllm_num_requests_running, trtllm_kv_cache_utilization",
    ),
    (
        Engine::TritonTrtllm,
        "nv_trt_llm_request_metrics{request_type=\"waiting\"|\"scheduled\"}, nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"}, nv_inference_pending_request_count",
    ),
    (Engine::Tgi, "tgi_queue_size, tgi_batch_current_size"),
    (
        Engine::LlamaCpp,
        "llamacpp:requests_deferred, llamacpp:requests_processing",
    ),
];

fn load_gauges(engine: Engine) -> &'static str {
    LOAD_GAUGES
        .iter()
        .find(|(e, _)| *e == engine)
        .map_or("none", |(_, names)| names)
}

impl Acc {
    /// The figures of `engine`: its gauges' sums and highest KV use, its cache geometry, and
    /// (vLLM) its LoRA residency.
    fn figures(&mut self, engine: Engine) -> Figures {
        match engine {
            Engine::Vllm => Figures {
                waiting: self.vllm_waiting.count(),
                running: self.vllm_running.count(),
                kv: self.vllm_kv_new.value.or(self.vllm_kv_old.value),
                block_size: self.vllm_block.0,
                num_blocks: self.vllm_block.1,
                lora: self.vllm_lora.take().map(|(_, l)| l),
            },
            Engine::Sglang => Figures {
                waiting: self.sgl_waiting.count(),
                running: self.sgl_running.count(),
                kv: self.sgl_kv.value,
                block_size: self.sgl_block.0,
                num_blocks: self.sgl_block.1,
                lora: None,
            },
            Engine::TrtllmServe => Figures {
                waiting: self.trt_waiting.count(),
                running: self.trt_running.count(),
                kv: self.trt_kv.value,
                block_size: self.trt_block_size.unwrap_or(0),
                num_blocks: self.trt_blocks.unwrap_or(0),
                lora: None,
            },
            Engine::TritonTrtllm => Figures {
                waiting: self.triton_waiting.count().or(self.triton_pending.count()),
                running: self.triton_running.count(),
                kv: self.triton_kv.value,
                block_size: self.triton_block_size.unwrap_or(0),
                num_blocks: self.triton_blocks.unwrap_or(0),
                lora: None,
            },
            Engine::Tgi => Figures {
                waiting: self.tgi_waiting.count(),
                running: self.tgi_running.count(),
                ..Figures::default()
            },
            Engine::LlamaCpp => Figures {
                waiting: self.llama_waiting.count(),
                running: self.llama_running.count(),
                ..Figures::default()
            },
            Engine::Unknown => Figures::default(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn wanted_table_matches_the_fast_check() {
        for (name, e) in WANTED {
            assert!(wanted(name), "{name}");
            assert_eq!(engine_of(name), Some(e), "{name}");
        }
        assert!(!wanted("vllm:num_requests_waiting_x"));
    }

    #[test]
    fn adapter_lists_stay_encodable() {
        let long = "x".repeat(256);
        let many: Vec<String> = (0..2000).map(|i| format!("a{i}")).collect();
        let text = format!(
            "vllm:lora_requests_info{{max_lora=\"99999\",running_lora_adapters=\"ok,{long}\",waiting_lora_adapters=\"{}\"}} 1\nvllm:num_requests_waiting 0\n",
            many.join(",")
        );
        let m = normalise(&text, Options::default()).expect("ok");
        let l = m.lora.expect("lora");
        assert_eq!(l.running, vec!["ok"]);
        assert_eq!(l.waiting.len(), llm_router_snapshot::MAX_ADAPTERS);
        assert_eq!(l.max_loras, u16::MAX - 1);
    }

    #[test]
    fn name_filter_query_per_engine() {
        let q = name_filter_query(Some(Engine::Sglang));
        assert_eq!(
            q,
            "name%5B%5D=sglang%3Anum_queue_reqs&name%5B%5D=sglang%3Anum_running_reqs&\
             name%5B%5D=sglang%3Atoken_usage&name%5B%5D=sglang%3Acache_config_info"
        );
        assert_eq!(
            name_filter_query(None).matches("name%5B%5D=").count(),
            WANTED.len()
        );
    }
}
