use super::shortlisted::shortlisted;
use super::view::PoolView;
use super::Context;
use crate::candidate::{Candidate, Mode};
use crate::flow::PodRoom;
use crate::inflight::{PodLoad, Table};
use crate::lora::{self, Placement};
use crate::predict::{self, Rate};
use crate::prefix::{self, PrefixIndex};
use crate::reject::Rejection;
use crate::replica_prior;
use crate::request::ParsedRequest;
use crate::score::{self, Unscored};
use crate::shortlist::Shortlist;
use crate::store::SharedStore;
use crate::trust;
use llm_router_snapshot::Health;

/// The pods a request may go to, with what the later stages need of the prefix index.
pub(super) struct Candidates<'f> {
    pub(super) cands: Vec<Candidate<'f>>,
    /// Prefix-index id per candidate.
    pub(super) ids: Vec<u32>,
    /// KV capacity per candidate, for admission.
    pub(super) rooms: Vec<PodRoom>,
    pub(super) hashes: prefix::Hashes,
    pub(super) found: prefix::PrefixMatch,
    /// Each candidate's position among the pool's candidates when they are a large pool's
    /// shortlist (ascending); empty when they are the whole pool.
    pub(super) positions: Vec<u32>,
    /// Candidates in the whole pool.
    pub(super) pool_pods: usize,
    /// A shortlist's homes: `(key, position)`.
    pub(super) homes: Option<Vec<(u64, Option<u32>)>>,
    /// What the ranking needs of the pods a shortlist left out.
    pub(super) unscored: Option<Unscored<'f>>,
    /// A large pool's index for the generation, when its candidates are the whole pool (its
    /// positions are then the candidates' indices): the homes without a rendezvous built per
    /// decision.
    pub(super) index: Option<&'f Shortlist>,
}

impl<'f> Candidates<'f> {
    /// The whole pool's candidates (not a shortlist), with their ids, rooms and the prompt's
    /// hashes and prefix match; `index`, a large pool's index for the generation.
    fn whole(
        cands: Vec<Candidate<'f>>,
        ids: Vec<u32>,
        rooms: Vec<PodRoom>,
        (hashes, found): (prefix::Hashes, prefix::PrefixMatch),
        index: Option<&'f Shortlist>,
    ) -> Self {
        Candidates {
            pool_pods: cands.len(),
            cands,
            ids,
            rooms,
            hashes,
            found,
            positions: Vec::new(),
            homes: None,
            unscored: None,
            index,
        }
    }

    /// The candidate every gateway replica takes as the home of `key`: the rendezvous choice
    /// among the pool's candidates ([`replica_prior::rendezvous`]; over the addresses' hashes in a
    /// large pool, [`replica_prior::Rendezvous`]).
    pub(super) fn home(&self, key: u64) -> Option<usize> {
        if let Some(homes) = &self.homes {
            let (_, at) = homes.iter().find(|(k, _)| *k == key)?;
            return self.positions.binary_search(&(*at)?).ok();
        }
        if self.cands.len() > score::LARGE_POOL {
            if let Some(sl) = self.index.filter(|sl| sl.len() == self.cands.len()) {
                return sl.home(key).map(|at| at as usize);
            }
            let hashes = self
                .cands
                .iter()
                .map(|c| replica_prior::address_hash(c.address));
            return replica_prior::Rendezvous::new(hashes).home(key);
        }
        replica_prior::rendezvous(self.cands.iter().map(|c| c.address), key)
    }
}

