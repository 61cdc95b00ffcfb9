//! Command line and fleet files: from `model-sim …` arguments to a list of [`PodConfig`]s.
//!
//! Forms (see README.md):
//! - `model-sim --port 9001 --profile h100` — one pod;
//! - `model-sim --port 9001 --port 9002-9004 --profile h100,a10g` — several pods; the i-th pod
//!   takes the i-th profile (the last one repeats);
//! - `model-sim fleet FILE` — a YAML (`.yaml`/`.yml`) or TOML (`.toml`) list of pods;
//! - `model-sim fleet --spec "h100:9001,a10g:9002,h100:9003-9005:sglang"`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use crate::metrics::{Flavor, KvMetricName};
use crate::profile::{Profile, UnknownProfile};
use crate::server::{OutputLen, PodConfig, DEFAULT_MODEL};

/// `model-sim` command line.
#[derive(Debug, Parser)]
#[command(
    name = "model-sim",
    version,
    about = "A vLLM-like model-server emulator (one pod or a fleet)."
)]
pub struct Cli {
    /// `fleet` form.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Single / repeated-pod form.
    #[command(flatten)]
    pub pod: PodArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a fleet described by a file or a `--spec` string.
    Fleet(FleetArgs),
}

/// `model-sim fleet` arguments.
#[derive(Debug, Args)]
pub struct FleetArgs {
    /// YAML or TOML fleet file.
    pub file: Option<PathBuf>,
    /// Quick form: comma list of PROFILE:PORT[-LAST][:ENGINE].
    #[arg(long)]
    pub spec: Option<String>,
    /// Defaults for every pod of the fleet (a file's values win).
    #[command(flatten)]
    pub defaults: PodArgs,
}

/// Per-pod options; in the fleet form they are defaults.
#[derive(Debug, Clone, Args)]
pub struct PodArgs {
    /// Port to serve (repeatable; `A-B` is a range; 0 picks a free port).
    #[arg(long = "port", value_name = "PORT|FIRST-LAST")]
    pub ports: Vec<String>,
    /// GPU profile(s): h100, a10g, h100-70b; a comma list gives one per pod, the last repeats.
    #[arg(long, value_delimiter = ',', default_value = "h100")]
    pub profile: Vec<String>,
    /// Metric names: vllm or sglang.
    #[arg(long, default_value = "vllm")]
    pub engine: String,
    /// Divide every emulated time by this factor.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// LoRA adapter slots per pod (0 disables adapters).
    #[arg(long, default_value_t = 4)]
    pub max_loras: usize,
    /// LoRA adapters kept in the CPU cache (vLLM `--max-cpu-loras`; default max_loras).
    #[arg(long)]
    pub max_cpu_loras: Option<usize>,
    /// Seed (pod i of a command line uses seed + i).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Base model name.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// The LoRA adapters the pod can load (comma list, like vLLM's `--lora-modules`); any
    /// other model name is answered 404. Without it, names containing `lora` or starting with
    /// `adapter` are adapters (see README.md).
    #[arg(long, value_delimiter = ',')]
    pub lora_modules: Vec<String>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// vLLM KV gauge name: new (kv_cache_usage_perc), old (gpu_cache_usage_perc) or both.
    #[arg(long, default_value = "new")]
    pub kv_metric: String,
    /// Serve only synthetic, slowly varying metrics (cheap; for 100+ pods).
    #[arg(long)]
    pub metrics_only: bool,
    /// Lie in `/metrics`: report waiting 0, running 0 and KV use 0 whatever the real state
    /// (a broken or hostile pod; inference is served as usual).
    #[arg(long)]
    pub lie_metrics: bool,
    /// `max_tokens` for requests that give none.
    #[arg(long, default_value_t = 128)]
    pub default_max_tokens: u32,
    /// Output length: max (= max_tokens), uniform (1..=max_tokens) or lognormal (EOS after a
    /// lognormal number of tokens, capped by max_tokens); the last two unless ignore_eos.
    #[arg(long, default_value = "max")]
    pub output_len: String,
    /// Override the profile's KV blocks.
    #[arg(long)]
    pub num_gpu_blocks: Option<u32>,
    /// Override the profile's max_num_seqs.
    #[arg(long)]
    pub max_num_seqs: Option<u32>,
    /// Override the profile's LoRA load time from disk (milliseconds, before speedup).
    #[arg(long)]
    pub lora_load_ms: Option<f64>,
    /// Override the profile's LoRA swap-in time from the CPU cache (ms, before speedup).
    #[arg(long)]
    pub lora_cpu_load_ms: Option<f64>,
    /// Tokio worker threads for the whole process.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

/// One pod in a fleet file; every field is optional and falls back to `defaults`, then to the
/// command line.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodSpec {
    /// First port.
    pub port: Option<u16>,
    /// Number of consecutive ports (pods) starting at `port` (default 1).
    pub count: Option<u16>,
    /// Profile name.
    pub profile: Option<String>,
    /// vllm | sglang.
    pub engine: Option<String>,
    /// Speed-up factor.
    pub speedup: Option<f64>,
    /// LoRA slots.
    pub max_loras: Option<usize>,
    /// CPU LoRA cache.
    pub max_cpu_loras: Option<usize>,
    /// Seed.
    pub seed: Option<u64>,
    /// Base model.
    pub model: Option<String>,
    /// Adapters the pod can load (default: the naming rule).
    pub lora_modules: Option<Vec<String>>,
    /// Bind address.
    pub host: Option<IpAddr>,
    /// new | old | both.
    pub kv_metric: Option<String>,
    /// Synthetic metrics only.
    pub metrics_only: Option<bool>,
    /// Report an empty engine in `/metrics`.
    pub lie_metrics: Option<bool>,
    /// Default max_tokens.
    pub default_max_tokens: Option<u32>,
    /// max | uniform | lognormal.
    pub output_len: Option<String>,
    /// KV blocks override.
    pub num_gpu_blocks: Option<u32>,
    /// max_num_seqs override.
    pub max_num_seqs: Option<u32>,
    /// LoRA load time from disk override (ms).
    pub lora_load_ms: Option<f64>,
    /// LoRA swap-in time from CPU override (ms).
    pub lora_cpu_load_ms: Option<f64>,
}

