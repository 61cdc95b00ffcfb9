//! Reading the pods' Prometheus `/metrics`: one scrape summed per metric family, over the fleet
//! ([`scrape`]) or per pod ([`scrape_each`]), and the emulator's stats reset ([`reset_stats`]).
//! The stack launchers ([`crate::stack`]) read pods with it; the bench's figures
//! (`bench::analysis::podmetrics`) are computed from what it returns.

use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Sum of every sample of each metric family in Prometheus text, keyed by name without labels.
pub fn sum_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.find('{') {
            Some(i) => match line[i..].find('}') {
                Some(j) => (&line[..i], &line[i + j + 1..]),
                None => continue,
            },
            None => match line.split_once(' ') {
                Some((n, r)) => (n, r),
                None => continue,
            },
        };
        let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        if v.is_finite() {
            *out.entry(name.to_string()).or_insert(0.0) += v;
        }
    }
    out
}

/// Scrape every pod once and sum the families over the fleet.
pub async fn scrape(pods: &[SocketAddr]) -> BTreeMap<String, f64> {
    let mut total = BTreeMap::new();
    for p in pods {
        if let Ok(r) = crate::get(*p, "/metrics", &[]).await {
            for (k, v) in sum_metrics(&r.text()) {
                *total.entry(k).or_insert(0.0) += v;
            }
        }
    }
    total
}

/// Scrape every pod once; one map per pod, in the order given (empty when a pod did not answer).
pub async fn scrape_each(pods: &[SocketAddr]) -> Vec<BTreeMap<String, f64>> {
    let mut out = Vec::with_capacity(pods.len());
    for p in pods {
        out.push(match crate::get(*p, "/metrics", &[]).await {
            Ok(r) if r.status == 200 => sum_metrics(&r.text()),
            _ => BTreeMap::new(),
        });
    }
    out
}

/// `POST /admin/stats/reset` on every pod (resets the emulator's `*_max` gauges at the window
/// start); true when every pod accepted it.
pub async fn reset_stats(pods: &[SocketAddr]) -> bool {
    let mut all = true;
    for p in pods {
        let ok = matches!(
            crate::post_bytes(*p, "/admin/stats/reset", &[], Vec::<u8>::new()).await,
            Ok(r) if (200..300).contains(&r.status)
        );
        all &= ok;
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_sample_of_a_family_and_skips_what_is_not_one() {
        let m = sum_metrics(
            "# TYPE q counter\nq{pod=\"a\"} 2\nq{pod=\"b\"} 3.5\nplain 1\nbad{ 1\nnan NaN\n",
        );
        assert_eq!(m["q"], 5.5);
        assert_eq!(m["plain"], 1.0);
        assert_eq!(m.len(), 2);
    }
}
