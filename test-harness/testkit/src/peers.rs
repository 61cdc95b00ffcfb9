//! The field's routers, run for real: [`PeerRouter::Smg`] (`smg` 1.13.0, Shepherd Model
//! Gateway: SGLang's model gateway today, the successor of `sglang-router`) and
//! [`PeerRouter::VllmRouter`] (`vllm-router` 0.1.17, vllm-project/router, a fork of the older
//! sglang-router). Both are PyPI wheels with a Rust core behind a Python launcher;
//! `./build.sh setup` installs each into its own venv, `<root>/.venv-peers/<package>`
//! (`setup_peers`).
//!
//! [`start`] runs one in front of the given workers on loopback and returns once its
//! `GET /readiness` reports every worker healthy (SGLang's `/health` answers 200 before any
//! worker is registered, so it is no readiness signal). The process is a [`ChildGuard`]:
//! logged under `<target>/testlogs/`, stopped by PID on drop.
//!
//! Only the flags needed to run here are set, each for a reason given at
//! [`PeerRouter::args`]; everything else is the router's documented default. In particular
//! retries (5 attempts with backoff), the circuit breaker (opens after 10 failures) and the
//! periodic health check stay as they ship, and so do the policy thresholds (`cache_threshold`
//! 0.3, the spill gates), SMG's load monitor (every 10 s), its admission bound
//! (`--max-concurrent-requests` derived from the cores, a queue of 100 for 60 s) and the
//! request log at INFO level. Callers that compare admission like with like add SMG's own
//! admission flags through [`start_blocking_with`].

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::http::blocking_get;
use crate::paths::{testlog_dir, workspace_root};
use crate::process::ChildGuard;

/// How long [`start`] waits for `/readiness` to report every worker healthy. The launchers
/// import Python packages first (a few seconds on a busy 2-core machine), then check the
/// workers once a second.
pub const PEER_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// One of the field's routers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerRouter {
    /// `smg` 1.13.0 (its `smg launch` command).
    Smg,
    /// `vllm-router` 0.1.17 (its `vllm-router` launcher).
    VllmRouter,
}

impl PeerRouter {
    /// Both, in report order.
    pub const ALL: [PeerRouter; 2] = [PeerRouter::Smg, PeerRouter::VllmRouter];

    /// The PyPI package (also the venv's folder name under `.venv-peers/`).
    pub fn package(self) -> &'static str {
        match self {
            PeerRouter::Smg => "smg",
            PeerRouter::VllmRouter => "vllm-router",
        }
    }

    /// The version `./build.sh setup` installs (`PEER_ROUTERS` in build.sh).
    pub fn version(self) -> &'static str {
        match self {
            PeerRouter::Smg => "1.13.0",
            PeerRouter::VllmRouter => "0.1.17",
        }
    }

    /// The variable that points at a venv installed elsewhere.
    pub fn venv_env(self) -> &'static str {
        match self {
            PeerRouter::Smg => "LLMR_SMG_VENV",
            PeerRouter::VllmRouter => "LLMR_VLLM_ROUTER_VENV",
        }
    }

    /// The venv: `$LLMR_SMG_VENV` / `$LLMR_VLLM_ROUTER_VENV` if set, else
    /// `<root>/.venv-peers/<package>`.
    pub fn venv(self) -> PathBuf {
        match std::env::var_os(self.venv_env()).filter(|v| !v.is_empty()) {
            Some(v) => PathBuf::from(v),
            None => workspace_root().join(".venv-peers").join(self.package()),
        }
    }

    /// The program and its leading arguments: the launcher script pip installed (`smg launch`,
    /// `vllm-router`). A [`Error::Missing`] that
    /// names `./build.sh setup` when the venv does not hold it.
    pub fn program(self) -> Result<(PathBuf, Vec<String>)> {
        self.program_in(&self.venv())
    }

    /// [`PeerRouter::program`] in the venv `venv`.
    pub fn program_in(self, venv: &std::path::Path) -> Result<(PathBuf, Vec<String>)> {
        let (program, args, marker) = match self {
            PeerRouter::Smg => (
                venv.join("bin/smg"),
                vec!["launch".to_string()],
                venv.join("bin/smg"),
            ),
            PeerRouter::VllmRouter => (
                venv.join("bin/vllm-router"),
                vec![],
                venv.join("bin/vllm-router"),
            ),
        };
        if program.is_file() && marker.is_file() {
            Ok((program, args))
        } else {
            Err(Error::Missing {
                what: format!("{} {}", self.package(), self.version()),
                path: marker,
                hint: format!(
                    "run `./build.sh setup` (installs it into .venv-peers/{}) or set {}",
                    self.package(),
                    self.venv_env()
                ),
            })
        }
    }

    /// The command line after the program, for `policy` in front of `workers`, listening on
    /// `port` with its Prometheus exporter on `prometheus_port`. The flags set, and why:
    ///
    /// - `--host 127.0.0.1`, `--prometheus-host 127.0.0.1`: both default to 0.0.0.0; the
    ///   harness runs on loopback only.
    /// - `--port`, `--prometheus-port`: free ports; the defaults (30000, and 29000 for both
    ///   routers' exporters) would collide when two run side by side.
    /// - `--worker-urls`: the pods; `--policy`: the policy under test.
    /// - `--worker-startup-check-interval 1`: at the default (30 s) the router waits up to 30 s
    ///   before it sees a started worker healthy; this only shortens the start, not routing.
    pub fn args(
        self,
        policy: &str,
        workers: &[SocketAddr],
        port: u16,
        prometheus_port: u16,
    ) -> Vec<String> {
        let mut a: Vec<String> = [
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &prometheus_port.to_string(),
            "--policy",
            policy,
            "--worker-startup-check-interval",
            "1",
            "--worker-urls",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(workers.iter().map(|w| format!("http://{w}")));
        a
    }
}

