//! Runs a real Envoy for tests, benchmarks and the demo: [`EnvoySpec`] renders a bootstrap
//! (pools as STATIC clusters, the router under test, a JSON access log), writes it to a fresh
//! folder under `<target>/testlogs/`, starts Envoy on loopback ports it picks itself (`:0`,
//! reported back through `--admin-address-path` and the admin API) and waits until it serves.
//! With the filter there are two listeners, as the shipped configs have them: the public one
//! (routing; the snapshot paths answer 404) and an internal one on 127.0.0.1 whose filter
//! instance — same VM, so the same shared data — serves the snapshot push and state paths.
//! [`EnvoyProcess`] reads stats, per-host request counts and the access log, and stops Envoy
//! by PID on drop.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::http::blocking_get;
use crate::identity::Identity;
use crate::paths::{envoy_binary, filter_wasm, testlog_dir};
use crate::process::ChildGuard;

/// Request header the filter sets to pick the cluster (pool); routes match on it.
pub const CLUSTER_HEADER: &str = "x-llm-router-cluster";
/// Request header the filter sets to pick endpoints inside the cluster (override_host source).
pub const ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";
/// Name of the public listener.
pub const PUBLIC_LISTENER: &str = "llm_router";
/// Name of the loopback listener serving the snapshot endpoints ([`Router::Filter`] only).
pub const INTERNAL_LISTENER: &str = "llm_router_internal";
/// The public listener's `per_connection_buffer_limit_bytes`: what Envoy buffers of one request
/// for the filter, which holds the whole body (Envoy answers 413 past it). 1 MiB: at least the
/// filter's default `max_body_bytes` (1,000,000) plus headers, as in every shipped configuration.
pub const PUBLIC_BUFFER_LIMIT_BYTES: u32 = 1024 * 1024;
/// The internal listener's `per_connection_buffer_limit_bytes`: the largest snapshot push Envoy
/// buffers for the filter (a larger one is refused with 413 before the filter sees it). Equal to
/// the filter's default `snapshot.max_bytes` and the sidecar's default total snapshot budget, as
/// in every shipped configuration (Envoy's own default is 1 MiB).
pub const INTERNAL_BUFFER_LIMIT_BYTES: u32 = 4 * 1024 * 1024;
/// The snapshot secret of [`EnvoySpec::default_plugin_config`]: long enough for the filter's
/// secret policy (`llm_router_snapshot::check_secret`), and only ever used in tests.
pub const DEFAULT_SECRET: &str = "testkit-default-secret-0123456789abcdef";
/// Timeout for one admin API call.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

/// One pool of model-server pods: one Envoy cluster with STATIC endpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSpec {
    /// Pool name (as in the plugin configuration).
    pub name: String,
    /// Envoy cluster name.
    pub cluster: String,
    /// The pods, `127.0.0.1:PORT`.
    pub endpoints: Vec<SocketAddr>,
}

impl PoolSpec {
    /// A pool named `name` served by cluster `cluster`.
    pub fn new(
        name: impl Into<String>,
        cluster: impl Into<String>,
        endpoints: Vec<SocketAddr>,
    ) -> Self {
        PoolSpec {
            name: name.into(),
            cluster: cluster.into(),
            endpoints,
        }
    }
}

/// Who picks the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Router {
    /// The llm-router Wasm filter (`allow_on_headers_stop_iteration`) with clusters using the
    /// `override_host` policy (fallback round robin), as the project ships it.
    #[default]
    Filter,
    /// Plain Envoy round robin, no filter (benchmark baseline).
    RoundRobin,
    /// Plain Envoy least request (power of two choices), no filter (benchmark baseline).
    LeastRequest,
    /// `override_host` clusters without the filter: the client sets
    /// `x-gateway-destination-endpoint` itself (tests of the Envoy side alone).
    OverrideHost,
}

impl Router {
    /// Short lower-case label (`filter`, `round_robin`, `least_request`, `override_host`).
    pub fn label(self) -> &'static str {
        match self {
            Router::Filter => "filter",
            Router::RoundRobin => "round_robin",
            Router::LeastRequest => "least_request",
            Router::OverrideHost => "override_host",
        }
    }
}

/// The route's retry conditions, as in the shipped `envoy/envoy.yaml`: a connection that fails
/// or is reset before the answer starts, and a 503 (the engine took no work). Not 429: a pod
/// that asks for back-off passes that on to the client rather than being hammered by retries.
pub const RETRY_ON: &str = "connect-failure,reset,refused-stream,retriable-status-codes";

/// The shipped `per_try_idle_timeout` (see [`EnvoySpec::per_try_idle_timeout`]).
pub const PER_TRY_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Everything needed to run one Envoy.
#[derive(Debug, Clone)]
pub struct EnvoySpec {
    /// Label used in log folder names (default `envoy`).
    pub name: String,
    /// The pools; the first one is the catch-all route's cluster. At least one.
    pub pools: Vec<PoolSpec>,
    /// Who picks the endpoint.
    pub router: Router,
    /// Envoy worker threads (`--concurrency`, default 2).
    pub concurrency: u32,
    /// Plugin configuration JSON for [`Router::Filter`]. `Null` (default) means
    /// [`EnvoySpec::default_plugin_config`].
    pub plugin_config: Value,
    /// The filter module; `None` means [`filter_wasm()`].
    pub wasm_path: Option<PathBuf>,
    /// Listener port; 0 (default) lets Envoy pick a free one.
    pub listen_port: u16,
    /// Address the public listener binds (default 127.0.0.1). Only a test that brings its own
    /// reachable network (a namespace with a veth pair) should set anything else.
    pub listen_ip: IpAddr,
    /// Port of the internal (snapshot) listener on 127.0.0.1; 0 (default) picks a free one.
    pub internal_port: u16,
    /// Admin port on 127.0.0.1; 0 (default) lets Envoy pick a free one.
    pub admin_port: u16,
    /// Envoy log level; `None` means `$ENVOY_LOG_LEVEL`, else `warning`.
    pub log_level: Option<String>,
    /// `--component-log-level` (e.g. `wasm:debug`); `None` means `$ENVOY_COMPONENT_LOG_LEVEL`.
    pub component_log_level: Option<String>,
    /// Route retries (default 2) on `connect-failure,reset,refused-stream` and status 503, as
    /// in the shipped `envoy/envoy.yaml`.
    pub num_retries: u32,
    /// The route's `per_try_idle_timeout` (default 120 s, as shipped): a try that receives
    /// nothing for this long is abandoned (retried if nothing reached the client yet).
    pub per_try_idle_timeout: Duration,
    /// Upstream connect timeout (default 1 s).
    pub connect_timeout: Duration,
    /// How long [`EnvoySpec::start`] waits for Envoy to serve (default 30 s).
    pub ready_timeout: Duration,
    /// More command-line arguments for Envoy.
    pub extra_args: Vec<String>,
    /// A cluster `load_balancing_policy` replacing the router's own `lb_policy` (plain-Envoy
    /// routers only; e.g. least request with `selection_method: FULL_SCAN`). `None` (default):
    /// the router's policy.
    pub cluster_lb_policy: Option<Value>,
    /// Endpoint `load_balancing_weight`s (e.g. a weighted round robin); endpoints not listed
    /// get none (Envoy's default weight 1).
    pub endpoint_weights: BTreeMap<SocketAddr, u32>,
    /// Exact paths routed to the first pool without the filter's say (default none): only for
    /// measurements of the Wasm mechanism's floor on a path the filter does not route. No
    /// shipped configuration has such a route.
    pub pass_through_paths: Vec<String>,
    /// Environment variables set on the Envoy process and passed into the filter's VM: every
    /// key is listed in each filter copy's `vm_config.environment_variables.host_env_keys`
    /// (e.g. the `snapshot.secret_env` variable, as a Kubernetes Secret would fill it).
    pub env: BTreeMap<String, String>,
    /// An external processor at this address (e.g. `extproc-noop`, see
    /// [`crate::start_extproc_noop`]): an `envoy.filters.http.ext_proc` filter just before the
    /// router, the endpoint-picker architecture ([`ext_proc_http_filter`]), with its gRPC
    /// cluster [`EXT_PROC_CLUSTER`]. `None` (default): no such filter. Benchmarks only; no
    /// shipped configuration has it.
    pub ext_proc: Option<SocketAddr>,
    /// Identity filters before the Wasm filter on the public listener (e.g. the shipped
    /// `envoy/identity/jwt-authn.yaml`, [`Identity::shipped_jwt_authn`]), their clusters, and
    /// their plugin configuration keys merged into the public copy's. `None` (default): none.
    pub identity: Option<Identity>,
    /// Admission at the gateway, Envoy's own way: every pool's circuit breakers bound the
    /// requests in flight to the pool (`max_connections` and `max_requests`: HTTP/1.1 upstreams
    /// hold one request per connection) and those waiting for one (`max_pending_requests`),
    /// and an overflow (response flag `UO`) is answered 429 with `retry-after: 1` by the
    /// listener's `local_reply_config`, as an operator who wants clients to back off would
    /// configure it. `None` (default): limits far above any benchmark (100,000).
    pub admission: Option<Admission>,
}

