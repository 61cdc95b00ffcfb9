//! A pool's tuning (`pools[i]`, or `defaults` for the pools only the snapshot names): its weight
//! preset and weights, LoRA costs, prediction priors, saturation bounds and prefix index, each
//! laid over the tuning it starts from.

use super::check::{err, set_checked};
use super::raw::{RawLora, RawPoolTuning, RawPredict, RawPrefix, RawSaturation, RawWeights};
use super::resolved::{LoraConfig, PoolConfig, PredictConfig, PrefixConfig, Saturation};
use super::ConfigError;
use crate::weights::Weights;

/// Largest weight a scorer may get (weights are relative; the bound keeps their sum finite).
pub const MAX_WEIGHT: f64 = 1_000_000.0;

/// `base` with what `t` sets, every field checked; errors name `path`.
pub(super) fn tuning(
    path: &str,
    base: &PoolConfig,
    t: &RawPoolTuning,
) -> Result<PoolConfig, ConfigError> {
    let mut out = base.clone();
    if let Some(p) = &t.preset {
        out.weights = preset(path, p)?;
    }
    if let Some(w) = &t.weights {
        weights(path, w, &mut out.weights)?;
    }
    if let Some(l) = t.lora {
        lora(&format!("{path}.lora"), l, &mut out.lora)?;
    }
    if let Some(p) = t.predict {
        predict(&format!("{path}.predict"), p, &mut out.predict)?;
    }
    if let Some(s) = t.saturation {
        saturation(&format!("{path}.saturation"), s, &mut out.saturation)?;
    }
    if let Some(p) = t.prefix {
        prefix(&format!("{path}.prefix"), p, &mut out.prefix)?;
    }
    Ok(out)
}

/// The weights of the preset named `name`.
fn preset(path: &str, name: &str) -> Result<Weights, ConfigError> {
    match Weights::preset(name) {
        Some(w) => Ok(w),
        None => {
            let names: Vec<&str> = crate::weights::PRESETS.iter().map(|(n, _)| *n).collect();
            err(format!(
                "{path}.preset: {name:?} is not one of {}",
                names.join(", ")
            ))
        }
    }
}

/// Sets the scorers `w` names; at least one weight must stay above 0.
fn weights(path: &str, w: &RawWeights, out: &mut Weights) -> Result<(), ConfigError> {
    for (name, &v) in w {
        let Some(i) = Weights::index(name) else {
            return err(format!(
                "{path}.weights.{name}: unknown scorer (one of {})",
                Weights::names()
            ));
        };
        // Weights are relative; the bound keeps their sum (the mean's divisor) finite.
        if !(0.0..=MAX_WEIGHT).contains(&v) {
            return err(format!(
                "{path}.weights.{name}: {v} must be a number in 0..={MAX_WEIGHT}"
            ));
        }
        if let Some(slot) = out.0.get_mut(i) {
            *slot = v;
        }
    }
    if out.0.iter().sum::<f64>() <= 0.0 {
        return err(format!(
            "{path}.weights: at least one weight must be above 0"
        ));
    }
    Ok(())
}

fn finite_above_zero(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

fn finite_not_negative(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

fn lora(path: &str, l: RawLora, out: &mut LoraConfig) -> Result<(), ConfigError> {
    let rule = "must be >= 0";
    set_checked(
        path,
        "load_ms",
        l.load_ms,
        &mut out.load_ms,
        finite_not_negative,
        rule,
    )?;
    set_checked(
        path,
        "stray_ms",
        l.stray_ms,
        &mut out.stray_ms,
        finite_not_negative,
        rule,
    )
}

fn predict(path: &str, p: RawPredict, out: &mut PredictConfig) -> Result<(), ConfigError> {
    set_checked(
        path,
        "chars_per_token",
        p.chars_per_token,
        &mut out.chars_per_token,
        finite_above_zero,
        "must be > 0",
    )?;
    set_checked(
        path,
        "prior_ms_per_token",
        p.prior_ms_per_token,
        &mut out.prior_ms_per_token,
        finite_above_zero,
        "must be > 0",
    )?;
    set_checked(
        path,
        "prior_base_ms",
        p.prior_base_ms,
        &mut out.prior_base_ms,
        finite_not_negative,
        "must be >= 0",
    )
}

fn saturation(path: &str, s: RawSaturation, out: &mut Saturation) -> Result<(), ConfigError> {
    set_checked(
        path,
        "queue_threshold",
        s.queue_threshold,
        &mut out.queue_threshold,
        finite_above_zero,
        "must be > 0",
    )?;
    set_checked(
        path,
        "kv_threshold",
        s.kv_threshold,
        &mut out.kv_threshold,
        |k| k.is_finite() && k > 0.0 && k <= 1.0,
        "must be in (0, 1]",
    )?;
    set_checked(
        path,
        "critical_factor",
        s.critical_factor,
        &mut out.critical_factor,
        |c| c.is_finite() && (c == 0.0 || c >= 1.0),
        "must be 0 (never) or >= 1",
    )
}

fn prefix(path: &str, p: RawPrefix, out: &mut PrefixConfig) -> Result<(), ConfigError> {
    set_checked(
        path,
        "block_chars",
        p.block_chars,
        &mut out.block_chars,
        |b| (4..=65_536).contains(&b),
        "must be in 4..=65536",
    )?;
    set_checked(
        path,
        "max_blocks",
        p.max_blocks,
        &mut out.max_blocks,
        |m| m <= 4096,
        "must be at most 4096 (0 disables)",
    )?;
    set_checked(
        path,
        "index_slots",
        p.index_slots,
        &mut out.index_slots,
        |s| (16..=4_194_304).contains(&s),
        "must be in 16..=4194304",
    )?;
    let per_page = |n: usize| (1..=255).contains(&n);
    set_checked(
        path,
        "page_blocks",
        p.page_blocks,
        &mut out.page_blocks,
        per_page,
        "must be in 1..=255",
    )?;
    set_checked(
        path,
        "entries_per_page",
        p.entries_per_page,
        &mut out.entries_per_page,
        per_page,
        "must be in 1..=255",
    )
}