/// A running peer router; stopped by PID when dropped.
#[derive(Debug)]
pub struct PeerProcess {
    /// Which router.
    pub kind: PeerRouter,
    /// Its policy.
    pub policy: String,
    /// Where it serves the OpenAI API (127.0.0.1:PORT).
    pub addr: SocketAddr,
    /// Its Prometheus exporter.
    pub prometheus_addr: SocketAddr,
    /// Its folder under `<target>/testlogs/` (holds `router.log`).
    pub dir: PathBuf,
    guard: ChildGuard,
}

impl PeerProcess {
    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The router's process id (the launcher's Python process; the Rust core runs inside it).
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// The file that receives its stdout and stderr.
    pub fn log_path(&self) -> &std::path::Path {
        self.guard.log_path()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.guard.log_tail(lines)
    }

    /// Stops it now (SIGTERM, SIGKILL after the grace period).
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.guard.stop()
    }
}

/// Whether a `/readiness` answer reports `want` workers, all healthy. Both routers answer
/// `{"status":"ready","healthy_workers":N,"total_workers":N}` (200) once ready.
pub fn readiness_complete(status: u16, body: &str, want: usize) -> bool {
    if status != 200 {
        return false;
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
        return false;
    };
    let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
    v.get("status").and_then(serde_json::Value::as_str) == Some("ready")
        && n("healthy_workers") == Some(want as u64)
        && n("total_workers") == Some(want as u64)
}

/// Starts `kind` with `policy` in front of `workers` and waits (blocking, up to
/// [`PEER_READY_TIMEOUT`]) until `/readiness` reports every worker healthy. Retries on new
/// ports (3 tries) if the process exits early, e.g. because a port was taken in between.
pub fn start_blocking(
    kind: PeerRouter,
    policy: &str,
    workers: &[SocketAddr],
) -> Result<PeerProcess> {
    start_blocking_with(kind, policy, workers, &[])
}

/// [`start_blocking`] with `extra` flags after the ones [`PeerRouter::args`] sets (e.g. SMG's
/// `--max-concurrent-requests N --queue-size Q`): for runs that enable a documented feature the
/// defaults leave off or size for another machine. The flags are the caller's to state.
pub fn start_blocking_with(
    kind: PeerRouter,
    policy: &str,
    workers: &[SocketAddr],
    extra: &[String],
) -> Result<PeerProcess> {
    let (program, lead) = kind.program()?;
    let mut last = None;
    for _ in 0..3 {
        // Both ports held open while choosing, so they differ.
        let hold: Vec<TcpListener> = (0..2)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::io("bind", "127.0.0.1:0", e))?;
        let ports: Vec<u16> = hold
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::io("local_addr of", "127.0.0.1:0", e))?;
        drop(hold);
        let label = format!("{}-{policy}", kind.package());
        let dir = testlog_dir(&label)?;
        let mut cmd = Command::new(&program);
        cmd.args(&lead)
            .args(kind.args(policy, workers, ports[0], ports[1]))
            .args(extra);
        let guard = ChildGuard::spawn_logged(&label, cmd, &dir.join("router.log"))?;
        let mut p = PeerProcess {
            kind,
            policy: policy.to_string(),
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, ports[0])),
            prometheus_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, ports[1])),
            dir,
            guard,
        };
        match wait_ready(&mut p, workers.len(), PEER_READY_TIMEOUT) {
            Ok(()) => return Ok(p),
            Err(e @ Error::Exited { .. }) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::Format {
        what: kind.package().into(),
        reason: "did not start".into(),
    }))
}

