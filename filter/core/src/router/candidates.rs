use super::shortlisted::shortlisted;
use super::view::PoolView;
use super::Context;
use crate::flow::PodRoom;
use crate::inflight::Table;
use crate::lora::{self, Placement};
use crate::predict::{self, Rate};
use crate::prefix::{self, PrefixIndex};
use crate::prior;
use crate::reject::Rejection;
use crate::request::ParsedRequest;
use crate::score::{self, Candidate, Mode, Unscored};
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
    /// `(candidate, its own prefix record)` for candidates credited by [`features`].
    pub(super) credited: Vec<(usize, u32)>,
    /// The prompt's anchor `(key, depth)`, for a long context: when it goes to a pod that
    /// holds less of it than the anchor depth (a new copy: no record of this replica's and
    /// no other replica's note puts it there), [`account`] shares where it went
    /// ([`prior::note_placed`]).
    pub(super) anchor: Option<(u64, usize)>,
    /// Candidates other replicas' notes put the anchor on (not a new copy there).
    pub(super) peer_placed: Vec<usize>,
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

impl Candidates<'_> {
    /// The candidate every gateway replica takes as the home of `key`: the rendezvous choice
    /// among the pool's candidates ([`prior::rendezvous`]; over the addresses' hashes in a
    /// large pool, [`prior::Rendezvous`]).
    pub(super) fn home(&self, key: u64) -> Option<usize> {
        if let Some(homes) = &self.homes {
            let (_, at) = homes.iter().find(|(k, _)| *k == key)?;
            return self.positions.binary_search(&(*at)?).ok();
        }
        if self.cands.len() > score::LARGE_POOL {
            if let Some(sl) = self.index.filter(|sl| sl.len() == self.cands.len()) {
                return sl.home(key).map(|at| at as usize);
            }
            let hashes = self.cands.iter().map(|c| prior::address_hash(c.address));
            return prior::Rendezvous::new(hashes).home(key);
        }
        prior::rendezvous(self.cands.iter().map(|c| c.address), key)
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
    let (pool, sp, live) = (&view.pool, view.sp, &view.live);
    let model = view.model(req);
    let empty = Table::default();
    let baseline = view.baseline.unwrap_or(&empty);
    let pod_id = |i: usize| {
        view.derived
            .and_then(|d| d.pod_ids.get(i).copied())
            .unwrap_or(0)
    };
    let hashes = prefix::block_hashes(
        model,
        &req.pieces,
        pool.prefix.block_chars,
        pool.prefix.max_blocks,
        req.key_pieces,
    );
    let index = PrefixIndex::new(
        store,
        &pool.name,
        pool.prefix.index_slots,
        pool.prefix.page_blocks,
        pool.prefix.entries_per_page,
    );
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
                credited: Vec::new(),
                anchor: None,
                peer_placed: Vec::new(),
                positions: s.positions,
                pool_pods: sl.len(),
                homes: Some(s.homes),
                unscored: Some(s.unscored),
                index: None,
            });
        }
    }
    let addrs = || sp.pods.iter().map(|p| p.address.as_str());
    let loads = live.get_all(addrs());
    let baselines = baseline.get_all(addrs());
    // Each pod's fit is solved once per decision; no pod is believed much faster than the
    // pool's median pod (`trust::cost_floor`: a pod answering before it did the work).
    let rates: Vec<Option<Rate>> = loads.iter().map(|l| l.fit.rate()).collect();
    let pool_rate = predict::pool_rate(rates.iter().flatten().copied(), prior);
    let floor = trust::cost_floor(pool_rate.cost_ms_per_token);
    let rates: Vec<Option<Rate>> = rates
        .into_iter()
        .map(|r| {
            r.map(|r| Rate {
                cost_ms_per_token: r.cost_ms_per_token.max(floor),
                ..r
            })
        })
        .collect();

    let adapter_name = view.adapter.then_some(model);
    let recent = match adapter_name {
        Some(_) => lora::read(store, &pool.name),
        None => lora::Recent::default(),
    };
    let home_of_adapter = adapter_name.and_then(|a| {
        view.derived
            .and_then(|d| d.homes.get(a).copied())
            .or_else(|| {
                let addrs: Vec<&str> = sp.pods.iter().map(|p| p.address.as_str()).collect();
                lora::rendezvous_home(a, &addrs)
            })
    });

    // The pool's mean request life, for a pod that has answered nothing yet (adapter requests
    // only: nothing else prices a slot wait).
    let pool_life_ms = match adapter_name {
        None => 0.0,
        Some(_) => {
            let (sum, n) = loads
                .iter()
                .filter(|l| l.life_ms > 0.0)
                .fold((0.0, 0u32), |(s, n), l| (s + f64::from(l.life_ms), n + 1));
            if n == 0 {
                0.0
            } else {
                sum / f64::from(n)
            }
        }
    };
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
        let id = pod_id(i);
        ids.push(id);
        rooms.push(PodRoom {
            kv_capacity_tokens: u64::from(p.block_size) * u64::from(p.num_blocks),
            adapter_slots: p.lora.as_ref().is_some_and(|l| l.max_loras > 0),
        });
        let placement = match adapter_name {
            Some(a) => lora::placement(
                a,
                p.lora.as_ref(),
                recent.of(&p.address),
                home_of_adapter == Some(i),
                l.in_flight,
            ),
            None => Placement::default(),
        };
        let adapter_ms = match adapter_name {
            None => 0.0,
            Some(_) => {
                let load = if placement.resident {
                    0.0
                } else {
                    pool.lora.load_ms
                };
                let stray = if placement.home {
                    0.0
                } else {
                    pool.lora.stray_ms
                };
                // A blocked pod frees a slot when one batch adapter's requests there have all
                // ended while its new ones keep joining ahead: sooner for an adapter with few
                // requests there than for one that keeps its slot busy
                // ([`lora::drain_lives`]); then one request life more for each adapter already
                // waiting for a slot (the engine gives freed slots first come first served).
                let slot_wait = if placement.blocked {
                    let life = if l.life_ms > 0.0 {
                        f64::from(l.life_ms)
                    } else {
                        pool_life_ms
                    };
                    life * (lora::drain_lives(placement.drain) + f64::from(placement.slot_queue))
                } else {
                    0.0
                };
                load + stray + slot_wait
            }
        };
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
            rate: r.unwrap_or(pool_rate),
            prefix_blocks: found.blocks_for(id),
            lora: placement,
            adapter_ms,
            contradicted: false,
            ejected: l.ejected(ctx.now_ms),
        });
    }
    // Pods answering server errors go behind the others, at most half of the pool (the
    // longest error runs first), as Envoy's outlier detection bounds its ejections.
    let ejected = cands.iter().filter(|c| c.ejected).count();
    if ejected > cands.len() / 2 {
        let mut runs: Vec<(u16, usize)> = cands
            .iter()
            .enumerate()
            .filter(|(_, c)| c.ejected)
            .map(|(i, c)| (live.get(c.address).errors, i))
            .collect();
        runs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, i) in runs.iter().skip(cands.len() / 2) {
            if let Some(c) = cands.get_mut(i) {
                c.ejected = false;
            }
        }
    }
    if full {
        trust::distrust(&mut cands);
    }
    if cands.is_empty() {
        let why = if sp.pods.is_empty() {
            "the pool has no pods"
        } else {
            "every pod is failing its metrics scrapes"
        };
        return Err(Rejection::no_endpoints(&pool.name, why));
    }
    let pool_pods = cands.len();
    Ok(Candidates {
        cands,
        ids,
        rooms,
        hashes,
        found,
        credited: Vec::new(),
        anchor: None,
        peer_placed: Vec::new(),
        positions: Vec::new(),
        pool_pods,
        homes: None,
        unscored: None,
        index: view.derived.and_then(|d| d.shortlist.as_ref()),
    })
}
