//! Loading a module and running VMs of it the way Envoy does: compile once ([`Module`]), one
//! [`Host`] per test (the state Envoy shares between worker threads), one [`Vm`] per worker
//! thread, each started with `_initialize`, root context, `proxy_on_vm_start` and
//! `proxy_on_configure`. Every call into the module is traced, and a trap becomes a
//! [`HostError::Trap`] carrying the Wasm backtrace.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use wasmtime::{
    Config, Engine, ExternType, InstancePre, Linker, Store, TypedFunc, Val, WasmBacktrace,
    WasmParams, WasmResults,
};

use crate::abi::{LogLevel, Status};
use crate::error::HostError;
use crate::request::{Flow, Request};
use crate::state::{
    lock, CallCount, ForeignCall, HostState, HttpCall, LogEntry, Metric, Shared, Trace,
};
use crate::wasi::{ProcExit, ENOSYS, WASI_MODULE};

/// Env var that overrides where the filter `.wasm` is looked for (testkit's
/// `LLM_ROUTER_FILTER_WASM` is honoured too).
pub const WASM_ENV: &str = "LLM_ROUTER_WASM";

/// Where the release filter `.wasm` is: `$LLM_ROUTER_WASM` or `$LLM_ROUTER_FILTER_WASM`, else
/// `$CARGO_TARGET_DIR/wasm32-wasip1/wasm/llm_router_filter.wasm`, else the workspace's
/// `target/`. The path is returned even when the file is missing (the error names it).
pub fn filter_wasm_path() -> PathBuf {
    for var in [WASM_ENV, "LLM_ROUTER_FILTER_WASM"] {
        if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
    }
    let rel = Path::new("wasm32-wasip1")
        .join("wasm")
        .join("llm_router_filter.wasm");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..");
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        let dir = PathBuf::from(dir);
        candidates.push(if dir.is_absolute() {
            dir.join(&rel)
        } else {
            workspace.join(dir).join(&rel)
        });
    }
    candidates.push(workspace.join("target").join(&rel));
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| candidates.remove(0))
}

/// A compiled module with its imports bound; cheap to clone, shared by every VM and test.
#[derive(Clone)]
pub struct Module {
    engine: Engine,
    pre: InstancePre<HostState>,
    imports: Vec<String>,
    unimplemented: Vec<String>,
    exports: Vec<String>,
}

impl Module {
    /// Compiles Wasm bytes (or WAT text) and binds every import.
    pub fn compile(bytes: &[u8]) -> Result<Module, HostError> {
        Module::compile_inner(bytes, true)
    }

    /// Compiles a WASI command module (`_start`, e.g. a `cargo test --target wasm32-wasip1`
    /// test binary) for [`run_command`]; no proxy-wasm exports required.
    pub fn compile_command(bytes: &[u8]) -> Result<Module, HostError> {
        Module::compile_inner(bytes, false)
    }

    fn compile_inner(bytes: &[u8], proxy_wasm: bool) -> Result<Module, HostError> {
        let mut config = Config::new();
        config.wasm_backtrace_max_frames(std::num::NonZeroUsize::new(64));
        config.cranelift_opt_level(wasmtime::OptLevel::Speed);
        let engine = Engine::new(&config).map_err(|e| HostError::Compile(format!("{e:?}")))?;
        let module = wasmtime::Module::new(&engine, bytes)
            .map_err(|e| HostError::Compile(format!("{e:?}")))?;

        let mut linker: Linker<HostState> = Linker::new(&engine);
        let bind = |e: wasmtime::Error| HostError::Module(format!("{e:?}"));
        let env_names = crate::env::define(&mut linker).map_err(bind)?;
        let wasi_names = crate::wasi::define(&mut linker).map_err(bind)?;
        let mut imports = Vec::new();
        let mut unimplemented = Vec::new();
        for imp in module.imports() {
            let (m, n) = (imp.module(), imp.name());
            imports.push(format!("{m}.{n}"));
            let known = (m == "env" && env_names.contains(&n))
                || (m == WASI_MODULE && wasi_names.contains(&n));
            if known {
                continue;
            }
            let ExternType::Func(ft) = imp.ty() else {
                return Err(HostError::Module(format!(
                    "it imports {m}.{n}, which is not a function"
                )));
            };
            let label = format!("{m}.{n}");
            unimplemented.push(label.clone());
            // Unknown functions answer "not implemented" (ENOSYS for WASI, Unimplemented for
            // proxy-wasm) when they return a status, and trap with their name otherwise.
            let status = if m == WASI_MODULE {
                ENOSYS
            } else {
                Status::Unimplemented.raw()
            };
            let returns_status = ft.results().len() == 1 && ft.results().all(|t| t.is_i32());
            linker
                .func_new(m, n, ft.clone(), move |mut c, _params, results| {
                    c.data_mut()
                        .trace
                        .push(|| format!("[vm->host] {label}(..) -> not implemented by this host"));
                    match results.first_mut() {
                        Some(slot) if returns_status => {
                            *slot = Val::I32(status as i32);
                            Ok(())
                        }
                        _ => Err(wasmtime::Error::msg(format!(
                            "the module called {label}, which this host does not implement"
                        ))),
                    }
                })
                .map_err(bind)?;
        }
        let exports = module
            .exports()
            .map(|e| e.name().to_string())
            .collect::<Vec<_>>();
        if proxy_wasm
            && !exports
                .iter()
                .any(|e| e.starts_with("proxy_abi_version_0_2"))
        {
            return Err(HostError::Module(
                "it exports no proxy_abi_version_0_2_x".into(),
            ));
        }
        let pre = linker.instantiate_pre(&module).map_err(bind)?;
        Ok(Module {
            engine,
            pre,
            imports,
            unimplemented,
            exports,
        })
    }

