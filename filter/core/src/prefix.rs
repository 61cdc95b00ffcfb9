//! Approximate prefix-cache affinity: which pods most likely still hold a prompt's prefix, and
//! how much of it.
//!
//! A prompt is cut into blocks of `block_chars` characters (≈ 16 tokens, vLLM's block size) and
//! each block gets a hash chained over all previous ones (xxHash64, seeded with the model name,
//! as GAIE does), so block `i`'s hash stands for the whole prefix up to it.
//!
//! The index lives in shared data, so every Envoy worker sees the same affinity (a
//! conversation's next turn may arrive on another connection and worker). It is organised in
//! *pages* of `page_blocks` blocks. Page `k` of a prompt covers blocks `k·g … k·g+g−1` and is
//! stored under its first block's hash (the *anchor*); it lists the recent pods that served a
//! prompt through that anchor, each with how far into the page that prompt went (`depth`) and a
//! 32-bit fingerprint of the chained hash of its last block there. Because hashes are chained, a
//! later prompt whose own hash at that depth carries the same fingerprint shares the whole
//! prefix up to it; one that diverged inside the page still shares everything up to the anchor.
//!
//! So every block of a recorded prompt is findable — a conversation's second turn finds the
//! first turn's last block, wherever it fell — while a lookup reads one key per page and a
//! record writes only the pages whose entry changed: a prompt served again by the same pod
//! writes nothing; a new turn writes its last old page and its new ones. Memory is bounded:
//! `index_slots` slots per pool (`slot = anchor mod index_slots`, a colliding page simply
//! replaces the older one) and at most `entries_per_page` entries per page, newest first.
//!
//! Page encoding: `anchor u64 | count u8 | (pod u32 | depth u8 | fingerprint u32) * count`,
//! little-endian. Pods are named by [`pod_id`], a 32-bit hash of their address.

use crate::request::Piece;
use crate::store::SharedStore;
use xxhash_rust::xxh64::{xxh64, Xxh64};

/// Separates pieces in the hashed stream, so `["ab","c"]` and `["a","bc"]` differ.
const PIECE_SEPARATOR: u8 = 0x1E;
/// Without a first user message to anchor on, the replica key covers this many blocks at most.
const KEY_BLOCKS: usize = 16;

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, n: u64) {
    if n >= 10 {
        push_decimal(out, n / 10);
    }
    out.push(char::from(b'0' + (n % 10) as u8));
}

/// The 32-bit name of a pod in the index.
pub fn pod_id(address: &str) -> u32 {
    xxh64(address.as_bytes(), 0x506F_6449) as u32
}

/// A prompt's chained block hashes and its replica key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hashes {
    /// Chained hashes of the prompt's full blocks (a trailing partial block is not hashed, like
    /// a model server that caches only full blocks), at most `max_blocks`.
    pub blocks: Vec<u64>,
    /// Hash of the prompt up to the end of its first user message (or of its first
    /// `KEY_BLOCKS` blocks when it has no messages): the same on every turn of a conversation
    /// and on every gateway replica, so replicas can agree on a home pod for it without sharing
    /// state.
    pub key: u64,
    /// `key` ends with the first user message (not the `KEY_BLOCKS` fallback, which prompts
    /// sharing their opening blocks share): a conversation's own key.
    pub keyed: bool,
}

/// Hashes a prompt. `key_pieces` is the number of leading pieces that end with the first user
/// message, when the API has messages.
pub fn block_hashes(
    model: &str,
    pieces: &[Piece<'_>],
    block_chars: usize,
    max_blocks: usize,
    key_pieces: Option<usize>,
) -> Hashes {
    let mut out = Vec::new();
    let seed = xxh64(model.as_bytes(), 0);
    if block_chars == 0 || max_blocks == 0 {
        return Hashes {
            blocks: out,
            key: seed,
            keyed: false,
        };
    }
    let mut chain = BlockChain {
        hasher: Xxh64::new(seed),
        seed,
        filled: 0,
        block_chars,
        max_blocks,
        out: &mut out,
    };
    let mut key = None;
    for (i, piece) in pieces.iter().enumerate() {
        match piece {
            Piece::Text(t) => chain.feed(t.as_bytes()),
            Piece::Tokens(ids) => {
                for id in ids {
                    chain.feed(&id.to_le_bytes());
                    if chain.full() {
                        break;
                    }
                }
            }
        }
        chain.feed(&[PIECE_SEPARATOR]);
        if key_pieces == Some(i + 1) && !chain.full() {
            key = Some(chain.hasher.digest());
        }
        if chain.full() {
            break;
        }
    }
    let tail = chain.hasher.digest();
    let keyed = key.is_some();
    let key = key.unwrap_or_else(|| match out.len() {
        0 => tail,
        n => out.get(n.min(KEY_BLOCKS) - 1).copied().unwrap_or(tail),
    });
    Hashes {
        blocks: out,
        key,
        keyed,
    }
}

struct BlockChain<'o> {
    /// The current partial block's hash state: what a block spanning pieces was fed so far, and
    /// what the key and tail digests read.
    hasher: Xxh64,
    /// The current block's seed: the previous block's hash (the model's for the first).
    seed: u64,
    filled: usize,
    block_chars: usize,
    max_blocks: usize,
    out: &'o mut Vec<u64>,
}

