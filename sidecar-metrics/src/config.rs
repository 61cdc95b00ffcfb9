//! The sidecar's configuration file (YAML or TOML) and its validation.
//!
//! A bad file must say which field is wrong and why before anything starts: serde reports the
//! path of a type error (`pools[0].discovery: unknown variant ...`), and [`Config::validate`]
//! checks what types cannot (ranges, `ip:port` shapes, unique names, exactly one secret source),
//! naming the field the same way.

use std::path::Path;
use std::time::Duration;

use llm_router_snapshot::Engine;
use serde::Deserialize;

mod validate;

/// Demo configuration used by `run` when neither `--config` nor `--pool` is given.
pub const DEFAULT_CONFIG_YAML: &str = include_str!("default-config.yaml");

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid YAML for this schema: {message}")]
    Yaml { path: String, message: String },
    #[error("config file {path} is not valid TOML for this schema: {message}")]
    Toml { path: String, message: String },
    #[error("config field `{field}`: {reason}")]
    Invalid { field: String, reason: String },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The whole file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `sidecar` (default: scrape, or follow the hubs, and push into the local proxy) or `hub`
    /// (scrape and stream the snapshots to subscribed sidecars; no push).
    #[serde(default)]
    pub mode: Mode,
    /// The hub: where it serves (mode `hub`), or which hubs a sidecar follows.
    #[serde(default)]
    pub hub: HubConfig,
    pub push: PushConfig,
    #[serde(default)]
    pub scrape: ScrapeConfig,
    /// Push even an unchanged snapshot this often (ms), so the filter can tell we are alive.
    #[serde(default = "d_heartbeat")]
    pub heartbeat_ms: u64,
    /// A pod whose last successful scrape is older than this (ms) is reported `stale`.
    #[serde(default = "d_stale")]
    pub pod_stale_after_ms: u64,
    /// Address of the sidecar's own `/metrics` and `/healthz`.
    #[serde(default = "d_listen")]
    pub listen: String,
    #[serde(default)]
    pub log: LogConfig,
    /// Byte budgets of the pushed snapshot.
    #[serde(default)]
    pub snapshot: SnapshotConfig,
    pub pools: Vec<PoolConfig>,
    /// Model rewrite rules sent in every snapshot (`crate::rewrites`); absent = no rewrites
    /// section sent, and the filter applies its own configured rules.
    #[serde(default)]
    pub rewrites: Option<RewritesConfig>,
    /// Follow llm-d's `InferenceObjective` objects and send their priorities in every snapshot
    /// (replacing the filter's configured `objectives`); absent = no objectives section sent.
    #[serde(default)]
    pub objectives: Option<ObjectivesConfig>,
    /// The file this configuration was loaded from (set by [`Config::load`]): where the
    /// `rewrites` rules are re-read from while the sidecar runs.
    #[serde(skip)]
    pub path: Option<std::path::PathBuf>,
}

/// What the process does.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Sidecar,
    Hub,
}

