//! The configuration as written: the JSON shapes serde reads, before any check. Every field is
//! optional where the resolved configuration has a default; [`super::Config::parse`] resolves
//! them section by section (the sibling modules), naming the JSON path of any field at fault.
//!
//! Every shape denies unknown fields, so a typo is an error rather than a silently ignored
//! setting.

use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

use super::check::err;
use super::ConfigError;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) pools: Vec<RawPool>,
    pub(super) cluster_header: Option<String>,
    pub(super) endpoint_header: Option<String>,
    pub(super) served_header: Option<String>,
    pub(super) reason_header: Option<String>,
    pub(super) rewrite_header: Option<String>,
    pub(super) priority_header: Option<String>,
    pub(super) objective_header: Option<String>,
    #[serde(default)]
    pub(super) objectives: HashMap<String, i32>,
    pub(super) top_k: Option<usize>,
    pub(super) max_body_bytes: Option<usize>,
    pub(super) retry_after_s: Option<u32>,
    pub(super) retry_after_max_s: Option<u32>,
    pub(super) snapshot: Option<RawSnapshot>,
    /// Applied to pools that appear only in the snapshot.
    pub(super) defaults: Option<RawPoolTuning>,
    pub(super) priority: Option<RawPriority>,
    pub(super) debug_scores: Option<bool>,
    pub(super) scores_header: Option<String>,
    pub(super) disclose: Option<RawDisclose>,
    pub(super) unknown_paths: Option<String>,
    #[serde(default)]
    pub(super) rewrites: Vec<RawRewrite>,
    pub(super) served_model_header: Option<String>,
    pub(super) flow: Option<RawFlow>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    pub(super) name: String,
    pub(super) cluster: Option<String>,
    /// Names or `{name, rewrite, adapter}` objects; checked field by field in [`raw_model`].
    #[serde(default)]
    pub(super) models: Vec<serde_json::Value>,
    #[serde(default)]
    pub(super) adapters: Vec<String>,
    pub(super) preset: Option<String>,
    pub(super) weights: Option<RawWeights>,
    pub(super) saturation: Option<RawSaturation>,
    pub(super) prefix: Option<RawPrefix>,
    pub(super) predict: Option<RawPredict>,
    pub(super) lora: Option<RawLora>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPoolTuning {
    pub(super) preset: Option<String>,
    pub(super) weights: Option<RawWeights>,
    pub(super) saturation: Option<RawSaturation>,
    pub(super) prefix: Option<RawPrefix>,
    pub(super) predict: Option<RawPredict>,
    pub(super) lora: Option<RawLora>,
}

pub(super) enum RawModel {
    Name(String),
    Full(RawModelFull),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModelFull {
    pub(super) name: String,
    pub(super) rewrite: Option<String>,
    #[serde(default)]
    pub(super) adapter: bool,
}

const MODEL_FIELDS: [&str; 3] = ["name", "rewrite", "adapter"];

/// One entry of a pool's `models`: a name, or an object whose every field is known (a typo such
/// as `rewrit` is an error naming its path, not a silently ignored field).
pub(super) fn raw_model(path: &str, v: &serde_json::Value) -> Result<RawModel, ConfigError> {
    match v {
        serde_json::Value::String(name) => Ok(RawModel::Name(name.clone())),
        serde_json::Value::Object(map) => {
            if let Some(key) = map.keys().find(|k| !MODEL_FIELDS.contains(&k.as_str())) {
                return err(format!(
                    "{path}.{key}: unknown field, expected one of name, rewrite, adapter"
                ));
            }
            serde_json::from_value(v.clone())
                .map(RawModel::Full)
                .map_err(|e| ConfigError(format!("{path}: {e}")))
        }
        other => err(format!(
            "{path}: expected a model name or an object with name, rewrite, adapter; got {other}"
        )),
    }
}

/// Scorer name → weight; names are checked against the scorer registry.
pub(super) type RawWeights = BTreeMap<String, f64>;

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLora {
    pub(super) load_ms: Option<f64>,
    pub(super) stray_ms: Option<f64>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPredict {
    pub(super) chars_per_token: Option<f64>,
    pub(super) prior_ms_per_token: Option<f64>,
    pub(super) prior_base_ms: Option<f64>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSaturation {
    pub(super) queue_threshold: Option<f64>,
    pub(super) kv_threshold: Option<f64>,
    pub(super) critical_factor: Option<f64>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrefix {
    pub(super) block_chars: Option<usize>,
    pub(super) max_blocks: Option<usize>,
    pub(super) index_slots: Option<u32>,
    pub(super) page_blocks: Option<usize>,
    pub(super) entries_per_page: Option<usize>,
}

/// One `InferenceModelRewrite`-like rule.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRewrite {
    pub(super) model: String,
    pub(super) targets: Vec<RawTarget>,
    pub(super) sticky: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTarget {
    pub(super) model: String,
    /// Default 1.
    pub(super) weight: Option<u32>,
    /// The pool serving `model` when `model` is not a configured model name.
    pub(super) pool: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSnapshot {
    pub(super) push_path: Option<String>,
    pub(super) state_path: Option<String>,
    pub(super) tally_path: Option<String>,
    pub(super) endpoints: Option<bool>,
    pub(super) secret: Option<String>,
    /// The name of an environment variable holding the secret (Envoy passes it into the VM with
    /// `vm_config.environment_variables.host_env_keys`).
    pub(super) secret_env: Option<String>,
    /// Removed (pushes are signed now); kept only to say so when a configuration sets it.
    pub(super) secret_header: Option<String>,
    pub(super) stale_after_ms: Option<u64>,
    pub(super) on_stale: Option<String>,
    pub(super) on_missing: Option<String>,
    pub(super) max_bytes: Option<usize>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFlow {
    pub(super) enabled: Option<bool>,
    pub(super) max_requests: Option<usize>,
    pub(super) max_bytes: Option<usize>,
    pub(super) tick_ms: Option<u64>,
    pub(super) summary_stale_ms: Option<u64>,
    pub(super) kv_threshold: Option<f64>,
    pub(super) newest_first_after_ms: Option<u64>,
    pub(super) bands: Option<RawBands>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBands {
    pub(super) sheddable: Option<RawBand>,
    pub(super) standard: Option<RawBand>,
    pub(super) critical: Option<RawBand>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBand {
    pub(super) max_requests: Option<usize>,
    pub(super) max_bytes: Option<usize>,
    pub(super) ttl_ms: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDisclose {
    pub(super) served_pod: Option<bool>,
    pub(super) pool_detail: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPriority {
    pub(super) trust_headers: Option<bool>,
}