impl BlockChain<'_> {
    fn full(&self) -> bool {
        self.out.len() >= self.max_blocks
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        // A whole block inside this piece is hashed in one call: the same hash as the streaming
        // hasher's (xxHash64 is defined on the bytes, not on how they are fed), at a fraction of
        // its buffering cost. Only a block that spans pieces goes through `hasher`, which is
        // re-seeded lazily after one-call blocks.
        let mut synced = true;
        while !bytes.is_empty() && !self.full() {
            if self.filled == 0 && bytes.len() >= self.block_chars {
                let (block, rest) = bytes.split_at(self.block_chars);
                let h = xxh64(block, self.seed);
                self.out.push(h);
                self.seed = h;
                bytes = rest;
                synced = false;
                continue;
            }
            if !synced {
                self.hasher = Xxh64::new(self.seed);
                synced = true;
            }
            let take = (self.block_chars - self.filled).min(bytes.len());
            let (head, rest) = bytes.split_at(take);
            self.hasher.update(head);
            self.filled += take;
            bytes = rest;
            if self.filled == self.block_chars {
                let h = self.hasher.digest();
                self.out.push(h);
                self.seed = h;
                self.filled = 0;
                synced = false;
            }
        }
        if !synced {
            self.hasher = Xxh64::new(self.seed);
        }
    }
}

/// One pod's record in a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub pod: u32,
    /// Blocks of the page the recorded prompt covered (1..=page_blocks).
    pub depth: u8,
    /// Low 32 bits of the chained hash of the recorded prompt's last block in the page.
    pub fingerprint: u32,
}

/// One page of the index, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub anchor: u64,
    /// Most recent first.
    pub entries: Vec<Entry>,
}

impl Page {
    pub fn encode(&self) -> Vec<u8> {
        let n = self.entries.len().min(255);
        let mut out = Vec::with_capacity(9 + 9 * n);
        out.extend_from_slice(&self.anchor.to_le_bytes());
        out.push(n as u8);
        for e in self.entries.iter().take(n) {
            out.extend_from_slice(&e.pod.to_le_bytes());
            out.push(e.depth);
            out.extend_from_slice(&e.fingerprint.to_le_bytes());
        }
        out
    }

    /// `None` for bytes that are not a page (treated as an empty slot).
    pub fn decode(bytes: &[u8]) -> Option<Page> {
        let anchor = u64::from_le_bytes(bytes.get(0..8)?.try_into().ok()?);
        let n = usize::from(*bytes.get(8)?);
        let body = bytes.get(9..)?;
        if body.len() != 9 * n {
            return None;
        }
        let entries = body
            .chunks_exact(9)
            .map(|c| {
                let (pod, rest) = c.split_at(4);
                let (depth, fp) = rest.split_at(1);
                Some(Entry {
                    pod: u32::from_le_bytes(pod.try_into().ok()?),
                    depth: *depth.first()?,
                    fingerprint: u32::from_le_bytes(fp.try_into().ok()?),
                })
            })
            .collect::<Option<Vec<Entry>>>()?;
        Some(Page { anchor, entries })
    }
}

/// What a lookup found: per pod, how many leading blocks it (probably) holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Blocks in the prompt.
    pub total: u32,
    /// `(pod id, matched leading blocks)`.
    pub per_pod: Vec<(u32, u32)>,
    /// Pages read while matching (page `k` of the prompt at `pages[k]`), with CAS tokens, reused
    /// when recording so recording costs no second read. `None`: not found.
    pages: Vec<Option<(Page, u32)>>,
}

