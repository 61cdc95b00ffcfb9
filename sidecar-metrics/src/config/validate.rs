//! [`Config::validate`]: what serde cannot check, section by section in a fixed order (the first
//! error found is the one reported), each error naming its field as the file spells it.

use std::net::SocketAddr;

use llm_router_snapshot::Engine;

use super::{
    host_port, invalid, Config, ConfigError, Discovery, HubConfig, KubeApi, Mode, PoolConfig,
    ScrapeConfig, SnapshotConfig, MIN_SNAPSHOT_MAX_BYTES, MIN_SNAPSHOT_MAX_POD_BYTES,
};

impl Config {
    /// Checks everything serde cannot; each error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.mode {
            Mode::Hub => check_hub_serving(&self.hub)?,
            Mode::Sidecar => self.check_hub_following()?,
        }
        self.check_push_target()?;
        self.check_hub_secret()?;
        if self.push.timeout_ms == 0 {
            return Err(invalid("push.timeout_ms", "must be > 0"));
        }
        check_scrape(&self.scrape)?;
        if self.heartbeat_ms == 0 {
            return Err(invalid("heartbeat_ms", "must be > 0"));
        }
        if self.pod_stale_after_ms == 0 {
            return Err(invalid("pod_stale_after_ms", "must be > 0"));
        }
        if self.listen.parse::<SocketAddr>().is_err() {
            return Err(invalid(
                "listen",
                format!("{:?} is not ip:port", self.listen),
            ));
        }
        check_snapshot(&self.snapshot)?;
        check_pools(&self.pools)?;
        if let Some(rules) = self.rewrites.as_ref().and_then(|r| r.rules.as_deref()) {
            crate::rewrites::check_rules("rewrites.rules", rules)
                .map_err(|e| invalid("rewrites", e))?;
        }
        Ok(())
    }

    /// Mode sidecar: the hubs it follows and how it talks to them and to its proxy's tally.
    fn check_hub_following(&self) -> Result<(), ConfigError> {
        for (i, u) in self.hub.upstreams.iter().enumerate() {
            crate::hub::hub_uri(u).map_err(|e| invalid(format!("hub.upstreams[{i}]"), e))?;
        }
        if self.hub.fallback_after_ms == Some(0) {
            return Err(invalid("hub.fallback_after_ms", "must be > 0"));
        }
        if self.hub.timeout_ms == 0 {
            return Err(invalid("hub.timeout_ms", "must be > 0"));
        }
        if !self.push.tally_path.starts_with('/') {
            return Err(invalid("push.tally_path", "must be an absolute path"));
        }
        Ok(())
    }

    /// Where snapshots are pushed (mode sidecar) and the push secret: exactly one source.
    fn check_push_target(&self) -> Result<(), ConfigError> {
        let addr_ok = |s: &str| s.parse::<SocketAddr>().is_ok() || host_port(s).is_some();
        if self.mode == Mode::Sidecar && !addr_ok(&self.push.address) {
            return Err(invalid(
                "push.address",
                format!("{:?} is not host:port", self.push.address),
            ));
        }
        if !self.push.path.starts_with('/') {
            return Err(invalid("push.path", "must start with '/'"));
        }
        let p = &self.push;
        let sources = count_sources([&p.secret, &p.secret_env, &p.secret_file]);
        if sources != 1 {
            return Err(invalid(
                "push.secret",
                format!("give exactly one of secret, secret_env, secret_file (found {sources})"),
            ));
        }
        if let Some(secret) = &self.push.secret {
            llm_router_snapshot::check_secret(secret).map_err(|e| invalid("push.secret", e))?;
        }
        Ok(())
    }

    /// The hub secret (at most one source) and a replica's credential, which replaces it.
    fn check_hub_secret(&self) -> Result<(), ConfigError> {
        let h = &self.hub;
        let hub_sources = count_sources([&h.secret, &h.secret_env, &h.secret_file]);
        if hub_sources > 1 {
            return Err(invalid(
                "hub.secret",
                format!(
                    "give at most one of secret, secret_env, secret_file (found {hub_sources})"
                ),
            ));
        }
        if let Some(secret) = &self.hub.secret {
            llm_router_snapshot::check_secret(secret).map_err(|e| invalid("hub.secret", e))?;
        }
        if self.hub.credential_file.is_some() && (self.mode == Mode::Hub || hub_sources > 0) {
            return Err(invalid(
                "hub.credential_file",
                "a replica's credential is for mode sidecar, instead of the hub secret",
            ));
        }
        Ok(())
    }
}

