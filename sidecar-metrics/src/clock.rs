//! The wall clock in Unix milliseconds, the one time base of snapshots, frames and tallies: a
//! leaf module, so whatever stamps or checks a time needs nothing else from the crate.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix time in ms.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
