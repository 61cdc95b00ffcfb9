//! The running sources of the rewrite rules (`crate::rewrites`): the configuration file,
//! re-read while the sidecar runs, and the `InferenceModelRewrite` objects `crate::kube`
//! follows; combined in that order into the rules every snapshot carries.

use std::path::PathBuf;
use std::time::Duration;

use llm_router_snapshot::RewriteRule;
use tokio::sync::watch;

use crate::config::Config;
use crate::rewrites::{append_snapshot_rules, RuleSpec};

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
        match Config::load(&path) {
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
