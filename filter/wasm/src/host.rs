//! Safe wrappers over the proxy-wasm host calls the filter uses.
//!
//! The SDK's context helpers unwrap internally (a non-UTF-8 header value from a client would
//! trap the VM and break every request on that worker). Every call here goes to
//! `proxy_wasm::hostcalls` directly and turns a failure into `None` / `false`, so the glue can
//! decide what a failure means for the request.

use llm_router_core::store::{SharedStore, StoreError};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType, Status};
use std::time::UNIX_EPOCH;

/// A request header as text; `None` when absent or not UTF-8.
pub fn request_header(name: &str) -> Option<String> {
    let bytes = hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name).ok()??;
    String::from_utf8(bytes).ok()
}

/// A response header as text; `None` when absent or not UTF-8.
pub fn response_header(name: &str) -> Option<String> {
    let bytes = hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name).ok()??;
    String::from_utf8(bytes).ok()
}

/// Sets (replaces) a request header.
pub fn set_request_header(name: &str, value: &str) -> bool {
    hostcalls::set_map_value(MapType::HttpRequestHeaders, name, Some(value)).is_ok()
}

/// Removes every copy of a request header.
pub fn remove_request_header(name: &str) {
    let _ = hostcalls::remove_map_value(MapType::HttpRequestHeaders, name);
}

/// Sets (replaces) a response header.
pub fn set_response_header(name: &str, value: &str) -> bool {
    hostcalls::set_map_value(MapType::HttpResponseHeaders, name, Some(value)).is_ok()
}

/// The first `size` bytes of the buffered request body.
pub fn request_body(size: usize) -> Option<Vec<u8>> {
    match hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size) {
        Ok(Some(b)) => Some(b),
        Ok(None) => Some(Vec::new()),
        Err(_) => None,
    }
}

/// Replaces the whole buffered request body (`old_size` bytes) with `body`.
pub fn replace_request_body(old_size: usize, body: &[u8]) -> bool {
    hostcalls::set_buffer(BufferType::HttpRequestBody, 0, old_size, body).is_ok()
}

/// The plugin configuration bytes.
pub fn plugin_configuration(size: usize) -> Option<Vec<u8>> {
    hostcalls::get_buffer(BufferType::PluginConfiguration, 0, size)
        .ok()
        .map(Option::unwrap_or_default)
}

/// A property as text (e.g. `["source", "address"]`).
pub fn property(path: &[&str]) -> Option<String> {
    let bytes = hostcalls::get_property(path.to_vec()).ok()??;
    String::from_utf8(bytes).ok()
}

/// Host time in milliseconds since the Unix epoch (0 if the host cannot tell).
pub fn now_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Host time in nanoseconds, for tie-break entropy.
pub fn now_nanos() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Sends a local reply; the request goes no further.
pub fn send_response(status: u16, headers: &[(&str, &str)], body: &[u8]) -> bool {
    hostcalls::send_http_response(u32::from(status), headers.to_vec(), Some(body)).is_ok()
}

/// Asks Envoy to pick the route again (after the cluster header was set).
pub fn clear_route_cache() -> bool {
    hostcalls::call_foreign_function("clear_route_cache", None).is_ok()
}

/// Whether the host logs at `level` for this VM (false when it cannot tell: lines are skipped
/// rather than formatted for nothing).
pub fn log_enabled(level: LogLevel) -> bool {
    hostcalls::get_log_level().is_ok_and(|l| l as u32 <= level as u32)
}

pub fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

/// The first `size` bytes of the response body chunk the host holds now.
pub fn response_body(size: usize) -> Option<Vec<u8>> {
    match hostcalls::get_buffer(BufferType::HttpResponseBody, 0, size) {
        Ok(Some(b)) => Some(b),
        Ok(None) => Some(Vec::new()),
        Err(_) => None,
    }
}

/// Asks for `on_tick` every `period`.
pub fn set_tick_period(period: std::time::Duration) -> bool {
    hostcalls::set_tick_period(period).is_ok()
}

/// A counter; one that could not be defined is a no-op, never a failure of the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counter(Option<u32>);

impl Counter {
    pub fn define(name: &str) -> Counter {
        Counter(hostcalls::define_metric(MetricType::Counter, name).ok())
    }

    pub fn inc(self) {
        self.add(1);
    }

    pub fn add(self, n: u64) {
        if let (Some(id), Ok(n)) = (self.0, i64::try_from(n)) {
            if n > 0 {
                let _ = hostcalls::increment_metric(id, n);
            }
        }
    }
}

/// A gauge (set, not incremented); a no-op when it could not be defined.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauge(Option<u32>);

impl Gauge {
    pub fn define(name: &str) -> Gauge {
        Gauge(hostcalls::define_metric(MetricType::Gauge, name).ok())
    }

    pub fn set(self, value: u64) {
        if let Some(id) = self.0 {
            let _ = hostcalls::record_metric(id, value);
        }
    }
}

/// A histogram of integer values; a no-op when it could not be defined.
#[derive(Debug, Clone, Copy, Default)]
pub struct Histogram(Option<u32>);

impl Histogram {
    pub fn define(name: &str) -> Histogram {
        Histogram(hostcalls::define_metric(MetricType::Histogram, name).ok())
    }

    pub fn record(self, value: u64) {
        if let Some(id) = self.0 {
            let _ = hostcalls::record_metric(id, value);
        }
    }
}

/// Envoy's shared data (one map per process, per VM id) as a [`SharedStore`].
#[derive(Debug, Clone, Copy, Default)]
pub struct HostStore;

impl SharedStore for HostStore {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        match hostcalls::get_shared_data(key) {
            Ok((Some(v), cas)) => Some((v, cas.unwrap_or(0))),
            Ok((None, Some(cas))) => Some((Vec::new(), cas)),
            _ => None,
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(_) => Err(StoreError::Failed),
        }
    }
}
