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
//! **Residency.** vLLM's `lora_requests_info` lists only adapters with running or waiting
//! requests, not the ones idle in their slots, so a pod whose slots are full of idle adapters
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
//! When every pod is blocked, the adapters already waiting there for a slot
//! ([`Placement::slot_queue`]) are ahead of this one: vLLM's scheduler keeps the requests it
//! skips for want of a slot in arrival order and gives a freed slot to the first of them.
//!
//! Recent-adapter table encoding (little-endian): `count u16 | (len u8 | address | n u8 |
//! (len u8 | adapter) * n) * count`.

use crate::store::SharedStore;
use crate::wire::Reader;
use llm_router_snapshot::LoraState;
use std::collections::HashMap;

/// Adapters remembered per pod.
const RECENT: usize = 16;

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

/// Per pod, the adapters most recently routed there (most recent first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recent {
    pub pods: Vec<(String, Vec<String>)>,
}

impl Recent {
    pub fn decode(bytes: &[u8]) -> Recent {
        Recent::try_decode(bytes).unwrap_or_default()
    }

    fn try_decode(bytes: &[u8]) -> Option<Recent> {
        let mut r = Reader(bytes);
        let count = r.u16()?;
        let mut pods = Vec::with_capacity(usize::from(count).min(4096));
        for _ in 0..count {
            let addr = r.str8()?.to_string();
            let n = r.u8()?;
            let adapters = (0..n)
                .map(|_| r.str8().map(str::to_string))
                .collect::<Option<Vec<String>>>()?;
            pods.push((addr, adapters));
        }
        r.done().then_some(Recent { pods })
    }

    pub fn encode(&self) -> Vec<u8> {
        let ok = |s: &String| s.len() <= 255;
        let pods: Vec<&(String, Vec<String>)> = self
            .pods
            .iter()
            .filter(|(a, _)| ok(a))
            .take(usize::from(u16::MAX))
            .collect();
        let mut out = Vec::new();
        out.extend_from_slice(&(pods.len() as u16).to_le_bytes());
        for (addr, adapters) in pods {
            out.push(addr.len() as u8);
            out.extend_from_slice(addr.as_bytes());
            let kept: Vec<&String> = adapters.iter().filter(|a| ok(a)).take(RECENT).collect();
            out.push(kept.len() as u8);
            for a in kept {
                out.push(a.len() as u8);
                out.extend_from_slice(a.as_bytes());
            }
        }
        out
    }

