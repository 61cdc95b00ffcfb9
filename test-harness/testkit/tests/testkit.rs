//! Tests of testkit against the real thing: processes are really killed, generated Envoy
//! configs pass `envoy --mode validate`, and a real Envoy routes to in-process echo backends
//! with each router (round robin, least request, override_host, cluster header, the filter).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use testkit::{
    bin, filter_wasm, get, pid_alive, post_json, validate_config, ChildGuard, EchoBackend,
    EchoConfig, EnvoySpec, Router, CLUSTER_HEADER, ENDPOINT_HEADER,
};

/// The filter module, or `None` (test skipped with a message) when it is not built and `CI` is
/// not set. In CI a missing module fails the test.
fn wasm_or_skip(test: &str) -> Option<std::path::PathBuf> {
    match filter_wasm() {
        Ok(path) => Some(path),
        Err(e) if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") => {
            panic!("{test}: CI is set and the filter module is missing: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED {test}: {e} (set CI=1 to make this a failure)");
            None
        }
    }
}

fn backend_of(resp: &testkit::HttpResponse) -> String {
    resp.header("x-echo-backend")
        .unwrap_or_default()
        .to_string()
}

#[test]
fn child_guard_kills_by_pid_on_drop_and_keeps_the_log() {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("echo hello-out; echo hello-err >&2; exec sleep 30");
    let guard = ChildGuard::spawn("sleeper", cmd).unwrap();
    let pid = guard.pid();
    assert!(pid_alive(pid));
    let log = guard.log_path().to_path_buf();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !guard.log_tail(5).contains("hello-err") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        guard.log_tail(5).contains("hello-out"),
        "{}",
        guard.log_tail(5)
    );
    assert!(guard.log_tail(5).contains("hello-err"));
    assert!(log.starts_with(testkit::target_dir().join("testlogs")));
    drop(guard);
    assert!(!pid_alive(pid), "pid {pid} still alive after drop");
}

#[test]
fn child_guard_escalates_to_sigkill_when_sigterm_is_ignored() {
    let mut cmd = Command::new("sh");
    // The trap makes the shell ignore SIGTERM; the loop keeps the shell itself running.
    cmd.arg("-c")
        .arg("trap '' TERM; echo ready; while true; do sleep 0.05; done");
    let mut guard = ChildGuard::spawn("stubborn", cmd).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !guard.log_tail(1).contains("ready") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    guard.set_grace(Duration::from_millis(200));
    let pid = guard.pid();
    let status = guard.stop();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "status {status}");
    assert!(!pid_alive(pid));
    assert!(guard.check_running().is_err());
}

#[test]
fn missing_binaries_name_the_build_command() {
    let err = bin("no-such-binary-xyz").unwrap_err().to_string();
    assert!(
        err.contains("cargo build --release --bin no-such-binary-xyz"),
        "{err}"
    );
    assert!(err.contains("no-such-binary-xyz"), "{err}");
    if let Err(e) = filter_wasm() {
        assert!(e.to_string().contains("./build.sh"), "{e}");
    }
    assert!(
        testkit::workspace_root().join("build.sh").is_file()
            || testkit::workspace_root().join("Cargo.toml").is_file()
    );
}

#[tokio::test]
async fn echo_backend_answers_records_and_streams() {
    let echo = EchoBackend::start().await.unwrap();
    let resp = post_json(
        echo.addr(),
        "/v1/chat/completions",
        &[("x-test", "1")],
        &json!({"model": "m"}),
    )
    .await
    .unwrap();
    assert_eq!(resp.status, 200);
    let body = resp.json().unwrap();
    assert_eq!(body["backend"], json!(echo.addr().to_string()));
    assert_eq!(body["body"]["model"], json!("m"));
    assert_eq!(body["headers"]["x-test"], json!("1"));
    assert_eq!(
        resp.header("x-model-sim-pod"),
        Some(echo.addr().to_string().as_str())
    );
    let streamed = post_json(
        echo.addr(),
        "/v1/completions",
        &[],
        &json!({"stream": true}),
    )
    .await
    .unwrap();
    assert_eq!(streamed.header("content-type"), Some("text/event-stream"));
    let data = streamed.sse_data();
    assert_eq!(data.len(), 4, "{data:?}");
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    echo.set_status(503);
    assert_eq!(get(echo.addr(), "/health", &[]).await.unwrap().status, 503);
    assert_eq!(echo.request_count(), 3);
    let recorded = echo.requests();
    assert_eq!(recorded[0].header("x-test"), Some("1"));
    assert_eq!(recorded[2].path, "/health");
    let addr = echo.addr();
    drop(echo);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        get(addr, "/", &[]).await.is_err(),
        "backend still answers after drop"
    );
}

