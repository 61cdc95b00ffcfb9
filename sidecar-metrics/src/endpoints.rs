//! A pool's current pod addresses as every discovery source publishes them (`crate::discovery`
//! for static lists and DNS, `crate::kube` for the API server) and the scrape loop reads them:
//! a leaf module, so the sources share the type without depending on one another.

use std::net::SocketAddr;
use std::sync::Arc;

/// The current pods of one pool.
pub type Endpoints = Arc<Vec<SocketAddr>>;

/// Sorts and de-duplicates.
pub fn normalise_set(mut v: Vec<SocketAddr>) -> Vec<SocketAddr> {
    v.sort();
    v.dedup();
    v
}
