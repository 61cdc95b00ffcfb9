//! `/metrics` text in the Prometheus exposition format, with vLLM's or SGLang's names and labels.
//!
//! The layout copies what vLLM (V1, `prometheus_client`) prints: `# HELP`/`# TYPE` per family,
//! label names sorted, floats printed the way `prometheus_client` prints them (`3.0`,
//! `1.7382173358407154e+09`), counters followed by their `_created` gauge families, and
//! `vllm:lora_requests_info` as one series per label set whose value is the time it was last
//! set (so readers must take the newest series). See `test-harness/fixtures/metrics/` for the
//! samples.

use std::fmt::Write as _;

/// vLLM's TTFT histogram bounds (`vllm/v1/metrics/loggers.py`).
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's end-to-end latency histogram bounds.
pub const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A cumulative histogram like `prometheus_client`'s.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// Empty histogram with upper bounds `bounds` (ascending; `+Inf` is implied).
    pub fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// A histogram from cumulative `counts` (one per bound), `sum` and `count`.
    pub fn from_parts(bounds: &[f64], counts: Vec<u64>, sum: f64, count: u64) -> Self {
        let mut counts = counts;
        counts.resize(bounds.len(), count);
        Histogram {
            bounds: bounds.to_vec(),
            counts,
            sum,
            count,
        }
    }

    /// Records one value. Non-finite values are ignored.
    pub fn observe(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        for (b, c) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    /// Observations.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of observations.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// (upper bound, cumulative count) pairs, without `+Inf`.
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.bounds.iter().copied().zip(self.counts.iter().copied())
    }
}

/// Which server's metric names to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// vLLM (`vllm:` names).
    Vllm,
    /// SGLang (`sglang:` names).
    Sglang,
}

/// Which KV-usage gauge name vLLM prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvMetricName {
    /// `vllm:kv_cache_usage_perc` (vLLM ≥ 0.10).
    New,
    /// `vllm:gpu_cache_usage_perc` (older vLLM).
    Old,
    /// Both.
    Both,
}

/// Everything `/metrics` prints, gathered under the pod's lock and rendered after.
#[derive(Debug, Clone)]
pub struct MetricsView {
    /// Served model name (`model_name` label).
    pub model: String,
    /// Running requests.
    pub running: f64,
    /// Waiting requests.
    pub waiting: f64,
    /// KV usage 0..=1.
    pub kv_usage: f64,
    /// KV blocks in use.
    pub used_blocks: u64,
    /// Tokens per block.
    pub block_size: u32,
    /// Blocks in the cache.
    pub num_gpu_blocks: u32,
    /// Adapter slots.
    pub max_lora: usize,
    /// LoRA label sets seen, oldest first: (running, waiting, unix time last set).
    pub lora_series: Vec<(String, String, f64)>,
    /// Prompt tokens counter.
    pub prompt_tokens: u64,
    /// Generation tokens counter.
    pub generation_tokens: u64,
    /// Prefix cache queries (tokens).
    pub prefix_queries: u64,
    /// Prefix cache hits (tokens).
    pub prefix_hits: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Requests finished by stop.
    pub finished_stop: u64,
    /// Requests finished by length.
    pub finished_length: u64,
    /// Requests aborted.
    pub finished_abort: u64,
    /// TTFT histogram.
    pub ttft: Histogram,
    /// E2E histogram.
    pub e2e: Histogram,
    /// LoRA adapters loaded so far (emulator extra: `model_sim:lora_loads_total`).
    pub lora_loads: u64,
    /// Of those, read from disk (`model_sim:lora_disk_loads_total`).
    pub lora_disk_loads: u64,
    /// Engine steps run (`model_sim:steps_total`).
    pub steps: u64,
    /// Σ step lateness, wall seconds (`model_sim:step_lateness_seconds_sum`).
    pub step_lateness_sum: f64,
    /// Largest step lateness since start/reset (`model_sim:step_lateness_seconds_max`).
    pub step_lateness_max: f64,
    /// Peak KV usage since start/reset (`model_sim:kv_usage_perc_max`).
    pub kv_usage_max: f64,
    /// ∫ KV usage dt, seconds (`model_sim:kv_usage_perc_seconds_sum`).
    pub kv_usage_seconds: f64,
    /// Peak waiting queue since start/reset (`model_sim:num_requests_waiting_max`).
    pub waiting_max: f64,
    /// Recent generation throughput (tokens/s), for SGLang's `gen_throughput`.
    pub gen_throughput: f64,
    /// Unix time the pod started (the `_created` values).
    pub created: f64,
}

