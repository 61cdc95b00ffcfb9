//! Byte budgets of the pushed snapshot (`snapshot.max_bytes`, `snapshot.max_pod_bytes`).
//!
//! The proxy buffers a push whole before the filter reads it, so a snapshot larger than the
//! internal listener's buffer is refused by Envoy (413) and one larger than the filter's
//! `snapshot.max_bytes` by the filter (403); the gateway then goes stale. Pool, model and pod
//! counts are bounded by the configuration and discovery; what one pod can blow up is its LoRA
//! adapter lists (vLLM's `lora_requests_info` names every adapter with running or waiting
//! requests: up to 2 × 1024 names of up to 255 bytes, ~0.5 MB per pod). So the budgets cut
//! adapter lists, and nothing else:
//!
//! 1. Each pod's entry is trimmed to `max_pod_bytes`: **waiting adapters go first**, then running
//!    ones. Running adapters are loaded on the pod: the filter counts them to tell whether a slot
//!    is free and sends requests for them there without a load; a waiting adapter only says that
//!    requests queue for it, and the filter's own routing history covers recently placed ones.
//!    Within a list the engine's order is kept and the tail is dropped, so the same report always
//!    gives the same snapshot (an unchanged fleet is not pushed again).
//! 2. If the whole snapshot still exceeds `max_bytes`, the largest pods' lists are cut to one
//!    common cap (water-filling: the smallest cap that fits), again waiting first.
//!
//! The whole snapshot includes its rewrites and objectives sections (`crate::rewrites`, the
//! `InferenceObjective` priorities), which are never cut: adapters make room for them, and
//! sections that alone exceed the budget leave nothing that fits (the snapshot is not pushed,
//! as for pods that alone exceed it).
//!
//! The result always decodes (`Snapshot::decode`): trimming only shortens lists that already met
//! the format's limits.

use llm_router_snapshot::{Pod, Pool, RewriteRule, Snapshot};

/// Bytes of the snapshot header: magic, version, flags, generation, created_ms, pool count.
const HEADER_BYTES: usize = 4 + 2 + 2 + 8 + 8 + 2;
/// Bytes of a pod entry besides its address and adapter names: the address length, engine,
/// health, failures, scraped_at_ms, waiting, running, kv, block_size, num_blocks, max_loras and
/// the two list counts.
const POD_FIXED_BYTES: usize = 1 + 1 + 1 + 2 + 8 + 4 + 4 + 2 + 4 + 4 + 2 + 2 + 2;

/// Bytes each pod carries more when any pod has other replicas' work (`FLAG_PEER_WORK`).
const PEER_WORK_BYTES: usize = 4 + 4;

/// The budgets in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub max_bytes: usize,
    pub max_pod_bytes: usize,
}

/// Adapters dropped from one list kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lists {
    pub running: u64,
    pub waiting: u64,
}

impl Lists {
    pub fn total(&self) -> u64 {
        self.running + self.waiting
    }
    fn add(&mut self, o: Lists) {
        self.running += o.running;
        self.waiting += o.waiting;
    }
}

/// What [`apply`] did to one snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Trim {
    /// Dropped to keep pods within `max_pod_bytes`.
    pub by_pod: Lists,
    /// Dropped afterwards to keep the snapshot within `max_bytes`.
    pub by_total: Lists,
    /// Pods whose lists were cut.
    pub pods_trimmed: usize,
    /// Encoded size after trimming.
    pub bytes: usize,
    /// Encoded size without any adapter: when above `max_bytes`, nothing fits.
    pub floor_bytes: usize,
}

impl Trim {
    /// The snapshot fits `max_bytes` after trimming.
    pub fn fits(&self, b: &Budget) -> bool {
        self.bytes <= b.max_bytes
    }
    pub fn dropped(&self) -> u64 {
        self.by_pod.total() + self.by_total.total()
    }
}

fn list_bytes(l: &[String]) -> usize {
    l.iter().map(|a| 1 + a.len()).sum()
}

/// Encoded bytes of a pod's adapter names (with their length bytes).
pub fn adapter_bytes(p: &Pod) -> usize {
    p.lora
        .as_ref()
        .map_or(0, |l| list_bytes(&l.running) + list_bytes(&l.waiting))
}

