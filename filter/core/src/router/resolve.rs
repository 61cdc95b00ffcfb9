use super::fleet::Fleet;
use super::{Context, Router};
use crate::config::PoolConfig;
use crate::request::ParsedRequest;
use crate::rewrite::Rewrites;

/// What a request's model name resolves to ([`Router::resolve`]).
pub(super) struct Resolved {
    pub(super) pool: PoolConfig,
    pub(super) rewrite: Option<String>,
    pub(super) adapter: bool,
    pub(super) served_model: Option<String>,
}

impl Router {
    /// The rewrite rules in force: the snapshot's when it carries a rewrites section (the
    /// sidecar manages them, so a weight change needs no configuration change), else the
    /// configured ones.
    pub fn rewrites<'r>(&'r self, fleet: Option<&'r Fleet>) -> &'r Rewrites {
        fleet
            .and_then(|f| f.rewrites.as_ref())
            .unwrap_or(&self.config.rewrites)
    }

    /// A request's priority from its priority and objective headers
    /// ([`crate::config::Config::request_priority`]): the objective's priority is the
    /// snapshot's when it carries an objectives section (the sidecar follows llm-d's
    /// `InferenceObjective` objects, so a change needs no configuration change), else the
    /// configured `objectives`'. An objective the section does not list is standard (0).
    pub fn request_priority(
        &self,
        fleet: Option<&Fleet>,
        priority: Option<&str>,
        objective: Option<&str>,
    ) -> i32 {
        match fleet.and_then(|f| f.snapshot.objectives.as_deref()) {
            Some(list) => self
                .config
                .request_priority_with(priority, objective, |name| {
                    list.iter().find(|o| o.name == name).map(|o| o.priority)
                }),
            None => self.config.request_priority(priority, objective),
        }
    }

    /// Resolves a request's model name: the pool settings, the body's new `model` (an alias's
    /// rewrite, or the target a rewrite rule chose), whether the served name is an adapter, and
    /// the served name when a rewrite rule chose it ([`crate::rewrite`]; drawn from `ctx.tie`,
    /// or the conversation for sticky rules).
    pub(super) fn resolve<'r>(
        &'r self,
        req: &ParsedRequest<'_>,
        ctx: Context,
        fleet: Option<&'r Fleet>,
    ) -> Option<Resolved> {
        let model = req.model.as_ref();
        let rewrites = self.rewrites(fleet);
        if let Some(rule) = rewrites.rule(model) {
            let target = rule.choose(req, ctx.tie)?;
            let pool = self.config.pools.get(target.pool)?.clone();
            // A target that is itself an alias is served under the alias' rewrite.
            let served = self
                .config
                .models
                .get(&target.model)
                .filter(|m| m.pool == target.pool)
                .and_then(|m| m.rewrite.clone())
                .unwrap_or_else(|| target.model.clone());
            return Some(Resolved {
                pool,
                rewrite: (served != model).then(|| served.clone()),
                adapter: target.adapter,
                served_model: Some(served),
            });
        }
        if let Some(route) = self.config.models.get(model) {
            let pool = self.config.pools.get(route.pool)?.clone();
            return Some(Resolved {
                pool,
                rewrite: route.rewrite.clone(),
                adapter: route.adapter,
                served_model: None,
            });
        }
        // A rewrite target that no pool's `models` lists is served only through its rule.
        if rewrites.is_target(model) {
            return None;
        }
        let fleet = fleet?;
        let &(i, adapter) = fleet.models.get(model)?;
        let sp = fleet.snapshot.pools.get(i)?;
        let pool = match self.config.pool(&sp.name) {
            Some(p) => p.clone(),
            None => PoolConfig {
                name: sp.name.clone(),
                cluster: sp.cluster.clone(),
                ..self.config.default_pool.clone()
            },
        };
        Some(Resolved {
            pool,
            rewrite: None,
            adapter,
            served_model: None,
        })
    }
}
