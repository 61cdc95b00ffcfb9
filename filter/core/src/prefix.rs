//! Approximate prefix-cache affinity: which pod most likely still holds a prompt's prefix.
//!
//! A prompt is cut into blocks of `block_chars` characters (≈ 16 tokens, vLLM's block size) and
//! each block gets a hash chained over all previous ones (xxHash64, seeded with the model name,
//! as GAIE does), so block `i`'s hash stands for the whole prefix up to it. After a pick, the
//! chosen pod is recorded for every block; the next request sharing that prefix finds it.
//!
//! The index lives in shared data, so every Envoy worker sees the same affinity (a
//! conversation's next turn may arrive on another connection and worker). Memory is bounded: a
//! fixed number of slots per pool, `slot = hash % index_slots`; a slot stores the full hash and
//! the last few pods, and a colliding block simply overwrites it (an LRU by construction).
//!
//! Slot encoding: `hash u64 | count u8 | (len u8 | address) * count`, little-endian.

use crate::request::Piece;
use crate::store::SharedStore;
use xxhash_rust::xxh64::{xxh64, Xxh64};

/// Past the power-of-two positions, every `STRIDE`-th block is indexed too.
const STRIDE: usize = 32;

/// Whether block `i` of an `n`-block prompt is kept in (and looked up in) the index: blocks
/// 1, 2, 4, 8, … (counting from one), every 32nd, and the last. A prompt costs at most
/// 13 index writes (256 blocks) — 6 for a 2 KB one — instead of one per block, while short
/// prompts and the first turns of a conversation still match at fine resolution (a second
/// turn finds the first turn's blocks 1, 2, 4, 8, …) and long documents every 2 KB.
pub fn indexed(i: usize, n: usize) -> bool {
    let k = i + 1;
    k.is_power_of_two() || k % STRIDE == 0 || k == n
}

/// Separates pieces in the hashed stream, so `["ab","c"]` and `["a","bc"]` differ.
const PIECE_SEPARATOR: u8 = 0x1E;

/// Chained hashes of the prompt's full blocks (a trailing partial block is not hashed, like a
/// model server that caches only full blocks), at most `max_blocks`.
pub fn block_hashes(
    model: &str,
    pieces: &[Piece<'_>],
    block_chars: usize,
    max_blocks: usize,
) -> Vec<u64> {
    let mut out = Vec::new();
    if block_chars == 0 || max_blocks == 0 {
        return out;
    }
    let mut chain = BlockChain {
        hasher: Xxh64::new(xxh64(model.as_bytes(), 0)),
        filled: 0,
        block_chars,
        max_blocks,
        out: &mut out,
    };
    for piece in pieces {
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
        if chain.full() {
            break;
        }
    }
    out
}

struct BlockChain<'o> {
    hasher: Xxh64,
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
        while !bytes.is_empty() && !self.full() {
            let take = (self.block_chars - self.filled).min(bytes.len());
            let (head, rest) = bytes.split_at(take);
            self.hasher.update(head);
            self.filled += take;
            bytes = rest;
            if self.filled == self.block_chars {
                let h = self.hasher.digest();
                self.out.push(h);
                self.hasher = Xxh64::new(h);
                self.filled = 0;
            }
        }
    }
}

/// One slot of the index, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub hash: u64,
    /// Most recent first.
    pub pods: Vec<String>,
}

impl Slot {
    pub fn encode(&self) -> Vec<u8> {
        let pods: Vec<&String> = self
            .pods
            .iter()
            .filter(|p| p.len() <= 255)
            .take(255)
            .collect();
        let mut out = Vec::with_capacity(9 + pods.iter().map(|p| p.len() + 1).sum::<usize>());
        out.extend_from_slice(&self.hash.to_le_bytes());
        out.push(pods.len() as u8);
        for p in pods {
            out.push(p.len() as u8);
            out.extend_from_slice(p.as_bytes());
        }
        out
    }