/// Encoded bytes of a pod entry.
pub fn pod_bytes(p: &Pod) -> usize {
    POD_FIXED_BYTES + p.address.len() + adapter_bytes(p)
}

fn pool_bytes(p: &Pool) -> usize {
    2 + p.name.len()
        + 2
        + p.cluster.len()
        + 2
        + p.models.iter().map(|m| 2 + m.len()).sum::<usize>()
        + 2
        + p.pods.iter().map(pod_bytes).sum::<usize>()
}

/// Encoded bytes of a rewrites section: the rule count, then per rule its model, sticky byte,
/// target count and targets (name and a u32 weight each).
fn rewrites_bytes(rules: &[RewriteRule]) -> usize {
    2 + rules
        .iter()
        .map(|r| {
            1 + r.model.len()
                + 1
                + 2
                + r.targets
                    .iter()
                    .map(|t| 1 + t.model.len() + 4)
                    .sum::<usize>()
        })
        .sum::<usize>()
}

/// The objectives section's bytes: a count, then each name (str8) and its priority.
fn objectives_bytes(list: &[llm_router_snapshot::Objective]) -> usize {
    2 + list.iter().map(|o| 1 + o.name.len() + 4).sum::<usize>()
}

/// Exactly `snap.encode()?.len()` for an encodable snapshot, without encoding it.
pub fn encoded_len(snap: &Snapshot) -> usize {
    let pods = snap.pools.iter().flat_map(|p| &p.pods);
    let peer_work = if pods.clone().any(|p| !p.peers.is_none()) {
        PEER_WORK_BYTES * pods.count()
    } else {
        0
    };
    // Other replicas' placed contexts: a count per pool, then 16 bytes each.
    let peer_contexts = if snap.pools.iter().any(|p| !p.peer_contexts.is_empty()) {
        snap.pools
            .iter()
            .map(|p| 2 + 16 * p.peer_contexts.len())
            .sum()
    } else {
        0
    };
    let rewrites = snap.rewrites.as_deref().map_or(0, rewrites_bytes);
    let objectives = snap.objectives.as_deref().map_or(0, objectives_bytes);
    HEADER_BYTES
        + snap.pools.iter().map(pool_bytes).sum::<usize>()
        + peer_work
        + peer_contexts
        + rewrites
        + objectives
}

/// Keeps the longest prefix of `l` whose names take at most `cap` bytes; returns how many went.
fn keep_prefix(l: &mut Vec<String>, cap: usize) -> u64 {
    let mut used = 0;
    let keep = l
        .iter()
        .take_while(|a| {
            used += 1 + a.len();
            used <= cap
        })
        .count();
    let dropped = l.len() - keep;
    l.truncate(keep);
    dropped as u64
}

/// Cuts a pod's adapter names to at most `cap` bytes, waiting ones first.
fn trim_pod(p: &mut Pod, cap: usize) -> Lists {
    let Some(l) = p.lora.as_mut() else {
        return Lists::default();
    };
    let running = list_bytes(&l.running);
    if running + list_bytes(&l.waiting) <= cap {
        return Lists::default();
    }
    if running <= cap {
        Lists {
            running: 0,
            waiting: keep_prefix(&mut l.waiting, cap - running),
        }
    } else {
        let waiting = l.waiting.len() as u64;
        l.waiting.clear();
        Lists {
            running: keep_prefix(&mut l.running, cap),
            waiting,
        }
    }
}

/// The largest common cap on adapter bytes per pod such that `sizes`, each cut to it, sum to at
/// most `budget`; `None` when they already fit.
fn water_level(sizes: &mut [usize], budget: usize) -> Option<usize> {
    sizes.sort_unstable();
    let mut left = budget;
    let n = sizes.len();
    for (k, &a) in sizes.iter().enumerate() {
        let rest = n - k;
        match a.checked_mul(rest) {
            Some(all) if all <= left => left -= a,
            _ => return Some(left / rest),
        }
    }
    None
}