    /// Reads and compiles a `.wasm` file.
    pub fn from_file(path: &Path) -> Result<Module, HostError> {
        if !path.is_file() {
            return Err(HostError::WasmMissing {
                path: path.to_path_buf(),
            });
        }
        let bytes = std::fs::read(path).map_err(|source| HostError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Module::compile(&bytes)
    }

    /// The release filter, compiled once per process (compiling takes seconds; the compiled
    /// code is immutable, all state lives in each [`Host`]).
    pub fn filter() -> Result<Module, HostError> {
        static FILTER: OnceLock<Result<Module, String>> = OnceLock::new();
        FILTER
            .get_or_init(|| Module::from_file(&filter_wasm_path()).map_err(|e| e.to_string()))
            .clone()
            .map_err(HostError::Module)
    }

    /// Every import as `module.name`.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    /// Imports this host answers only with "not implemented".
    pub fn unimplemented_imports(&self) -> &[String] {
        &self.unimplemented
    }

    /// Every export name.
    pub fn exports(&self) -> &[String] {
        &self.exports
    }
}

/// Runs a WASI command module to completion with these arguments (`args[0]` is the program
/// name), its stdout/stderr going to this process's; returns its exit code. Clock and
/// randomness are the host's deterministic ones; there is no file system.
pub fn run_command(module: &Module, args: &[String]) -> Result<i32, HostError> {
    let host = Host::new(module);
    let vm = host.builder().trace(false).start_command(args)?;
    let mut i = vm.0.borrow_mut();
    match i.call(|e| &e.start, 0, "_start()".into(), ()) {
        Ok(_) => Ok(0),
        Err(HostError::Trap { message, .. }) if message.starts_with("module called proc_exit(") => {
            let code = message
                .trim_start_matches("module called proc_exit(")
                .trim_end_matches(')');
            Ok(code.parse().unwrap_or(1))
        }
        Err(e) => Err(e),
    }
}

/// What one test shares between its VMs: shared data, queues, metrics and the clock.
pub struct Host {
    module: Module,
    shared: Arc<Mutex<Shared>>,
    vm_id: String,
}

impl Host {
    /// A fresh host (empty shared data, clock at 2026-01-01T00:00:00Z) for a compiled module.
    pub fn new(module: &Module) -> Host {
        Host {
            module: module.clone(),
            shared: Arc::new(Mutex::new(Shared::new())),
            vm_id: "llm-router".into(),
        }
    }

    /// Compiles `wasm` and makes a host for it.
    pub fn load(wasm: &[u8]) -> Result<Host, HostError> {
        Ok(Host::new(&Module::compile(wasm)?))
    }

    /// A host for the release filter `.wasm` (see [`filter_wasm_path`]).
    pub fn filter() -> Result<Host, HostError> {
        Ok(Host::new(&Module::filter()?))
    }

    /// The module this host runs.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// Starts a VM with this plugin configuration (vm_id and root_id `llm-router`).
    pub fn vm(&self, plugin_config: &str) -> Result<Vm, HostError> {
        self.builder().plugin_config(plugin_config).start()
    }

