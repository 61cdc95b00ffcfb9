//! The decision for one request: which pool, which pods in which order, or which rejection.
//!
//! [`Router::route`] takes the configuration, the fleet as of the latest accepted snapshot, the
//! parsed request and the shared store (in-flight counts, prefix index), and returns ranked
//! endpoints or a [`Rejection`]. It knows nothing of proxy-wasm: the filter calls it with a
//! store backed by Envoy's shared data; tests call it with [`crate::store::MemoryStore`].

use crate::config::Config;
use crate::inflight::{self};
use crate::lora::{self};
use crate::reject::Rejection;
use crate::request::ParsedRequest;
use crate::store::SharedStore;

mod admit;
mod candidates;
mod features;
mod fleet;
mod rank;
mod record;
mod resolve;
mod shortlisted;
mod view;

use admit::{admit_or_wait, Admitted};
use candidates::candidates;
use features::features;
pub use fleet::Fleet;
use record::record;
#[cfg(test)]
use shortlisted::SHORTLISTED;
use view::Viewed;

/// How the endpoints were chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteMode {
    /// From fresh metrics.
    Scored,
    /// The snapshot is stale: by this proxy's in-flight counts.
    LeastInflight,
    /// No usable snapshot: no endpoint set, Envoy's fallback policy picks.
    Fallback,
}

impl RouteMode {
    pub fn name(self) -> &'static str {
        match self {
            RouteMode::Scored => "scored",
            RouteMode::LeastInflight => "least_inflight",
            RouteMode::Fallback => "fallback",
        }
    }
}

/// Where a request goes (the routing decision when it is placed, [`Decision::Routed`]): its
/// pool, cluster and endpoints best first, the model rewrite, and what was counted for it on the
/// chosen pod (in flight, pending prefill, adapter) to release when it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub pool: String,
    pub cluster: String,
    /// Best first; empty when Envoy's fallback policy should choose.
    pub endpoints: Vec<String>,
    /// New value for the body's `model`.
    pub rewrite: Option<String>,
    /// The served model name a rewrite rule chose (for the response header and the metrics);
    /// `None` when no rule matched.
    pub served_model: Option<String>,
    pub mode: RouteMode,
    /// `(address, score)` best first: the endpoints', or every candidate's when
    /// `debug_scores` is on (logs and the debug header).
    pub scores: Vec<(String, f64)>,
    /// The chosen pod probably has a cached prefix of this prompt (prefix-index match).
    pub prefix_hit: bool,
    /// An adapter request went to a pod where the adapter is resident or at home.
    pub lora_hit: bool,
    /// Pod whose in-flight count this request incremented (decrement it when the stream ends).
    pub inflight_pod: Option<String>,
    /// Prefill tokens this request added to that pod's pending work (release them at its first
    /// response byte, or when it ends without one).
    pub pending_tokens: u32,
    /// Prefill work ahead of and including this request on that pod when it was routed: with
    /// the time to its first byte, one observation of the pod's rate. NaN (no observation)
    /// when the pod was chosen on a guess of what it has cached ([`crate::replica_prior`]).
    pub work_tokens: f64,
    /// The LoRA adapter counted in flight on that pod ([`lora::note`]; report its end with
    /// [`Router::adapter_ended`]).
    pub adapter: Option<String>,
}

/// Priority and tie-break bits that come from the request's headers and the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Context {
    pub priority: i32,
    pub now_ms: u64,
    pub tie: u64,
    /// When the request's own time-to-first-token objective ends (host ms; llm-d's
    /// `x-slo-ttft-ms` from its arrival): with flow control, only pods predicted to answer
    /// by then take it ([`crate::flow::admit`]).
    pub deadline_ms: Option<u64>,
}

/// The configured router.
#[derive(Debug, Clone)]
pub struct Router {
    pub config: Config,
}

impl Router {
    pub fn new(config: Config) -> Router {
        Router { config }
    }

