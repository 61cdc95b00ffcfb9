//! LoRA placement: a stable home pod for every adapter, and which adapters a pod probably holds.
//!
//! **Homes.** Each adapter's home is its highest rendezvous-hash pod that still has room, taking
//! the adapters in name order, where a pod has room for `max(max_loras, ⌈adapters / pods⌉)`
//! adapters (bounded-load rendezvous). With no more adapters than the pool's GPU slots no pod is
//! home to more adapters than it has slots, so adapters that stay home never evict each other;
//! with more, every pod takes an equal share and the engine's CPU cache absorbs the rest. The
//! homes depend only on the adapter names and the pod addresses, so every worker and every
//! gateway replica computes the same ones without sharing state.
//!
//! **Residency.** vLLM's `lora_requests_info` lists only adapters with requests in the engine
//! (V1: requests it has scheduled; see [`placement`]), not the ones idle in their slots, so a pod
//! whose slots are full of idle adapters
//! looks free. The filter therefore also remembers, per pod, the adapters it routed there most
//! recently (shared by all workers): an adapter among a pod's last `max_loras` is probably still
//! loaded, and a pod whose last `max_loras` distinct adapters fill its slots has no free one.
//!
//! **Batch slots.** An engine runs requests of at most `max_loras` adapters in one batch (vLLM:
//! `--max-loras`); a request for another adapter waits in the engine's queue until every request
//! of one adapter in the batch has ended, while later requests for the batch's adapters join it
//! ahead of the waiting one. Such a pod is [`Placement::blocked`] for the adapter: its wait is
//! counted in request lives ([`crate::inflight::PodLoad::life_ms`]), not in the adapter's load
//! time. Measured on real vLLM (`vllm_lora`, 2 pods × 2 slots, 8 adapters; results
//! `test-harness/bench/results/real-v1.md`): without it the six rarer adapters waited at their
//! home for a slot (TTFT p95 1,716 ms against 1,247–1,569 for the other routers).
//! When every pod is blocked, the pods differ in how soon a slot frees: a slot frees at the
//! first lull of one request life in its adapter's traffic, rare for an adapter that keeps it
//! busy ([`drain_lives`], from this proxy's requests in flight per pod and adapter, kept in the
//! recent-adapter table), and the adapters already waiting there for a slot
//! ([`Placement::slot_queue`]) are ahead of this one: vLLM's scheduler keeps the requests it
//! skips for want of a slot in arrival order and gives a freed slot to the first of them. vLLM V1
//! does not report them; this proxy's own requests do ([`placement`]).
//!
//! Recent-adapter table encoding (little-endian): `b'A' | version u8 = 2 | count u16 |
//! (len u8 | address | n u8 | (len u8 | adapter | in_flight u16) * n) * count`.

use crate::store::SharedStore;
use crate::wire::Reader;
use llm_router_snapshot::LoraState;
use std::collections::HashMap;

/// Adapters remembered per pod.
const RECENT: usize = 16;
/// Recent-adapter table tag and version.
const TAG: [u8; 2] = [b'A', 2];

/// Rendezvous (highest-random-weight) hash of an adapter on a pod.
pub fn rendezvous(adapter: &str, address: &str) -> u64 {
    weight(adapter_seed(adapter), address)
}

fn adapter_seed(adapter: &str) -> u64 {
    xxhash_rust::xxh64::xxh64(adapter.as_bytes(), 0x4C6F_5241)
}

fn weight(seed: u64, address: &str) -> u64 {
    xxhash_rust::xxh64::xxh64(address.as_bytes(), seed)
}

