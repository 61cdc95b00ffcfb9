//! End-to-end smoke test of the benchmark (about 20 s): a tiny mixed-GPU run through the real
//! Envoy under round robin and under the filter (with the sidecar), then the report files.
//!
//! Needs what `./build.sh test` builds first (model-sim, sidecar-metrics, the filter .wasm and
//! Envoy in .venv); when one is missing it fails with testkit's message naming the command.

use bench::report::{check_targets, Report};
use bench::runner::{run_one, write_outputs};
use bench::scenarios::{scenario, Mode};
use bench::stack::RouterKind;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_mixed_gpu_run_through_envoy_and_the_filter() {
    let mode = Mode {
        quick: true,
        speedup: 1.0,
        seed: 7,
    };
    let mut sc = scenario("mixed_gpu", mode).unwrap();
    sc.workload.horizon = Duration::from_secs(3);
    sc.workload.arrival = bench::arrivals::Arrival::Poisson { rate: 5.0 };
    sc.drain = Duration::from_secs(20);
    let n = bench::workload::generate(&sc.workload).len() as u64;
    assert!(n > 3);
    let mut rep = Report {
        mode: "smoke".into(),
        ..Report::default()
    };
    for r in [RouterKind::RoundRobin, RouterKind::Filter] {
        let (sum, result) = run_one(&sc, r)
            .await
            .unwrap_or_else(|e| panic!("{} run failed: {e}", r.name()));
        assert_eq!(sum.requests, n, "{}", r.name());
        assert_eq!(sum.errors, 0, "{}: {:?}", r.name(), sum.errors_by_status);
        assert!(sum.ttft_p50_ms > 0.0 && sum.ttft_p99_ms >= sum.ttft_p50_ms);
        assert!(sum.output_tokens_per_s > 0.0);
        // Every sample names a pod of the fleet, and the shares add up to 1.
        assert!(result.samples.iter().all(|s| s.outcome.pod.is_some()));
        let total: f64 = sum.pod_share.values().sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!(sum.pod_share.len() <= 4);
        rep.scenarios
            .entry("mixed_gpu".into())
            .or_default()
            .insert(r.name().into(), sum);
    }
    rep.targets = check_targets(&rep.scenarios, &[]);
    let dir = testkit::testlog_dir("bench-smoke").unwrap();
    write_outputs(&rep, &dir, "smoke").unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("smoke.json")).unwrap()).unwrap();
    for r in ["round_robin", "filter"] {
        let s = &v["scenarios"]["mixed_gpu"][r];
        for k in [
            "ttft_p50_ms",
            "ttft_p95_ms",
            "ttft_p99_ms",
            "e2e_p95_ms",
            "throughput_rps",
            "output_tokens_per_s",
            "requests",
            "errors",
        ] {
            assert!(s[k].is_number(), "{r}.{k}: {s}");
        }
    }
    let md = std::fs::read_to_string(dir.join("smoke.md")).unwrap();
    assert!(md.contains("| mixed_gpu | filter |"));
    // The chart is linked by its name, beside the report (no machine path).
    assert!(
        md.contains("Chart: [`smoke-ttft.png`](smoke-ttft.png)"),
        "{md}"
    );
    assert!(dir.join("smoke-ttft.png").is_file());
}
