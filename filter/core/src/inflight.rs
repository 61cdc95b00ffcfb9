//! This proxy's own view of each pod's load, shared by all Envoy workers.
//!
//! One shared-data key per pool holds a small table, per pod: the requests this proxy sent and
//! that have not finished (`in_flight`), the estimated prompt tokens of those that have not yet
//! returned a first response byte (`pending_tokens`: prefill work queued or running there), and
//! the pod's learned prefill rate ([`Fit`]). It also keeps the pool's mean prefill size, which
//! turns an engine's count of waiting requests into tokens. The table is updated with
//! compare-and-swap when a request is routed, when its first response byte arrives and when its
//! stream ends (completion, reset or client abort).
//!
//! When a snapshot is accepted, the table is copied to a baseline key: the difference
//! `in_flight now − in_flight then` is the load this proxy added (or removed) since the pods
//! were last observed, which keeps a burst between two scrapes from herding onto one pod.
//!
//! It also keeps, per pod, how its answers went: consecutive server errors (5xx) and, once there
//! were [`EJECT_AFTER_ERRORS`] in a row, until when the pod is put behind the others
//! ([`PodLoad::ejected`]). A pod that answers every request at once with an error has nothing in
//! flight and looks idle in its own metrics; this is what keeps it from drawing the pool (Envoy's
//! outlier detection ejects it too, but the `override_host` policy sends a request to the pod the
//! filter names whatever its health: seen in Envoy 1.40, `test-harness/e2e/tests/edges.rs`).
//!
//! It keeps, per pod, how long its answers take too (`life_ms`: from routing to the end of the
//! answer, decayed mean): a request for a LoRA adapter that cannot join the pod's batch waits for
//! an adapter there to finish its requests ([`crate::lora::Placement::blocked`]), a wait in
//! request lives, not in prefill tokens.
//!
//! Encoding (little-endian): `b'L' | version u8 = 5 | mean_prefill_tokens f32 | count u16 |
//! (len u8 | address | in_flight u32 | pending_tokens u32 | fit 8 × f64 | errors u16 |
//! ejected_until_ms u64 | life_ms f32) * count`. A value that
//! does not decode reads as empty: the table is an estimate and heals itself.

use crate::predict::Fit;
use crate::store::SharedStore;
use crate::wire::Reader;
use std::collections::BTreeMap;

const TAG: [u8; 2] = [b'L', 5];
/// Consecutive server errors after which a pod is put behind the others (Envoy's
/// `consecutive_5xx` default is 5; the shipped clusters use the same).
pub const EJECT_AFTER_ERRORS: u16 = 5;
/// How long a pod stays behind the others after its last error in such a run (then one request
/// probes it: a success clears it, another error puts it back at once).
pub const EJECT_MS: u64 = 10_000;
/// Weight of a new request in the pool's mean prefill size.
const MEAN_ALPHA: f32 = 0.05;
/// Weight of a new answer in a pod's mean request life (≈ the last 10 answers count).
const LIFE_ALPHA: f32 = 0.1;
/// Entries kept at most; idle ones go first.
const MAX_ENTRIES: usize = 4096;

/// Shared-data key of a pool's live table.
pub fn key(pool: &str) -> String {
    format!("llmr/if/{pool}")
}

/// Shared-data key of a pool's table as it was when the current snapshot was accepted.
pub fn baseline_key(pool: &str) -> String {
    format!("llmr/ifb/{pool}")
}

/// One pod's entry.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PodLoad {
    pub in_flight: u32,
    pub pending_tokens: u32,
    pub fit: Fit,
    /// Server errors (5xx) in a row from this pod; a success resets it.
    pub errors: u16,
    /// Until when (host ms) the pod goes behind the others; 0 = not.
    pub ejected_until_ms: u64,
    /// Decayed mean time from routing to the end of the answer of the requests the pod
    /// answered, in ms (0 = none yet).
    pub life_ms: f32,
}

impl PodLoad {
    fn idle(&self) -> bool {
        self.in_flight == 0 && self.pending_tokens == 0 && self.errors == 0
    }

    /// Whether the pod is behind the others at `now_ms` (a run of errors ended recently).
    pub fn ejected(&self, now_ms: u64) -> bool {
        self.errors >= EJECT_AFTER_ERRORS && now_ms < self.ejected_until_ms
    }
}

