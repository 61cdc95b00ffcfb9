//! `affinity`: the home of the prompt's key — the rendezvous-hash pod of its start up to the
//! first user message — scores 1, every other pod 0. Every gateway replica computes the same
//! home without sharing state, so when nothing else separates the pods (a conversation this
//! replica has not seen yet), replicas send a conversation's turns to the same pod and its prefix
//! stays cached in one place. Weighted low: load and cached prefixes decide first.

use super::Inputs;

pub fn score(x: &Inputs<'_>, out: &mut [f64]) -> bool {
    let Some(home) = x.req.home else {
        return false;
    };
    for (i, o) in out.iter_mut().enumerate() {
        *o = if i == home { 1.0 } else { 0.0 };
    }
    true
}