/// Stage 3: every pod that is not failing, with its gauges, this proxy's load, its learned
/// rate, the prompt's cached prefix there and the adapter's placement; pods with an error run
/// put behind (at most half), contradicted pods' gauges replaced ([`trust::distrust`]).
pub(super) fn candidates<'f, S: SharedStore>(
    store: &S,
    view: &PoolView<'f>,
    req: &ParsedRequest<'_>,
    ctx: Context,
    shortlist: Option<usize>,
) -> Result<Candidates<'f>, Rejection> {
    let pool = &view.pool;
    let model = view.model(req);
    let hashes = prefix::block_hashes(
        model,
        &req.pieces,
        pool.prefix.block_chars,
        pool.prefix.max_blocks,
        req.key_pieces,
    );
    let index = prefix_index(store, pool);
    let found = index.lookup(&hashes.blocks);
    let predict = pool.predict;
    let prior = Rate {
        cost_ms_per_token: predict.prior_ms_per_token,
        base_ms: predict.prior_base_ms,
    };
    let large = view
        .derived
        .and_then(|d| d.shortlist.as_ref())
        .filter(|_| view.mode == Mode::Full && !view.adapter);
    if let (Some(sl), Some(top_k)) = (large, shortlist) {
        if let Some(s) = shortlisted(view, sl, &hashes, &found, req, ctx, prior, top_k) {
            return Ok(Candidates {
                cands: s.cands,
                ids: s.ids,
                rooms: s.rooms,
                hashes,
                found,
                positions: s.positions,
                pool_pods: sl.len(),
                homes: Some(s.homes),
                unscored: Some(s.unscored),
                index: None,
            });
        }
    }
    whole_pool(store, view, req, ctx, hashes, found, prior)
}

/// Every pod of the pool that is not failing, as [`candidates`] describes them.
fn whole_pool<'f, S: SharedStore>(
    store: &S,
    view: &PoolView<'f>,
    req: &ParsedRequest<'_>,
    ctx: Context,
    hashes: prefix::Hashes,
    found: prefix::PrefixMatch,
    prior: Rate,
) -> Result<Candidates<'f>, Rejection> {
    let (pool, sp, live) = (&view.pool, view.sp, &view.live);
    let empty = Table::default();
    let baseline = view.baseline.unwrap_or(&empty);
    let addrs = || sp.pods.iter().map(|p| p.address.as_str());
    let loads = live.get_all(addrs());
    let baselines = baseline.get_all(addrs());
    // Each pod's fit is solved once per decision; no pod is believed much faster than the
    // pool's median pod.
    let rates: Vec<Option<Rate>> = loads.iter().map(|l| l.fit.rate()).collect();
    let pool_rate = predict::pool_rate(rates.iter().flatten().copied(), prior);
    let floor = trust::cost_floor(pool_rate.cost_ms_per_token);
    let adapter = AdapterView::of(store, view, view.model(req), &loads);
    let full = view.mode == Mode::Full;
    let mut ids = Vec::with_capacity(sp.pods.len());
    let mut rooms = Vec::with_capacity(sp.pods.len());
    let mut cands: Vec<Candidate<'f>> = Vec::with_capacity(sp.pods.len());
    for (i, ((p, l), (b, r))) in sp
        .pods
        .iter()
        .zip(&loads)
        .zip(baselines.iter().zip(&rates))
        .enumerate()
    {
        if p.health == Health::Failing {
            continue;
        }
        let id = view.pod_id(i);
        ids.push(id);
        rooms.push(room_of(p));
        let (placement, adapter_ms) = adapter
            .as_ref()
            .map_or((Placement::default(), 0.0), |a| a.price(pool, p, l, i));
        cands.push(Candidate {
            address: &p.address,
            stale: p.health == Health::Stale,
            waiting: if full { p.waiting } else { 0 },
            running: if full { p.running } else { 0 },
            kv_usage: if full { p.kv_usage } else { None },
            in_flight: l.in_flight,
            in_flight_baseline: if full { b.in_flight } else { 0 },
            pending_tokens: l.pending_tokens,
            peer_in_flight: if full { p.peers.in_flight } else { 0 },
            peer_pending_tokens: if full { p.peers.pending_tokens } else { 0 },
            rate: r.map_or(pool_rate, |r| floored(r, floor)),
            prefix_blocks: found.blocks_for(id),
            lora: placement,
            adapter_ms,
            contradicted: false,
            ejected: l.ejected(ctx.now_ms),
        });
    }
    let half = cands.len() / 2;
    put_errors_behind(&mut cands, half, live);
    if full {
        trust::distrust(&mut cands);
    }
    if cands.is_empty() {
        return Err(no_candidates(view));
    }
    let index = view.derived.and_then(|d| d.shortlist.as_ref());
    Ok(Candidates::whole(cands, ids, rooms, (hashes, found), index))
}

