//! LoRA adapters in vLLM's two tiers: `max_loras` GPU slots and a CPU cache of
//! `max_cpu_loras` adapters, both least-recently-used.
//!
//! As in vLLM's `LRUCacheLoRAModelManager`, an adapter must be registered in the CPU cache to
//! be activated in a GPU slot: one that is not in the CPU cache is first read from disk
//! (expensive), one that is only swaps in (cheap). GPU-resident adapters stay in the CPU cache;
//! the CPU cache evicts the least recently used adapter that is not in a GPU slot.

use std::collections::HashSet;
use std::sync::Arc;

/// How an adapter got into its GPU slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// It was already resident: nothing to pay.
    Resident,
    /// Swapped in from the CPU cache.
    FromCpu,
    /// Read from disk (into the CPU cache) and swapped in.
    FromDisk,
}

/// Adapters of one pod: GPU slots and CPU cache, each least-recently-used first.
#[derive(Debug)]
pub struct LoraSlots {
    max: usize,
    max_cpu: usize,
    resident: Vec<Arc<str>>,
    cpu: Vec<Arc<str>>,
    loads: u64,
    disk_loads: u64,
}

fn touch_in(list: &mut Vec<Arc<str>>, name: &str) -> bool {
    match list.iter().position(|r| &**r == name) {
        Some(i) => {
            let r = list.remove(i);
            list.push(r);
            true
        }
        None => false,
    }
}

impl LoraSlots {
    /// `max` GPU slots and a CPU cache of `max_cpu` adapters (raised to `max` if smaller, as
    /// vLLM requires `max_cpu_loras >= max_loras`), all empty.
    pub fn new(max: usize, max_cpu: usize) -> Self {
        LoraSlots {
            max,
            max_cpu: max_cpu.max(max),
            resident: Vec::new(),
            cpu: Vec::new(),
            loads: 0,
            disk_loads: 0,
        }
    }

    /// Number of GPU slots.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Size of the CPU cache.
    pub fn max_cpu(&self) -> usize {
        self.max_cpu
    }

    /// Adapters put into a GPU slot so far, from either tier (a reload after eviction counts
    /// again).
    pub fn loads(&self) -> u64 {
        self.loads
    }

    /// The subset of [`Self::loads`] that had to be read from disk.
    pub fn disk_loads(&self) -> u64 {
        self.disk_loads
    }

    /// Whether `name` sits in a GPU slot.
    pub fn is_resident(&self, name: &str) -> bool {
        self.resident.iter().any(|r| &**r == name)
    }

    /// Whether `name` is in the CPU cache (GPU-resident adapters are too).
    pub fn in_cpu(&self, name: &str) -> bool {
        self.cpu.iter().any(|r| &**r == name)
    }

    /// GPU-resident adapter names, least recently used first.
    pub fn resident(&self) -> impl Iterator<Item = &str> {
        self.resident.iter().map(|r| &**r)
    }

    /// CPU-cached adapter names, least recently used first.
    pub fn cached(&self) -> impl Iterator<Item = &str> {
        self.cpu.iter().map(|r| &**r)
    }

    /// Marks `name` as just used (in both tiers).
    pub fn touch(&mut self, name: &str) {
        touch_in(&mut self.resident, name);
        touch_in(&mut self.cpu, name);
    }

    /// Whether `name` could be put in a slot now: a slot is free or holds an adapter not in
    /// `busy`.
    pub fn can_load(&self, busy: &HashSet<&str>) -> bool {
        self.max > 0
            && (self.resident.len() < self.max
                || self.resident.iter().any(|r| !busy.contains(&**r)))
    }

    /// Puts `name` in a GPU slot, evicting the least recently used adapter not in `busy` when
    /// the slots are full, and says where it came from; `None` (and no change) when no slot
    /// can be had.
    pub fn load(&mut self, name: &Arc<str>, busy: &HashSet<&str>) -> Option<Load> {
        if self.is_resident(name) {
            self.touch(name);
            return Some(Load::Resident);
        }
        if !self.can_load(busy) {
            return None;
        }
        if self.resident.len() >= self.max {
            if let Some(i) = self.resident.iter().position(|r| !busy.contains(&**r)) {
                self.resident.remove(i);
            }
        }
        let from = if touch_in(&mut self.cpu, name) {
            Load::FromCpu
        } else {
            if self.cpu.len() >= self.max_cpu {
                let victim = self.cpu.iter().position(|c| !self.is_resident(c));
                if let Some(i) = victim {
                    self.cpu.remove(i);
                }
            }
            self.cpu.push(name.clone());
            self.disk_loads += 1;
            Load::FromDisk
        };
        self.resident.push(name.clone());
        self.loads += 1;
        Some(from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arc(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn evicts_lru_not_busy() {
        let mut s = LoraSlots::new(2, 2);
        let (a, b, c) = (arc("a"), arc("b"), arc("c"));
        let none = HashSet::new();
        assert_eq!(s.load(&a, &none), Some(Load::FromDisk));
        assert_eq!(s.load(&b, &none), Some(Load::FromDisk));
        s.touch("a");
        assert_eq!(s.load(&c, &none), Some(Load::FromDisk));
        assert!(s.is_resident("a") && s.is_resident("c") && !s.is_resident("b"));
        let busy: HashSet<&str> = ["a", "c"].into_iter().collect();
        assert_eq!(s.load(&b, &busy), None);
        assert_eq!(s.load(&a, &busy), Some(Load::Resident));
        assert_eq!((s.loads(), s.disk_loads()), (3, 3));
        assert!(!LoraSlots::new(0, 4).can_load(&none));
    }

    #[test]
    fn cpu_tier_makes_reloads_cheap_until_it_overflows() {
        // 1 GPU slot, 3 in the CPU cache.
        let mut s = LoraSlots::new(1, 3);
        let none = HashSet::new();
        let names: Vec<Arc<str>> = ["a", "b", "c", "d"].into_iter().map(arc).collect();
        for n in &names[..3] {
            assert_eq!(s.load(n, &none), Some(Load::FromDisk));
        }
        // a, b, c are all in the CPU cache: swapping back is from CPU.
        assert_eq!(s.load(&names[0], &none), Some(Load::FromCpu));
        assert_eq!(s.load(&names[1], &none), Some(Load::FromCpu));
        // d evicts the least recently used CPU entry that is not on the GPU: c.
        assert_eq!(s.load(&names[3], &none), Some(Load::FromDisk));
        assert!(!s.in_cpu("c") && s.in_cpu("a") && s.in_cpu("b") && s.in_cpu("d"));
        assert_eq!(s.load(&names[2], &none), Some(Load::FromDisk));
        assert_eq!((s.loads(), s.disk_loads()), (7, 5));
        // max_cpu below max is raised to max (vLLM requires max_cpu_loras >= max_loras).
        assert_eq!(LoraSlots::new(4, 1).max_cpu(), 4);
    }
}
