use super::candidates::Candidates;
use super::view::PoolView;
use super::Router;
use crate::candidate::Features;
use crate::reject::Rejection;
use crate::score::{self, Scope};

impl Router {
    /// Stage 6: scores and ranks the candidates; with `fits` (some pods would pass their KV
    /// bound), the first pick is the best-ranked pod that fits, the others stay behind it as
    /// fallbacks in rank order (a retry to a full pod beats none).
    pub(super) fn rank(
        &self,
        view: &PoolView<'_>,
        c: &Candidates<'_>,
        features: &Features<'_>,
        fits: Option<&[bool]>,
    ) -> Result<Vec<score::Scored>, Rejection> {
        // Every candidate is kept ranked when its score is shown, or when those that fit are
        // to be put first.
        let keep = if self.config.debug_scores || fits.is_some() {
            c.cands.len()
        } else {
            self.config.top_k
        };
        let scope = Scope {
            positions: &c.positions,
            pool_pods: c.pool_pods,
            unscored: c.unscored.as_ref(),
        };
        let ranked = score::rank_in(
            &view.pool,
            &c.cands,
            features,
            view.mode,
            keep,
            (self.config.retry_after_s, self.config.retry_after_max_s),
            &scope,
        )?;
        let Some(fits) = fits else {
            return Ok(ranked);
        };
        let fit = |s: &score::Scored| fits.get(s.index).copied().unwrap_or(false);
        let (mut first, rest): (Vec<_>, Vec<_>) = ranked.into_iter().partition(fit);
        first.extend(rest);
        Ok(first)
    }
}
