//! Fuzz target: the sidecar's Prometheus text reader (`sidecar_metrics::prom`) and the
//! normalisation of one pod's text into load figures (`engines::normalise`), on whatever a pod's
//! `/metrics` answers.
//!
//! Properties checked, beyond "no panic":
//! - every sample read, written back in the exposition format (escaped labels, the value in
//!   exponent form), reads back as the same sample (name, labels, value bit for bit or NaN,
//!   timestamp);
//! - bad lines are reported once each, in order, with numbers inside the text;
//! - the scraping fast path (samples of unwanted names skipped unread) gives exactly the samples
//!   a full read gives for the wanted names;
//! - normalising fast and in detail gives the same figures for the same engine, a KV use within
//!   [0, 1], and a pod the snapshot format can carry (it encodes and decodes back).
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_router_snapshot::{Pod, Pool, Snapshot};
use sidecar_metrics::engines::{normalise, Options, PodMetrics};
use sidecar_metrics::prom::{self, Line, Sample};
use std::fmt::Write;

fn write_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v == f64::INFINITY {
        out.push_str("+Inf");
    } else if v == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else {
        let _ = write!(out, "{v:e}");
    }
}

/// One sample in the exposition format.
fn render(s: &Sample<'_>) -> String {
    let mut out = String::from(s.name);
    let labels: Vec<_> = s.labels().collect();
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            for c in v.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '"' => out.push_str("\\\""),
                    '\n' => out.push_str("\\n"),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    write_value(&mut out, s.value);
    if let Some(t) = s.timestamp {
        let _ = write!(out, " {t}");
    }
    out
}

fn same_sample(a: &Sample<'_>, b: &Sample<'_>) -> bool {
    a.name == b.name
        && a.timestamp == b.timestamp
        && (a.value.to_bits() == b.value.to_bits() || (a.value.is_nan() && b.value.is_nan()))
        && a.labels().eq(b.labels())
}

/// A name filter unlike the engines' one, so both paths of the fast skip are exercised.
fn want(name: &str) -> bool {
    name.len().is_multiple_of(2)
}

fn figures(m: &PodMetrics) -> impl PartialEq + std::fmt::Debug {
    (
        m.engine,
        m.waiting,
        m.running,
        m.kv_usage.map(f32::to_bits),
        m.block_size,
        m.num_blocks,
        m.lora.clone(),
        m.missing.clone(),
    )
}

fn check_normalise(text: &str) {
    let detailed = normalise(
        text,
        Options {
            engine: None,
            detailed: true,
        },
    );
    let Ok(detailed) = detailed else { return };
    let fast = normalise(
        text,
        Options {
            engine: Some(detailed.engine),
            detailed: false,
        },
    )
    .expect("the engine read in detail also reads fast");
    let again = normalise(
        text,
        Options {
            engine: Some(detailed.engine),
            detailed: true,
        },
    )
    .expect("the detected engine reads when configured");
    assert_eq!(figures(&fast), figures(&again));
    assert!(fast.kv_usage.is_none_or(|kv| (0.0..=1.0).contains(&kv)));
    // What the sidecar pushes for this pod (sidecar.rs `pod_entry`).
    let snapshot = Snapshot {
        rewrites: None,
        objectives: None,
        generation: 1,
        created_ms: 1,
        pools: vec![Pool {
            name: "p".into(),
            cluster: "c".into(),
            models: Vec::new(),
            pods: vec![Pod {
                address: "10.0.0.1:8000".into(),
                engine: fast.engine,
                waiting: fast.waiting,
                running: fast.running,
                kv_usage: fast.kv_usage,
                block_size: fast.block_size,
                num_blocks: fast.num_blocks,
                lora: fast.lora.clone(),
                ..Pod::default()
            }],
            peer_contexts: Vec::new(),
        }],
    };
    let bytes = snapshot.encode().expect("the pod's figures encode");
    Snapshot::decode(&bytes).expect("and decode");
}

fuzz_target!(|data: &[u8]| {
    // The scraper refuses a body that is not UTF-8 before parsing (scrape.rs).
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (samples, errors) = prom::parse_all(text);
    let lines = text.split('\n').count();
    for w in errors.windows(2) {
        assert!(w[0].line < w[1].line, "{:?}", w);
    }
    for e in &errors {
        assert!(e.line >= 1 && e.line <= lines);
    }
    for s in &samples {
        let line = render(s);
        match prom::parse_line(&line, 1, |_| true) {
            Ok(Line::Sample(back)) => assert!(same_sample(s, &back), "{s:?} → {line:?} → {back:?}"),
            other => panic!("{s:?} rendered as {line:?} reads as {other:?}"),
        }
    }
    let mut fast = Vec::new();
    prom::for_each_line(
        text,
        want,
        |l| {
            if let Line::Sample(s) = l {
                fast.push(s);
            }
        },
        |_| {},
    );
    let full: Vec<_> = samples.iter().filter(|s| want(s.name)).collect();
    assert_eq!(fast.len(), full.len(), "fast path and full read disagree");
    for (a, b) in fast.iter().zip(full) {
        assert!(same_sample(a, b), "{a:?} vs {b:?}");
    }
    check_normalise(text);
});