/// Home pod (index into `pods`) of each adapter, by bounded-load rendezvous.
/// `slots[i]` is pod `i`'s `max_loras` (0 when unknown).
pub fn homes(adapters: &[String], pods: &[&str], slots: &[u16]) -> HashMap<String, usize> {
    let mut names: Vec<&String> = adapters.iter().collect();
    names.sort();
    names.dedup();
    let mut out = HashMap::with_capacity(names.len());
    if pods.is_empty() {
        return out;
    }
    let share = names.len().div_ceil(pods.len());
    let mut room: Vec<usize> = (0..pods.len())
        .map(|i| {
            usize::from(slots.get(i).copied().unwrap_or(0))
                .max(share)
                .max(1)
        })
        .collect();
    for name in names {
        // The highest-weight pod with room left (the first of equal weights): one hash per
        // pod, no sort — adapters × pods hashes in all (a sort hashed inside its key cost
        // adapters × pods × log pods: 7.8 s for 1,000 adapters on 4,096 pods under wasmtime).
        let seed = adapter_seed(name);
        let mut best: Option<(u64, usize)> = None;
        for (i, pod) in pods.iter().enumerate() {
            if room.get(i).copied().unwrap_or(0) == 0 {
                continue;
            }
            let w = weight(seed, pod);
            if best.is_none_or(|(b, _)| w > b) {
                best = Some((w, i));
            }
        }
        if let Some((_, i)) = best {
            if let Some(r) = room.get_mut(i) {
                *r -= 1;
            }
            out.insert(name.clone(), i);
        }
    }
    out
}

/// What [`homes`] depends on, hashed: equal keys give equal homes, so a new snapshot of the same
/// pods, slots and adapters reuses the last one's homes instead of solving them again.
pub fn homes_key(adapters: &[String], pods: &[&str], slots: &[u16]) -> u64 {
    let mut names: Vec<&String> = adapters.iter().collect();
    names.sort();
    names.dedup();
    let mut h = xxhash_rust::xxh64::Xxh64::new(0x486F_6D65);
    for n in names {
        h.update(n.as_bytes());
        h.update(&[0]);
    }
    h.update(&[1]);
    for (i, p) in pods.iter().enumerate() {
        h.update(p.as_bytes());
        h.update(&slots.get(i).copied().unwrap_or(0).to_le_bytes());
    }
    h.digest()
}

/// The plain rendezvous home among `pods` (for adapters the configuration does not list).
pub fn rendezvous_home(adapter: &str, pods: &[&str]) -> Option<usize> {
    pods.iter()
        .enumerate()
        .max_by_key(|(_, p)| rendezvous(adapter, p))
        .map(|(i, _)| i)
}

/// Shared-data key of a pool's recent-adapter table.
pub fn key(pool: &str) -> String {
    format!("llmr/lora/{pool}")
}

/// One entry of a pod's [`Recent`] list: an adapter this proxy recently routed to the pod,
/// with its requests for it there that have not ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentAdapter {
    pub adapter: String,
    pub in_flight: u16,
}

/// Per pod, the adapters most recently routed there (most recent first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recent {
    pub pods: Vec<(String, Vec<RecentAdapter>)>,
}

impl Recent {
    pub fn decode(bytes: &[u8]) -> Recent {
        Recent::try_decode(bytes).unwrap_or_default()
    }

    fn try_decode(bytes: &[u8]) -> Option<Recent> {
        let mut r = Reader(bytes);
        if r.array::<2>()? != TAG {
            return None;
        }
        let count = r.u16()?;
        let mut pods = Vec::with_capacity(usize::from(count).min(4096));
        for _ in 0..count {
            let addr = r.str8()?.to_string();
            let n = r.u8()?;
            let adapters = (0..n)
                .map(|_| {
                    let adapter = r.str8()?.to_string();
                    let in_flight = r.u16()?;
                    Some(RecentAdapter { adapter, in_flight })
                })
                .collect::<Option<Vec<RecentAdapter>>>()?;
            pods.push((addr, adapters));
        }
        r.done().then_some(Recent { pods })
    }

