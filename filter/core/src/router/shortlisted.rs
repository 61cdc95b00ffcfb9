use super::candidates::{floored, put_errors_behind, room_of};
use super::features::{anchor, peer_placed};
use super::view::PoolView;
use super::Context;
use crate::flow::PodRoom;
use crate::inflight::PodLoad;
use crate::lora::Placement;
use crate::predict::{self, Rate};
use crate::prefix;
use crate::prior;
use crate::request::ParsedRequest;
use crate::score::{Candidate, Unscored};
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
    let (pool, sp, live) = (&view.pool, view.sp, &view.live);
    let saturations = sl.saturations(pool)?;
    // This proxy's entries for the pool's pods by snapshot index (the last of an address that
    // repeats, as [`Table::get_all`] reads it).
    let mut loads: Vec<(usize, PodLoad)> = live
        .entries
        .iter()
        .rev()
        .filter_map(|(a, l)| Some((sl.index_of(a)?, *l)))
        .collect();
    loads.sort_by_key(|&(i, _)| i);
    loads.dedup_by_key(|&mut (i, _)| i);
    let load_of = |i: usize| {
        loads
            .binary_search_by_key(&i, |&(j, _)| j)
            .ok()
            .and_then(|k| loads.get(k))
            .map_or_else(PodLoad::default, |&(_, l)| l)
    };
    let pool_rate = predict::pool_rate(loads.iter().filter_map(|(_, l)| l.fit.rate()), prior);
    let floor = trust::cost_floor(pool_rate.cost_ms_per_token);
    let holders: Vec<(u32, u32)> = found
        .per_pod
        .iter()
        .filter_map(|&(id, blocks)| Some((sl.position_of_id(id)?, blocks)))
        .collect();
    let known = holders.iter().map(|&(_, b)| b).max().unwrap_or(0);
    let share = view.derived.map_or(1.0, |d| d.own_share);
    let mut keys = vec![hashes.key];
    let n = hashes.blocks.len();
    let anchored =
        anchor(pool, hashes, req.prompt_chars()).filter(|&(_, depth)| (known as usize) < depth);
    keys.extend(
        anchored
            .filter(|_| prior::credit(n, known, share).is_some())
            .map(|(k, _)| k),
    );
    // The pods other replicas placed the context on are scored too.
    let placed: Vec<u32> = anchored
        .zip(view.derived)
        .map(|((key, _), d)| {
            peer_placed(d, key)
                .filter_map(|p| sl.position_of_id(p.pod))
                .collect()
        })
        .unwrap_or_default();
    let touched = loads
        .iter()
        .filter_map(|&(i, _)| sl.position_of(i))
        .chain(holders.iter().map(|&(at, _)| at))
        .chain(placed);
    let plan = sl.plan(touched, &keys, top_k, ctx.tie)?;
    let blocks_of = |at: u32| {
        holders
            .iter()
            .find(|&&(h, _)| h == at)
            .map_or(0, |&(_, b)| b)
    };
    let n = plan.positions.len();
    let (mut cands, mut ids, mut rooms) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut scored = Vec::new();
    for &at in &plan.positions {
        let i = *sl.pods.get(at as usize)? as usize;
        let (p, g) = (sp.pods.get(i)?, sl.gauges.get(at as usize)?);
        let l = load_of(i);
        let rate = l.fit.rate().map_or(pool_rate, |r| floored(r, floor));
        scored.extend(sl.saturation_of(pool, at));
        ids.push(
            view.derived
                .and_then(|d| d.pod_ids.get(i).copied())
                .unwrap_or(0),
        );
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
            ejected: l.ejected(ctx.now_ms),
        });
    }
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
