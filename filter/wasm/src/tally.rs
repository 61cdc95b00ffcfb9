//! The tally's long poll: a sidecar's read of `GET {tally_path}?after=V&wait_ms=W` is held
//! until this proxy's tally moves past version `V` or `W` ms pass (at most
//! [`MAX_TALLY_WAIT_MS`]), then answered with the tally and its version
//! ([`TALLY_VERSION_HEADER`]).
//!
//! Read every `hub.share_ms` instead, the other gateway replicas saw a request this one routed
//! only up to one interval later, and a prefill shorter than that was invisible to them (the
//! bench's mixed fleet: replicas met each other's pending prefills in a third of their slowest
//! requests). Held, a read is answered on the root context's next tick after the change
//! ([`HELD_READ_TICK`], while a read is held: the version is a few shared-data reads, nothing decoded),
//! and an idle proxy is read once per wait.
//!
//! The version is [`inflight::tally_version`] of the snapshot's pools (as this worker last decoded
//! them: a tick decodes nothing); each worker holds
//! the reads that reached it and checks them on its own tick, whichever worker's stream changed
//! the tally.

use crate::host::{self, HostStore};
#[cfg(doc)]
use crate::worker::HELD_READ_TICK;
use crate::worker::{HeldRead as Held, Worker};
use llm_router_core::{inflight, Fleet};
use llm_router_snapshot::tally::{
    MAX_TALLY_WAIT_MS, TALLY_AFTER_PARAM, TALLY_VERSION_HEADER, TALLY_WAIT_PARAM,
};

/// Reads one worker holds at most; more are answered at once (one sidecar holds one).
pub const MAX_HELD: usize = 8;

/// `(after, wait_ms)` from a tally read's query, when it asks to be held (both present and
/// numbers, a wait above zero); the wait capped at [`MAX_TALLY_WAIT_MS`].
pub fn wanted(query: &str) -> Option<(u64, u64)> {
    let (mut after, mut wait) = (None, None);
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((k, v)) if k == TALLY_AFTER_PARAM => after = v.parse::<u64>().ok(),
            Some((k, v)) if k == TALLY_WAIT_PARAM => wait = v.parse::<u64>().ok(),
            _ => {}
        }
    }
    Some((after?, wait.filter(|w| *w > 0)?.min(MAX_TALLY_WAIT_MS)))
}

/// The tally's version now, over the pools of `fleet`.
fn version(fleet: Option<&Fleet>) -> u64 {
    fleet.map_or(0, |f| {
        inflight::tally_version(&HostStore, f.snapshot.pools.iter().map(|p| p.name.as_str()))
    })
}

/// The version a tick compares: over the fleet this worker decoded last, not refreshed — the
/// sidecar pushes a snapshot per hub frame, and a tick that decoded each one would decode
/// snapshots no request needs (the next answer, or any request here, refreshes it).
fn version_now(w: &mut Worker) -> u64 {
    let fleet = w.cache.last().or_else(|| w.fleet());
    version(fleet.as_deref())
}

/// Answers the effective stream with the tally of the current snapshot's pools (an empty one
/// before any snapshot) and its version, read first: a change while the bytes are built shows
/// as a newer version at the next read, never as a missed one. The worker's decoded fleet names
/// the pools (decoded once per generation), the same for the version and the bytes.
fn answer(w: &mut Worker) {
    let fleet = w.fleet();
    let v = version(fleet.as_deref()).to_string();
    let names = fleet
        .iter()
        .flat_map(|f| f.snapshot.pools.iter())
        .map(|p| p.name.as_str());
    // Bounded by the snapshot's own limits, so encoding cannot fail; empty if it ever did.
    let bytes = inflight::tally(&HostStore, names, host::now_ms())
        .encode()
        .unwrap_or_default();
    host::send_response(
        200,
        &[
            ("content-type", "application/x-llm-router-tally"),
            ("cache-control", "no-store"),
            (TALLY_VERSION_HEADER, &v),
        ],
        &bytes,
    );
}

/// A read of the tally on stream `context` with `query`: answered now (false) or held (true).
pub fn read(w: &mut Worker, context: u32, query: &str) -> bool {
    let Some((after, wait_ms)) = wanted(query) else {
        answer(w);
        return false;
    };
    if w.tally_held.len() >= MAX_HELD || version_now(w) != after {
        answer(w);
        return false;
    }
    w.tally_held.push(Held {
        context,
        after,
        until_ms: host::now_ms().saturating_add(wait_ms),
    });
    crate::waiting::retick(w);
    true
}

/// The root context's tick: answers the held reads whose version moved or whose wait ended.
pub fn on_tick(w: &mut Worker, root: u32) {
    if w.tally_held.is_empty() {
        return;
    }
    let (now, v) = (host::now_ms(), version_now(w));
    let due: Vec<Held> = w
        .tally_held
        .iter()
        .filter(|h| h.after != v || now >= h.until_ms)
        .copied()
        .collect();
    if due.is_empty() {
        return;
    }
    w.tally_held.retain(|h| !due.contains(h));
    for h in due {
        if host::set_effective_context(h.context) {
            answer(w);
        }
    }
    host::set_effective_context(root);
    crate::waiting::retick(w);
}

/// Stream `context` ended (its reader gave up): its read is no longer held.
pub fn forget(w: &mut Worker, context: u32) {
    let before = w.tally_held.len();
    w.tally_held.retain(|h| h.context != context);
    if w.tally_held.len() != before {
        crate::waiting::retick(w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_held_only_when_it_names_a_version_and_a_wait() {
        assert_eq!(wanted("after=12&wait_ms=200"), Some((12, 200)));
        assert_eq!(wanted("wait_ms=200&x=1&after=0"), Some((0, 200)));
        assert_eq!(
            wanted("after=12&wait_ms=60000"),
            Some((12, MAX_TALLY_WAIT_MS))
        );
        for q in [
            "",
            "after=12",
            "wait_ms=200",
            "after=x&wait_ms=200",
            "after=1&wait_ms=0",
        ] {
            assert_eq!(wanted(q), None, "{q}");
        }
    }
}