/// The view of a live engine. `lora_series` is the LoRA label history (last = current).
pub fn engine_view(
    model: &str,
    engine: &crate::engine::Engine,
    lora_series: Vec<(String, String, f64)>,
    gen_throughput: f64,
    created: f64,
) -> MetricsView {
    let st = engine.state();
    let s = engine.stats();
    let p = engine.profile();
    MetricsView {
        model: model.to_string(),
        running: f64::from(st.running),
        waiting: f64::from(st.waiting),
        kv_usage: st.kv_usage,
        used_blocks: u64::from(st.used_blocks),
        block_size: p.block_size,
        num_gpu_blocks: p.num_gpu_blocks,
        max_lora: engine.max_loras(),
        lora_series,
        prompt_tokens: s.prompt_tokens,
        generation_tokens: s.generation_tokens,
        prefix_queries: s.prefix_queries,
        prefix_hits: s.prefix_hits,
        preemptions: s.preemptions,
        finished_stop: s.finished_stop,
        finished_length: s.finished_length,
        finished_abort: s.aborted,
        ttft: s.ttft.clone(),
        e2e: s.e2e.clone(),
        lora_loads: engine.lora_loads(),
        lora_disk_loads: engine.lora_disk_loads(),
        steps: s.steps,
        step_lateness_sum: 0.0,
        step_lateness_max: 0.0,
        kv_usage_max: s.kv_usage_max,
        kv_usage_seconds: s.kv_usage_seconds,
        waiting_max: f64::from(s.waiting_max),
        gen_throughput,
        created,
    }
}

/// Formats a float as Python's `prometheus_client.utils.floatToGoString` does.
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v == f64::INFINITY {
        return "+Inf".into();
    }
    if v == f64::NEG_INFINITY {
        return "-Inf".into();
    }
    let s = format!("{v:?}");
    if v > 0.0 {
        if let Some(dot) = s.find('.') {
            if dot > 6 && !s.contains('e') {
                let mantissa = format!("{}.{}{}", &s[..1], &s[1..dot], &s[dot + 1..]);
                let mantissa = mantissa.trim_end_matches(['0', '.']);
                return format!("{mantissa}e+0{}", dot - 1);
            }
        }
    }
    s
}

fn esc(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out {
    s: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.s, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        let mut labels: Vec<(&str, &str)> = labels.to_vec();
        labels.sort_by(|a, b| a.0.cmp(b.0));
        self.s.push_str(name);
        if !labels.is_empty() {
            self.s.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.s.push(',');
                }
                let _ = write!(self.s, "{k}=\"{}\"", esc(val));
            }
            self.s.push('}');
        }
        let _ = writeln!(self.s, " {}", go_float(v));
    }
    fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: f64) {
        self.family(name, "gauge", help);
        self.sample(name, labels, v);
    }
    fn counter(&mut self, base: &str, help: &str, labels: &[(&str, &str)], v: f64, created: f64) {
        let total = format!("{base}_total");
        self.family(&total, "counter", help);
        self.sample(&total, labels, v);
        let c = format!("{base}_created");
        self.family(&c, "gauge", help);
        self.sample(&c, labels, created);
    }
    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        h: &Histogram,
        sum_first: bool,
    ) {
        self.family(name, "histogram", help);
        let sum_name = format!("{name}_sum");
        if sum_first {
            self.sample(&sum_name, labels, h.sum());
        }
        let bucket = format!("{name}_bucket");
        for (le, c) in h.buckets() {
            let le = go_float(le);
            let mut l = labels.to_vec();
            l.push(("le", &le));
            self.sample(&bucket, &l, c as f64);
        }
        let mut l = labels.to_vec();
        l.push(("le", "+Inf"));
        self.sample(&bucket, &l, h.count() as f64);
        self.sample(&format!("{name}_count"), labels, h.count() as f64);
        if !sum_first {
            self.sample(&sum_name, labels, h.sum());
        }
    }
}

