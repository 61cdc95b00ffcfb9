//! Finds each pool's pods: a static list, DNS (a headless Service name, re-resolved),
//! Kubernetes EndpointSlices, or the Pods of a Gateway API Inference Extension InferencePool
//! (both watched through the API server).
//!
//! Every source publishes the pool's current endpoint set on a `watch` channel as a sorted,
//! de-duplicated list; the scrape loop picks up changes at its next round, so a pod that appears
//! or vanishes shows up in the next snapshot. A source that fails keeps the last known set
//! (an API server restart must not empty the fleet), except when DNS answers authoritatively that
//! the name has no records.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use tokio::sync::watch;

use crate::config::{Discovery, DnsConfig};
use crate::endpoints::{normalise_set, Endpoints};
use crate::kube;

/// Why a discovery source could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("pool {pool}: bad static endpoint {addr:?}")]
    BadStatic { pool: String, addr: String },
    #[error("pool {pool}: cannot build the DNS resolver: {reason}")]
    Resolver { pool: String, reason: String },
    #[error("pool {pool}: {source}")]
    Kube {
        pool: String,
        source: kube::KubeError,
    },
}

/// Starts the source for one pool. Static lists are published at once; DNS and Kubernetes run
/// as tasks until `shutdown` flips to true.
pub fn start(
    pool: &str,
    discovery: &Discovery,
    shutdown: watch::Receiver<bool>,
) -> Result<watch::Receiver<Endpoints>, DiscoveryError> {
    match discovery {
        Discovery::Static(list) => {
            let mut v = Vec::with_capacity(list.len());
            for a in list {
                v.push(
                    a.parse::<SocketAddr>()
                        .map_err(|_| DiscoveryError::BadStatic {
                            pool: pool.into(),
                            addr: a.clone(),
                        })?,
                );
            }
            let (_tx, rx) = watch::channel(Arc::new(normalise_set(v)));
            Ok(rx)
        }
        Discovery::Dns(d) => {
            let resolver = dns_resolver(d).map_err(|reason| DiscoveryError::Resolver {
                pool: pool.into(),
                reason,
            })?;
            let (tx, rx) = watch::channel(Arc::new(Vec::new()));
            tokio::spawn(dns_loop(pool.to_owned(), d.clone(), resolver, tx, shutdown));
            Ok(rx)
        }
        Discovery::Kubernetes(k) => {
            let client = kube::Client::from_config(k).map_err(|source| DiscoveryError::Kube {
                pool: pool.into(),
                source,
            })?;
            let (tx, rx) = watch::channel(Arc::new(Vec::new()));
            tokio::spawn(kube::watch_loop(pool.to_owned(), client, tx, shutdown));
            Ok(rx)
        }
        Discovery::InferencePool(p) => {
            let client =
                kube::PoolClient::from_config(p).map_err(|source| DiscoveryError::Kube {
                    pool: pool.into(),
                    source,
                })?;
            let (tx, rx) = watch::channel(Arc::new(Vec::new()));
            tokio::spawn(kube::inference_pool_loop(
                pool.to_owned(),
                client,
                tx,
                shutdown,
            ));
            Ok(rx)
        }
    }
}

/// A resolver that asks the configured nameserver (UDP+TCP on its port) or, by default, the
/// system configuration. Answers are never cached: every round asks again.
pub fn dns_resolver(d: &DnsConfig) -> Result<TokioResolver, String> {
    let mut builder = match &d.nameserver {
        Some(ns) => {
            let sa: SocketAddr = ns
                .parse()
                .map_err(|_| format!("nameserver {ns:?} is not ip:port"))?;
            let mut server = NameServerConfig::udp_and_tcp(sa.ip());
            for c in &mut server.connections {
                c.port = sa.port();
            }
            let cfg = ResolverConfig::from_name_servers(vec![server]);
            TokioResolver::builder_with_config(cfg, TokioRuntimeProvider::default())
        }
        None => TokioResolver::builder_tokio().map_err(|e| e.to_string())?,
    };
    let opts = builder.options_mut();
    opts.cache_size = 0;
    opts.attempts = 2;
    opts.timeout = Duration::from_secs(2);
    if d.nameserver.is_some() {
        opts.use_hosts_file = ResolveHosts::Never;
    }
    builder.build().map_err(|e| e.to_string())
}

/// One resolution: `Ok(Some(set))` on an answer (an empty set when the name has no records),
/// `Ok(None)` never, `Err` on a transport failure (keep the previous set).
pub async fn resolve_once(
    resolver: &TokioResolver,
    name: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, String> {
    resolver.clear_cache();
    match resolver.lookup_ip(name).await {
        Ok(ips) => Ok(normalise_set(
            ips.iter()
                .map(|ip: IpAddr| SocketAddr::new(ip, port))
                .collect(),
        )),
        Err(e) if e.is_no_records_found() || e.is_nx_domain() => Ok(Vec::new()),
        Err(e) => Err(e.to_string()),
    }
}

async fn dns_loop(
    pool: String,
    d: DnsConfig,
    resolver: TokioResolver,
    tx: watch::Sender<Endpoints>,
    mut shutdown: watch::Receiver<bool>,
) {
    let every = Duration::from_millis(d.interval_ms);
    loop {
        match resolve_once(&resolver, &d.name, d.port).await {
            Ok(set) => {
                if **tx.borrow() != set {
                    tracing::info!(pool = %pool, name = %d.name, pods = set.len(), "DNS endpoints changed");
                    let _ = tx.send(Arc::new(set));
                }
            }
            Err(e) => {
                tracing::warn!(pool = %pool, name = %d.name, error = %e, "DNS lookup failed; keeping the last set")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}
