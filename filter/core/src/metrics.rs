//! The filter's metric names and how their labels reach Prometheus.
//!
//! proxy-wasm defines a metric by a flat name only; Envoy turns parts of a stat name into tags
//! with the regexes of its bootstrap `stats_config.stats_tags`. The labels are therefore encoded
//! in the name the way Istio encodes its own: `pool=.=llama;.;outcome=.=routed;.;` before the
//! metric name. With one `stats_tags` entry per label (`regex: "(pool=\.=(.*?);\.;)"`, which
//! is also what Istio's `extraStatTags` generates) Envoy removes each `label=.=value;.;` from the
//! name and keeps the value as a tag, so `/stats/prometheus` prints
//! `llm_router_requests_total{pool="llama",outcome="routed"} 1` (Envoy drops its `wasmcustom.`
//! namespace there). Without those entries the stats still work, with the labels in the name.
//!
//! Every series of a metric has the same label names; a value that is not known (the pool of an
//! unknown model) is empty, which Prometheus treats as absent (strict exposition parsers want
//! one label set per family). Only values from the configuration, the snapshot and fixed sets
//! are used, never text a client chose, so the number of stats stays bounded by the fleet.

/// Requests the filter handled, by `pool`, `model` (as requested), `target` (the served name a
/// rewrite rule chose, empty when none did) and `outcome` (counter).
pub const REQUESTS: &str = "llm_router_requests_total";
/// Routed requests by first-choice pod (`pool`, `pod`; counter).
pub const PICKS: &str = "llm_router_picks_total";
/// Time from reading the request body to the routing headers being set: parse, decision,
/// header writes, in microseconds (histogram; Envoy histograms record integers).
pub const DECISION_DURATION: &str = "llm_router_decision_duration_microseconds";
/// Seconds since this proxy accepted the current snapshot (gauge).
pub const SNAPSHOT_AGE: &str = "llm_router_snapshot_age_seconds";
/// Generation of the current snapshot, 0 before the first (gauge).
pub const SNAPSHOT_GENERATION: &str = "llm_router_snapshot_generation";
/// Snapshot pushes by `result` (`accepted`, `refused`; counter).
pub const SNAPSHOT_PUSHES: &str = "llm_router_snapshot_pushes_total";
/// Rules of the current snapshot's rewrites section that this proxy dropped because they do
/// not resolve against its configuration (`crate::config::DroppedRewrite`; gauge).
pub const SNAPSHOT_REWRITES_DROPPED: &str = "llm_router_snapshot_rewrites_dropped";
/// Routed requests whose chosen pod had a cached prefix of the prompt (`pool`; counter).
pub const PREFIX_HITS: &str = "llm_router_prefix_hits_total";
/// Adapter requests routed to a pod where the adapter is resident or at home (`pool`; counter).
pub const LORA_HITS: &str = "llm_router_lora_hits_total";
/// Requests in flight per pod, this proxy's (`pool`, `pod`; gauge).
pub const IN_FLIGHT: &str = "llm_router_in_flight";
/// This proxy's share of the requests the pool's engines report running or waiting, in percent
/// (`pool`; gauge): below 100 when other gateway replicas (or clients going around the
/// gateway) send to the pool too. It weighs the prefix prior of [`crate::replica_prior`].
pub const TRAFFIC_SHARE: &str = "llm_router_traffic_share_percent";
/// Tokens reported in the responses' `usage` (`pool`, `model`, `kind`; counter).
pub const TOKENS: &str = "llm_router_tokens_total";

/// Requests waiting in this proxy for a pod of their pool (`pool`, `band`: sheddable, standard,
/// critical; gauge, summed over the workers, updated on the root context's tick).
pub const FLOW_WAITING: &str = "llm_router_flow_waiting";
/// How flow control ended a held request (`pool`, `band`, `outcome`: `dispatched`, `shed`,
/// `queue_full`, `queue_bytes`, `queue_timeout`, `displaced`, `deadline` — its own
/// `x-slo-ttft-ms` objective passed, or would have before its turn —, `abandoned` — the client
/// hung up; counter). `queue_full` and `queue_bytes` were refused on arrival, the others waited
/// (`deadline`: either).
pub const FLOW_OUTCOMES: &str = "llm_router_flow_requests_total";
/// How long a dispatched request waited, in milliseconds (`pool`, `band`; histogram).
pub const FLOW_WAIT: &str = "llm_router_flow_wait_milliseconds";