/// The metrics hub (`crate::hub`), either side.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HubConfig {
    /// Mode `hub`: address of the snapshot stream (reached by the gateway pods).
    #[serde(default = "d_hub_listen")]
    pub listen: String,
    /// Mode `sidecar`: hubs to follow, `http://host:port[/path]` or `host:port` (one Service
    /// name, or several hubs listed). Empty: scrape on its own, as without a hub.
    #[serde(default)]
    pub upstreams: Vec<String>,
    /// Mode `sidecar`: scrape on its own when no hub snapshot came for this long (ms); default
    /// three scrape intervals, at least 100 ms.
    #[serde(default)]
    pub fallback_after_ms: Option<u64>,
    /// Mode `sidecar`: connect and answer timeout of a subscription (ms).
    #[serde(default = "d_hub_timeout")]
    pub timeout_ms: u64,
    /// Mode `sidecar` with upstreams: read the proxy's tally (its work in flight per pod) and
    /// send it to every hub, so the other gateway replicas count it: each read is held by the
    /// proxy until the tally changes, and reads start at most this often (ms); 0 = never
    /// (the other replicas then see this one's work only through the engines' gauges).
    #[serde(default = "d_hub_share")]
    pub share_ms: u64,
    /// Mode `hub`: a replica's tally not renewed for this long (ms) is dropped (the replica is
    /// gone, or has no work left and said so).
    #[serde(default = "d_hub_tally_ttl")]
    pub tally_ttl_ms: u64,
    /// Mode `hub`: a tally that changes a replica's work streams a frame at once (the last
    /// round's pods with the new tallies) instead of waiting for the next scrape round, at most
    /// one such frame per this many ms; 0 = frames only with scrape rounds.
    #[serde(default = "d_hub_tally_frame")]
    pub tally_frame_ms: u64,
    /// The hub secret, from which the hub's keys are derived (subscribe, frame, tally master;
    /// `crate::keys`), inline …
    #[serde(default)]
    pub secret: Option<String>,
    /// … or from this environment variable …
    #[serde(default)]
    pub secret_env: Option<String>,
    /// … or from this file. Mode `hub`: the hubs hold it. Mode `sidecar`: give
    /// `credential_file` instead, so that no replica can speak for another. None of the three:
    /// the push secret serves as the hub secret too (the configuration before the roles were
    /// split; then whoever holds the push secret, the proxy included, opens the hub; logged).
    #[serde(default)]
    pub secret_file: Option<String>,
    /// Mode `sidecar`: this replica's credential (`sidecar-metrics credential`): its replica id
    /// and the keys it needs (subscribe, frame, its own tally key), never the hub secret.
    #[serde(default)]
    pub credential_file: Option<String>,
}

fn d_hub_listen() -> String {
    "0.0.0.0:9465".into()
}
fn d_hub_timeout() -> u64 {
    1000
}
fn d_hub_share() -> u64 {
    25
}
fn d_hub_tally_ttl() -> u64 {
    500
}
fn d_hub_tally_frame() -> u64 {
    5
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            listen: d_hub_listen(),
            upstreams: Vec::new(),
            fallback_after_ms: None,
            timeout_ms: d_hub_timeout(),
            share_ms: d_hub_share(),
            tally_ttl_ms: d_hub_tally_ttl(),
            tally_frame_ms: d_hub_tally_frame(),
            secret: None,
            secret_env: None,
            secret_file: None,
            credential_file: None,
        }
    }
}

fn d_heartbeat() -> u64 {
    1000
}
fn d_stale() -> u64 {
    1000
}
fn d_listen() -> String {
    "127.0.0.1:9464".into()
}

/// Byte budgets of the encoded snapshot. The proxy buffers a push whole before the filter reads
/// it: past the internal listener's `per_connection_buffer_limit_bytes` Envoy answers 413, past
/// the filter's `snapshot.max_bytes` the filter answers 403, and either way the gateway goes stale.
/// Adapter lists are what grows without bound (vLLM lists every adapter with running or waiting
/// requests), so they are what the budgets cut: a pod's lists are trimmed to `max_pod_bytes`
/// (waiting adapters first), then, if the whole snapshot still exceeds `max_bytes`, the largest
/// pods' lists are trimmed further until it fits.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SnapshotConfig {
    /// Largest encoded snapshot pushed (bytes). Keep it at most the filter's
    /// `snapshot.max_bytes` and the internal listener's `per_connection_buffer_limit_bytes`
    /// (4 MiB each in every shipped configuration).
    #[serde(default = "d_snapshot_max_bytes")]
    pub max_bytes: usize,
    /// Largest encoded entry of one pod (address, figures and adapter lists), in bytes.
    #[serde(default = "d_snapshot_max_pod_bytes")]
    pub max_pod_bytes: usize,
}

/// Default `snapshot.max_bytes`: the filter's default `snapshot.max_bytes` and the internal
/// listener's buffer limit in the shipped configurations.
pub const DEFAULT_SNAPSHOT_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Default `snapshot.max_pod_bytes`: `max_bytes / 64`, so 64 pods at their full budget fill the
/// total one; it holds 1,000 adapter names of up to 63 bytes (vLLM LoRA names are typically
/// 10–40) plus the pod's ~60 bytes of address and figures.
pub const DEFAULT_SNAPSHOT_MAX_POD_BYTES: usize = 64 * 1024;
/// The smallest budgets accepted: a pod entry without adapters is at most 292 bytes (a 255-byte
/// address), a snapshot header 26.
pub const MIN_SNAPSHOT_MAX_POD_BYTES: usize = 512;
pub const MIN_SNAPSHOT_MAX_BYTES: usize = 4096;