    /// A VM with more settings.
    pub fn builder(&self) -> VmBuilder<'_> {
        VmBuilder {
            host: self,
            plugin_config: Vec::new(),
            vm_config: Vec::new(),
            root_id: "llm-router".into(),
            properties: Vec::new(),
            log_level: LogLevel::Info,
            trace: true,
            log_before_done: false,
            local_reply_through_filter: true,
            buffer_limit: Some(DEFAULT_BUFFER_LIMIT),
            env: Vec::new(),
        }
    }

    /// Current time of the test clock, ns since the Unix epoch.
    pub fn now_ns(&self) -> u64 {
        lock(&self.shared).clock_ns
    }

    /// Current time of the test clock, ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.now_ns() / 1_000_000
    }

    /// Sets the clock (VM timers are not fired; see [`Vm::advance`]).
    pub fn set_now_ms(&self, ms: u64) {
        lock(&self.shared).clock_ns = ms.saturating_mul(1_000_000);
    }

    /// Moves the clock forward without firing timers.
    pub fn advance_clock(&self, d: Duration) {
        let mut sh = lock(&self.shared);
        sh.clock_ns = sh
            .clock_ns
            .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Shared data under `key` (value and CAS), as every VM sees it.
    pub fn shared_data(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        lock(&self.shared)
            .data
            .get(&(self.vm_id.clone(), key.to_string()))
            .cloned()
    }

    /// Every shared-data key.
    pub fn shared_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = lock(&self.shared)
            .data
            .keys()
            .map(|(_, k)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    /// Writes shared data as another worker would (new CAS).
    pub fn set_shared_data(&self, key: &str, value: &[u8]) {
        let mut sh = lock(&self.shared);
        let cas = sh.next_cas();
        sh.data
            .insert((self.vm_id.clone(), key.to_string()), (value.to_vec(), cas));
    }

    /// A metric by the name the module defined it with.
    pub fn metric(&self, name: &str) -> Option<Metric> {
        lock(&self.shared).metrics.get(name).cloned()
    }

    /// Every metric.
    pub fn metrics(&self) -> BTreeMap<String, Metric> {
        lock(&self.shared).metrics.clone()
    }
}

/// Settings of one VM; [`VmBuilder::start`] runs it up to a configured root context.
pub struct VmBuilder<'h> {
    host: &'h Host,
    plugin_config: Vec<u8>,
    vm_config: Vec<u8>,
    root_id: String,
    properties: Vec<(String, Vec<u8>)>,
    log_level: LogLevel,
    trace: bool,
    log_before_done: bool,
    local_reply_through_filter: bool,
    buffer_limit: Option<usize>,
    env: Vec<Vec<u8>>,
}

/// Envoy's default `per_connection_buffer_limit_bytes` (1 MiB), which also bounds a request
/// body a filter buffers.
pub const DEFAULT_BUFFER_LIMIT: usize = 1024 * 1024;

