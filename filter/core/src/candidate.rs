//! A pod and a request as the ranking sees them ([`Candidate`], [`Features`]) and how much it
//! can trust the metrics ([`Mode`]): what scoring ([`crate::score`]), the bounds on what a pod
//! can claim ([`crate::trust`]) and admission ([`crate::flow::admit`]) all read.

use crate::lora::Placement;
use crate::predict::Rate;

/// One pod as the ranking sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate<'a> {
    pub address: &'a str,
    /// Metrics are old (the sidecar marked the pod stale): ranked below fresh pods.
    pub stale: bool,
    pub waiting: u32,
    pub running: u32,
    pub kv_usage: Option<f32>,
    /// This proxy's requests in flight to the pod now …
    pub in_flight: u32,
    /// … and when the snapshot was accepted; the difference is load the snapshot cannot show.
    pub in_flight_baseline: u32,
    /// Estimated prompt tokens this proxy sent there that have no first response byte yet.
    pub pending_tokens: u32,
    /// Other gateway replicas' requests in flight there, and their prompt tokens without a
    /// first byte yet, as a metrics hub merged their tallies (`Pod::peers`; 0 without a hub,
    /// and with a stale snapshot). Tens of ms old at most; this proxy's own never included.
    pub peer_in_flight: u32,
    pub peer_pending_tokens: u32,
    /// The pod's prefill rate: its own learned one, or the pool's.
    pub rate: Rate,
    /// Leading prompt blocks the pod probably has cached.
    pub prefix_blocks: u32,
    /// Where the request's adapter stands on this pod (default when no adapter).
    pub lora: Placement,
    /// What the adapter costs on this pod, in ms: a load where it is not resident, and the
    /// price of leaving its home (an eviction and a reload later) elsewhere.
    pub adapter_ms: f64,
    /// The pod's report contradicts this proxy's own count ([`crate::trust::contradicted`]):
    /// its gauges were replaced by its peers' and it may hold no more than a fair share of
    /// this proxy's in-flight requests ahead of pods that are not contradicted.
    pub contradicted: bool,
    /// A run of server errors from the pod ended less than [`crate::inflight::EJECT_MS`] ago
    /// ([`crate::inflight::PodLoad::ejected`]): ranked after every pod that is not, whatever it
    /// reports (at most half of a pool is put back this way).
    pub ejected: bool,
}

impl Candidate<'_> {
    fn delta(&self) -> i64 {
        i64::from(self.in_flight) - i64::from(self.in_flight_baseline)
    }

    /// Waiting requests, corrected by what this proxy sent or saw finish since the snapshot.
    pub fn est_waiting(&self) -> f64 {
        (i64::from(self.waiting) + self.delta()).max(0) as f64
    }

    /// Running + waiting, corrected the same way, and never below the requests every gateway
    /// replica has in flight there (which the engine holds, whatever it reported earlier).
    pub fn est_load(&self) -> f64 {
        let reported = (i64::from(self.waiting) + i64::from(self.running) + self.delta()).max(0);
        let known = i64::from(self.in_flight) + i64::from(self.peer_in_flight);
        reported.max(known) as f64
    }

    /// Prefill work queued on the pod, in tokens: the pending prompts of this proxy and of the
    /// other replicas that report to a hub, or the engine's waiting requests at the pool's mean
    /// prompt size when that is more (work of proxies that report nothing).
    pub fn queued_tokens(&self, f: &Features<'_>, mode: Mode) -> f64 {
        let own = f64::from(self.pending_tokens);
        match mode {
            Mode::Full => (own + f64::from(self.peer_pending_tokens))
                .max(self.est_waiting() * f.mean_prefill_tokens),
            Mode::LeastInflight => own,
        }
    }

    /// Tokens of this request the pod would have to prefill (its cached prefix excluded).
    pub fn uncached_tokens(&self, f: &Features<'_>) -> f64 {
        f.uncached_tokens(self.prefix_blocks)
    }

    /// Predicted time to first token of this request on this pod (ms).
    pub fn predicted_ttft_ms(&self, f: &Features<'_>, mode: Mode) -> f64 {
        self.rate
            .ttft_ms(self.queued_tokens(f, mode) + self.uncached_tokens(f))
            + self.adapter_ms.max(0.0)
    }
}

/// What of the request matters to scoring.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Features<'a> {
    /// LoRA adapter the request needs, if any.
    pub adapter: Option<&'a str>,
    /// Estimated prompt tokens.
    pub prompt_tokens: u32,
    /// Blocks the prompt was cut into (0: no prefix scoring).
    pub prompt_blocks: u32,
    /// The prompt runs past its hashed blocks (`prefix.max_blocks`): what a pod holds beyond
    /// them is unknown.
    pub truncated: bool,
    /// Tokens per prefix block (block characters ÷ characters per token).
    pub tokens_per_block: f64,
    /// The pool's mean prefill tokens per request (turns waiting requests into work; 0 = unknown).
    pub mean_prefill_tokens: f64,
    /// Candidate that every gateway replica picks as the home of this prompt's key.
    pub home: Option<usize>,
    /// < 0 sheddable, 0 standard, > 0 critical (never shed).
    pub priority: i32,
    /// Random bits to break exact ties.
    pub tie: u64,
}

impl Features<'_> {
    /// Tokens of this request left to prefill on a pod that holds its first `cached_blocks`.
    ///
    /// A pod holding every hashed block of a prompt that runs past them is taken to hold the
    /// rest too (nothing is left to prefill): the prompts that reached it through the same
    /// blocks were most likely the same long document or history. Counting the unhashed rest
    /// as uncached there would queue phantom prefill on the one pod that has the context, and
    /// teach its rate from warm requests taken for long prefills (seen: fitted costs 4× too
    /// low on the bench's shared-prefix documents, which run past the default 256 blocks).
    pub fn uncached_tokens(&self, cached_blocks: u32) -> f64 {
        if self.truncated && self.prompt_blocks > 0 && cached_blocks >= self.prompt_blocks {
            return 0.0;
        }
        let prompt = f64::from(self.prompt_tokens);
        (prompt - f64::from(cached_blocks) * self.tokens_per_block).max(0.0)
    }
}

/// How much the ranking can trust the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Fresh snapshot: every scorer and saturation checks.
    Full,
    /// Stale snapshot: only this proxy's own data (in-flight counts, pending work, learned
    /// rates, prefix and adapter history); never sheds.
    LeastInflight,
}
