//! Seeded request sequences: what each scenario sends, decided entirely before the run.
//!
//! A workload is a list of [`RequestSpec`]s (arrival offset, model or adapter, prompt, max_tokens,
//! the exact request body). It depends only on the [`WorkloadSpec`] and its seed, so every router
//! is measured against byte-identical traffic.

use crate::loadgen::arrivals::Arrival;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::json;
use std::time::Duration;

/// Characters per token, as the emulator counts them.
pub const CHARS_PER_TOKEN: u32 = 4;

/// An inclusive range sampled uniformly.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Range {
    /// Smallest value.
    pub lo: u32,
    /// Largest value.
    pub hi: u32,
}

impl Range {
    /// A range `lo..=hi` (swapped if given backwards).
    pub const fn new(lo: u32, hi: u32) -> Self {
        if lo <= hi {
            Range { lo, hi }
        } else {
            Range { lo: hi, hi: lo }
        }
    }
    fn sample(&self, rng: &mut StdRng) -> u32 {
        rng.random_range(self.lo..=self.hi)
    }
    /// The mean of the range.
    pub fn mean(&self) -> f64 {
        (f64::from(self.lo) + f64::from(self.hi)) / 2.0
    }
}

/// What the prompts look like.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Prompts {
    /// Independent single-turn chats (no shared prefix beyond chance).
    Independent {
        /// Prompt length in tokens.
        prompt_tokens: Range,
        /// `max_tokens` of each request.
        max_tokens: Range,
    },
    /// Independent single-turn chats whose prompt lengths follow a lognormal law (heavy
    /// tail); the output length is left to the pod's EOS (`--output-len lognormal`) under a
    /// generous `max_tokens` cap.
    HeavyTailed {
        /// Median prompt length, tokens.
        prompt_median: u32,
        /// σ of the log of the prompt length.
        prompt_sigma: f64,
        /// Longest prompt, tokens (the lognormal is cut here).
        prompt_max: u32,
        /// `max_tokens` of every request (a cap; the pod stops earlier at its EOS).
        max_tokens: u32,
    },
    /// Multi-turn conversations (each turn resends the whole history) mixed with document
    /// Q&A (many questions about a few long documents): long common prefixes, in the style of
    /// inference-perf's `shared_prefix` (N shared prefixes × many questions each).
    SharedPrefix {
        /// Conversations open at any time; a finished one is replaced by a new one.
        conversations: usize,
        /// Turns per conversation before it is replaced.
        max_turns: u32,
        /// Distinct system prompts; each conversation uses one of them.
        system_prompts: usize,
        /// Length of each system prompt, tokens.
        system_tokens: u32,
        /// New user text per turn, tokens.
        turn_tokens: Range,
        /// The assistant reply that the next turn carries in its history, tokens.
        reply_tokens: u32,
        /// Documents asked about.
        documents: usize,
        /// Length of each document, tokens.
        document_tokens: u32,
        /// Share of requests that are document questions (0..=1).
        document_share: f64,
        /// `max_tokens` of each request.
        max_tokens: Range,
    },
    /// Requests for LoRA adapters over one base model, popularity following a Zipf law.
    Lora {
        /// Number of adapters (`adapter-00` ...).
        adapters: usize,
        /// Zipf exponent of adapter popularity (0 = uniform).
        zipf_s: f64,
        /// Share of requests for the base model itself.
        base_share: f64,
        /// Prompt length in tokens.
        prompt_tokens: Range,
        /// `max_tokens` of each request.
        max_tokens: Range,
    },
}

/// Everything that determines a workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadSpec {
    /// Seed of every random choice.
    pub seed: u64,
    /// Arrival process.
    pub arrival: Arrival,
    /// No arrival at or after this offset.
    pub horizon: Duration,
    /// At most this many requests.
    pub max_requests: usize,
    /// The base model name.
    pub model: String,
    /// Prompt shape.
    pub prompts: Prompts,
    /// Who each request is (a header drawn per request), if the scenario says.
    pub tagging: Option<Tagging>,
}