/// Envoy's circuit-breaker admission ([`EnvoySpec::admission`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Requests in flight to a pool.
    pub max_in_flight: u32,
    /// Requests waiting for one of those places.
    pub max_pending: u32,
}

impl Default for EnvoySpec {
    fn default() -> Self {
        EnvoySpec {
            name: "envoy".into(),
            pools: Vec::new(),
            router: Router::Filter,
            concurrency: 2,
            plugin_config: Value::Null,
            wasm_path: None,
            listen_port: 0,
            listen_ip: IpAddr::from([127, 0, 0, 1]),
            internal_port: 0,
            admin_port: 0,
            log_level: None,
            component_log_level: None,
            num_retries: 2,
            per_try_idle_timeout: PER_TRY_IDLE_TIMEOUT,
            connect_timeout: Duration::from_secs(1),
            ready_timeout: Duration::from_secs(30),
            extra_args: Vec::new(),
            cluster_lb_policy: None,
            endpoint_weights: BTreeMap::new(),
            pass_through_paths: Vec::new(),
            env: BTreeMap::new(),
            ext_proc: None,
            identity: None,
            admission: None,
        }
    }
}

impl EnvoySpec {
    /// A spec for `router` with no pools yet.
    pub fn new(router: Router) -> Self {
        EnvoySpec {
            name: format!("envoy-{}", router.label()),
            router,
            ..EnvoySpec::default()
        }
    }

    /// Adds a pool (builder style).
    pub fn pool(
        mut self,
        name: impl Into<String>,
        cluster: impl Into<String>,
        endpoints: Vec<SocketAddr>,
    ) -> Self {
        self.pools.push(PoolSpec::new(name, cluster, endpoints));
        self
    }

    /// Sets the plugin configuration (builder style).
    pub fn plugin_config(mut self, config: Value) -> Self {
        self.plugin_config = config;
        self
    }

    /// Adds an ext_proc filter talking to the external processor at `addr` (builder style; see
    /// [`EnvoySpec::ext_proc`]).
    pub fn ext_proc(mut self, addr: SocketAddr) -> Self {
        self.ext_proc = Some(addr);
        self
    }