fn d_snapshot_max_bytes() -> usize {
    DEFAULT_SNAPSHOT_MAX_BYTES
}
fn d_snapshot_max_pod_bytes() -> usize {
    DEFAULT_SNAPSHOT_MAX_POD_BYTES
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            max_bytes: DEFAULT_SNAPSHOT_MAX_BYTES,
            max_pod_bytes: DEFAULT_SNAPSHOT_MAX_POD_BYTES,
        }
    }
}

/// Where and how snapshots are pushed.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PushConfig {
    /// The Envoy listener, `host:port` (loopback in every supported deployment). Unused (and
    /// may be left out) in mode `hub`, whose `push` section only names the secret.
    #[serde(default)]
    pub address: String,
    #[serde(default = "d_push_path")]
    pub path: String,
    /// Where the proxy serves its tally (the filter's `snapshot.tally_path`), read when the
    /// sidecar shares its replica's work with hubs (`hub.share_ms`).
    #[serde(default = "d_tally_path")]
    pub tally_path: String,
    /// The shared secret, inline …
    #[serde(default)]
    pub secret: Option<String>,
    /// … or from this environment variable …
    #[serde(default)]
    pub secret_env: Option<String>,
    /// … or from this file (trailing newline trimmed).
    #[serde(default)]
    pub secret_file: Option<String>,
    #[serde(default = "d_push_timeout")]
    pub timeout_ms: u64,
}

fn d_push_path() -> String {
    "/__llm_router/snapshot".into()
}
fn d_tally_path() -> String {
    "/__llm_router/tally".into()
}
fn d_push_timeout() -> u64 {
    1000
}

/// How pods are scraped.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScrapeConfig {
    #[serde(default = "d_interval")]
    pub interval_ms: u64,
    /// Each round waits `interval × (1 ± jitter)`; 0 disables jitter.
    #[serde(default = "d_jitter")]
    pub jitter: f64,
    #[serde(default = "d_scrape_timeout")]
    pub timeout_ms: u64,
    #[serde(default = "d_max_bytes")]
    pub max_response_bytes: usize,
    /// Scrapes in flight at once.
    #[serde(default = "d_concurrency")]
    pub concurrency: usize,
    #[serde(default = "d_metrics_path")]
    pub path: String,
    /// Ask for only the families we read (`?name[]=…`, honoured by prometheus_client servers
    /// such as vLLM and SGLang; ignored by the others). Cuts bytes and CPU on both sides.
    #[serde(default = "d_true")]
    pub name_filter: bool,
    /// After handling the answers that are ready, wait this long (ms) for the rest of the round
    /// so they are handled in one wake-up; 0 handles each answer as it comes.
    #[serde(default = "d_coalesce")]
    pub coalesce_ms: u64,
    /// The largest share of a pod's time its `/metrics` answers may take (0 = no bound): after a
    /// successful scrape that took `t`, the pod is next scraped no sooner than `t / max_duty`
    /// later (and never later than half of `pod_stale_after_ms`). vLLM renders `/metrics` in its
    /// API server's one Python thread, the one that streams every request's tokens: ≈ 5 ms of
    /// CPU a scrape (9 ms answered on a loaded CPU-served pod), so 20 scrapes a second take a
    /// tenth of it. A pod that answers in 1 ms is still scraped every round.
    #[serde(default = "d_max_duty")]
    pub max_duty: f64,
}

fn d_max_duty() -> f64 {
    0.02
}

fn d_coalesce() -> u64 {
    1
}

fn d_true() -> bool {
    true
}

fn d_interval() -> u64 {
    50
}
fn d_jitter() -> f64 {
    0.1
}
fn d_scrape_timeout() -> u64 {
    1000
}
fn d_max_bytes() -> usize {
    4 * 1024 * 1024
}
fn d_concurrency() -> usize {
    128
}
fn d_metrics_path() -> String {
    "/metrics".into()
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            interval_ms: d_interval(),
            jitter: d_jitter(),
            timeout_ms: d_scrape_timeout(),
            max_response_bytes: d_max_bytes(),
            concurrency: d_concurrency(),
            path: d_metrics_path(),
            name_filter: true,
            coalesce_ms: d_coalesce(),
            max_duty: d_max_duty(),
        }
    }
}