    /// The pool `req` goes to, if any (what its wait queue is keyed by). A rewrite rule whose
    /// targets sit in different pools draws its target from `ctx.tie` here and again when the
    /// request is dispatched: sticky rules (or one pool per rule) keep both the same.
    pub fn pool_of(
        &self,
        req: &ParsedRequest<'_>,
        ctx: Context,
        fleet: Option<&Fleet>,
    ) -> Option<String> {
        self.resolve(req, ctx, fleet).map(|r| r.pool.name)
    }

    /// Decides where `req` goes, never holding it (flow control off, or a dispatch that may not
    /// wait). On success the chosen pod's in-flight count is incremented and the prompt's blocks
    /// are recorded for it in the prefix index.
    pub fn route<S: SharedStore>(
        &self,
        store: &S,
        fleet: Option<&Fleet>,
        req: &ParsedRequest<'_>,
        ctx: Context,
    ) -> Result<Route, Rejection> {
        match self.decide(store, fleet, req, ctx, Hold::Never)? {
            Decision::Routed(r) => Ok(r),
            // Not reached: with `Hold::Never` the admission stage admits every request.
            Decision::Wait { pool } => Err(Rejection::saturated(&pool, self.config.retry_after_s)),
        }
    }

    /// The decision as a pipeline: resolve → pool view → candidates → admit or wait → features
    /// → rank → record. With [`Hold::IfFull`], a request no pod can take now
    /// ([`flow::admit`]) comes back as [`Decision::Wait`], with [`Hold::Behind`] every request
    /// does; either way one the pool would shed (sheddable in a saturated pool, standard far
    /// past it) is refused instead: sheddable requests are the first to go.
    pub fn decide<S: SharedStore>(
        &self,
        store: &S,
        fleet: Option<&Fleet>,
        req: &ParsedRequest<'_>,
        ctx: Context,
        hold: Hold,
    ) -> Result<Decision, Rejection> {
        let target = match self.resolve(req, ctx, fleet) {
            Some(t) => t,
            // Pools the configuration does not name are learnt from the snapshot: before the
            // first one any model may be theirs.
            None if fleet.is_none() && self.config.pools.is_empty() => {
                return Err(Rejection::no_snapshot_yet())
            }
            None => return Err(Rejection::model_not_found(&req.model)),
        };
        let view = match self.pool_view(store, fleet, target, ctx)? {
            Viewed::Ready(v) => v,
            Viewed::Fallback(r) => return Ok(Decision::Routed(*r)),
        };
        // A large pool's shortlist ranks exactly what scoring every pod would for the best
        // `top_k`: not for the debug scores, which list them all, nor for work queued behind
        // held work (the whole pool decides whether it waits).
        let shortlist =
            (hold != Hold::Behind && !self.config.debug_scores).then_some(self.config.top_k);
        let mut cands = candidates(store, &view, req, ctx, shortlist)?;
        let retry = (self.config.retry_after_s, self.config.retry_after_max_s);
        let kv_threshold = self.config.flow.kv_threshold;
        let mut admitted = admit_or_wait(&view, &cands, req, ctx, hold, kv_threshold, retry);
        // Flow control's admission over a shortlist is the whole pool's when every pod on it
        // fits: the pool's best pods are on it, so they fit, and ranking the fitting pods of
        // the pool gives the same best `top_k`. Otherwise a pod left off may be the best that
        // fits, or the only one with room: the whole pool is judged.
        if !cands.positions.is_empty() && !matches!(admitted, Ok(Admitted::Any)) {
            #[cfg(test)]
            REJUDGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            cands = candidates(store, &view, req, ctx, None)?;
            admitted = admit_or_wait(&view, &cands, req, ctx, hold, kv_threshold, retry);
        }
        let admitted = admitted?;
        if admitted == Admitted::Wait {
            return Ok(Decision::Wait {
                pool: view.pool.name,
            });
        }
        // Owned here: the features borrow it while `view` moves into [`record`].
        let served = view.served_model.clone();
        let model = served.as_deref().unwrap_or(req.model.as_ref());
        let (features, credits) = features(store, &view, &mut cands, req, model, ctx);
        let ranked = self.rank(&view, &cands, &features, admitted.fits())?;
        Ok(Decision::Routed(record(
            store,
            view,
            &cands,
            &credits,
            &features,
            &ranked,
            self.config.top_k,
        )))
    }

