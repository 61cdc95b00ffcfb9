//! The sidecar's own numbers, rendered as Prometheus text on its `/metrics`: scrape latency and
//! errors per pod, pushes by result, snapshot age and generation, pods by health.
//!
//! One mutex guards plain counters; the scrape loop takes it once per finished scrape and the
//! HTTP face once per request, which is far below any contention that matters.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// Upper bounds (seconds) of the scrape latency histogram.
pub const LATENCY_BUCKETS: [f64; 10] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

#[derive(Default, Clone)]
struct PodStat {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
    errors: BTreeMap<&'static str, u64>,
    health: &'static str,
    failures: u32,
}

#[derive(Default)]
struct Inner {
    /// pool → pod → numbers (nested so that a lookup by `&str` allocates nothing).
    pods: BTreeMap<String, BTreeMap<String, PodStat>>,
    pushes: BTreeMap<&'static str, u64>,
    rounds: u64,
    last_round_ms: u64,
    last_accepted_created_ms: u64,
    last_accepted_generation: u64,
    last_push_result: &'static str,
}

/// Shared between the scrape loop and the HTTP face.
#[derive(Default)]
pub struct Stats {
    inner: Mutex<Inner>,
}

/// A point-in-time view for `/healthz` and tests.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub rounds: u64,
    pub last_round_ms: u64,
    pub pods: usize,
    pub pods_ok: usize,
    pub pushes: BTreeMap<&'static str, u64>,
    pub last_push_result: &'static str,
    pub last_accepted_generation: u64,
    pub last_accepted_created_ms: u64,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Inner {
    /// The numbers of one pod, created on first use (no allocation once it exists).
    fn pod_mut(&mut self, pool: &str, pod: &str) -> Option<&mut PodStat> {
        if !self.pods.contains_key(pool) {
            self.pods.insert(pool.to_owned(), BTreeMap::new());
        }
        let pods = self.pods.get_mut(pool)?;
        if !pods.contains_key(pod) {
            pods.insert(pod.to_owned(), PodStat::default());
        }
        pods.get_mut(pod)
    }

    fn iter(&self) -> impl Iterator<Item = ((&str, &str), &PodStat)> {
        self.pods.iter().flat_map(|(pool, pods)| {
            pods.iter()
                .map(move |(pod, s)| ((pool.as_str(), pod.as_str()), s))
        })
    }
}