/// Log output.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (default) or `json`.
    #[serde(default)]
    pub format: LogFormat,
    /// An `EnvFilter` directive, e.g. `info` or `sidecar_metrics=debug`; `RUST_LOG` wins.
    #[serde(default)]
    pub level: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// One pool of interchangeable pods behind one Envoy cluster.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    pub cluster: String,
    #[serde(default)]
    pub models: Vec<String>,
    /// `vllm`, `sglang`, `trtllm`, `triton`, `tgi`, `llamacpp`; absent = detect from the names.
    #[serde(default)]
    pub engine: Option<String>,
    /// Overrides `scrape.path` for this pool.
    #[serde(default)]
    pub metrics_path: Option<String>,
    pub discovery: Discovery,
}

impl PoolConfig {
    /// The configured engine (validated by [`Config::validate`]).
    pub fn engine(&self) -> Option<Engine> {
        self.engine.as_deref().and_then(Engine::from_name)
    }
}

/// Where a pool's pods come from. Written as a map with exactly one key:
/// `discovery: {static: [...]}`, `{dns: {...}}`, `{kubernetes: {...}}` or
/// `{inference_pool: {...}}`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(try_from = "DiscoveryRaw")]
pub enum Discovery {
    /// Fixed `ip:port` list.
    Static(Vec<String>),
    /// A name (e.g. a headless Service) whose A/AAAA records are the pods, re-resolved.
    Dns(DnsConfig),
    /// EndpointSlices of a Service (or matching a label selector), watched via the API server.
    Kubernetes(KubeConfig),
    /// The Pods a Gateway API Inference Extension InferencePool selects, on its target ports;
    /// the pool object and the pods both watched via the API server.
    InferencePool(InferencePoolConfig),
}

/// The file form of [`Discovery`] (serde_yaml 0.9 reads enums only from YAML tags).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiscoveryRaw {
    #[serde(default, rename = "static")]
    static_: Option<Vec<String>>,
    #[serde(default)]
    dns: Option<DnsConfig>,
    #[serde(default)]
    kubernetes: Option<KubeConfig>,
    #[serde(default)]
    inference_pool: Option<InferencePoolConfig>,
}

impl TryFrom<DiscoveryRaw> for Discovery {
    type Error = String;