    /// The first response byte of a request routed to `pod` arrived after `ttft_ms`: its
    /// `pending` tokens are no longer queued there, and, when the timing reflects prefill (a
    /// streamed response, an embedding), `observed = Some((work_tokens, ttft_ms))` teaches the
    /// pod's rate.
    pub fn first_byte(
        &self,
        store: &impl SharedStore,
        pool: &str,
        pod: &str,
        pending: u32,
        observed: Option<(f64, f64)>,
    ) -> bool {
        inflight::first_byte(store, pool, pod, pending, observed)
    }

    /// The stream of a routed request ended: its pod has one request less in flight, and the
    /// `pending` tokens it still had (no first byte came) are released. False when the update
    /// did not land (the caller defers it: [`inflight::Ledger`]).
    pub fn finished(&self, store: &impl SharedStore, pool: &str, pod: &str, pending: u32) -> bool {
        inflight::finished(store, pool, pod, pending)
    }

    /// [`Router::finished`], with how the pod answered: a run of server errors puts the pod
    /// behind the others for a while, an answer's life teaches the pod's request life
    /// ([`inflight::finished_with`]).
    pub fn finished_with_status(
        &self,
        store: &impl SharedStore,
        pool: &str,
        pod: &str,
        pending: u32,
        answer: Answer,
    ) -> bool {
        let end = inflight::Ending {
            outcome: inflight::Outcome::of_status(answer.status),
            now_ms: answer.now_ms,
            life_ms: answer.life_ms,
        };
        inflight::finished_with(store, pool, pod, pending, end)
    }

    /// A request for LoRA adapter `adapter` that was counted on `pod` has ended
    /// ([`Route::adapter`]).
    pub fn adapter_ended(&self, store: &impl SharedStore, pool: &str, pod: &str, adapter: &str) {
        lora::ended(store, pool, pod, adapter);
    }

    /// The request was served by `served` although `chosen` was counted (an Envoy retry went to
    /// a fallback endpoint): move the in-flight count and the pending work.
    pub fn moved(
        &self,
        store: &impl SharedStore,
        pool: &str,
        chosen: &str,
        served: &str,
        pending: u32,
    ) -> bool {
        chosen == served || inflight::moved(store, pool, chosen, served, pending)
    }
}

/// How a routed request's answer ended, for [`Router::finished_with_status`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Answer {
    /// The status the pod answered (0 = none reached the filter).
    pub status: u16,
    /// Host time (ms) of the end: needed only for a server error (an error run's window).
    pub now_ms: u64,
    /// Time from routing to the end (ms), when it is known.
    pub life_ms: Option<f64>,
}

impl Answer {
    /// An answer with `status` at `now_ms`, its life unknown.
    pub fn status(status: u16, now_ms: u64) -> Answer {
        Answer {
            status,
            now_ms,
            life_ms: None,
        }
    }
}

/// Whether a request may be held in the proxy ([`crate::flow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Route at once (flow control off): placed or refused, never held.
    Never,
    /// Hold it if no pod of its pool can take it now.
    IfFull,
    /// Work of its band or above already waits for the pool: it queues behind that work
    /// unless the pool would shed it.
    Behind,
}

/// What the decision came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Routed(Route),
    /// No pod of pool `pool` can take the request now: hold it and ask again later.
    Wait {
        pool: String,
    },
}

/// Shortlists flow control's admission set aside for the whole pool.
#[cfg(test)]
static REJUDGED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[cfg(test)]
mod large;
#[cfg(test)]
mod lying;
#[cfg(test)]
mod tests;
