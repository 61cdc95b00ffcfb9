//! The engine model: a pure, clock-injected emulation of vLLM's V1 scheduler on a GPU.
//!
//! Time is a plain `f64` of seconds passed in by the caller, so tests drive it step by step
//! without sleeping and the server drives it with a real clock. One engine step:
//! 1. running sequences first (oldest first): each gets the tokens it still has to compute
//!    (1 for a decode, a chunk for a prefill) within the step's token budget; when a sequence
//!    needs a new KV block and none is free, the newest running sequence is preempted back to
//!    the head of the waiting queue and recomputed later (vLLM's recompute preemption);
//! 2. then, unless something was preempted, waiting requests are admitted FCFS while
//!    `max_num_seqs`, the token budget and free KV blocks allow; cached prefix blocks are taken
//!    from the prefix cache and skip prefill; a request whose LoRA adapter is not resident and
//!    cannot get a slot is skipped (it keeps its place) so later requests may pass it;
//! 3. the step lasts `base + decodes × per-seq + prefill tokens × per-token + prefill attention
//!    pairs × attention + context tokens × kv-read + adapter loads × load time`
//!    ([`crate::profile::Profile`]); an adapter in the CPU cache swaps in cheaply, one that is
//!    not is read from disk;
//! 4. when it ends, every sequence that caught up with its tokens samples one new token.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::kv::{BlockId, KvCache};
use crate::lora::{Load, LoraSlots};
use crate::metrics::{Histogram, E2E_BUCKETS, TTFT_BUCKETS};
use crate::profile::Profile;

/// Request id inside one engine.
pub type ReqId = u64;

/// A request as the engine sees it: token counts, prefix block hashes and an adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRequest {
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Tokens this request will generate before it stops (≤ `max_tokens`).
    pub output_tokens: u32,
    /// The request's `max_tokens`; `output_tokens == max_tokens` finishes with `length`.
    pub max_tokens: u32,
    /// Chained hashes of the prompt's full blocks (see `prompt::block_hashes`).
    pub block_hashes: Vec<u64>,
    /// LoRA adapter, `None` for the base model.
    pub adapter: Option<Arc<str>>,
}

/// Why a request was refused at submission.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// Prompt plus output exceed the model's context window.
    #[error("This model's maximum context length is {max} tokens. However, you requested {requested} tokens ({prompt} in the messages, {output} in the completion). Please reduce the length of the messages or completion.")]
    TooLong {
        /// Context window.
        max: u32,
        /// Prompt + max_tokens.
        requested: u64,
        /// Prompt tokens.
        prompt: u32,
        /// Requested output tokens.
        output: u32,
    },
    /// The request could never fit in the KV cache.
    #[error("request needs {blocks} KV blocks but the cache holds only {capacity}")]
    TooBigForKv {
        /// Blocks needed.
        blocks: u32,
        /// Blocks in the cache.
        capacity: u32,
    },
    /// LoRA is disabled on this pod (`max_loras` = 0).
    #[error("The model `{adapter}` does not exist.")]
    NoLora {
        /// Adapter that was asked for.
        adapter: String,
    },
}

/// Why a sequence finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Emulated end-of-sequence before `max_tokens`.
    Stop,
    /// Reached `max_tokens`.
    Length,
}

impl FinishReason {
    /// OpenAI / vLLM spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token accounting returned with a finished request (the `usage` block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: u32,
}

/// Something the engine tells the request's owner at the end of a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The request produced its `index`-th output token (1-based).
    Token {
        /// Request.
        id: ReqId,
        /// 1-based index of the token.
        index: u32,
        /// Whether this is the last token.
        last: bool,
    },
    /// The request is done; always follows its last `Token`.
    Finished {
        /// Request.
        id: ReqId,
        /// Why it stopped.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
        /// Time to first token (seconds, engine clock).
        ttft: f64,
        /// Arrival to finish (seconds, engine clock).
        e2e: f64,
    },
}

