//! The command line as a user meets it: `parse` output and exit codes, `check` errors naming the
//! field, and `run` in its flag form pushing to a fake proxy, then stopping cleanly on SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use llm_router_snapshot::Health;

const BIN: &str = env!("CARGO_BIN_EXE_sidecar-metrics");

fn fixture(name: &str) -> String {
    metrics_fixtures_dir().join(name).display().to_string()
}

fn tmp_file(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("sidecar-cli-{}-{name}", std::process::id()));
    std::fs::write(&p, text).expect("write");
    p
}

#[test]
fn parse_prints_the_pod_state_as_json() {
    let out = Command::new(BIN)
        .args(["parse", &fixture("sglang-docs-production-metrics.prom")])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["engine"], "sglang");
    assert_eq!(v["engine_detected"], true);
    assert_eq!(v["waiting"], 2826);
    assert_eq!(v["running"], 162);
    assert_eq!(
        v["kv_usage"].as_f64().map(|k| (k * 100.0).round()),
        Some(28.0)
    );
    assert_eq!(v["lora"], serde_json::Value::Null);
    assert_eq!(v["models"][0], "meta-llama/Llama-3.1-8B-Instruct");

    let out = Command::new(BIN)
        .args([
            "parse",
            "--engine",
            "vllm",
            &fixture("vllm-v0.7-aibrix-runtime-doc.prom"),
        ])
        .output()
        .expect("run");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        (v["block_size"].as_u64(), v["num_blocks"].as_u64()),
        (Some(16), Some(81767))
    );
    assert_eq!(v["lora"]["max_loras"], 0);
    assert_eq!(v["engine_detected"], false);

    // Skipped lines are reported on stderr, the figures still printed.
    let out = Command::new(BIN)
        .args([
            "parse",
            &fixture("vllm-design-doc-example-with-ellipsis.prom"),
        ])
        .output()
        .expect("run");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 4") && err.contains("skipped"), "{err}");
}

