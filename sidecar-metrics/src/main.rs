//! The `sidecar-metrics` command: `run` the scraper/pusher, `parse` one saved `/metrics` text
//! into the pod state the snapshot would carry, or `check` a configuration file.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use llm_router_snapshot::Engine;
use sidecar_metrics::config::{
    Config, ConfigError, Discovery, LogFormat, Mode, PoolConfig, PushConfig,
};
use sidecar_metrics::engines::{normalise, Options};

#[derive(Parser)]
#[command(
    name = "sidecar-metrics",
    version,
    about = "Scrapes model-server pods and pushes fleet snapshots into the proxy."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Scrape (or follow the hubs) and push until SIGTERM/SIGINT; `--mode hub` scrapes and
    /// streams to subscribed sidecars instead.
    Run(Box<RunArgs>),
    /// Read one saved /metrics text (`-` = stdin) and print the normalised pod state as JSON.
    Parse {
        file: PathBuf,
        /// vllm, sglang, trtllm, triton, tgi, llamacpp (default: detect from the metric names).
        #[arg(long)]
        engine: Option<String>,
    },
    /// Validate a configuration file and print it as the sidecar understands it.
    Check { file: PathBuf },
    /// Print (or write) one gateway replica's hub credential (`hub.credential_file`): its
    /// replica id and its keys, derived from the hub secret, which it never holds.
    Credential {
        /// File holding the hub secret (trailing newline ignored).
        #[arg(long)]
        hub_secret_file: String,
        /// The replica id (a number above 0) …
        #[arg(
            long,
            conflicts_with = "replica_name",
            required_unless_present = "replica_name"
        )]
        replica: Option<u64>,
        /// … or a name it is derived from (e.g. the pod's name).
        #[arg(long)]
        replica_name: Option<String>,
        /// Write it to this file (mode 0600) instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// YAML or TOML configuration (default: the embedded demo config, unless --pool is given).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Push target: `http://host:port[/path]` or `host:port` (path defaults to /__llm_router/snapshot).
    #[arg(long)]
    push: Option<String>,
    /// Push secret (or use --secret-env / --secret-file / the config file); at least 32 bytes.
    #[arg(long)]
    secret: Option<String>,
    /// Environment variable holding the push secret.
    #[arg(long)]
    secret_env: Option<String>,
    /// File holding the push secret (e.g. a mounted Kubernetes Secret; trailing newline ignored).
    #[arg(long)]
    secret_file: Option<String>,
    /// A pool: `name=N,cluster=C,models=M1+M2,endpoints=IP:PORT+IP:PORT[,engine=E][,path=/metrics]`
    /// (repeatable; replaces the pools of --config).
    #[arg(long = "pool")]
    pools: Vec<String>,
    #[arg(long)]
    interval_ms: Option<u64>,
    #[arg(long)]
    jitter: Option<f64>,
    /// Largest share of a pod's time its /metrics answers may take (`scrape.max_duty`; 0 = no
    /// bound).
    #[arg(long)]
    max_duty: Option<f64>,
    #[arg(long)]
    timeout_ms: Option<u64>,
    #[arg(long)]
    heartbeat_ms: Option<u64>,
    /// Pod staleness (ms without a successful scrape).
    #[arg(long)]
    stale_ms: Option<u64>,
    /// Address of the sidecar's own /metrics and /healthz (e.g. 127.0.0.1:0).
    #[arg(long)]
    listen: Option<String>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Log filter (RUST_LOG syntax); RUST_LOG wins when set.
    #[arg(long)]
    log_level: Option<String>,
    /// `sidecar` (push into the local proxy) or `hub` (stream the snapshots to subscribed
    /// sidecars; no --push needed).
    #[arg(long, value_parser = ["sidecar", "hub"])]
    mode: Option<String>,
    /// Mode hub: address of the snapshot stream (default 0.0.0.0:9465).
    #[arg(long)]
    hub_listen: Option<String>,
    /// Mode sidecar: follow these hubs (`http://host:port[/path]` or `host:port`, comma-separated
    /// or repeated), scraping on its own only while none answers; replaces hub.upstreams.
    #[arg(long = "hub", value_delimiter = ',')]
    hubs: Vec<String>,
    /// Mode sidecar: scrape on its own after this long (ms) without a hub snapshot.
    #[arg(long)]
    hub_fallback_ms: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("--pool {spec:?}: {reason}")]
    PoolSpec { spec: String, reason: String },
    #[error("--push {0:?} is not http://host:port[/path] or host:port")]
    PushSpec(String),
    #[error("--push needs a secret: give --secret, --secret-env or --secret-file")]
    NoSecret,
    #[error(transparent)]
    Start(#[from] sidecar_metrics::sidecar::StartError),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Unusable { path: String, reason: String },
    #[error("unknown engine {0:?} (vllm, sglang, trtllm, triton, tgi, llamacpp)")]
    Engine(String),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

fn parse_pool(spec: &str) -> Result<PoolConfig, CliError> {
    let bad = |reason: &str| CliError::PoolSpec {
        spec: spec.into(),
        reason: reason.into(),
    };
    let (mut name, mut cluster, mut models, mut endpoints, mut engine, mut path) =
        (None, None, Vec::new(), None, None, None);
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| bad(&format!("{part:?} is not key=value")))?;
        let list = || {
            v.split('+')
                .filter(|x| !x.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        match k.trim() {
            "name" => name = Some(v.to_owned()),
            "cluster" => cluster = Some(v.to_owned()),
            "models" => models = list(),
            "endpoints" => endpoints = Some(list()),
            "engine" => engine = Some(v.to_owned()),
            "path" => path = Some(v.to_owned()),
            other => {
                return Err(bad(&format!(
                    "unknown key {other:?} (name, cluster, models, endpoints, engine, path)"
                )))
            }
        }
    }
    let name = name.ok_or_else(|| bad("name= is required"))?;
    Ok(PoolConfig {
        cluster: cluster.unwrap_or_else(|| name.clone()),
        name,
        models,
        engine,
        metrics_path: path,
        discovery: Discovery::Static(endpoints.ok_or_else(|| bad("endpoints= is required"))?),
    })
}

fn parse_push(s: &str) -> Result<(String, Option<String>), CliError> {
    let rest = s.strip_prefix("http://").unwrap_or(s);
    let (addr, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(rest[i..].to_owned())),
        None => (rest, None),
    };
    if addr.is_empty() || s.starts_with("https://") {
        return Err(CliError::PushSpec(s.into()));
    }
    Ok((addr.to_owned(), path.filter(|p| p != "/")))
}