/// Cumulative counters and histograms, named after the vLLM metrics they feed.
#[derive(Debug, Clone)]
pub struct Stats {
    /// `vllm:prompt_tokens_total`.
    pub prompt_tokens: u64,
    /// `vllm:generation_tokens_total`.
    pub generation_tokens: u64,
    /// `vllm:prefix_cache_queries_total` (tokens).
    pub prefix_queries: u64,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub prefix_hits: u64,
    /// `vllm:num_preemptions_total`.
    pub preemptions: u64,
    /// `vllm:request_success_total{finished_reason="stop"}`.
    pub finished_stop: u64,
    /// `vllm:request_success_total{finished_reason="length"}`.
    pub finished_length: u64,
    /// Aborted requests (client went away).
    pub aborted: u64,
    /// Engine steps run.
    pub steps: u64,
    /// Peak KV usage (0..=1) since start or [`Engine::reset_peaks`].
    pub kv_usage_max: f64,
    /// Peak waiting-queue length since start or [`Engine::reset_peaks`].
    pub waiting_max: u32,
    /// ∫ KV usage dt over the engine clock (seconds), up to the last step event.
    pub kv_usage_seconds: f64,
    /// `vllm:time_to_first_token_seconds`.
    pub ttft: Histogram,
    /// `vllm:e2e_request_latency_seconds`.
    pub e2e: Histogram,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            prompt_tokens: 0,
            generation_tokens: 0,
            prefix_queries: 0,
            prefix_hits: 0,
            preemptions: 0,
            finished_stop: 0,
            finished_length: 0,
            aborted: 0,
            steps: 0,
            kv_usage_max: 0.0,
            waiting_max: 0,
            kv_usage_seconds: 0.0,
            ttft: Histogram::new(TTFT_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
        }
    }
}

#[derive(Debug)]
struct Seq {
    req: NewRequest,
    arrival: f64,
    generated: u32,
    computed: u32,
    blocks: Vec<BlockId>,
    registered: u32,
    first_token_at: Option<f64>,
    cached_tokens: Option<u32>,
}

impl Seq {
    fn num_tokens(&self) -> u32 {
        self.req.prompt_tokens + self.generated
    }
}

#[derive(Debug)]
struct Scheduled {
    id: ReqId,
    tokens: u32,
}

/// One pod's engine.
#[derive(Debug)]
pub struct Engine {
    profile: Profile,
    kv: KvCache,
    lora: LoraSlots,
    seqs: HashMap<ReqId, Seq>,
    waiting: VecDeque<ReqId>,
    running: Vec<ReqId>,
    in_flight: Option<(f64, Vec<Scheduled>)>,
    next_id: ReqId,
    stats: Stats,
    last_step: Option<StepInfo>,
    /// Engine time up to which `stats.kv_usage_seconds` is integrated.
    kv_clock: f64,
}

/// What the last planned step contained (for tests and debugging).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepInfo {
    /// Sequences that decode one token.
    pub decodes: u32,
    /// Prefill tokens computed.
    pub prefill_tokens: u32,
    /// Σ over prefill tokens of the context each attends to (the quadratic part).
    pub attention_pairs: u64,
    /// Adapters put in a GPU slot in this step (from CPU or disk).
    pub lora_loads: u32,
    /// Of those, adapters read from disk.
    pub lora_disk_loads: u32,
    /// Step duration (seconds).
    pub duration: f64,
}

/// Gauges of the engine at one moment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineState {
    /// Requests in the running batch.
    pub running: u32,
    /// Requests in the waiting queue.
    pub waiting: u32,
    /// Fraction of KV blocks in use.
    pub kv_usage: f64,
    /// KV blocks in use.
    pub used_blocks: u32,
    /// Prompt tokens of the waiting requests.
    pub waiting_tokens: u64,
    /// Adapters of running requests, sorted.
    pub running_adapters: Vec<String>,
    /// Adapters of waiting requests, sorted.
    pub waiting_adapters: Vec<String>,
    /// Adapters resident in GPU slots, least recently used first.
    pub resident_adapters: Vec<String>,
    /// Adapters in the CPU cache, least recently used first.
    pub cpu_adapters: Vec<String>,
}

impl Engine {
    /// An idle engine for `profile` with `max_loras` adapter slots (and a CPU cache of the
    /// same size, vLLM's default).
    pub fn new(profile: Profile, max_loras: usize) -> Self {
        Self::with_cpu_loras(profile, max_loras, max_loras)
    }

    /// An idle engine with `max_loras` GPU slots and a CPU cache of `max_cpu_loras` adapters.
    pub fn with_cpu_loras(profile: Profile, max_loras: usize, max_cpu_loras: usize) -> Self {
        Engine {
            kv: KvCache::new(profile.num_gpu_blocks, profile.block_size),
            lora: LoraSlots::new(max_loras, max_cpu_loras),
            kv_clock: 0.0,
            profile,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: None,
            next_id: 1,
            stats: Stats::default(),
            last_step: None,
        }
    }