/// How a routed request's answer went, for the pod's error run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The pod answered (any status below 500): its error run ends.
    Answered,
    /// The pod answered with a server error (5xx).
    ServerError,
    /// Nothing is known (no answer reached the filter: a client abort, a reset).
    Unknown,
}

impl Outcome {
    /// From the response status the pod sent (0 = none).
    pub fn of_status(status: u16) -> Outcome {
        match status {
            0 => Outcome::Unknown,
            500.. => Outcome::ServerError,
            _ => Outcome::Answered,
        }
    }
}

/// A decoded table. Small (one entry per pod), kept as a vector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    /// Mean estimated prefill tokens (prompt tokens not cached on the chosen pod) of the requests
    /// routed to the pool (0 = none yet).
    pub mean_prefill_tokens: f32,
    pub entries: Vec<(String, PodLoad)>,
}

impl Table {
    /// Decodes; anything malformed reads as empty.
    pub fn decode(bytes: &[u8]) -> Table {
        Table::try_decode(bytes).unwrap_or_default()
    }

    fn try_decode(bytes: &[u8]) -> Option<Table> {
        let mut r = Reader(bytes);
        if r.array::<2>()? != TAG {
            return None;
        }
        let mean = r.f32()?;
        let n = r.u16()?;
        let mut entries = Vec::with_capacity(usize::from(n).min(MAX_ENTRIES));
        for _ in 0..n {
            let addr = r.str8()?;
            let load = PodLoad {
                in_flight: r.u32()?,
                pending_tokens: r.u32()?,
                fit: Fit {
                    n: r.f64()?,
                    sw: r.f64()?,
                    st: r.f64()?,
                    sww: r.f64()?,
                    swt: r.f64()?,
                    pn: r.f64()?,
                    pww: r.f64()?,
                    pwt: r.f64()?,
                },
                errors: r.u16()?,
                ejected_until_ms: r.u64()?,
                life_ms: finite(r.f32()?),
            };
            entries.push((addr.to_string(), load));
        }
        r.done().then_some(Table {
            mean_prefill_tokens: finite(mean),
            entries,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let kept = || {
            self.entries
                .iter()
                .filter(|(a, _)| a.len() <= 255)
                .take(usize::from(u16::MAX))
        };
        let mut out = Vec::with_capacity(8 + self.entries.len() * 64);
        out.extend_from_slice(&TAG);
        out.extend_from_slice(&self.mean_prefill_tokens.to_le_bytes());
        out.extend_from_slice(&(kept().count() as u16).to_le_bytes());
        for (addr, l) in kept() {
            out.push(addr.len() as u8);
            out.extend_from_slice(addr.as_bytes());
            out.extend_from_slice(&l.in_flight.to_le_bytes());
            out.extend_from_slice(&l.pending_tokens.to_le_bytes());
            for x in [
                l.fit.n, l.fit.sw, l.fit.st, l.fit.sww, l.fit.swt, l.fit.pn, l.fit.pww, l.fit.pwt,
            ] {
                out.extend_from_slice(&x.to_le_bytes());
            }
            out.extend_from_slice(&l.errors.to_le_bytes());
            out.extend_from_slice(&l.ejected_until_ms.to_le_bytes());
            out.extend_from_slice(&l.life_ms.to_le_bytes());
        }
        out
    }

    /// The entry for `addr` (all zero when absent).
    pub fn get(&self, addr: &str) -> PodLoad {
        self.entries
            .iter()
            .find(|(a, _)| a == addr)
            .map(|(_, l)| *l)
            .unwrap_or_default()
    }

    /// The entries of `addrs`, in their order (zero for absent ones): one pass over the table
    /// instead of a linear search per address (pools have up to thousands of pods).
    pub fn get_all<'a>(&self, addrs: impl IntoIterator<Item = &'a str>) -> Vec<PodLoad> {
        let by_addr: BTreeMap<&str, PodLoad> =
            self.entries.iter().map(|(a, l)| (a.as_str(), *l)).collect();
        addrs
            .into_iter()
            .map(|a| by_addr.get(a).copied().unwrap_or_default())
            .collect()
    }

    /// Requests in flight to `addr`.
    pub fn in_flight(&self, addr: &str) -> u32 {
        self.get(addr).in_flight
    }

    /// Applies `f` to `addr`'s entry, adding the entry when it is new.
    fn with(&mut self, addr: &str, f: impl FnOnce(&mut PodLoad)) {
        match self.entries.iter_mut().find(|(a, _)| a == addr) {
            Some((_, l)) => f(l),
            None => {
                let mut l = PodLoad::default();
                f(&mut l);
                self.entries.push((addr.to_string(), l));
            }
        }
    }

    /// Pods with nothing in flight and nothing learned do not accumulate; past the bound, idle
    /// entries go first.
    fn tidy(&mut self) {
        self.entries
            .retain(|(_, l)| !(l.idle() && l.fit.n < 1e-3 && l.life_ms <= 0.0));
        if self.entries.len() > MAX_ENTRIES {
            self.entries.sort_by_key(|(_, l)| l.idle());
            self.entries.truncate(MAX_ENTRIES);
        }
    }
}

/// A decoded mean: finite and not negative, else 0 (unknown).
fn finite(x: f32) -> f32 {
    if x.is_finite() {
        x.max(0.0)
    } else {
        0.0
    }
}

/// Reads a pool's live table.
pub fn read(store: &impl SharedStore, pool: &str) -> Table {
    store
        .get(&key(pool))
        .map(|(v, _)| Table::decode(&v))
        .unwrap_or_default()
}

/// This proxy's tally for a metrics hub: per pool of `pools`, the pods with requests in flight
/// or prompt tokens pending, and the long contexts it placed most recently
/// ([`crate::placed::placed`]) (`replica` 0: the sidecar that sends it stamps its own id).
/// Every Envoy worker writes the same shared tables, so this is the whole proxy's work.
pub fn tally<'a>(
    store: &impl SharedStore,
    pools: impl IntoIterator<Item = &'a str>,
    now_ms: u64,
) -> llm_router_snapshot::Tally {
    let pools = pools
        .into_iter()
        .map(|name| llm_router_snapshot::TallyPool {
            name: name.to_string(),
            pods: read(store, name)
                .entries
                .into_iter()
                .filter(|(_, l)| l.in_flight > 0 || l.pending_tokens > 0)
                .map(|(address, l)| llm_router_snapshot::TallyPod {
                    address,
                    in_flight: l.in_flight,
                    pending_tokens: l.pending_tokens,
                })
                .collect(),
            contexts: crate::placed::placed(store, name),
        })
        .filter(|p| !p.pods.is_empty() || !p.contexts.is_empty())
        .collect();
    llm_router_snapshot::Tally {
        replica: 0,
        seq: 0,
        taken_ms: now_ms,
        pools,
    }
}