/// A request header drawn per request: who a request is (its objective, its tenant). Drawn
/// from a random stream of its own, so arrivals and prompts are the same as without it; with
/// `only`, the workload keeps just the requests that drew that value (the same requests at
/// the same times: one tenant's traffic alone).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tagging {
    /// The header's name.
    pub header: String,
    /// Its values with their relative weights.
    pub values: Vec<(String, f64)>,
    /// Keep only the requests that drew this value.
    pub only: Option<String>,
}

impl Tagging {
    /// A header whose values are drawn with these weights.
    pub fn new(header: &str, values: &[(&str, f64)]) -> Self {
        Tagging {
            header: header.to_string(),
            values: values.iter().map(|(v, w)| (v.to_string(), *w)).collect(),
            only: None,
        }
    }

    fn draw(&self, rng: &mut StdRng) -> Option<&str> {
        let total: f64 = self.values.iter().map(|(_, w)| w.max(0.0)).sum();
        let mut x = rng.random::<f64>() * total;
        for (v, w) in &self.values {
            if x < w.max(0.0) {
                return Some(v);
            }
            x -= w.max(0.0);
        }
        self.values.last().map(|(v, _)| v.as_str())
    }
}

/// One request of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpec {
    /// Index in the workload.
    pub id: u64,
    /// When to send it, from the start of the run.
    pub at: Duration,
    /// The `model` field (base model or adapter).
    pub model: String,
    /// `max_tokens` asked for.
    pub max_tokens: u32,
    /// Characters of prompt text in the body.
    pub prompt_chars: usize,
    /// The shared prefix this request reads (a document or a system prompt), if any; the
    /// first request of each group is a cold read for every router.
    pub prefix_group: Option<u32>,
    /// The exact JSON body (streaming chat completion with usage).
    pub body: Bytes,
    /// The request's [`Tagging`] header and the value it drew.
    pub header: Option<(String, String)>,
}

/// The name of adapter `i`.
pub fn adapter_name(i: usize) -> String {
    format!("adapter-{i:02}")
}

const WORDS: &[&str] = &[
    "the",
    "model",
    "router",
    "cache",
    "token",
    "prefix",
    "request",
    "latency",
    "pod",
    "queue",
    "batch",
    "decode",
    "prefill",
    "adapter",
    "gateway",
    "envoy",
    "metric",
    "kernel",
    "tensor",
    "layer",
    "attention",
    "weight",
    "memory",
    "block",
    "stream",
    "answer",
    "question",
    "summary",
    "report",
    "data",
    "value",
    "system",
    "user",
    "policy",
    "score",
    "load",
    "fleet",
    "cluster",
    "node",
    "service",
    "result",
    "error",
    "window",
    "context",
    "document",
    "section",
    "table",
    "figure",
    "river",
    "mountain",
    "city",
    "market",
    "garden",
    "engine",
    "signal",
    "network",
    "language",
    "history",
    "science",
    "music",
    "light",
    "water",
    "energy",
    "travel",
];

/// Deterministic filler text of about `chars` characters.
pub fn text(rng: &mut StdRng, chars: usize) -> String {
    let mut s = String::with_capacity(chars + 16);
    while s.len() < chars {
        let w = WORDS[rng.random_range(0..WORDS.len())];
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(w);
    }
    s.truncate(chars);
    s
}

/// A lognormal sample with the given median and σ (Box-Muller).
fn lognormal(rng: &mut StdRng, median: f64, sigma: f64) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random::<f64>();
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    (median.max(1.0).ln() + sigma * z).exp()
}

/// Share of the requests from `from` on that are the first read of their shared prefix (a
/// cold read no router can avoid), counting groups first read before `from` as warm.
pub fn cold_read_fraction(reqs: &[RequestSpec], from: Duration) -> f64 {
    let mut seen = std::collections::HashSet::new();
    let (mut cold, mut n) = (0usize, 0usize);
    for r in reqs {
        let first = r.prefix_group.is_some_and(|g| seen.insert(g));
        if r.at >= from {
            n += 1;
            cold += usize::from(first);
        }
    }
    if n == 0 {
        0.0
    } else {
        cold as f64 / n as f64
    }
}

fn tokens_to_chars(tokens: u32) -> usize {
    (tokens as usize) * (CHARS_PER_TOKEN as usize)
}