    /// The profile this engine runs with.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Adapter slots.
    pub fn max_loras(&self) -> usize {
        self.lora.max()
    }

    /// CPU cache size for adapters.
    pub fn max_cpu_loras(&self) -> usize {
        self.lora.max_cpu()
    }

    /// Adapters put into a GPU slot so far (from CPU or disk).
    pub fn lora_loads(&self) -> u64 {
        self.lora.loads()
    }

    /// Adapters read from disk so far.
    pub fn lora_disk_loads(&self) -> u64 {
        self.lora.disk_loads()
    }

    /// Integrates KV usage up to `now` (engine clock; earlier times are ignored).
    fn account(&mut self, now: f64) {
        if now > self.kv_clock {
            self.stats.kv_usage_seconds += self.kv.usage() * (now - self.kv_clock);
            self.kv_clock = now;
        }
    }

    /// ∫ KV usage dt up to `now` (seconds of engine clock), without changing the engine.
    pub fn kv_usage_seconds_at(&self, now: f64) -> f64 {
        self.stats.kv_usage_seconds + self.kv.usage() * (now - self.kv_clock).max(0.0)
    }

    /// Restarts the peak gauges (`kv_usage_max`, `waiting_max`) from the current values.
    pub fn reset_peaks(&mut self) {
        self.stats.kv_usage_max = self.kv.usage();
        self.stats.waiting_max = self.waiting.len() as u32;
    }

    fn note_peaks(&mut self) {
        self.stats.kv_usage_max = self.stats.kv_usage_max.max(self.kv.usage());
        self.stats.waiting_max = self.stats.waiting_max.max(self.waiting.len() as u32);
    }

    /// Counters and histograms.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The last planned step.
    pub fn last_step(&self) -> Option<StepInfo> {
        self.last_step
    }

    /// Free KV blocks still holding a cached prefix.
    pub fn cached_free_blocks(&self) -> u32 {
        self.kv.num_cached_free()
    }

