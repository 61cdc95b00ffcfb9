//! The `rewrites` section: canary and weighted model rewrites ([`crate::rewrite`]), each
//! target resolved to the pool that serves it.

use std::collections::HashMap;

use super::check::err;
use super::raw::{RawRewrite, RawTarget};
use super::resolved::{ModelRoute, PoolConfig};
use super::{Config, ConfigError};
use crate::rewrite::{Rewrites, Rule, Sticky, Target};
use llm_router_snapshot::Snapshot;

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
        if rules.iter().any(|q| q.model == r.model) {
            return err(format!(
                "{path}.model: {:?} already has a rule (one rule per model name)",
                r.model
            ));
        }
        rules.push(rule(&path, r, pools, models)?);
    }
    Ok(Rewrites { rules })
}

/// One rule at `path`, checked and resolved (its salt is set later, from the secret).
fn rule(
    path: &str,
    r: &RawRewrite,
    pools: &[PoolConfig],
    models: &HashMap<String, ModelRoute>,
) -> Result<Rule, ConfigError> {
    if r.model.is_empty() {
        return err(format!("{path}.model: must not be empty"));
    }
    if r.targets.is_empty() {
        return err(format!("{path}.targets: at least one target is needed"));
    }
    let sticky = sticky(path, r.sticky.as_deref())?;
    let mut targets = Vec::with_capacity(r.targets.len());
    for (j, t) in r.targets.iter().enumerate() {
        targets.push(target(&format!("{path}.targets[{j}]"), t, pools, models)?);
    }
    if targets.iter().all(|t| t.weight == 0) {
        return err(format!(
            "{path}.targets: the weights sum to 0; at least one must be above 0"
        ));
    }
    Ok(Rule {
        model: r.model.clone(),
        targets,
        sticky,
        salt: 0,
    })
}

/// A rule of the snapshot's rewrites section that this configuration cannot apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedRewrite {
    /// The requested model name the rule matches.
    pub model: String,
    /// Why, naming the field at fault (an unknown target: `... targets[1].model: "x" is not a
    /// configured model name ...`).
    pub reason: String,
}

/// Resolves the rules a snapshot carries ([`llm_router_snapshot::RewriteRule`]) exactly as
/// configured rules are: each target must be a model or adapter name a configured pool serves
/// (or, as a configured target's `pool` says, a model the snapshot lists for a configured
/// pool: a canary pool declared without `models`), the weights pass the same checks, sticky
/// rules are salted by the same secret. A rule that does not resolve is left out and
/// reported, so one bad rule never costs the others and nothing is left to fail per request.
pub fn resolve_snapshot_rewrites(
    snapshot: &Snapshot,
    config: &Config,
) -> (Rewrites, Vec<DroppedRewrite>) {
    let mut resolved = Rewrites::default();
    let mut dropped = Vec::new();
    for r in snapshot.rewrites.iter().flatten() {
        let raw = RawRewrite {
            model: r.model.clone(),
            targets: r
                .targets
                .iter()
                .map(|t| RawTarget {
                    model: t.model.clone(),
                    weight: Some(t.weight),
                    pool: serving_pool(&t.model, snapshot, config),
                })
                .collect(),
            sticky: Some(r.sticky.name().to_owned()),
        };
        let path = format!("snapshot rewrite {:?}", r.model);
        match rule(&path, &raw, &config.pools, &config.models) {
            Ok(rule) => resolved.rules.push(rule),
            Err(e) => dropped.push(DroppedRewrite {
                model: r.model.clone(),
                reason: e.0,
            }),
        }
    }
    if !resolved.is_empty() {
        salt(&mut resolved, &config.snapshot.secret);
    }
    (resolved, dropped)
}

/// The configured pool a snapshot target that is not a configured model name is served by:
/// the first configured pool whose snapshot entry lists `model`. `None` when the name is
/// configured (its own entry says where) or no configured pool serves it.
fn serving_pool(model: &str, snapshot: &Snapshot, config: &Config) -> Option<String> {
    if config.models.contains_key(model) {
        return None;
    }
    snapshot
        .pools
        .iter()
        .find(|p| config.pool(&p.name).is_some() && p.models.iter().any(|m| m == model))
        .map(|p| p.name.clone())
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