impl Stats {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        // A panic while holding the lock cannot leave counters inconsistent in a harmful way.
        let mut g = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g)
    }

    pub fn scrape_done(&self, pool: &str, pod: &str, seconds: f64, error: Option<&'static str>) {
        self.with(|i| {
            let Some(s) = i.pod_mut(pool, pod) else {
                return;
            };
            s.count += 1;
            s.sum += seconds;
            for (b, le) in s.buckets.iter_mut().zip(LATENCY_BUCKETS) {
                if seconds <= le {
                    *b += 1;
                }
            }
            if let Some(kind) = error {
                *s.errors.entry(kind).or_default() += 1;
            }
        });
    }

    pub fn pod_health(&self, pool: &str, pod: &str, health: &'static str, failures: u32) {
        self.with(|i| {
            let Some(s) = i.pod_mut(pool, pod) else {
                return;
            };
            s.health = health;
            s.failures = failures;
        });
    }

    /// Forget pods that discovery no longer lists.
    pub fn retain_pods(&self, keep: impl Fn(&str, &str) -> bool) {
        self.with(|i| {
            for (pool, pods) in i.pods.iter_mut() {
                pods.retain(|pod, _| keep(pool, pod));
            }
            i.pods.retain(|_, pods| !pods.is_empty());
        });
    }

    pub fn round_done(&self, now_ms: u64) {
        self.with(|i| {
            i.rounds += 1;
            i.last_round_ms = now_ms;
        });
    }

    pub fn push_done(&self, result: &'static str, accepted: Option<(u64, u64)>) {
        self.with(|i| {
            *i.pushes.entry(result).or_default() += 1;
            i.last_push_result = result;
            if let Some((generation, created_ms)) = accepted {
                i.last_accepted_generation = generation;
                i.last_accepted_created_ms = created_ms;
            }
        });
    }

    pub fn summary(&self) -> Summary {
        self.with(|i| Summary {
            rounds: i.rounds,
            last_round_ms: i.last_round_ms,
            pods: i.iter().count(),
            pods_ok: i.iter().filter(|(_, p)| p.health == "ok").count(),
            pushes: i.pushes.clone(),
            last_push_result: if i.last_push_result.is_empty() {
                "none"
            } else {
                i.last_push_result
            },
            last_accepted_generation: i.last_accepted_generation,
            last_accepted_created_ms: i.last_accepted_created_ms,
        })
    }

    /// Prometheus text exposition of everything above.
    pub fn render(&self, now_ms: u64) -> String {
        self.with(|i| {
            let mut o = String::with_capacity(1024 + i.iter().count() * 1024);
            let _ = writeln!(o, "# HELP sidecar_scrape_duration_seconds Time to fetch and read one pod's /metrics.");
            let _ = writeln!(o, "# TYPE sidecar_scrape_duration_seconds histogram");
            for ((pool, pod), s) in i.iter() {
                let l = format!("pool=\"{}\",pod=\"{}\"", escape(pool), escape(pod));
                for (n, le) in s.buckets.iter().zip(LATENCY_BUCKETS) {
                    let _ = writeln!(o, "sidecar_scrape_duration_seconds_bucket{{{l},le=\"{le}\"}} {n}");
                }
                let _ = writeln!(o, "sidecar_scrape_duration_seconds_bucket{{{l},le=\"+Inf\"}} {}", s.count);
                let _ = writeln!(o, "sidecar_scrape_duration_seconds_sum{{{l}}} {}", s.sum);
                let _ = writeln!(o, "sidecar_scrape_duration_seconds_count{{{l}}} {}", s.count);
            }
            let _ = writeln!(o, "# HELP sidecar_scrape_errors_total Failed scrapes by pod and kind.");
            let _ = writeln!(o, "# TYPE sidecar_scrape_errors_total counter");
            for ((pool, pod), s) in i.iter() {
                for (kind, n) in &s.errors {
                    let _ = writeln!(
                        o,
                        "sidecar_scrape_errors_total{{pool=\"{}\",pod=\"{}\",kind=\"{kind}\"}} {n}",
                        escape(pool),
                        escape(pod)
                    );
                }
            }
            let _ = writeln!(o, "# HELP sidecar_pod_consecutive_failures Failed scrapes in a row per pod.");
            let _ = writeln!(o, "# TYPE sidecar_pod_consecutive_failures gauge");
            for ((pool, pod), s) in i.iter() {
                let _ = writeln!(
                    o,
                    "sidecar_pod_consecutive_failures{{pool=\"{}\",pod=\"{}\"}} {}",
                    escape(pool),
                    escape(pod),
                    s.failures
                );
            }
            let _ = writeln!(o, "# HELP sidecar_pods Pods by pool and health in the last snapshot.");
            let _ = writeln!(o, "# TYPE sidecar_pods gauge");
            let mut by: BTreeMap<(&str, &str), u64> = BTreeMap::new();
            for ((pool, _), s) in i.iter() {
                *by.entry((pool, if s.health.is_empty() { "unknown" } else { s.health })).or_default() += 1;
            }
            for ((pool, h), n) in by {
                let _ = writeln!(o, "sidecar_pods{{pool=\"{}\",health=\"{h}\"}} {n}", escape(pool));
            }
            let _ = writeln!(o, "# HELP sidecar_pushes_total Snapshot pushes by result.");
            let _ = writeln!(o, "# TYPE sidecar_pushes_total counter");
            for r in ["accepted", "invalid", "forbidden", "not_found", "stale", "http_error", "transport_error"] {
                let n = i.pushes.get(r).copied().unwrap_or(0);
                let _ = writeln!(o, "sidecar_pushes_total{{result=\"{r}\"}} {n}");
            }
            let _ = writeln!(o, "# HELP sidecar_snapshot_age_seconds Age of the last snapshot the proxy accepted (-1: none yet).");
            let _ = writeln!(o, "# TYPE sidecar_snapshot_age_seconds gauge");
            let age = if i.last_accepted_created_ms == 0 {
                -1.0
            } else {
                now_ms.saturating_sub(i.last_accepted_created_ms) as f64 / 1000.0
            };
            let _ = writeln!(o, "sidecar_snapshot_age_seconds {age}");
            let _ = writeln!(o, "# HELP sidecar_snapshot_generation Generation of the last accepted snapshot.");
            let _ = writeln!(o, "# TYPE sidecar_snapshot_generation gauge");
            let _ = writeln!(o, "sidecar_snapshot_generation {}", i.last_accepted_generation);
            let _ = writeln!(o, "# HELP sidecar_scrape_rounds_total Scrape rounds completed.");
            let _ = writeln!(o, "# TYPE sidecar_scrape_rounds_total counter");
            let _ = writeln!(o, "sidecar_scrape_rounds_total {}", i.rounds);
            o
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::prom::parse_all;

    #[test]
    fn renders_valid_exposition_text() {
        let s = Stats::default();
        s.scrape_done("llama", "127.0.0.1:1", 0.003, None);
        s.scrape_done("llama", "127.0.0.1:1", 2.0, Some("timeout"));
        s.pod_health("llama", "127.0.0.1:1", "failing", 1);
        s.push_done("accepted", Some((7, 1000)));
        s.push_done("transport_error", None);
        let text = s.render(3500);
        let (samples, errors) = parse_all(&text);
        assert!(errors.is_empty(), "{errors:?}");
        let get = |name: &str, label: Option<(&str, &str)>| {
            samples
                .iter()
                .find(|x| {
                    x.name == name && label.is_none_or(|(k, v)| x.label(k).as_deref() == Some(v))
                })
                .map(|x| x.value)
        };
        assert_eq!(
            get("sidecar_scrape_duration_seconds_count", None),
            Some(2.0)
        );
        assert_eq!(
            get(
                "sidecar_scrape_duration_seconds_bucket",
                Some(("le", "0.005"))
            ),
            Some(1.0)
        );
        assert_eq!(
            get(
                "sidecar_scrape_duration_seconds_bucket",
                Some(("le", "+Inf"))
            ),
            Some(2.0)
        );
        assert_eq!(
            get("sidecar_scrape_errors_total", Some(("kind", "timeout"))),
            Some(1.0)
        );
        assert_eq!(
            get("sidecar_pushes_total", Some(("result", "accepted"))),
            Some(1.0)
        );
        assert_eq!(
            get("sidecar_pushes_total", Some(("result", "transport_error"))),
            Some(1.0)
        );
        assert_eq!(get("sidecar_snapshot_age_seconds", None), Some(2.5));
        assert_eq!(get("sidecar_snapshot_generation", None), Some(7.0));
        assert_eq!(get("sidecar_pods", Some(("health", "failing"))), Some(1.0));
        assert_eq!(s.summary().last_push_result, "transport_error");
    }
}