/// How many of a secret's sources are given.
fn count_sources(sources: [&Option<String>; 3]) -> usize {
    sources.iter().filter(|s| s.is_some()).count()
}

/// Mode hub: where it serves and what it keeps; it follows no hub itself.
fn check_hub_serving(hub: &HubConfig) -> Result<(), ConfigError> {
    if hub.tally_ttl_ms == 0 {
        return Err(invalid("hub.tally_ttl_ms", "must be > 0"));
    }
    if hub.listen.parse::<SocketAddr>().is_err() {
        return Err(invalid(
            "hub.listen",
            format!("{:?} is not ip:port", hub.listen),
        ));
    }
    if !hub.upstreams.is_empty() {
        return Err(invalid(
            "hub.upstreams",
            "a hub follows no hub (leave it out in mode hub)",
        ));
    }
    Ok(())
}

fn check_scrape(s: &ScrapeConfig) -> Result<(), ConfigError> {
    if s.interval_ms == 0 {
        return Err(invalid("scrape.interval_ms", "must be > 0"));
    }
    if !(0.0..1.0).contains(&s.jitter) {
        return Err(invalid(
            "scrape.jitter",
            format!("{} is not in [0, 1)", s.jitter),
        ));
    }
    if s.timeout_ms == 0 {
        return Err(invalid("scrape.timeout_ms", "must be > 0"));
    }
    if !(0.0..=1.0).contains(&s.max_duty) {
        return Err(invalid(
            "scrape.max_duty",
            format!("{} is not in [0, 1]", s.max_duty),
        ));
    }
    if s.max_response_bytes < 1024 {
        return Err(invalid(
            "scrape.max_response_bytes",
            "must be at least 1024",
        ));
    }
    if s.coalesce_ms * 2 > s.interval_ms {
        return Err(invalid(
            "scrape.coalesce_ms",
            "must be at most half of interval_ms",
        ));
    }
    if s.concurrency == 0 {
        return Err(invalid("scrape.concurrency", "must be > 0"));
    }
    if !s.path.starts_with('/') {
        return Err(invalid("scrape.path", "must start with '/'"));
    }
    Ok(())
}

/// The snapshot's byte budgets: above the smallest that works, the pod's within the total.
fn check_snapshot(b: &SnapshotConfig) -> Result<(), ConfigError> {
    if b.max_bytes < MIN_SNAPSHOT_MAX_BYTES {
        return Err(invalid(
            "snapshot.max_bytes",
            format!("must be at least {MIN_SNAPSHOT_MAX_BYTES}"),
        ));
    }
    if b.max_pod_bytes < MIN_SNAPSHOT_MAX_POD_BYTES || b.max_pod_bytes > b.max_bytes {
        return Err(invalid(
            "snapshot.max_pod_bytes",
            format!(
                "must be in {MIN_SNAPSHOT_MAX_POD_BYTES}..=snapshot.max_bytes ({})",
                b.max_bytes
            ),
        ));
    }
    Ok(())
}

/// At least one pool, no more than a snapshot carries, each one valid.
fn check_pools(pools: &[PoolConfig]) -> Result<(), ConfigError> {
    if pools.is_empty() {
        return Err(invalid("pools", "at least one pool is needed"));
    }
    if pools.len() > llm_router_snapshot::MAX_POOLS {
        return Err(invalid(
            "pools",
            format!(
                "at most {} pools fit in a snapshot",
                llm_router_snapshot::MAX_POOLS
            ),
        ));
    }
    for (i, p) in pools.iter().enumerate() {
        let f = |k: &str| format!("pools[{i}].{k}");
        check_pool(p, pools.get(..i).unwrap_or_default(), &f)?;
        check_discovery(&p.discovery, &f)?;
    }
    Ok(())
}