/// A fleet file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    /// Values for every pod.
    #[serde(default)]
    pub defaults: PodSpec,
    /// The pods.
    pub pods: Vec<PodSpec>,
}

/// Configuration errors, each naming what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Bad port or range.
    #[error("bad port {0:?} (want PORT or FIRST-LAST)")]
    BadPort(String),
    /// Unknown profile.
    #[error(transparent)]
    Profile(#[from] UnknownProfile),
    /// Unknown engine.
    #[error("unknown engine {0:?} (want vllm or sglang)")]
    Engine(String),
    /// Unknown KV metric name.
    #[error("unknown kv metric {0:?} (want new, old or both)")]
    KvMetric(String),
    /// Unknown output-length mode.
    #[error("unknown output length mode {0:?} (want max, uniform or lognormal)")]
    OutputLen(String),
    /// Bad spec item.
    #[error("bad --spec item {0:?} (want PROFILE:PORT[-LAST][:ENGINE])")]
    Spec(String),
    /// File unreadable.
    #[error("cannot read fleet file {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// File unparsable.
    #[error("cannot parse fleet file {path}: {msg}")]
    Parse {
        /// File.
        path: PathBuf,
        /// Parser message.
        msg: String,
    },
    /// No pods at all.
    #[error("no pods: give a fleet FILE or --spec")]
    NoPods,
}

/// Parses `PORT` or `FIRST-LAST`.
pub fn parse_ports(s: &str) -> Result<Vec<u16>, ConfigError> {
    let bad = || ConfigError::BadPort(s.to_string());
    match s.split_once('-') {
        Some((a, b)) => {
            let a: u16 = a.trim().parse().map_err(|_| bad())?;
            let b: u16 = b.trim().parse().map_err(|_| bad())?;
            if b < a || a == 0 {
                return Err(bad());
            }
            Ok((a..=b).collect())
        }
        None => Ok(vec![s.trim().parse().map_err(|_| bad())?]),
    }
}

fn flavor(s: &str) -> Result<Flavor, ConfigError> {
    match s {
        "vllm" => Ok(Flavor::Vllm),
        "sglang" => Ok(Flavor::Sglang),
        o => Err(ConfigError::Engine(o.into())),
    }
}

