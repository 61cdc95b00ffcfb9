use super::fleet::{Fleet, PoolIndex};
use super::resolve::Resolved;
use super::{Context, Route, RouteMode, Router};
use crate::candidate::Mode;
use crate::config::{OnMissing, OnStale, PoolConfig};
use crate::inflight::{self, Table};
use crate::reject::Rejection;
use crate::request::ParsedRequest;
use crate::store::SharedStore;

/// The pool as one decision sees it.
pub(super) struct PoolView<'f> {
    pub(super) pool: PoolConfig,
    pub(super) rewrite: Option<String>,
    pub(super) adapter: bool,
    /// The served name a rewrite rule chose: its own prefix cache, its own adapter home.
    pub(super) served_model: Option<String>,
    pub(super) sp: &'f llm_router_snapshot::Pool,
    /// In-flight counts when the snapshot was accepted.
    pub(super) baseline: Option<&'f Table>,
    pub(super) derived: Option<&'f PoolIndex>,
    pub(super) mode: Mode,
    pub(super) live: Table,
    pub(super) live_cas: Option<u32>,
}

impl PoolView<'_> {
    /// The model name the request is served as (a rewrite rule's target, else its own).
    /// The prefix-index id of snapshot pod `i` (0 without the snapshot's index).
    pub(super) fn pod_id(&self, i: usize) -> u32 {
        self.derived
            .and_then(|d| d.pod_ids.get(i).copied())
            .unwrap_or(0)
    }

    pub(super) fn model<'a>(&'a self, req: &'a ParsedRequest<'_>) -> &'a str {
        self.served_model.as_deref().unwrap_or(req.model.as_ref())
    }
}

#[allow(clippy::large_enum_variant)] // one per decision, on the stack
pub(super) enum Viewed<'f> {
    Ready(PoolView<'f>),
    Fallback(Box<Route>),
}

impl Router {
    /// Stage 2: the pool's state as of the snapshot and the live load table, or the fallback
    /// decision (no snapshot, pool not listed, stale snapshot per `on_stale`).
    pub(super) fn pool_view<'f, S: SharedStore>(
        &self,
        store: &S,
        fleet: Option<&'f Fleet>,
        target: Resolved,
        ctx: Context,
    ) -> Result<Viewed<'f>, Rejection> {
        let Resolved {
            pool,
            rewrite,
            adapter,
            served_model,
        } = target;
        let fallback = |why: &str, reject: bool| -> Result<Viewed<'f>, Rejection> {
            if reject {
                return Err(Rejection::no_endpoints(&pool.name, why));
            }
            Ok(Viewed::Fallback(Box::new(Route {
                pool: pool.name.clone(),
                cluster: pool.cluster.clone(),
                endpoints: Vec::new(),
                rewrite: rewrite.clone(),
                served_model: served_model.clone(),
                mode: RouteMode::Fallback,
                scores: Vec::new(),
                prefix_hit: false,
                lora_hit: false,
                inflight_pod: None,
                pending_tokens: 0,
                work_tokens: 0.0,
                adapter: None,
            })))
        };
        let snap = &self.config.snapshot;
        let reject_missing = snap.on_missing == OnMissing::Reject;
        let Some(fleet) = fleet else {
            return fallback("no fleet snapshot has arrived yet", reject_missing);
        };
        let Some((pool_index, sp)) = fleet
            .snapshot
            .pools
            .iter()
            .enumerate()
            .find(|(_, p)| p.name == pool.name)
        else {
            return fallback("the fleet snapshot does not list this pool", reject_missing);
        };
        let mode = if fleet.is_stale(ctx.now_ms, snap.stale_after_ms) {
            match snap.on_stale {
                OnStale::LeastInflight => Mode::LeastInflight,
                OnStale::Fallback => return fallback("", false),
                OnStale::Reject => return fallback("the fleet snapshot is stale", true),
            }
        } else {
            Mode::Full
        };
        // Read once: ranks the pods and, with its CAS token, is the base of the write in
        // [`record`].
        let (live, live_cas) = inflight::read_for_update(store, &pool.name);
        Ok(Viewed::Ready(PoolView {
            pool,
            rewrite,
            adapter,
            served_model,
            sp,
            baseline: fleet.baselines.get(pool_index),
            derived: fleet.pools.get(pool_index),
            mode,
            live,
            live_cas,
        }))
    }
}
