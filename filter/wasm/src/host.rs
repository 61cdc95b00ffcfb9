//! Safe wrappers over the proxy-wasm host calls the filter uses.
//!
//! The SDK's context helpers unwrap internally (a non-UTF-8 header value from a client would
//! trap the VM and break every request on that worker). Every call here goes to
//! `proxy_wasm::hostcalls` directly and turns a failure into `None` / `false`, so the glue can
//! decide what a failure means for the request. No other module calls the host.

use llm_router_core::store::{SharedStore, StoreError};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType, Status};
use std::time::UNIX_EPOCH;

/// Every header of a request or response, fetched in one host call (`proxy_get_header_map_pairs`)
/// instead of one call per header: each call that returns data also re-enters the module to
/// allocate it, so several reads of the same map cost far more one by one.
///
/// Kept as the host serialised it (`count u32 | (key_len u32 | value_len u32) * count |
/// (key \0 value \0) * count`, little-endian) and read in place; a map that does not decode
/// reads as empty.
#[derive(Debug, Default)]
pub struct HeaderMap(Vec<u8>);

impl HeaderMap {
    /// The first value of `name` (ASCII case-insensitive) as text; `None` when absent or not
    /// UTF-8, like a single-header read.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs()
            .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// Whether `name` is present (any value).
    pub fn contains(&self, name: &str) -> bool {
        self.pairs()
            .any(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
    }

    fn pairs(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let b = self.0.as_slice();
        let u32_at = |at: usize| {
            b.get(at..at.checked_add(4)?)
                .and_then(|s| <[u8; 4]>::try_from(s).ok())
                .map(|a| u32::from_le_bytes(a) as usize)
        };
        let count = u32_at(0).unwrap_or(0);
        // Sizes start at 4; the data after the sizes table.
        let mut data = count
            .checked_mul(8)
            .and_then(|n| n.checked_add(4))
            .unwrap_or(usize::MAX);
        (0..count).map_while(move |i| {
            let sizes = 4 + i * 8;
            let (k, v) = (u32_at(sizes)?, u32_at(sizes + 4)?);
            let key = b.get(data..data.checked_add(k)?)?;
            let value_at = data.checked_add(k)?.checked_add(1)?;
            let value = b.get(value_at..value_at.checked_add(v)?)?;
            data = value_at.checked_add(v)?.checked_add(1)?;
            Some((key, value))
        })
    }
}

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_header_map_pairs(
        map_type: MapType,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> u32;
}

/// Every header of `map` in one call (the SDK's own `get_map` panics on a value that is not
/// UTF-8, which a client can send).
fn header_map(map: MapType) -> HeaderMap {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: the host writes a pointer it allocated through this module's
    // `proxy_on_memory_allocate` (the SDK's allocator: a `Vec<u8>` of capacity `size`, leaked)
    // and its size, exactly as for the SDK's own `get_map`; ownership passes to the `Vec`.
    unsafe {
        match proxy_get_header_map_pairs(map, &mut data, &mut size) {
            status if status == Status::Ok as u32 && !data.is_null() => {
                HeaderMap(Vec::from_raw_parts(data, size, size))
            }
            _ => HeaderMap::default(),
        }
    }
}

/// Every request header, in one host call.
pub fn request_headers() -> HeaderMap {
    header_map(MapType::HttpRequestHeaders)
}

/// Every response header, in one host call.
pub fn response_headers() -> HeaderMap {
    header_map(MapType::HttpResponseHeaders)
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

/// Registers this VM's shared queue `name` (where other workers wake this one); `None` when
/// the host refused.
pub fn register_shared_queue(name: &str) -> Option<u32> {
    hostcalls::register_shared_queue(name).ok()
}

/// The queue `name` another worker registered under `vm_id`; `None` when there is none (yet)
/// or the host refused.
pub fn resolve_shared_queue(vm_id: &str, name: &str) -> Option<u32> {
    hostcalls::resolve_shared_queue(vm_id, name).ok().flatten()
}

/// Takes the next message off `queue`; `None` when it is empty or the host refused.
pub fn dequeue_shared_queue(queue: u32) -> Option<Vec<u8>> {
    match hostcalls::dequeue_shared_queue(queue) {
        Ok(Some(message)) => Some(message),
        _ => None,
    }
}

/// Puts `message` on `queue` (the host calls its registrant's `on_queue_ready`).
pub fn enqueue_shared_queue(queue: u32, message: &[u8]) -> bool {
    hostcalls::enqueue_shared_queue(queue, Some(message)).is_ok()
}

/// Makes context `id` the one the next calls act on (a paused stream, from the root context);
/// false when that stream is gone.
pub fn set_effective_context(id: u32) -> bool {
    hostcalls::set_effective_context(id).is_ok()
}

/// Lets the effective stream's paused request go on to its upstream.
pub fn resume_request() -> bool {
    hostcalls::resume_http_request().is_ok()
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

/// A gauge (set, or moved by a delta); a no-op when it could not be defined.
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

    /// Moves the gauge by `delta` (Envoy adds or subtracts atomically: several workers can
    /// share one gauge).
    pub fn add(self, delta: i64) {
        if let (Some(id), true) = (self.0, delta != 0) {
            let _ = hostcalls::increment_metric(id, delta);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::HeaderMap;

    /// Serialises pairs the way the host does for `proxy_get_header_map_pairs`.
    fn serialise(pairs: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
        for (k, v) in pairs {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        }
        for (k, v) in pairs {
            out.extend_from_slice(k.as_bytes());
            out.push(0);
            out.extend_from_slice(v);
            out.push(0);
        }
        out
    }

    #[test]
    fn headers_are_found_by_name_in_any_case_first_value_first() {
        let map = HeaderMap(serialise(&[
            (":path", b"/v1/chat/completions?x=1"),
            (":method", b"POST"),
            ("x-empty", b""),
            ("x-priority", b"2"),
            ("x-priority", b"9"),
            ("x-binary", b"\xff\xfe"),
        ]));
        assert_eq!(map.get(":path"), Some("/v1/chat/completions?x=1"));
        assert_eq!(map.get(":method"), Some("POST"));
        assert_eq!(map.get("X-Priority"), Some("2"));
        assert_eq!(map.get("x-empty"), Some(""));
        assert!(map.contains("x-empty"));
        // Present but not text: absent to `get` (as for a single-header read), present to
        // `contains` (so a spoofed routing header is removed whatever its bytes).
        assert_eq!(map.get("x-binary"), None);
        assert!(map.contains("X-BINARY"));
        assert_eq!(map.get("content-length"), None);
        assert!(!map.contains("x-gateway-destination-endpoint"));
    }

    #[test]
    fn a_map_that_does_not_decode_reads_as_empty_without_panicking() {
        let good = serialise(&[("a", b"1"), ("bb", b"22")]);
        for cut in 0..good.len() {
            let map = HeaderMap(good[..cut].to_vec());
            // What survives the cut is a whole pair or nothing, never a piece of one.
            assert!(matches!(map.get("a"), None | Some("1")), "cut at {cut}");
            assert!(matches!(map.get("bb"), None | Some("22")), "cut at {cut}");
        }
        // A count far beyond the bytes, sizes pointing past the end.
        let mut lying = good.clone();
        lying[0] = 0xff;
        assert_eq!(HeaderMap(lying).get("zz"), None);
        let mut huge = good.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(HeaderMap(huge).get("a"), None);
        assert_eq!(HeaderMap::default().get("a"), None);
    }
}