fn kv_metric(s: &str) -> Result<KvMetricName, ConfigError> {
    match s {
        "new" => Ok(KvMetricName::New),
        "old" => Ok(KvMetricName::Old),
        "both" => Ok(KvMetricName::Both),
        o => Err(ConfigError::KvMetric(o.into())),
    }
}

fn output_len(s: &str) -> Result<OutputLen, ConfigError> {
    match s {
        "max" => Ok(OutputLen::Max),
        "uniform" => Ok(OutputLen::Uniform),
        "lognormal" => Ok(OutputLen::Lognormal),
        o => Err(ConfigError::OutputLen(o.into())),
    }
}

impl PodArgs {
    fn base_spec(&self) -> PodSpec {
        PodSpec {
            port: None,
            count: None,
            profile: self.profile.last().cloned(),
            engine: Some(self.engine.clone()),
            speedup: Some(self.speedup),
            max_loras: Some(self.max_loras),
            max_cpu_loras: self.max_cpu_loras,
            seed: Some(self.seed),
            model: Some(self.model.clone()),
            lora_modules: (!self.lora_modules.is_empty()).then(|| self.lora_modules.clone()),
            host: Some(self.host),
            kv_metric: Some(self.kv_metric.clone()),
            metrics_only: Some(self.metrics_only),
            lie_metrics: Some(self.lie_metrics),
            default_max_tokens: Some(self.default_max_tokens),
            output_len: Some(self.output_len.clone()),
            num_gpu_blocks: self.num_gpu_blocks,
            max_num_seqs: self.max_num_seqs,
            lora_load_ms: self.lora_load_ms,
            lora_cpu_load_ms: self.lora_cpu_load_ms,
        }
    }
}

impl PodSpec {
    fn over(&self, base: &PodSpec) -> PodSpec {
        PodSpec {
            port: self.port.or(base.port),
            count: self.count.or(base.count),
            profile: self.profile.clone().or_else(|| base.profile.clone()),
            engine: self.engine.clone().or_else(|| base.engine.clone()),
            speedup: self.speedup.or(base.speedup),
            max_loras: self.max_loras.or(base.max_loras),
            max_cpu_loras: self.max_cpu_loras.or(base.max_cpu_loras),
            seed: self.seed.or(base.seed),
            model: self.model.clone().or_else(|| base.model.clone()),
            lora_modules: self
                .lora_modules
                .clone()
                .or_else(|| base.lora_modules.clone()),
            host: self.host.or(base.host),
            kv_metric: self.kv_metric.clone().or_else(|| base.kv_metric.clone()),
            metrics_only: self.metrics_only.or(base.metrics_only),
            lie_metrics: self.lie_metrics.or(base.lie_metrics),
            default_max_tokens: self.default_max_tokens.or(base.default_max_tokens),
            output_len: self.output_len.clone().or_else(|| base.output_len.clone()),
            num_gpu_blocks: self.num_gpu_blocks.or(base.num_gpu_blocks),
            max_num_seqs: self.max_num_seqs.or(base.max_num_seqs),
            lora_load_ms: self.lora_load_ms.or(base.lora_load_ms),
            lora_cpu_load_ms: self.lora_cpu_load_ms.or(base.lora_cpu_load_ms),
        }
    }

    /// Builds the pod for `port` (the spec must be complete, i.e. laid over [`PodArgs`]).
    fn build(&self, port: u16, seed_offset: u64) -> Result<PodConfig, ConfigError> {
        let mut profile = Profile::by_name(self.profile.as_deref().unwrap_or("h100"))?;
        if let Some(n) = self.num_gpu_blocks {
            profile.num_gpu_blocks = n.max(1);
        }
        if let Some(n) = self.max_num_seqs {
            profile.max_num_seqs = n.max(1);
        }
        if let Some(ms) = self.lora_load_ms {
            profile.lora_load_s = (ms / 1000.0).max(0.0);
        }
        if let Some(ms) = self.lora_cpu_load_ms {
            profile.lora_cpu_load_s = (ms / 1000.0).max(0.0);
        }
        let mut cfg = PodConfig::new(port, profile);
        cfg.flavor = flavor(self.engine.as_deref().unwrap_or("vllm"))?;
        cfg.speedup = self.speedup.unwrap_or(1.0);
        cfg.max_loras = self.max_loras.unwrap_or(4);
        cfg.max_cpu_loras = self.max_cpu_loras;
        cfg.seed = self.seed.unwrap_or(0).wrapping_add(seed_offset);
        cfg.model = self.model.clone().unwrap_or_else(|| DEFAULT_MODEL.into());
        cfg.lora_modules = self.lora_modules.clone();
        if let Some(h) = self.host {
            cfg.host = h;
        }
        cfg.kv_metric = kv_metric(self.kv_metric.as_deref().unwrap_or("new"))?;
        cfg.metrics_only = self.metrics_only.unwrap_or(false);
        cfg.lie_metrics = self.lie_metrics.unwrap_or(false);
        cfg.default_max_tokens = self.default_max_tokens.unwrap_or(128).max(1);
        cfg.output_len = output_len(self.output_len.as_deref().unwrap_or("max"))?;
        Ok(cfg)
    }

