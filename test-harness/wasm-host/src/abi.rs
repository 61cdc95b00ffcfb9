//! The numbers and byte layouts of the proxy-wasm ABI 0.2.1, in one place, so the host functions
//! and the trace speak the same names as the SDK (`proxy_wasm::types`).

use std::fmt;

/// Status codes a host function returns (`WasmResult` in Envoy). Only the ones the SDK accepts
/// for each call may be returned, or the SDK panics inside the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    BadArgument = 2,
    SerializationFailure = 3,
    ParseFailure = 4,
    InvalidMemoryAccess = 6,
    Empty = 7,
    CasMismatch = 8,
    InternalFailure = 10,
    Unimplemented = 12,
}

impl Status {
    /// The raw value handed back to the module.
    pub fn raw(self) -> u32 {
        self as u32
    }
}

/// `proxy_wasm::types::Action` as returned by the stream callbacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Let the data go on to the next filter (Envoy `Continue`).
    Continue,
    /// Hold it: `StopIteration` for headers, `StopIterationAndBuffer` for a body chunk.
    Pause,
    /// A value the SDK never returns; kept so a violation can be reported.
    Other(u32),
}

impl Action {
    pub(crate) fn from_raw(v: u32) -> Action {
        match v {
            0 => Action::Continue,
            1 => Action::Pause,
            other => Action::Other(other),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Continue => f.write_str("Continue"),
            Action::Pause => f.write_str("Pause"),
            Action::Other(v) => write!(f, "Action({v})"),
        }
    }
}

/// Log levels of `proxy_log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Critical,
}

impl LogLevel {
    pub(crate) fn from_raw(v: u32) -> Option<LogLevel> {
        Some(match v {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            5 => LogLevel::Critical,
            _ => return None,
        })
    }

    pub(crate) fn raw(self) -> u32 {
        self as u32
    }
}

/// Which header map a call names (`proxy_wasm::types::MapType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapType {
    RequestHeaders,
    RequestTrailers,
    ResponseHeaders,
    ResponseTrailers,
    GrpcInitialMetadata,
    GrpcTrailingMetadata,
    HttpCallResponseHeaders,
    HttpCallResponseTrailers,
}

impl MapType {
    pub(crate) fn from_raw(v: u32) -> Option<MapType> {
        Some(match v {
            0 => MapType::RequestHeaders,
            1 => MapType::RequestTrailers,
            2 => MapType::ResponseHeaders,
            3 => MapType::ResponseTrailers,
            4 => MapType::GrpcInitialMetadata,
            5 => MapType::GrpcTrailingMetadata,
            6 => MapType::HttpCallResponseHeaders,
            7 => MapType::HttpCallResponseTrailers,
            _ => return None,
        })
    }
}

/// Which buffer a call names (`proxy_wasm::types::BufferType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferType {
    RequestBody,
    ResponseBody,
    DownstreamData,
    UpstreamData,
    HttpCallResponseBody,
    GrpcReceiveBuffer,
    VmConfiguration,
    PluginConfiguration,
    CallData,
}

impl BufferType {
    pub(crate) fn from_raw(v: u32) -> Option<BufferType> {
        Some(match v {
            0 => BufferType::RequestBody,
            1 => BufferType::ResponseBody,
            2 => BufferType::DownstreamData,
            3 => BufferType::UpstreamData,
            4 => BufferType::HttpCallResponseBody,
            5 => BufferType::GrpcReceiveBuffer,
            6 => BufferType::VmConfiguration,
            7 => BufferType::PluginConfiguration,
            8 => BufferType::CallData,
            _ => return None,
        })
    }
}

/// Which stream `proxy_continue_stream` / `proxy_close_stream` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamType {
    Request,
    Response,
    Downstream,
    Upstream,
}

impl StreamType {
    pub(crate) fn from_raw(v: u32) -> Option<StreamType> {
        Some(match v {
            0 => StreamType::Request,
            1 => StreamType::Response,
            2 => StreamType::Downstream,
            3 => StreamType::Upstream,
            _ => return None,
        })
    }
}

/// Metric kinds of `proxy_define_metric`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

impl MetricType {
    pub(crate) fn from_raw(v: u32) -> Option<MetricType> {
        Some(match v {
            0 => MetricType::Counter,
            1 => MetricType::Gauge,
            2 => MetricType::Histogram,
            _ => return None,
        })
    }
}