    /// `None` for bytes that are not a slot (treated as an empty slot).
    pub fn decode(bytes: &[u8]) -> Option<Slot> {
        let (h, rest) = (bytes.len() >= 9).then(|| bytes.split_at(8))?;
        let hash = u64::from_le_bytes(h.try_into().ok()?);
        let (&n, mut rest) = rest.split_first()?;
        let mut pods = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            let (&len, r) = rest.split_first()?;
            let len = usize::from(len);
            let (addr, r) = (r.len() >= len).then(|| r.split_at(len))?;
            pods.push(std::str::from_utf8(addr).ok()?.to_string());
            rest = r;
        }
        rest.is_empty().then_some(Slot { hash, pods })
    }
}

/// What a lookup found: per pod, how many leading blocks it (probably) holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Blocks in the prompt.
    pub total: u32,
    /// `(address, matched leading blocks)`.
    pub per_pod: Vec<(String, u32)>,
    /// Slots read while matching (block `i` of the prompt hit slot `hits[i]`), with CAS tokens,
    /// reused when recording so a hit costs no second read. `None`: the block was not found.
    hits: Vec<Option<(Slot, u32)>>,
}

impl PrefixMatch {
    /// Matched leading blocks for `addr`.
    pub fn blocks_for(&self, addr: &str) -> u32 {
        self.per_pod
            .iter()
            .find(|(a, _)| a == addr)
            .map(|(_, n)| *n)
            .unwrap_or(0)
    }
}

/// A pool's shared prefix index.
pub struct PrefixIndex<'s, S: SharedStore> {
    store: &'s S,
    pool: &'s str,
    slots: u32,
    pods_per_block: usize,
}

impl<'s, S: SharedStore> PrefixIndex<'s, S> {
    pub fn new(store: &'s S, pool: &'s str, slots: u32, pods_per_block: usize) -> Self {
        PrefixIndex {
            store,
            pool,
            slots: slots.max(1),
            pods_per_block: pods_per_block.max(1),
        }
    }

    fn key(&self, hash: u64) -> String {
        format!("llmr/px/{}/{}", self.pool, hash % u64::from(self.slots))
    }

    /// Walks the [`indexed`] blocks from the start until two of them in a row are found in no
    /// slot. Because hashes are chained, a pod found at block `i` held the whole prefix `0..=i`
    /// when it was recorded; one missing block (its slot taken by a colliding prefix) is skipped.
    pub fn lookup(&self, hashes: &[u64]) -> PrefixMatch {
        let mut m = PrefixMatch {
            total: hashes.len() as u32,
            ..PrefixMatch::default()
        };
        let mut misses = 0;
        let n = hashes.len();
        for (i, &h) in hashes.iter().enumerate() {
            if !indexed(i, n) {
                m.hits.push(None);
                continue;
            }
            let found = self.store.get(&self.key(h)).and_then(|(bytes, cas)| {
                Slot::decode(&bytes)
                    .filter(|s| s.hash == h)
                    .map(|s| (s, cas))
            });
            let Some((slot, cas)) = found else {
                misses += 1;
                if misses >= 2 {
                    break;
                }
                m.hits.push(None);
                continue;
            };
            misses = 0;
            let depth = i as u32 + 1;
            for pod in &slot.pods {
                match m.per_pod.iter_mut().find(|(a, _)| a == pod) {
                    Some((_, n)) => *n = depth,
                    None => m.per_pod.push((pod.clone(), depth)),
                }
            }
            m.hits.push(Some((slot, cas)));
        }
        m
    }

