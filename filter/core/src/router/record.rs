use super::candidates::{prefix_index, Candidates};
use super::features::Credits;
use super::view::PoolView;
use super::{Route, RouteMode};
use crate::candidate::{Candidate, Features, Mode};
use crate::inflight;
use crate::lora;
use crate::score;
use crate::store::SharedStore;
use llm_router_snapshot::PeerContext;

/// Stage 7: the decision, recorded in shared data: the chosen pod's in-flight count and pending
/// work go up in the shared load table, the prompt's blocks are recorded for it in the prefix
/// index, an adapter is noted as used there.
pub(super) fn record<S: SharedStore>(
    store: &S,
    view: PoolView<'_>,
    c: &Candidates<'_>,
    credits: &Credits,
    features: &Features<'_>,
    ranked: &[score::Scored],
    top_k: usize,
) -> Route {
    let pool = &view.pool;
    let (endpoints, scores) = listed(c, ranked, top_k);
    let best = ranked.first().map(|s| s.index);
    let chosen = best.and_then(|i| c.cands.get(i).map(|c| (i, c)));
    let recorded = |i: usize, cand: &Candidate<'_>| {
        credits
            .credited
            .iter()
            .find(|&&(j, _)| j == i)
            .map_or(cand.prefix_blocks, |&(_, blocks)| blocks)
    };
    let (mut pending_tokens, mut work_tokens) = (0, 0.0);
    let (mut prefix_hit, mut lora_hit) = (false, false);
    if let Some((i, cand)) = chosen {
        let known = recorded(i, cand);
        prefix_hit = known > 0;
        lora_hit = features.adapter.is_some() && (cand.lora.resident || cand.lora.home);
        let uncached = features.uncached_tokens(known);
        pending_tokens = uncached.min(f64::from(u32::MAX)) as u32;
        // When the pod was credited with a guess of what it holds, its timing says nothing
        // sure about its rate: no observation (NaN is ignored by the fit).
        work_tokens = if known < cand.prefix_blocks {
            f64::NAN
        } else {
            cand.queued_tokens(features, view.mode) + uncached
        };
        record_prompt(store, &view, c, credits, i, known);
        inflight::routed_after_read(
            store,
            &pool.name,
            // Without a CAS token (no table yet) a blind write could overwrite another
            // worker's first entry: read again instead.
            view.live_cas.map(|cas| (view.live, Some(cas))),
            cand.address,
            pending_tokens,
        );
        if let Some(a) = features.adapter {
            lora::note(store, &pool.name, cand.address, a, cand.in_flight == 0);
        }
    }
    Route {
        pool: pool.name.clone(),
        cluster: pool.cluster.clone(),
        endpoints,
        rewrite: view.rewrite.clone(),
        served_model: view.served_model.clone(),
        mode: if view.mode == Mode::Full {
            RouteMode::Scored
        } else {
            RouteMode::LeastInflight
        },
        scores,
        prefix_hit,
        lora_hit,
        inflight_pod: chosen.map(|(_, c)| c.address.to_string()),
        pending_tokens,
        work_tokens,
        adapter: chosen.and(features.adapter).map(str::to_string),
    }
}

/// The best `top_k` endpoints, and every ranked candidate's `(address, score)`, best first.
#[allow(clippy::type_complexity)]
fn listed(
    c: &Candidates<'_>,
    ranked: &[score::Scored],
    top_k: usize,
) -> (Vec<String>, Vec<(String, f64)>) {
    let endpoints = ranked
        .iter()
        .take(top_k)
        .filter_map(|s| c.cands.get(s.index))
        .map(|c| c.address.to_string())
        .collect();
    let scores = ranked
        .iter()
        .filter_map(|s| {
            c.cands
                .get(s.index)
                .map(|c| (c.address.to_string(), s.score))
        })
        .collect();
    (endpoints, scores)
}

/// The prompt's blocks recorded for candidate `i` in the prefix index; a new copy of a long
/// context (the pod held `known` blocks, less than the anchor, by this replica's records and
/// the others' notes), made while other replicas are at work in the pool, noted for them
/// (through the tally), so they need not guess — the first copy, and every later one (a busy
/// holder avoided), which the others would otherwise not know of and copy again.
fn record_prompt<S: SharedStore>(
    store: &S,
    view: &PoolView<'_>,
    c: &Candidates<'_>,
    credits: &Credits,
    i: usize,
    known: u32,
) {
    let pool = &view.pool;
    let index = prefix_index(store, pool);
    let id = c.ids.get(i).copied().unwrap_or(0);
    index.record(&c.hashes.blocks, id, &c.found);
    if let Some((key, depth)) = credits.anchor {
        if view.derived.is_some_and(|d| d.peers)
            && (known as usize) < depth
            && !credits.peer_placed.contains(&i)
        {
            let blocks = c.hashes.blocks.len() as u32;
            crate::placed::note_placed(
                store,
                &pool.name,
                PeerContext {
                    key,
                    pod: id,
                    blocks,
                },
            );
        }
    }
    // A conversation's turn that starts it (a prompt of a page or more: a shorter history
    // costs little to move, and the turn that moves it is noted), or goes where neither this
    // replica's records nor the notes put its history (it moved), is noted under the
    // conversation's key, so the replicas send its next turns there instead of guessing.
    if let Some(history) = credits.conversation {
        let blocks = c.hashes.blocks.len();
        let noteworthy = match history {
            None => blocks >= pool.prefix.page_blocks.max(1),
            Some(h) => (known as usize) < h,
        };
        if noteworthy && credits.peer_turn != Some(i) {
            let blocks = blocks as u32;
            crate::placed::note_placed(
                store,
                &pool.name,
                PeerContext {
                    key: c.hashes.key,
                    pod: id,
                    blocks,
                },
            );
        }
    }
}
