//! The one door to state shared by every Envoy worker thread.
//!
//! In Envoy this is the Wasm shared-data map (one per process, keyed by VM id, with
//! compare-and-swap tokens); the filter implements [`SharedStore`] on those host calls. Tests
//! and native tools use [`MemoryStore`], which follows the same CAS rules.

use std::cell::RefCell;
use std::collections::HashMap;

/// Why a write did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Someone wrote the key since it was read; read again and retry.
    CasMismatch,
    /// The host refused for another reason.
    Failed,
}

/// A key-value map with compare-and-swap, shared by all workers.
pub trait SharedStore {
    /// The value and its CAS token, or `None` when the key was never written.
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)>;
    /// Writes `value`; with `cas = Some(token)` only if the key is unchanged since that read.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;
}

/// Read-modify-write of the value at `key` with compare-and-swap, retried (at most 32 times)
/// while another worker wrote in between. `first`: a value already read in this request, with
/// its CAS token (no read when nobody wrote since); `decode` reads a stored value (absent: the
/// default); `change` edits it and returns the bytes to store. False when the host refused or
/// the retries ran out.
pub fn update<T: Default>(
    store: &impl SharedStore,
    key: &str,
    mut first: Option<(T, Option<u32>)>,
    decode: impl Fn(&[u8]) -> T,
    mut change: impl FnMut(&mut T) -> Vec<u8>,
) -> bool {
    for _ in 0..32 {
        let (mut value, cas) = match first.take() {
            Some(read) => read,
            None => match store.get(key) {
                Some((v, cas)) => (decode(&v), Some(cas)),
                None => (T::default(), None),
            },
        };
        match store.set(key, &change(&mut value), cas) {
            Ok(()) => return true,
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Failed) => return false,
        }
    }
    false
}

/// An in-memory [`SharedStore`] with Envoy's CAS semantics, for tests and native use.
#[derive(Debug, Default)]
pub struct MemoryStore {
    map: RefCell<HashMap<String, (Vec<u8>, u32)>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of keys written.
    pub fn len(&self) -> usize {
        self.map.borrow().len()
    }

    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.map.borrow().is_empty()
    }
}

impl SharedStore for MemoryStore {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.map.borrow().get(key).cloned()
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        let mut map = self.map.borrow_mut();
        let current = map.get(key).map(|(_, c)| *c);
        if let (Some(want), Some(have)) = (cas, current) {
            if want != have {
                return Err(StoreError::CasMismatch);
            }
        }
        let next = current.unwrap_or(0).wrapping_add(1).max(1);
        map.insert(key.to_string(), (value.to_vec(), next));
        Ok(())
    }
}