impl PrefixMatch {
    /// Matched leading blocks for the pod with this [`pod_id`].
    pub fn blocks_for(&self, pod: u32) -> u32 {
        self.per_pod
            .iter()
            .find(|(p, _)| *p == pod)
            .map(|(_, n)| *n)
            .unwrap_or(0)
    }

    fn note(&mut self, pod: u32, blocks: u32) {
        match self.per_pod.iter_mut().find(|(p, _)| *p == pod) {
            Some((_, n)) => *n = (*n).max(blocks),
            None => self.per_pod.push((pod, blocks)),
        }
    }
}

/// The low 32 bits of block `i`'s hash, if the prompt has that block.
fn fingerprint(hashes: &[u64], i: usize) -> Option<u32> {
    hashes.get(i).map(|h| *h as u32)
}

/// A pool's shared prefix index.
pub struct PrefixIndex<'s, S: SharedStore> {
    store: &'s S,
    pool: &'s str,
    slots: u32,
    page_blocks: usize,
    entries_per_page: usize,
}

impl<'s, S: SharedStore> PrefixIndex<'s, S> {
    pub fn new(
        store: &'s S,
        pool: &'s str,
        slots: u32,
        page_blocks: usize,
        entries_per_page: usize,
    ) -> Self {
        PrefixIndex {
            store,
            pool,
            slots: slots.max(1),
            page_blocks: page_blocks.clamp(1, 255),
            entries_per_page: entries_per_page.clamp(1, 255),
        }
    }

    fn key(&self, anchor: u64) -> String {
        // Built by hand: `format!` costs more than the rest of a page lookup (up to 16 per
        // request).
        let mut key = String::with_capacity(8 + self.pool.len() + 1 + 10);
        key.push_str("llmr/px/");
        key.push_str(self.pool);
        key.push('/');
        push_decimal(&mut key, anchor % u64::from(self.slots));
        key
    }

    /// Reads the prompt's pages from the start until two in a row are missing (one missing page
    /// — its slot taken by a colliding prefix — is skipped).
    pub fn lookup(&self, hashes: &[u64]) -> PrefixMatch {
        let mut m = PrefixMatch {
            total: hashes.len() as u32,
            ..PrefixMatch::default()
        };
        let g = self.page_blocks;
        let mut misses = 0;
        for (k, &anchor) in hashes.iter().step_by(g).enumerate() {
            let start = k * g;
            let found = self.store.get(&self.key(anchor)).and_then(|(bytes, cas)| {
                Page::decode(&bytes)
                    .filter(|p| p.anchor == anchor)
                    .map(|p| (p, cas))
            });
            let Some((page, cas)) = found else {
                misses += 1;
                m.pages.push(None);
                if misses >= 2 {
                    break;
                }
                continue;
            };
            misses = 0;
            for e in &page.entries {
                let d = usize::from(e.depth).max(1);
                let last = start + d - 1;
                let blocks = if fingerprint(hashes, last) == Some(e.fingerprint) {
                    last + 1
                } else {
                    start + 1
                };
                m.note(e.pod, blocks as u32);
            }
            m.pages.push(Some((page, cas)));
        }
        m
    }

    /// Records that the pod `pod` (a [`pod_id`]) now holds the prompt's blocks. Pages that
    /// already hold this exact entry are left alone; others get it first, replacing the pod's
    /// entries that it extends. Best effort: a lost CAS race is ignored. Returns the number of
    /// pages written.
    pub fn record(&self, hashes: &[u64], pod: u32, found: &PrefixMatch) -> usize {
        let g = self.page_blocks;
        let n = hashes.len();
        let mut writes = 0;
        for (k, &anchor) in hashes.iter().step_by(g).enumerate() {
            let start = k * g;
            let d = g.min(n - start);
            let Some(fp) = fingerprint(hashes, start + d - 1) else {
                continue;
            };
            let new = Entry {
                pod,
                depth: d as u8,
                fingerprint: fp,
            };
            let (page, cas) = match found.pages.get(k).and_then(Option::as_ref) {
                Some((page, cas)) => {
                    if page.entries.contains(&new) {
                        continue;
                    }
                    let extends = |e: &Entry| {
                        e.pod == pod
                            && usize::from(e.depth) <= d
                            && fingerprint(hashes, start + usize::from(e.depth).max(1) - 1)
                                == Some(e.fingerprint)
                    };
                    let mut entries = Vec::with_capacity(self.entries_per_page);
                    entries.push(new);
                    entries.extend(
                        page.entries
                            .iter()
                            .filter(|e| !extends(e))
                            .take(self.entries_per_page - 1),
                    );
                    (Page { anchor, entries }, Some(*cas))
                }
                None => (
                    Page {
                        anchor,
                        entries: vec![new],
                    },
                    None,
                ),
            };
            if self
                .store
                .set(&self.key(anchor), &page.encode(), cas)
                .is_ok()
            {
                writes += 1;
            }
        }
        writes
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::store::MemoryStore;
    use std::borrow::Cow;

    fn text(s: &str) -> Vec<Piece<'_>> {
        vec![Piece::Text(Cow::Borrowed(s))]
    }