/// A number that changes whenever what [`tally`] returns for `pools` may have changed: the
/// compare-and-swap tokens of each pool's live table and ring of placed contexts, mixed with
/// the pool names (a new snapshot of the same pools does not move it: the sidecar pushes one
/// per hub frame, and a tally read answered per push would be the polling it replaces).
/// Nothing is decoded,
/// so a worker holding a sidecar's tally read checks it on every tick
/// ([`llm_router_snapshot::tally::TALLY_VERSION_HEADER`]). It may change with no change to the
/// tally (a learned rate moves with a first byte), never the other way round.
pub fn tally_version<'a>(
    store: &impl SharedStore,
    pools: impl IntoIterator<Item = &'a str>,
) -> u64 {
    let cas = |k: &str| store.get(k).map_or(0, |(_, c)| u64::from(c) + 1);
    pools.into_iter().fold(0, |v, name| {
        let tokens = (cas(&key(name)) << 32) ^ cas(&crate::placed::placed_key(name));
        crate::score::mix(v ^ xxhash_rust::xxh64::xxh64(name.as_bytes(), 0), tokens)
    })
}

/// Reads a pool's live table with its compare-and-swap token, for a later
/// [`routed_after_read`] that writes without reading the key again.
pub fn read_for_update(store: &impl SharedStore, pool: &str) -> (Table, Option<u32>) {
    match store.get(&key(pool)) {
        Some((v, cas)) => (Table::decode(&v), Some(cas)),
        None => (Table::default(), None),
    }
}