impl VmBuilder<'_> {
    pub fn plugin_config(mut self, config: impl AsRef<[u8]>) -> Self {
        self.plugin_config = config.as_ref().to_vec();
        self
    }

    pub fn vm_config(mut self, config: impl AsRef<[u8]>) -> Self {
        self.vm_config = config.as_ref().to_vec();
        self
    }

    /// An environment variable the module sees (WASI `environ_get`), as Envoy passes the ones
    /// listed in `vm_config.environment_variables` (`host_env_keys`, `key_values`).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push(format!("{key}={value}").into_bytes());
        self
    }

    pub fn root_id(mut self, id: &str) -> Self {
        self.root_id = id.into();
        self
    }

    /// A VM-wide property (e.g. `"node.id"`); per-request ones go on [`Request::property`].
    pub fn property(mut self, path: &str, value: impl Into<PropertyValue>) -> Self {
        self.properties.push((path.into(), value.into().0));
        self
    }

    /// What `proxy_get_log_level` answers (Envoy's default is `Info`).
    pub fn log_level(mut self, level: LogLevel) -> Self {
        self.log_level = level;
        self
    }

    /// Record the crossing trace (on by default; off for benchmarks).
    pub fn trace(mut self, on: bool) -> Self {
        self.trace = on;
        self
    }

    /// End streams with `proxy_on_log` before `proxy_on_done` (default: done, log, delete,
    /// the order of the ABI spec). A filter should account correctly in both orders.
    pub fn log_before_done(mut self, yes: bool) -> Self {
        self.log_before_done = yes;
        self
    }

    /// Whether a local reply passes through this filter's response callbacks, as it does in
    /// Envoy (default true).
    pub fn local_reply_through_filter(mut self, yes: bool) -> Self {
        self.local_reply_through_filter = yes;
        self
    }

    /// The most request body Envoy buffers for a filter that pauses (the listener's
    /// `per_connection_buffer_limit_bytes`, 1 MiB by default); past it Envoy itself answers 413
    /// "Payload Too Large" while the headers are held. `None` = no limit.
    pub fn buffer_limit(mut self, limit: Option<usize>) -> Self {
        self.buffer_limit = limit;
        self
    }

    /// Instantiates and starts the VM: `_initialize`/`_start`, root context 1,
    /// `proxy_on_vm_start`, `proxy_on_configure`.
    pub fn start(self) -> Result<Vm, HostError> {
        self.instantiate(None)
    }

    /// Instantiates a command module without running anything (see [`run_command`]).
    fn start_command(self, args: &[String]) -> Result<Vm, HostError> {
        self.instantiate(Some(args))
    }

    fn instantiate(self, command_args: Option<&[String]>) -> Result<Vm, HostError> {
        let host = self.host;
        let vm_index = {
            let mut sh = lock(&host.shared);
            sh.next_vm += 1;
            sh.next_vm
        };
        let state = HostState {
            shared: host.shared.clone(),
            vm_index,
            vm_id: host.vm_id.clone(),
            root_id: self.root_id,
            memory: None,
            alloc: None,
            root_ctx: 1,
            effective_ctx: 1,
            vm_config: self.vm_config,
            plugin_config: self.plugin_config,
            in_vm_start: false,
            in_configure: false,
            properties: self.properties.into_iter().collect(),
            streams: HashMap::new(),
            logs: Vec::new(),
            trace: Trace::new(self.trace),
            stdout: Vec::new(),
            stderr: Vec::new(),
            log_level: self.log_level,
            tick: None,
            http_calls: Vec::new(),
            next_token: 0,
            call_response: None,
            metric_ids: Vec::new(),
            foreign_calls: Vec::new(),
            violations: Vec::new(),
            rng: 0x5eed_0000 + vm_index as u64,
            host_calls: 0,
            call_counts: None,
            pending_in: std::cell::Cell::new(0),
            last_kind: None,
            args: Vec::new(),
            env: self.env,
            passthrough_output: false,
        };
        let mut store = Store::new(&host.module.engine, state);
        let instance = host
            .module
            .pre
            .instantiate(&mut store)
            .map_err(|e| HostError::Instantiate(format!("{e:?}")))?;
        let memory = instance.get_memory(&mut store, "memory");
        let alloc = instance
            .get_typed_func::<u32, u32>(&mut store, "proxy_on_memory_allocate")
            .or_else(|_| instance.get_typed_func::<u32, u32>(&mut store, "malloc"))
            .ok();
        store.data_mut().memory = memory;
        store.data_mut().alloc = alloc;
        macro_rules! f {
            ($name:literal) => {
                instance.get_typed_func(&mut store, $name).ok()
            };
        }
        let ex = Exports {
            initialize: f!("_initialize"),
            start: f!("_start"),
            context_create: f!("proxy_on_context_create"),
            vm_start: f!("proxy_on_vm_start"),
            configure: f!("proxy_on_configure"),
            request_headers: f!("proxy_on_request_headers"),
            request_body: f!("proxy_on_request_body"),
            request_trailers: f!("proxy_on_request_trailers"),
            response_headers: f!("proxy_on_response_headers"),
            response_body: f!("proxy_on_response_body"),
            response_trailers: f!("proxy_on_response_trailers"),
            done: f!("proxy_on_done"),
            log: f!("proxy_on_log"),
            delete: f!("proxy_on_delete"),
            tick: f!("proxy_on_tick"),
            queue_ready: f!("proxy_on_queue_ready"),
            http_call_response: f!("proxy_on_http_call_response"),
        };
        let mut inner = VmInner {
            store,
            instance,
            ex,
            dead: None,
            next_ctx: 2,
            flows: HashMap::new(),
            log_before_done: self.log_before_done,
            local_reply_through_filter: self.local_reply_through_filter,
            buffer_limit: self.buffer_limit,
        };
        if let Some(args) = command_args {
            let st = inner.store.data_mut();
            st.args = args.iter().map(|a| a.as_bytes().to_vec()).collect();
            st.passthrough_output = true;
            return Ok(Vm(Rc::new(RefCell::new(inner))));
        }
        inner.boot()?;
        Ok(Vm(Rc::new(RefCell::new(inner))))
    }
}

/// A property value: strings as their bytes, integers as 8 little-endian bytes (Envoy's
/// encoding of `int64` properties).
pub struct PropertyValue(pub Vec<u8>);

