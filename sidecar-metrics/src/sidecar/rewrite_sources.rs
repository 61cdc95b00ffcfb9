//! The running sources of the rewrite rules (`crate::rewrites`): the configuration file,
//! re-read while the sidecar runs, and the `InferenceModelRewrite` objects `crate::kube`
//! follows; combined in that order into the rules every snapshot carries. A source that gives
//! no rules (`None`: the file has no `rewrites.rules`, no object names one of the pools) is not
//! an empty one: with neither giving rules the snapshots carry no rewrites section, so the
//! filter's configured rules apply.

use std::path::PathBuf;
use std::time::Duration;

use llm_router_snapshot::RewriteRule;
use tokio::sync::watch;

use crate::config::Config;
use crate::rewrites::{append_snapshot_rules, RuleSpec};

/// Re-reads the configuration file at `path` every `every` and publishes its rules on `tx`
/// when they change (`None` once the file has no `rewrites.rules`). A file that does not load
/// or validate keeps the rules in force (logged once per new error), so a typo never drops a
/// canary's rules.
pub async fn follow_file(
    path: PathBuf,
    every: Duration,
    tx: watch::Sender<Option<Vec<RuleSpec>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last_error = String::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        match Config::load(&path) {
            Ok(cfg) => {
                last_error.clear();
                let rules = cfg.rewrites.and_then(|r| r.rules);
                tx.send_if_modified(|old| {
                    let changed = *old != rules;
                    if changed {
                        match &rules {
                            Some(r) => tracing::info!(rules = r.len(), file = %path.display(), "rewrite rules changed"),
                            None => tracing::info!(file = %path.display(), "the file no longer gives rewrite rules"),
                        }
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

/// Rules one source gives: `None` when it gives none (not even an empty list).
type Rules = watch::Receiver<Option<Vec<RuleSpec>>>;

/// The rule sources of a running sidecar: the configuration file's rules and, when followed,
/// the `InferenceModelRewrite` objects' (oldest first), combined in that order when one changes.
pub struct RewriteSources {
    file: Rules,
    kube: Option<Rules>,
    current: Option<Vec<RewriteRule>>,
}

impl RewriteSources {
    pub fn new(file: Rules, kube: Option<Rules>) -> RewriteSources {
        let mut s = RewriteSources {
            file,
            kube,
            current: None,
        };
        s.combine();
        s
    }

    /// The snapshot rules in force now (combined again only when a source changed); `None`
    /// while no source gives rules: the snapshot then carries no rewrites section.
    pub fn current(&mut self) -> Option<&[RewriteRule]> {
        let changed = |rx: &Rules| rx.has_changed().unwrap_or(false);
        if changed(&self.file) || self.kube.as_ref().is_some_and(changed) {
            self.combine();
        }
        self.current.as_deref()
    }

    fn combine(&mut self) {
        let mut out: Option<Vec<RewriteRule>> = None;
        let sources = std::iter::once(&mut self.file).chain(self.kube.as_mut());
        for rx in sources {
            if let Some(rules) = &*rx.borrow_and_update() {
                append_snapshot_rules(rules, out.get_or_insert_with(Vec::new));
            }
        }
        self.current = out;
    }
}

/// Starts the sources `cfg.rewrites` names (tasks in `tasks`); `None` without the section.
pub fn start(
    cfg: &Config,
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
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rule(model: &str) -> RuleSpec {
        let yaml =
            format!("{{matches: [{{model: {{value: {model}}}}}], targets: [{{modelRewrite: t}}]}}");
        serde_yaml::from_str(&yaml).unwrap()
    }

    fn models(s: &mut RewriteSources) -> Option<Vec<String>> {
        s.current()
            .map(|rules| rules.iter().map(|r| r.model.clone()).collect())
    }

    /// No source giving rules is no section; an empty list is an empty section; the file's
    /// rules come before the objects'.
    #[test]
    fn sources_that_give_no_rules_give_no_section() {
        let (file_tx, file_rx) = watch::channel(None);
        let (kube_tx, kube_rx) = watch::channel(None);
        let mut s = RewriteSources::new(file_rx, Some(kube_rx));
        assert_eq!(models(&mut s), None);
        kube_tx.send_replace(Some(vec![]));
        assert_eq!(models(&mut s), Some(vec![]));
        kube_tx.send_replace(Some(vec![rule("b")]));
        file_tx.send_replace(Some(vec![rule("a")]));
        assert_eq!(models(&mut s), Some(vec!["a".into(), "b".into()]));
        kube_tx.send_replace(None);
        assert_eq!(models(&mut s), Some(vec!["a".into()]));
        file_tx.send_replace(None);
        assert_eq!(models(&mut s), None);
    }
}
