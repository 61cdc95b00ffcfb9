//! What a stream carries between callbacks, held by its HTTP context or by its worker: the
//! state a routed stream carries from its decision to its response and end ([`RouteState`],
//! made by [`crate::route::apply`]), and a paused stream's request while it waits for its pool
//! ([`WaitingRequest`], in [`crate::waiting`]'s queues).

use llm_router_core::request::ApiKind;
use llm_router_core::usage::Scanner;

/// What a routed stream carries from its decision to its response and end (made where the
/// decision was applied: in its own HTTP context, or in the root context for a request
/// dispatched from the waiting room, which the stream then picks up).
#[derive(Default)]
pub struct RouteState {
    /// The pod it is counted in flight on (absent in `fallback` mode: no pod was counted).
    pub in_flight: Option<InFlight>,
    /// Set for routed requests whose response should carry `usage`.
    pub usage: Option<UsageTrack>,
    /// The debug scores header for the response (`debug_scores`).
    pub scores: Option<String>,
    /// The served name a rewrite rule chose, for `served_model_header` on the response.
    pub served_model: Option<String>,
}

/// A routed request's pool and counted pod, and what its first response byte will teach.
pub struct InFlight {
    pub pool: String,
    pub pod: String,
    /// Prefill tokens still counted as pending on `pod` (0 once the first byte arrived).
    pub pending: u32,
    /// Prefill work ahead of and including this request on `pod` when it was routed.
    pub work: f64,
    /// Host time when it was routed (ns).
    pub sent_ns: u64,
    /// Whether the time to the first byte measures prefill: a streamed response or an
    /// embedding, answered by the pod that was chosen, with status 200.
    pub observe: bool,
    /// Whether the response is streamed. An unstreamed reply's first byte comes when the
    /// generation is done, just before its end: its pending tokens are released with the
    /// in-flight count at the end (one load-table update instead of two) unless its timing
    /// teaches a rate.
    pub streamed: bool,
    /// The status the serving pod answered with (0 until its response headers come): a run of
    /// server errors puts the pod behind the others.
    pub status: u16,
    /// `(pod, adapter)`: the LoRA adapter counted in flight on the pod chosen for it (where it
    /// stays counted if an Envoy retry served it elsewhere), uncounted at the end.
    pub lora: Option<(String, String)>,
}

/// Where a routed request's token usage is counted, and the reader of its response body.
pub struct UsageTrack {
    pub pool: String,
    pub model: String,
    /// Set at the response headers: a 200 with a JSON or SSE body is read.
    pub reading: bool,
    pub scanner: Scanner,
}

/// A paused stream waiting for its pool: what dispatching it needs.
pub struct WaitingRequest {
    pub kind: ApiKind,
    pub body: Vec<u8>,
    /// The body's size in the host's buffer.
    pub size: usize,
    pub content_length: bool,
    pub priority: i32,
}