    /// Whether any request is queued or running.
    pub fn has_work(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// End time of the step in flight, if any.
    pub fn step_in_flight(&self) -> Option<f64> {
        self.in_flight.as_ref().map(|(end, _)| *end)
    }

    /// Queues a request that arrived at `now`.
    pub fn submit(&mut self, req: NewRequest, now: f64) -> Result<ReqId, SubmitError> {
        let requested = u64::from(req.prompt_tokens) + u64::from(req.max_tokens);
        if requested > u64::from(self.profile.max_model_len) {
            return Err(SubmitError::TooLong {
                max: self.profile.max_model_len,
                requested,
                prompt: req.prompt_tokens,
                output: req.max_tokens,
            });
        }
        let blocks = self
            .kv
            .blocks_for(req.prompt_tokens.saturating_add(req.output_tokens));
        if blocks > self.kv.num_blocks() {
            return Err(SubmitError::TooBigForKv {
                blocks,
                capacity: self.kv.num_blocks(),
            });
        }
        if let Some(a) = &req.adapter {
            if self.lora.max() == 0 {
                return Err(SubmitError::NoLora {
                    adapter: a.to_string(),
                });
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut req = req;
        req.output_tokens = req.output_tokens.clamp(1, req.max_tokens.max(1));
        self.seqs.insert(
            id,
            Seq {
                req,
                arrival: now,
                generated: 0,
                computed: 0,
                blocks: Vec::new(),
                registered: 0,
                first_token_at: None,
                cached_tokens: None,
            },
        );
        self.waiting.push_back(id);
        self.account(now);
        self.note_peaks();
        Ok(id)
    }

    /// Drops a request (its client went away). Returns whether it existed.
    pub fn abort(&mut self, id: ReqId) -> bool {
        let Some(seq) = self.seqs.remove(&id) else {
            return false;
        };
        self.kv.release(&seq.blocks);
        self.running.retain(|r| *r != id);
        self.waiting.retain(|r| *r != id);
        self.stats.aborted += 1;
        true
    }

    fn busy_adapters(&self) -> HashSet<&str> {
        self.running
            .iter()
            .filter_map(|id| self.seqs.get(id)?.req.adapter.as_deref())
            .collect()
    }

    fn preempt_newest(&mut self) -> Option<ReqId> {
        let victim = self.running.pop()?;
        if let Some(seq) = self.seqs.get_mut(&victim) {
            self.kv.release(&seq.blocks);
            seq.blocks.clear();
            seq.computed = 0;
            seq.registered = 0;
        }
        self.waiting.push_front(victim);
        self.stats.preemptions += 1;
        Some(victim)
    }

    fn grow(&mut self, id: ReqId, upto_tokens: u32) -> bool {
        let Some(seq) = self.seqs.get(&id) else {
            return false;
        };
        let need = self
            .kv
            .blocks_for(upto_tokens)
            .saturating_sub(seq.blocks.len() as u32);
        if need > self.kv.num_free() {
            return false;
        }
        let mut got = Vec::with_capacity(need as usize);
        for _ in 0..need {
            match self.kv.alloc() {
                Some(b) => got.push(b),
                None => break,
            }
        }
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.blocks.extend(got);
        }
        true
    }

    /// Plans the next step at `now` and returns when it ends; `None` when there is nothing to
    /// do. If a step is already in flight, returns its end time unchanged.
    pub fn begin_step(&mut self, now: f64) -> Option<f64> {
        if let Some((end, _)) = &self.in_flight {
            return Some(*end);
        }
        if self.seqs.is_empty() {
            return None;
        }
        self.account(now);
        let p = &self.profile;
        let mut budget = p.max_num_batched_tokens;
        let max_seqs = p.max_num_seqs as usize;
        let mut scheduled: Vec<Scheduled> = Vec::new();
        let mut preempted = false;

        // 1. Running sequences, oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(seq) = self.seqs.get(&id) else {
                self.running.remove(i);
                continue;
            };
            let n = (seq.num_tokens() - seq.computed).min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let upto = seq.computed + n;
            let mut self_preempted = false;
            while !self.grow(id, upto) {
                match self.preempt_newest() {
                    Some(v) => {
                        preempted = true;
                        if v == id {
                            self_preempted = true;
                            break;
                        }
                    }
                    None => {
                        self_preempted = true;
                        break;
                    }
                }
            }
            if self_preempted {
                break;
            }
            scheduled.push(Scheduled { id, tokens: n });
            budget -= n;
            i += 1;
        }

        // 2. Admission from the waiting queue.
        let mut lora_loads = 0u32;
        let mut lora_disk_loads = 0u32;
        if !preempted {
            let mut skipped: Vec<ReqId> = Vec::new();
            while budget > 0 && self.running.len() < max_seqs {
                let Some(id) = self.waiting.pop_front() else {
                    break;
                };
                let Some(seq) = self.seqs.get(&id) else {
                    continue;
                };
                let adapter = seq.req.adapter.clone();
                let mut needs_load = false;
                if let Some(a) = &adapter {
                    if !self.lora.is_resident(a) {
                        if !self.lora.can_load(&self.busy_adapters()) {
                            skipped.push(id);
                            continue;
                        }
                        needs_load = true;
                    }
                }
                let num_tokens = seq.num_tokens();
                let bs = self.kv.block_size();
                let (mut hits, mut hits_free) = self.kv.prefix_hits(&seq.req.block_hashes);
                // At least one token must be computed to sample from (vLLM does the same).
                while hits > 0 && hits * bs >= num_tokens {
                    hits -= 1;
                    hits_free = hits_free.min(hits);
                }
                let cached = hits * bs;
                let n = (num_tokens - cached).min(budget);
                let need_new = self.kv.blocks_for(cached + n) - hits;
                if need_new + hits_free > self.kv.num_free() {
                    self.waiting.push_front(id);
                    break;
                }
                if needs_load {
                    if let Some(a) = &adapter {
                        let busy: HashSet<&str> = self
                            .running
                            .iter()
                            .filter_map(|r| self.seqs.get(r)?.req.adapter.as_deref())
                            .collect();
                        let busy: HashSet<String> = busy.into_iter().map(str::to_string).collect();
                        let busy_ref: HashSet<&str> = busy.iter().map(String::as_str).collect();
                        match self.lora.load(a, &busy_ref) {
                            Some(Load::FromDisk) => {
                                lora_loads += 1;
                                lora_disk_loads += 1;
                            }
                            Some(Load::FromCpu) => lora_loads += 1,
                            Some(Load::Resident) | None => {}
                        }
                    }
                } else if let Some(a) = &adapter {
                    self.lora.touch(a);
                }
                let hashes: Vec<u64> = self.seqs.get(&id).map_or_else(Vec::new, |s| {
                    s.req
                        .block_hashes
                        .iter()
                        .take(hits as usize)
                        .copied()
                        .collect()
                });
                let mut blocks = Vec::with_capacity(self.kv.blocks_for(num_tokens) as usize);
                for h in hashes {
                    if let Some(b) = self.kv.acquire_cached(h) {
                        blocks.push(b);
                    }
                }
                for _ in 0..need_new {
                    if let Some(b) = self.kv.alloc() {
                        blocks.push(b);
                    }
                }
                self.stats.prefix_queries += u64::from(num_tokens);
                self.stats.prefix_hits += u64::from(cached);
                if let Some(seq) = self.seqs.get_mut(&id) {
                    seq.blocks = blocks;
                    seq.computed = cached;
                    seq.registered = hits;
                    if seq.cached_tokens.is_none() {
                        seq.cached_tokens = Some(cached);
                    }
                }
                self.running.push(id);
                scheduled.push(Scheduled { id, tokens: n });
                budget -= n;
            }
            for id in skipped.into_iter().rev() {
                self.waiting.push_front(id);
            }
        }

        self.note_peaks();
        if scheduled.is_empty() {
            self.last_step = None;
            return None;
        }

        // 3. Step time.
        let mut decodes = 0u32;
        let mut prefill = 0u32;
        let mut context = 0u64;
        let mut attention_pairs = 0u64;
        for s in &scheduled {
            if let Some(seq) = self.seqs.get(&s.id) {
                if s.tokens == 1 && seq.computed + 1 == seq.num_tokens() && seq.generated > 0 {
                    decodes += 1;
                } else {
                    prefill += s.tokens;
                    // Token j of the chunk attends to the `computed + j` tokens before it and
                    // itself (causal attention).
                    let (n, c) = (u64::from(s.tokens), u64::from(seq.computed));
                    attention_pairs += n * c + n * (n + 1) / 2;
                }
                context += u64::from(seq.computed + s.tokens);
            }
        }
        let p = &self.profile;
        let duration = p.step_base_s
            + f64::from(decodes) * p.decode_per_seq_s
            + f64::from(prefill) * p.prefill_per_token_s
            + attention_pairs as f64 * p.prefill_attn_s
            + context as f64 * p.kv_read_per_token_s
            + f64::from(lora_disk_loads) * p.lora_load_s
            + f64::from(lora_loads - lora_disk_loads) * p.lora_cpu_load_s;
        self.last_step = Some(StepInfo {
            decodes,
            prefill_tokens: prefill,
            attention_pairs,
            lora_loads,
            lora_disk_loads,
            duration,
        });
        let end = now + duration;
        self.in_flight = Some((end, scheduled));
        self.stats.steps += 1;
        Some(end)
    }