    /// Records that `pod` now holds the prompt's blocks. Slots that already name `pod` first
    /// are left alone; the rest are written (blindly past the first miss: such a slot holds
    /// another prefix, which the newer one replaces). Best effort: a lost CAS race is ignored.
    pub fn record(&self, hashes: &[u64], pod: &str, found: &PrefixMatch) {
        let n = hashes.len();
        for (i, &h) in hashes.iter().enumerate().filter(|(i, _)| indexed(*i, n)) {
            match found.hits.get(i).and_then(Option::as_ref) {
                Some((slot, cas)) => {
                    if slot.pods.first().map(String::as_str) == Some(pod) {
                        continue;
                    }
                    let mut pods = Vec::with_capacity(self.pods_per_block);
                    pods.push(pod.to_string());
                    pods.extend(
                        slot.pods
                            .iter()
                            .filter(|p| p.as_str() != pod)
                            .take(self.pods_per_block - 1)
                            .cloned(),
                    );
                    let _ =
                        self.store
                            .set(&self.key(h), &Slot { hash: h, pods }.encode(), Some(*cas));
                }
                None => {
                    let slot = Slot {
                        hash: h,
                        pods: vec![pod.to_string()],
                    };
                    let _ = self.store.set(&self.key(h), &slot.encode(), None);
                }
            }
        }
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

    #[test]
    fn only_full_blocks_are_hashed_and_capped() {
        assert_eq!(block_hashes("m", &text(&"a".repeat(62)), 64, 256).len(), 0);
        // 64 chars + the piece separator = 65 bytes: one full block.
        assert_eq!(block_hashes("m", &text(&"a".repeat(64)), 64, 256).len(), 1);
        assert_eq!(
            block_hashes("m", &text(&"a".repeat(64 * 10)), 64, 256).len(),
            10
        );
        assert_eq!(
            block_hashes("m", &text(&"a".repeat(64 * 10)), 64, 4).len(),
            4
        );
        assert!(block_hashes("m", &text("abc"), 64, 0).is_empty());
    }

    #[test]
    fn a_shared_prefix_shares_leading_hashes_only() {
        let base = "You are a helpful assistant. ".repeat(20);
        let a = format!("{base} Question one?");
        let b = format!(
            "{base} Another, different question that is long enough to fill more blocks {}",
            "y".repeat(200)
        );
        let a = format!("{a} {}", "x".repeat(200));
        let ha = block_hashes("m", &text(&a), 64, 256);
        let hb = block_hashes("m", &text(&b), 64, 256);
        let common = base.len() / 64;
        assert_eq!(ha[..common], hb[..common]);
        assert_ne!(ha.last(), hb.last());
    }

    #[test]
    fn model_and_piece_boundaries_change_hashes() {
        let s = "x".repeat(200);
        assert_ne!(
            block_hashes("m1", &text(&s), 64, 8),
            block_hashes("m2", &text(&s), 64, 8)
        );
        let split = vec![
            Piece::Text(Cow::Borrowed(&s[..100])),
            Piece::Text(Cow::Borrowed(&s[100..])),
        ];
        let whole = text(&s);
        assert_ne!(
            block_hashes("m", &split, 64, 8)[1..],
            block_hashes("m", &whole, 64, 8)[1..]
        );
        // Token ids hash as 4 bytes each.
        let toks = vec![Piece::Tokens((0..64).collect())];
        assert_eq!(block_hashes("m", &toks, 64, 256).len(), 4);
    }

    #[test]
    fn lookup_finds_the_pod_that_served_the_prefix() {
        let store = MemoryStore::new();
        let idx = PrefixIndex::new(&store, "pool", 65_536, 4);
        let conv = "system prompt and a long first turn ".repeat(30);
        let h1 = block_hashes("m", &text(&conv), 64, 256);
        let miss = idx.lookup(&h1);
        assert_eq!(miss.per_pod, vec![]);
        idx.record(&h1, "10.0.0.1:8000", &miss);
        // Second turn: same prefix plus more text.
        let turn2 = format!("{conv} and the second turn, which adds some more words to it");
        let h2 = block_hashes("m", &text(&turn2), 64, 256);
        let found = idx.lookup(&h2);
        assert_eq!(found.blocks_for("10.0.0.1:8000"), h1.len() as u32);
        assert_eq!(found.total, h2.len() as u32);
        idx.record(&h2, "10.0.0.2:8000", &found);
        let again = idx.lookup(&h2);
        assert_eq!(again.blocks_for("10.0.0.2:8000"), h2.len() as u32);
        assert_eq!(again.blocks_for("10.0.0.1:8000"), h1.len() as u32);
    }

    #[test]
    fn one_lost_block_does_not_hide_the_rest_of_the_prefix() {
        let store = MemoryStore::new();
        let idx = PrefixIndex::new(&store, "pool", 65_536, 4);
        let h = block_hashes(
            "m",
            &text(&"some shared document text ".repeat(40)),
            64,
            256,
        );
        idx.record(&h, "a:1", &PrefixMatch::default());
        // Another prefix takes block 3's slot.
        let key = idx.key(h[3]);
        store
            .set(
                &key,
                &Slot {
                    hash: 1,
                    pods: vec!["b:2".into()],
                }
                .encode(),
                None,
            )
            .unwrap();
        assert_eq!(idx.lookup(&h).blocks_for("a:1"), h.len() as u32);
    }

    #[test]
    fn a_long_prompt_writes_a_bounded_number_of_slots_and_still_matches() {
        let store = MemoryStore::new();
        let idx = PrefixIndex::new(&store, "pool", 65_536, 4);
        let doc = "a long shared document, read by many questions. ".repeat(400);
        let h = block_hashes("m", &text(&doc), 64, 256);
        assert_eq!(h.len(), 256);
        idx.record(&h, "a:1", &PrefixMatch::default());
        // 1, 2, 4, …, 256 (9) and 32, 64, …, 256 (8, 4 of them powers of two).
        assert_eq!(store.len(), 9 + 4);
        // A question about the document matches at the last indexed block inside the document.
        let q = format!("{doc} What does it say about slots?");
        let hq = block_hashes("m", &text(&q), 64, 256);
        let m = idx.lookup(&hq);
        assert_eq!(m.blocks_for("a:1"), 256);
        // A conversation's second turn matches its first, short turn block by block.
        let t1 = "system: be brief. user: hello there, how are you today? ".repeat(3);
        let h1 = block_hashes("m", &text(&t1), 64, 256);
        idx.record(&h1, "b:2", &idx.lookup(&h1));
        let t2 = format!("{t1} assistant: fine. user: and now a follow-up question");
        let m2 = idx.lookup(&block_hashes("m", &text(&t2), 64, 256));
        // The first turn's last block is not a probe point of the longer second turn: the
        // match is the largest power of two below it.
        let expect = 1u32 << (u32::BITS - 1 - (h1.len() as u32).leading_zeros());
        assert_eq!(
            m2.blocks_for("b:2"),
            expect,
            "{} blocks in turn 1",
            h1.len()
        );
        assert!(expect * 2 > h1.len() as u32);
    }

    #[test]
    fn memory_is_bounded_by_slots() {
        let store = MemoryStore::new();
        let idx = PrefixIndex::new(&store, "pool", 16, 2);
        for i in 0..100 {
            let p = format!(
                "{i:04} unique prompt text that is long enough for several blocks {}",
                "z".repeat(300)
            );
            let h = block_hashes("m", &text(&p), 64, 256);
            let m = idx.lookup(&h);
            idx.record(&h, &format!("10.0.0.{}:1", i % 7), &m);
        }
        assert!(store.len() <= 16, "{} keys", store.len());
    }

    #[test]
    fn slots_round_trip_and_reject_garbage() {
        let s = Slot {
            hash: 42,
            pods: vec!["a:1".into(), "b:2".into()],
        };
        assert_eq!(Slot::decode(&s.encode()), Some(s));
        assert_eq!(Slot::decode(&[1, 2, 3]), None);
        assert_eq!(Slot::decode(&[0, 0, 0, 0, 0, 0, 0, 0, 2, 1, b'a']), None);
    }
}