impl From<&str> for PropertyValue {
    fn from(s: &str) -> Self {
        PropertyValue(s.as_bytes().to_vec())
    }
}
impl From<String> for PropertyValue {
    fn from(s: String) -> Self {
        PropertyValue(s.into_bytes())
    }
}
impl From<&[u8]> for PropertyValue {
    fn from(b: &[u8]) -> Self {
        PropertyValue(b.to_vec())
    }
}
impl From<Vec<u8>> for PropertyValue {
    fn from(b: Vec<u8>) -> Self {
        PropertyValue(b)
    }
}
impl From<i64> for PropertyValue {
    fn from(v: i64) -> Self {
        PropertyValue(v.to_le_bytes().to_vec())
    }
}

/// `proxy_on_http_call_response(ctx, token, headers, body, trailers)`.
pub(crate) type HttpCallResponseFn = TypedFunc<(u32, u32, u32, u32, u32), ()>;

pub(crate) struct Exports {
    pub initialize: Option<TypedFunc<(), ()>>,
    pub start: Option<TypedFunc<(), ()>>,
    pub context_create: Option<TypedFunc<(u32, u32), ()>>,
    pub vm_start: Option<TypedFunc<(u32, u32), u32>>,
    pub configure: Option<TypedFunc<(u32, u32), u32>>,
    pub request_headers: Option<TypedFunc<(u32, u32, u32), u32>>,
    pub request_body: Option<TypedFunc<(u32, u32, u32), u32>>,
    pub request_trailers: Option<TypedFunc<(u32, u32), u32>>,
    pub response_headers: Option<TypedFunc<(u32, u32, u32), u32>>,
    pub response_body: Option<TypedFunc<(u32, u32, u32), u32>>,
    pub response_trailers: Option<TypedFunc<(u32, u32), u32>>,
    pub done: Option<TypedFunc<u32, u32>>,
    pub log: Option<TypedFunc<u32, ()>>,
    pub delete: Option<TypedFunc<u32, ()>>,
    pub tick: Option<TypedFunc<u32, ()>>,
    pub queue_ready: Option<TypedFunc<(u32, u32), ()>>,
    pub http_call_response: Option<HttpCallResponseFn>,
}

/// One VM: a wasmtime store with its instance, and the streams in flight on it.
pub(crate) struct VmInner {
    pub store: Store<HostState>,
    pub instance: wasmtime::Instance,
    pub ex: Exports,
    pub dead: Option<String>,
    pub next_ctx: u32,
    pub flows: HashMap<u32, Flow>,
    pub log_before_done: bool,
    pub local_reply_through_filter: bool,
    pub buffer_limit: Option<usize>,
}

impl VmInner {
    /// Calls an export (a no-op when the module does not export it, as in Envoy), tracing the
    /// crossing and turning a trap into [`HostError::Trap`].
    pub fn call<P, R>(
        &mut self,
        pick: fn(&Exports) -> &Option<TypedFunc<P, R>>,
        ctx: u32,
        what: String,
        args: P,
    ) -> Result<Option<R>, HostError>
    where
        P: WasmParams,
        R: WasmResults + Debug,
    {
        if let Some(d) = &self.dead {
            return Err(HostError::VmDead(d.clone()));
        }
        let Some(f) = pick(&self.ex).clone() else {
            self.store
                .data_mut()
                .trace
                .push(|| format!("[host->vm] {what}: not exported, skipped"));
            return Ok(None);
        };
        let st = self.store.data_mut();
        st.effective_ctx = ctx;
        st.trace.push(|| format!("[host->vm] {what}"));
        match f.call(&mut self.store, args) {
            Ok(r) => {
                self.store
                    .data_mut()
                    .trace
                    .push(|| format!("[host<-vm] {} -> {r:?}", short(&what)));
                Ok(Some(r))
            }
            Err(e) => Err(self.trap(what, e)),
        }
    }

