//! The filter's plugin configuration: parsed from the JSON that Envoy hands the filter, checked
//! once at load time, and turned into the resolved form the router uses per request.
//!
//! Every mistake is reported with the JSON path of the field and what was expected, so a bad
//! configuration fails at load with one clear log line instead of misrouting traffic later.
//!
//! The JSON shape as written (serde) is in `raw.rs`, the resolved configuration and its defaults
//! in `resolved.rs`. [`Config::parse`] reads the one and resolves it into the other section by
//! section, one file each: `pools.rs` (pools and the model names they serve) with `tuning.rs`
//! (a pool's weights, LoRA costs, priors, saturation and prefix index, also for `defaults`),
//! `general.rs` (the top-level settings), `rewrites.rs`, `snapshot.rs` (endpoints, freshness,
//! the push secret), `headers.rs` and `flow.rs`. The checks they share are in `check.rs`.

mod check;
mod flow;
mod general;
mod headers;
mod pools;
mod raw;
mod resolved;
mod rewrites;
mod snapshot;
mod tuning;

use std::fmt;

use raw::RawConfig;

pub(crate) use resolved::standing_before;
pub use resolved::{
    slo_ttft_ms, BandLimits, Config, Disclose, FlowConfig, LoraConfig, ModelRoute, OnMissing,
    OnStale, PoolConfig, PredictConfig, PrefixConfig, PriorityConfig, Saturation, SnapshotConfig,
    UnknownPaths, FAIRNESS_HEADERS, LLMD_OBJECTIVE_HEADER, NEWEST_FIRST_AFTER_MS, SLO_TTFT_HEADER,
};
pub use rewrites::{resolve_snapshot_rewrites, DroppedRewrite, MAX_REWRITE_WEIGHT};
pub use tuning::MAX_WEIGHT;

pub use crate::weights::Weights;

/// A configuration problem, with the path of the field at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid llm-router configuration: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

impl Default for Config {
    fn default() -> Self {
        // An empty object is a valid configuration; this cannot fail.
        Config::from_raw(RawConfig::default(), &|_| None)
            .unwrap_or_else(|_| Config::fallback_defaults())
    }
}

impl Config {
    /// Parses the plugin configuration. Empty input (no configuration) means all defaults.
    /// `snapshot.secret_env` is read from the process environment (in Envoy: the variables
    /// `vm_config.environment_variables` passes into the VM).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        Config::parse_with_env(bytes, &|name| std::env::var(name).ok())
    }

    /// [`Config::parse`] with `env` as the environment.
    pub fn parse_with_env(
        bytes: &[u8],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let trimmed = bytes.iter().position(|b| !b.is_ascii_whitespace());
        if trimmed.is_none() {
            return Config::from_raw(RawConfig::default(), env);
        }
        let raw: RawConfig = serde_json::from_slice(bytes)
            .map_err(|e| ConfigError(format!("not valid configuration JSON: {e}")))?;
        Config::from_raw(raw, env)
    }

    /// Resolves `raw` section by section, in a fixed order (a configuration with several
    /// mistakes always reports the same one): `defaults`, `pools`, the top-level settings,
    /// `rewrites`, `snapshot`, the header names, `flow`.
    fn from_raw(
        mut raw: RawConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let base = Config::fallback_defaults();
        let default_pool = match &raw.defaults {
            Some(t) => tuning::tuning("defaults", &base.default_pool, t)?,
            None => base.default_pool.clone(),
        };
        let (pools, models) = pools::pools(&raw.pools, &default_pool)?;
        let top_k = general::top_k(raw.top_k, base.top_k)?;
        let max_body_bytes = general::max_body_bytes(raw.max_body_bytes, base.max_body_bytes)?;
        let (retry_after_s, retry_after_max_s) = general::retry_after(
            (raw.retry_after_s, raw.retry_after_max_s),
            (base.retry_after_s, base.retry_after_max_s),
        )?;
        let unknown_paths =
            general::unknown_paths(raw.unknown_paths.as_deref(), base.unknown_paths)?;
        let mut rewrites = rewrites::rewrites(&raw.rewrites, &pools, &models)?;
        let snapshot = snapshot::snapshot(raw.snapshot.take(), &base.snapshot, env)?;
        rewrites::salt(&mut rewrites, &snapshot.secret);
        let headers = headers::headers(&mut raw, &base)?;
        Ok(Config {
            pools,
            models,
            default_pool,
            cluster_header: headers.cluster,
            endpoint_header: headers.endpoint,
            served_header: headers.served,
            reason_header: headers.reason,
            rewrite_header: headers.rewrite,
            priority_header: headers.priority,
            objective_header: headers.objective,
            objectives: raw.objectives,
            top_k,
            max_body_bytes,
            retry_after_s,
            retry_after_max_s,
            snapshot,
            priority: general::priority(raw.priority, base.priority),
            debug_scores: raw.debug_scores.unwrap_or(base.debug_scores),
            scores_header: headers.scores,
            disclose: general::disclose(raw.disclose, base.disclose),
            unknown_paths,
            rewrites,
            served_model_header: headers.served_model,
            flow: flow::flow_config(raw.flow)?,
        })
    }
}

#[cfg(test)]
mod tests;