    /// Completes the step in flight at time `at` and appends its events to `out`.
    pub fn finish_step(&mut self, at: f64, out: &mut Vec<Event>) {
        let Some((_, scheduled)) = self.in_flight.take() else {
            return;
        };
        self.account(at);
        let bs = self.kv.block_size();
        for s in scheduled {
            let Some(seq) = self.seqs.get_mut(&s.id) else {
                continue; // aborted while the step ran
            };
            seq.computed += s.tokens;
            // Register full prompt blocks now computed, so later prompts can share them.
            let full = seq.computed.min(seq.req.prompt_tokens) / bs;
            while seq.registered < full {
                let i = seq.registered as usize;
                if let (Some(&b), Some(&h)) = (seq.blocks.get(i), seq.req.block_hashes.get(i)) {
                    self.kv.register(b, h);
                }
                seq.registered += 1;
            }
            if seq.computed < seq.num_tokens() {
                continue; // still prefilling
            }
            seq.generated += 1;
            self.stats.generation_tokens += 1;
            if seq.generated == 1 && seq.first_token_at.is_none() {
                seq.first_token_at = Some(at);
                self.stats.prompt_tokens += u64::from(seq.req.prompt_tokens);
                // Never negative: the server may start a step at the previous step's planned
                // end, a little before a request that arrived meanwhile.
                self.stats.ttft.observe((at - seq.arrival).max(0.0));
            }
            let last = seq.generated >= seq.req.output_tokens;
            out.push(Event::Token {
                id: s.id,
                index: seq.generated,
                last,
            });
            if last {
                let reason = if seq.req.output_tokens >= seq.req.max_tokens {
                    FinishReason::Length
                } else {
                    FinishReason::Stop
                };
                let usage = Usage {
                    prompt_tokens: seq.req.prompt_tokens,
                    completion_tokens: seq.generated,
                    cached_tokens: seq.cached_tokens.unwrap_or(0),
                };
                let ttft = (seq.first_token_at.unwrap_or(at) - seq.arrival).max(0.0);
                let e2e = (at - seq.arrival).max(0.0);
                let blocks = std::mem::take(&mut seq.blocks);
                self.kv.release(&blocks);
                self.seqs.remove(&s.id);
                self.running.retain(|r| *r != s.id);
                self.stats.e2e.observe(e2e);
                match reason {
                    FinishReason::Stop => self.stats.finished_stop += 1,
                    FinishReason::Length => self.stats.finished_length += 1,
                }
                out.push(Event::Finished {
                    id: s.id,
                    reason,
                    usage,
                    ttft,
                    e2e,
                });
            }
        }
    }

