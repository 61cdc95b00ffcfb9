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
//! snapshot rule per model name. Without a `rewrites` section the snapshot carries none and the
//! filter applies its own configured rules.

use std::path::PathBuf;
use std::time::Duration;

use llm_router_snapshot::{
    RewriteRule, RewriteSticky, RewriteTarget, MAX_REWRITE_RULES, MAX_REWRITE_TARGETS,
};
use serde::Deserialize;
use tokio::sync::watch;

/// The `rewrites:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RewritesConfig {
    /// Rules in the `InferenceModelRewrite` `spec.rules` shape; the first matching rule wins.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    /// Re-read the rules from the configuration file this often (ms); 0 = only at start.
    #[serde(default = "d_reload_ms")]
    pub reload_ms: u64,
    /// Also follow the `InferenceModelRewrite` objects of the sidecar's pools.
    #[serde(default)]
    pub kubernetes: Option<crate::config::RewriteWatchConfig>,
}

fn d_reload_ms() -> u64 {
    500
}

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

/// The rules the configuration's `rewrites` section gives (`None`: no section).
pub fn configured_rules(cfg: &crate::config::Config) -> Option<Vec<RewriteRule>> {
    let section = cfg.rewrites.as_ref()?;
    let mut rules = Vec::new();
    append_snapshot_rules(&section.rules, &mut rules);
    Some(rules)
}

/// Re-reads the configuration file at `path` every `every` and publishes its rules on `tx`
/// when they change. A file that does not load or validate keeps the rules in force (logged
/// once per new error), so a typo never drops a canary's rules.
pub async fn follow_file(
    path: PathBuf,
    every: Duration,
    tx: watch::Sender<Vec<RuleSpec>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last_error = String::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        match crate::config::Config::load(&path) {
            Ok(cfg) => {
                last_error.clear();
                let rules = cfg.rewrites.map(|r| r.rules).unwrap_or_default();
                tx.send_if_modified(|old| {
                    let changed = *old != rules;
                    if changed {
                        tracing::info!(rules = rules.len(), file = %path.display(), "rewrite rules changed");
                        *old = rules;
                    }
                    changed
                });
            }
            Err(e) => {
                let e = e.to_string();
                if e != last_error {
                    tracing::warn!(error = %e, "the configuration file no longer loads; keeping the rewrite rules in force");
                    last_error = e;
                }
            }
        }
    }
}

/// The rule sources of a running sidecar: the configuration file's rules and, when followed,
/// the `InferenceModelRewrite` objects' (oldest first), combined in that order when one changes.
pub struct RewriteSources {
    file: watch::Receiver<Vec<RuleSpec>>,
    kube: Option<watch::Receiver<Vec<RuleSpec>>>,
    current: Vec<RewriteRule>,
}

impl RewriteSources {
    pub fn new(
        file: watch::Receiver<Vec<RuleSpec>>,
        kube: Option<watch::Receiver<Vec<RuleSpec>>>,
    ) -> RewriteSources {
        let mut s = RewriteSources {
            file,
            kube,
            current: Vec::new(),
        };
        s.combine();
        s
    }

    /// The snapshot rules in force now (combined again only when a source changed).
    pub fn current(&mut self) -> &[RewriteRule] {
        let changed = |rx: &watch::Receiver<Vec<RuleSpec>>| rx.has_changed().unwrap_or(false);
        if changed(&self.file) || self.kube.as_ref().is_some_and(changed) {
            self.combine();
        }
        &self.current
    }

    fn combine(&mut self) {
        let mut out = Vec::new();
        append_snapshot_rules(&self.file.borrow_and_update(), &mut out);
        if let Some(kube) = &mut self.kube {
            append_snapshot_rules(&kube.borrow_and_update(), &mut out);
        }
        self.current = out;
    }
}

/// Starts the sources `cfg.rewrites` names (tasks in `tasks`); `None` without the section.
pub fn start(
    cfg: &crate::config::Config,
    shutdown: &watch::Receiver<bool>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<Option<RewriteSources>, crate::kube::KubeError> {
    let Some(section) = &cfg.rewrites else {
        return Ok(None);
    };
    let (file_tx, file_rx) = watch::channel(section.rules.clone());
    if let (Some(path), true) = (&cfg.path, section.reload_ms > 0) {
        tasks.push(tokio::spawn(follow_file(
            path.clone(),
            Duration::from_millis(section.reload_ms),
            file_tx,
            shutdown.clone(),
        )));
    }
    let kube = match &section.kubernetes {
        Some(k) => {
            let pools: Vec<String> = cfg.pools.iter().map(|p| p.name.clone()).collect();
            Some(crate::kube::start_rewrite_watch(
                k,
                pools,
                shutdown.clone(),
            )?)
        }
        None => None,
    };
    Ok(Some(RewriteSources::new(file_rx, kube)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

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
        let section: RewritesConfig = serde_yaml::from_str(RULES).unwrap();
        check_rules("rewrites.rules", &section.rules).unwrap();
        let mut out = Vec::new();
        append_snapshot_rules(&section.rules, &mut out);
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
            let section: RewritesConfig = serde_yaml::from_str(yaml).unwrap();
            check_rules("rewrites.rules", &section.rules).unwrap_err()
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
