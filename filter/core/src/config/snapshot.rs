//! The `snapshot` section: the push, state and tally endpoints, what to do without a fresh
//! snapshot, and the secret pushes are signed with.

use super::check::err;
use super::raw::RawSnapshot;
use super::resolved::{OnMissing, OnStale, SnapshotConfig};
use super::ConfigError;

/// `base` with what `raw` sets, every field checked; the secret from `secret` or from the
/// environment variable `secret_env` names (looked up in `env`).
pub(super) fn snapshot(
    raw: Option<RawSnapshot>,
    base: &SnapshotConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<SnapshotConfig, ConfigError> {
    let s = raw.unwrap_or_default();
    let push_path = endpoint_path("snapshot.push_path", s.push_path, &base.push_path)?;
    let state_path = endpoint_path("snapshot.state_path", s.state_path, &base.state_path)?;
    let tally_path = endpoint_path("snapshot.tally_path", s.tally_path, &base.tally_path)?;
    let on_stale = on_stale(s.on_stale.as_deref())?;
    let on_missing = on_missing(s.on_missing.as_deref())?;
    let stale_after_ms = s.stale_after_ms.unwrap_or(base.stale_after_ms);
    if stale_after_ms == 0 {
        return err("snapshot.stale_after_ms: must be above 0");
    }
    if s.secret_header.is_some() {
        return err(
            "snapshot.secret_header: no longer used: pushes are signed with HMAC-SHA256 of \
             snapshot.secret in x-llm-router-signature; remove the field",
        );
    }
    let endpoints = s.endpoints.unwrap_or(base.endpoints);
    let secret = secret(s.secret, s.secret_env, env)?;
    if endpoints && secret.is_empty() {
        return err(
            "snapshot.secret: must be set (or snapshot.secret_env) when snapshot.endpoints \
             is true",
        );
    }
    Ok(SnapshotConfig {
        push_path,
        state_path,
        tally_path,
        endpoints,
        secret,
        stale_after_ms,
        on_stale,
        on_missing,
        max_bytes: s.max_bytes.unwrap_or(base.max_bytes),
    })
}

/// One of the endpoints' paths (`default` unless set): absolute, without query or fragment.
fn endpoint_path(name: &str, v: Option<String>, default: &str) -> Result<String, ConfigError> {
    let p = v.unwrap_or_else(|| default.to_string());
    if !path_ok(&p) {
        return err(format!(
            "{name}: {p:?} must be an absolute path without query"
        ));
    }
    Ok(p)
}

/// Absolute, with no query, fragment or space.
fn path_ok(p: &str) -> bool {
    p.starts_with('/') && !p.contains(['?', '#', ' '])
}

fn on_stale(v: Option<&str>) -> Result<OnStale, ConfigError> {
    match v {
        None | Some("least_inflight") => Ok(OnStale::LeastInflight),
        Some("fallback") => Ok(OnStale::Fallback),
        Some("reject") => Ok(OnStale::Reject),
        Some(o) => err(format!(
            "snapshot.on_stale: {o:?} is not one of least_inflight, fallback, reject"
        )),
    }
}

fn on_missing(v: Option<&str>) -> Result<OnMissing, ConfigError> {
    match v {
        None | Some("fallback") => Ok(OnMissing::Fallback),
        Some("reject") => Ok(OnMissing::Reject),
        Some(o) => err(format!(
            "snapshot.on_missing: {o:?} is not one of fallback, reject"
        )),
    }
}

/// The push secret: `literal`, or the value of the environment variable `var` names; empty
/// when neither is set. Either goes through the shared policy
/// ([`llm_router_snapshot::check_secret`]).
fn secret(
    literal: Option<String>,
    var: Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    match (literal, var) {
        (Some(_), Some(_)) => err(
            "snapshot.secret, snapshot.secret_env: set one of them, not both (secret_env names \
             the environment variable holding the secret)",
        ),
        (Some(literal), None) => {
            if !literal.is_empty() {
                if let Err(why) = llm_router_snapshot::check_secret(&literal) {
                    return err(format!("snapshot.secret: {why}"));
                }
            }
            Ok(literal)
        }
        (None, Some(name)) => secret_from_env(&name, env),
        (None, None) => Ok(String::new()),
    }
}

/// The secret held by the environment variable `name`.
fn secret_from_env(
    name: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    // A portable variable name (letters, digits, `_`): nothing that could trouble the host's
    // environment lookup, no `=` or NUL.
    let portable = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if name.is_empty() || !portable {
        return err(format!(
            "snapshot.secret_env: {name:?} must name an environment variable (letters, digits \
             and _)"
        ));
    }
    // A trailing line end is not part of the secret: a Kubernetes Secret made from a file
    // often ends in one, and the sidecar, reading the same Secret as a mounted file, drops it
    // too (both sides must key the HMAC alike).
    let value = env(name)
        .unwrap_or_default()
        .trim_end_matches(['\n', '\r'])
        .to_string();
    if value.is_empty() {
        return err(format!(
            "snapshot.secret_env: environment variable {name} is not set or empty in the Wasm \
             VM (Envoy passes it only when it is listed in \
             vm_config.environment_variables.host_env_keys and set in Envoy's own environment, \
             e.g. from a Kubernetes Secret)"
        ));
    }
    if let Err(why) = llm_router_snapshot::check_secret(&value) {
        return err(format!(
            "snapshot.secret_env: environment variable {name}: {why}"
        ));
    }
    Ok(value)
}
