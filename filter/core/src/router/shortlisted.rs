use super::candidates::{floored, put_errors_behind, room_of};
use super::features::{anchor, history_blocks, peer_placed};
use super::view::PoolView;
use super::Context;
use crate::candidate::Candidate;
use crate::flow::PodRoom;
use crate::inflight::PodLoad;
use crate::lora::Placement;
use crate::predict::{self, Rate};
use crate::prefix;
use crate::replica_prior;
use crate::request::ParsedRequest;
use crate::score::Unscored;
use crate::shortlist::Shortlist;
use crate::trust;

/// Decisions made over a shortlist (tests check that they were).
#[cfg(test)]
pub(super) static SHORTLISTED: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Stage 3 over a large pool's shortlist ([`crate::shortlist`]).
pub(super) struct Shortlisted<'f> {
    pub(super) cands: Vec<Candidate<'f>>,
    pub(super) ids: Vec<u32>,
    pub(super) rooms: Vec<PodRoom>,
    pub(super) positions: Vec<u32>,
    pub(super) homes: Vec<(u64, Option<u32>)>,
    pub(super) unscored: Unscored<'f>,
}

/// The candidates of a large pool's shortlist for a request in a fresh snapshot that names no
/// adapter: each built as [`candidates`] builds it over the whole pool (the gauges already
/// distrusted once for the generation, [`Shortlist::new`]). `None` when the shortlist cannot
/// be sure of the best pods ([`Shortlist::plan`]); the whole pool is scored then.
#[allow(clippy::too_many_arguments)]
pub(super) fn shortlisted<'f>(
    view: &PoolView<'f>,
    sl: &'f Shortlist,
    hashes: &prefix::Hashes,
    found: &prefix::PrefixMatch,
    req: &ParsedRequest<'_>,
    ctx: Context,
    prior: Rate,
    top_k: usize,
) -> Option<Shortlisted<'f>> {
    let (pool, live) = (&view.pool, &view.live);
    let saturations = sl.saturations(pool)?;
    let loads = loads_by_index(live, sl);
    let pool_rate = predict::pool_rate(loads.iter().filter_map(|(_, l)| l.fit.rate()), prior);
    let floor = trust::cost_floor(pool_rate.cost_ms_per_token);
    let holders: Vec<(u32, u32)> = found
        .per_pod
        .iter()
        .filter_map(|&(id, blocks)| Some((sl.position_of_id(id)?, blocks)))
        .collect();
    let (keys, placed) = keys_and_placed(view, sl, hashes, req, &holders);
    let touched = loads
        .iter()
        .filter_map(|&(i, _)| sl.position_of(i))
        .chain(holders.iter().map(|&(at, _)| at))
        .chain(placed);
    let plan = sl.plan(touched, &keys, top_k, ctx.tie)?;
    let pricing = Pricing {
        loads: &loads,
        pool_rate,
        floor,
        now_ms: ctx.now_ms,
    };
    let (mut cands, ids, rooms, scored) = build(view, sl, &plan.positions, &holders, &pricing)?;
    // As over the whole pool: at most half of it is put behind for its errors.
    put_errors_behind(&mut cands, sl.len() / 2, live);
    #[cfg(test)]
    SHORTLISTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let unscored = Unscored {
        pods: saturations.len().saturating_sub(scored.len()),
        rate: pool_rate,
        saturations,
        scored,
    };
    Some(Shortlisted {
        cands,
        ids,
        rooms,
        positions: plan.positions,
        homes: plan.homes,
        unscored,
    })
}

/// This proxy's entries for the pool's pods by snapshot index (the last of an address that
/// repeats, as [`crate::inflight::Table::get_all`] reads it), ascending.
fn loads_by_index(live: &crate::inflight::Table, sl: &Shortlist) -> Vec<(usize, PodLoad)> {
    let mut loads: Vec<(usize, PodLoad)> = live
        .entries
        .iter()
        .rev()
        .filter_map(|(a, l)| Some((sl.index_of(a)?, *l)))
        .collect();
    loads.sort_by_key(|&(i, _)| i);
    loads.dedup_by_key(|&mut (i, _)| i);
    loads
}

