//! The names of the headers the filter reads and writes: each a lower-case HTTP header name,
//! its default unless configured.

use super::check::err;
use super::raw::RawConfig;
use super::resolved::Config;
use super::ConfigError;

/// The configured header names, resolved ([`Config`]'s `*_header` fields).
pub(super) struct Headers {
    pub cluster: String,
    pub endpoint: String,
    pub served: String,
    pub reason: String,
    pub rewrite: String,
    pub priority: String,
    pub objective: String,
    pub scores: String,
    pub served_model: String,
}

/// Takes the header names out of `raw`, each checked in the order of [`Config`]'s fields;
/// `base` gives the defaults.
pub(super) fn headers(raw: &mut RawConfig, base: &Config) -> Result<Headers, ConfigError> {
    Ok(Headers {
        cluster: header_name(
            "cluster_header",
            raw.cluster_header.take(),
            &base.cluster_header,
        )?,
        endpoint: header_name(
            "endpoint_header",
            raw.endpoint_header.take(),
            &base.endpoint_header,
        )?,
        served: header_name(
            "served_header",
            raw.served_header.take(),
            &base.served_header,
        )?,
        reason: header_name(
            "reason_header",
            raw.reason_header.take(),
            &base.reason_header,
        )?,
        rewrite: header_name(
            "rewrite_header",
            raw.rewrite_header.take(),
            &base.rewrite_header,
        )?,
        priority: header_name(
            "priority_header",
            raw.priority_header.take(),
            &base.priority_header,
        )?,
        objective: header_name(
            "objective_header",
            raw.objective_header.take(),
            &base.objective_header,
        )?,
        scores: header_name(
            "scores_header",
            raw.scores_header.take(),
            &base.scores_header,
        )?,
        served_model: header_name(
            "served_model_header",
            raw.served_model_header.take(),
            &base.served_model_header,
        )?,
    })
}

/// The header name at `path`: `v`, else `default`; lower-case letters, digits, `-` and `_`.
fn header_name(path: &str, v: Option<String>, default: &str) -> Result<String, ConfigError> {
    let v = v.unwrap_or_else(|| default.to_string());
    let ok = !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !ok {
        return err(format!(
            "{path}: {v:?} is not a lower-case HTTP header name"
        ));
    }
    Ok(v)
}