/// A streaming chat completion with usage. `ignore_eos`: generate exactly `max_tokens`, as
/// serving benchmarks ask for fixed output lengths (a real engine's random-weight model would
/// otherwise stop at a chance EOS); false where the length is left to the pod's EOS.
fn chat_body(
    model: &str,
    messages: &[(String, String)],
    max_tokens: u32,
    ignore_eos: bool,
) -> Bytes {
    let msgs: Vec<serde_json::Value> = messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let mut v = json!({
        "model": model,
        "messages": msgs,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if ignore_eos {
        v["ignore_eos"] = json!(true);
    }
    Bytes::from(v.to_string())
}

struct Conversation {
    id: u64,
    turns: u32,
    system: usize,
    history: Vec<(String, String)>,
}

/// Build the workload of a spec. Pure: the same spec gives the same requests.
pub fn generate(spec: &WorkloadSpec) -> Vec<RequestSpec> {
    let mut arrival_rng = StdRng::seed_from_u64(spec.seed);
    let times = spec
        .arrival
        .times(&mut arrival_rng, spec.horizon, spec.max_requests);
    // A separate stream for content so prompt shapes do not depend on the arrival process.
    let mut rng = StdRng::seed_from_u64(spec.seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::with_capacity(times.len());
    match &spec.prompts {
        Prompts::Independent {
            prompt_tokens,
            max_tokens,
        } => {
            for (i, at) in times.into_iter().enumerate() {
                let n = prompt_tokens.sample(&mut rng);
                let prompt = format!("[{i}] {}", text(&mut rng, tokens_to_chars(n)));
                let mt = max_tokens.sample(&mut rng);
                let msgs = vec![("user".to_string(), prompt)];
                out.push(RequestSpec {
                    id: i as u64,
                    at,
                    model: spec.model.clone(),
                    max_tokens: mt,
                    prompt_chars: msgs[0].1.len(),
                    prefix_group: None,
                    body: chat_body(&spec.model, &msgs, mt, true),
                    header: None,
                });
            }
        }
        Prompts::HeavyTailed {
            prompt_median,
            prompt_sigma,
            prompt_max,
            max_tokens,
        } => {
            for (i, at) in times.into_iter().enumerate() {
                let n = lognormal(&mut rng, f64::from(*prompt_median), *prompt_sigma)
                    .clamp(1.0, f64::from((*prompt_max).max(1))) as u32;
                let prompt = format!("[{i}] {}", text(&mut rng, tokens_to_chars(n)));
                let msgs = vec![("user".to_string(), prompt)];
                out.push(RequestSpec {
                    id: i as u64,
                    at,
                    model: spec.model.clone(),
                    max_tokens: *max_tokens,
                    prompt_chars: msgs[0].1.len(),
                    prefix_group: None,
                    body: chat_body(&spec.model, &msgs, *max_tokens, false),
                    header: None,
                });
            }
        }
        Prompts::SharedPrefix {
            conversations,
            max_turns,
            system_prompts,
            system_tokens,
            turn_tokens,
            reply_tokens,
            documents,
            document_tokens,
            document_share,
            max_tokens,
        } => {
            let systems: Vec<String> = (0..(*system_prompts).max(1))
                .map(|k| {
                    format!(
                        "You are assistant {k}. {}",
                        text(&mut rng, tokens_to_chars(*system_tokens))
                    )
                })
                .collect();
            // Document questions carry the first system prompt.
            let system = systems[0].clone();
            let docs: Vec<String> = (0..(*documents).max(1))
                .map(|d| {
                    format!(
                        "Document {d}: {}",
                        text(&mut rng, tokens_to_chars(*document_tokens))
                    )
                })
                .collect();
            let mut next_conv = 0u64;
            // The first conversations take the system prompts in turn, later ones at random.
            let new_conv = |next: &mut u64, rng: &mut StdRng| {
                let k = if (*next as usize) < systems.len() {
                    *next as usize
                } else {
                    rng.random_range(0..systems.len())
                };
                let c = Conversation {
                    id: *next,
                    turns: 0,
                    system: k,
                    history: vec![("system".to_string(), systems[k].clone())],
                };
                *next += 1;
                c
            };
            let mut convs: Vec<Conversation> = (0..(*conversations).max(1))
                .map(|_| new_conv(&mut next_conv, &mut rng))
                .collect();
            for (i, at) in times.into_iter().enumerate() {
                let mt = max_tokens.sample(&mut rng);
                let group;
                // Priming: the first requests read every document, then open one conversation
                // per system prompt, so a warm-up sees the whole working set.
                let priming = i < docs.len() + systems.len().min(convs.len());
                let doc_question = if priming {
                    i < docs.len()
                } else {
                    rng.random::<f64>() < *document_share
                };
                let msgs = if doc_question {
                    let d = if priming {
                        i
                    } else {
                        rng.random_range(0..docs.len())
                    };
                    group = d as u32;
                    let qn = turn_tokens.sample(&mut rng);
                    let q = text(&mut rng, tokens_to_chars(qn));
                    vec![
                        ("system".to_string(), system.clone()),
                        (
                            "user".to_string(),
                            format!("{}\n\nQuestion {i}: {q}", docs[d]),
                        ),
                    ]
                } else {
                    let k = if priming {
                        i - docs.len()
                    } else {
                        rng.random_range(0..convs.len())
                    };
                    if convs[k].turns >= *max_turns {
                        convs[k] = new_conv(&mut next_conv, &mut rng);
                    }
                    let c = &mut convs[k];
                    group = (docs.len() + c.system) as u32;
                    let un = turn_tokens.sample(&mut rng);
                    let user = format!(
                        "[conversation {} turn {}] {}",
                        c.id,
                        c.turns,
                        text(&mut rng, tokens_to_chars(un))
                    );
                    c.history.push(("user".to_string(), user));
                    let msgs = c.history.clone();
                    // The reply the client would append before its next turn.
                    let reply = text(&mut rng, tokens_to_chars(*reply_tokens));
                    c.history.push(("assistant".to_string(), reply));
                    c.turns += 1;
                    msgs
                };
                let prompt_chars = msgs.iter().map(|(_, c)| c.len()).sum();
                out.push(RequestSpec {
                    id: i as u64,
                    at,
                    model: spec.model.clone(),
                    max_tokens: mt,
                    prompt_chars,
                    prefix_group: Some(group),
                    body: chat_body(&spec.model, &msgs, mt, true),
                    header: None,
                });
            }
        }
        Prompts::Lora {
            adapters,
            zipf_s,
            base_share,
            prompt_tokens,
            max_tokens,
        } => {
            let n = (*adapters).max(1);
            let weights: Vec<f64> = (1..=n).map(|r| 1.0 / (r as f64).powf(*zipf_s)).collect();
            let total: f64 = weights.iter().sum();
            // A fixed random permutation so adapter-00 is not always the most popular.
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                let j = rng.random_range(0..=i);
                order.swap(i, j);
            }
            for (i, at) in times.into_iter().enumerate() {
                let model = if rng.random::<f64>() < *base_share {
                    spec.model.clone()
                } else {
                    let mut x = rng.random::<f64>() * total;
                    let mut pick = n - 1;
                    for (r, w) in weights.iter().enumerate() {
                        if x < *w {
                            pick = r;
                            break;
                        }
                        x -= w;
                    }
                    adapter_name(order[pick])
                };
                let pn = prompt_tokens.sample(&mut rng);
                let p = format!("[{i}] {}", text(&mut rng, tokens_to_chars(pn)));
                let mt = max_tokens.sample(&mut rng);
                let msgs = vec![("user".to_string(), p)];
                out.push(RequestSpec {
                    id: i as u64,
                    at,
                    max_tokens: mt,
                    prompt_chars: msgs[0].1.len(),
                    prefix_group: None,
                    body: chat_body(&model, &msgs, mt, true),
                    model,
                    header: None,
                });
            }
        }
    }
    if let Some(t) = &spec.tagging {
        out = tag(out, t, spec.seed);
    }
    out
}

/// Draw each request's [`Tagging`] value (a stream of its own) and keep only `t.only`'s.
fn tag(reqs: Vec<RequestSpec>, t: &Tagging, seed: u64) -> Vec<RequestSpec> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5bd1_e995_7f4a_0001);
    reqs.into_iter()
        .filter_map(|mut r| {
            let v = t.draw(&mut rng)?.to_string();
            if t.only.as_ref().is_some_and(|o| *o != v) {
                return None;
            }
            r.header = Some((t.header.clone(), v));
            Some(r)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(prompts: Prompts, seed: u64) -> WorkloadSpec {
        WorkloadSpec {
            seed,
            arrival: Arrival::Poisson { rate: 10.0 },
            horizon: Duration::from_secs(20),
            max_requests: 500,
            model: "m".into(),
            prompts,
            tagging: None,
        }
    }

    fn all_kinds() -> Vec<Prompts> {
        vec![
            Prompts::Independent {
                prompt_tokens: Range::new(10, 100),
                max_tokens: Range::new(5, 50),
            },
            Prompts::SharedPrefix {
                conversations: 4,
                max_turns: 5,
                system_prompts: 2,
                system_tokens: 50,
                turn_tokens: Range::new(10, 30),
                reply_tokens: 20,
                documents: 2,
                document_tokens: 200,
                document_share: 0.5,
                max_tokens: Range::new(5, 50),
            },
            Prompts::Lora {
                adapters: 8,
                zipf_s: 1.0,
                base_share: 0.1,
                prompt_tokens: Range::new(10, 100),
                max_tokens: Range::new(5, 50),
            },
            Prompts::HeavyTailed {
                prompt_median: 40,
                prompt_sigma: 1.0,
                prompt_max: 400,
                max_tokens: 64,
            },
        ]
    }

    #[test]
    fn heavy_tailed_prompts_have_a_lognormal_spread() {
        let p = Prompts::HeavyTailed {
            prompt_median: 500,
            prompt_sigma: 0.8,
            prompt_max: 20_000,
            max_tokens: 1000,
        };
        let mut s = spec(p, 4);
        s.max_requests = 4000;
        s.horizon = Duration::from_secs(1000);
        let mut chars: Vec<usize> = generate(&s).iter().map(|r| r.prompt_chars).collect();
        chars.sort_unstable();
        let q = |f: f64| chars[((chars.len() - 1) as f64 * f) as usize] as f64;
        // Median ≈ 500 tokens ≈ 2,000 characters; p99 / p50 = e^(2.33·0.8) ≈ 6.4.
        assert!((1700.0..2300.0).contains(&q(0.5)), "{}", q(0.5));
        let tail = q(0.99) / q(0.5);
        assert!((4.5..9.0).contains(&tail), "{tail}");
    }

    #[test]
    fn cold_reads_are_first_reads_of_a_group() {
        let mk = |at: u64, g: Option<u32>| RequestSpec {
            id: at,
            at: Duration::from_secs(at),
            model: "m".into(),
            max_tokens: 1,
            prompt_chars: 1,
            prefix_group: g,
            body: Bytes::new(),
            header: None,
        };
        let reqs = vec![
            mk(0, Some(1)),
            mk(1, Some(2)),
            mk(2, Some(1)),
            mk(3, Some(3)),
            mk(4, None),
            mk(5, Some(2)),
        ];
        assert!((cold_read_fraction(&reqs, Duration::ZERO) - 0.5).abs() < 1e-9);
        // From t=2 on: only group 3's first read is cold (1 of 4).
        assert!((cold_read_fraction(&reqs, Duration::from_secs(2)) - 0.25).abs() < 1e-9);
    }

    #[test]
    fn tags_are_drawn_by_weight_without_changing_the_requests_and_only_keeps_one_value() {
        let p = all_kinds().remove(0);
        let mut s = spec(p, 9);
        s.max_requests = 5000;
        s.horizon = Duration::from_secs(1000);
        let plain = generate(&s);
        s.tagging = Some(Tagging::new("x-who", &[("a", 2.0), ("b", 8.0)]));
        let tagged = generate(&s);
        assert_eq!(plain.len(), tagged.len());
        let mut a = 0;
        for (p, t) in plain.iter().zip(&tagged) {
            // Same arrivals and bodies: only the header is new.
            assert_eq!((p.id, p.at, &p.body), (t.id, t.at, &t.body));
            let (h, v) = t.header.clone().unwrap();
            assert_eq!(h, "x-who");
            a += usize::from(v == "a");
        }
        let share = a as f64 / tagged.len() as f64;
        assert!((share - 0.2).abs() < 0.02, "{share}");
        // `only` keeps the same requests that drew it, at the same times.
        s.tagging.as_mut().unwrap().only = Some("a".into());
        let alone = generate(&s);
        assert_eq!(alone.len(), a);
        let drew_a: Vec<_> = tagged
            .iter()
            .filter(|r| r.header.as_ref().unwrap().1 == "a")
            .collect();
        for (x, y) in alone.iter().zip(drew_a) {
            assert_eq!(
                (x.id, x.at, &x.body, &x.header),
                (y.id, y.at, &y.body, &y.header)
            );
        }
    }

    #[test]
    fn same_seed_same_workload_other_seed_other_workload() {
        for p in all_kinds() {
            let a = generate(&spec(p.clone(), 42));
            let b = generate(&spec(p.clone(), 42));
            let c = generate(&spec(p, 43));
            assert!(!a.is_empty());
            assert_eq!(a, b);
            assert_ne!(a, c);
        }
    }

    #[test]
    fn bodies_are_streaming_chat_requests_with_usage() {
        for p in all_kinds() {
            // Fixed output lengths, except where the pod's EOS decides the length.
            let eos_decides = matches!(p, Prompts::HeavyTailed { .. });
            for r in generate(&spec(p, 1)) {
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                assert_eq!(v["model"], r.model.as_str());
                assert_eq!(v["stream"], true);
                assert_eq!(v["stream_options"]["include_usage"], true);
                assert_eq!(v["max_tokens"], r.max_tokens);
                assert!(!v["messages"].as_array().unwrap().is_empty());
                assert_eq!(v.get("ignore_eos").is_none(), eos_decides, "{v}");
            }
        }
    }

    #[test]
    fn conversation_turns_extend_their_history() {
        let p = Prompts::SharedPrefix {
            conversations: 2,
            max_turns: 10,
            system_prompts: 1,
            system_tokens: 50,
            turn_tokens: Range::new(10, 30),
            reply_tokens: 20,
            documents: 1,
            document_tokens: 100,
            document_share: 0.0,
            max_tokens: Range::new(5, 10),
        };
        let w = generate(&spec(p, 9));
        // Every later turn of a conversation starts with the whole previous request's messages.
        let msgs = |r: &RequestSpec| -> Vec<serde_json::Value> {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            v["messages"].as_array().unwrap().clone()
        };
        let mut extended = 0;
        for (i, a) in w.iter().enumerate() {
            let ma = msgs(a);
            if let Some(b) = w[i + 1..].iter().find(|b| {
                let mb = msgs(b);
                mb.len() == ma.len() + 2 && mb[1]["content"] == ma[1]["content"]
            }) {
                assert_eq!(msgs(b)[..ma.len()], ma[..]);
                extended += 1;
            }
        }
        assert!(extended > w.len() / 2, "{extended} of {}", w.len());
    }

    #[test]
    fn lora_uses_many_adapters_with_skewed_popularity() {
        let p = Prompts::Lora {
            adapters: 16,
            zipf_s: 1.0,
            base_share: 0.0,
            prompt_tokens: Range::new(10, 20),
            max_tokens: Range::new(5, 10),
        };
        let mut s = spec(p, 5);
        s.max_requests = 5000;
        s.horizon = Duration::from_secs(1000);
        let w = generate(&s);
        let mut counts = std::collections::HashMap::new();
        for r in &w {
            *counts.entry(r.model.clone()).or_insert(0usize) += 1;
        }
        assert_eq!(counts.len(), 16);
        let max = *counts.values().max().unwrap();
        let min = *counts.values().min().unwrap();
        assert!(max > 5 * min, "max {max} min {min}");
    }

    #[test]
    fn text_has_the_asked_length() {
        let mut rng = StdRng::seed_from_u64(1);
        for n in [0, 1, 10, 1000, 200_000] {
            assert_eq!(text(&mut rng, n).len(), n);
        }
    }
}
