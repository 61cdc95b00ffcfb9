//! The model rewrite rules the sidecar sends in every snapshot (the snapshot's rewrites
//! section, `llm_router_snapshot::rewrites`), so a canary's weight changes in every gateway
//! replica's filter with the next push: no filter configuration change, no Envoy reload.
//!
//! Sources, in precedence order (the first rule matching a model name wins, as in llm-d):
//! 1. the `rewrites.rules` of the configuration file, re-read while the sidecar runs
//!    (`rewrites.reload_ms`; a file that no longer validates keeps the last rules, logged);
//! 2. with `rewrites.kubernetes`, the `InferenceModelRewrite` objects (`llm-d.ai/v1alpha2`)
//!    whose `spec.poolRef.name` is one of the sidecar's pools, oldest object first (llm-d's
//!    precedence), followed live (`crate::kube`).
//!
//! Rules are written in the `InferenceModelRewrite` shape: `matches[].model {type: Exact,
//! value}`, `targets[] {modelRewrite, weight}`, plus `sticky: none | conversation` (an
//! extension: the filter's per-conversation draw). A rule with several matches becomes one
//! snapshot rule per model name.
//!
//! The snapshot carries a rewrites section only while a source gives rules: the file's
//! `rewrites.rules` when present (`rules: []` is an empty section, which turns the filter's
//! configured rules off), the objects' while at least one names a pool of the sidecar. Without
//! either (no `rewrites` section, no `rules`, every object deleted) it carries none and the
//! filter applies its own configured rules.
//!
//! This module is the rules' shape and checks (a leaf); the `rewrites:` section is
//! `crate::config::RewritesConfig`, the running sources `crate::sidecar` (file) and
//! `crate::kube` (objects).

use llm_router_snapshot::{
    RewriteRule, RewriteSticky, RewriteTarget, Snapshot, MAX_REWRITE_RULES, MAX_REWRITE_TARGETS,
};
use serde::Deserialize;
use std::collections::BTreeSet;

