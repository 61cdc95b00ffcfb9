//! This replica's ring of the long contexts it placed (in shared data, per pool), which its
//! tally serves to a metrics hub so other replicas find them: [`note_placed`] when the router
//! makes a new copy, [`placed`] for the tally. How the contexts are credited is
//! [`crate::replica_prior`]'s.

use crate::store::SharedStore;
use crate::wire::Reader;
use llm_router_snapshot::PeerContext;

/// Most contexts a pool's ring of placements holds: the newest this replica placed where it
/// made a new copy. 16 bytes each in shared data and in every tally this proxy serves.
pub const PLACED_RING: usize = 128;

/// The shared-data key of a pool's ring of placements.
pub fn placed_key(pool: &str) -> String {
    format!("llmr/placed/{pool}")
}

/// The ring's notes, oldest first, read in place.
fn entries(bytes: &[u8]) -> impl Iterator<Item = PeerContext> + '_ {
    let mut r = Reader(bytes);
    let n = r.u16().map_or(0, usize::from).min(PLACED_RING);
    (0..n).map_while(move |_| {
        Some(PeerContext {
            key: r.u64()?,
            pod: r.u32()?,
            blocks: r.u32()?,
        })
    })
}

fn decode_placed(bytes: &[u8]) -> Vec<PeerContext> {
    entries(bytes).collect()
}

fn encode_placed(ring: &[PeerContext]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + ring.len() * 16);
    out.extend_from_slice(&(ring.len() as u16).to_le_bytes());
    for c in ring {
        out.extend_from_slice(&c.key.to_le_bytes());
        out.extend_from_slice(&c.pod.to_le_bytes());
        out.extend_from_slice(&c.blocks.to_le_bytes());
    }
    out
}

/// Notes that this proxy placed a long context (`placed.key`, the prompt's chained hash at its
/// anchor depth) on pod `placed.pod`, a new copy there: it becomes the ring's newest,
/// replacing an older note of the same key and pod; the oldest beyond [`PLACED_RING`] drop.
/// False when the write did not land (contention; the context stays this replica's alone).
pub fn note_placed(store: &impl SharedStore, pool: &str, placed: PeerContext) -> bool {
    crate::store::update(store, &placed_key(pool), None, decode_placed, |ring| {
        ring.retain(|c| (c.key, c.pod) != (placed.key, placed.pod));
        ring.push(placed);
        let over = ring.len().saturating_sub(PLACED_RING);
        ring.drain(..over);
        encode_placed(ring)
    })
}

/// This replica's own note of `key` with the most blocks (its deepest placement; the newest
/// of equals), read without decoding the ring.
pub fn own_deepest(store: &impl SharedStore, pool: &str, key: u64) -> Option<PeerContext> {
    let (bytes, _) = store.get(&placed_key(pool))?;
    entries(&bytes)
        .filter(|c| c.key == key)
        .max_by_key(|c| c.blocks)
}

/// The pool's ring of placements, oldest first.
pub fn placed(store: &impl SharedStore, pool: &str) -> Vec<PeerContext> {
    store
        .get(&placed_key(pool))
        .map(|(v, _)| decode_placed(&v))
        .unwrap_or_default()
}
