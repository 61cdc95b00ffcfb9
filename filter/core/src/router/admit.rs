use super::candidates::Candidates;
use super::view::PoolView;
use super::{Context, Hold};
use crate::candidate::Features;
use crate::flow::{self, Admission};
use crate::reject::Rejection;
use crate::request::ParsedRequest;
use crate::score;

/// The request's size as admission and scoring see it, before any prefix credit.
pub(super) fn base_features<'r>(
    view: &PoolView<'_>,
    req: &ParsedRequest<'_>,
    model: &'r str,
    ctx: Context,
) -> Features<'r> {
    let pool = &view.pool;
    let chars_per_token = pool.predict.chars_per_token.max(0.1);
    let prompt_tokens = (req.prompt_chars() as f64 / chars_per_token).ceil();
    Features {
        adapter: view.adapter.then_some(model),
        prompt_tokens: prompt_tokens.min(f64::from(u32::MAX)) as u32,
        prompt_blocks: 0,
        truncated: false,
        tokens_per_block: pool.prefix.block_chars as f64 / chars_per_token,
        // Until the pool's mean is known, a waiting request is assumed as big as this one.
        mean_prefill_tokens: if view.live.mean_prefill_tokens > 0.0 {
            f64::from(view.live.mean_prefill_tokens)
        } else {
            prompt_tokens
        },
        home: None,
        priority: ctx.priority,
        tie: ctx.tie,
    }
}

/// What admission came to for a request it does not refuse ([`admit_or_wait`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Admitted {
    /// No pod can take it now: it waits.
    Wait,
    /// Any pod may be picked.
    Any,
    /// Only the pods marked (per candidate) keep their KV bound: they are picked first.
    Fitting(Vec<bool>),
}

impl Admitted {
    /// The pods that keep their KV bound, when not every pod does.
    pub(super) fn fits(&self) -> Option<&[bool]> {
        match self {
            Admitted::Fitting(fits) => Some(fits),
            Admitted::Wait | Admitted::Any => None,
        }
    }
}

/// Stage 4: admit or wait ([`flow::admit`]). A request the ranking would shed (sheddable in a saturated pool,
/// standard far past it) is refused instead. A pod past the *queue* bound may still be picked
/// when some pod has room: a busy pod holding the prompt's prefix may still answer first, and
/// the ranking weighs that (restricting the pick to pods with room sent shared-prefix requests
/// to cold pods: TTFT p95 591 against 160 ms, results/flow-v1-bursty.md). A pod past the *KV*
/// bound may not: the engine would preempt what runs there.
pub(super) fn admit_or_wait(
    view: &PoolView<'_>,
    c: &Candidates<'_>,
    req: &ParsedRequest<'_>,
    ctx: Context,
    hold: Hold,
    kv_threshold: f64,
    retry_after: (u32, u32),
) -> Result<Admitted, Rejection> {
    if hold == Hold::Never {
        return Ok(Admitted::Any);
    }
    let f = base_features(view, req, view.model(req), ctx);
    let budget_ms = ctx.deadline_ms.map(|d| d.saturating_sub(ctx.now_ms) as f64);
    let admission = match hold {
        Hold::Behind => Admission::Wait,
        _ => flow::admit(
            &view.pool,
            kv_threshold,
            &c.cands,
            &c.rooms,
            &f,
            view.mode,
            budget_ms,
        ),
    };
    match admission {
        Admission::Admit(fits) if fits.iter().all(|&f| f) => Ok(Admitted::Any),
        Admission::Admit(fits) => Ok(Admitted::Fitting(fits)),
        Admission::Late => Err(Rejection::not_queued(
            &view.pool.name,
            flow::Refusal::Late.reason(),
            retry_after.0,
        )),
        Admission::Wait => {
            // Ranking with every pod judges saturation exactly as without flow control: a
            // saturated pool refuses a sheddable request now, and a pool `critical_factor`
            // times past saturation a standard one, rather than hold what would time out.
            score::rank(&view.pool, &c.cands, &f, view.mode, 1, retry_after)?;
            Ok(Admitted::Wait)
        }
    }
}