/// Reads a pool's baseline table.
pub fn read_baseline(store: &impl SharedStore, pool: &str) -> Table {
    store
        .get(&baseline_key(pool))
        .map(|(v, _)| Table::decode(&v))
        .unwrap_or_default()
}

/// Applies `change` to the pool's table with compare-and-swap; gives up after a bounded number
/// of conflicts (the table is an estimate; losing one update under extreme contention is
/// preferable to spinning inside a request). Returns whether the update landed.
pub fn update(store: &impl SharedStore, pool: &str, change: impl FnMut(&mut Table)) -> bool {
    update_from(store, pool, None, change)
}

/// [`update`], starting from a table already read (with its CAS token) in this request: when
/// no other worker wrote since, the update costs one write and no read.
fn update_from(
    store: &impl SharedStore,
    pool: &str,
    first: Option<(Table, Option<u32>)>,
    mut change: impl FnMut(&mut Table),
) -> bool {
    crate::store::update(store, &key(pool), first, Table::decode, |table| {
        change(table);
        table.tidy();
        table.encode()
    })
}

/// A request that brings `tokens` estimated tokens of prefill work was sent to `addr`.
pub fn routed(store: &impl SharedStore, pool: &str, addr: &str, tokens: u32) -> bool {
    routed_after_read(store, pool, None, addr, tokens)
}

/// [`routed`], given the table (and CAS token) this request already read to rank the pods:
/// the common case writes once without reading again; a concurrent write by another worker
/// makes the CAS fail and the update retries from a fresh read.
pub fn routed_after_read(
    store: &impl SharedStore,
    pool: &str,
    read: Option<(Table, Option<u32>)>,
    addr: &str,
    tokens: u32,
) -> bool {
    update_from(store, pool, read, |t| {
        t.with(addr, |l| {
            l.in_flight = l.in_flight.saturating_add(1);
            l.pending_tokens = l.pending_tokens.saturating_add(tokens);
        });
        t.mean_prefill_tokens = if t.mean_prefill_tokens > 0.0 {
            t.mean_prefill_tokens + MEAN_ALPHA * (tokens as f32 - t.mean_prefill_tokens)
        } else {
            tokens as f32
        };
    })
}

/// The first response byte of a request arrived from `addr`: its `tokens` are no longer
/// pending, and when `observed = Some((work, ttft_ms))` the pod's fit learns from it (its own
/// `tokens` among the `work` tell whether it measured prefill speed).
pub fn first_byte(
    store: &impl SharedStore,
    pool: &str,
    addr: &str,
    tokens: u32,
    observed: Option<(f64, f64)>,
) -> bool {
    update(store, pool, |t| {
        t.with(addr, |l| {
            l.pending_tokens = l.pending_tokens.saturating_sub(tokens);
            if let Some((work, ttft)) = observed {
                l.fit.observe(work, f64::from(tokens), ttft);
            }
        });
    })
}

/// A request's stream to `addr` ended; `pending` is what it still had pending (its tokens when
/// no first byte ever came, else 0).
pub fn finished(store: &impl SharedStore, pool: &str, addr: &str, pending: u32) -> bool {
    finished_with(store, pool, addr, pending, Ending::unknown())
}

/// How a routed request's answer ended, for [`finished_with`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ending {
    pub outcome: Outcome,
    /// Host time (ms) of the end; read only for server errors (an error run's window).
    pub now_ms: u64,
    /// Time from routing to the end, when the pod answered.
    pub life_ms: Option<f64>,
}

impl Ending {
    /// Nothing known of how it went.
    pub fn unknown() -> Ending {
        Ending {
            outcome: Outcome::Unknown,
            now_ms: 0,
            life_ms: None,
        }
    }
}

