//! The operator's view, end to end: a real Prometheus (Debian's `prometheus`, on loopback, in its
//! own temporary folder, on a free port, stopped by PID) scrapes a real Envoy running the real
//! filter `.wasm` and the metrics sidecar in front of model-sim pods while traffic flows. Then
//! every query of the shipped Grafana dashboard (`envoy/observability/grafana-dashboard.json`,
//! template variables substituted) runs against that server's HTTP API and must return data,
//! every metric a query or a template variable names must exist there, and the shipped scrape
//! configuration (`envoy/observability/prometheus.yml`, whose jobs and paths the test uses with
//! its own targets) passes `promtool check config`.
//!
//! The main panels' series over the run are written to `<target>/observability/dashboard-run.json`
//! (`bench dashboard-chart` draws the README's chart from it).
//!
//! Needs Envoy (`./build.sh setup`), the filter `.wasm`, `model-sim` and `sidecar-metrics`
//! (`./build.sh`) and `prometheus` (`./build.sh setup`; or `PROMETHEUS_BIN`): skipped with a
//! message when missing, failed when `CI` is set.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use testkit::{ChildGuard, EnvoyProcess, EnvoySpec, Router, ServerProcess};

const SECRET: &str = "e2e-prometheus-secret-0123456789abcdef";
const MODEL: &str = "llama-model";
const ADAPTER: &str = "sql-lora";
const DASHBOARD: &str = "envoy/observability/grafana-dashboard.json";
const SCRAPE_CONFIG: &str = "envoy/observability/prometheus.yml";
/// Prometheus' scrape interval in the test.
const SCRAPE_S: u64 = 1;
/// How long traffic flows.
const TRAFFIC: Duration = Duration::from_secs(20);
/// Stands for Grafana's `$__rate_interval`: longer than the whole run, so a rate covers it.
const RATE_INTERVAL: &str = "1m";
const LIMIT: Duration = Duration::from_secs(30);
/// Panels drawn in the README's chart (titles in the dashboard).
const CHART_PANELS: [&str; 6] = [
    "Requests by outcome",
    "Picks per pod",
    "Decision time",
    "In flight per pod",
    "Tokens per second by model",
    "Snapshot age",
];

fn prometheus_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("PROMETHEUS_BIN") {
        return Ok(PathBuf::from(p));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
        .ok_or_else(|| "prometheus not found on PATH (./build.sh setup installs Debian's prometheus package; or set PROMETHEUS_BIN)".to_string())
}

/// Percent-encodes a query parameter value (everything but RFC 3986's unreserved characters).
fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len() * 3);
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// GET on Prometheus' HTTP API; returns `data` of a successful answer.
async fn api(prom: SocketAddr, path: &str) -> Value {
    let r = testkit::get(prom, path, &[]).await.unwrap();
    assert_eq!(r.status, 200, "GET {path}: {}", r.text());
    let v = r.json().unwrap();
    assert_eq!(v["status"], "success", "GET {path}: {v}");
    v["data"].clone()
}

/// The shipped scrape configuration with the test's targets and a short interval, as JSON
/// (which Prometheus reads as YAML).
fn scrape_config(root: &Path, envoy_admin: SocketAddr, sidecar: SocketAddr) -> Value {
    let text = std::fs::read_to_string(root.join(SCRAPE_CONFIG))
        .unwrap_or_else(|e| panic!("{SCRAPE_CONFIG}: {e}"));
    let shipped: Value = serde_yaml::from_str(&text).unwrap();
    let jobs = shipped["scrape_configs"].as_array().unwrap();
    let mut out = Vec::new();
    for (job, target) in [("envoy", envoy_admin), ("llm-router-sidecar", sidecar)] {
        let mut j = jobs
            .iter()
            .find(|j| j["job_name"] == job)
            .unwrap_or_else(|| panic!("{SCRAPE_CONFIG} has no job {job}"))
            .clone();
        j["static_configs"] = json!([{"targets": [target.to_string()]}]);
        j["scrape_interval"] = json!(format!("{SCRAPE_S}s"));
        j["scrape_timeout"] = json!(format!("{SCRAPE_S}s"));
        out.push(j);
    }
    json!({
        "global": {"scrape_interval": format!("{SCRAPE_S}s"), "evaluation_interval": format!("{SCRAPE_S}s")},
        "scrape_configs": out,
    })
}

/// Starts Prometheus on a free loopback port with its data in `dir`.
fn start_prometheus(dir: &Path, config: &Path) -> ServerProcess {
    let program = prometheus_binary().unwrap();
    let mut last = None;
    for attempt in 0..3 {
        let port = testkit::free_port().unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let args = vec![
            format!("--config.file={}", config.display()),
            format!(
                "--storage.tsdb.path={}",
                dir.join(format!("data-{attempt}")).display()
            ),
            format!("--web.listen-address={addr}"),
            "--log.level=warn".to_string(),
        ];
        match testkit::spawn_and_wait_http("prometheus", &program, &args, addr, "/-/ready", LIMIT) {
            Ok(p) => return p,
            Err(e) => last = Some(e),
        }
    }
    panic!("prometheus did not start: {last:?}")
}

