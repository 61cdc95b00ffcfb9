//! The soak's figures and its Markdown: what [`crate::experiments::soak`] measured (its verdict
//! is [`crate::report::verdicts::verdict`]'s).

use crate::report::verdicts::Verdict;
use serde::Serialize;
use std::collections::BTreeMap;

/// Figures of one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SoakReport {
    /// Requests sent.
    pub sent: usize,
    /// Complete answers (hostile bodies not counted).
    pub succeeded: usize,
    /// Hostile bodies refused as documented.
    pub refused_hostile: usize,
    /// Every other ending, by cause.
    pub failed_by_cause: BTreeMap<String, usize>,
    /// Requests lost before streaming started.
    pub lost: usize,
    /// Streams cut after they started.
    pub cut: usize,
    /// Requests that outlived their timeout.
    pub hangs: usize,
    /// Hostile bodies that were served.
    pub hostile_served: usize,
    /// p50 / p99 latency of the succeeded requests, ms.
    pub p50_ms: f64,
    /// p99 latency of the succeeded requests, ms.
    pub p99_ms: f64,
    /// Longest request of all, ms.
    pub max_ms: f64,
    /// Wall time of the run, s.
    pub wall_s: f64,
    /// Envoy's VmRSS after the warm-up and at the end, kB.
    pub envoy_rss_kb: (u64, u64),
    /// The sidecar's VmRSS after the warm-up (first process) and at the end (the restarted
    /// one, after the same warm-up), kB.
    pub sidecar_rss_kb: (u64, u64),
    /// The pod killed, and when (requests sent).
    pub killed_pod: String,
    /// Requests sent when the pod was killed and the sidecar restarted.
    pub events_at: (usize, usize),
    /// Per pool: Envoy's retries and failed upstream connects (the killed pod's doing).
    pub envoy_retries: BTreeMap<String, (u64, u64)>,
}

/// The report as Markdown.
pub fn markdown(r: &SoakReport, v: &Verdict) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "## Soak: {} ({} requests in {:.0} s)\n\n",
        if v.passed() { "PASS" } else { "FAIL" },
        r.sent,
        r.wall_s
    ));
    s.push_str(&format!(
        "- sent {}, succeeded {}, hostile bodies refused {}\n",
        r.sent, r.succeeded, r.refused_hostile
    ));
    for (cause, n) in &r.failed_by_cause {
        s.push_str(&format!("- {cause}: {n}\n"));
    }
    s.push_str(&format!(
        "- latency of the succeeded: p50 {:.0} ms, p99 {:.0} ms; longest request {:.0} ms\n",
        r.p50_ms, r.p99_ms, r.max_ms
    ));
    s.push_str(&format!(
        "- events: pod {} killed after {} requests, sidecar restarted after {}\n",
        r.killed_pod, r.events_at.0, r.events_at.1
    ));
    for (pool, (retries, connect_fail)) in &r.envoy_retries {
        s.push_str(&format!(
            "- Envoy, pool {pool}: {retries} retries, {connect_fail} failed connects\n"
        ));
    }
    let pct = |(a, b): (u64, u64)| {
        if a == 0 {
            0.0
        } else {
            (b as f64 / a as f64 - 1.0) * 100.0
        }
    };
    s.push_str(&format!(
        "- VmRSS after warm-up → end: Envoy {} → {} kB ({:+.1} %), sidecar {} → {} kB ({:+.1} %)\n",
        r.envoy_rss_kb.0,
        r.envoy_rss_kb.1,
        pct(r.envoy_rss_kb),
        r.sidecar_rss_kb.0,
        r.sidecar_rss_kb.1,
        pct(r.sidecar_rss_kb)
    ));
    for f in &v.failures {
        s.push_str(&format!("- FAILED: {f}\n"));
    }
    s
}