    /// Puts an identity chain in front of the filter (builder style; see
    /// [`EnvoySpec::identity`]).
    pub fn identity(mut self, identity: Identity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Sets `--concurrency` (builder style).
    pub fn concurrency(mut self, workers: u32) -> Self {
        self.concurrency = workers;
        self
    }

    /// The plugin configuration used when none is given: every pool serves one model named
    /// after the pool, snapshot secret [`DEFAULT_SECRET`], everything else at the filter's
    /// defaults.
    pub fn default_plugin_config(&self) -> Value {
        let pools: Vec<Value> = self
            .pools
            .iter()
            .map(|p| json!({"name": p.name, "cluster": p.cluster, "models": [p.name]}))
            .collect();
        json!({"pools": pools, "snapshot": {"secret": DEFAULT_SECRET}})
    }

    /// The plugin configuration actually used (on the public listener), with the
    /// [`EnvoySpec::identity`] chain's keys merged in.
    pub fn effective_plugin_config(&self) -> Value {
        let mut config = if self.plugin_config.is_null() {
            self.default_plugin_config()
        } else {
            self.plugin_config.clone()
        };
        if let Some(identity) = &self.identity {
            identity.merge_into(&mut config);
        }
        config
    }

    /// The internal listener's plugin configuration: the public one's `snapshot` section with
    /// `endpoints: true` (pushes and state are served there only).
    pub fn internal_plugin_config(&self) -> Value {
        let mut snapshot = self
            .effective_plugin_config()
            .get("snapshot")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        snapshot["endpoints"] = json!(true);
        json!({"snapshot": snapshot})
    }

    /// The keys of [`EnvoySpec::env`], as `host_env_keys` lists them.
    pub fn env_keys(&self) -> Vec<&str> {
        self.env.keys().map(String::as_str).collect()
    }

    /// The header the routes match on: the plugin configuration's `cluster_header` or
    /// [`CLUSTER_HEADER`].
    pub fn cluster_header(&self) -> String {
        self.plugin_config
            .get("cluster_header")
            .and_then(Value::as_str)
            .unwrap_or(CLUSTER_HEADER)
            .to_string()
    }

    /// The override_host source header: the plugin configuration's `endpoint_header` or
    /// [`ENDPOINT_HEADER`].
    pub fn endpoint_header(&self) -> String {
        self.plugin_config
            .get("endpoint_header")
            .and_then(Value::as_str)
            .unwrap_or(ENDPOINT_HEADER)
            .to_string()
    }

    /// The bootstrap as JSON. `wasm` is the module path (used by [`Router::Filter`] only),
    /// `access_log` the access log file.
    pub fn bootstrap(&self, wasm: &Path, access_log: &Path) -> Result<Value> {
        let first = self.pools.first().ok_or_else(|| Error::Format {
            what: format!("EnvoySpec {}", self.name),
            reason: "needs at least one pool".into(),
        })?;
        let retry = json!({
            "retry_on": RETRY_ON,
            "retriable_status_codes": [503],
            "num_retries": self.num_retries,
            "per_try_idle_timeout": format!("{}s", self.per_try_idle_timeout.as_secs_f64()),
        });
        let mut routes = public_routes(self.router, &self.cluster_header(), &first.cluster, &retry);
        if let Some(list) = routes.as_array_mut() {
            for (i, path) in self.pass_through_paths.iter().enumerate() {
                list.insert(
                    i,
                    json!({"match": {"path": path}, "route": {"cluster": first.cluster, "timeout": "0s"}}),
                );
            }
        }
        let mut http_filters = Vec::new();
        if let Some(identity) = &self.identity {
            http_filters.extend(identity.http_filters.iter().cloned());
        }
        if self.router == Router::Filter {
            http_filters.push(wasm_http_filter_with_env(
                wasm,
                &self.effective_plugin_config(),
                &self.env_keys(),
            )?);
        }
        if self.ext_proc.is_some() {
            http_filters.push(ext_proc_http_filter(EXT_PROC_CLUSTER));
        }
        http_filters.push(json!({
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
        }));
        let mut hcm = json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "ingress",
            "codec_type": "AUTO",
            "access_log": [access_log_config(access_log)],
            "route_config": {
                "name": "llm_router",
                "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}],
            },
            "http_filters": http_filters,
        });
        if let (Some(h), Value::Object(edge)) = (hcm.as_object_mut(), edge_hcm_settings()) {
            h.extend(edge);
        }
        if self.admission.is_some() {
            hcm["local_reply_config"] = overflow_as_429();
        }
        let mut clusters: Vec<Value> = self.pools.iter().map(|p| self.cluster(p)).collect();
        if let Some(addr) = self.ext_proc {
            clusters.push(ext_proc_cluster(
                EXT_PROC_CLUSTER,
                addr,
                self.connect_timeout,
            ));
        }
        if let Some(identity) = &self.identity {
            clusters.extend(identity.clusters.iter().cloned());
        }
        let mut listeners = vec![json!({
            "name": PUBLIC_LISTENER,
            "address": socket_address(&self.listen_ip.to_string(), self.listen_port),
            "per_connection_buffer_limit_bytes": PUBLIC_BUFFER_LIMIT_BYTES,
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": hcm,
            }]}],
        })];
        if self.router == Router::Filter {
            listeners.push(self.internal_listener(wasm, access_log)?);
        }
        Ok(json!({
            "admin": {"address": socket_address("127.0.0.1", self.admin_port)},
            "stats_config": stats_config(),
            "overload_manager": overload_manager(),
            "static_resources": {"listeners": listeners, "clusters": clusters},
        }))
    }

    /// The loopback listener whose filter instance serves the snapshot endpoints; anything
    /// the filter does not answer itself gets 404.
    fn internal_listener(&self, wasm: &Path, access_log: &Path) -> Result<Value> {
        let hcm = json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "internal",
            "codec_type": "AUTO",
            "access_log": [access_log_config(access_log)],
            "route_config": {
                "name": "llm_router_internal",
                "virtual_hosts": [{"name": "internal", "domains": ["*"], "routes": [
                    {"match": {"prefix": "/"}, "direct_response": {"status": 404}},
                ]}],
            },
            "http_filters": [
                wasm_http_filter_with_env(wasm, &self.internal_plugin_config(), &self.env_keys())?,
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                },
            ],
        });
        Ok(json!({
            "name": INTERNAL_LISTENER,
            "address": socket_address("127.0.0.1", self.internal_port),
            "per_connection_buffer_limit_bytes": INTERNAL_BUFFER_LIMIT_BYTES,
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": hcm,
            }]}],
        }))
    }

    fn cluster(&self, pool: &PoolSpec) -> Value {
        let endpoints: Vec<Value> = pool
            .endpoints
            .iter()
            .map(|a| {
                let mut e =
                    json!({"endpoint": {"address": socket_address(&a.ip().to_string(), a.port())}});
                if let Some(w) = self.endpoint_weights.get(a) {
                    e["load_balancing_weight"] = json!(w);
                }
                e
            })
            .collect();
        let mut cluster = json!({
            "name": pool.cluster,
            "type": "STATIC",
            "connect_timeout": format!("{}s", self.connect_timeout.as_secs_f64()),
            "load_assignment": {"cluster_name": pool.cluster, "endpoints": [{"lb_endpoints": endpoints}]},
            // Benchmarks push far more concurrent requests than Envoy's default limits (1024),
            // unless the spec asks for admission.
            "circuit_breakers": {"thresholds": [match self.admission {
                None => json!({
                    "max_connections": 100_000, "max_pending_requests": 100_000,
                    "max_requests": 100_000, "max_retries": 10_000,
                }),
                Some(a) => json!({
                    "max_connections": a.max_in_flight, "max_requests": a.max_in_flight,
                    "max_pending_requests": a.max_pending, "max_retries": 10_000,
                }),
            }]},
        });
        match self.router {
            Router::Filter | Router::OverrideHost => {
                cluster["load_balancing_policy"] = override_host_policy(&self.endpoint_header());
            }
            Router::RoundRobin => cluster["lb_policy"] = json!("ROUND_ROBIN"),
            Router::LeastRequest => cluster["lb_policy"] = json!("LEAST_REQUEST"),
        }
        if let (Some(policy), Router::RoundRobin | Router::LeastRequest) =
            (&self.cluster_lb_policy, self.router)
        {
            if let Some(c) = cluster.as_object_mut() {
                c.remove("lb_policy");
            }
            cluster["load_balancing_policy"] = policy.clone();
        }
        cluster
    }

    /// The bootstrap rendered as YAML (see [`EnvoySpec::bootstrap`]).
    pub fn render_yaml(&self, wasm: &Path, access_log: &Path) -> Result<String> {
        let doc = self.bootstrap(wasm, access_log)?;
        let yaml = serde_yaml::to_string(&doc).map_err(|e| Error::Format {
            what: "Envoy bootstrap YAML".into(),
            reason: e.to_string(),
        })?;
        Ok(format!(
            "# Generated by testkit for {} (router: {}). Not hand-edited.\n{yaml}",
            self.name,
            self.router.label()
        ))
    }

    /// The module path this spec uses: [`EnvoySpec::wasm_path`] or [`filter_wasm()`]. Only
    /// required (and checked) for [`Router::Filter`].
    pub fn resolve_wasm(&self) -> Result<PathBuf> {
        match (&self.wasm_path, self.router) {
            (Some(path), _) => Ok(path.clone()),
            (None, Router::Filter) => filter_wasm(),
            (None, _) => Ok(PathBuf::from("/nonexistent/unused.wasm")),
        }
    }

    /// Writes `envoy.yaml` into `dir` (access log `dir/access.log`); returns the config path.
    pub fn write_config(&self, dir: &Path) -> Result<PathBuf> {
        let wasm = self.resolve_wasm()?;
        let yaml = self.render_yaml(&wasm, &dir.join("access.log"))?;
        let path = dir.join("envoy.yaml");
        std::fs::write(&path, yaml).map_err(|e| Error::io("write", &path, e))?;
        Ok(path)
    }

    /// Starts Envoy and waits until it serves (blocking; see [`EnvoySpec::start`]).
    pub fn start_blocking(&self) -> Result<EnvoyProcess> {
        let dir = testlog_dir(&self.name)?;
        let config_path = self.write_config(&dir)?;
        let log_path = dir.join("envoy.log");
        let admin_address_path = dir.join("admin-address.txt");
        let access_log_path = dir.join("access.log");
        let mut cmd = Command::new(envoy_binary()?);
        cmd.arg("-c")
            .arg(&config_path)
            .arg("--concurrency")
            .arg(self.concurrency.max(1).to_string())
            // No shared memory at all, so any number of Envoys can run side by side
            // (the alternative, --use-dynamic-base-id, still allocates a base id each).
            .arg("--disable-hot-restart")
            .arg("--log-level")
            .arg(log_level(self.log_level.as_deref()))
            .arg("--admin-address-path")
            .arg(&admin_address_path)
            .arg("--file-flush-interval-msec")
            .arg("50");
        if let Some(components) = self.component_log_level.clone().or_else(|| {
            std::env::var("ENVOY_COMPONENT_LOG_LEVEL")
                .ok()
                .filter(|s| !s.is_empty())
        }) {
            cmd.arg("--component-log-level").arg(components);
        }
        cmd.args(&self.extra_args);
        cmd.envs(&self.env);
        let guard = ChildGuard::spawn_logged(&self.name, cmd, &log_path)?;
        let mut process = EnvoyProcess {
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            internal_addr: None,
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            guard,
            dir,
            config_path,
            log_path,
            access_log_path,
        };
        process.wait_ready(&admin_address_path, self.ready_timeout)?;
        Ok(process)
    }

    /// Starts Envoy and waits (without blocking the runtime) until its admin `/ready` says
    /// `LIVE` and its listener accepts connections. On failure the error carries Envoy's log
    /// tail and Envoy is stopped.
    pub async fn start(&self) -> Result<EnvoyProcess> {
        let spec = self.clone();
        tokio::task::spawn_blocking(move || spec.start_blocking())
            .await
            .map_err(|e| Error::Format {
                what: "Envoy start task".into(),
                reason: e.to_string(),
            })?
    }
}