/// [`finished`], with how the pod answered: a server error extends its error run and, from
/// [`EJECT_AFTER_ERRORS`] in a row, puts it behind the others for [`EJECT_MS`]; an answer ends
/// the run and, with its life, updates the pod's [`PodLoad::life_ms`]. In the same update as
/// the count, so it costs no extra write.
pub fn finished_with(
    store: &impl SharedStore,
    pool: &str,
    addr: &str,
    pending: u32,
    end: Ending,
) -> bool {
    let Ending {
        outcome,
        now_ms,
        life_ms,
    } = end;
    update(store, pool, |t| {
        t.with(addr, |l| {
            l.in_flight = l.in_flight.saturating_sub(1);
            l.pending_tokens = l.pending_tokens.saturating_sub(pending);
            match outcome {
                Outcome::Answered => {
                    l.errors = 0;
                    l.ejected_until_ms = 0;
                    if let Some(life) = life_ms.filter(|x| x.is_finite() && *x >= 0.0) {
                        let life = life as f32;
                        l.life_ms = if l.life_ms > 0.0 {
                            l.life_ms + LIFE_ALPHA * (life - l.life_ms)
                        } else {
                            life
                        };
                    }
                }
                Outcome::ServerError => {
                    l.errors = l.errors.saturating_add(1);
                    if l.errors >= EJECT_AFTER_ERRORS {
                        l.ejected_until_ms = now_ms.saturating_add(EJECT_MS);
                    }
                }
                Outcome::Unknown => {}
            }
        });
    })
}

/// A request counted on `from` was served by `to` (an Envoy retry to a fallback endpoint).
pub fn moved(store: &impl SharedStore, pool: &str, from: &str, to: &str, pending: u32) -> bool {
    update(store, pool, |t| {
        t.with(from, |l| {
            l.in_flight = l.in_flight.saturating_sub(1);
            l.pending_tokens = l.pending_tokens.saturating_sub(pending);
        });
        t.with(to, |l| {
            l.in_flight = l.in_flight.saturating_add(1);
            l.pending_tokens = l.pending_tokens.saturating_add(pending);
        });
    })
}

/// Most (pool, pod) entries a [`Ledger`] holds; past it new decrements are dropped (and
/// counted).
pub const MAX_LEDGER_ENTRIES: usize = 1024;

/// Decrements one worker still has to apply to a pod's entry (at the next [`Ledger::settle`]):
/// their compare-and-swap lost every one of its attempts under contention (see [`update`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Decrements {
    pub in_flight: u32,
    pub pending_tokens: u32,
}

/// A worker's ledger of decrements that did not land. Without it a lost `finished` would leave
/// the pod one request busier for as long as the proxy runs; with it the decrement is deferred
/// to the next [`Ledger::settle`] (the filter's once-a-second tick), in one update per pool.
///
/// Only decrements are kept: a count that is low for a while is an estimate that heals when its
/// request ends (saturating at zero), a count that is high forever is not. So a lost
/// [`moved`] defers its `from` entry's decrement and drops the `to` increment; a lost
/// [`first_byte`] defers its pending tokens (its timing sample is dropped). Bounded by [`MAX_LEDGER_ENTRIES`].
#[derive(Debug, Default)]
pub struct Ledger {
    deferred: BTreeMap<(String, String), Decrements>,
    /// Decrements not deferred because the ledger was full.
    pub dropped: u64,
}

impl Ledger {
    /// Defers these decrements of `addr` in `pool` to the next [`Ledger::settle`] (they add up
    /// with any already deferred there).
    pub fn defer_decrement(&mut self, pool: &str, addr: &str, in_flight: u32, pending_tokens: u32) {
        if in_flight == 0 && pending_tokens == 0 {
            return;
        }
        let key = (pool.to_string(), addr.to_string());
        if !self.deferred.contains_key(&key) && self.deferred.len() >= MAX_LEDGER_ENTRIES {
            self.dropped = self.dropped.saturating_add(1);
            return;
        }
        let o = self.deferred.entry(key).or_default();
        o.in_flight = o.in_flight.saturating_add(in_flight);
        o.pending_tokens = o.pending_tokens.saturating_add(pending_tokens);
    }

    /// Whether nothing is deferred.
    pub fn is_empty(&self) -> bool {
        self.deferred.is_empty()
    }

    /// The decrements deferred for `addr` in `pool` (zero when none).
    pub fn deferred(&self, pool: &str, addr: &str) -> Decrements {
        self.deferred
            .get(&(pool.to_string(), addr.to_string()))
            .copied()
            .unwrap_or_default()
    }

