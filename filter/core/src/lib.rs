//! The routing decision: snapshot + request -> ranked pods or a rejection. No proxy-wasm.