    fn expand(&self, out: &mut Vec<PodConfig>) -> Result<(), ConfigError> {
        let first = self.port.unwrap_or(0);
        let count = self.count.unwrap_or(1).max(1);
        for i in 0..count {
            let port = if first == 0 {
                0
            } else {
                first
                    .checked_add(i)
                    .ok_or_else(|| ConfigError::BadPort(format!("{first}+{i}")))?
            };
            let off = out.len() as u64;
            out.push(self.build(port, off)?);
        }
        Ok(())
    }
}

/// Parses a fleet file (YAML or TOML by extension; anything else is tried as YAML).
pub fn load_fleet_file(path: &Path) -> Result<FleetFile, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.into(),
        source,
    })?;
    parse_fleet(
        &text,
        path.extension().and_then(|e| e.to_str()) == Some("toml"),
    )
    .map_err(|msg| ConfigError::Parse {
        path: path.into(),
        msg,
    })
}

/// Parses fleet text.
pub fn parse_fleet(text: &str, toml_format: bool) -> Result<FleetFile, String> {
    if toml_format {
        toml::from_str(text).map_err(|e| e.to_string())
    } else {
        serde_yaml::from_str(text).map_err(|e| e.to_string())
    }
}

/// Parses a `--spec` string into pod specs.
pub fn parse_spec(spec: &str) -> Result<Vec<PodSpec>, ConfigError> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let parts: Vec<&str> = item.split(':').collect();
        if parts.len() < 2 || parts.len() > 3 {
            return Err(ConfigError::Spec(item.into()));
        }
        let ports = parse_ports(parts[1])?;
        let first = ports
            .first()
            .copied()
            .ok_or_else(|| ConfigError::Spec(item.into()))?;
        out.push(PodSpec {
            port: Some(first),
            count: Some(ports.len() as u16),
            profile: Some(parts[0].to_string()),
            engine: parts.get(2).map(|s| s.to_string()),
            ..PodSpec::default()
        });
    }
    Ok(out)
}