/// The configuration `run` uses: the file (or the flags alone, or the embedded demo), then each
/// flag given in place of its field, then validated.
fn build_config(a: &RunArgs) -> Result<Config, CliError> {
    let mut cfg = match &a.config {
        Some(p) => Config::load(p)?,
        None if !a.pools.is_empty() => flags_only_config(a)?,
        None => Config::embedded_default()?,
    };
    apply_push_flags(a, &mut cfg)?;
    apply_hub_flags(a, &mut cfg);
    apply_timing_and_log_flags(a, &mut cfg);
    if cfg.push.secret.is_none() && cfg.push.secret_env.is_none() && cfg.push.secret_file.is_none()
    {
        return Err(CliError::NoSecret);
    }
    cfg.validate()?;
    Ok(cfg)
}

/// Without `--config` but with `--pool`: the defaults, pushing to `--push` (none in mode hub).
fn flags_only_config(a: &RunArgs) -> Result<Config, CliError> {
    let hub = a.mode.as_deref() == Some("hub");
    let (address, path) = match a.push.as_deref() {
        Some(push) => parse_push(push)?,
        None if hub => (String::new(), None),
        None => return Err(CliError::PushSpec(String::new())),
    };
    Ok(Config {
        push: PushConfig {
            address,
            path: path.unwrap_or_else(|| "/__llm_router/snapshot".into()),
            tally_path: "/__llm_router/tally".into(),
            secret: a.secret.clone(),
            secret_env: a.secret_env.clone(),
            secret_file: a.secret_file.clone(),
            timeout_ms: 1000,
        },
        scrape: Default::default(),
        snapshot: Default::default(),
        rewrites: None,
        objectives: None,
        path: None,
        heartbeat_ms: 1000,
        pod_stale_after_ms: 1000,
        mode: Default::default(),
        hub: Default::default(),
        listen: "127.0.0.1:9464".into(),
        log: Default::default(),
        pools: Vec::new(),
    })
}

/// `--push`, the secret flags (all three replace the file's, together) and `--pool`.
fn apply_push_flags(a: &RunArgs, cfg: &mut Config) -> Result<(), CliError> {
    if let Some(p) = &a.push {
        let (address, path) = parse_push(p)?;
        cfg.push.address = address;
        if let Some(path) = path {
            cfg.push.path = path;
        }
    }
    if a.secret.is_some() || a.secret_env.is_some() || a.secret_file.is_some() {
        cfg.push.secret = a.secret.clone();
        cfg.push.secret_env = a.secret_env.clone();
        cfg.push.secret_file = a.secret_file.clone();
    }
    if !a.pools.is_empty() {
        cfg.pools = a
            .pools
            .iter()
            .map(|s| parse_pool(s))
            .collect::<Result<_, _>>()?;
    }
    Ok(())
}

/// `--mode`, `--hub-listen`, `--hub` and `--hub-fallback-ms`.
fn apply_hub_flags(a: &RunArgs, cfg: &mut Config) {
    match a.mode.as_deref() {
        Some("hub") => cfg.mode = Mode::Hub,
        Some(_) => cfg.mode = Mode::Sidecar,
        None => {}
    }
    if let Some(l) = &a.hub_listen {
        cfg.hub.listen = l.clone();
    }
    if !a.hubs.is_empty() {
        cfg.hub.upstreams = a.hubs.iter().filter(|h| !h.is_empty()).cloned().collect();
    }
    if let Some(v) = a.hub_fallback_ms {
        cfg.hub.fallback_after_ms = Some(v);
    }
}

