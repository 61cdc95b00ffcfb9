//! `affinity`: the home of the prompt's key — the rendezvous-hash pod of its start up to the
//! first user message — scores up to 1, every other pod 0. Every gateway replica computes the
//! same home without sharing state, so when nothing else separates the pods (a conversation this
//! replica has not seen yet), replicas send a conversation's turns to the same pod and its prefix
//! stays cached in one place. What co-location saves grows with the prompt, so the home's value
//! does too: `prompt tokens / 1024`, at most 1 — a short prompt is not worth a longer queue.
//! Weighted low: load and cached prefixes decide first.

use super::Inputs;

/// Prompt tokens at which the home gets its full value.
const FULL_AT_TOKENS: f64 = 1024.0;

pub fn score(x: &Inputs<'_>, out: &mut [f64]) -> bool {
    let Some(home) = x.req.home else {
        return false;
    };
    let value = (f64::from(x.req.prompt_tokens) / FULL_AT_TOKENS).min(1.0);
    for (i, o) in out.iter_mut().enumerate() {
        *o = if i == home { value } else { 0.0 };
    }
    true
}
