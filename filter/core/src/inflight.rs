//! The filter's own count of requests in flight per pod, shared by all Envoy workers.
//!
//! One shared-data key per pool holds a small table `address → requests sent and not yet
//! finished`. It is updated with compare-and-swap when a request is routed and when its
//! stream ends (completion, reset or client abort). When a snapshot is accepted, the table is
//! copied to a baseline key: the difference `now − baseline` is the load this proxy added (or
//! removed) since the pods were last observed, which keeps a burst between two scrapes from
//! herding onto one pod.
//!
//! Encoding: `count u16 | (len u8 | address | in_flight u32) * count`, little-endian.

use crate::store::{SharedStore, StoreError};

/// Shared-data key of a pool's live table.
pub fn key(pool: &str) -> String {
    format!("llmr/if/{pool}")
}

/// Shared-data key of a pool's table as it was when the current snapshot was accepted.
pub fn baseline_key(pool: &str) -> String {
    format!("llmr/ifb/{pool}")
}

/// A decoded table. Small (one entry per pod), kept as a vector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub entries: Vec<(String, u32)>,
}

impl Table {
    /// Decodes; a corrupt value reads as empty (it is only an estimate and heals itself).
    pub fn decode(bytes: &[u8]) -> Table {
        let mut entries = Vec::new();
        let mut rest = bytes;
        let Some((n, r)) = split_u16(rest) else {
            return Table::default();
        };
        rest = r;
        for _ in 0..n {
            let Some((&len, r)) = rest.split_first() else {
                return Table::default();
            };
            let Some((addr, r)) = split_at(r, usize::from(len)) else {
                return Table::default();
            };
            let Some((count, r)) = split_u32(r) else {
                return Table::default();
            };
            let Ok(addr) = std::str::from_utf8(addr) else {
                return Table::default();
            };
            entries.push((addr.to_string(), count));
            rest = r;
        }
        Table { entries }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + self.entries.len() * 24);
        let n = self
            .entries
            .iter()
            .filter(|(a, _)| a.len() <= 255)
            .take(usize::from(u16::MAX))
            .count();
        out.extend_from_slice(&(n as u16).to_le_bytes());
        for (addr, count) in self.entries.iter().filter(|(a, _)| a.len() <= 255).take(n) {
            out.push(addr.len() as u8);
            out.extend_from_slice(addr.as_bytes());
            out.extend_from_slice(&count.to_le_bytes());
        }
        out
    }

    /// The count for `addr` (0 when absent).
    pub fn get(&self, addr: &str) -> u32 {
        self.entries
            .iter()
            .find(|(a, _)| a == addr)
            .map(|(_, c)| *c)
            .unwrap_or(0)
    }

    fn adjust(&mut self, addr: &str, delta: i32) {
        match self.entries.iter_mut().find(|(a, _)| a == addr) {
            Some((_, c)) => *c = c.saturating_add_signed(delta),
            None if delta > 0 => self.entries.push((addr.to_string(), delta.unsigned_abs())),
            None => {}
        }
        // Idle pods that left the fleet do not accumulate.
        self.entries.retain(|(_, c)| *c > 0);
    }
}

fn split_at(b: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
    (b.len() >= n).then(|| b.split_at(n))
}

fn split_u16(b: &[u8]) -> Option<(u16, &[u8])> {
    let (h, r) = split_at(b, 2)?;
    Some((u16::from_le_bytes(h.try_into().ok()?), r))
}

fn split_u32(b: &[u8]) -> Option<(u32, &[u8])> {
    let (h, r) = split_at(b, 4)?;
    Some((u32::from_le_bytes(h.try_into().ok()?), r))
}

/// Reads a pool's live table.
pub fn read(store: &impl SharedStore, pool: &str) -> Table {
    store
        .get(&key(pool))
        .map(|(v, _)| Table::decode(&v))
        .unwrap_or_default()
}

/// Reads a pool's baseline table.
pub fn read_baseline(store: &impl SharedStore, pool: &str) -> Table {
    store
        .get(&baseline_key(pool))
        .map(|(v, _)| Table::decode(&v))
        .unwrap_or_default()
}

/// Adds `delta` to `addr`'s count with compare-and-swap; gives up after a bounded number of
/// conflicts (the count is an estimate; losing one update under extreme contention is
/// preferable to spinning inside a request). Returns whether the update landed.
pub fn adjust(store: &impl SharedStore, pool: &str, addr: &str, delta: i32) -> bool {
    let k = key(pool);
    for _ in 0..32 {
        let (mut table, cas) = match store.get(&k) {
            Some((v, cas)) => (Table::decode(&v), Some(cas)),
            None => (Table::default(), None),
        };
        table.adjust(addr, delta);
        match store.set(&k, &table.encode(), cas) {
            Ok(()) => return true,
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Failed) => return false,
        }
    }
    false
}

/// Copies a pool's live table to its baseline (called when a snapshot is accepted).
pub fn snapshot_baseline(store: &impl SharedStore, pool: &str) {
    let live = store
        .get(&key(pool))
        .map(|(v, _)| v)
        .unwrap_or_else(|| Table::default().encode());
    let _ = store.set(&baseline_key(pool), &live, None);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn counts_go_up_and_down_and_idle_entries_vanish() {
        let s = MemoryStore::new();
        assert!(adjust(&s, "p", "10.0.0.1:8000", 1));
        assert!(adjust(&s, "p", "10.0.0.1:8000", 1));
        assert!(adjust(&s, "p", "10.0.0.2:8000", 1));
        let t = read(&s, "p");
        assert_eq!(t.get("10.0.0.1:8000"), 2);
        assert_eq!(t.get("10.0.0.2:8000"), 1);
        adjust(&s, "p", "10.0.0.2:8000", -1);
        adjust(&s, "p", "10.0.0.2:8000", -1); // never below zero
        let t = read(&s, "p");
        assert_eq!(t.entries, vec![("10.0.0.1:8000".to_string(), 2)]);
        assert_eq!(read(&s, "other").entries, vec![]);
    }

    #[test]
    fn baseline_is_a_copy_at_snapshot_time() {
        let s = MemoryStore::new();
        adjust(&s, "p", "a:1", 1);
        snapshot_baseline(&s, "p");
        adjust(&s, "p", "a:1", 1);
        assert_eq!(read_baseline(&s, "p").get("a:1"), 1);
        assert_eq!(read(&s, "p").get("a:1"), 2);
    }

    #[test]
    fn corrupt_tables_read_as_empty() {
        for bad in [
            &[][..],
            &[1][..],
            &[1, 0, 5, b'a'][..],
            &[1, 0, 1, 0xFF, 1, 0, 0, 0][..],
        ] {
            assert_eq!(Table::decode(bad), Table::default(), "{bad:?}");
        }
        let t = Table {
            entries: vec![("x:1".into(), 7)],
        };
        assert_eq!(Table::decode(&t.encode()), t);
    }

    /// Two "workers" interleaving read-modify-write: CAS keeps every update.
    #[test]
    fn cas_conflicts_are_retried() {
        let s = MemoryStore::new();
        adjust(&s, "p", "a:1", 1);
        let (v, cas) = s.get(&key("p")).unwrap();
        adjust(&s, "p", "a:1", 1); // another worker wins the race
        let mut t = Table::decode(&v);
        t.adjust("a:1", 1);
        assert_eq!(
            s.set(&key("p"), &t.encode(), Some(cas)),
            Err(StoreError::CasMismatch)
        );
        assert_eq!(read(&s, "p").get("a:1"), 2);
    }
}
