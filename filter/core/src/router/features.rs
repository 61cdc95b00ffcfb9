use super::admit::base_features;
use super::candidates::Candidates;
use super::fleet::PoolIndex;
use super::view::PoolView;
use super::Context;
use crate::candidate::{Features, Mode};
use crate::config::PoolConfig;
use crate::prefix;
use crate::replica_prior;
use crate::request::ParsedRequest;
use crate::store::SharedStore;
use llm_router_snapshot::PeerContext;

/// The anchor of a long context ([`replica_prior::anchor_depth`]): its chained block hash and
/// depth. Other replicas may have put the context somewhere when this replica knows less of the
/// prompt than the depth (`.filter(|&(_, depth)| known < depth)` at the callers).
pub(super) fn anchor(
    pool: &PoolConfig,
    hashes: &prefix::Hashes,
    prompt_chars: usize,
) -> Option<(u64, usize)> {
    let n = hashes.blocks.len();
    let prompt_blocks = prompt_chars / pool.prefix.block_chars.max(1);
    let depth = replica_prior::anchor_depth(n, prompt_blocks, pool.prefix.page_blocks)?;
    let key = hashes.blocks.get(depth.checked_sub(1)?).copied()?;
    Some((key, depth))
}

/// A later chat turn's history (everything before its last user message) in blocks, at most
/// the `n` hashed; `None` for a first turn or a request without messages.
pub(super) fn history_blocks(
    pool: &PoolConfig,
    req: &ParsedRequest<'_>,
    n: usize,
) -> Option<usize> {
    let block_chars = pool.prefix.block_chars.max(1);
    req.history_bytes()
        .map(|bytes| (bytes / block_chars).min(n))
}

/// The contexts other gateway replicas placed under `key` ([`crate::placed::note_placed`]).
pub(super) fn peer_placed(d: &PoolIndex, key: u64) -> impl Iterator<Item = &PeerContext> {
    let from = d.peer_contexts.partition_point(|p| p.key < key);
    d.peer_contexts
        .get(from..)
        .unwrap_or_default()
        .iter()
        .take_while(move |p| p.key == key)
}

/// What [`features`] credited, for [`super::record::record`] to read.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Credits {
    /// `(candidate, its own prefix record)` for the candidates credited: the work accounting
    /// counts what the pod itself is known to hold, not the guess.
    pub(super) credited: Vec<(usize, u32)>,
    /// The prompt's anchor `(key, depth)`, for a long context: when it goes to a pod that
    /// holds less of it than the anchor depth (a new copy: no record of this replica's and
    /// no other replica's note puts it there), [`super::record::record`] shares where it went
    /// ([`crate::placed::note_placed`]).
    pub(super) anchor: Option<(u64, usize)>,
    /// Candidates other replicas' notes put the anchor on (not a new copy there).
    pub(super) peer_placed: Vec<usize>,
    /// For a conversation (a chat request, [`prefix::Hashes::key`] its key): the blocks of
    /// history it carries (`None` on its first turn), for [`super::record::record`] to note
    /// where a turn goes when it starts the conversation or moves it
    /// ([`crate::placed::note_placed`]).
    pub(super) conversation: Option<Option<usize>>,
    /// The candidate the notes (the other replicas', or this one's own) put the conversation's
    /// latest turn on ([`peer_turn`]).
    pub(super) peer_turn: Option<usize>,
}

/// Where the gateway replicas sent a conversation's latest turn, when their notes say: the
/// candidate (by `ids`) of the note with the most blocks among the others' and this replica's
/// own (`own`; each turn is longer than the last, so the deepest note is the newest
/// placement: a turn that went elsewhere since was noted there with more).
pub(super) fn peer_turn(
    d: &PoolIndex,
    own: Option<PeerContext>,
    key: u64,
    ids: &[u32],
) -> Option<usize> {
    peer_placed(d, key)
        .chain(own.as_ref())
        .filter_map(|p| Some((ids.iter().position(|&id| id == p.pod)?, p.blocks)))
        .max_by_key(|&(_, blocks)| blocks)
        .map(|(at, _)| at)
}

