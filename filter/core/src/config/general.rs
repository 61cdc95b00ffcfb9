//! The top-level settings outside any section: how many pods a decision returns, the largest
//! body, the bounds of `Retry-After`, unknown paths, what clients are told and whose priority
//! headers count. Each is its default (`base`'s) unless configured.

use super::check::err;
use super::raw::{RawDisclose, RawPriority};
use super::resolved::{Disclose, PriorityConfig, UnknownPaths};
use super::ConfigError;

pub(super) fn top_k(v: Option<usize>, base: usize) -> Result<usize, ConfigError> {
    let top_k = v.unwrap_or(base);
    if !(1..=32).contains(&top_k) {
        return err(format!("top_k: {top_k} must be in 1..=32"));
    }
    Ok(top_k)
}

pub(super) fn max_body_bytes(v: Option<usize>, base: usize) -> Result<usize, ConfigError> {
    let max_body_bytes = v.unwrap_or(base);
    if max_body_bytes < 1024 {
        return err(format!(
            "max_body_bytes: {max_body_bytes} must be at least 1024"
        ));
    }
    Ok(max_body_bytes)
}

/// `(retry_after_s, retry_after_max_s)`, the second not below the first.
pub(super) fn retry_after(
    v: (Option<u32>, Option<u32>),
    base: (u32, u32),
) -> Result<(u32, u32), ConfigError> {
    let retry_after_s = v.0.unwrap_or(base.0);
    let retry_after_max_s = v.1.unwrap_or(base.1);
    if retry_after_max_s < retry_after_s {
        return err(format!(
            "retry_after_max_s: {retry_after_max_s} must be >= retry_after_s ({retry_after_s})"
        ));
    }
    Ok((retry_after_s, retry_after_max_s))
}

pub(super) fn unknown_paths(
    v: Option<&str>,
    base: UnknownPaths,
) -> Result<UnknownPaths, ConfigError> {
    match v {
        None => Ok(base),
        Some("pass") => Ok(UnknownPaths::Pass),
        Some("reject") => Ok(UnknownPaths::Reject),
        Some(o) => err(format!("unknown_paths: {o:?} is not one of pass, reject")),
    }
}

pub(super) fn disclose(v: Option<RawDisclose>, base: Disclose) -> Disclose {
    let d = v.unwrap_or_default();
    Disclose {
        served_pod: d.served_pod.unwrap_or(base.served_pod),
        pool_detail: d.pool_detail.unwrap_or(base.pool_detail),
    }
}

pub(super) fn priority(v: Option<RawPriority>, base: PriorityConfig) -> PriorityConfig {
    PriorityConfig {
        trust_headers: v
            .and_then(|p| p.trust_headers)
            .unwrap_or(base.trust_headers),
    }
}