    /// The adapters recently routed to `addr`, most recent first.
    pub fn of(&self, addr: &str) -> &[String] {
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

/// Notes that `adapter` was routed to `addr`. Writes only when it is not already the pod's
/// most recent adapter; best effort (a lost CAS race is ignored: the next request repeats it).
pub fn note(store: &impl SharedStore, pool: &str, addr: &str, adapter: &str) {
    let k = key(pool);
    let (mut recent, cas) = match store.get(&k) {
        Some((v, cas)) => (Recent::decode(&v), Some(cas)),
        None => (Recent::default(), None),
    };
    if recent.of(addr).first().map(String::as_str) == Some(adapter) {
        return;
    }
    match recent.pods.iter_mut().find(|(a, _)| a == addr) {
        Some((_, list)) => {
            list.retain(|a| a != adapter);
            list.insert(0, adapter.to_string());
            list.truncate(RECENT);
        }
        None => recent
            .pods
            .push((addr.to_string(), vec![adapter.to_string()])),
    }
    let _ = store.set(&k, &recent.encode(), cas);
}

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
    /// On a blocked pod, the other adapters already waiting there for a batch slot (the engine's
    /// waiting adapters that are not in its batch): each takes the next slot that frees before
    /// this request can, first come first served in the engine's queue.
    pub slot_queue: u16,
}

/// Residency of `adapter` on a pod from the engine's report and the routing history. `busy`:
/// this proxy has requests in flight there, so the adapter it routed there last is probably in
/// the batch although the engine's last report (up to a scrape interval old) may not list it.
pub fn placement(
    adapter: &str,
    engine: Option<&LoraState>,
    recent: &[String],
    home: bool,
    busy: bool,
) -> Placement {
    let slots = engine.map_or(0, |l| usize::from(l.max_loras));
    let listed =
        |a: &str| engine.is_some_and(|l| l.running.iter().chain(&l.waiting).any(|x| x == a));
    let recent_loaded = || recent.iter().take(slots);
    let resident = listed(adapter) || recent_loaded().any(|a| a == adapter);
    let mut loaded: Vec<&str> = engine
        .map(|l| l.running.iter().map(String::as_str).collect())
        .unwrap_or_default();
    for a in recent_loaded() {
        if !loaded.contains(&a.as_str()) {
            loaded.push(a);
        }
    }
    // The adapters of the running batch: the engine's, and the one last routed here while this
    // proxy still has requests there.
    let mut batch: Vec<&str> = engine
        .map(|l| l.running.iter().map(String::as_str).collect())
        .unwrap_or_default();
    if let Some(last) = recent.first().filter(|_| busy) {
        if !batch.contains(&last.as_str()) {
            batch.push(last);
        }
    }
    let blocked = slots > 0 && !batch.contains(&adapter) && batch.len() >= slots;
    let slot_queue = match engine.filter(|_| blocked) {
        Some(l) => l
            .waiting
            .iter()
            .filter(|a| *a != adapter && !batch.contains(&a.as_str()))
            .count(),
        None => 0,
    };
    Placement {
        home,
        resident,
        free_slot: engine.is_some() && loaded.len() < slots,
        blocked,
        slot_queue: u16::try_from(slot_queue).unwrap_or(u16::MAX),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::store::MemoryStore;

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
        let recent = vec!["b".to_string(), "c".to_string(), "d".to_string()];
        let p = placement("b", Some(&engine), &recent, false, false);
        assert!(p.resident && !p.free_slot);
        let p = placement("d", Some(&engine), &recent, true, false);
        assert!(!p.resident && !p.free_slot && p.home);
        // Without history, one of two slots is free.
        let p = placement("x", Some(&engine), &[], false, false);
        assert!(!p.resident && p.free_slot);
        // No LoRA information at all: nothing is known.
        assert_eq!(
            placement("x", None, &recent, false, true),
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
        assert!(placement("c", Some(&full), &[], true, false).blocked);
        // An adapter of the batch joins it.
        assert!(!placement("a", Some(&full), &[], false, false).blocked);
        // One slot runs: free, unless this proxy just routed another adapter there.
        let one = two(&["a"], &[]);
        let last = vec!["b".to_string()];
        assert!(!placement("c", Some(&one), &last, false, false).blocked);
        assert!(placement("c", Some(&one), &last, false, true).blocked);
        assert!(!placement("b", Some(&one), &last, false, true).blocked);
        // Waiting requests hold no slot.
        assert!(!placement("c", Some(&two(&["a"], &["b"])), &[], false, false).blocked);
        // On a blocked pod, the other adapters waiting for a slot are ahead of this one; its
        // own waiting requests and the batch's are not.
        let queued = two(&["a", "b"], &["a", "d", "c", "e"]);
        assert_eq!(
            placement("c", Some(&queued), &[], true, false).slot_queue,
            2
        );
        assert_eq!(
            placement("a", Some(&queued), &[], true, false).slot_queue,
            0
        );
        // Unknown slots (no LoRA report, or max_loras 0): never blocked.
        assert!(!placement("c", None, &last, false, true).blocked);
        let unknown = LoraState {
            max_loras: 0,
            ..full.clone()
        };
        assert!(!placement("c", Some(&unknown), &[], false, false).blocked);
    }

    #[test]
    fn recent_adapters_are_shared_and_written_only_when_they_change() {
        let s = MemoryStore::new();
        note(&s, "p", "a:1", "x");
        note(&s, "p", "a:1", "y");
        note(&s, "p", "b:2", "x");
        let before = s.get(&key("p")).unwrap().1;
        note(&s, "p", "b:2", "x");
        assert_eq!(s.get(&key("p")).unwrap().1, before, "no write for a repeat");
        note(&s, "p", "a:1", "x");
        let r = read(&s, "p");
        assert_eq!(r.of("a:1"), ["x".to_string(), "y".to_string()]);
        assert_eq!(r.of("b:2"), ["x".to_string()]);
        assert_eq!(Recent::decode(&r.encode()), r);
        for cut in 0..r.encode().len() {
            assert_eq!(Recent::decode(&r.encode()[..cut]), Recent::default());
        }
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
