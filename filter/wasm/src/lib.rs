//! The proxy-wasm HTTP filter Envoy loads.
