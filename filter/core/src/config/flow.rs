//! The `flow` section: holding requests while their pool is full ([`crate::flow`]), with the
//! bounds of the whole queue and of each priority class (`flow.bands`).

use super::check::{set_above_zero, set_checked};
use super::raw::{RawBand, RawFlow};
use super::resolved::{BandLimits, FlowConfig};
use super::ConfigError;
use crate::priority::Class;

/// The defaults with what `raw` sets, every field checked.
pub(super) fn flow_config(raw: Option<RawFlow>) -> Result<FlowConfig, ConfigError> {
    let mut out = FlowConfig::default();
    let Some(raw) = raw else {
        return Ok(out);
    };
    out.enabled = raw.enabled.unwrap_or(out.enabled);
    set_above_zero(
        "flow",
        "max_requests",
        raw.max_requests,
        &mut out.max_requests,
    )?;
    set_above_zero("flow", "max_bytes", raw.max_bytes, &mut out.max_bytes)?;
    set_checked(
        "flow",
        "tick_ms",
        raw.tick_ms,
        &mut out.tick_ms,
        |t| (1..=1000).contains(&t),
        "must be in 1..=1000",
    )?;
    let tick_ms = out.tick_ms;
    set_checked(
        "flow",
        "summary_stale_ms",
        raw.summary_stale_ms,
        &mut out.summary_stale_ms,
        |t| t >= tick_ms.saturating_mul(2),
        &format!("must be at least twice flow.tick_ms ({tick_ms})"),
    )?;
    if let Some(t) = raw.newest_first_after_ms {
        out.newest_first_after_ms = t;
    }
    set_checked(
        "flow",
        "kv_threshold",
        raw.kv_threshold,
        &mut out.kv_threshold,
        |k| k > 0.0 && k <= 1.0,
        "must be in (0, 1]",
    )?;
    let bands = raw.bands.unwrap_or_default();
    for (class, b) in [
        (Class::Sheddable, bands.sheddable),
        (Class::Standard, bands.standard),
        (Class::Critical, bands.critical),
    ] {
        let Some(b) = b else { continue };
        let Some(slot) = out.bands.get_mut(class.index()) else {
            continue;
        };
        band(&format!("flow.bands.{}", class.name()), b, slot)?;
    }
    Ok(out)
}

/// One class's bounds (`flow.bands.<class>`).
fn band(path: &str, b: RawBand, out: &mut BandLimits) -> Result<(), ConfigError> {
    set_above_zero(path, "max_requests", b.max_requests, &mut out.max_requests)?;
    set_above_zero(path, "max_bytes", b.max_bytes, &mut out.max_bytes)?;
    set_above_zero(path, "ttl_ms", b.ttl_ms, &mut out.ttl_ms)
}