    fn blocks(s: &str) -> Vec<u64> {
        block_hashes("m", &text(s), 64, 256, None).blocks
    }

    fn index(store: &MemoryStore) -> PrefixIndex<'_, MemoryStore> {
        PrefixIndex::new(store, "pool", 65_536, 16, 16)
    }

    const A: u32 = 0xA;
    const B: u32 = 0xB;

    /// The chain by its definition: the pieces' bytes, each followed by the separator, cut
    /// into whole blocks, each hashed seeded with the previous block's hash.
    fn reference_chain(model: &str, pieces: &[&str], block_chars: usize, max: usize) -> Vec<u64> {
        let mut bytes = Vec::new();
        for p in pieces {
            bytes.extend_from_slice(p.as_bytes());
            bytes.push(PIECE_SEPARATOR);
        }
        let mut seed = xxh64(model.as_bytes(), 0);
        bytes
            .chunks_exact(block_chars)
            .take(max)
            .map(|block| {
                seed = xxh64(block, seed);
                seed
            })
            .collect()
    }

    #[test]
    fn blocks_hash_the_same_however_the_pieces_cut_them() {
        let long = "0123456789abcdef".repeat(40);
        let cases: Vec<Vec<&str>> = vec![
            vec![&long],
            vec![&long[..64], &long[64..]],
            vec![&long[..63], &long[63..200], "", &long[200..]],
            vec!["a", "bc", &long[..130], "d", &long[5..300]],
            vec![&long[..10]],
        ];
        for pieces in cases {
            let text: Vec<Piece<'_>> = pieces
                .iter()
                .map(|p| Piece::Text(Cow::Borrowed(p)))
                .collect();
            for (block_chars, max) in [(64, 256), (64, 3), (7, 1000), (1, 50)] {
                assert_eq!(
                    block_hashes("m", &text, block_chars, max, None).blocks,
                    reference_chain("m", &pieces, block_chars, max),
                    "pieces {:?}, blocks of {block_chars}, at most {max}",
                    pieces.iter().map(|p| p.len()).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn page_keys_name_the_pool_and_the_slot() {
        let store = MemoryStore::new();
        let index = PrefixIndex::new(&store, "llama", 1_000_003, 16, 4);
        assert_eq!(index.key(0), "llmr/px/llama/0");
        assert_eq!(index.key(7), "llmr/px/llama/7");
        assert_eq!(index.key(1_000_002), "llmr/px/llama/1000002");
        assert_eq!(index.key(1_000_003 + 10), "llmr/px/llama/10");
        let mut s = String::new();
        push_decimal(&mut s, u64::MAX);
        assert_eq!(s, u64::MAX.to_string());
    }

    #[test]
    fn only_full_blocks_are_hashed_and_capped() {
        assert_eq!(blocks(&"a".repeat(62)).len(), 0);
        // 64 chars + the piece separator = 65 bytes: one full block.
        assert_eq!(blocks(&"a".repeat(64)).len(), 1);
        assert_eq!(blocks(&"a".repeat(64 * 10)).len(), 10);
        let capped = block_hashes("m", &text(&"a".repeat(64 * 10)), 64, 4, None);
        assert_eq!(capped.blocks.len(), 4);
        assert!(block_hashes("m", &text("abc"), 64, 0, None)
            .blocks
            .is_empty());
    }

    #[test]
    fn a_shared_prefix_shares_leading_hashes_only() {
        let base = "You are a helpful assistant. ".repeat(20);
        let a = format!("{base} Question one? {}", "x".repeat(200));
        let b = format!("{base} Another, different question {}", "y".repeat(200));
        let (ha, hb) = (blocks(&a), blocks(&b));
        let common = base.len() / 64;
        assert_eq!(ha[..common], hb[..common]);
        assert_ne!(ha.last(), hb.last());
    }

    #[test]
    fn model_and_piece_boundaries_change_hashes() {
        let s = "x".repeat(200);
        assert_ne!(
            block_hashes("m1", &text(&s), 64, 8, None),
            block_hashes("m2", &text(&s), 64, 8, None)
        );
        let split = vec![
            Piece::Text(Cow::Borrowed(&s[..100])),
            Piece::Text(Cow::Borrowed(&s[100..])),
        ];
        assert_ne!(
            block_hashes("m", &split, 64, 8, None).blocks[1..],
            blocks(&s)[1..]
        );
        // Token ids hash as 4 bytes each.
        let toks = vec![Piece::Tokens((0..64).collect())];
        assert_eq!(block_hashes("m", &toks, 64, 256, None).blocks.len(), 4);
    }

    /// The blind spot of a sparse index: turn 2 must find turn 1's *last* block, wherever it
    /// fell, not only the positions both prompts happen to probe.
    #[test]
    fn a_later_turn_finds_exactly_how_far_the_earlier_turn_went() {
        for turn1_blocks in 1..=70usize {
            let store = MemoryStore::new();
            let idx = index(&store);
            let t1: String = (0..turn1_blocks * 64 - 1)
                .map(|i| (b'a' + (i % 26) as u8) as char)
                .collect();
            let h1 = blocks(&t1);
            assert_eq!(h1.len(), turn1_blocks);
            // Every pod served the shared start; A served the whole first turn.
            let shared = &h1[..h1.len().min(3)];
            idx.record(shared, B, &idx.lookup(shared));
            idx.record(&h1, A, &idx.lookup(&h1));
            // Turn 2 resends turn 1 as its first piece and adds the reply and a question.
            let more = "z".repeat(900);
            let t2 = vec![
                Piece::Text(Cow::Borrowed(t1.as_str())),
                Piece::Text(Cow::Borrowed("assistant: ok. user: and then?")),
                Piece::Text(Cow::Borrowed(more.as_str())),
            ];
            let h2 = block_hashes("m", &t2, 64, 256, None).blocks;
            let m = idx.lookup(&h2);
            assert_eq!(
                m.blocks_for(A),
                turn1_blocks as u32,
                "turn 1 of {turn1_blocks}"
            );
            assert_eq!(
                m.blocks_for(B),
                shared.len() as u32,
                "turn 1 of {turn1_blocks}"
            );
        }
    }

    #[test]
    fn a_prompt_that_diverged_inside_a_page_still_shares_the_anchor() {
        let store = MemoryStore::new();
        let idx = index(&store);
        let doc = "a document read by many questions. ".repeat(40); // 1400 chars: 21 blocks
        let q1 = blocks(&format!("{doc} first question {}", "x".repeat(300)));
        idx.record(&q1, A, &idx.lookup(&q1));
        let q2 = blocks(&format!("{doc} second question {}", "y".repeat(300)));
        let m = idx.lookup(&q2);
        // The page starting at block 16 is where they diverge: A holds at least its anchor.
        assert_eq!(m.blocks_for(A), 17);
    }

    #[test]
    fn repeats_write_nothing_and_a_new_turn_writes_only_what_changed() {
        let store = MemoryStore::new();
        let idx = index(&store);
        let t1 = "conversation text that keeps growing ".repeat(60); // ~2200 chars: 34 blocks
        let h1 = blocks(&t1);
        assert_eq!(idx.record(&h1, A, &idx.lookup(&h1)), 3);
        assert_eq!(idx.record(&h1, A, &idx.lookup(&h1)), 0);
        let h2 = blocks(&format!("{t1} {}", "more words ".repeat(60))); // 45 blocks
                                                                        // Pages 0 and 1 are unchanged; page 2 grows.
        assert_eq!(idx.record(&h2, A, &idx.lookup(&h2)), 1);
        // The old, shorter entry of A in page 2 was replaced, not kept beside the new one.
        let m = idx.lookup(&h2);
        assert_eq!(m.pages[2].as_ref().unwrap().0.entries.len(), 1);
        assert_eq!(m.blocks_for(A), h2.len() as u32);
        // Another pod serving the same prompt writes every page once.
        assert_eq!(idx.record(&h2, B, &m), 3);
        let m = idx.lookup(&h2);
        let n = h2.len() as u32;
        assert_eq!((m.blocks_for(A), m.blocks_for(B)), (n, n));
    }

    #[test]
    fn one_lost_page_does_not_hide_the_rest_of_the_prefix() {
        let store = MemoryStore::new();
        let idx = index(&store);
        let h = blocks(&"some shared document text ".repeat(120)); // 48 blocks
        idx.record(&h, A, &PrefixMatch::default());
        // Another prefix takes page 1's slot.
        let other = Page {
            anchor: 1,
            entries: vec![],
        };
        store.set(&idx.key(h[16]), &other.encode(), None).unwrap();
        assert_eq!(idx.lookup(&h).blocks_for(A), h.len() as u32);
    }

    #[test]
    fn a_long_prompt_writes_one_page_per_sixteen_blocks() {
        let store = MemoryStore::new();
        let idx = index(&store);
        let h = blocks(&"a long shared document, read by many questions. ".repeat(400));
        assert_eq!(h.len(), 256);
        assert_eq!(idx.record(&h, A, &PrefixMatch::default()), 16);
        assert_eq!(store.len(), 16);
    }

    #[test]
    fn memory_is_bounded_by_slots_and_entries() {
        let store = MemoryStore::new();
        let idx = PrefixIndex::new(&store, "pool", 16, 16, 4);
        for i in 0..100 {
            let p = format!("{i:04} unique prompt text long enough {}", "z".repeat(1500));
            let h = blocks(&p);
            idx.record(&h, i % 7, &idx.lookup(&h));
        }
        assert!(store.len() <= 16, "{} keys", store.len());
        let shared = blocks(&"shared ".repeat(100));
        for pod in 0..10 {
            idx.record(&shared, pod, &idx.lookup(&shared));
        }
        assert_eq!(idx.lookup(&shared).per_pod.len(), 4);
    }

    #[test]
    fn pages_round_trip_and_reject_garbage() {
        let p = Page {
            anchor: 42,
            entries: vec![
                Entry {
                    pod: 7,
                    depth: 16,
                    fingerprint: 9,
                },
                Entry {
                    pod: 8,
                    depth: 1,
                    fingerprint: 0xFFFF_FFFF,
                },
            ],
        };
        let bytes = p.encode();
        assert_eq!(bytes.len(), 9 + 18);
        assert_eq!(Page::decode(&bytes), Some(p));
        for cut in 0..bytes.len() {
            assert_eq!(Page::decode(&bytes[..cut]), None);
        }
        assert_eq!(Page::decode(&[0, 0, 0, 0, 0, 0, 0, 0, 2, 1]), None);
    }

    #[test]
    fn the_replica_key_follows_the_first_user_message() {
        let sys = "You are a helpful assistant. ".repeat(30);
        let turn = |user: &str, more: &[&str]| -> u64 {
            let mut pieces = vec![
                Piece::Text(Cow::Borrowed("system")),
                Piece::Text(Cow::Owned(sys.clone())),
                Piece::Text(Cow::Borrowed("user")),
                Piece::Text(Cow::Owned(user.to_string())),
            ];
            pieces.extend(more.iter().map(|m| Piece::Text(Cow::Owned(m.to_string()))));
            block_hashes("m", &pieces, 64, 256, Some(4)).key
        };
        let c1 = turn("what is a KV cache?", &[]);
        let c1_turn2 = turn(
            "what is a KV cache?",
            &["assistant", "memory.", "user", "and?"],
        );
        let c2 = turn("how do LoRA adapters work?", &[]);
        assert_eq!(c1, c1_turn2);
        assert_ne!(c1, c2);
        // Without messages, the key covers the first 16 blocks.
        let doc = "plain completion prompt ".repeat(100);
        let a = block_hashes("m", &text(&doc), 64, 256, None);
        let b = block_hashes("m", &text(&format!("{doc} tail")), 64, 256, None);
        assert_eq!(a.key, a.blocks[15]);
        assert_eq!(a.key, b.key);
    }
}
