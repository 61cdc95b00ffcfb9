//! The `rewrites` section: canary and weighted model rewrites ([`crate::rewrite`]), each
//! target resolved to the pool that serves it.

use std::collections::HashMap;

use super::check::err;
use super::raw::{RawRewrite, RawTarget};
use super::resolved::{ModelRoute, PoolConfig};
use super::ConfigError;
use crate::rewrite::{Rewrites, Rule, Sticky, Target};

/// Largest weight of a rewrite target (weights are relative).
pub const MAX_REWRITE_WEIGHT: u32 = 1_000_000;

/// Checks the rules and resolves each target's pool: a configured model name (its pool and
/// adapter flag), or a `pool` that is configured.
pub(super) fn rewrites(
    raw: &[RawRewrite],
    pools: &[PoolConfig],
    models: &HashMap<String, ModelRoute>,
) -> Result<Rewrites, ConfigError> {
    let mut rules: Vec<Rule> = Vec::with_capacity(raw.len());
    for (i, r) in raw.iter().enumerate() {
        let path = format!("rewrites[{i}]");
        if r.model.is_empty() {
            return err(format!("{path}.model: must not be empty"));
        }
        if rules.iter().any(|q| q.model == r.model) {
            return err(format!(
                "{path}.model: {:?} already has a rule (one rule per model name)",
                r.model
            ));
        }
        if r.targets.is_empty() {
            return err(format!("{path}.targets: at least one target is needed"));
        }
        let sticky = sticky(&path, r.sticky.as_deref())?;
        let mut targets = Vec::with_capacity(r.targets.len());
        for (j, t) in r.targets.iter().enumerate() {
            targets.push(target(&format!("{path}.targets[{j}]"), t, pools, models)?);
        }
        if targets.iter().all(|t| t.weight == 0) {
            return err(format!(
                "{path}.targets: the weights sum to 0; at least one must be above 0"
            ));
        }
        rules.push(Rule {
            model: r.model.clone(),
            targets,
            sticky,
            salt: 0,
        });
    }
    Ok(Rewrites { rules })
}

fn sticky(path: &str, sticky: Option<&str>) -> Result<Sticky, ConfigError> {
    match sticky {
        None | Some("none") => Ok(Sticky::None),
        Some("conversation") => Ok(Sticky::Conversation),
        Some(o) => err(format!(
            "{path}.sticky: {o:?} is not one of none, conversation"
        )),
    }
}

/// One target at `path`: its weight (default 1) checked, its pool and adapter flag resolved.
fn target(
    path: &str,
    t: &RawTarget,
    pools: &[PoolConfig],
    models: &HashMap<String, ModelRoute>,
) -> Result<Target, ConfigError> {
    if t.model.is_empty() {
        return err(format!("{path}.model: must not be empty"));
    }
    let weight = t.weight.unwrap_or(1);
    if weight > MAX_REWRITE_WEIGHT {
        return err(format!(
            "{path}.weight: {weight} must be in 0..={MAX_REWRITE_WEIGHT}"
        ));
    }
    let route = models.get(&t.model);
    let (pool, adapter) = match (&t.pool, route) {
        (Some(name), _) => {
            let Some(p) = pools.iter().position(|p| &p.name == name) else {
                return err(format!("{path}.pool: {name:?} is not a configured pool"));
            };
            // The served name's own entry says whether it is an adapter there.
            let adapter = route.is_some_and(|m| m.pool == p && m.adapter);
            (p, adapter)
        }
        (None, Some(m)) => (m.pool, m.adapter),
        (None, None) => {
            return err(format!(
                "{path}.model: {:?} is not a configured model name; list it in a \
                 pool's models or adapters, or give the target a pool",
                t.model
            ))
        }
    };
    Ok(Target {
        model: t.model.clone(),
        pool,
        adapter,
        weight,
    })
}

/// Keys every rule's sticky draw by the snapshot secret ([`crate::rewrite::sticky_salt`]),
/// which every replica shares and no client knows.
pub(super) fn salt(rewrites: &mut Rewrites, secret: &str) {
    let salt = crate::rewrite::sticky_salt(secret);
    for rule in &mut rewrites.rules {
        rule.salt = salt;
    }
}