    pub(crate) fn trap(&mut self, what: String, e: wasmtime::Error) -> HostError {
        let backtrace = match e.downcast_ref::<WasmBacktrace>() {
            Some(bt) => bt.to_string(),
            None => "(no wasm backtrace)".into(),
        };
        let message = if let Some(t) = e.downcast_ref::<wasmtime::Trap>() {
            t.to_string()
        } else if let Some(p) = e.downcast_ref::<ProcExit>() {
            p.to_string()
        } else {
            e.root_cause().to_string()
        };
        self.dead = Some(what.clone());
        let st = self.store.data_mut();
        st.trace
            .push(|| format!("[host<-vm] {} -> TRAP {message}", short(&what)));
        let mut output = String::new();
        output.push_str(&String::from_utf8_lossy(tail_bytes(&st.stderr, 4096)));
        output.push_str(&String::from_utf8_lossy(tail_bytes(&st.stdout, 4096)));
        for l in st
            .logs
            .iter()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            output.push_str(&format!(
                "[log {:?} ctx={}] {}\n",
                l.level, l.ctx, l.message
            ));
        }
        let trace = st.trace.tail(40);
        HostError::Trap {
            callback: what,
            message,
            backtrace,
            output,
            trace,
        }
    }

    fn boot(&mut self) -> Result<(), HostError> {
        if self.ex.initialize.is_some() {
            self.call(|e| &e.initialize, 0, "_initialize()".into(), ())?;
        } else if self.ex.start.is_some() {
            match self.call(|e| &e.start, 0, "_start()".into(), ()) {
                Err(HostError::Trap { message, .. }) if message == ProcExit(0).to_string() => {
                    self.dead = None;
                }
                other => {
                    other?;
                }
            }
        }
        let root = self.store.data().root_ctx;
        self.call(
            |e| &e.context_create,
            root,
            format!("proxy_on_context_create(ctx={root}, root=0)"),
            (root, 0),
        )?;
        let n = len32(self.store.data().vm_config.len());
        self.store.data_mut().in_vm_start = true;
        let ok = self.call(
            |e| &e.vm_start,
            root,
            format!("proxy_on_vm_start(ctx={root}, size={n})"),
            (root, n),
        );
        self.store.data_mut().in_vm_start = false;
        if ok? == Some(0) {
            return Err(HostError::VmStartRejected {
                logs: self.log_text(),
            });
        }
        let n = len32(self.store.data().plugin_config.len());
        self.store.data_mut().in_configure = true;
        let ok = self.call(
            |e| &e.configure,
            root,
            format!("proxy_on_configure(ctx={root}, size={n})"),
            (root, n),
        );
        self.store.data_mut().in_configure = false;
        if ok? == Some(0) {
            return Err(HostError::ConfigureRejected {
                logs: self.log_text(),
            });
        }
        Ok(())
    }

    pub fn log_text(&self) -> String {
        self.store
            .data()
            .logs
            .iter()
            .map(|l| format!("[{:?} ctx={}] {}\n", l.level, l.ctx, l.message))
            .collect()
    }

    /// Fires `proxy_on_tick` for every period that ends by `target_ns`, moving the clock to each
    /// deadline first, then leaves the clock at `target_ns`.
    fn advance_to(&mut self, target_ns: u64) -> Result<u32, HostError> {
        let mut fired = 0;
        loop {
            let now = self.store.data().now_ns();
            let Some((period, next)) = self.store.data().tick else {
                break;
            };
            if next > target_ns {
                break;
            }
            let at = next.max(now);
            lock(&self.store.data().shared).clock_ns = at;
            // Re-arm before the call, so a period set inside on_tick wins.
            self.store.data_mut().tick =
                Some((period, at.saturating_add(u64::from(period) * 1_000_000)));
            let root = self.store.data().root_ctx;
            self.call(
                |e| &e.tick,
                root,
                format!("proxy_on_tick(ctx={root})"),
                root,
            )?;
            // Streams the tick resumed or answered (`proxy_continue_stream`, a local reply
            // from the root context through `proxy_set_effective_context`) go on now.
            self.after_out_of_band(root)?;
            fired += 1;
        }
        let mut sh = lock(&self.store.data().shared);
        sh.clock_ns = sh.clock_ns.max(target_ns);
        Ok(fired)
    }
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn tail_bytes(b: &[u8], n: usize) -> &[u8] {
    &b[b.len().saturating_sub(n)..]
}

/// `proxy_on_request_body(ctx=2, ...)` → `proxy_on_request_body`.
pub(crate) fn short(what: &str) -> &str {
    what.split('(').next().unwrap_or(what)
}

/// One VM of the module: a worker thread of Envoy. Cheap to clone (a handle); not `Send`.
#[derive(Clone)]
pub struct Vm(pub(crate) Rc<RefCell<VmInner>>);

impl Vm {
    /// A new HTTP stream; nothing reaches the module until [`Request::send`].
    pub fn request(&self) -> Request {
        Request::new(self.clone())
    }

    /// Sets a VM-wide property (seen by every stream unless a stream overrides it).
    pub fn set_property(&self, path: &str, value: impl Into<PropertyValue>) {
        self.0
            .borrow_mut()
            .store
            .data_mut()
            .properties
            .insert(path.into(), value.into().0);
    }