    pub fn encode(&self) -> Vec<u8> {
        let ok = |s: &String| s.len() <= 255;
        let pods: Vec<&(String, Vec<RecentAdapter>)> = self
            .pods
            .iter()
            .filter(|(a, _)| ok(a))
            .take(usize::from(u16::MAX))
            .collect();
        let mut out = Vec::new();
        out.extend_from_slice(&TAG);
        out.extend_from_slice(&(pods.len() as u16).to_le_bytes());
        for (addr, adapters) in pods {
            out.push(addr.len() as u8);
            out.extend_from_slice(addr.as_bytes());
            let kept: Vec<&RecentAdapter> = adapters
                .iter()
                .filter(|a| ok(&a.adapter))
                .take(RECENT)
                .collect();
            out.push(kept.len() as u8);
            for a in kept {
                out.push(a.adapter.len() as u8);
                out.extend_from_slice(a.adapter.as_bytes());
                out.extend_from_slice(&a.in_flight.to_le_bytes());
            }
        }
        out
    }

    /// The adapters recently routed to `addr`, most recent first.
    pub fn of(&self, addr: &str) -> &[RecentAdapter] {
        self.pods
            .iter()
            .find(|(a, _)| a == addr)
            .map(|(_, l)| l.as_slice())
            .unwrap_or(&[])
    }
}

/// Reads a pool's recent-adapter table.
pub fn read(store: &impl SharedStore, pool: &str) -> Recent {
    store
        .get(&key(pool))
        .map(|(v, _)| Recent::decode(&v))
        .unwrap_or_default()
}

/// Applies `change` to the table with compare-and-swap, retrying a bounded number of times
/// (a lost count would misprice a pod until it idles: see [`note`]).
fn update(store: &impl SharedStore, pool: &str, mut change: impl FnMut(&mut Recent)) -> bool {
    crate::store::update(store, &key(pool), None, Recent::decode, |recent| {
        change(recent);
        recent.encode()
    })
}

/// Notes that a request for `adapter` was routed to `addr`: the adapter becomes the pod's most
/// recent and its count there goes up. `idle`: this proxy had nothing in flight there before
/// this request, so every count of the pod starts again from 0 (a count a lost update or a
/// vanished stream left behind heals when the pod idles).
pub fn note(store: &impl SharedStore, pool: &str, addr: &str, adapter: &str, idle: bool) -> bool {
    update(store, pool, |recent| {
        match recent.pods.iter_mut().find(|(a, _)| a == addr) {
            Some((_, list)) => {
                if idle {
                    list.iter_mut().for_each(|r| r.in_flight = 0);
                }
                let in_flight = list
                    .iter()
                    .position(|r| r.adapter == adapter)
                    .map_or(0, |i| list.remove(i).in_flight);
                list.insert(
                    0,
                    RecentAdapter {
                        adapter: adapter.to_string(),
                        in_flight: in_flight.saturating_add(1),
                    },
                );
                list.truncate(RECENT);
            }
            None => recent.pods.push((
                addr.to_string(),
                vec![RecentAdapter {
                    adapter: adapter.to_string(),
                    in_flight: 1,
                }],
            )),
        }
    })
}

/// A request for `adapter` that was routed to `addr` has ended.
pub fn ended(store: &impl SharedStore, pool: &str, addr: &str, adapter: &str) -> bool {
    update(store, pool, |recent| {
        if let Some(r) = recent
            .pods
            .iter_mut()
            .find(|(a, _)| a == addr)
            .and_then(|(_, list)| list.iter_mut().find(|r| r.adapter == adapter))
        {
            r.in_flight = r.in_flight.saturating_sub(1);
        }
    })
}