/// The keys whose homes the plan must score (the prompt's, and a long context's anchor when
/// the others' share may have put it somewhere this replica does not know), and the positions
/// other replicas placed the context on (scored too). `holders`: `(position, blocks)` of the
/// pods this replica's prefix index says hold the prompt.
fn keys_and_placed(
    view: &PoolView<'_>,
    sl: &Shortlist,
    hashes: &prefix::Hashes,
    req: &ParsedRequest<'_>,
    holders: &[(u32, u32)],
) -> (Vec<u64>, Vec<u32>) {
    let known = holders.iter().map(|&(_, b)| b).max().unwrap_or(0);
    let share = view.derived.map_or(1.0, |d| d.own_share);
    let mut keys = vec![hashes.key];
    let n = hashes.blocks.len();
    let anchored = anchor(&view.pool, hashes, req.prompt_chars())
        .filter(|&(_, depth)| (known as usize) < depth);
    keys.extend(
        anchored
            .filter(|_| replica_prior::credit(n, known, share).is_some())
            .map(|(k, _)| k),
    );
    let mut placed: Vec<u32> = anchored
        .zip(view.derived)
        .map(|((key, _), d)| {
            peer_placed(d, key)
                .filter_map(|p| sl.position_of_id(p.pod))
                .collect()
        })
        .unwrap_or_default();
    // And the pods other replicas sent the conversation's turns to, when this replica knows
    // less than its history.
    let unknown =
        hashes.keyed && history_blocks(&view.pool, req, n).is_some_and(|h| (known as usize) < h);
    if let Some(d) = view.derived.filter(|_| unknown) {
        placed.extend(peer_placed(d, hashes.key).filter_map(|p| sl.position_of_id(p.pod)));
    }
    (keys, placed)
}

/// What a shortlisted candidate's load and rate are read from.
struct Pricing<'a> {
    /// [`loads_by_index`].
    loads: &'a [(usize, PodLoad)],
    pool_rate: Rate,
    floor: f64,
    now_ms: u64,
}

impl Pricing<'_> {
    /// This proxy's entry for snapshot pod `i` (none: an empty one).
    fn load_of(&self, i: usize) -> PodLoad {
        self.loads
            .binary_search_by_key(&i, |&(j, _)| j)
            .ok()
            .and_then(|k| self.loads.get(k))
            .map_or_else(PodLoad::default, |&(_, l)| l)
    }
}

/// The candidates at the plan's `positions`, each built as over the whole pool, with their
/// prefix-index ids, rooms and the saturations of those the ranking scores.
#[allow(clippy::type_complexity)]
fn build<'f>(
    view: &PoolView<'f>,
    sl: &'f Shortlist,
    positions: &[u32],
    holders: &[(u32, u32)],
    pricing: &Pricing<'_>,
) -> Option<(Vec<Candidate<'f>>, Vec<u32>, Vec<PodRoom>, Vec<f64>)> {
    let (pool, sp) = (&view.pool, view.sp);
    let blocks_of = |at: u32| {
        holders
            .iter()
            .find(|&&(h, _)| h == at)
            .map_or(0, |&(_, b)| b)
    };
    let n = positions.len();
    let (mut cands, mut ids, mut rooms) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut scored = Vec::new();
    for &at in positions {
        let i = *sl.pods.get(at as usize)? as usize;
        let (p, g) = (sp.pods.get(i)?, sl.gauges.get(at as usize)?);
        let l = pricing.load_of(i);
        let rate = l
            .fit
            .rate()
            .map_or(pricing.pool_rate, |r| floored(r, pricing.floor));
        scored.extend(sl.saturation_of(pool, at));
        ids.push(view.pod_id(i));
        rooms.push(room_of(p));
        cands.push(Candidate {
            address: &p.address,
            stale: g.stale,
            waiting: g.waiting,
            running: g.running,
            kv_usage: g.kv_usage,
            in_flight: l.in_flight,
            in_flight_baseline: g.baseline,
            pending_tokens: l.pending_tokens,
            // The shortlist serves fresh snapshots only (a stale one is scored whole).
            peer_in_flight: p.peers.in_flight,
            peer_pending_tokens: p.peers.pending_tokens,
            rate,
            prefix_blocks: blocks_of(at),
            lora: Placement::default(),
            adapter_ms: 0.0,
            contradicted: g.contradicted,
            ejected: l.ejected(pricing.now_ms),
        });
    }
    Some((cands, ids, rooms, scored))
}