/// [`start_blocking`] without blocking the async runtime.
pub async fn start(kind: PeerRouter, policy: &str, workers: &[SocketAddr]) -> Result<PeerProcess> {
    start_with(kind, policy, workers, &[]).await
}

/// [`start_blocking_with`] without blocking the async runtime.
pub async fn start_with(
    kind: PeerRouter,
    policy: &str,
    workers: &[SocketAddr],
    extra: &[String],
) -> Result<PeerProcess> {
    let policy = policy.to_string();
    let workers = workers.to_vec();
    let extra = extra.to_vec();
    tokio::task::spawn_blocking(move || start_blocking_with(kind, &policy, &workers, &extra))
        .await
        .map_err(|e| Error::Format {
            what: format!("{} start task", kind.package()),
            reason: e.to_string(),
        })?
}

fn wait_ready(p: &mut PeerProcess, want: usize, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    let mut reason = String::from("no answer yet");
    while start.elapsed() < timeout {
        p.guard.check_running()?;
        match blocking_get(p.addr, "/readiness", Duration::from_secs(2)) {
            Ok((status, body)) if readiness_complete(status, &body, want) => return Ok(()),
            Ok((status, body)) => reason = format!("/readiness answered {status}: {}", body.trim()),
            Err(e) => reason = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(Error::NotReady {
        name: format!("{} ({})", p.kind.package(), p.policy),
        waited_ms: start.elapsed().as_millis(),
        reason,
        log: p.log_path().to_path_buf(),
        tail: p.log_tail(40),
    })
}

/// Whether the peer routers `kinds` and `model-sim` are installed and built. When one is
/// missing the calling test is skipped with a message naming the command that installs it, or,
/// under `CI`, fails (a CI run must not pass by skipping).
pub fn peers_ready(test: &str, kinds: &[PeerRouter]) -> bool {
    crate::paths::prerequisites_ready(
        test,
        kinds
            .iter()
            .map(|k| k.program().err().map(|e| e.to_string()))
            .chain(std::iter::once(
                crate::paths::bin("model-sim").err().map(|e| e.to_string()),
            )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_every_worker_healthy() {
        let ready = r#"{"status":"ready","healthy_workers":2,"total_workers":2}"#;
        assert!(readiness_complete(200, ready, 2));
        assert!(!readiness_complete(200, ready, 3));
        assert!(!readiness_complete(503, ready, 2));
        assert!(!readiness_complete(
            200,
            r#"{"status":"ready","healthy_workers":1,"total_workers":2}"#,
            2
        ));
        assert!(!readiness_complete(
            503,
            r#"{"status":"not_ready","healthy_workers":0,"total_workers":0}"#,
            0
        ));
        assert!(!readiness_complete(200, "OK", 2));
    }

    #[test]
    fn args_set_loopback_ports_and_the_workers() {
        let w = [
            SocketAddr::from(([127, 0, 0, 1], 9001)),
            SocketAddr::from(([127, 0, 0, 1], 9002)),
        ];
        let a = PeerRouter::Smg.args("cache_aware", &w, 30001, 29001);
        let after = |flag: &str| {
            a.iter()
                .position(|x| x == flag)
                .and_then(|i| a.get(i + 1))
                .cloned()
        };
        assert_eq!(after("--host").as_deref(), Some("127.0.0.1"));
        assert_eq!(after("--prometheus-host").as_deref(), Some("127.0.0.1"));
        assert_eq!(after("--port").as_deref(), Some("30001"));
        assert_eq!(after("--prometheus-port").as_deref(), Some("29001"));
        assert_eq!(after("--policy").as_deref(), Some("cache_aware"));
        assert_eq!(
            &a[a.len() - 2..],
            ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
        );
        // Retries and circuit breakers stay as they ship.
        assert!(!a
            .iter()
            .any(|x| x.contains("retr") || x.contains("circuit")));
    }

    #[test]
    fn a_missing_venv_names_the_setup_command() {
        // Not the real venv: a path that cannot exist.
        let err = PeerRouter::VllmRouter
            .program_in(std::path::Path::new("/nonexistent/venv"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("./build.sh setup") && err.contains("LLMR_VLLM_ROUTER_VENV"));
    }
}