/// The filter's view of the pool, from the internal listener.
async fn pods_ok(envoy: &EnvoyProcess, pods: &[SocketAddr]) -> bool {
    let r = testkit::get(envoy.push_addr(), "/__llm_router/state", &[])
        .await
        .unwrap();
    let s: Value = r.json().unwrap_or(Value::Null);
    pods.iter().all(|a| {
        s["pools"][0]["pods"].as_array().is_some_and(|ps| {
            ps.iter()
                .any(|p| p["address"] == json!(a.to_string()) && p["health"] == "ok")
        })
    })
}

/// One client's share of the traffic: shared-prefix chats, adapter requests, an unknown model.
async fn client(envoy: SocketAddr, id: usize, until: Instant) -> (u64, u64) {
    let (mut ok, mut other) = (0u64, 0u64);
    let mut i = 0usize;
    let preamble = "You are a careful assistant for the operations team. ".repeat(40);
    while Instant::now() < until {
        let (model, content) = match i % 10 {
            0..=5 => (MODEL, format!("{preamble} Question {id}-{i}")),
            6..=8 => (ADAPTER, format!("SELECT {i} FROM t{id}")),
            _ => ("no-such-model", "hi".to_string()),
        };
        let body = json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": content}]});
        match testkit::post_json(envoy, "/v1/chat/completions", &[], &body).await {
            Ok(r) if r.status == 200 => ok += 1,
            _ => other += 1,
        }
        i += 1;
        // Paced: enough for every panel, light on a shared machine.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (ok, other)
}

/// Replaces the dashboard's template variables the way Grafana does with "All" selected.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("${pool}", ".*")
        .replace("$pool", ".*")
}

/// Metric names a PromQL expression reads (this project's, `llm_router_…`, and Envoy's).
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("llm_router_") || w.starts_with("envoy_"))
        .map(str::to_string)
        .collect()
}