    fn try_from(r: DiscoveryRaw) -> Result<Self, String> {
        match (r.static_, r.dns, r.kubernetes, r.inference_pool) {
            (Some(s), None, None, None) => Ok(Discovery::Static(s)),
            (None, Some(d), None, None) => Ok(Discovery::Dns(d)),
            (None, None, Some(k), None) => Ok(Discovery::Kubernetes(k)),
            (None, None, None, Some(p)) => Ok(Discovery::InferencePool(p)),
            _ => Err("give exactly one of `static`, `dns`, `kubernetes`, `inference_pool`".into()),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DnsConfig {
    pub name: String,
    pub port: u16,
    #[serde(default = "d_dns_interval")]
    pub interval_ms: u64,
    /// `ip:port` of the DNS server to ask; absent = the system resolver configuration.
    #[serde(default)]
    pub nameserver: Option<String>,
}

fn d_dns_interval() -> u64 {
    5000
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KubeConfig {
    /// Absent = the pod's own namespace (in-cluster), else `default`.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The Service whose EndpointSlices list the pods (`kubernetes.io/service-name=<service>`).
    #[serde(default)]
    pub service: Option<String>,
    /// Or any label selector on EndpointSlices.
    #[serde(default)]
    pub label_selector: Option<String>,
    /// The EndpointSlice port to use: a number or a port name; absent = the first port.
    #[serde(default)]
    pub port: Option<PortRef>,
    /// API server access; absent = in-cluster service-account credentials.
    #[serde(default)]
    pub api: Option<KubeApi>,
}

/// An `inference.networking.k8s.io/v1` InferencePool: its `spec.selector.matchLabels` picks the
/// Pods (Ready, not terminating, with an IP) in its namespace, each an endpoint on every
/// `spec.targetPorts[].number`. `spec.endpointPickerRef` is ignored: the filter picks.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InferencePoolConfig {
    /// The InferencePool's name.
    pub name: String,
    /// Its namespace (and the pods'); absent = the pod's own namespace (in-cluster), else
    /// `default`.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Use only this one of the pool's target ports; absent = all of them.
    #[serde(default)]
    pub port: Option<u16>,
    /// API server access; absent = in-cluster service-account credentials.
    #[serde(default)]
    pub api: Option<KubeApi>,
}

/// The `rewrites:` section (`crate::rewrites`: the rules' shape and precedence).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RewritesConfig {
    /// Rules in the `InferenceModelRewrite` `spec.rules` shape; the first matching rule wins.
    /// Absent: the file gives no rules (with `kubernetes`, the objects' only; without, the
    /// snapshot carries no section and the filter's configured rules apply). `[]`: an empty
    /// section, which turns the filter's configured rules off.
    #[serde(default)]
    pub rules: Option<Vec<crate::rewrites::RuleSpec>>,
    /// Re-read the rules from the configuration file this often (ms); 0 = only at start.
    #[serde(default = "d_reload_ms")]
    pub reload_ms: u64,
    /// Also follow the `InferenceModelRewrite` objects of the sidecar's pools.
    #[serde(default)]
    pub kubernetes: Option<ObjectWatchConfig>,
}

fn d_reload_ms() -> u64 {
    500
}

/// The `objectives:` section: the `InferenceObjective` priorities every snapshot carries.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ObjectivesConfig {
    /// Where the `InferenceObjective` objects of the sidecar's pools are watched.
    pub kubernetes: ObjectWatchConfig,
}

/// `rewrites.kubernetes`, `objectives.kubernetes`: where the `InferenceModelRewrite` or
/// `InferenceObjective` objects (`llm-d.ai/v1alpha2`) of the sidecar's pools
/// (`spec.poolRef.name`) are watched.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ObjectWatchConfig {
    /// Absent = the pod's own namespace (in-cluster), else `default`.
    #[serde(default)]
    pub namespace: Option<String>,
    /// API server access; absent = in-cluster service-account credentials.
    #[serde(default)]
    pub api: Option<KubeApi>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum PortRef {
    Number(u16),
    Name(String),
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KubeApi {
    /// `https://host:port` (or `http://` for a local stand-in).
    pub server: String,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub token_file: Option<String>,
    /// PEM CA bundle for the server certificate.
    #[serde(default)]
    pub ca_file: Option<String>,
}

impl Config {
    /// Reads a YAML (`.yaml`/`.yml`) or TOML (`.toml`) file; other extensions try YAML then TOML.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: p.clone(),
            source,
        })?;
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        let cfg = match ext.as_str() {
            "toml" => Config::from_toml(&text, &p)?,
            "yaml" | "yml" => Config::from_yaml(&text, &p)?,
            _ => Config::from_yaml(&text, &p)
                .or_else(|y| Config::from_toml(&text, &p).map_err(|_| y))?,
        };
        cfg.validate()?;
        Ok(Config {
            path: Some(path.to_path_buf()),
            ..cfg
        })
    }

    pub fn from_yaml(text: &str, path: &str) -> Result<Config, ConfigError> {
        serde_yaml::from_str(text).map_err(|e| ConfigError::Yaml {
            path: path.into(),
            message: e.to_string(),
        })
    }

    pub fn from_toml(text: &str, path: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Toml {
            path: path.into(),
            message: e.to_string(),
        })
    }

    /// The embedded demo configuration.
    pub fn embedded_default() -> Result<Config, ConfigError> {
        let c = Config::from_yaml(DEFAULT_CONFIG_YAML, "<embedded default>")?;
        c.validate()?;
        Ok(c)
    }

    /// The push secret from whichever source the file names, refused when it is a placeholder
    /// or shorter than 32 bytes (`llm_router_snapshot::check_secret`, the filter's rule too).
    pub fn resolve_secret(&self) -> Result<String, ConfigError> {
        let p = &self.push;
        resolve_source("push", &p.secret, &p.secret_env, &p.secret_file)?
            .ok_or_else(|| invalid("push.secret", "no secret configured"))
    }

    /// The hub secret (`hub.secret*`), `None` when none is configured; the same rules.
    pub fn resolve_hub_secret(&self) -> Result<Option<String>, ConfigError> {
        let h = &self.hub;
        resolve_source("hub", &h.secret, &h.secret_env, &h.secret_file)
    }

    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.scrape.interval_ms)
    }

    /// How long a sidecar following hubs waits for a hub snapshot before it scrapes on its own.
    pub fn hub_fallback_after(&self) -> Duration {
        Duration::from_millis(
            self.hub
                .fallback_after_ms
                .unwrap_or((self.scrape.interval_ms * 3).max(100)),
        )
    }
}

