//! Starting a sidecar (or a hub): discovery for each pool, where its snapshots go, the hub's
//! stream or the subscriptions to hubs (and the tally sharing), the admin endpoints, then the
//! scrape loop; and the [`Running`] handle that stops it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use llm_router_snapshot::Snapshot;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::follow::Follow;
use super::run_loop::run_loop;
use super::{Loop, Output, PoolRt, TrimState};
use crate::admin;
use crate::budget::{Budget, Trim};
use crate::config::{Config, Mode, PoolConfig};
use crate::discovery::{self, DiscoveryError};
use crate::keys::{Credential, HubKeys};
use crate::push::{PushSetupError, Pusher};
use crate::share::TallyBoard;
use crate::stats::Stats;

/// Why the sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error(transparent)]
    Push(#[from] PushSetupError),
    #[error("hub.upstreams {hub:?}: {reason}")]
    Hub { hub: String, reason: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// What this process holds of the hub's keys: all of them in mode hub (or when it derives its own
/// credential from the hub secret), and its replica's credential.
struct HubSecrets {
    hub: Option<HubKeys>,
    credential: Credential,
}

/// The hub keys from `hub.credential_file`, else `hub.secret*`, else (the configuration from
/// before the roles were split) the push secret, logged as opening the hub to the proxy.
fn resolve_hub_keys(cfg: &Config, push_secret: &str) -> Result<HubSecrets, StartError> {
    let bad = |reason: String| StartError::Hub {
        hub: "hub.secret".into(),
        reason,
    };
    if let Some(path) = &cfg.hub.credential_file {
        let text =
            std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read {path}: {e}")))?;
        let credential = Credential::parse(&text).map_err(|e| bad(format!("{path}: {e}")))?;
        return Ok(HubSecrets {
            hub: None,
            credential,
        });
    }
    let hub_secret = cfg.resolve_hub_secret().map_err(|e| bad(e.to_string()))?;
    let uses_hub = cfg.mode == Mode::Hub || !cfg.hub.upstreams.is_empty();
    if hub_secret.is_none() && uses_hub {
        tracing::warn!("no hub.secret_file: the push secret serves as the hub secret, so whoever holds it (the proxy's environment included) can subscribe, forge frames and speak for every replica; give the hubs hub.secret_file and each gateway sidecar hub.credential_file (`sidecar-metrics credential`)");
    } else if cfg.mode == Mode::Sidecar && !cfg.hub.upstreams.is_empty() {
        tracing::warn!("this sidecar holds the hub secret: it could speak for any replica; give it hub.credential_file (`sidecar-metrics credential`) instead");
    }
    let keys = HubKeys::from_secret(hub_secret.as_deref().unwrap_or(push_secret).as_bytes());
    Ok(HubSecrets {
        credential: keys.credential(crate::share::replica_id()),
        hub: Some(keys),
    })
}

/// A started sidecar.
pub struct Running {
    /// Where its own `/metrics` and `/healthz` listen.
    pub face_addr: SocketAddr,
    /// Mode hub: where the snapshot stream listens.
    pub hub_addr: Option<SocketAddr>,
    pub stats: Arc<Stats>,
    /// Every snapshot the proxy accepted (latest), for tests and debugging.
    pub accepted: watch::Receiver<Option<Snapshot>>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops scraping, lets the last push finish, stops the face.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Asks the loop and the face to stop; [`Running::wait`] then resolves.
    pub fn signal_stop(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Resolves when the loop and the face have ended.
    pub async fn wait(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Starts discovery, the scrape loop and the face. `cfg` must be validated.
pub async fn start(cfg: Config, secret: String) -> Result<Running, StartError> {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let stats = Arc::new(Stats::default());
    let pools = cfg
        .pools
        .iter()
        .map(|p| PoolRt::start(p, &cfg, shutdown_rx.clone(), &stats))
        .collect::<Result<Vec<_>, _>>()?;
    let (frames_tx, frames_rx) = watch::channel(None);
    let board = Arc::new(TallyBoard::new(Duration::from_millis(cfg.hub.tally_ttl_ms)));
    let hub_secret = resolve_hub_keys(&cfg, &secret)?;
    let cred = hub_secret.credential;
    let out = output(
        &cfg,
        &secret,
        hub_secret.hub.clone(),
        frames_tx,
        board.clone(),
    )?;
    let mut tasks = Vec::new();
    let hub_addr = match cfg.mode {
        Mode::Hub => {
            let keys = hub_secret.hub;
            let (addr, task) =
                serve_hub(&cfg, keys, frames_rx, board, &stats, &shutdown_rx).await?;
            tasks.push(task);
            Some(addr)
        }
        Mode::Sidecar => None,
    };
    let follow = follow_hubs(&cfg, &cred, &stats, &shutdown_rx, &mut tasks)?;
    let rewrites =
        super::rewrite_sources::start(&cfg, &shutdown_rx, &mut tasks).map_err(|source| {
            DiscoveryError::Kube {
                pool: "rewrites.kubernetes".into(),
                source,
            }
        })?;
    let objectives = match &cfg.objectives {
        Some(o) => {
            let pools: Vec<String> = cfg.pools.iter().map(|p| p.name.clone()).collect();
            Some(
                crate::kube::start_objective_watch(&o.kubernetes, pools, shutdown_rx.clone())
                    .map_err(|source| DiscoveryError::Kube {
                        pool: "objectives.kubernetes".into(),
                        source,
                    })?,
            )
        }
        None => None,
    };
    let (listener, face_addr) = bind(&cfg.listen).await?;
    stats.snapshot_budget(cfg.snapshot.max_bytes);
    let (snap_tx, snap_rx) = watch::channel(None);
    log_started(&out, face_addr, hub_addr, &cfg);
    let face_task = tokio::spawn(admin::serve(
        listener,
        stats.clone(),
        cfg.scrape.interval_ms,
        shutdown_rx.clone(),
    ));
    let mut lp = Loop::new(cfg, pools, out, stats.clone(), snap_tx, cred.replica);
    lp.rewrites = rewrites;
    lp.objectives = objectives;
    let loop_task = tokio::spawn(run_loop(lp, follow, shutdown_rx));
    tasks.push(loop_task);
    tasks.push(face_task);
    Ok(Running {
        face_addr,
        hub_addr,
        stats,
        accepted: snap_rx,
        shutdown: shutdown_tx,
        tasks,
    })
}

impl PoolRt {
    /// Starts the discovery of pool `p` and takes the pods it already knows.
    fn start(
        p: &PoolConfig,
        cfg: &Config,
        shutdown: watch::Receiver<bool>,
        stats: &Stats,
    ) -> Result<PoolRt, StartError> {
        let rx = discovery::start(&p.name, &p.discovery, shutdown)?;
        let path = p
            .metrics_path
            .clone()
            .unwrap_or_else(|| cfg.scrape.path.clone());
        let filtered_path = cfg.scrape.name_filter.then(|| {
            let sep = if path.contains('?') { '&' } else { '?' };
            format!(
                "{path}{sep}{}",
                crate::engines::name_filter_query(p.engine())
            )
        });
        let mut rt = PoolRt {
            name: p.name.clone(),
            cluster: p.cluster.clone(),
            models: p.models.clone(),
            engine: p.engine(),
            path,
            filtered_path,
            rx,
            pods: Vec::new(),
        };
        let initial = rt.rx.borrow_and_update().clone();
        rt.resync(&initial, stats);
        Ok(rt)
    }
}

/// Where this process's snapshots go: the local proxy (mode sidecar) or the hub's streams.
fn output(
    cfg: &Config,
    secret: &str,
    hub_keys: Option<HubKeys>,
    frames: watch::Sender<Option<Bytes>>,
    board: Arc<TallyBoard>,
) -> Result<Output, StartError> {
    Ok(match cfg.mode {
        Mode::Sidecar => Output::Push(Box::new(Pusher::new(
            &cfg.push.address,
            &cfg.push.path,
            secret,
            Duration::from_millis(cfg.push.timeout_ms),
        )?)),
        Mode::Hub => {
            llm_router_snapshot::check_secret(secret).map_err(PushSetupError::BadSecret)?;
            Output::Publish {
                keys: hub_keys.ok_or_else(|| no_hub_secret(cfg))?,
                frames,
                board,
            }
        }
    })
}

fn no_hub_secret(cfg: &Config) -> StartError {
    StartError::Hub {
        hub: cfg.hub.listen.clone(),
        reason: "no hub secret".into(),
    }
}

/// Binds `addr`; the address it got (the port, for `:0`).
async fn bind(addr: &str) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    let bind_error = |source| StartError::Bind {
        addr: addr.to_owned(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// Mode hub: listens on `hub.listen` and serves the snapshot stream; the address it got and
/// the task.
async fn serve_hub(
    cfg: &Config,
    keys: Option<HubKeys>,
    frames: watch::Receiver<Option<Bytes>>,
    board: Arc<TallyBoard>,
    stats: &Arc<Stats>,
    shutdown: &watch::Receiver<bool>,
) -> Result<(SocketAddr, JoinHandle<()>), StartError> {
    let (listener, addr) = bind(&cfg.hub.listen).await?;
    let keys = keys.ok_or_else(|| no_hub_secret(cfg))?;
    let task = tokio::spawn(crate::hub::serve(
        listener,
        keys,
        frames,
        board,
        stats.clone(),
        shutdown.clone(),
    ));
    Ok((addr, task))
}

/// Mode sidecar with `hub.upstreams`: a subscription to each hub and, with `hub.share_ms`, this
/// replica's tally sent to them (tasks in `tasks`); `None` when it follows no hub.
fn follow_hubs(
    cfg: &Config,
    cred: &Credential,
    stats: &Arc<Stats>,
    shutdown: &watch::Receiver<bool>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<Option<Follow>, StartError> {
    if cfg.mode != Mode::Sidecar || cfg.hub.upstreams.is_empty() {
        return Ok(None);
    }
    let (tx, rx) = mpsc::channel(8);
    let mut hub_uris = Vec::with_capacity(cfg.hub.upstreams.len());
    let opts = crate::hub::SubscribeOptions {
        timeout: Duration::from_millis(cfg.hub.timeout_ms),
        max_backoff: Duration::from_secs(1),
    };
    for (i, u) in cfg.hub.upstreams.iter().enumerate() {
        let uri = crate::hub::hub_uri(u).map_err(|reason| StartError::Hub {
            hub: u.clone(),
            reason,
        })?;
        hub_uris.push(uri.clone());
        tasks.push(tokio::spawn(crate::hub::subscribe(
            i,
            uri,
            cred.clone(),
            opts,
            tx.clone(),
            stats.clone(),
            shutdown.clone(),
        )));
    }
    if cfg.hub.share_ms > 0 {
        tasks.push(spawn_share(cfg, hub_uris, cred, stats, shutdown)?);
    }
    let fallback_after = cfg.hub_fallback_after();
    stats.hub_source("hub", None);
    Ok(Some(Follow::new(
        rx,
        fallback_after,
        cfg.hub.upstreams.len(),
    )))
}

/// Sends this replica's tally (read from `push.tally_path`) to the `hubs` every `hub.share_ms`.
fn spawn_share(
    cfg: &Config,
    hubs: Vec<hyper::Uri>,
    cred: &Credential,
    stats: &Arc<Stats>,
    shutdown: &watch::Receiver<bool>,
) -> Result<JoinHandle<()>, StartError> {
    let tally_uri: hyper::Uri = format!("http://{}{}", cfg.push.address, cfg.push.tally_path)
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| StartError::Hub {
            hub: cfg.push.address.clone(),
            reason: format!("push.tally_path: {e}"),
        })?;
    Ok(tokio::spawn(crate::share::share(
        crate::share::ShareOptions {
            interval: Duration::from_millis(cfg.hub.share_ms),
            tally_uri,
            hubs,
            timeout: Duration::from_millis(cfg.hub.timeout_ms),
        },
        cred.clone(),
        stats.clone(),
        shutdown.clone(),
    )))
}

fn log_started(out: &Output, face_addr: SocketAddr, hub_addr: Option<SocketAddr>, cfg: &Config) {
    match out {
        Output::Push(p) => tracing::info!(
            face = %face_addr,
            push = %p.uri(),
            hubs = ?cfg.hub.upstreams,
            pools = cfg.pools.len(),
            interval_ms = cfg.scrape.interval_ms,
            "sidecar-metrics started"
        ),
        Output::Publish { .. } => tracing::info!(
            face = %face_addr,
            hub = ?hub_addr,
            pools = cfg.pools.len(),
            interval_ms = cfg.scrape.interval_ms,
            "sidecar-metrics hub started"
        ),
    }
}

impl Loop {
    /// The loop's state before its first round.
    fn new(
        cfg: Config,
        pools: Vec<PoolRt>,
        out: Output,
        stats: Arc<Stats>,
        snapshots: watch::Sender<Option<Snapshot>>,
        replica: u64,
    ) -> Loop {
        Loop {
            pools,
            out,
            stats,
            last_generation: 0,
            budget: Budget {
                max_bytes: cfg.snapshot.max_bytes,
                max_pod_bytes: cfg.snapshot.max_pod_bytes,
            },
            trim_state: TrimState::Whole,
            future_logged: false,
            last_accepted: None,
            last_accepted_at: None,
            in_flight_snapshot: None,
            retry: false,
            last_push_label: "none",
            snapshots,
            next_pod: 0,
            replica,
            last_trim: Trim::default(),
            published_at: None,
            queued: None,
            last_hub_pods: None,
            push_started: None,
            peer_push_at: None,
            rewrites: None,
            objectives: None,
            unknown_targets: Vec::new(),
            cfg,
        }
    }
}