/// True when an instant-query result holds at least one finite value.
fn has_data(data: &Value) -> bool {
    data["result"].as_array().is_some_and(|r| {
        r.iter().any(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_queries_return_data_from_a_real_prometheus() {
    if !testkit::stack_ready(
        "dashboard_queries_return_data_from_a_real_prometheus",
        [prometheus_binary().err()],
    ) {
        return;
    }
    let root = testkit::workspace_root();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join(DASHBOARD))
            .unwrap_or_else(|e| panic!("{DASHBOARD}: {e}")),
    )
    .unwrap();

    // The shipped scrape configuration is valid for Prometheus itself.
    let promtool = prometheus_binary().unwrap().with_file_name("promtool");
    if promtool.is_file() {
        let out = Command::new(&promtool)
            .args(["check", "config"])
            .arg(root.join(SCRAPE_CONFIG))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool check config {SCRAPE_CONFIG}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Two pods, and a third that is down (nothing listens there): the sidecar's failures.
    let sim = ["--profile", "h100", "--speedup", "50", "--model", MODEL];
    let a = testkit::start_model_sim(&sim).await.unwrap();
    let b = testkit::start_model_sim(&sim).await.unwrap();
    let dead: SocketAddr = format!("127.0.0.1:{}", testkit::free_port().unwrap())
        .parse()
        .unwrap();
    let (pa, pb) = (a.addr, b.addr);
    let envoy = EnvoySpec::new(Router::Filter)
        .concurrency(2)
        .pool("llama", "pool_llama", vec![pa, pb, dead])
        .plugin_config(json!({
            "pools": [{"name": "llama", "cluster": "pool_llama", "models": [MODEL], "adapters": [ADAPTER]}],
            "snapshot": {"secret": SECRET, "stale_after_ms": 3000}
        }))
        .start()
        .await
        .unwrap();

    let face: SocketAddr = format!("127.0.0.1:{}", testkit::free_port().unwrap())
        .parse()
        .unwrap();
    let mut cmd = Command::new(testkit::bin("sidecar-metrics").unwrap());
    cmd.args([
        "run",
        "--push",
        &format!("http://{}", envoy.push_addr()),
        "--secret",
        SECRET,
        "--pool",
        &format!("name=llama,cluster=pool_llama,models={MODEL},endpoints={pa}+{pb}+{dead}"),
        "--interval-ms",
        "50",
        "--timeout-ms",
        "200",
        "--listen",
        &face.to_string(),
    ]);
    let _sidecar = ChildGuard::spawn("sidecar-metrics", cmd).unwrap();
    let start = Instant::now();
    while !pods_ok(&envoy, &[pa, pb]).await {
        assert!(
            start.elapsed() < LIMIT,
            "the sidecar's snapshot never reached the filter\n{}",
            envoy.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let dir = testkit::testlog_dir("prometheus").unwrap();
    let config_path = dir.join("prometheus.yml");
    std::fs::write(
        &config_path,
        serde_json::to_string_pretty(&scrape_config(&root, envoy.admin_addr, face)).unwrap(),
    )
    .unwrap();
    let prom = {
        let (dir, config_path) = (dir.clone(), config_path.clone());
        tokio::task::spawn_blocking(move || start_prometheus(&dir, &config_path))
            .await
            .unwrap()
    };
    let p = prom.addr;

    // Both targets up before the traffic starts.
    let start = Instant::now();
    loop {
        let t = api(p, "/api/v1/targets?state=active").await;
        let targets = t["activeTargets"].as_array().cloned().unwrap_or_default();
        if targets.len() == 2 && targets.iter().all(|t| t["health"] == "up") {
            break;
        }
        assert!(
            start.elapsed() < LIMIT,
            "Prometheus' targets are not up: {t:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let t0 = now_s();
    let until = Instant::now() + TRAFFIC;
    let runs: Vec<_> = (0..4)
        .map(|id| tokio::spawn(client(envoy.listen_addr, id, until)))
        .collect();
    let (mut ok, mut other) = (0, 0);
    for r in runs {
        let (o, x) = r.await.unwrap();
        ok += o;
        other += x;
    }
    eprintln!("traffic: {ok} answered 200, {other} others in {TRAFFIC:?}");
    assert!(ok > 20, "too little traffic got through: {ok}");
    // Two more scrapes so the last requests and the gauges' last values are stored.
    tokio::time::sleep(Duration::from_secs(3 * SCRAPE_S)).await;
    let t1 = now_s();

    let names: BTreeSet<String> = api(p, "/api/v1/label/__name__/values")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();

    let mut failures = Vec::new();
    // Template variables: `label_values(metric, label)` must find values.
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        let Some(q) = var["query"]["query"].as_str().or(var["query"].as_str()) else {
            continue;
        };
        let Some(args) = q
            .strip_prefix("label_values(")
            .and_then(|s| s.strip_suffix(')'))
        else {
            continue;
        };
        let (metric, label) = args.split_once(',').unwrap();
        let (metric, label) = (metric.trim(), label.trim());
        if !names.contains(metric) {
            failures.push(format!("variable {}: no metric {metric}", var["name"]));
            continue;
        }
        let values = api(
            p,
            &format!(
                "/api/v1/label/{label}/values?match%5B%5D={}",
                encode(metric)
            ),
        )
        .await;
        if values.as_array().is_none_or(Vec::is_empty) {
            failures.push(format!(
                "variable {}: no {label} values on {metric}",
                var["name"]
            ));
        }
    }

    let step = 1.0;
    let mut chart = Vec::new();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap_or_default();
        let mut series = Vec::new();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = substitute(target["expr"].as_str().unwrap());
            queries += 1;
            for m in metric_names(&expr) {
                if !names.contains(&m) {
                    failures.push(format!("{title}: metric {m} does not exist ({expr})"));
                }
            }
            let data = api(
                p,
                &format!("/api/v1/query?query={}&time={t1:.3}", encode(&expr)),
            )
            .await;
            if !has_data(&data) {
                failures.push(format!("{title}: no data for {expr}: {data}"));
            }
            if CHART_PANELS.contains(&title) {
                let range = api(
                    p,
                    &format!(
                        "/api/v1/query_range?query={}&start={t0:.3}&end={t1:.3}&step={step}",
                        encode(&substitute(
                            &target["expr"]
                                .as_str()
                                .unwrap()
                                .replace("$__rate_interval", "5s")
                        ))
                    ),
                )
                .await;
                let legend = target["legendFormat"].as_str().unwrap_or_default();
                for s in range["result"].as_array().into_iter().flatten() {
                    let label = s["metric"].as_object().map_or(legend.to_string(), |m| {
                        m.iter().fold(legend.to_string(), |l, (k, v)| {
                            l.replace(&format!("{{{{{k}}}}}"), v.as_str().unwrap_or_default())
                        })
                    });
                    let points: Vec<(f64, f64)> = s["values"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| {
                            let t = v[0].as_f64()? - t0;
                            let y = v[1].as_str()?.parse::<f64>().ok()?;
                            y.is_finite().then_some((t, y))
                        })
                        .collect();
                    series.push(json!({"label": label, "points": points}));
                }
            }
        }
        if CHART_PANELS.contains(&title) {
            chart.push(json!({
                "title": title,
                "unit": panel["fieldConfig"]["defaults"]["unit"],
                "series": series,
            }));
        }
    }
    assert!(queries >= 12, "the dashboard has only {queries} queries");
    assert!(
        failures.is_empty(),
        "{} problem(s) with the dashboard's {queries} queries:\n{}",
        failures.len(),
        failures.join("\n")
    );

    let out = testkit::target_dir().join("observability");
    std::fs::create_dir_all(&out).unwrap();
    let run = json!({
        "what": "the dashboard's main panels over one run of test-harness/e2e/tests/prometheus.rs",
        "traffic_s": TRAFFIC.as_secs(),
        "clients": 4,
        "requests_ok": ok,
        "requests_other": other,
        "scrape_interval_s": SCRAPE_S,
        "rate_window": "5s",
        "panels": chart,
    });
    std::fs::write(
        out.join("dashboard-run.json"),
        serde_json::to_string_pretty(&run).unwrap(),
    )
    .unwrap();
    eprintln!(
        "{queries} dashboard queries returned data; series written to {}",
        out.join("dashboard-run.json").display()
    );
}