/// Stage 5: the request's features, with the pods other gateway replicas probably warmed for
/// it credited ([`replica_prior`]). A prompt deeper than anything this replica knows may be on
/// the pod where other replicas put it: credit that pod with the blocks it would save, weighed
/// by the other replicas' share of the pool's traffic. Two places are expected: a long context's
/// anchor home, and a conversation's home (its key's) for the history its earlier turns left.
/// Where the replicas' notes say where a context or a conversation went, that pod is credited
/// instead, in full (a fact, not a guess).
/// The credits raise the candidates' `prefix_blocks`; what they replaced comes back in
/// [`Credits`].
pub(super) fn features<'r, S: SharedStore>(
    store: &S,
    view: &PoolView<'_>,
    c: &mut Candidates<'_>,
    req: &ParsedRequest<'_>,
    model: &'r str,
    ctx: Context,
) -> (Features<'r>, Credits) {
    let pool = &view.pool;
    let mut credits = Credits::default();
    let full = view.mode == Mode::Full;
    let key_home = c.home(c.hashes.key);
    let prompt_chars = req.prompt_chars();
    if full {
        let known = c.cands.iter().map(|c| c.prefix_blocks).max().unwrap_or(0);
        let share = view.derived.map_or(1.0, |d| d.own_share);
        let n = c.hashes.blocks.len();
        credits.anchor = anchor(pool, &c.hashes, prompt_chars);
        let anchored = credits
            .anchor
            .filter(|&(_, depth)| (known as usize) < depth);
        // Where other replicas placed the context, when their rings say: a fact, in full.
        let placed: Vec<(usize, u32)> = anchored
            .zip(view.derived)
            .map(|((key, _), d)| {
                let ids = &c.ids;
                peer_placed(d, key)
                    .filter_map(|p| {
                        let at = ids.iter().position(|&id| id == p.pod)?;
                        Some((at, p.blocks.min(n as u32)))
                    })
                    .collect()
            })
            .unwrap_or_default();
        credits.peer_placed = placed.iter().map(|&(at, _)| at).collect();
        // Otherwise where they probably put it: its home, believed by their share.
        let context = anchored.filter(|_| placed.is_empty()).and_then(|(key, _)| {
            let credit = replica_prior::credit(n, known, share)?;
            Some((c.home(key)?, credit))
        });
        let history = history_blocks(pool, req, n);
        if c.hashes.keyed && view.derived.is_some_and(|d| d.peers) {
            credits.conversation = Some(history);
        }
        // Where the replicas sent the conversation's latest turn, when their notes (the
        // others', and this replica's own of a turn it started or moved) say: a fact, its whole
        // history; otherwise where the others probably sent it, its key's home.
        let unknown = history.filter(|&h| (known as usize) < h);
        credits.peer_turn = unknown
            .filter(|_| c.hashes.keyed)
            .zip(view.derived.filter(|d| d.peers))
            .and_then(|(_, d)| {
                let own = crate::placed::own_deepest(store, &pool.name, c.hashes.key);
                peer_turn(d, own, c.hashes.key, &c.ids)
            });
        let noted = credits.peer_turn.zip(unknown.map(|h| h as u32));
        let conversation = unknown.filter(|_| noted.is_none()).and_then(|h| {
            let credit = replica_prior::credit(h, known, share)?;
            Some((key_home?, credit))
        });
        let credited = placed.into_iter().chain(context).chain(noted);
        for (home, credit) in credited.chain(conversation) {
            if let Some(cand) = c.cands.get_mut(home) {
                if !credits.credited.iter().any(|&(j, _)| j == home) {
                    credits.credited.push((home, cand.prefix_blocks));
                }
                cand.prefix_blocks = cand.prefix_blocks.max(credit);
            }
        }
    }
    let features = Features {
        prompt_blocks: c.hashes.blocks.len() as u32,
        truncated: prompt_chars / pool.prefix.block_chars.max(1) > c.hashes.blocks.len(),
        home: key_home,
        ..base_features(view, req, model, ctx)
    };
    (features, credits)
}