/// A header list as the host keeps it: names lower-cased (like Envoy), order kept.
pub type Pairs = Vec<(String, Vec<u8>)>;

/// Headers, body and trailers of an http-call answer.
pub type Pairs3 = (Pairs, Vec<u8>, Pairs);

/// Serialises pairs the way the SDK's `deserialize_map` reads them:
/// `count u32 | (name_len u32, value_len u32) * count | (name \0 value \0) * count`.
pub fn encode_pairs(pairs: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut size = 4;
    for (k, v) in pairs {
        size += 8 + k.len() + v.len() + 2;
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&len32(pairs.len()).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&len32(k.len()).to_le_bytes());
        out.extend_from_slice(&len32(v.len()).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Why serialised pairs from the module could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed header map at byte {at}: {what}")]
pub struct PairsError {
    pub at: usize,
    pub what: &'static str,
}

/// Reads pairs serialised by the SDK's `serialize_map` (the layout of [`encode_pairs`]).
pub fn decode_pairs(bytes: &[u8]) -> Result<Pairs, PairsError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let u32_at = |at: usize| -> Result<usize, PairsError> {
        let b = bytes.get(at..at + 4).ok_or(PairsError {
            at,
            what: "truncated length",
        })?;
        let mut a = [0u8; 4];
        a.copy_from_slice(b);
        Ok(u32::from_le_bytes(a) as usize)
    };
    let count = u32_at(0)?;
    if count > bytes.len() / 8 {
        return Err(PairsError {
            at: 0,
            what: "count larger than the data",
        });
    }
    let mut lens = Vec::with_capacity(count);
    for i in 0..count {
        lens.push((u32_at(4 + i * 8)?, u32_at(8 + i * 8)?));
    }
    let mut at = 4 + count * 8;
    let mut out = Vec::with_capacity(count);
    for (kl, vl) in lens {
        let k = bytes.get(at..at + kl).ok_or(PairsError {
            at,
            what: "truncated name",
        })?;
        at += kl;
        if bytes.get(at) != Some(&0) {
            return Err(PairsError {
                at,
                what: "name not followed by NUL",
            });
        }
        at += 1;
        let v = bytes.get(at..at + vl).ok_or(PairsError {
            at,
            what: "truncated value",
        })?;
        at += vl;
        if bytes.get(at) != Some(&0) {
            return Err(PairsError {
                at,
                what: "value not followed by NUL",
            });
        }
        at += 1;
        let k = std::str::from_utf8(k).map_err(|_| PairsError {
            at,
            what: "name is not UTF-8",
        })?;
        out.push((k.to_ascii_lowercase(), v.to_vec()));
    }
    Ok(out)
}

/// A property path as the SDK sends it (`segments` joined by NUL) in the dotted form tests
/// use: `["source", "address"]` → `"source.address"`.
pub fn path_to_dotted(raw: &[u8]) -> String {
    raw.split(|b| *b == 0)
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_matches_sdk_layout() {
        let pairs = vec![
            (":path".to_string(), b"/a".to_vec()),
            ("x".to_string(), Vec::new()),
        ];
        let bytes = encode_pairs(&pairs);
        #[rustfmt::skip]
        let expected: Vec<u8> = vec![
            2, 0, 0, 0,             // two pairs
            5, 0, 0, 0, 2, 0, 0, 0, // ":path" is 5 bytes, "/a" is 2
            1, 0, 0, 0, 0, 0, 0, 0, // "x" is 1 byte, "" is 0
            b':', b'p', b'a', b't', b'h', 0, b'/', b'a', 0,
            b'x', 0, 0,
        ];
        assert_eq!(bytes, expected);
        assert_eq!(decode_pairs(&bytes), Ok(pairs));
    }

    #[test]
    fn malformed_pairs_are_errors_not_panics() {
        let good = encode_pairs(&[("abc".to_string(), b"defg".to_vec())]);
        for cut in 0..good.len() {
            assert!(
                decode_pairs(&good[..cut]).is_err() || cut == 0,
                "cut at {cut}"
            );
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut junk = good.clone();
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let i = (seed as usize) % junk.len();
            junk[i] = (seed >> 32) as u8;
            let _ = decode_pairs(&junk);
        }
    }

    #[test]
    fn dotted_paths() {
        assert_eq!(path_to_dotted(b"source\0address"), "source.address");
        assert_eq!(path_to_dotted(b"plugin_name"), "plugin_name");
    }
}