/// Request lives a blocked pod's batch slot takes to free, when the batch adapter that frees
/// first has `n` of this proxy's requests in flight there. The slot frees at the first gap of
/// one request life `L` with no new request for that adapter; with requests arriving as a
/// Poisson process of rate `λ`, the expected time to such a gap is `(e^{λL} − 1) / λ`, and
/// `n ≈ λL` (requests in flight = arrival rate × life): `L (eⁿ − 1) / n`, one life when
/// nothing of this proxy's is there (the engine's report is up to a scrape old), growing fast
/// for an adapter that keeps its slot busy. `n` is capped at [`DRAIN_CAP`] (e⁸: thousands of
/// lives; the ranking only needs "never soon").
pub fn drain_lives(n: u16) -> f64 {
    let n = f64::from(n.min(DRAIN_CAP));
    if n <= 0.0 {
        1.0
    } else {
        n.exp_m1() / n
    }
}

/// Largest in-flight count [`drain_lives`] distinguishes.
const DRAIN_CAP: u16 = 8;

/// What the ranking needs to know about one pod and the requested adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placement {
    /// The pod is the adapter's home.
    pub home: bool,
    /// The adapter is probably loaded there (the engine lists it, or it was among the last
    /// `max_loras` adapters routed there).
    pub resident: bool,
    /// A slot is probably free there.
    pub free_slot: bool,
    /// The engine's batch already runs requests of `max_loras` other adapters: the request would
    /// wait until one of them leaves.
    pub blocked: bool,
    /// On a blocked pod, the other adapters already waiting there for a batch slot ahead of this
    /// request (the engine's waiting adapters that are not in its batch, where its report tells
    /// them apart, and this proxy's own: see [`placement`]): each takes the next slot that
    /// frees before this request can, first come first served in the engine's queue.
    pub slot_queue: u16,
    /// On a blocked pod, this proxy's requests in flight there for the batch adapter that has
    /// the fewest ([`drain_lives`]: how soon its slot frees).
    pub drain: u16,
}

/// What an adapter request costs on a pod with `placement`, in ms: a load where the adapter is
/// not resident, the price of leaving its home (an eviction and a reload later) elsewhere, and
/// the wait for a slot on a pod whose slots are all taken. A blocked pod frees a slot when one
/// batch adapter's requests there have all ended while its new ones keep joining ahead: sooner
/// for an adapter with few requests there than for one that keeps its slot busy
/// ([`drain_lives`]); then one request life (`life_ms`, the pod's, else the pool's) more for
/// each adapter already waiting for a slot (the engine gives freed slots first come first
/// served).
pub fn price(placement: &Placement, costs: &crate::config::LoraConfig, life_ms: f64) -> f64 {
    let load = if placement.resident {
        0.0
    } else {
        costs.load_ms
    };
    let stray = if placement.home { 0.0 } else { costs.stray_ms };
    let slot_wait = if placement.blocked {
        life_ms * (drain_lives(placement.drain) + f64::from(placement.slot_queue))
    } else {
        0.0
    };
    load + stray + slot_wait
}