/// One pool's own fields; `before` are the pools listed ahead of it (names are unique) and `f`
/// names a field of this pool (`pools[2].name`).
fn check_pool(
    p: &PoolConfig,
    before: &[PoolConfig],
    f: &dyn Fn(&str) -> String,
) -> Result<(), ConfigError> {
    if p.name.is_empty() || p.name.len() > 1000 {
        return Err(invalid(f("name"), "must be 1..1000 bytes"));
    }
    if before.iter().any(|q| q.name == p.name) {
        return Err(invalid(
            f("name"),
            format!("pool {:?} is defined twice", p.name),
        ));
    }
    if p.cluster.is_empty() || p.cluster.len() > 1000 {
        return Err(invalid(f("cluster"), "must be 1..1000 bytes"));
    }
    if p.models.len() > llm_router_snapshot::MAX_MODELS_PER_POOL {
        return Err(invalid(
            f("models"),
            format!(
                "at most {} models fit in a snapshot",
                llm_router_snapshot::MAX_MODELS_PER_POOL
            ),
        ));
    }
    if let Some(j) = p
        .models
        .iter()
        .position(|m| m.is_empty() || m.len() > 65535)
    {
        return Err(invalid(
            f(&format!("models[{j}]")),
            "must be 1..65535 bytes",
        ));
    }
    if let Some(e) = &p.engine {
        if Engine::from_name(e).is_none() {
            return Err(invalid(
                f("engine"),
                format!("unknown engine {e:?} (vllm, sglang, trtllm, triton, tgi, llamacpp)"),
            ));
        }
    }
    if let Some(mp) = &p.metrics_path {
        if !mp.starts_with('/') {
            return Err(invalid(f("metrics_path"), "must start with '/'"));
        }
    }
    Ok(())
}

/// A pool's discovery source; `f` names a field of the pool.
fn check_discovery(d: &Discovery, f: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
    match d {
        Discovery::Static(list) => {
            for (j, a) in list.iter().enumerate() {
                if a.parse::<SocketAddr>().is_err() {
                    return Err(invalid(
                        f(&format!("discovery.static[{j}]")),
                        format!("{a:?} is not ip:port"),
                    ));
                }
            }
        }
        Discovery::Dns(d) => {
            if d.name.is_empty() {
                return Err(invalid(f("discovery.dns.name"), "must not be empty"));
            }
            if d.interval_ms == 0 {
                return Err(invalid(f("discovery.dns.interval_ms"), "must be > 0"));
            }
            if let Some(ns) = &d.nameserver {
                if ns.parse::<SocketAddr>().is_err() {
                    return Err(invalid(
                        f("discovery.dns.nameserver"),
                        format!("{ns:?} is not ip:port"),
                    ));
                }
            }
        }
        Discovery::Kubernetes(k) => {
            if k.service.is_some() == k.label_selector.is_some() {
                return Err(invalid(
                    f("discovery.kubernetes"),
                    "give exactly one of service, label_selector",
                ));
            }
            check_api(k.api.as_ref(), &|field| {
                f(&format!("discovery.kubernetes.{field}"))
            })?;
        }
        Discovery::InferencePool(ip) => {
            if ip.name.is_empty() {
                return Err(invalid(
                    f("discovery.inference_pool.name"),
                    "must not be empty",
                ));
            }
            if ip.port == Some(0) {
                return Err(invalid(f("discovery.inference_pool.port"), "must be > 0"));
            }
            check_api(ip.api.as_ref(), &|field| {
                f(&format!("discovery.inference_pool.{field}"))
            })?;
        }
    }
    Ok(())
}

/// The `api` section of a Kubernetes source; `field` names `api.server` and `api` in errors.
fn check_api(api: Option<&KubeApi>, field: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
    let Some(api) = api else { return Ok(()) };
    if !(api.server.starts_with("https://") || api.server.starts_with("http://")) {
        return Err(invalid(
            field("api.server"),
            "must start with https:// (or http:// for a local test server)",
        ));
    }
    if api.token.is_some() && api.token_file.is_some() {
        return Err(invalid(
            field("api"),
            "give at most one of token, token_file",
        ));
    }
    Ok(())
}
