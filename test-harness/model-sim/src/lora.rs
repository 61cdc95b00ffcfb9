//! LoRA adapter slots on the GPU: `max_loras` resident adapters, loaded on demand, evicted LRU.

use std::collections::HashSet;
use std::sync::Arc;

/// Resident adapters of one pod, in least-recently-used-first order.
#[derive(Debug)]
pub struct LoraSlots {
    max: usize,
    resident: Vec<Arc<str>>,
    loads: u64,
}

impl LoraSlots {
    /// `max` slots, all empty.
    pub fn new(max: usize) -> Self {
        LoraSlots {
            max,
            resident: Vec::new(),
            loads: 0,
        }
    }

    /// Number of slots.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Adapters loaded so far (a reload after eviction counts again).
    pub fn loads(&self) -> u64 {
        self.loads
    }

    /// Whether `name` sits in a slot.
    pub fn is_resident(&self, name: &str) -> bool {
        self.resident.iter().any(|r| &**r == name)
    }

    /// Resident adapter names, least recently used first.
    pub fn resident(&self) -> impl Iterator<Item = &str> {
        self.resident.iter().map(|r| &**r)
    }

    /// Marks `name` as just used.
    pub fn touch(&mut self, name: &str) {
        if let Some(i) = self.resident.iter().position(|r| &**r == name) {
            let r = self.resident.remove(i);
            self.resident.push(r);
        }
    }

    /// Whether `name` could be loaded now: a slot is free or holds an adapter not in `busy`.
    pub fn can_load(&self, busy: &HashSet<&str>) -> bool {
        self.max > 0
            && (self.resident.len() < self.max
                || self.resident.iter().any(|r| !busy.contains(&**r)))
    }

    /// Loads `name`, evicting the least recently used adapter not in `busy` when slots are
    /// full. Returns false (and changes nothing) when no slot can be had.
    pub fn load(&mut self, name: &Arc<str>, busy: &HashSet<&str>) -> bool {
        if self.is_resident(name) {
            self.touch(name);
            return true;
        }
        if !self.can_load(busy) {
            return false;
        }
        if self.resident.len() >= self.max {
            if let Some(i) = self.resident.iter().position(|r| !busy.contains(&**r)) {
                self.resident.remove(i);
            }
        }
        self.resident.push(name.clone());
        self.loads += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_lru_not_busy() {
        let mut s = LoraSlots::new(2);
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "c".into());
        let none = HashSet::new();
        assert!(s.load(&a, &none));
        assert!(s.load(&b, &none));
        s.touch("a");
        assert!(s.load(&c, &none));
        assert!(s.is_resident("a") && s.is_resident("c") && !s.is_resident("b"));
        let busy: HashSet<&str> = ["a", "c"].into_iter().collect();
        assert!(!s.load(&b, &busy));
        assert_eq!(s.loads(), 3);
        assert!(!LoraSlots::new(0).can_load(&none));
    }
}