fn log_level(explicit: Option<&str>) -> String {
    explicit
        .map(str::to_string)
        .or_else(|| {
            std::env::var("ENVOY_LOG_LEVEL")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "warning".to_string())
}

fn socket_address(address: &str, port: u16) -> Value {
    json!({"socket_address": {"address": address, "port_value": port}})
}

/// The body of the gateway's own 404, in the OpenAI error shape clients parse.
pub const NOT_ROUTED_BODY: &str = r#"{"error":{"message":"no such API path on this gateway","type":"invalid_request_error","param":null,"code":"not_found"}}"#;

/// The public listener's routes, as the shipped configurations have them: an explicit allowlist.
/// Only the API paths the filter routes ([`llm_router_core::request::API_PATH_REGEX`]) reach a
/// pool, and only once the filter has named the pool's cluster in `cluster_header` (it strips
/// that header from clients); every other request gets the gateway's own 404 in the OpenAI error
/// shape. A trailing slash is dropped on the way to the pod. With the filter there is no
/// catch-all to a pool: a request the filter did not route (an unknown path, a VM that failed
/// open) cannot reach a pod. The baselines (no filter) send the API paths to the first pool, or
/// to the pool a client names in `cluster_header` (tests of Envoy's side alone).
pub fn public_routes(
    router: Router,
    cluster_header: &str,
    first_cluster: &str,
    retry: &Value,
) -> Value {
    let api = json!({"safe_regex": {"regex": llm_router_core::request::API_PATH_REGEX}});
    let to = |mut action: Value| {
        action["timeout"] = json!("0s");
        action["retry_policy"] = retry.clone();
        action["regex_rewrite"] = json!({"pattern": {"regex": "^(.+)/$"}, "substitution": "\\1"});
        action
    };
    let mut tagged = api.clone();
    tagged["headers"] = json!([{"name": cluster_header, "present_match": true}]);
    let mut routes = vec![json!({
        "name": "api",
        "match": tagged,
        "route": to(json!({"cluster_header": cluster_header})),
    })];
    if router != Router::Filter {
        routes.push(json!({
            "name": "api_first_pool",
            "match": api,
            "route": to(json!({"cluster": first_cluster})),
        }));
    }
    routes.push(json!({
        "name": "not_routed",
        "match": {"prefix": "/"},
        "direct_response": {"status": 404, "body": {"inline_string": NOT_ROUTED_BODY}},
        "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}],
    }));
    Value::Array(routes)
}

/// The public HTTP connection manager's edge settings, as in every shipped configuration
/// (Envoy's edge best practices, with the limits a body-holding LLM gateway needs): paths
/// normalised (RFC 3986, percent-decoded unreserved characters, dot segments) and slashes merged
/// before any filter or route sees them, escaped slashes refused; bounded header and body
/// reception; HTTP/2 stream limits; client addresses from the connection, not headers.
pub fn edge_hcm_settings() -> Value {
    json!({
        "normalize_path": true,
        "merge_slashes": true,
        "path_with_escaped_slashes_action": "REJECT_REQUEST",
        "use_remote_address": true,
        "request_headers_timeout": "10s",
        // The whole request within 75 s, as the shipped listeners: above flow control's longest
        // time to live (60 s), so a held request meets the filter's 429, not Envoy's 408. The
        // response (a long stream) is bounded by the route's idle timeouts, not here.
        "request_timeout": "75s",
        "stream_idle_timeout": "300s",
        "common_http_protocol_options": {
            "idle_timeout": "3600s",
            "headers_with_underscores_action": "REJECT_REQUEST",
            "max_headers_count": 100,
        },
        "http2_protocol_options": {
            "max_concurrent_streams": 100,
            "initial_stream_window_size": 65536,
            "initial_connection_window_size": 1048576,
        },
    })
}

/// The overload manager of every shipped configuration: a heap bound (shrink the heap at 95 %,
/// stop accepting requests at 98 %, reset the streams holding the most buffered bytes from 90 %)
/// and a global bound on downstream connections.
pub fn overload_manager() -> Value {
    let heap = |value: f64| json!([{"name": "envoy.resource_monitors.fixed_heap", "threshold": {"value": value}}]);
    json!({
        "refresh_interval": "0.25s",
        // Per-stream memory accounts, which reset_high_memory_stream needs: streams that
        // buffer 1 MiB (2^20 bytes) or more are tracked.
        "buffer_factory_config": {"minimum_account_to_track_power_of_two": 20},
        "resource_monitors": [
            {
                "name": "envoy.resource_monitors.fixed_heap",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig",
                    "max_heap_size_bytes": MAX_HEAP_BYTES,
                },
            },
            {
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                    "max_active_downstream_connections": MAX_DOWNSTREAM_CONNECTIONS,
                },
            },
        ],
        "actions": [
            {"name": "envoy.overload_actions.shrink_heap", "triggers": heap(0.95)},
            {"name": "envoy.overload_actions.stop_accepting_requests", "triggers": heap(0.98)},
            {
                "name": "envoy.overload_actions.reset_high_memory_stream",
                "triggers": [{"name": "envoy.resource_monitors.fixed_heap",
                    "scaled": {"scaling_threshold": 0.90, "saturation_threshold": 0.98}}],
            },
        ],
    })
}