/// One rule, as `InferenceModelRewrite.spec.rules[]` spells it (plus `sticky`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuleSpec {
    /// The model names the rule applies to. Empty (llm-d: every model) is not supported: the
    /// filter matches exact names only.
    #[serde(default)]
    pub matches: Vec<MatchSpec>,
    pub targets: Vec<TargetSpec>,
    /// `none` (default: per request, weighted random) or `conversation`.
    #[serde(default)]
    pub sticky: Option<String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MatchSpec {
    pub model: ModelMatch,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelMatch {
    /// `Exact` (the default and the only type).
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    pub value: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TargetSpec {
    /// The served model name requests are rewritten to.
    pub model_rewrite: String,
    /// Relative weight; given for every target of a rule or for none (then all equal).
    #[serde(default)]
    pub weight: Option<u32>,
}

/// Checks rules as the filter will need them; the error names the rule (`{at}[i]...`).
pub fn check_rules(at: &str, rules: &[RuleSpec]) -> Result<(), String> {
    for (i, r) in rules.iter().enumerate() {
        let at = format!("{at}[{i}]");
        if r.matches.is_empty() {
            return Err(format!(
                "{at}.matches: give at least one model (rules for every model are not supported)"
            ));
        }
        for (j, m) in r.matches.iter().enumerate() {
            if m.model.kind.as_deref().is_some_and(|k| k != "Exact") {
                return Err(format!(
                    "{at}.matches[{j}].model.type: only Exact is supported"
                ));
            }
            check_name(&format!("{at}.matches[{j}].model.value"), &m.model.value)?;
        }
        if r.targets.is_empty() || r.targets.len() > MAX_REWRITE_TARGETS {
            return Err(format!(
                "{at}.targets: give 1 to {MAX_REWRITE_TARGETS} targets"
            ));
        }
        for (j, t) in r.targets.iter().enumerate() {
            check_name(&format!("{at}.targets[{j}].modelRewrite"), &t.model_rewrite)?;
        }
        let weighted = r.targets.iter().filter(|t| t.weight.is_some()).count();
        if weighted != 0 && weighted != r.targets.len() {
            return Err(format!(
                "{at}.targets: give a weight to every target or to none"
            ));
        }
        sticky(r.sticky.as_deref()).ok_or_else(|| {
            format!(
                "{at}.sticky: {:?} is not one of none, conversation",
                r.sticky
            )
        })?;
    }
    Ok(())
}

fn check_name(at: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 255 {
        return Err(format!("{at}: must be 1 to 255 bytes"));
    }
    Ok(())
}

fn sticky(s: Option<&str>) -> Option<RewriteSticky> {
    match s {
        None | Some("none") => Some(RewriteSticky::None),
        Some("conversation") => Some(RewriteSticky::Conversation),
        Some(_) => None,
    }
}

/// The snapshot rules of `specs` (checked by [`check_rules`]), in order, appended to `out`: one
/// per matched model name not already ruled (the first rule matching a name wins), at most
/// [`MAX_REWRITE_RULES`].
pub fn append_snapshot_rules(specs: &[RuleSpec], out: &mut Vec<RewriteRule>) {
    for spec in specs {
        let targets: Vec<RewriteTarget> = spec
            .targets
            .iter()
            .map(|t| RewriteTarget {
                model: t.model_rewrite.clone(),
                weight: t.weight.unwrap_or(1),
            })
            .collect();
        let sticky = sticky(spec.sticky.as_deref()).unwrap_or_default();
        for m in &spec.matches {
            if out.len() >= MAX_REWRITE_RULES {
                tracing::warn!(
                    max = MAX_REWRITE_RULES,
                    "more rewrite rules than a snapshot carries; keeping the first"
                );
                return;
            }
            if out.iter().any(|r| r.model == m.model.value) {
                continue;
            }
            out.push(RewriteRule {
                model: m.model.value.clone(),
                sticky,
                targets: targets.clone(),
            });
        }
    }
}

/// The target names of `snap`'s rewrite rules that no pool of the snapshot serves as far as
/// the sidecar can tell: not in any pool's `models`, not an adapter any pod reports. Sorted,
/// each once. The filter drops a rule whose target its configuration does not resolve either
/// (unless it lists the name, e.g. an adapter no pod has loaded yet), so these are most likely
/// typos or a canary whose pool is not there yet.
pub fn unknown_targets(snap: &Snapshot) -> Vec<String> {
    let Some(rules) = snap.rewrites.as_deref() else {
        return Vec::new();
    };
    let mut unknown: BTreeSet<&str> = rules
        .iter()
        .flat_map(|r| &r.targets)
        .map(|t| t.model.as_str())
        .filter(|name| {
            !snap
                .pools
                .iter()
                .any(|p| p.models.iter().any(|m| m == name))
        })
        .collect();
    // Adapters only for the names no pool lists: one pass over every pod's lists (which may
    // hold thousands of names), not one per target.
    if !unknown.is_empty() {
        for l in snap
            .pools
            .iter()
            .flat_map(|p| &p.pods)
            .filter_map(|p| p.lora.as_ref())
        {
            for a in l.running.iter().chain(&l.waiting) {
                unknown.remove(a.as_str());
            }
        }
    }
    unknown.into_iter().map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    /// A target is known when a pool lists it as a model or a pod reports it as an adapter
    /// (running or waiting); each unknown name counts once, however many rules name it.
    #[test]
    fn targets_no_pool_serves_are_unknown() {
        use llm_router_snapshot::{LoraState, Pod, Pool};
        let rule = |model: &str, targets: &[&str]| RewriteRule {
            model: model.into(),
            sticky: RewriteSticky::None,
            targets: targets
                .iter()
                .map(|t| RewriteTarget {
                    model: (*t).into(),
                    weight: 1,
                })
                .collect(),
        };
        let mut snap = Snapshot {
            pools: vec![Pool {
                name: "llama".into(),
                models: vec!["base".into()],
                pods: vec![Pod {
                    lora: Some(LoraState {
                        running: vec!["loaded".into()],
                        waiting: vec!["queued".into()],
                        max_loras: 2,
                    }),
                    ..Pod::default()
                }],
                ..Pool::default()
            }],
            ..Snapshot::default()
        };
        assert!(unknown_targets(&snap).is_empty(), "no section");
        snap.rewrites = Some(vec![
            rule("chat", &["base", "typo", "loaded"]),
            rule("chat-2", &["queued", "typo", "elsewhere"]),
        ]);
        assert_eq!(unknown_targets(&snap), ["elsewhere", "typo"]);
        snap.rewrites = Some(vec![rule("chat", &["base"])]);
        assert!(unknown_targets(&snap).is_empty());
    }

    const RULES: &str = r#"
rules:
  - matches: [{model: {type: Exact, value: chat}}, {model: {value: chat-2}}]
    targets: [{modelRewrite: stable, weight: 100}, {modelRewrite: canary, weight: 0}]
    sticky: conversation
  - matches: [{model: {value: chat}}]
    targets: [{modelRewrite: ignored}]
  - matches: [{model: {value: alias}}]
    targets: [{modelRewrite: a}, {modelRewrite: b}]
"#;

    /// The InferenceModelRewrite shape becomes one snapshot rule per matched name; the first
    /// rule matching a name wins; absent weights are all 1.
    #[test]
    fn rules_in_the_inference_model_rewrite_shape_become_snapshot_rules() {
        let section: crate::config::RewritesConfig = serde_yaml::from_str(RULES).unwrap();
        let rules = section.rules.as_deref().unwrap();
        check_rules("rewrites.rules", rules).unwrap();
        let mut out = Vec::new();
        append_snapshot_rules(rules, &mut out);
        let names: Vec<&str> = out.iter().map(|r| r.model.as_str()).collect();
        assert_eq!(names, ["chat", "chat-2", "alias"]);
        assert_eq!(out[0].sticky, RewriteSticky::Conversation);
        let weights = |r: &RewriteRule| -> Vec<(String, u32)> {
            r.targets
                .iter()
                .map(|t| (t.model.clone(), t.weight))
                .collect()
        };
        assert_eq!(
            weights(&out[0]),
            [("stable".into(), 100), ("canary".into(), 0)]
        );
        assert_eq!(weights(&out[2]), [("a".into(), 1), ("b".into(), 1)]);
        assert_eq!(section.reload_ms, 500);
    }

    #[test]
    fn rules_the_filter_cannot_use_are_refused_by_name() {
        let bad = |yaml: &str| {
            let section: crate::config::RewritesConfig = serde_yaml::from_str(yaml).unwrap();
            check_rules("rewrites.rules", section.rules.as_deref().unwrap()).unwrap_err()
        };
        assert!(
            bad("rules: [{targets: [{modelRewrite: a}]}]").contains("rewrites.rules[0].matches")
        );
        assert!(bad(
            "rules: [{matches: [{model: {type: Regex, value: a}}], targets: [{modelRewrite: a}]}]"
        )
        .contains("only Exact"));
        assert!(bad("rules: [{matches: [{model: {value: a}}], targets: [{modelRewrite: a, weight: 1}, {modelRewrite: b}]}]")
            .contains("every target or to none"));
        assert!(bad(
            "rules: [{matches: [{model: {value: a}}], targets: [{modelRewrite: a}], sticky: pod}]"
        )
        .contains("sticky"));
        assert!(bad("rules: [{matches: [{model: {value: a}}], targets: []}]").contains("targets"));
    }
}