    /// Gauges now.
    pub fn state(&self) -> EngineState {
        let mut running_adapters: Vec<String> = self
            .running
            .iter()
            .filter_map(|id| {
                self.seqs
                    .get(id)?
                    .req
                    .adapter
                    .as_deref()
                    .map(str::to_string)
            })
            .collect();
        running_adapters.sort();
        running_adapters.dedup();
        let mut waiting_adapters: Vec<String> = self
            .waiting
            .iter()
            .filter_map(|id| {
                self.seqs
                    .get(id)?
                    .req
                    .adapter
                    .as_deref()
                    .map(str::to_string)
            })
            .collect();
        waiting_adapters.sort();
        waiting_adapters.dedup();
        EngineState {
            running: self.running.len() as u32,
            waiting: self.waiting.len() as u32,
            kv_usage: self.kv.usage(),
            used_blocks: self.kv.used_blocks(),
            waiting_tokens: self
                .waiting
                .iter()
                .filter_map(|id| self.seqs.get(id))
                .map(|s| u64::from(s.req.prompt_tokens))
                .sum(),
            running_adapters,
            waiting_adapters,
            resident_adapters: self.lora.resident().map(str::to_string).collect(),
            cpu_adapters: self.lora.cached().map(str::to_string).collect(),
        }
    }
}

/// Outcome of one request in a [`simulate`] run.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Index of the request in the input list.
    pub index: usize,
    /// Arrival time.
    pub arrival: f64,
    /// Time to first token.
    pub ttft: f64,
    /// Arrival to finish.
    pub e2e: f64,
    /// Usage block.
    pub usage: Usage,
}

/// Runs `arrivals` (time, request; sorted by time) through `engine` on a simulated clock until
/// every request finished or `until` passed. `observe` sees the engine after every step.
/// Returns outcomes in finishing order. Requests refused at submission are left out.
pub fn simulate(
    engine: &mut Engine,
    arrivals: Vec<(f64, NewRequest)>,
    until: f64,
    mut observe: impl FnMut(&Engine, f64),
) -> Vec<Outcome> {
    let mut t = 0.0f64;
    let mut pending = arrivals.into_iter().enumerate().peekable();
    let mut index_of: HashMap<ReqId, (usize, f64)> = HashMap::new();
    let mut outcomes = Vec::new();
    let mut events = Vec::new();
    while t <= until {
        while let Some((_, (at, _))) = pending.peek() {
            if *at > t {
                break;
            }
            if let Some((i, (at, req))) = pending.next() {
                if let Ok(id) = engine.submit(req, at) {
                    index_of.insert(id, (i, at));
                }
            }
        }
        match engine.begin_step(t) {
            Some(end) => {
                // Requests arriving during the step queue with their own arrival time.
                while let Some((_, (at, _))) = pending.peek() {
                    if *at > end {
                        break;
                    }
                    if let Some((i, (at, req))) = pending.next() {
                        if let Ok(id) = engine.submit(req, at) {
                            index_of.insert(id, (i, at));
                        }
                    }
                }
                events.clear();
                engine.finish_step(end, &mut events);
                for e in &events {
                    if let Event::Finished {
                        id,
                        usage,
                        ttft,
                        e2e,
                        ..
                    } = e
                    {
                        if let Some(&(index, arrival)) = index_of.get(id) {
                            outcomes.push(Outcome {
                                index,
                                arrival,
                                ttft: *ttft,
                                e2e: *e2e,
                                usage: *usage,
                            });
                        }
                    }
                }
                t = end;
                observe(engine, t);
            }
            None => match pending.peek() {
                Some((_, (at, _))) => t = t.max(*at),
                None => break,
            },
        }
    }
    outcomes
}