/// Why a pool has no candidate: no pods, or every one failing its scrapes.
fn no_candidates(view: &PoolView<'_>) -> Rejection {
    let why = if view.sp.pods.is_empty() {
        "the pool has no pods"
    } else {
        "every pod is failing its metrics scrapes"
    };
    Rejection::no_endpoints(&view.pool.name, why)
}

/// The pool's prefix index in the shared store, as its configuration sizes it.
pub(super) fn prefix_index<'s, S: SharedStore>(
    store: &'s S,
    pool: &'s crate::config::PoolConfig,
) -> PrefixIndex<'s, S> {
    PrefixIndex::new(
        store,
        &pool.name,
        pool.prefix.index_slots,
        pool.prefix.page_blocks,
        pool.prefix.entries_per_page,
    )
}

/// What admission needs of a pod's capacity.
pub(super) fn room_of(p: &llm_router_snapshot::Pod) -> PodRoom {
    PodRoom {
        kv_capacity_tokens: u64::from(p.block_size) * u64::from(p.num_blocks),
        adapter_slots: p.lora.as_ref().is_some_and(|l| l.max_loras > 0),
    }
}

/// A pod's learned rate, no faster than the pool's floor ([`trust::cost_floor`]: a pod
/// answering before it did the work is not believed faster than the pool's median pod).
pub(super) fn floored(rate: Rate, floor: f64) -> Rate {
    Rate {
        cost_ms_per_token: rate.cost_ms_per_token.max(floor),
        ..rate
    }
}

/// Pods answering server errors go behind the others, at most `half` of the pool (the longest
/// error runs first), as Envoy's outlier detection bounds its ejections.
pub(super) fn put_errors_behind(cands: &mut [Candidate<'_>], half: usize, live: &Table) {
    if cands.iter().filter(|c| c.ejected).count() <= half {
        return;
    }
    let mut runs: Vec<(u16, usize)> = cands
        .iter()
        .enumerate()
        .filter(|(_, c)| c.ejected)
        .map(|(i, c)| (live.get(c.address).errors, i))
        .collect();
    runs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in runs.iter().skip(half) {
        if let Some(c) = cands.get_mut(i) {
            c.ejected = false;
        }
    }
}

/// What pricing an adapter request's placement needs of the pool, read once per decision.
struct AdapterView<'a> {
    name: &'a str,
    /// Adapters recently used per pod ([`lora::read`]).
    recent: lora::Recent,
    /// The adapter's home: the snapshot's bounded-load rendezvous, else the plain one.
    home: Option<usize>,
    /// The pool's mean request life, for a pod that has answered nothing yet.
    pool_life_ms: f64,
}

impl<'a> AdapterView<'a> {
    /// `None` for a request that names no adapter.
    fn of<S: SharedStore>(
        store: &S,
        view: &PoolView<'_>,
        model: &'a str,
        loads: &[PodLoad],
    ) -> Option<Self> {
        if !view.adapter {
            return None;
        }
        let sp = view.sp;
        let home = view
            .derived
            .and_then(|d| d.homes.get(model).copied())
            .or_else(|| {
                let addrs: Vec<&str> = sp.pods.iter().map(|p| p.address.as_str()).collect();
                lora::rendezvous_home(model, &addrs)
            });
        let (sum, n) = loads
            .iter()
            .filter(|l| l.life_ms > 0.0)
            .fold((0.0, 0u32), |(s, n), l| (s + f64::from(l.life_ms), n + 1));
        Some(AdapterView {
            name: model,
            recent: lora::read(store, &view.pool.name),
            home,
            pool_life_ms: if n == 0 { 0.0 } else { sum / f64::from(n) },
        })
    }

    /// Pod `i`'s placement of the adapter and what it costs there ([`lora::price`]).
    fn price(
        &self,
        pool: &crate::config::PoolConfig,
        p: &llm_router_snapshot::Pod,
        l: &PodLoad,
        i: usize,
    ) -> (Placement, f64) {
        let placement = lora::placement(
            self.name,
            p.lora.as_ref(),
            self.recent.of(&p.address),
            self.home == Some(i),
            l.in_flight,
        );
        let life_ms = if l.life_ms > 0.0 {
            f64::from(l.life_ms)
        } else {
            self.pool_life_ms
        };
        let ms = lora::price(&placement, &pool.lora, life_ms);
        (placement, ms)
    }
}