/// Renders `view` as vLLM (V1 engine) prints it.
pub fn render_vllm(view: &MetricsView, kv_name: KvMetricName) -> String {
    let mut o = Out {
        s: String::with_capacity(8192),
    };
    let m = view.model.as_str();
    let l: &[(&str, &str)] = &[("engine", "0"), ("model_name", m)];
    o.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        l,
        view.running,
    );
    o.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        l,
        view.waiting,
    );
    if matches!(kv_name, KvMetricName::New | KvMetricName::Both) {
        o.gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            l,
            view.kv_usage,
        );
    }
    if matches!(kv_name, KvMetricName::Old | KvMetricName::Both) {
        o.gauge(
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage.",
            l,
            view.kv_usage,
        );
    }
    let c = view.created;
    o.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        l,
        view.prefix_queries as f64,
        c,
    );
    o.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        l,
        view.prefix_hits as f64,
        c,
    );
    o.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        l,
        view.preemptions as f64,
        c,
    );
    o.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        l,
        view.prompt_tokens as f64,
        c,
    );
    o.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        l,
        view.generation_tokens as f64,
        c,
    );
    o.family(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
    );
    for (reason, v) in [
        ("stop", view.finished_stop),
        ("length", view.finished_length),
        ("abort", view.finished_abort),
    ] {
        o.sample(
            "vllm:request_success_total",
            &[
                ("engine", "0"),
                ("finished_reason", reason),
                ("model_name", m),
            ],
            v as f64,
        );
    }
    o.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        l,
        &view.ttft,
        false,
    );
    o.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        l,
        &view.e2e,
        false,
    );
    let bs = view.block_size.to_string();
    let nb = view.num_gpu_blocks.to_string();
    o.gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        &[
            ("block_size", &bs),
            ("cache_dtype", "auto"),
            ("calculate_kv_scales", "False"),
            ("cpu_offload_gb", "0"),
            ("enable_prefix_caching", "True"),
            ("engine", "0"),
            ("gpu_memory_utilization", "0.9"),
            ("is_attention_free", "False"),
            ("num_cpu_blocks", "None"),
            ("num_gpu_blocks", &nb),
            ("num_gpu_blocks_override", "None"),
            ("prefix_caching_hash_algo", "sha256"),
            ("sliding_window", "None"),
            ("swap_space", "4"),
        ],
        1.0,
    );
    o.family(
        "vllm:lora_requests_info",
        "gauge",
        "Running stats on lora requests.",
    );
    let max_lora = view.max_lora.to_string();
    for (run, wait, ts) in &view.lora_series {
        o.sample(
            "vllm:lora_requests_info",
            &[
                ("max_lora", &max_lora),
                ("running_lora_adapters", run),
                ("waiting_lora_adapters", wait),
            ],
            *ts,
        );
    }
    emulator_extras(&mut o, view);
    o.s
}

/// Not vLLM metrics: what benchmarks need to judge a run (`model_sim:` marks them as the
/// emulator's): adapter loads (any source, and from disk), engine steps and how late they
/// ended on the wall clock, peak and integrated KV usage, peak queue. `_max` gauges restart at
/// `POST /admin/stats/reset`; counters never do.
fn emulator_extras(o: &mut Out, view: &MetricsView) {
    let l: &[(&str, &str)] = &[("model_name", &view.model)];
    let items: [(&str, &str, &str, f64); 8] = [
        (
            "model_sim:lora_loads_total",
            "counter",
            "LoRA adapters put into GPU slots, from CPU cache or disk (emulator only).",
            view.lora_loads as f64,
        ),
        (
            "model_sim:lora_disk_loads_total",
            "counter",
            "LoRA adapters read from disk, i.e. not in the CPU cache (emulator only).",
            view.lora_disk_loads as f64,
        ),
        (
            "model_sim:steps_total",
            "counter",
            "Engine steps run (emulator only).",
            view.steps as f64,
        ),
        (
            "model_sim:step_lateness_seconds_sum",
            "counter",
            "Sum over steps of wall seconds a step ended after its planned end (emulator only).",
            view.step_lateness_sum,
        ),
        (
            "model_sim:step_lateness_seconds_max",
            "gauge",
            "Largest step lateness since start or stats reset, wall seconds (emulator only).",
            view.step_lateness_max,
        ),
        (
            "model_sim:kv_usage_perc_max",
            "gauge",
            "Peak KV-cache usage since start or stats reset, 0..1 (emulator only).",
            view.kv_usage_max,
        ),
        (
            "model_sim:kv_usage_perc_seconds_sum",
            "counter",
            "Integral of KV-cache usage over wall seconds (emulator only).",
            view.kv_usage_seconds,
        ),
        (
            "model_sim:num_requests_waiting_max",
            "gauge",
            "Peak waiting queue since start or stats reset (emulator only).",
            view.waiting_max,
        ),
    ];
    for (name, kind, help, v) in items {
        o.family(name, kind, help);
        o.sample(name, l, v);
    }
}