/// The adapters in the engine's batch (its report's running ones, then this proxy's with
/// requests in flight there, oldest first, while slots are left) and this proxy's adapters
/// waiting for a slot, in the order they started waiting ([`placement`]).
fn batch_and_waiters<'a>(
    engine: Option<&'a LoraState>,
    recent: &'a [RecentAdapter],
    slots: usize,
    in_flight: u32,
) -> (Vec<&'a str>, Vec<&'a str>) {
    let mut batch: Vec<&str> = engine
        .map(|l| l.running.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let mut waiters: Vec<&str> = Vec::new();
    if in_flight > 0 {
        let ours = recent
            .iter()
            .enumerate()
            .rev()
            .filter(|(i, r)| *i == 0 || r.in_flight > 0)
            .map(|(_, r)| r.adapter.as_str());
        for a in ours {
            if batch.contains(&a) || waiters.contains(&a) {
                continue;
            }
            if batch.len() < slots {
                batch.push(a);
            } else {
                waiters.push(a);
            }
        }
    }
    (batch, waiters)
}

/// This proxy's requests on the pod for the batch adapter with the fewest (never more than it
/// has there in all, `in_flight`: a count a lost update left behind does not outlive the pod's
/// load).
fn drain_of(batch: &[&str], recent: &[RecentAdapter], in_flight: u32) -> u16 {
    let cap = u16::try_from(in_flight).unwrap_or(u16::MAX);
    batch
        .iter()
        .map(|b| {
            recent
                .iter()
                .find(|r| r.adapter == *b)
                .map_or(0, |r| r.in_flight.min(cap))
        })
        .min()
        .unwrap_or(0)
}

/// Residency of `adapter` on a pod from the engine's report and the routing history.
/// `in_flight`: this proxy's requests in flight there.
///
/// **The batch and the adapters waiting for a slot.** The engine's report is up to a scrape
/// old, and vLLM V1 (checked on 0.32) learns of a request's arrival only with its first output:
/// its `lora_requests_info` names, in both of its lists, the adapters whose requests have been
/// scheduled and have not ended, so a request waiting for a slot appears in neither
/// (`test-harness/fixtures/metrics/vllm-0.32-cpu-local-lora-slot-wait.prom`: `max_lora` 1, one
/// request waiting, both lists `a0`). What the report cannot show, this proxy's own routing
/// history does: its adapters with requests in flight on the pod (the one it routed there last
/// counts while it has any request there) that the report does not list, oldest first, take the
/// slots the report leaves free, and wait for one when none is left (vLLM gives a freed slot to
/// the earliest request it skipped).
pub fn placement(
    adapter: &str,
    engine: Option<&LoraState>,
    recent: &[RecentAdapter],
    home: bool,
    in_flight: u32,
) -> Placement {
    let slots = engine.map_or(0, |l| usize::from(l.max_loras));
    let listed =
        |a: &str| engine.is_some_and(|l| l.running.iter().chain(&l.waiting).any(|x| x == a));
    let recent_loaded = || recent.iter().take(slots).map(|r| r.adapter.as_str());
    let resident = listed(adapter) || recent_loaded().any(|a| a == adapter);
    let mut loaded: Vec<&str> = engine
        .map(|l| l.running.iter().map(String::as_str).collect())
        .unwrap_or_default();
    for a in recent_loaded() {
        if !loaded.contains(&a) {
            loaded.push(a);
        }
    }
    let (batch, waiters) = batch_and_waiters(engine, recent, slots, in_flight);
    let blocked = slots > 0 && !batch.contains(&adapter) && batch.len() >= slots;
    // Ahead of this request for a slot: the adapters the engine reports waiting outside its
    // batch (engines whose lists tell them apart), and this proxy's waiting adapters that
    // started waiting before this one's (all of them for an adapter not yet waiting here).
    let slot_queue = if blocked {
        let reported = engine.map_or(0, |l| {
            l.waiting
                .iter()
                .filter(|a| {
                    *a != adapter && !batch.contains(&a.as_str()) && !waiters.contains(&a.as_str())
                })
                .count()
        });
        let ours = waiters
            .iter()
            .position(|a| *a == adapter)
            .unwrap_or(waiters.len());
        reported + ours
    } else {
        0
    };
    let drain = if blocked {
        drain_of(&batch, recent, in_flight)
    } else {
        0
    };
    Placement {
        home,
        resident,
        free_slot: engine.is_some() && loaded.len() < slots,
        blocked,
        slot_queue: u16::try_from(slot_queue).unwrap_or(u16::MAX),
        drain,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::store::MemoryStore;

    /// Recent adapters with no request in flight.
    fn routed(names: &[&str]) -> Vec<RecentAdapter> {
        names
            .iter()
            .map(|n| RecentAdapter {
                adapter: n.to_string(),
                in_flight: 0,
            })
            .collect()
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("adapter-{i}")).collect()
    }

    #[test]
    fn no_pod_homes_more_adapters_than_it_has_slots() {
        let addrs: Vec<String> = (0..4).map(|i| format!("10.0.0.{i}:8000")).collect();
        let pods: Vec<&str> = addrs.iter().map(String::as_str).collect();
        for (adapters, slots) in [(16, 4u16), (8, 4), (12, 3), (30, 2)] {
            let h = homes(&names(adapters), &pods, &[slots; 4]);
            assert_eq!(h.len(), adapters);
            let mut per_pod = [0usize; 4];
            for &i in h.values() {
                per_pod[i] += 1;
            }
            let cap = usize::from(slots).max(adapters.div_ceil(4));
            assert!(
                per_pod.iter().all(|&n| n <= cap),
                "{adapters}/{slots}: {per_pod:?}"
            );
        }
        // Plain rendezvous (no bound) is uneven for the same names: the bound matters.
        let plain = names(16)
            .iter()
            .map(|a| rendezvous_home(a, &pods).unwrap())
            .fold([0usize; 4], |mut acc, i| {
                acc[i] += 1;
                acc
            });
        assert!(plain.iter().any(|&n| n > 4), "{plain:?}");
    }

    #[test]
    fn homes_do_not_depend_on_the_order_of_names_or_pods() {
        let addrs: Vec<String> = (0..5).map(|i| format!("10.1.0.{i}:8000")).collect();
        let pods: Vec<&str> = addrs.iter().map(String::as_str).collect();
        let a = homes(&names(12), &pods, &[3; 5]);
        let mut rev = names(12);
        rev.reverse();
        let mut rpods = pods.clone();
        rpods.reverse();
        let b = homes(&rev, &rpods, &[3; 5]);
        for (name, i) in &a {
            assert_eq!(pods[*i], rpods[b[name]], "{name}");
        }
    }

    #[test]
    fn residency_comes_from_the_engine_and_the_routing_history() {
        let engine = LoraState {
            running: vec!["a".into()],
            waiting: vec![],
            max_loras: 2,
        };
        // Only "a" is active; the history says "b" and "c" were routed here last.
        let recent = routed(&["b", "c", "d"]);
        let p = placement("b", Some(&engine), &recent, false, 0);
        assert!(p.resident && !p.free_slot);
        let p = placement("d", Some(&engine), &recent, true, 0);
        assert!(!p.resident && !p.free_slot && p.home);
        // Without history, one of two slots is free.
        let p = placement("x", Some(&engine), &[], false, 0);
        assert!(!p.resident && p.free_slot);
        // No LoRA information at all: nothing is known.
        assert_eq!(
            placement("x", None, &recent, false, 1),
            Placement::default()
        );
    }

    #[test]
    fn a_pod_whose_batch_runs_max_loras_other_adapters_is_blocked() {
        let two = |running: &[&str], waiting: &[&str]| LoraState {
            running: running.iter().map(|s| s.to_string()).collect(),
            waiting: waiting.iter().map(|s| s.to_string()).collect(),
            max_loras: 2,
        };
        // Both slots run other adapters: a request for "c" waits, home or not.
        let full = two(&["a", "b"], &[]);
        assert!(placement("c", Some(&full), &[], true, 0).blocked);
        // An adapter of the batch joins it.
        assert!(!placement("a", Some(&full), &[], false, 0).blocked);
        // One slot runs: free, unless this proxy just routed another adapter there.
        let one = two(&["a"], &[]);
        let last = routed(&["b"]);
        assert!(!placement("c", Some(&one), &last, false, 0).blocked);
        assert!(placement("c", Some(&one), &last, false, 1).blocked);
        assert!(!placement("b", Some(&one), &last, false, 1).blocked);
        // Waiting requests hold no slot.
        assert!(!placement("c", Some(&two(&["a"], &["b"])), &[], false, 0).blocked);
        // On a blocked pod, the other adapters waiting for a slot are ahead of this one; its
        // own waiting requests and the batch's are not.
        let queued = two(&["a", "b"], &["a", "d", "c", "e"]);
        assert_eq!(placement("c", Some(&queued), &[], true, 0).slot_queue, 2);
        assert_eq!(placement("a", Some(&queued), &[], true, 0).slot_queue, 0);
        // Unknown slots (no LoRA report, or max_loras 0): never blocked.
        assert!(!placement("c", None, &last, false, 1).blocked);
        let unknown = LoraState {
            max_loras: 0,
            ..full.clone()
        };
        assert!(!placement("c", Some(&unknown), &[], false, 0).blocked);
    }

    /// vLLM V1 lists only adapters with a scheduled request, the same names in both lists: the
    /// adapters waiting for a slot are this proxy's in flight there that the report does not
    /// list, in the order they started waiting.
    #[test]
    fn adapters_waiting_for_a_slot_are_known_from_this_proxys_requests() {
        let v1 = |names: &[&str]| LoraState {
            running: names.iter().map(|s| s.to_string()).collect(),
            waiting: names.iter().map(|s| s.to_string()).collect(),
            max_loras: 2,
        };
        let full = v1(&["a", "b"]);
        // Most recent first: "d", then "c" (both unlisted: waiting, "c" first), "a", "b".
        let mut recent = routed(&["d", "c", "a", "b"]);
        for (r, n) in recent.iter_mut().zip([1, 2, 3, 1]) {
            r.in_flight = n;
        }
        let e = placement("e", Some(&full), &recent, false, 7);
        assert!(e.blocked);
        assert_eq!(e.slot_queue, 2, "c and d take the next slots before e");
        let c = placement("c", Some(&full), &recent, false, 7);
        assert!(c.blocked, "c is not in the batch: its requests wait");
        assert_eq!(c.slot_queue, 0);
        assert_eq!(placement("d", Some(&full), &recent, false, 7).slot_queue, 1);
        assert!(!placement("a", Some(&full), &recent, false, 7).blocked);
        // The drain is the batch's: "b" has one request here.
        assert_eq!(e.drain, 1);
        // A slot the report leaves free goes to the oldest of this proxy's unlisted adapters.
        let one = v1(&["a"]);
        let mut recent = routed(&["c", "b", "a"]);
        for r in &mut recent {
            r.in_flight = 1;
        }
        let d = placement("d", Some(&one), &recent, false, 3);
        assert!(d.blocked);
        assert_eq!(d.slot_queue, 1, "b took the free slot, c waits");
        assert!(!placement("b", Some(&one), &recent, false, 3).blocked);
        // Nothing of this proxy's there: only the report counts.
        assert_eq!(placement("e", Some(&full), &recent, false, 0).slot_queue, 0);
    }

    #[test]
    fn recent_adapters_and_their_requests_in_flight_are_shared() {
        let s = MemoryStore::new();
        note(&s, "p", "a:1", "x", true);
        note(&s, "p", "a:1", "y", false);
        note(&s, "p", "b:2", "x", true);
        note(&s, "p", "a:1", "x", false);
        let names = |r: &Recent, a: &str| -> Vec<(String, u16)> {
            r.of(a)
                .iter()
                .map(|r| (r.adapter.clone(), r.in_flight))
                .collect()
        };
        let r = read(&s, "p");
        assert_eq!(names(&r, "a:1"), [("x".into(), 2), ("y".into(), 1)]);
        assert_eq!(names(&r, "b:2"), [("x".into(), 1)]);
        assert_eq!(Recent::decode(&r.encode()), r);
        for cut in 0..r.encode().len() {
            assert_eq!(Recent::decode(&r.encode()[..cut]), Recent::default());
        }
        ended(&s, "p", "a:1", "x");
        ended(&s, "p", "a:1", "y");
        ended(&s, "p", "a:1", "y");
        assert_eq!(
            names(&read(&s, "p"), "a:1"),
            [("x".into(), 1), ("y".into(), 0)]
        );
        // The pod idled (a stream's end was lost): its counts start again.
        note(&s, "p", "a:1", "y", true);
        assert_eq!(
            names(&read(&s, "p"), "a:1"),
            [("y".into(), 1), ("x".into(), 0)]
        );
    }

    #[test]
    fn a_slot_held_by_a_busier_adapter_frees_later() {
        assert_eq!(drain_lives(0), 1.0);
        let lives: Vec<f64> = (1..=10).map(drain_lives).collect();
        assert!((lives[0] - 1.718).abs() < 1e-3, "{lives:?}");
        assert!(lives.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(lives[7], lives[9], "capped");
        let two = LoraState {
            running: vec!["a".into(), "b".into()],
            waiting: vec![],
            max_loras: 2,
        };
        // Three of this proxy's requests for "a" there and one for "b": "b"'s slot frees first.
        let mut recent = routed(&["a", "b"]);
        recent[0].in_flight = 3;
        recent[1].in_flight = 1;
        assert_eq!(placement("c", Some(&two), &recent, false, 4).drain, 1);
        // Never more than the proxy has there in all.
        recent[1].in_flight = 9;
        assert_eq!(placement("c", Some(&two), &recent, false, 2).drain, 2);
        // Not blocked: no wait.
        assert_eq!(placement("a", Some(&two), &recent, false, 4).drain, 0);
    }

    /// The one-pass selection gives the homes of a full sort by weight (ties to the lower
    /// index), on fleets where the bounded load binds.
    #[test]
    fn homes_are_the_highest_weight_pods_with_room() {
        fn by_sort(adapters: &[String], pods: &[&str], slots: &[u16]) -> HashMap<String, usize> {
            let mut names: Vec<&String> = adapters.iter().collect();
            names.sort();
            names.dedup();
            let share = names.len().div_ceil(pods.len());
            let mut room: Vec<usize> = (0..pods.len())
                .map(|i| usize::from(slots[i]).max(share).max(1))
                .collect();
            let mut out = HashMap::new();
            for name in names {
                let mut order: Vec<usize> = (0..pods.len()).collect();
                order.sort_by_key(|&i| std::cmp::Reverse(rendezvous(name, pods[i])));
                if let Some(&i) = order.iter().find(|&&i| room[i] > 0) {
                    room[i] -= 1;
                    out.insert(name.clone(), i);
                }
            }
            out
        }
        for (n_pods, n_adapters, slot) in [(1, 5, 0), (4, 9, 2), (7, 40, 1), (32, 200, 4)] {
            let addrs: Vec<String> = (0..n_pods).map(|i| format!("10.1.0.{i}:8000")).collect();
            let pods: Vec<&str> = addrs.iter().map(String::as_str).collect();
            let slots = vec![slot; n_pods];
            let adapters: Vec<String> = (0..n_adapters).map(|i| format!("adapter-{i}")).collect();
            let got = homes(&adapters, &pods, &slots);
            assert_eq!(got, by_sort(&adapters, &pods, &slots), "{n_pods} pods");
            assert_eq!(got.len(), n_adapters);
        }
    }

    #[test]
    fn the_homes_key_changes_with_what_homes_depend_on() {
        let a: Vec<String> = ["x", "y"].iter().map(|s| s.to_string()).collect();
        let k = homes_key(&a, &["p:1", "p:2"], &[2, 2]);
        let reordered: Vec<String> = ["y", "x", "x"].iter().map(|s| s.to_string()).collect();
        assert_eq!(homes_key(&reordered, &["p:1", "p:2"], &[2, 2]), k);
        assert_ne!(homes_key(&a, &["p:2", "p:1"], &[2, 2]), k);
        assert_ne!(homes_key(&a, &["p:1", "p:2"], &[2, 3]), k);
        assert_ne!(homes_key(&a, &["p:1"], &[2]), k);
        assert_ne!(homes_key(&a[..1], &["p:1", "p:2"], &[2, 2]), k);
    }
}
