//! Our own servers as child processes (model-sim, sidecar-metrics, anything with an HTTP health
//! endpoint): spawn a release binary under a [`ChildGuard`], wait until it answers its health
//! check, and retry on another port when the chosen one was taken in the meantime.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::http::blocking_get;
use crate::paths::{bin, free_port};
use crate::process::ChildGuard;

/// How long [`start_model_sim`] waits for `/health`.
pub const SERVER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A server child process and where it listens.
#[derive(Debug)]
pub struct ServerProcess {
    /// Where it answers (127.0.0.1:PORT).
    pub addr: SocketAddr,
    /// The process; stopped when dropped.
    pub guard: ChildGuard,
}

impl ServerProcess {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.guard.log_tail(lines)
    }
}

/// Spawns `program args...` as `name` and waits until `GET http://{addr}{health_path}` answers
/// 200 (blocking, bounded by `timeout`). Fails with the log tail if the process exits.
pub fn spawn_and_wait_http(
    name: &str,
    program: &Path,
    args: &[String],
    addr: SocketAddr,
    health_path: &str,
    timeout: Duration,
) -> Result<ServerProcess> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let mut guard = ChildGuard::spawn(name, cmd)?;
    let start = Instant::now();
    let mut reason = String::from("no answer yet");
    while start.elapsed() < timeout {
        guard.check_running()?;
        match blocking_get(addr, health_path, Duration::from_secs(2)) {
            Ok((200, _)) => return Ok(ServerProcess { addr, guard }),
            Ok((status, body)) => {
                reason = format!("{health_path} answered {status}: {}", body.trim())
            }
            Err(e) => reason = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(Error::NotReady {
        name: name.to_string(),
        waited_ms: start.elapsed().as_millis(),
        reason,
        log: guard.log_path().to_path_buf(),
        tail: guard.log_tail(40),
    })
}

/// Starts `target/release/<name>` with the arguments `args(addr)` for a free loopback address
/// and waits for its `/health` (blocking). Retries with a new port (3 tries) if the process exits
/// early, e.g. because the port was taken between choosing and binding it.
pub fn start_on_free_port(
    name: &str,
    args: impl Fn(SocketAddr) -> Vec<String>,
) -> Result<ServerProcess> {
    let program = bin(name)?;
    let mut last = None;
    for _ in 0..3 {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        match spawn_and_wait_http(
            name,
            &program,
            &args(addr),
            addr,
            "/health",
            SERVER_READY_TIMEOUT,
        ) {
            Ok(server) => return Ok(server),
            Err(e @ Error::Exited { .. }) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::Format {
        what: name.into(),
        reason: "did not start".into(),
    }))
}

/// Starts `target/release/model-sim --port <free port> ARGS...` and waits for `/health`
/// (blocking; [`start_on_free_port`]). `args` are the other flags, e.g.
/// `["--profile", "h100", "--speedup", "20"]`.
pub fn start_model_sim_blocking(args: &[&str]) -> Result<ServerProcess> {
    start_on_free_port("model-sim", |addr| {
        let mut all = vec!["--port".to_string(), addr.port().to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        all
    })
}

/// [`start_model_sim_blocking`] without blocking the async runtime.
pub async fn start_model_sim(args: &[&str]) -> Result<ServerProcess> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        start_model_sim_blocking(&refs)
    })
    .await
    .map_err(|e| Error::Format {
        what: "model-sim start task".into(),
        reason: e.to_string(),
    })?
}
