//! Canary and weighted model rewrites, in the shape of llm-d / GAIE's `InferenceModelRewrite`:
//! rules matching a requested model name, each with weighted targets (served names); the first
//! rule whose name matches picks one target per request and the body's `model` is rewritten to
//! it. GAIE splits by weighted random; so does a rule here unless it is `sticky`.
//!
//! Sticky rules key the choice on the conversation instead of the request: the prompt up to
//! the end of its first user message (the same on every turn of a chat, and on every gateway
//! replica, with no header or shared state), so a conversation does not hop between model
//! versions mid-way. GAIE has no stickiness; llm-d's session affinity (a cookie) pins pods, not
//! model names. The choice is `mix(key) mod total weight` against the targets' cumulative
//! weights, so growing a canary from 10 to 20 moves only the conversations in the grown slice.
//!
//! The configuration side (validation: weights, targets that exist) is in [`crate::config`].

use crate::request::{ParsedRequest, Piece};
use xxhash_rust::xxh64::Xxh64;

/// One served name a rule can send a request to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The model name the pod serves (the body's new `model`).
    pub model: String,
    /// Index into [`crate::config::Config::pools`]: the pool that serves `model`.
    pub pool: usize,
    /// `model` is a LoRA adapter on that pool's base model.
    pub adapter: bool,
    /// Relative weight (0 = never chosen).
    pub weight: u32,
}

/// How a rule's targets are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sticky {
    /// Each request on its own (weighted random, as GAIE).
    #[default]
    None,
    /// Per conversation ([`conversation_key`]); requests without messages are chosen on their
    /// own.
    Conversation,
}

/// One rule: a requested model name and its weighted targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The requested model name this rule matches (exactly).
    pub model: String,
    pub targets: Vec<Target>,
    pub sticky: Sticky,
    /// Keys the sticky draw ([`conversation_key`]): derived from the snapshot secret that every
    /// replica shares ([`sticky_salt`]), so replicas agree while a client, who cannot know it,
    /// cannot compute offline which prompt lands on which target. 0 without a secret.
    pub salt: u64,
}

/// A salt so the rewrite's draw is independent of the pod tie-break drawn from the same
/// entropy (`Context::tie`).
const SALT: u64 = 0x7265_7772_6974_6521;

/// SplitMix64's finalizer: spreads any input (consecutive counters, clock readings) over the
/// 64 bits, so the modulo below sees uniform values.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The sticky draw's salt from the snapshot secret: the first 8 bytes of its derived key for
/// this use (HKDF-Expand, as every key derived from it), 0 when no secret is configured (the
/// draw then depends on public constants only, and the documentation says so).
pub fn sticky_salt(secret: &str) -> u64 {
    if secret.is_empty() {
        return 0;
    }
    let key = llm_router_snapshot::auth::derive_key(secret.as_bytes(), "rewrite/sticky");
    let mut first = [0u8; 8];
    first.copy_from_slice(key.get(..8).unwrap_or(&[0; 8]));
    u64::from_le_bytes(first)
}

/// A conversation's key: the hash of the prompt's pieces through the first user message
/// ([`ParsedRequest::key_pieces`]), seeded with `salt`; `None` when the body has no role-tagged
/// messages.
pub fn conversation_key(req: &ParsedRequest<'_>, salt: u64) -> Option<u64> {
    let n = req.key_pieces?;
    let mut h = Xxh64::new(SALT ^ salt);
    h.update(req.model.as_bytes());
    for piece in req.pieces.iter().take(n) {
        h.update(&[0x1E]);
        match piece {
            Piece::Text(t) => h.update(t.as_bytes()),
            Piece::Tokens(ids) => {
                for id in ids {
                    h.update(&id.to_le_bytes());
                }
            }
        }
    }
    Some(h.digest())
}

impl Rule {
    /// Sum of the weights (above 0 in a validated configuration).
    pub fn total(&self) -> u64 {
        self.targets.iter().map(|t| u64::from(t.weight)).sum()
    }