#[test]
fn parse_refuses_unusable_text_with_a_reason() {
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "parse".into(),
                tmp_file("html", "<html>502</html>\n").display().to_string(),
            ],
            "no metric of a known model server",
        ),
        (
            vec![
                "parse".into(),
                fixture("trtllm-dynamo-docs-illustrative.prom"),
            ],
            "none of the load gauges",
        ),
        (
            vec![
                "parse".into(),
                "--engine".into(),
                "sglang".into(),
                fixture("vllm-v1-grep-head40-llama-vllm-single.prom"),
            ],
            "sglang metrics found",
        ),
        (
            vec![
                "parse".into(),
                "--engine".into(),
                "nope".into(),
                fixture("vllm-v1-grep-head40-llama-vllm-single.prom"),
            ],
            "unknown engine",
        ),
        (
            vec!["parse".into(), "/nonexistent/metrics.prom".into()],
            "cannot read",
        ),
        (
            vec![
                "parse".into(),
                tmp_file("bin", "\u{0}\u{1}").display().to_string(),
            ],
            "no metric of a known model server",
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(BIN).args(&args).output().expect("run");
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
    let out = Command::new(BIN)
        .args(["parse", "-"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(!out.status.success());
}

#[test]
fn check_names_the_bad_field() {
    let p = tmp_file(
        "bad.yaml",
        "push: {address: 127.0.0.1:10000, secret: sidecar-test-secret-0123456789abcdef}\npools:\n  - name: a\n    cluster: c\n    discovery: {static: [\"nope\"]}\n",
    );
    let out = Command::new(BIN)
        .arg("check")
        .arg(&p)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pools[0].discovery.static[0]"), "{err}");
    let p = tmp_file(
        "good.toml",
        "[push]\naddress = \"127.0.0.1:10000\"\nsecret_file = \"/run/secrets/llm-router\"\n[[pools]]\nname = \"a\"\ncluster = \"c\"\n[pools.discovery]\nstatic = [\"127.0.0.1:1\"]\n",
    );
    let out = Command::new(BIN)
        .arg("check")
        .arg(&p)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A placeholder or a short secret stops the sidecar before it starts, from any source, with the
/// shared policy's message (how to make one).
#[test]
fn weak_secrets_are_refused_at_startup() {
    let pool = "name=llama,cluster=pool_llama,endpoints=127.0.0.1:1";
    let run = |secret_args: &[&str], env: Option<&str>| {
        let mut c = Command::new(BIN);
        c.args(["run", "--push", "127.0.0.1:1", "--pool", pool])
            .args(secret_args)
            .args(["--listen", "127.0.0.1:0"]);
        if let Some(v) = env {
            c.env("SIDECAR_CLI_TEST_SECRET", v);
        }
        let out = c.output().expect("run");
        assert!(!out.status.success(), "{secret_args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(&["--secret", "s3cret"], None);
    assert!(e.contains("6 bytes") && e.contains("openssl rand"), "{e}");
    let e = run(
        &["--secret-env", "SIDECAR_CLI_TEST_SECRET"],
        Some("change-me"),
    );
    assert!(
        e.contains("push.secret_env") && e.contains("placeholder"),
        "{e}"
    );
    let short = tmp_file("short-secret", "0123456789abcdef\n");
    let e = run(&["--secret-file", short.to_str().expect("utf-8")], None);
    assert!(
        e.contains("push.secret_file") && e.contains("16 bytes"),
        "{e}"
    );
    // `check` refuses an inline placeholder, naming the field.
    let p = tmp_file(
        "placeholder.yaml",
        "push: {address: 127.0.0.1:10000, secret: change-me}\npools:\n  - name: a\n    cluster: c\n    discovery: {static: [\"127.0.0.1:1\"]}\n",
    );
    let out = Command::new(BIN)
        .arg("check")
        .arg(&p)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("push.secret") && e.contains("placeholder"),
        "{e}"
    );
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn run_flag_form_pushes_and_stops_on_sigterm() {
    let fleet = FakeFleet::start(2, Answer::Text(vllm_text(0, 2, 0.4))).await;
    let proxy = FakeProxy::start().await;
    let pool = format!(
        "name=llama,cluster=pool_llama,models=m1+m2,endpoints={}",
        fleet.endpoints().join("+")
    );
    // The secret from a file, as a mounted Kubernetes Secret gives it (with a trailing newline).
    let secret = tmp_file("secret", &format!("{SECRET}\n"));
    let child = Command::new(BIN)
        .args([
            "run",
            "--push",
            &format!("http://{}", proxy.addr),
            "--secret-file",
            secret.to_str().expect("utf-8 path"),
            "--pool",
            &pool,
        ])
        .args([
            "--interval-ms",
            "50",
            "--listen",
            "127.0.0.1:0",
            "--log-json",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut child = Kill(child);
    let snaps = proxy
        .wait_for(
            "a snapshot with both pods ok",
            Duration::from_secs(10),
            |s| {
                s.last().and_then(|s| s.pool("llama")).is_some_and(|p| {
                    p.pods.len() == 2
                        && p.pods
                            .iter()
                            .all(|p| p.health == Health::Ok && p.running == 2)
                })
            },
        )
        .await;
    let last = snaps.last().and_then(|s| s.pool("llama")).expect("pool");
    assert_eq!(last.models, vec!["m1", "m2"]);
    assert_eq!(last.cluster, "pool_llama");
    assert!(proxy
        .received()
        .iter()
        .all(|r| r.signed && r.plain_secret.is_none()));

    let ok = Command::new("kill")
        .arg("-TERM")
        .arg(child.0.id().to_string())
        .status()
        .expect("kill");
    assert!(ok.success());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit status {status:?}");
    let mut logs = String::new();
    if let Some(mut e) = child.0.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut logs);
    }
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(!lines.is_empty(), "no JSON log lines: {logs}");
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "snapshot accepted by the proxy"),
        "{logs}"
    );
    assert!(
        lines.iter().any(|l| l["fields"]["message"] == "stopped"),
        "{logs}"
    );
}

/// `credential` writes one replica's credential from the hub secret: the same for the same pod
/// name, another for another name, never the secret itself; a weak hub secret is refused.
#[test]
fn credential_derives_a_replicas_keys_without_the_hub_secret() {
    let secret = "cli-hub-secret-0123456789abcdef-0123456";
    let f = tmp_file("hub-secret", &format!("{secret}\n"));
    let run = |name: &str| {
        let o = std::process::Command::new(BIN)
            .args(["credential", "--hub-secret-file"])
            .arg(&f)
            .args(["--replica-name", name])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let a = run("llm-gateway-abc");
    assert_eq!(a, run("llm-gateway-abc"));
    assert_ne!(a, run("llm-gateway-xyz"));
    let c = sidecar_metrics::keys::Credential::parse(&a).unwrap();
    assert_eq!(
        c.replica,
        sidecar_metrics::keys::replica_id_of_name("llm-gateway-abc")
    );
    assert!(!a.contains(secret));
    let hub = sidecar_metrics::keys::HubKeys::from_secret(secret.as_bytes());
    assert!(hub.credential(c.replica) == c);
    let weak = tmp_file("hub-weak", "change-me\n");
    let o = std::process::Command::new(BIN)
        .args(["credential", "--hub-secret-file"])
        .arg(&weak)
        .args(["--replica", "3"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("placeholder"));
}