    /// Applies the deferred decrements, one table update per pool; a pool whose update fails
    /// again stays deferred to the next call. Returns the number of entries settled.
    pub fn settle(&mut self, store: &impl SharedStore) -> usize {
        if self.deferred.is_empty() {
            return 0;
        }
        let pools: Vec<String> = {
            let mut p: Vec<String> = self.deferred.keys().map(|(pool, _)| pool.clone()).collect();
            p.dedup();
            p
        };
        let mut settled = 0;
        for pool in pools {
            let due: Vec<(String, Decrements)> = self
                .deferred
                .iter()
                .filter(|((p, _), _)| *p == pool)
                .map(|((_, a), o)| (a.clone(), *o))
                .collect();
            let landed = update(store, &pool, |t| {
                for (addr, o) in &due {
                    t.with(addr, |l| {
                        l.in_flight = l.in_flight.saturating_sub(o.in_flight);
                        l.pending_tokens = l.pending_tokens.saturating_sub(o.pending_tokens);
                    });
                }
            });
            if landed {
                for (addr, _) in &due {
                    self.deferred.remove(&(pool.clone(), addr.clone()));
                }
                settled += due.len();
            }
        }
        settled
    }
}

/// Copies a pool's live table to its baseline (called when a snapshot is accepted).
pub fn snapshot_baseline(store: &impl SharedStore, pool: &str) {
    let live = store
        .get(&key(pool))
        .map(|(v, _)| v)
        .unwrap_or_else(|| Table::default().encode());
    let _ = store.set(&baseline_key(pool), &live, None);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::store::{MemoryStore, StoreError};

    #[test]
    fn counts_and_pending_work_go_up_and_down_and_idle_entries_vanish() {
        let s = MemoryStore::new();
        assert!(routed(&s, "p", "10.0.0.1:8000", 100));
        assert!(routed(&s, "p", "10.0.0.1:8000", 300));
        assert!(routed(&s, "p", "10.0.0.2:8000", 50));
        let t = read(&s, "p");
        assert_eq!(t.get("10.0.0.1:8000").in_flight, 2);
        assert_eq!(t.get("10.0.0.1:8000").pending_tokens, 400);
        assert_eq!(t.in_flight("10.0.0.2:8000"), 1);
        first_byte(&s, "p", "10.0.0.1:8000", 100, None);
        assert_eq!(read(&s, "p").get("10.0.0.1:8000").pending_tokens, 300);
        // Ends: one after its first byte (nothing pending), one before (its tokens pending).
        finished(&s, "p", "10.0.0.1:8000", 0);
        finished(&s, "p", "10.0.0.1:8000", 300);
        finished(&s, "p", "10.0.0.2:8000", 50);
        finished(&s, "p", "10.0.0.2:8000", 50); // never below zero
        let t = read(&s, "p");
        assert_eq!(t.entries, vec![]);
        assert!(t.mean_prefill_tokens > 50.0 && t.mean_prefill_tokens < 300.0);
        assert_eq!(read(&s, "other").entries, vec![]);
    }

    #[test]
    fn the_tally_lists_the_pods_with_work_in_flight_and_nothing_else() {
        let s = MemoryStore::new();
        routed(&s, "p", "10.0.0.1:8000", 100);
        routed(&s, "p", "10.0.0.1:8000", 300);
        routed(&s, "p", "10.0.0.2:8000", 50);
        first_byte(&s, "p", "10.0.0.2:8000", 50, Some((50.0, 20.0)));
        routed(&s, "q", "10.0.1.1:8000", 7);
        finished(&s, "q", "10.0.1.1:8000", 7); // ended: only its learned fit stays
        let t = tally(&s, ["p", "q", "absent"], 1_234);
        assert_eq!((t.replica, t.taken_ms), (0, 1_234));
        assert_eq!(t.pools.len(), 1, "pools without work are left out");
        let pods: Vec<(&str, u32, u32)> = t.pools[0]
            .pods
            .iter()
            .map(|p| (p.address.as_str(), p.in_flight, p.pending_tokens))
            .collect();
        assert_eq!(
            pods,
            vec![("10.0.0.1:8000", 2, 400), ("10.0.0.2:8000", 1, 0)]
        );
    }

    #[test]
    fn the_tally_version_moves_with_every_change_a_tally_can_show_and_only_for_its_pools() {
        let s = MemoryStore::new();
        let v = |_: u8| tally_version(&s, ["p", "q"]);
        let idle = v(7);
        assert_eq!(v(7), idle, "nothing changed, nothing moves");
        assert_ne!(tally_version(&s, ["p"]), idle, "other pools");
        let mut seen = vec![idle];
        let mut moved = |what: &str| {
            let now = v(7);
            assert!(!seen.contains(&now), "{what}: the version did not move");
            seen.push(now);
        };
        routed(&s, "p", "10.0.0.1:8000", 100);
        moved("routed");
        first_byte(&s, "p", "10.0.0.1:8000", 100, None);
        moved("first byte");
        finished(&s, "p", "10.0.0.1:8000", 0);
        moved("finished");
        let ctx = llm_router_snapshot::PeerContext {
            key: 9,
            pod: 1,
            blocks: 4,
        };
        crate::placed::note_placed(&s, "q", ctx);
        moved("a placed context");
        let before = v(7);
        routed(&s, "elsewhere", "10.0.0.1:8000", 100);
        assert_eq!(v(7), before, "a pool the tally does not list");
    }

    #[test]
    fn observations_stay_after_the_requests_end() {
        let s = MemoryStore::new();
        for i in 0..5u32 {
            routed(&s, "p", "a:1", 100 * (i + 1));
            first_byte(
                &s,
                "p",
                "a:1",
                100 * (i + 1),
                Some((f64::from(100 * (i + 1)), 50.0)),
            );
            finished(&s, "p", "a:1", 0);
        }
        let l = read(&s, "p").get("a:1");
        assert_eq!((l.in_flight, l.pending_tokens), (0, 0));
        assert!(l.fit.trusted());
    }

    #[test]
    fn a_pods_request_life_is_learned_from_its_answers_only() {
        let s = MemoryStore::new();
        let answered = |life| Ending {
            outcome: Outcome::Answered,
            now_ms: 0,
            life_ms: Some(life),
        };
        routed(&s, "p", "a:1", 10);
        finished_with(&s, "p", "a:1", 0, answered(1000.0));
        assert_eq!(
            read(&s, "p").get("a:1").life_ms,
            1000.0,
            "the first answer sets it"
        );
        for _ in 0..60 {
            routed(&s, "p", "a:1", 10);
            finished_with(&s, "p", "a:1", 0, answered(200.0));
        }
        let life = read(&s, "p").get("a:1").life_ms;
        assert!(
            (200.0..210.0).contains(&life),
            "decays to new answers: {life}"
        );
        // Errors, unknown ends and nonsense do not move it; it survives the pod going idle.
        routed(&s, "p", "a:1", 10);
        finished_with(
            &s,
            "p",
            "a:1",
            0,
            Ending {
                outcome: Outcome::ServerError,
                now_ms: 5,
                life_ms: Some(9e9),
            },
        );
        routed(&s, "p", "a:1", 10);
        finished_with(&s, "p", "a:1", 0, answered(f64::NAN));
        routed(&s, "p", "a:1", 10);
        finished(&s, "p", "a:1", 0);
        let l = read(&s, "p").get("a:1");
        assert_eq!((l.in_flight, l.life_ms), (0, life));
        assert_eq!(Table::decode(&read(&s, "p").encode()), read(&s, "p"));
    }

    #[test]
    fn a_retry_moves_the_count_and_the_pending_work() {
        let s = MemoryStore::new();
        routed(&s, "p", "a:1", 70);
        moved(&s, "p", "a:1", "b:2", 70);
        let t = read(&s, "p");
        assert_eq!(t.get("a:1"), PodLoad::default());
        assert_eq!(
            (t.get("b:2").in_flight, t.get("b:2").pending_tokens),
            (1, 70)
        );
    }

    #[test]
    fn baseline_is_a_copy_at_snapshot_time() {
        let s = MemoryStore::new();
        routed(&s, "p", "a:1", 1);
        snapshot_baseline(&s, "p");
        routed(&s, "p", "a:1", 1);
        assert_eq!(read_baseline(&s, "p").in_flight("a:1"), 1);
        assert_eq!(read(&s, "p").in_flight("a:1"), 2);
    }

    #[test]
    fn corrupt_tables_read_as_empty() {
        let good = {
            let s = MemoryStore::new();
            routed(&s, "p", "x:1", 7);
            s.get(&key("p")).unwrap().0
        };
        assert_eq!(Table::decode(&good).in_flight("x:1"), 1);
        for cut in 0..good.len() {
            assert_eq!(
                Table::decode(&good[..cut]),
                Table::default(),
                "cut at {cut}"
            );
        }
        let mut extra = good.clone();
        extra.push(0);
        assert_eq!(Table::decode(&extra), Table::default());
        // The version-1 layout (count u16 first) is not misread.
        assert_eq!(
            Table::decode(&[1, 0, 3, b'a', b':', b'1', 1, 0, 0, 0]),
            Table::default()
        );
    }

    /// A store whose writes lose their compare-and-swap `fail` more times (as under heavy
    /// contention from other workers), then behave.
    struct ContendedStore {
        inner: MemoryStore,
        fail: std::cell::Cell<u32>,
    }

    impl SharedStore for ContendedStore {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.inner.get(key)
        }

        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            if self.fail.get() > 0 {
                self.fail.set(self.fail.get() - 1);
                return Err(StoreError::CasMismatch);
            }
            self.inner.set(key, value, cas)
        }
    }

    /// A `finished` that loses 32 compare-and-swaps in a row used to be lost forever: the pod
    /// stayed one request busier for the life of the proxy. The ledger pays it on the next
    /// settle, and keeps it while the store still refuses.
    #[test]
    fn a_decrement_that_lost_every_cas_is_paid_later_from_the_ledger() {
        let s = ContendedStore {
            inner: MemoryStore::new(),
            fail: std::cell::Cell::new(0),
        };
        let mut ledger = Ledger::default();
        assert!(routed(&s, "p", "a:1", 100));
        assert!(routed(&s, "p", "b:2", 10));
        assert!(routed(&s, "p", "b:2", 10));
        s.fail.set(1000);
        assert!(!finished(&s, "p", "a:1", 100), "lost under contention");
        ledger.defer_decrement("p", "a:1", 1, 100);
        assert!(!moved(&s, "p", "b:2", "c:3", 10));
        ledger.defer_decrement("p", "b:2", 1, 10);
        assert!(!first_byte(&s, "p", "b:2", 10, None));
        ledger.defer_decrement("p", "b:2", 0, 10);
        assert_eq!(
            ledger.deferred("p", "b:2"),
            Decrements {
                in_flight: 1,
                pending_tokens: 20
            }
        );
        // Still contended: nothing settles, nothing is forgotten.
        assert_eq!(ledger.settle(&s), 0);
        assert!(!ledger.is_empty());
        assert_eq!(read(&s, "p").in_flight("a:1"), 1, "the leak");
        // Contention over: the debts land in one update and the counts are right again.
        s.fail.set(0);
        assert_eq!(ledger.settle(&s), 2);
        assert!(ledger.is_empty());
        let t = read(&s, "p");
        assert_eq!(t.get("a:1"), PodLoad::default());
        assert_eq!(
            (t.get("b:2").in_flight, t.get("b:2").pending_tokens),
            (1, 0)
        );
        // The other request on b:2 ends normally.
        assert!(finished(&s, "p", "b:2", 0));
        assert_eq!(read(&s, "p").entries, vec![]);
    }

    #[test]
    fn the_ledger_is_bounded() {
        let mut ledger = Ledger::default();
        for i in 0..MAX_LEDGER_ENTRIES + 10 {
            ledger.defer_decrement("p", &format!("10.0.{}.{}:1", i / 256, i % 256), 1, 0);
        }
        ledger.defer_decrement("p", "10.0.0.0:1", 1, 0); // an existing entry still adds up
        assert_eq!(ledger.deferred("p", "10.0.0.0:1").in_flight, 2);
        assert_eq!(ledger.dropped, 10);
        let s = MemoryStore::new();
        assert_eq!(ledger.settle(&s), MAX_LEDGER_ENTRIES);
    }

    /// Two "workers" interleaving read-modify-write: CAS keeps every update.
    #[test]
    fn cas_conflicts_are_retried() {
        let s = MemoryStore::new();
        routed(&s, "p", "a:1", 1);
        let (v, cas) = s.get(&key("p")).unwrap();
        routed(&s, "p", "a:1", 1); // another worker wins the race
        let mut t = Table::decode(&v);
        t.with("a:1", |l| l.in_flight += 1);
        assert_eq!(
            s.set(&key("p"), &t.encode(), Some(cas)),
            Err(StoreError::CasMismatch)
        );
        assert_eq!(read(&s, "p").in_flight("a:1"), 2);
    }
}