/// Trims `snap`'s adapter lists to the budgets (see the module documentation).
pub fn apply(snap: &mut Snapshot, b: &Budget) -> Trim {
    let mut t = Trim::default();
    let mut trimmed = Vec::new();
    for pod in snap.pools.iter_mut().flat_map(|p| &mut p.pods) {
        let cap = b
            .max_pod_bytes
            .saturating_sub(POD_FIXED_BYTES + pod.address.len());
        let d = trim_pod(pod, cap);
        t.by_pod.add(d);
        trimmed.push(d.total() > 0);
    }
    let mut sizes: Vec<usize> = snap
        .pools
        .iter()
        .flat_map(|p| &p.pods)
        .map(adapter_bytes)
        .collect();
    t.bytes = encoded_len(snap);
    t.floor_bytes = t.bytes - sizes.iter().sum::<usize>();
    if t.bytes > b.max_bytes {
        let budget = b.max_bytes.saturating_sub(t.floor_bytes);
        if let Some(cap) = water_level(&mut sizes, budget) {
            let pods = snap.pools.iter_mut().flat_map(|p| &mut p.pods);
            for (pod, was) in pods.zip(trimmed.iter_mut()) {
                let d = trim_pod(pod, cap);
                t.by_total.add(d);
                *was |= d.total() > 0;
            }
        }
        t.bytes = encoded_len(snap);
    }
    t.pods_trimmed = trimmed.iter().filter(|x| **x).count();
    t
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use llm_router_snapshot::{Engine, Health, LoraState};

    fn names(prefix: &str, n: usize, len: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                let s = format!("{prefix}-{i:05}-");
                format!("{s}{}", "x".repeat(len.saturating_sub(s.len())))
            })
            .collect()
    }

    fn pod(i: usize, running: Vec<String>, waiting: Vec<String>) -> Pod {
        Pod {
            address: format!("10.0.{}.{}:8000", i / 250, i % 250),
            engine: Engine::Vllm,
            health: Health::Ok,
            waiting: 3,
            running: 7,
            kv_usage: Some(0.5),
            block_size: 16,
            num_blocks: 1000,
            lora: Some(LoraState {
                running,
                waiting,
                max_loras: 8,
            }),
            ..Pod::default()
        }
    }

    fn fleet(pods: Vec<Pod>) -> Snapshot {
        Snapshot {
            rewrites: None,
            objectives: None,
            generation: 1,
            created_ms: 2,
            pools: vec![Pool {
                name: "llama".into(),
                cluster: "pool_llama".into(),
                models: vec!["meta-llama/Llama-3.1-8B-Instruct".into()],
                pods,
                peer_contexts: Vec::new(),
            }],
        }
    }

    const DEFAULTS: Budget = Budget {
        max_bytes: crate::config::DEFAULT_SNAPSHOT_MAX_BYTES,
        max_pod_bytes: crate::config::DEFAULT_SNAPSHOT_MAX_POD_BYTES,
    };

    #[test]
    fn encoded_len_is_exact() {
        let mut s = fleet(vec![
            pod(0, names("r", 3, 20), names("w", 2, 9)),
            Pod {
                address: "[::1]:8000".into(),
                ..Pod::default()
            },
        ]);
        s.pools.push(Pool {
            name: "q".into(),
            cluster: "c".into(),
            ..Pool::default()
        });
        assert_eq!(encoded_len(&s), s.encode().unwrap().len());
        // With other replicas' work on one pod, every pod carries it.
        s.pools[0].pods[1].peers.in_flight = 2;
        assert_eq!(encoded_len(&s), s.encode().unwrap().len());
        // And with the contexts they placed: every pool carries its list.
        s.pools[0].peer_contexts = vec![llm_router_snapshot::PeerContext {
            key: 1,
            pod: 2,
            blocks: 3,
        }];
        assert_eq!(encoded_len(&s), s.encode().unwrap().len());
        assert_eq!(
            encoded_len(&Snapshot::default()),
            Snapshot::default().encode().unwrap().len()
        );
        // With a rewrites section, empty or not.
        s.rewrites = Some(vec![]);
        assert_eq!(encoded_len(&s), s.encode().unwrap().len());
        s.rewrites = Some(rewrite_rules(3));
        assert_eq!(encoded_len(&s), s.encode().unwrap().len());
        // And an objectives section, empty or not.
        s.objectives = Some(vec![]);
        assert_eq!(encoded_len(&s), s.encode().unwrap().len());
        s.objectives = Some(
            ["vip", "batch-nightly"]
                .iter()
                .zip([10, -1])
                .map(|(name, priority)| llm_router_snapshot::Objective {
                    name: (*name).into(),
                    priority,
                })
                .collect(),
        );
        assert_eq!(encoded_len(&s), s.encode().unwrap().len());
    }

    /// `n` rules of two targets each, names of different lengths.
    fn rewrite_rules(n: usize) -> Vec<llm_router_snapshot::RewriteRule> {
        use llm_router_snapshot::{RewriteRule, RewriteSticky, RewriteTarget};
        (0..n)
            .map(|i| RewriteRule {
                model: format!("chat-{i}"),
                sticky: RewriteSticky::Conversation,
                targets: vec![
                    RewriteTarget {
                        model: "meta-llama/Llama-3.1-8B-Instruct".into(),
                        weight: 90,
                    },
                    RewriteTarget {
                        model: format!("canary-{}", "x".repeat(i)),
                        weight: 10,
                    },
                ],
            })
            .collect()
    }

    /// The rewrites section is part of what the total budget bounds: adapters make room for
    /// it, and a section that alone exceeds the budget leaves nothing that fits.
    #[test]
    fn the_rewrites_section_counts_against_the_total_budget() {
        let pods = || {
            vec![
                pod(0, names("r", 100, 40), names("w", 100, 40)),
                pod(1, names("r", 100, 40), vec![]),
            ]
        };
        let without = fleet(pods()).encode().unwrap().len();
        let b = Budget {
            max_bytes: without,
            max_pod_bytes: 1 << 20,
        };
        let mut s = fleet(pods());
        s.rewrites = Some(rewrite_rules(20));
        let t = apply(&mut s, &b);
        let bytes = s.encode().unwrap().len();
        assert!(bytes <= b.max_bytes, "{bytes} > {}", b.max_bytes);
        assert_eq!(t.bytes, bytes);
        assert!(t.by_total.waiting > 0, "{t:?}");
        assert_eq!(
            s.rewrites,
            Some(rewrite_rules(20)),
            "the rules are kept whole"
        );
        // Rules alone over the budget: the floor counts them, nothing fits.
        let mut s = fleet(pods());
        s.rewrites = Some(rewrite_rules(200));
        let t = apply(&mut s, &b);
        assert!(t.floor_bytes > b.max_bytes && !t.fits(&b), "{t:?}");
    }

    /// The sizing the defaults are chosen for: 64 pods reporting 1,000 adapters each (names of
    /// realistic length, and even of 63 bytes) fit untouched.
    #[test]
    fn a_thousand_adapters_on_64_pods_fit_the_defaults() {
        for len in [36, 63] {
            let pods = (0..64)
                .map(|i| pod(i, names("run", 600, len), names("wait", 400, len)))
                .collect();
            let mut s = fleet(pods);
            let before = s.clone();
            let t = apply(&mut s, &DEFAULTS);
            assert_eq!(t.dropped(), 0, "{len}: {t:?}");
            assert_eq!(s, before);
            assert!(t.fits(&DEFAULTS));
            assert_eq!(t.bytes, s.encode().unwrap().len());
        }
    }

    #[test]
    fn a_pod_over_its_budget_loses_waiting_adapters_first() {
        let b = Budget {
            max_bytes: 1 << 20,
            max_pod_bytes: 4096,
        };
        // 60 running × 33 bytes = 1980, 100 waiting × 33 = 3300: the waiting list is cut.
        let mut s = fleet(vec![
            pod(0, names("r", 60, 32), names("w", 100, 32)),
            pod(1, names("r", 2, 32), names("w", 2, 32)),
        ]);
        let t = apply(&mut s, &b);
        let p = &s.pools[0].pods[0];
        assert!(pod_bytes(p) <= 4096, "{}", pod_bytes(p));
        let l = p.lora.as_ref().unwrap();
        assert_eq!(l.running, names("r", 60, 32), "running adapters are kept");
        assert_eq!(l.waiting, names("w", 100, 32)[..l.waiting.len()].to_vec());
        assert_eq!(t.by_pod.running, 0);
        assert_eq!(t.by_pod.waiting, 100 - l.waiting.len() as u64);
        assert_eq!(t.by_total, Lists::default());
        assert_eq!(t.pods_trimmed, 1);
        // Running adapters alone over the budget: waiting all gone, running cut to fit.
        let mut s = fleet(vec![pod(0, names("r", 300, 32), names("w", 5, 32))]);
        let t = apply(&mut s, &b);
        let p = &s.pools[0].pods[0];
        let l = p.lora.as_ref().unwrap();
        assert!(l.waiting.is_empty());
        assert!(pod_bytes(p) <= 4096 && pod_bytes(p) > 4096 - 34);
        assert_eq!(t.by_pod.waiting, 5);
        assert_eq!(t.by_pod.running, 300 - l.running.len() as u64);
        // The same report gives the same snapshot.
        let mut again = fleet(vec![pod(0, names("r", 300, 32), names("w", 5, 32))]);
        apply(&mut again, &b);
        assert!(again.same_state(&s));
    }

    /// Worst case per pod (2 × 1024 names of 255 bytes, ~0.5 MB) on 64 pods: 34 MB before, at
    /// most `max_bytes` after, and it still decodes.
    #[test]
    fn the_total_budget_holds_for_the_worst_pods() {
        let max = llm_router_snapshot::MAX_ADAPTERS;
        let pods: Vec<Pod> = (0..64)
            .map(|i| pod(i, names("r", max, 255), names("w", max, 255)))
            .collect();
        let mut s = fleet(pods);
        assert!(encoded_len(&s) > 30_000_000);
        let t = apply(&mut s, &DEFAULTS);
        let bytes = s.encode().unwrap();
        assert!(bytes.len() <= DEFAULTS.max_bytes, "{}", bytes.len());
        assert_eq!(t.bytes, bytes.len());
        assert_eq!(t.pods_trimmed, 64);
        assert!(t.by_pod.waiting == 64 * max as u64, "{t:?}");
        let back = Snapshot::decode(&bytes).expect("a trimmed snapshot decodes");
        assert_eq!(back, s);
        // A total budget below the pods' sum: the largest are cut to one level, small pods kept.
        let b = Budget {
            max_bytes: 64 * 1024,
            max_pod_bytes: 64 * 1024,
        };
        let mut s = fleet(vec![
            pod(0, names("r", 1000, 40), vec![]),
            pod(1, names("r", 600, 40), names("w", 400, 40)),
            pod(2, names("r", 10, 40), names("w", 5, 40)),
        ]);
        let small = s.pools[0].pods[2].clone();
        let t = apply(&mut s, &b);
        assert!(t.fits(&b) && t.bytes > b.max_bytes - 2 * 41, "{t:?}");
        assert_eq!(t.bytes, s.encode().unwrap().len());
        let pods = &s.pools[0].pods;
        assert_eq!(pods[2], small, "the small pod is untouched");
        let (a0, a1) = (adapter_bytes(&pods[0]), adapter_bytes(&pods[1]));
        assert!(a0.abs_diff(a1) <= 41, "{a0} {a1}");
        let (l0, l1) = (
            pods[0].lora.as_ref().unwrap(),
            pods[1].lora.as_ref().unwrap(),
        );
        assert_eq!(l1.running.len(), 600, "waiting adapters go first");
        assert!(l1.waiting.len() < 400);
        assert_eq!(t.by_pod, Lists::default());
        assert_eq!(
            t.by_total,
            Lists {
                running: 1000 - l0.running.len() as u64,
                waiting: 400 - l1.waiting.len() as u64,
            }
        );
        assert_eq!(t.pods_trimmed, 2);
    }

    #[test]
    fn nothing_fits_when_the_pods_alone_exceed_the_budget() {
        let b = Budget {
            max_bytes: 4096,
            max_pod_bytes: 4096,
        };
        let mut s = fleet(
            (0..200)
                .map(|i| pod(i, names("r", 2, 10), vec![]))
                .collect(),
        );
        let t = apply(&mut s, &b);
        assert!(!t.fits(&b));
        assert!(t.floor_bytes > b.max_bytes);
    }

    #[test]
    fn water_level_is_the_largest_cap_that_fits() {
        assert_eq!(water_level(&mut [10, 20, 30], 60), None);
        assert_eq!(water_level(&mut [10, 20, 30], 50), Some(20));
        assert_eq!(water_level(&mut [10, 20, 30], 45), Some(17));
        assert_eq!(water_level(&mut [30, 30], 0), Some(0));
        assert_eq!(water_level(&mut [], 0), None);
        assert_eq!(water_level(&mut [usize::MAX, 1], 10), Some(9));
    }
}