/// The timing flags, `--listen` and the log flags.
fn apply_timing_and_log_flags(a: &RunArgs, cfg: &mut Config) {
    if let Some(v) = a.interval_ms {
        cfg.scrape.interval_ms = v;
    }
    if let Some(v) = a.jitter {
        cfg.scrape.jitter = v;
    }
    if let Some(v) = a.max_duty {
        cfg.scrape.max_duty = v;
    }
    if let Some(v) = a.timeout_ms {
        cfg.scrape.timeout_ms = v;
    }
    if let Some(v) = a.heartbeat_ms {
        cfg.heartbeat_ms = v;
    }
    if let Some(v) = a.stale_ms {
        cfg.pod_stale_after_ms = v;
    }
    if let Some(v) = &a.listen {
        cfg.listen = v.clone();
    }
    if a.log_json {
        cfg.log.format = LogFormat::Json;
    }
    if let Some(l) = &a.log_level {
        cfg.log.level = Some(l.clone());
    }
}

fn init_logs(cfg: &Config) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(cfg.log.level.as_deref().unwrap_or("info")))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match cfg.log.format {
        LogFormat::Json => b.json().init(),
        LogFormat::Text => b.init(),
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn run(a: RunArgs) -> Result<(), CliError> {
    let cfg = build_config(&a)?;
    init_logs(&cfg);
    let secret = cfg.resolve_secret()?;
    // One thread: the work is I/O-bound and a single-threaded runtime costs the least CPU.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    rt.block_on(async move {
        let running = sidecar_metrics::sidecar::start(cfg, secret).await?;
        shutdown_signal().await;
        running.stop().await;
        tracing::info!("stopped");
        Ok(())
    })
}

fn parse_cmd(file: PathBuf, engine: Option<String>) -> Result<(), CliError> {
    let path = file.display().to_string();
    let engine = match engine {
        Some(e) => Some(Engine::from_name(&e).ok_or(CliError::Engine(e))?),
        None => None,
    };
    let bytes = if path == "-" {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v).map_err(|source| {
            CliError::Read {
                path: path.clone(),
                source,
            }
        })?;
        v
    } else {
        std::fs::read(&file).map_err(|source| CliError::Read {
            path: path.clone(),
            source,
        })?
    };
    let text = String::from_utf8(bytes).map_err(|e| CliError::Unusable {
        path: path.clone(),
        reason: format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
    })?;
    let m = normalise(
        &text,
        Options {
            engine,
            detailed: true,
        },
    )
    .map_err(|e| CliError::Unusable {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    for e in &m.bad_lines {
        eprintln!("warning: {path}: {e} (skipped)");
    }
    match serde_json::to_string_pretty(&m) {
        Ok(j) => println!("{j}"),
        Err(e) => {
            return Err(CliError::Unusable {
                path,
                reason: e.to_string(),
            })
        }
    }
    Ok(())
}

fn credential_cmd(
    hub_secret_file: String,
    replica: Option<u64>,
    replica_name: Option<String>,
    out: Option<PathBuf>,
) -> Result<(), CliError> {
    let mut cfg = Config::embedded_default()?;
    cfg.hub.secret_file = Some(hub_secret_file);
    let secret = cfg.resolve_hub_secret()?.unwrap_or_default();
    let id = match (replica, replica_name) {
        (Some(0), _) => {
            return Err(CliError::Unusable {
                path: "--replica".into(),
                reason: "0 is reserved".into(),
            })
        }
        (Some(id), _) => id,
        (None, Some(name)) => sidecar_metrics::keys::replica_id_of_name(&name),
        (None, None) => {
            return Err(CliError::Unusable {
                path: "--replica".into(),
                reason: "give --replica or --replica-name".into(),
            })
        }
    };
    let line = sidecar_metrics::keys::HubKeys::from_secret(secret.as_bytes())
        .credential(id)
        .to_line();
    match out {
        None => print!("{line}"),
        Some(path) => {
            use std::io::Write;
            #[cfg(unix)]
            use std::os::unix::fs::OpenOptionsExt;
            let mut o = std::fs::OpenOptions::new();
            o.write(true).create(true).truncate(true);
            #[cfg(unix)]
            o.mode(0o600);
            let shown = path.display().to_string();
            o.open(&path)
                .and_then(|mut f| f.write_all(line.as_bytes()))
                .map_err(|source| CliError::Read {
                    path: shown,
                    source,
                })?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Run(a) => run(*a),
        Cmd::Parse { file, engine } => parse_cmd(file, engine),
        Cmd::Credential {
            hub_secret_file,
            replica,
            replica_name,
            out,
        } => credential_cmd(hub_secret_file, replica, replica_name, out),
        Cmd::Check { file } => Config::load(&file)
            .map_err(CliError::from)
            .map(|c| println!("{c:#?}")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sidecar-metrics: error: {e}");
            ExitCode::FAILURE
        }
    }
}