/// SGLang's histogram bounds for TTFT.
const SGLANG_TTFT: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    15.0, 20.0, 25.0, 30.0,
];
/// SGLang's histogram bounds for end-to-end latency.
const SGLANG_E2E: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
];

fn rebucket(h: &Histogram, bounds: &[f64]) -> Histogram {
    // Cumulative counts at the nearest source bound not above each target bound.
    let src: Vec<(f64, u64)> = h.buckets().collect();
    let mut out = Histogram::new(bounds);
    for (i, b) in bounds.iter().enumerate() {
        out.counts[i] = src
            .iter()
            .filter(|(le, _)| *le <= *b + 1e-12)
            .map(|(_, c)| *c)
            .max()
            .unwrap_or(0);
    }
    out.sum = h.sum();
    out.count = h.count();
    out
}

/// Renders `view` with SGLang's names (`--engine sglang`).
pub fn render_sglang(view: &MetricsView) -> String {
    let mut o = Out {
        s: String::with_capacity(6144),
    };
    let m = view.model.as_str();
    let l: &[(&str, &str)] = &[("engine_type", "unified"), ("model_name", m)];
    o.family(
        "sglang:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
    );
    o.sample("sglang:prompt_tokens_total", l, view.prompt_tokens as f64);
    o.family(
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
    );
    o.sample(
        "sglang:generation_tokens_total",
        l,
        view.generation_tokens as f64,
    );
    o.gauge(
        "sglang:num_running_reqs",
        "The number of running requests.",
        l,
        view.running,
    );
    o.gauge(
        "sglang:num_used_tokens",
        "The number of used tokens.",
        l,
        (view.used_blocks * u64::from(view.block_size)) as f64,
    );
    o.gauge("sglang:token_usage", "The token usage.", l, view.kv_usage);
    o.gauge(
        "sglang:gen_throughput",
        "The generation throughput (token/s).",
        l,
        view.gen_throughput,
    );
    o.gauge(
        "sglang:num_queue_reqs",
        "The number of requests in the waiting queue.",
        l,
        view.waiting,
    );
    let hit_rate = if view.prefix_queries > 0 {
        view.prefix_hits as f64 / view.prefix_queries as f64
    } else {
        0.0
    };
    o.gauge(
        "sglang:cache_hit_rate",
        "The prefix cache hit rate.",
        l,
        hit_rate,
    );
    let ps = view.block_size.to_string();
    let np = view.num_gpu_blocks.to_string();
    o.gauge(
        "sglang:cache_config_info",
        "Information of the cache configuration.",
        &[("num_pages", &np), ("page_size", &ps)],
        1.0,
    );
    o.histogram(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        l,
        &rebucket(&view.ttft, SGLANG_TTFT),
        true,
    );
    o.histogram(
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        l,
        &rebucket(&view.e2e, SGLANG_E2E),
        true,
    );
    emulator_extras(&mut o, view);
    o.s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_prometheus_client() {
        assert_eq!(go_float(0.0), "0.0");
        assert_eq!(go_float(3.0), "3.0");
        assert_eq!(go_float(27453.0), "27453.0");
        assert_eq!(go_float(1738217335.8407154), "1.7382173358407154e+09");
        assert_eq!(go_float(8128902.0), "8.128902e+06");
        assert_eq!(go_float(0.25), "0.25");
        assert_eq!(go_float(f64::INFINITY), "+Inf");
    }

    #[test]
    fn histogram_is_cumulative() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);
        h.observe(f64::NAN);
        let b: Vec<(f64, u64)> = h.buckets().collect();
        assert_eq!(b, vec![(0.1, 1), (1.0, 2)]);
        assert_eq!(h.count(), 3);
        let r = rebucket(&h, &[0.5, 1.0, 2.0]);
        assert_eq!(r.buckets().map(|x| x.1).collect::<Vec<_>>(), vec![1, 2, 2]);
    }
}