/// A secret from the first source given (inline, environment variable, file; a file's trailing
/// newline trimmed), `None` when none is; refused by `check_secret`'s policy. `section` names
/// the fields in errors (`push.secret_file`).
fn resolve_source(
    section: &str,
    inline: &Option<String>,
    env: &Option<String>,
    file: &Option<String>,
) -> Result<Option<String>, ConfigError> {
    let (field, secret) = if let Some(s) = inline {
        (format!("{section}.secret"), s.clone())
    } else if let Some(var) = env {
        let field = format!("{section}.secret_env");
        let s = std::env::var(var)
            .map_err(|_| invalid(&field, format!("environment variable {var} is not set")))?;
        (field, s)
    } else if let Some(path) = file {
        let field = format!("{section}.secret_file");
        // A mounted Kubernetes Secret (or `echo … > file`) ends in a newline.
        let s = std::fs::read_to_string(path)
            .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
            .map_err(|e| invalid(&field, format!("cannot read {path}: {e}")))?;
        (field, s)
    } else {
        return Ok(None);
    };
    llm_router_snapshot::check_secret(&secret).map_err(|e| invalid(&field, e))?;
    Ok(Some(secret))
}

/// Splits `host:port` (host may be a name) when it is not a plain socket address.
pub fn host_port(s: &str) -> Option<(&str, u16)> {
    let (h, p) = s.rsplit_once(':')?;
    let port = p.parse::<u16>().ok()?;
    (!h.is_empty() && !h.contains('/')).then_some((h, port))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const YAML: &str = r#"
push:
  address: 127.0.0.1:10000
  secret: config-test-secret-0123456789abcdef
pools:
  - name: llama
    cluster: pool_llama
    models: [m1]
    discovery:
      static: ["127.0.0.1:9001", "127.0.0.1:9002"]
  - name: qwen
    cluster: pool_qwen
    engine: sglang
    discovery:
      dns: {name: qwen.svc, port: 8000, nameserver: "127.0.0.1:5353"}
  - name: k
    cluster: pool_k
    discovery:
      kubernetes: {namespace: ns, service: vllm, port: http}
  - name: ip
    cluster: pool_ip
    discovery:
      inference_pool: {name: vllm-llama, namespace: llm}
"#;

    #[test]
    fn yaml_with_defaults() {
        let c = Config::from_yaml(YAML, "t.yaml").expect("parses");
        c.validate().expect("valid");
        assert_eq!(c.scrape.interval_ms, 50);
        assert_eq!(c.heartbeat_ms, 1000);
        assert_eq!(c.push.path, "/__llm_router/snapshot");
        assert_eq!(c.pools.len(), 4);
        assert_eq!(
            c.pools[3].discovery,
            Discovery::InferencePool(InferencePoolConfig {
                name: "vllm-llama".into(),
                namespace: Some("llm".into()),
                port: None,
                api: None,
            })
        );
        assert_eq!(
            c.pools[0].discovery,
            Discovery::Static(vec!["127.0.0.1:9001".into(), "127.0.0.1:9002".into()])
        );
        assert_eq!(c.pools[1].engine(), Some(Engine::Sglang));
        match &c.pools[2].discovery {
            Discovery::Kubernetes(k) => assert_eq!(k.port, Some(PortRef::Name("http".into()))),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            c.resolve_secret().expect("secret"),
            "config-test-secret-0123456789abcdef"
        );
        assert_eq!(c.snapshot, SnapshotConfig::default());
        assert_eq!(
            (c.snapshot.max_bytes, c.snapshot.max_pod_bytes),
            (4 * 1024 * 1024, 64 * 1024)
        );
    }

    #[test]
    fn toml_equivalent() {
        let t = r#"
heartbeat_ms = 500
[push]
address = "127.0.0.1:10000"
secret_env = "LLMR_TEST_SECRET_NOT_SET_ANYWHERE"
[scrape]
interval_ms = 100
[[pools]]
name = "llama"
cluster = "pool_llama"
models = ["m1"]
[pools.discovery]
static = ["127.0.0.1:9001"]
[[pools]]
name = "k"
cluster = "c"
[pools.discovery.kubernetes]
label_selector = "app=vllm"
port = 8000
[[pools]]
name = "ip"
cluster = "c2"
[pools.discovery.inference_pool]
name = "vllm-llama"
port = 8001
api = {server = "http://127.0.0.1:8080", token = "t"}
"#;
        let c = Config::from_toml(t, "t.toml").expect("parses");
        c.validate().expect("valid");
        assert_eq!((c.heartbeat_ms, c.scrape.interval_ms), (500, 100));
        match &c.pools[1].discovery {
            Discovery::Kubernetes(k) => assert_eq!(k.port, Some(PortRef::Number(8000))),
            other => panic!("{other:?}"),
        }
        match &c.pools[2].discovery {
            Discovery::InferencePool(p) => {
                assert_eq!(
                    (p.name.as_str(), p.port, p.namespace.as_deref()),
                    ("vllm-llama", Some(8001), None)
                );
                assert_eq!(
                    p.api.as_ref().map(|a| a.server.as_str()),
                    Some("http://127.0.0.1:8080")
                );
            }
            other => panic!("{other:?}"),
        }
        let e = c.resolve_secret().expect_err("env not set");
        assert!(e.to_string().contains("push.secret_env"), "{e}");
    }

    fn err_of(yaml: &str) -> String {
        match Config::from_yaml(yaml, "bad.yaml").and_then(|c| c.validate().map(|_| c)) {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_configs_name_the_field() {
        let e = err_of(&YAML.replace("127.0.0.1:9002", "localhost"));
        assert!(
            e.contains("pools[0].discovery.static[1]") && e.contains("not ip:port"),
            "{e}"
        );
        let e = err_of(&YAML.replace("engine: sglang", "engine: foo"));
        assert!(
            e.contains("pools[1].engine") && e.contains("unknown engine"),
            "{e}"
        );
        let e = err_of(&YAML.replace(
            "secret: config-test-secret-0123456789abcdef",
            "secret: a\n  secret_env: B",
        ));
        assert!(
            e.contains("push.secret") && e.contains("exactly one"),
            "{e}"
        );
        let e = err_of(&YAML.replace("cluster: pool_qwen", "clustr: pool_qwen"));
        assert!(e.contains("pools[1]") && e.contains("clustr"), "{e}");
        let e = err_of(&YAML.replace("static:", "statik:"));
        assert!(
            e.contains("pools[0].discovery") && e.contains("statik"),
            "{e}"
        );
        let e = err_of(&YAML.replace("name: qwen", "name: llama"));
        assert!(e.contains("pools[1].name") && e.contains("twice"), "{e}");
        let e = err_of(&YAML.replace("service: vllm", "service: vllm, label_selector: a=b"));
        assert!(e.contains("pools[2].discovery.kubernetes"), "{e}");
        let e = err_of(&YAML.replace("name: vllm-llama,", "name: \"\","));
        assert!(e.contains("pools[3].discovery.inference_pool.name"), "{e}");
        let e = err_of(&YAML.replace("namespace: llm}", "namespace: llm, port: 0}"));
        assert!(e.contains("pools[3].discovery.inference_pool.port"), "{e}");
        let e = err_of(&YAML.replace("namespace: llm}", "namespace: llm, api: {server: x}}"));
        assert!(
            e.contains("pools[3].discovery.inference_pool.api.server"),
            "{e}"
        );
        let e = err_of(&YAML.replace("namespace: llm}", "namespace: llm, selector: a}"));
        assert!(
            e.contains("pools[3].discovery") && e.contains("selector"),
            "{e}"
        );
        let e = err_of(&YAML.replace(
            "service: vllm, port: http}",
            "service: vllm, port: http}\n      inference_pool: {name: x}",
        ));
        assert!(
            e.contains("pools[2]") && e.contains("exactly one") && e.contains("inference_pool"),
            "{e}"
        );
        let e = err_of(&format!("{YAML}scrape: {{interval_ms: 0}}\n"));
        assert!(e.contains("scrape.interval_ms"), "{e}");
        let e = err_of("push: {address: 127.0.0.1:1, secret_env: X}\npools: []\n");
        assert!(e.contains("`pools`"), "{e}");
        let e = err_of(&format!("{YAML}snapshot: {{max_pod_bytes: 100}}\n"));
        assert!(e.contains("snapshot.max_pod_bytes"), "{e}");
        let e = err_of(&format!(
            "{YAML}snapshot: {{max_bytes: 65536, max_pod_bytes: 65537}}\n"
        ));
        assert!(e.contains("snapshot.max_pod_bytes"), "{e}");
        let e = err_of(&format!("{YAML}snapshot: {{max_bytes: 1000}}\n"));
        assert!(e.contains("snapshot.max_bytes"), "{e}");
        let e = err_of(&format!("{YAML}snapshot: {{max_byte: 1000}}\n"));
        assert!(e.contains("max_byte"), "{e}");
    }

    #[test]
    fn snapshot_budgets_read() {
        let c = Config::from_yaml(
            &format!("{YAML}snapshot: {{max_bytes: 1048576, max_pod_bytes: 16384}}\n"),
            "t.yaml",
        )
        .expect("parses");
        c.validate().expect("valid");
        assert_eq!(
            c.snapshot,
            SnapshotConfig {
                max_bytes: 1 << 20,
                max_pod_bytes: 16384
            }
        );
    }

    /// Placeholders and short secrets are refused from every source, with the shared policy's
    /// message; a file's trailing newline is not part of the secret.
    #[test]
    fn weak_secrets_are_refused() {
        for weak in ["change-me", "s3cret"] {
            let e = err_of(&YAML.replace("config-test-secret-0123456789abcdef", weak));
            assert!(
                e.contains("push.secret") && e.contains("openssl rand"),
                "{e}"
            );
        }
        let dir = std::env::temp_dir().join(format!("sidecar-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let with_file = |text: &str| {
            let f = dir.join("secret");
            std::fs::write(&f, text).unwrap();
            let y = YAML.replace(
                "secret: config-test-secret-0123456789abcdef",
                &format!("secret_file: {}", f.display()),
            );
            let c = Config::from_yaml(&y, "t.yaml").unwrap();
            c.validate().unwrap();
            c.resolve_secret()
        };
        let good = "0123456789abcdef0123456789abcdef";
        assert_eq!(with_file(&format!("{good}\n")).unwrap(), good);
        let e = with_file("change-me\n").unwrap_err().to_string();
        assert!(
            e.contains("push.secret_file") && e.contains("placeholder"),
            "{e}"
        );
        let e = with_file("short\n").unwrap_err().to_string();
        assert!(
            e.contains("push.secret_file") && e.contains("5 bytes"),
            "{e}"
        );
    }

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::embedded_default().expect("valid");
        assert!(!c.pools.is_empty());
        // No secret is shipped: the demo reads it from the environment.
        assert_eq!(c.push.secret, None);
        assert_eq!(
            c.push.secret_env.as_deref(),
            Some("LLM_ROUTER_SNAPSHOT_SECRET")
        );
        assert_eq!(c.snapshot, SnapshotConfig::default());
        // The sidecar's own /metrics stays on loopback unless configured.
        assert_eq!(c.listen, "127.0.0.1:9464");
        let minimal = Config::from_yaml(
            "push: {address: 127.0.0.1:1, secret_env: X}\npools: []\n",
            "t.yaml",
        )
        .unwrap();
        assert_eq!(minimal.listen, "127.0.0.1:9464");
    }
}