    /// Everything the module logged, in order.
    pub fn logs(&self) -> Vec<LogEntry> {
        self.0.borrow().store.data().logs.clone()
    }

    /// The logs as text, one `[Level ctx=N] message` per line.
    pub fn log_text(&self) -> String {
        self.0.borrow().log_text()
    }

    /// True when some log line contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.0
            .borrow()
            .store
            .data()
            .logs
            .iter()
            .any(|l| l.message.contains(needle))
    }

    /// The whole crossing trace.
    pub fn trace(&self) -> String {
        self.0.borrow().store.data().trace.tail(usize::MAX)
    }

    /// The last `n` lines of the trace.
    pub fn trace_tail(&self, n: usize) -> String {
        self.0.borrow().store.data().trace.tail(n)
    }

    /// What the module wrote to stdout and stderr.
    pub fn output(&self) -> (String, String) {
        let i = self.0.borrow();
        let st = i.store.data();
        (
            String::from_utf8_lossy(&st.stdout).into_owned(),
            String::from_utf8_lossy(&st.stderr).into_owned(),
        )
    }

    /// How many host functions the module has called so far.
    pub fn host_calls(&self) -> u64 {
        self.0.borrow().store.data().host_calls
    }

    /// Starts (`true`, from zero) or stops counting host calls per kind with the bytes each
    /// kind copied across the Wasm boundary. Costs a formatted line per call: for cost tests
    /// and reports, not for timing.
    pub fn count_calls(&self, on: bool) {
        let mut inner = self.0.borrow_mut();
        let st = inner.store.data_mut();
        st.call_counts = on.then(BTreeMap::new);
        st.last_kind = None;
        st.pending_in.set(0);
    }

    /// The per-kind counts since [`Vm::count_calls`]`(true)` (empty when not counting), keyed
    /// by the ABI function name (`proxy_get_shared_data`, …).
    pub fn call_counts(&self) -> BTreeMap<String, CallCount> {
        self.0
            .borrow()
            .store
            .data()
            .call_counts
            .clone()
            .unwrap_or_default()
    }

    /// Size of the module's linear memory in bytes (what this worker VM holds).
    pub fn memory_bytes(&self) -> usize {
        let inner = self.0.borrow();
        inner
            .store
            .data()
            .memory
            .map(|m| m.data_size(&inner.store))
            .unwrap_or(0)
    }

    /// True after a trap.
    pub fn is_dead(&self) -> bool {
        self.0.borrow().dead.is_some()
    }

    /// The tick period the module asked for, if any.
    pub fn tick_period(&self) -> Option<Duration> {
        self.0
            .borrow()
            .store
            .data()
            .tick
            .map(|(p, _)| Duration::from_millis(u64::from(p)))
    }

    /// Moves the shared clock forward by `d`, firing this VM's ticks on the way (each at its
    /// deadline). Returns how many ticks fired.
    pub fn advance(&self, d: Duration) -> Result<u32, HostError> {
        let mut i = self.0.borrow_mut();
        let target = i
            .store
            .data()
            .now_ns()
            .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        i.advance_to(target)
    }

    /// Fires ticks that are due now (another VM may have moved the clock).
    pub fn run_timers(&self) -> Result<u32, HostError> {
        let mut i = self.0.borrow_mut();
        let now = i.store.data().now_ns();
        i.advance_to(now)
    }

    /// `proxy_http_call`s not yet answered.
    pub fn http_calls(&self) -> Vec<HttpCall> {
        self.0.borrow().store.data().http_calls.clone()
    }

    /// Answers an http call: `proxy_on_http_call_response` with these headers and body.
    pub fn respond_http_call(
        &self,
        token: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
        let pairs = headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.as_bytes().to_vec()))
            .collect();
        self.deliver_http_call(token, Some((pairs, body.to_vec(), Vec::new())))
    }

    /// Fails an http call (reset/timeout): Envoy calls back with no headers and no body.
    pub fn fail_http_call(&self, token: u32) -> Result<(), HostError> {
        self.deliver_http_call(token, None)
    }

    fn deliver_http_call(
        &self,
        token: u32,
        response: Option<crate::abi::Pairs3>,
    ) -> Result<(), HostError> {
        let mut i = self.0.borrow_mut();
        let calls = &mut i.store.data_mut().http_calls;
        let Some(pos) = calls.iter().position(|c| c.token == token) else {
            return Err(HostError::Usage(format!(
                "no pending http call with token {token}"
            )));
        };
        let call = calls.remove(pos);
        let (nh, nb, nt) = match &response {
            Some((h, b, t)) => (len32(h.len()), len32(b.len()), len32(t.len())),
            None => (0, 0, 0),
        };
        i.store.data_mut().call_response = response;
        let ctx = call.ctx;
        let r = i.call(
            |e| &e.http_call_response,
            ctx,
            format!("proxy_on_http_call_response(ctx={ctx}, token={token}, headers={nh}, body={nb}, trailers={nt})"),
            (ctx, token, nh, nb, nt),
        );
        i.store.data_mut().call_response = None;
        r?;
        i.after_out_of_band(ctx)
    }

    /// Announces queued items with `proxy_on_queue_ready` on this VM (for queues it
    /// registered). Returns how many announcements were made.
    pub fn deliver_queue_events(&self) -> Result<u32, HostError> {
        let mut i = self.0.borrow_mut();
        let vm = i.store.data().vm_index;
        let due: Vec<(u32, u32, usize)> = {
            let mut sh = lock(&i.store.data().shared);
            sh.queues
                .iter_mut()
                .enumerate()
                .filter(|(_, q)| q.owner_vm == vm && q.unannounced > 0)
                .map(|(n, q)| {
                    (
                        q.owner_ctx,
                        len32(n + 1),
                        std::mem::take(&mut q.unannounced),
                    )
                })
                .collect()
        };
        let mut count = 0;
        for (ctx, id, times) in due {
            for _ in 0..times {
                i.call(
                    |e| &e.queue_ready,
                    ctx,
                    format!("proxy_on_queue_ready(ctx={ctx}, queue={id})"),
                    (ctx, id),
                )?;
                count += 1;
            }
        }
        Ok(count)
    }

    /// Every `proxy_call_foreign_function` made on this VM.
    pub fn foreign_calls(&self) -> Vec<ForeignCall> {
        self.0.borrow().store.data().foreign_calls.clone()
    }

    /// Violations outside any stream (e.g. `clear_route_cache` from the root context).
    pub fn violations(&self) -> Vec<String> {
        self.0.borrow().store.data().violations.clone()
    }

    /// Drops what is kept of finished streams and the logs (long benchmark runs).
    pub fn forget_finished(&self) {
        let mut i = self.0.borrow_mut();
        i.flows.retain(|_, f| !f.finished);
        i.store.data_mut().logs.clear();
        i.store.data_mut().foreign_calls.clear();
    }

    /// Calls any exported function with integer arguments (converted to its parameter types);
    /// for modules written for a test. Traps are reported like callback traps.
    pub fn call_export(&self, name: &str, args: &[i64]) -> Result<Vec<i64>, HostError> {
        let mut i = self.0.borrow_mut();
        if let Some(d) = &i.dead {
            return Err(HostError::VmDead(d.clone()));
        }
        let inst = i.instance;
        let Some(f) = inst.get_func(&mut i.store, name) else {
            return Err(HostError::Usage(format!(
                "the module exports no function {name}"
            )));
        };
        let ty = f.ty(&i.store);
        if ty.params().len() != args.len() {
            return Err(HostError::Usage(format!(
                "{name} takes {} arguments",
                ty.params().len()
            )));
        }
        let params: Vec<Val> = ty
            .params()
            .zip(args)
            .map(|(t, a)| {
                if t.is_i64() {
                    Val::I64(*a)
                } else {
                    Val::I32(*a as i32)
                }
            })
            .collect();
        let mut results: Vec<Val> = ty.results().map(|_| Val::I32(0)).collect();
        let what = format!("{name}{args:?}");
        let root = i.store.data().root_ctx;
        let st = i.store.data_mut();
        st.effective_ctx = root;
        st.trace.push(|| format!("[host->vm] {what}"));
        if let Err(e) = f.call(&mut i.store, &params, &mut results) {
            return Err(i.trap(what, e));
        }
        Ok(results
            .iter()
            .map(|v| match v {
                Val::I32(x) => i64::from(*x),
                Val::I64(x) => *x,
                _ => 0,
            })
            .collect())
    }

    /// Ends the VM as Envoy does on shutdown: `proxy_on_done` then `proxy_on_delete` on the
    /// root context. Returns what `proxy_on_done` answered.
    pub fn shutdown(&self) -> Result<bool, HostError> {
        let mut i = self.0.borrow_mut();
        let root = i.store.data().root_ctx;
        let done = i.call(
            |e| &e.done,
            root,
            format!("proxy_on_done(ctx={root})"),
            root,
        )?;
        i.call(
            |e| &e.delete,
            root,
            format!("proxy_on_delete(ctx={root})"),
            root,
        )?;
        Ok(done != Some(0))
    }
}