#[test]
fn generated_configs_pass_envoy_validate() {
    let endpoints: Vec<SocketAddr> = vec![
        "127.0.0.1:9001".parse().unwrap(),
        "127.0.0.1:9002".parse().unwrap(),
    ];
    let dir = testkit::testlog_dir("validate").unwrap();
    for router in [
        Router::RoundRobin,
        Router::LeastRequest,
        Router::OverrideHost,
    ] {
        let spec = EnvoySpec::new(router)
            .pool("a", "pool_a", endpoints.clone())
            .pool("b", "pool_b", vec![]);
        let sub = dir.join(router.label());
        std::fs::create_dir_all(&sub).unwrap();
        let path = spec.write_config(&sub).unwrap();
        validate_config(&path).unwrap_or_else(|e| panic!("{router:?}: {e}"));
    }
    // A broken config must fail validation (the check can fail).
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        "static_resources: {clusters: [{name: x, type: STATIC, lb_policy: NOPE}]}\n",
    )
    .unwrap();
    assert!(validate_config(&bad).is_err());
}

#[test]
fn filter_config_passes_envoy_validate() {
    let Some(wasm) = wasm_or_skip("filter_config_passes_envoy_validate") else {
        return;
    };
    let mut spec =
        EnvoySpec::new(Router::Filter).pool("a", "pool_a", vec!["127.0.0.1:9001".parse().unwrap()]);
    spec.wasm_path = Some(wasm);
    let dir = testkit::testlog_dir("validate-filter").unwrap();
    let path = spec.write_config(&dir).unwrap();
    validate_config(&path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_and_stop_removes_the_pid() {
    let a = EchoBackend::start().await.unwrap();
    let b = EchoBackend::start().await.unwrap();
    let mut envoy = EnvoySpec::new(Router::RoundRobin)
        .pool("a", "pool_a", vec![a.addr(), b.addr()])
        .start()
        .await
        .unwrap();
    assert!(pid_alive(envoy.pid()));
    let mut served = std::collections::BTreeMap::<String, u32>::new();
    for i in 0..20 {
        let resp = post_json(
            envoy.listen_addr,
            "/v1/chat/completions",
            &[],
            &json!({"model": "a", "i": i}),
        )
        .await
        .unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
        let body = resp.json().unwrap();
        assert_eq!(body["backend"], json!(backend_of(&resp)));
        assert_eq!(body["body"]["i"], json!(i));
        *served.entry(backend_of(&resp)).or_default() += 1;
    }
    assert_eq!(
        served.len(),
        2,
        "round robin used one backend only: {served:?}"
    );
    assert_eq!(a.request_count() + b.request_count(), 20);
    let hosts = envoy.host_rq_totals("pool_a").unwrap();
    assert_eq!(hosts.get(&a.addr()).copied(), Some(a.request_count()));
    assert_eq!(hosts.get(&b.addr()).copied(), Some(b.request_count()));
    assert_eq!(
        envoy.counter("cluster.pool_a.upstream_rq_200").unwrap(),
        Some(20)
    );
    assert_eq!(envoy.counter("no.such.stat").unwrap(), None);
    let log = envoy.wait_access_log(20, Duration::from_secs(20)).unwrap();
    assert!(log
        .iter()
        .all(|e| e.code == 200 && e.cluster == "pool_a" && e.path == "/v1/chat/completions"));
    let counts = envoy.upstream_counts();
    assert_eq!(
        counts.get(&a.addr().to_string()).copied().unwrap_or(0) as u64,
        a.request_count()
    );
    let pid = envoy.pid();
    envoy.stop();
    assert!(!pid_alive(pid), "envoy pid {pid} alive after stop");
    assert!(post_json(envoy.listen_addr, "/", &[], &json!({}))
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_host_header_steers_and_retries_past_a_dead_member() {
    let a = EchoBackend::start().await.unwrap();
    let b = EchoBackend::start().await.unwrap();
    let dead: SocketAddr = format!("127.0.0.1:{}", testkit::free_port().unwrap())
        .parse()
        .unwrap();
    let envoy = EnvoySpec::new(Router::OverrideHost)
        .pool("a", "pool_a", vec![a.addr(), b.addr(), dead])
        .start()
        .await
        .unwrap();
    for _ in 0..6 {
        let b_str = b.addr().to_string();
        let resp = post_json(
            envoy.listen_addr,
            "/v1/completions",
            &[(ENDPOINT_HEADER, &b_str)],
            &json!({}),
        )
        .await
        .unwrap();
        assert_eq!(backend_of(&resp), b_str);
    }
    assert_eq!(a.request_count(), 0);
    // A non-member first entry is skipped; the next member is used.
    let list = format!("10.9.9.9:80,{}", a.addr());
    let resp = post_json(
        envoy.listen_addr,
        "/v1/completions",
        &[(ENDPOINT_HEADER, &list)],
        &json!({}),
    )
    .await
    .unwrap();
    assert_eq!(backend_of(&resp), a.addr().to_string());
    // A dead member first: connect failure, retry takes the next entry.
    let list = format!("{dead},{}", a.addr());
    let resp = post_json(
        envoy.listen_addr,
        "/v1/completions",
        &[(ENDPOINT_HEADER, &list)],
        &json!({}),
    )
    .await
    .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(backend_of(&resp), a.addr().to_string());
    assert_eq!(b.request_count(), 6);
    let log = envoy.wait_access_log(8, Duration::from_secs(20)).unwrap();
    let retried = log.iter().find(|e| e.endpoint_header == list).unwrap();
    assert_eq!(retried.raw["attempts"], json!(2), "{:?}", retried.raw);
    assert_eq!(retried.upstream_host, a.addr().to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_header_selects_the_pool_and_streams_pass_through() {
    let a = EchoBackend::start().await.unwrap();
    let b = EchoBackend::start_with(EchoConfig {
        sse_events: 5,
        sse_interval: Duration::from_millis(20),
        ..EchoConfig::default()
    })
    .await
    .unwrap();
    let envoy = EnvoySpec::new(Router::LeastRequest)
        .pool("a", "pool_a", vec![a.addr()])
        .pool("b", "pool_b", vec![b.addr()])
        .start()
        .await
        .unwrap();
    let resp = post_json(envoy.listen_addr, "/v1/completions", &[], &json!({}))
        .await
        .unwrap();
    assert_eq!(
        backend_of(&resp),
        a.addr().to_string(),
        "catch-all goes to the first pool"
    );
    let resp = post_json(
        envoy.listen_addr,
        "/v1/completions",
        &[(CLUSTER_HEADER, "pool_b")],
        &json!({"stream": true}),
    )
    .await
    .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(backend_of(&resp), b.addr().to_string());
    let data = resp.sse_data();
    assert_eq!(data.len(), 6, "{data:?}");
    assert_eq!(data[5], "[DONE]");
    assert!(
        resp.chunks.len() > 1,
        "stream arrived in one piece: {} chunks",
        resp.chunks.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_envoys_run_side_by_side() {
    let echo = EchoBackend::start().await.unwrap();
    let spec = EnvoySpec::new(Router::RoundRobin).pool("a", "pool_a", vec![echo.addr()]);
    let (x, y, z) = tokio::join!(spec.start(), spec.start(), spec.start());
    let envoys = [x.unwrap(), y.unwrap(), z.unwrap()];
    let mut listeners: Vec<SocketAddr> = envoys.iter().map(|e| e.listen_addr).collect();
    listeners.dedup();
    assert_eq!(listeners.len(), 3);
    for envoy in &envoys {
        let body = json!({});
        let r = post_json(envoy.listen_addr, "/v1/completions", &[], &body).await;
        assert_eq!(r.unwrap().status, 200);
    }
    assert_eq!(echo.request_count(), 3);
}

#[tokio::test]
async fn a_bad_config_fails_fast_with_envoys_log() {
    let mut spec = EnvoySpec::new(Router::RoundRobin).pool("a", "pool_a", vec![]);
    spec.extra_args = vec!["--no-such-flag".into()];
    let err = spec.start().await.unwrap_err().to_string();
    assert!(err.contains("exited early"), "{err}");
    assert!(err.contains("no-such-flag"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_router_routes_by_model_in_the_body() {
    let Some(wasm) = wasm_or_skip("filter_router_routes_by_model_in_the_body") else {
        return;
    };
    let a = EchoBackend::start().await.unwrap();
    let b = EchoBackend::start().await.unwrap();
    let mut spec = EnvoySpec::new(Router::Filter)
        .pool("model-a", "pool_a", vec![a.addr()])
        .pool("model-b", "pool_b", vec![b.addr()]);
    spec.wasm_path = Some(wasm);
    let envoy = spec.start().await.unwrap();
    for _ in 0..4 {
        let resp = post_json(
            envoy.listen_addr,
            "/v1/chat/completions",
            &[],
            &json!({"model": "model-b", "messages": []}),
        )
        .await
        .unwrap();
        assert_eq!(
            resp.status,
            200,
            "{} / envoy log:\n{}",
            resp.text(),
            envoy.log_tail(30)
        );
        assert_eq!(
            backend_of(&resp),
            b.addr().to_string(),
            "model-b must go to pool_b"
        );
        assert_eq!(resp.json().unwrap()["body"]["model"], json!("model-b"));
    }
    let resp = post_json(
        envoy.listen_addr,
        "/v1/chat/completions",
        &[],
        &json!({"model": "model-a", "messages": []}),
    )
    .await
    .unwrap();
    assert_eq!(backend_of(&resp), a.addr().to_string());
}

#[test]
fn spawn_and_wait_http_waits_for_health_and_reports_early_exit() {
    let port = testkit::free_port().unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let args: Vec<String> = [
        "-m",
        "http.server",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let server = testkit::spawn_and_wait_http(
        "http-server",
        std::path::Path::new("python3"),
        &args,
        addr,
        "/",
        Duration::from_secs(30),
    )
    .unwrap();
    let (status, _) = testkit::blocking_get(addr, "/", Duration::from_secs(5)).unwrap();
    assert_eq!(status, 200);
    let pid = server.pid();
    drop(server);
    assert!(!pid_alive(pid));
    let err = testkit::spawn_and_wait_http(
        "early-exit",
        std::path::Path::new("sh"),
        &["-c".to_string(), "echo boom-message; exit 3".to_string()],
        addr,
        "/",
        Duration::from_secs(30),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("exited early") && err.contains("boom-message"),
        "{err}"
    );
}