    /// The target for a draw: `mix(draw) mod total` against the cumulative weights.
    pub fn pick(&self, draw: u64) -> Option<&Target> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let mut at = mix(draw ^ SALT) % total;
        for t in &self.targets {
            let w = u64::from(t.weight);
            if at < w {
                return Some(t);
            }
            at -= w;
        }
        None
    }

    /// The target for `req`: by its conversation when the rule is sticky and the request has
    /// one, otherwise by `tie` (the request's own entropy).
    pub fn choose(&self, req: &ParsedRequest<'_>, tie: u64) -> Option<&Target> {
        let draw = match self.sticky {
            Sticky::Conversation => conversation_key(req, self.salt).unwrap_or(tie),
            Sticky::None => tie,
        };
        self.pick(draw)
    }
}

/// The configured rules, looked up by requested model name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rewrites {
    pub rules: Vec<Rule>,
}

impl Rewrites {
    /// The rule for a requested model name (names are unique across rules).
    pub fn rule(&self, model: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.model == model)
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// `model` is some rule's target. A target the configuration does not also list in a pool's
    /// `models` is reachable only through its rule: a canary pool declared without `models`
    /// keeps its served name private, so clients cannot aim at it by name (a drained weight-0
    /// canary included), even once the snapshot reports the pods serving it.
    pub fn is_target(&self, model: &str) -> bool {
        self.rules
            .iter()
            .any(|r| r.targets.iter().any(|t| t.model == model))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::request::{parse, ApiKind};

    fn rule(weights: &[u32], sticky: Sticky) -> Rule {
        Rule {
            model: "llama".into(),
            targets: weights
                .iter()
                .enumerate()
                .map(|(i, &w)| Target {
                    model: format!("llama-v{}", i + 1),
                    pool: 0,
                    adapter: false,
                    weight: w,
                })
                .collect(),
            sticky,
            salt: 0,
        }
    }

    fn chat(first: &str, later: &[&str]) -> Vec<u8> {
        let mut messages = vec![
            serde_json::json!({"role": "system", "content": "be brief"}),
            serde_json::json!({"role": "user", "content": first}),
        ];
        for (i, m) in later.iter().enumerate() {
            messages.push(serde_json::json!({"role": "assistant", "content": format!("a{i}")}));
            messages.push(serde_json::json!({"role": "user", "content": m}));
        }
        serde_json::json!({"model": "llama", "messages": messages})
            .to_string()
            .into_bytes()
    }

    /// The issue's bound: 90/10 over 10,000 requests within ±1 percentage point, with the
    /// tie-break entropy the filter passes (here a counter, as deterministic as a test needs).
    #[test]
    fn a_90_10_split_over_10000_requests_is_within_one_point() {
        let r = rule(&[90, 10], Sticky::None);
        let body = chat("hello", &[]);
        let req = parse(ApiKind::ChatCompletions, &body).unwrap();
        let canary = (0..10_000u64)
            .filter(|&i| r.choose(&req, i).unwrap().model == "llama-v2")
            .count();
        let share = canary as f64 / 10_000.0;
        assert!((share - 0.10).abs() <= 0.01, "canary share {share}");
        // And with entropy shaped like the filter's (clock ns ^ counter * golden ^ context id).
        let canary = (0..10_000u64)
            .filter(|&i| {
                let tie = (1_700_000_000_000_000_000 + i * 7_919)
                    ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    ^ (i % 64);
                r.choose(&req, tie).unwrap().model == "llama-v2"
            })
            .count();
        let share = canary as f64 / 10_000.0;
        assert!((share - 0.10).abs() <= 0.01, "canary share {share}");
    }

    #[test]
    fn a_zero_weight_target_is_never_chosen_and_three_way_splits_hold() {
        let r = rule(&[1, 0, 3], Sticky::None);
        let mut counts = [0usize; 3];
        for i in 0..8_000u64 {
            let t = r.pick(i).unwrap();
            let k = r.targets.iter().position(|x| x == t).unwrap();
            counts[k] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!((1_800..=2_200).contains(&counts[0]), "{counts:?}");
        assert!((5_800..=6_200).contains(&counts[2]), "{counts:?}");
        assert!(rule(&[0, 0], Sticky::None).pick(1).is_none());
    }

    /// Every turn of a conversation keeps its target; different conversations spread.
    #[test]
    fn a_sticky_conversation_keeps_its_target_whatever_the_entropy() {
        let r = rule(&[50, 50], Sticky::Conversation);
        let mut seen = [0usize; 2];
        for c in 0..200 {
            let first = format!("conversation {c}");
            let body = chat(&first, &[]);
            let req = parse(ApiKind::ChatCompletions, &body).unwrap();
            let chosen = r.choose(&req, 1).unwrap().model.clone();
            for turn in 1..5u64 {
                let later: Vec<String> = (0..turn).map(|t| format!("follow-up {t}")).collect();
                let later: Vec<&str> = later.iter().map(String::as_str).collect();
                let body = chat(&first, &later);
                let req = parse(ApiKind::ChatCompletions, &body).unwrap();
                assert_eq!(r.choose(&req, turn * 7_777).unwrap().model, chosen, "{c}");
            }
            seen[usize::from(chosen == "llama-v2")] += 1;
        }
        assert!(seen[0] > 60 && seen[1] > 60, "{seen:?}");
        // Not sticky: the same conversation goes both ways.
        let r = rule(&[50, 50], Sticky::None);
        let body = chat("one conversation", &[]);
        let req = parse(ApiKind::ChatCompletions, &body).unwrap();
        let v2 = (0..100u64)
            .filter(|&i| r.choose(&req, i).unwrap().model == "llama-v2")
            .count();
        assert!((20..=80).contains(&v2), "{v2}");
    }

    /// Growing the canary only moves the conversations in the grown slice: none leaves v2.
    #[test]
    fn growing_a_canary_moves_conversations_one_way_only() {
        let small = rule(&[90, 10], Sticky::Conversation);
        let big = rule(&[80, 20], Sticky::Conversation);
        let (mut stayed, mut moved) = (0, 0);
        for c in 0..2_000 {
            let body = chat(&format!("c{c}"), &[]);
            let req = parse(ApiKind::ChatCompletions, &body).unwrap();
            let before = &small.choose(&req, 0).unwrap().model;
            let after = &big.choose(&req, 0).unwrap().model;
            if before == "llama-v2" {
                assert_eq!(after, "llama-v2", "conversation {c} left the canary");
                stayed += 1;
            } else if after == "llama-v2" {
                moved += 1;
            }
        }
        assert!(stayed > 100 && moved > 100, "{stayed} {moved}");
    }

    #[test]
    fn a_request_without_messages_is_chosen_on_its_own() {
        let r = rule(&[50, 50], Sticky::Conversation);
        let body = br#"{"model":"llama","prompt":"the same prompt"}"#;
        let req = parse(ApiKind::Completions, body).unwrap();
        assert_eq!(conversation_key(&req, 0), None);
        let v2 = (0..100u64)
            .filter(|&i| r.choose(&req, i).unwrap().model == "llama-v2")
            .count();
        assert!((20..=80).contains(&v2), "{v2}");
    }

    /// The sticky draw is keyed by the shared secret: two replicas with the same secret send a
    /// conversation to the same target, while a different secret (what a client who computes
    /// the draw offline has to guess) reassigns about half of the conversations of a 50/50 rule.
    #[test]
    fn the_sticky_draw_is_keyed_by_the_secret() {
        let salted = |secret: &str| Rule {
            salt: sticky_salt(secret),
            ..rule(&[50, 50], Sticky::Conversation)
        };
        assert_eq!(sticky_salt(""), 0);
        let a = sticky_salt("replica-secret-0123456789abcdef-0123");
        assert_ne!(a, 0);
        assert_eq!(a, sticky_salt("replica-secret-0123456789abcdef-0123"));
        let (one, other) = (
            salted("replica-secret-0123456789abcdef-0123"),
            salted("another-secret-0123456789abcdef-0123"),
        );
        let public = rule(&[50, 50], Sticky::Conversation);
        let (mut vs_other, mut vs_public) = (0, 0);
        for c in 0..400 {
            let body = chat(&format!("conversation {c}"), &[]);
            let req = parse(ApiKind::ChatCompletions, &body).unwrap();
            let mine = &one.choose(&req, 1).unwrap().model;
            let replica = salted("replica-secret-0123456789abcdef-0123");
            assert_eq!(&replica.choose(&req, 99).unwrap().model, mine, "{c}");
            vs_other += usize::from(&other.choose(&req, 1).unwrap().model != mine);
            vs_public += usize::from(&public.choose(&req, 1).unwrap().model != mine);
        }
        assert!((140..=260).contains(&vs_other), "{vs_other} of 400 moved");
        assert!((140..=260).contains(&vs_public), "{vs_public} of 400 moved");
    }
}