/// The overload manager's heap bound (2 GiB; the shipped Deployment's memory limit is above it).
pub const MAX_HEAP_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// The overload manager's bound on downstream connections, over all listeners.
pub const MAX_DOWNSTREAM_CONNECTIONS: u64 = 50_000;

/// Envoy's least-request policy with `selection_method: FULL_SCAN`: every pick compares all
/// endpoints (ties broken at random), unlike the default two random choices. For
/// [`EnvoySpec::cluster_lb_policy`].
pub fn least_request_full_scan_policy() -> Value {
    json!({"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.least_request",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
            "selection_method": "FULL_SCAN",
        },
    }}]})
}

/// The `override_host` load-balancing policy reading `header`, falling back to round robin.
pub fn override_host_policy(header: &str) -> Value {
    json!({"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [{"header": header}],
            "fallback_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.round_robin",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"},
            }}]},
        },
    }}]})
}

/// The gRPC cluster of [`EnvoySpec::ext_proc`].
pub const EXT_PROC_CLUSTER: &str = "ext_proc";

/// The `envoy.filters.http.ext_proc` filter entry of the endpoint-picker architecture, talking to
/// `cluster` over Envoy's own gRPC client: request headers sent, the whole request body buffered
/// and sent in one message (`BUFFERED`), nothing of the response (headers, body, trailers
/// skipped), a picker that cannot be reached fails the request (`failure_mode_allow: false`,
/// GAIE's FailClose). This is GAIE's first Envoy Gateway policy (request body `Buffered`,
/// `messageTimeout: 1000s`) without its response processing; GAIE today streams both bodies
/// through the picker (`FULL_DUPLEX_STREAMED`), which costs more. So with a no-op server behind
/// it, the floor of the architecture.
pub fn ext_proc_http_filter(cluster: &str) -> Value {
    json!({
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": cluster}},
            "failure_mode_allow": false,
            "message_timeout": "1000s",
            "processing_mode": {
                "request_header_mode": "SEND",
                "request_body_mode": "BUFFERED",
                "request_trailer_mode": "SKIP",
                "response_header_mode": "SKIP",
                "response_body_mode": "NONE",
                "response_trailer_mode": "SKIP",
            },
        },
    })
}

/// A STATIC HTTP/2 (gRPC) cluster `name` with the one endpoint `addr`, limits as high as the
/// pools' (GAIE's policy raises the picker cluster's connection limits for the same reason).
pub fn ext_proc_cluster(name: &str, addr: SocketAddr, connect_timeout: Duration) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": format!("{}s", connect_timeout.as_secs_f64()),
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": socket_address(&addr.ip().to_string(), addr.port())}},
        ]}]},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            },
        },
        "circuit_breakers": {"thresholds": [{
            "max_connections": 100_000, "max_pending_requests": 100_000,
            "max_requests": 100_000, "max_retries": 10_000,
        }]},
    })
}

/// The `local_reply_config` that answers a circuit-breaker overflow (response flag `UO`) with
/// 429 and `retry-after: 1` instead of Envoy's 503 ([`EnvoySpec::admission`]).
pub fn overflow_as_429() -> Value {
    json!({"mappers": [{
        "filter": {"response_flag_filter": {"flags": ["UO"]}},
        "status_code": 429,
        "headers_to_add": [{"header": {"key": "retry-after", "value": "1"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
    }]})
}

/// The Wasm HTTP filter entry for the llm-router module at `wasm` with `plugin_config`.
pub fn wasm_http_filter(wasm: &Path, plugin_config: &Value) -> Result<Value> {
    wasm_http_filter_with_env(wasm, plugin_config, &[])
}

/// [`wasm_http_filter`] with these host environment variables passed into the VM
/// (`vm_config.environment_variables.host_env_keys`; none: no `environment_variables`).
pub fn wasm_http_filter_with_env(
    wasm: &Path,
    plugin_config: &Value,
    env_keys: &[&str],
) -> Result<Value> {
    let configuration = serde_json::to_string(plugin_config).map_err(|e| Error::Format {
        what: "plugin configuration".into(),
        reason: e.to_string(),
    })?;
    let mut vm_config = json!({
        "vm_id": "llm-router",
        "runtime": "envoy.wasm.runtime.v8",
        "code": {"local": {"filename": wasm.to_string_lossy()}},
    });
    if !env_keys.is_empty() {
        vm_config["environment_variables"] = json!({"host_env_keys": env_keys});
    }
    Ok(json!({
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": "llm-router",
                "root_id": "llm-router",
                "allow_on_headers_stop_iteration": true,
                // A VM that traps is reloaded (after a backoff) instead of leaving the worker
                // answering 503 for good; while it reloads, requests fail closed.
                "failure_policy": "FAIL_RELOAD",
                "reload_config": {"backoff": {"base_interval": "0.5s", "max_interval": "10s"}},
                "vm_config": vm_config,
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": configuration,
                },
            },
        },
    }))
}

pub(crate) fn access_log_config(path: &Path) -> Value {
    json!({
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": path.to_string_lossy(),
            "log_format": {"json_format": {
                "start": "%START_TIME%",
                "method": "%REQ(:METHOD)%",
                "path": "%REQ(:PATH)%",
                "code": "%RESPONSE_CODE%",
                "flags": "%RESPONSE_FLAGS%",
                "duration_ms": "%DURATION%",
                "upstream_host": "%UPSTREAM_HOST%",
                "cluster": "%UPSTREAM_CLUSTER%",
                "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
                "endpoint_header": "%REQ(X-GATEWAY-DESTINATION-ENDPOINT)%",
                "cluster_header": "%REQ(X-LLM-ROUTER-CLUSTER)%",
                "served": "%RESP(X-GATEWAY-DESTINATION-ENDPOINT-SERVED)%",
                "dropped_reason": "%RESP(X-LLM-ROUTER-DROPPED-REASON)%",
                "bytes_received": "%BYTES_RECEIVED%",
                "bytes_sent": "%BYTES_SENT%",
            }},
        },
    })
}

/// Runs `envoy --mode validate -c FILE`; returns Envoy's output on success.
pub fn validate_config(path: &Path) -> Result<String> {
    validate_config_env(path, &[])
}