/// `outcome` values of [`FLOW_OUTCOMES`], in slot order.
pub const FLOW_OUTCOME_NAMES: [&str; 8] = [
    "dispatched",
    "shed",
    "queue_full",
    "queue_bytes",
    "queue_timeout",
    "displaced",
    "deadline",
    "abandoned",
];

/// Every label the filter uses: each needs one `stats_tags` entry in Envoy's bootstrap.
/// No label name ends with another (a tag regex such as `model=\.=` would also match inside
/// `served_model=.=`): hence `target`, not `target_model`.
pub const LABELS: [&str; 8] = [
    "pool", "model", "outcome", "pod", "kind", "result", "target", "band",
];

/// `outcome` values of [`REQUESTS`] for routed requests (rejections use
/// [`crate::Rejection::outcome`]).
pub const ROUTED: &str = "routed";

/// The `stats_tags` regex that extracts `label` (Istio's `extraStatTags` form).
pub fn tag_regex(label: &str) -> String {
    format!(r"({label}=\.=(.*?);\.;)")
}

/// The stat name of metric `name` with `labels` encoded for Envoy's tag extraction.
/// A `;` in a value (it would end the tag early) becomes `_`.
pub fn stat_name(name: &str, labels: &[(&str, &str)]) -> String {
    let len = labels
        .iter()
        .map(|(k, v)| k.len() + v.len() + 6)
        .sum::<usize>()
        + name.len();
    let mut out = String::with_capacity(len);
    for (k, v) in labels {
        out.push_str(k);
        out.push_str("=.=");
        out.extend(v.chars().map(|c| if c == ';' { '_' } else { c }));
        out.push_str(";.;");
    }
    out.push_str(name);
    out
}

/// The compact debug header value: `addr=score` of the ranked pods, best first, scores with
/// three decimals, cut after whole entries to at most `max_len` bytes (`,...` marks the cut).
pub fn scores_header(mode: &str, scores: &[(String, f64)], max_len: usize) -> String {
    let mut out = String::with_capacity(max_len.min(1024));
    out.push_str(mode);
    for (i, (addr, score)) in scores.iter().enumerate() {
        let entry = format!("{}{addr}={score:.3}", if i == 0 { " " } else { "," });
        // Room for the cut mark unless this is the last entry.
        let room = if i + 1 == scores.len() {
            max_len
        } else {
            max_len.saturating_sub(4)
        };
        if out.len() + entry.len() > room {
            out.push_str(",...");
            break;
        }
        out.push_str(&entry);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_go_before_the_name_empty_ones_too() {
        assert_eq!(
            stat_name(
                REQUESTS,
                &[("pool", "llama"), ("model", ""), ("outcome", "shed")]
            ),
            "pool=.=llama;.;model=.=;.;outcome=.=shed;.;llm_router_requests_total"
        );
        assert_eq!(stat_name(SNAPSHOT_AGE, &[]), SNAPSHOT_AGE);
        assert_eq!(
            stat_name(TOKENS, &[("model", "a;b/c.d")]),
            "model=.=a_b/c.d;.;llm_router_tokens_total"
        );
        assert_eq!(tag_regex("pool"), r"(pool=\.=(.*?);\.;)");
    }

    #[test]
    fn the_scores_header_is_bounded() {
        let scores: Vec<(String, f64)> = (0..100)
            .map(|i| (format!("10.0.0.{i}:8000"), 1.0 / f64::from(i + 1)))
            .collect();
        let short = scores_header("scored", scores.get(..2).unwrap_or(&[]), 512);
        assert_eq!(short, "scored 10.0.0.0:8000=1.000,10.0.0.1:8000=0.500");
        let long = scores_header("scored", &scores, 512);
        assert!(long.len() <= 512, "{}", long.len());
        assert!(long.ends_with(",..."), "{long}");
        assert!(long.starts_with("scored 10.0.0.0:8000=1.000,"), "{long}");
    }
}
