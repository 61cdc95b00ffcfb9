//! Paged KV cache with automatic prefix caching, after vLLM's block manager.
//!
//! Blocks hold `block_size` tokens. A full prompt block gets a chained hash; a block whose last
//! holder finished keeps its hash and goes to an LRU of free-but-cached blocks, so a later prompt
//! with the same prefix can take it back without prefill. A fresh allocation takes an uncached
//! free block first and otherwise evicts the least recently freed cached block.

use std::collections::{BTreeMap, HashMap};

/// Block index inside the cache.
pub type BlockId = u32;

/// The block pool of one pod.
#[derive(Debug)]
pub struct KvCache {
    block_size: u32,
    refcnt: Vec<u32>,
    hash_of: Vec<Option<u64>>,
    lru_key: Vec<u64>,
    by_hash: HashMap<u64, BlockId>,
    free_plain: Vec<BlockId>,
    free_cached: BTreeMap<u64, BlockId>,
    stamp: u64,
    used: u32,
}

impl KvCache {
    /// A cache of `num_blocks` empty blocks.
    pub fn new(num_blocks: u32, block_size: u32) -> Self {
        let n = num_blocks as usize;
        KvCache {
            block_size: block_size.max(1),
            refcnt: vec![0; n],
            hash_of: vec![None; n],
            lru_key: vec![0; n],
            by_hash: HashMap::new(),
            // Pop from the end: block 0 is handed out first.
            free_plain: (0..num_blocks).rev().collect(),
            free_cached: BTreeMap::new(),
            stamp: 0,
            used: 0,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Total number of blocks.
    pub fn num_blocks(&self) -> u32 {
        self.refcnt.len() as u32
    }

    /// Blocks held by at least one sequence.
    pub fn used_blocks(&self) -> u32 {
        self.used
    }

    /// Blocks that an allocation can take (uncached free plus evictable cached).
    pub fn num_free(&self) -> u32 {
        (self.free_plain.len() + self.free_cached.len()) as u32
    }

    /// Free blocks that still hold a cached prefix.
    pub fn num_cached_free(&self) -> u32 {
        self.free_cached.len() as u32
    }

    /// Fraction of blocks in use, as vLLM reports `kv_cache_usage_perc` (0..=1).
    pub fn usage(&self) -> f64 {
        if self.refcnt.is_empty() {
            0.0
        } else {
            f64::from(self.used) / self.refcnt.len() as f64
        }
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size)
    }

    /// Leading blocks of `hashes` that are cached (held or free), and how many of those are free.
    pub fn prefix_hits(&self, hashes: &[u64]) -> (u32, u32) {
        let mut hits = 0;
        let mut free = 0;
        for h in hashes {
            match self.by_hash.get(h) {
                Some(&b) => {
                    hits += 1;
                    if self.refcnt[b as usize] == 0 {
                        free += 1;
                    }
                }
                None => break,
            }
        }
        (hits, free)
    }

    /// Takes the cached block holding `hash` (the caller checked it with [`Self::prefix_hits`]).
    pub fn acquire_cached(&mut self, hash: u64) -> Option<BlockId> {
        let b = *self.by_hash.get(&hash)?;
        self.take(b);
        Some(b)
    }

    /// Takes a fresh block, evicting the least recently freed cached block when needed.
    pub fn alloc(&mut self) -> Option<BlockId> {
        let b = match self.free_plain.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.free_cached.pop_first()?;
                if let Some(h) = self.hash_of[b as usize].take() {
                    if self.by_hash.get(&h) == Some(&b) {
                        self.by_hash.remove(&h);
                    }
                }
                b
            }
        };
        self.refcnt[b as usize] = 1;
        self.used += 1;
        Some(b)
    }

    fn take(&mut self, b: BlockId) {
        let i = b as usize;
        if self.refcnt[i] == 0 {
            self.free_cached.remove(&self.lru_key[i]);
            self.used += 1;
        }
        self.refcnt[i] += 1;
    }

    /// Gives blocks back. Tail blocks are released first so they are evicted first.
    pub fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            let i = b as usize;
            if self.refcnt[i] == 0 {
                continue;
            }
            self.refcnt[i] -= 1;
            if self.refcnt[i] == 0 {
                self.used -= 1;
                if self.hash_of[i].is_some() {
                    self.stamp += 1;
                    self.lru_key[i] = self.stamp;
                    self.free_cached.insert(self.stamp, b);
                } else {
                    self.free_plain.push(b);
                }
            }
        }
    }

    /// Marks a full, computed block as holding the prefix whose chained hash is `hash`.
    pub fn register(&mut self, block: BlockId, hash: u64) {
        let i = block as usize;
        if self.hash_of[i].is_some() || self.by_hash.contains_key(&hash) {
            return;
        }
        self.hash_of[i] = Some(hash);
        self.by_hash.insert(hash, block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_blocks_survive_release_and_are_evicted_last_in_lru_order() {
        let mut kv = KvCache::new(4, 16);
        let a = kv.alloc().unwrap_or(99);
        let b = kv.alloc().unwrap_or(99);
        kv.register(a, 11);
        kv.register(b, 22);
        assert_eq!(kv.used_blocks(), 2);
        kv.release(&[a, b]);
        assert_eq!(kv.used_blocks(), 0);
        assert_eq!(kv.prefix_hits(&[11, 22, 33]), (2, 2));
        // Two plain blocks go first, then the cached tail block (22), then the head (11).
        let _ = kv.alloc();
        let _ = kv.alloc();
        assert_eq!(kv.prefix_hits(&[11, 22]), (2, 2));
        let _ = kv.alloc();
        assert_eq!(kv.prefix_hits(&[11, 22]), (1, 1));
        assert_eq!(kv.acquire_cached(11), Some(a));
        assert_eq!(kv.num_free(), 0);
        assert_eq!(kv.alloc(), None);
        assert!((kv.usage() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn shared_block_counts_once() {
        let mut kv = KvCache::new(2, 16);
        let a = kv.alloc().unwrap_or(99);
        kv.register(a, 5);
        assert_eq!(kv.acquire_cached(5), Some(a));
        assert_eq!(kv.used_blocks(), 1);
        kv.release(&[a]);
        assert_eq!(kv.used_blocks(), 1);
        kv.release(&[a]);
        assert_eq!(kv.used_blocks(), 0);
        assert_eq!(kv.num_cached_free(), 1);
    }
}