/// [`validate_config`] with `env` added to Envoy's environment (validation runs the filter's
/// configuration, which may read a variable such as the snapshot secret).
pub fn validate_config_env(path: &Path, env: &[(&str, &str)]) -> Result<String> {
    let envoy = envoy_binary()?;
    let output = Command::new(&envoy)
        .envs(env.iter().copied())
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(path)
        .arg("--disable-hot-restart")
        .arg("--log-level")
        .arg("warning")
        .output()
        .map_err(|source| Error::Spawn {
            program: envoy.clone(),
            source,
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(Error::CommandFailed {
            command: format!("{} --mode validate -c {}", envoy.display(), path.display()),
            status: output.status.to_string(),
            output: text,
        })
    }
}

/// One line of the access log (fields missing in the line are empty / 0).
#[derive(Debug, Clone, PartialEq)]
pub struct AccessLogEntry {
    /// Request method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// Response code (0 if none was sent).
    pub code: u16,
    /// Envoy response flags (`-` if none).
    pub flags: String,
    /// Total duration in ms.
    pub duration_ms: u64,
    /// The upstream host that served the request (`ip:port`), empty if none.
    pub upstream_host: String,
    /// The upstream cluster, empty if none.
    pub cluster: String,
    /// The request's `x-gateway-destination-endpoint` as the router saw it.
    pub endpoint_header: String,
    /// The response's `x-llm-router-dropped-reason`.
    pub dropped_reason: String,
    /// The whole line as JSON.
    pub raw: Value,
}

impl AccessLogEntry {
    /// Parses one JSON access-log line.
    pub fn parse(line: &str) -> Option<Self> {
        let raw: Value = serde_json::from_str(line).ok()?;
        let text = |key: &str| match raw.get(key) {
            Some(Value::String(s)) if s != "-" => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => String::new(),
        };
        let number = |key: &str| match raw.get(key) {
            Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
            Some(Value::String(s)) => s.parse().unwrap_or(0),
            _ => 0,
        };
        Some(AccessLogEntry {
            method: text("method"),
            path: text("path"),
            code: u16::try_from(number("code")).unwrap_or(0),
            flags: text("flags"),
            duration_ms: number("duration_ms"),
            upstream_host: text("upstream_host"),
            cluster: text("cluster"),
            endpoint_header: text("endpoint_header"),
            dropped_reason: text("dropped_reason"),
            raw,
        })
    }
}

/// A running Envoy; stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct EnvoyProcess {
    /// The public HTTP listener (send traffic here). A listener bound to 0.0.0.0 is reported
    /// as 127.0.0.1 with its port.
    pub listen_addr: SocketAddr,
    /// The internal listener serving the snapshot push and state paths ([`Router::Filter`]).
    pub internal_addr: Option<SocketAddr>,
    /// The admin API.
    pub admin_addr: SocketAddr,
    /// The process itself.
    pub guard: ChildGuard,
    /// The folder holding config and logs.
    pub dir: PathBuf,
    /// The bootstrap file Envoy runs.
    pub config_path: PathBuf,
    /// Envoy's own log (stdout and stderr).
    pub log_path: PathBuf,
    /// The JSON access log.
    pub access_log_path: PathBuf,
}

impl EnvoyProcess {
    pub(crate) fn wait_ready(
        &mut self,
        admin_address_path: &Path,
        timeout: Duration,
    ) -> Result<()> {
        let start = Instant::now();
        let mut reason = String::from("admin address file not written yet");
        while start.elapsed() < timeout {
            self.guard.check_running()?;
            match self.probe(admin_address_path) {
                Ok(()) => return Ok(()),
                Err(why) => reason = why,
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Err(Error::NotReady {
            name: self.guard.name().to_string(),
            waited_ms: start.elapsed().as_millis(),
            reason,
            log: self.log_path.clone(),
            tail: self.guard.log_tail(40),
        })
    }

    fn probe(&mut self, admin_address_path: &Path) -> std::result::Result<(), String> {
        let text = std::fs::read_to_string(admin_address_path)
            .map_err(|_| "admin address file not written yet")?;
        self.admin_addr = text
            .trim()
            .parse()
            .map_err(|e| format!("admin address {text:?}: {e}"))?;
        let (status, body) =
            blocking_get(self.admin_addr, "/ready", ADMIN_TIMEOUT).map_err(|e| e.to_string())?;
        if status != 200 || body.trim() != "LIVE" {
            return Err(format!("/ready answered {status} {:?}", body.trim()));
        }
        let (_, listeners) = blocking_get(self.admin_addr, "/listeners?format=json", ADMIN_TIMEOUT)
            .map_err(|e| e.to_string())?;
        self.listen_addr = listener_address(&listeners, PUBLIC_LISTENER)
            .ok_or_else(|| format!("no listener address in {listeners}"))?;
        if self.listen_addr.ip().is_unspecified() {
            self.listen_addr.set_ip(IpAddr::from([127, 0, 0, 1]));
        }
        self.internal_addr = listener_address(&listeners, INTERNAL_LISTENER);
        for addr in std::iter::once(self.listen_addr).chain(self.internal_addr) {
            TcpStream::connect_timeout(&addr, ADMIN_TIMEOUT)
                .map_err(|e| format!("listener {addr} does not accept: {e}"))?;
        }
        Ok(())
    }

    /// The Envoy process id.
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// `http://<listener><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.listen_addr, path)
    }

    /// Where snapshots are pushed and state is read: the internal listener (or, for Envoys
    /// without the filter, the public one, which then has no such endpoints).
    pub fn push_addr(&self) -> SocketAddr {
        self.internal_addr.unwrap_or(self.listen_addr)
    }

    /// The last `lines` lines of Envoy's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.guard.log_tail(lines)
    }

    /// Stops Envoy now (SIGTERM, then SIGKILL) and returns its exit status.
    pub fn stop(&mut self) -> ExitStatus {
        self.guard.stop()
    }

    /// GET on the admin API (blocking, short); returns status and body.
    pub fn admin_get(&self, path: &str) -> Result<(u16, String)> {
        blocking_get(self.admin_addr, path, ADMIN_TIMEOUT)
    }

    /// Every counter and gauge (`/stats`, histograms left out).
    pub fn stats(&self) -> Result<BTreeMap<String, u64>> {
        let (_, body) = self.admin_get("/stats")?;
        Ok(parse_stats(&body))
    }

    /// The sum of the filter's stats of `family` whose `label` is `value`, over every other
    /// label (pools, models, bands), from `/stats`.
    pub fn filter_stat_sum(&self, family: &str, label: &str, value: &str) -> Result<u64> {
        Ok(self
            .stats()?
            .iter()
            .filter(|(k, _)| filter_stat_label(k, family, label) == Some(value))
            .map(|(_, v)| *v)
            .sum())
    }

    /// One counter or gauge by its full name (e.g. `cluster.pool_a.upstream_rq_total`);
    /// `None` if Envoy has no such stat.
    pub fn counter(&self, name: &str) -> Result<Option<u64>> {
        Ok(self.stats()?.get(name).copied())
    }

    /// Requests each host of `cluster` has received (`rq_total` from `/clusters`).
    pub fn host_rq_totals(&self, cluster: &str) -> Result<BTreeMap<SocketAddr, u64>> {
        let (_, body) = self.admin_get("/clusters")?;
        Ok(parse_host_rq_totals(&body, cluster))
    }

    /// The access log so far (lines that are not JSON are skipped).
    pub fn access_log(&self) -> Vec<AccessLogEntry> {
        std::fs::read_to_string(&self.access_log_path)
            .unwrap_or_default()
            .lines()
            .filter_map(AccessLogEntry::parse)
            .collect()
    }