/// Resolves the command line into pods and the worker-thread count.
pub fn resolve(cli: &Cli) -> Result<(Vec<PodConfig>, usize), ConfigError> {
    match &cli.command {
        Some(Command::Fleet(f)) => {
            let base = f.defaults.base_spec();
            let mut specs = Vec::new();
            let mut defaults = PodSpec::default();
            if let Some(path) = &f.file {
                let file = load_fleet_file(path)?;
                defaults = file.defaults;
                specs.extend(file.pods);
            }
            if let Some(s) = &f.spec {
                specs.extend(parse_spec(s)?);
            }
            if specs.is_empty() {
                return Err(ConfigError::NoPods);
            }
            let base = defaults.over(&base);
            let mut pods = Vec::new();
            for s in specs {
                s.over(&base).expand(&mut pods)?;
            }
            Ok((pods, f.defaults.threads))
        }
        None => {
            let a = &cli.pod;
            let mut ports = Vec::new();
            for p in &a.ports {
                ports.extend(parse_ports(p)?);
            }
            if ports.is_empty() {
                ports.push(8000);
            }
            let base = a.base_spec();
            let mut pods = Vec::new();
            for (i, port) in ports.into_iter().enumerate() {
                let profile = a.profile.get(i).or(a.profile.last()).cloned();
                let spec = PodSpec {
                    profile,
                    ..base.clone()
                };
                pods.push(spec.build(port, i as u64)?);
            }
            Ok((pods, a.threads))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        let mut v = vec!["model-sim"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn repeated_ports_and_profiles() {
        let (pods, _) = resolve(&cli(&[
            "--port",
            "9001",
            "--port",
            "9002-9003",
            "--profile",
            "h100,a10g",
            "--speedup",
            "5",
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        let v: Vec<(u16, &str, u64)> = pods
            .iter()
            .map(|p| (p.port, p.profile.name.as_str(), p.seed))
            .collect();
        assert_eq!(
            v,
            vec![(9001, "h100", 0), (9002, "a10g", 1), (9003, "a10g", 2)]
        );
        assert!(pods.iter().all(|p| p.speedup == 5.0));
    }

    #[test]
    fn spec_and_errors() {
        let (pods, _) = resolve(&cli(&[
            "fleet",
            "--spec",
            "h100:9001,a10g:9002-9003:sglang",
            "--max-loras",
            "2",
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pods.len(), 3);
        assert_eq!(pods[2].flavor, Flavor::Sglang);
        assert_eq!(pods[0].max_loras, 2);
        assert!(resolve(&cli(&["fleet", "--spec", "tpu:1"])).is_err());
        assert!(resolve(&cli(&["fleet"])).is_err());
        assert!(resolve(&cli(&["--port", "9-1"])).is_err());
        assert!(resolve(&cli(&["--engine", "tgi"])).is_err());
    }

    #[test]
    fn lora_modules_from_the_command_line_and_files() {
        let (pods, _) = resolve(&cli(&["--lora-modules", "sql-lora,chat-lora"]))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            pods[0].lora_modules,
            Some(vec!["sql-lora".to_string(), "chat-lora".to_string()])
        );
        let (pods, _) = resolve(&cli(&[])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pods[0].lora_modules, None);
        let y = "defaults: {lora_modules: [a]}\npods:\n  - {port: 9001}\n  - {port: 9002, lora_modules: [b, c]}\n";
        let f = parse_fleet(y, false).unwrap_or_else(|e| panic!("{e}"));
        let base = f.defaults.over(&cli(&[]).pod.base_spec());
        let mut pods = Vec::new();
        for s in &f.pods {
            s.over(&base)
                .expand(&mut pods)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(pods[0].lora_modules, Some(vec!["a".to_string()]));
        assert_eq!(
            pods[1].lora_modules,
            Some(vec!["b".to_string(), "c".to_string()])
        );
    }

    #[test]
    fn yaml_and_toml_files() {
        let y = "defaults:\n  speedup: 10\npods:\n  - {port: 9001, profile: h100}\n  - {port: 9100, count: 3, profile: a10g, metrics_only: true}\n";
        let f = parse_fleet(y, false).unwrap_or_else(|e| panic!("{e}"));
        let base = f.defaults.over(&cli(&[]).pod.base_spec());
        let mut pods = Vec::new();
        for s in &f.pods {
            s.over(&base)
                .expand(&mut pods)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(pods.len(), 4);
        assert_eq!(pods[3].port, 9102);
        assert!(pods[3].metrics_only && !pods[0].metrics_only);
        assert!(pods.iter().all(|p| p.speedup == 10.0));
        let t = "[defaults]\nengine = \"sglang\"\n[[pods]]\nport = 9001\nprofile = \"h100-70b\"\nmax_loras = 1\nmax_cpu_loras = 8\noutput_len = \"lognormal\"\nlora_cpu_load_ms = 3\n";
        let f = parse_fleet(t, true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.pods[0].max_loras, Some(1));
        let mut pods = Vec::new();
        f.pods[0]
            .over(&f.defaults.over(&cli(&[]).pod.base_spec()))
            .expand(&mut pods)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pods[0].max_cpu_loras, Some(8));
        assert_eq!(pods[0].output_len, OutputLen::Lognormal);
        assert_eq!(pods[0].profile.name, "h100-70b");
        assert!((pods[0].profile.lora_cpu_load_s - 0.003).abs() < 1e-12);
        assert!(parse_fleet("pods: [{prt: 1}]", false).is_err());
    }
}