    /// Waits (bounded by `timeout`) until the access log has at least `n` entries; Envoy
    /// writes it asynchronously.
    pub fn wait_access_log(&self, n: usize, timeout: Duration) -> Result<Vec<AccessLogEntry>> {
        let start = Instant::now();
        loop {
            let entries = self.access_log();
            if entries.len() >= n {
                return Ok(entries);
            }
            if start.elapsed() >= timeout {
                return Err(Error::NotReady {
                    name: format!("access log {}", self.access_log_path.display()),
                    waited_ms: start.elapsed().as_millis(),
                    reason: format!("{} of {n} entries", entries.len()),
                    log: self.log_path.clone(),
                    tail: self.log_tail(20),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Requests per upstream host according to the access log.
    pub fn upstream_counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for entry in self.access_log() {
            if !entry.upstream_host.is_empty() {
                *counts.entry(entry.upstream_host).or_insert(0) += 1;
            }
        }
        counts
    }
}

/// `stats_config` with one tag regex per label of the filter's metrics (as `envoy/envoy.yaml`
/// has it), so `/stats/prometheus` shows them as labels.
pub fn stats_config() -> Value {
    let tags: Vec<Value> = llm_router_core::metrics::LABELS
        .iter()
        .map(|l| json!({"tag_name": l, "regex": llm_router_core::metrics::tag_regex(l)}))
        .collect();
    json!({"stats_tags": tags})
}

pub(crate) fn listener_address(json_text: &str, name: &str) -> Option<SocketAddr> {
    let doc: Value = serde_json::from_str(json_text).ok()?;
    let socket = doc
        .get("listener_statuses")?
        .as_array()?
        .iter()
        .find(|l| l.get("name").and_then(Value::as_str) == Some(name))?
        .get("local_address")?
        .get("socket_address")?;
    let ip = socket.get("address")?.as_str()?;
    let port = socket.get("port_value")?.as_u64()?;
    format!("{ip}:{port}").parse().ok()
}

/// Parses Envoy's text `/stats` (`name: value` lines); histogram lines are skipped.
pub fn parse_stats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(": ")?;
            Some((name.trim().to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The value of `label` in the full `/stats` name of one of the filter's stats of `family`
/// (the filter encodes labels before the metric's name, `pool=.=llama;.;outcome=.=routed;.;`
/// then `llm_router_requests_total`; see `llm_router_core::metrics`); `None` when `name` is of
/// another family or has no such label.
pub fn filter_stat_label<'a>(name: &'a str, family: &str, label: &str) -> Option<&'a str> {
    let labels = name.strip_suffix(family)?.strip_suffix(";.;")?;
    labels.split(";.;").find_map(|part| {
        // The first label carries Envoy's namespace (`wasmcustom.pool`); label names have no dot.
        let (key, value) = part.split_once("=.=")?;
        (key.rsplit('.').next() == Some(label)).then_some(value)
    })
}

/// Parses `/clusters` lines `cluster::ip:port::rq_total::N` for one cluster.
pub fn parse_host_rq_totals(text: &str, cluster: &str) -> BTreeMap<SocketAddr, u64> {
    let prefix = format!("{cluster}::");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (host, rest) = rest.split_once("::")?;
            let value = rest.strip_prefix("rq_total::")?;
            Some((host.parse().ok()?, value.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_a_label_of_the_filters_stat_names() {
        let name = "wasmcustom.pool=.=llama;.;model=.=a_b/c.d;.;outcome=.=least_inflight;.;llm_router_requests_total";
        let family = "llm_router_requests_total";
        assert_eq!(
            filter_stat_label(name, family, "outcome"),
            Some("least_inflight")
        );
        assert_eq!(filter_stat_label(name, family, "pool"), Some("llama"));
        assert_eq!(filter_stat_label(name, family, "model"), Some("a_b/c.d"));
        assert_eq!(filter_stat_label(name, family, "band"), None);
        assert_eq!(
            filter_stat_label(name, "llm_router_picks_total", "pool"),
            None
        );
        assert_eq!(
            filter_stat_label("cluster.x.upstream_rq_total", family, "pool"),
            None
        );
    }

    #[test]
    fn parses_stats_and_cluster_hosts() {
        let stats = "cluster.a.upstream_rq_total: 7\nserver.live: 1\ncluster.a.upstream_rq_time: P0(nan,1) P25(nan,2)\n";
        let parsed = parse_stats(stats);
        assert_eq!(parsed.get("cluster.a.upstream_rq_total"), Some(&7));
        assert_eq!(parsed.get("server.live"), Some(&1));
        assert!(!parsed.contains_key("cluster.a.upstream_rq_time"));
        let clusters = "pool_a::127.0.0.1:9001::rq_total::5\npool_a::127.0.0.1:9001::cx_active::1\n\
                        pool_a::127.0.0.1:9002::rq_total::3\npool_ab::127.0.0.1:9003::rq_total::9\n";
        let hosts = parse_host_rq_totals(clusters, "pool_a");
        assert_eq!(hosts.len(), 2);
        assert_eq!(hosts[&"127.0.0.1:9001".parse().unwrap()], 5);
        assert_eq!(hosts[&"127.0.0.1:9002".parse().unwrap()], 3);
    }

    #[test]
    fn parses_access_log_lines() {
        let line = r#"{"code":200,"upstream_host":"127.0.0.1:9","duration_ms":3,"flags":"-","dropped_reason":null}"#;
        let entry = AccessLogEntry::parse(line).unwrap();
        assert_eq!(entry.code, 200);
        assert_eq!(entry.upstream_host, "127.0.0.1:9");
        assert_eq!(entry.duration_ms, 3);
        assert_eq!(entry.flags, "");
        assert_eq!(entry.dropped_reason, "");
        assert!(AccessLogEntry::parse("not json").is_none());
    }

    #[test]
    fn lb_policy_override_and_endpoint_weights() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:9001".parse().unwrap(),
            "127.0.0.1:9002".parse().unwrap(),
        );
        let mut spec = EnvoySpec::new(Router::LeastRequest).pool("a", "pool_a", vec![a, b]);
        spec.cluster_lb_policy = Some(least_request_full_scan_policy());
        spec.endpoint_weights.insert(b, 10);
        let doc = spec.bootstrap(Path::new("/x"), Path::new("/y")).unwrap();
        let c = &doc["static_resources"]["clusters"][0];
        assert!(c.get("lb_policy").is_none(), "{c}");
        let p = &c["load_balancing_policy"]["policies"][0]["typed_extension_config"];
        assert_eq!(p["typed_config"]["selection_method"], json!("FULL_SCAN"));
        let eps = &c["load_assignment"]["endpoints"][0]["lb_endpoints"];
        assert!(eps[0].get("load_balancing_weight").is_none());
        assert_eq!(eps[1]["load_balancing_weight"], json!(10));
        // The filter keeps its override_host policy whatever is set.
        let mut f = EnvoySpec::new(Router::Filter).pool("a", "pool_a", vec![a]);
        f.cluster_lb_policy = Some(least_request_full_scan_policy());
        let doc = f.bootstrap(Path::new("/x"), Path::new("/y")).unwrap();
        let p = &doc["static_resources"]["clusters"][0]["load_balancing_policy"]["policies"][0];
        assert_eq!(
            p["typed_extension_config"]["name"],
            json!("envoy.load_balancing_policies.override_host")
        );
    }

    #[test]
    fn ext_proc_filter_sits_before_the_router_with_its_grpc_cluster() {
        let a: SocketAddr = "127.0.0.1:9001".parse().unwrap();
        let picker: SocketAddr = "127.0.0.1:9100".parse().unwrap();
        let plain = EnvoySpec::new(Router::RoundRobin).pool("a", "pool_a", vec![a]);
        let doc = plain.bootstrap(Path::new("/x"), Path::new("/y")).unwrap();
        let hcm = |d: &Value| {
            d["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
                .clone()
        };
        assert_eq!(hcm(&doc)["http_filters"].as_array().unwrap().len(), 1);
        assert_eq!(
            doc["static_resources"]["clusters"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        for router in [Router::RoundRobin, Router::Filter] {
            let spec = EnvoySpec::new(router)
                .pool("a", "pool_a", vec![a])
                .ext_proc(picker);
            let doc = spec.bootstrap(Path::new("/x"), Path::new("/y")).unwrap();
            let filters = hcm(&doc)["http_filters"].as_array().unwrap().clone();
            let names: Vec<&str> = filters.iter().filter_map(|f| f["name"].as_str()).collect();
            let n = names.len();
            assert_eq!(
                &names[n - 2..],
                ["envoy.filters.http.ext_proc", "envoy.filters.http.router"]
            );
            let cfg = &filters[n - 2]["typed_config"];
            assert_eq!(cfg["processing_mode"]["request_body_mode"], "BUFFERED");
            assert_eq!(cfg["processing_mode"]["request_header_mode"], "SEND");
            assert_eq!(cfg["processing_mode"]["response_header_mode"], "SKIP");
            assert_eq!(cfg["failure_mode_allow"], false);
            assert_eq!(
                cfg["grpc_service"]["envoy_grpc"]["cluster_name"],
                EXT_PROC_CLUSTER
            );
            let clusters = doc["static_resources"]["clusters"].as_array().unwrap();
            let c = clusters
                .iter()
                .find(|c| c["name"] == EXT_PROC_CLUSTER)
                .unwrap();
            let ep = &c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"];
            assert_eq!(ep["address"]["socket_address"]["port_value"], 9100);
            let opts = &c["typed_extension_protocol_options"]
                ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
            assert!(opts["explicit_http_config"]["http2_protocol_options"].is_object());
        }
    }

    #[test]
    fn filter_bootstrap_has_the_required_settings() {
        let spec = EnvoySpec::new(Router::Filter)
            .pool("a", "pool_a", vec!["127.0.0.1:9001".parse().unwrap()])
            .pool("b", "pool_b", vec!["127.0.0.1:9002".parse().unwrap()]);
        let doc = spec
            .bootstrap(Path::new("/x/f.wasm"), Path::new("/x/access.log"))
            .unwrap();
        let hcm = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"];
        let wasm = &hcm["http_filters"][0]["typed_config"]["config"];
        assert_eq!(wasm["allow_on_headers_stop_iteration"], json!(true));
        assert_eq!(wasm["vm_config"]["runtime"], json!("envoy.wasm.runtime.v8"));
        assert_eq!(
            wasm["vm_config"]["code"]["local"]["filename"],
            json!("/x/f.wasm")
        );
        let plugin: Value =
            serde_json::from_str(wasm["configuration"]["value"].as_str().unwrap()).unwrap();
        assert_eq!(plugin["pools"][1]["cluster"], json!("pool_b"));
        let routes = &hcm["route_config"]["virtual_hosts"][0]["routes"];
        assert_eq!(routes[0]["route"]["cluster_header"], json!(CLUSTER_HEADER));
        assert_eq!(
            routes[0]["match"]["headers"][0]["name"],
            json!(CLUSTER_HEADER)
        );
        // No catch-all to a pool: the last route is the gateway's own 404.
        assert_eq!(routes[1]["direct_response"]["status"], json!(404));
        assert!(routes[1].get("route").is_none());
        assert_eq!(
            hcm["path_with_escaped_slashes_action"],
            json!("REJECT_REQUEST")
        );
        assert_eq!(wasm["failure_policy"], json!("FAIL_RELOAD"));
        let internal = &doc["static_resources"]["listeners"][1];
        assert_eq!(internal["name"], json!(INTERNAL_LISTENER));
        assert_eq!(
            internal["address"]["socket_address"]["address"],
            json!("127.0.0.1")
        );
        let iwasm = &internal["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0]
            ["typed_config"]["config"];
        assert_eq!(
            iwasm["vm_config"], wasm["vm_config"],
            "one VM, one shared data"
        );
        let iplugin: Value =
            serde_json::from_str(iwasm["configuration"]["value"].as_str().unwrap()).unwrap();
        assert_eq!(iplugin["snapshot"]["endpoints"], json!(true));
        assert_eq!(iplugin["snapshot"]["secret"], plugin["snapshot"]["secret"]);
        assert!(plugin["snapshot"].get("endpoints").is_none());
        assert!(wasm["vm_config"].get("environment_variables").is_none());
        // Environment variables go to the process and are listed in both copies' vm_config.
        let mut with_env = spec.clone();
        with_env
            .env
            .insert("LLM_ROUTER_SNAPSHOT_SECRET".into(), "x".into());
        let doc = with_env
            .bootstrap(Path::new("/x/f.wasm"), Path::new("/x/access.log"))
            .unwrap();
        let listeners = &doc["static_resources"]["listeners"];
        for l in 0..2 {
            let vm = &listeners[l]["filter_chains"][0]["filters"][0]["typed_config"]
                ["http_filters"][0]["typed_config"]["config"]["vm_config"];
            assert_eq!(
                vm["environment_variables"]["host_env_keys"],
                json!(["LLM_ROUTER_SNAPSHOT_SECRET"]),
                "listener {l}"
            );
        }
        let cluster = &doc["static_resources"]["clusters"][1];
        let policy = &cluster["load_balancing_policy"]["policies"][0]["typed_extension_config"];
        assert_eq!(
            policy["name"],
            json!("envoy.load_balancing_policies.override_host")
        );
        assert_eq!(
            policy["typed_config"]["override_host_sources"][0]["header"],
            json!(ENDPOINT_HEADER)
        );
        let rr = EnvoySpec::new(Router::RoundRobin).pool("a", "pool_a", vec![]);
        let doc = rr.bootstrap(Path::new("/x"), Path::new("/y")).unwrap();
        let hcm = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"];
        assert_eq!(hcm["http_filters"].as_array().unwrap().len(), 1);
        assert_eq!(
            doc["static_resources"]["clusters"][0]["lb_policy"],
            json!("ROUND_ROBIN")
        );
        assert!(EnvoySpec::new(Router::RoundRobin)
            .bootstrap(Path::new("/x"), Path::new("/y"))
            .is_err());
    }
}
