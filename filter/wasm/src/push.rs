//! The snapshot endpoints on the internal listener (`snapshot.endpoints`): the sidecar's signed
//! snapshot push, the state (`GET {state_path}`) and the tally (`GET {tally_path}`, answered or
//! held by [`crate::tally`]). An
//! instance without `snapshot.endpoints` answers 404 on those paths. What is stored and how a
//! push is checked against the stored generation is [`crate::fleet`]'s.

use crate::fleet::{self, PushOutcome};
use crate::host::{self, HeaderMap, HostStore};
use crate::http::{Endpoint, Http, Kind};
use proxy_wasm::types::{Action, LogLevel};

/// The one answer to every push refused before its signature was verified: which check
/// failed is in the proxy's log only.
const FORBIDDEN: &str = r#"{"accepted":false,"error":{"message":"forbidden","type":"invalid_request_error","param":null,"code":"forbidden"}}"#;
/// The answer on the snapshot paths of an instance without `snapshot.endpoints`.
const NOT_FOUND: &str = r#"{"error":{"message":"not found","type":"invalid_request_error","param":null,"code":"not_found"}}"#;

impl Http {
    /// The request headers of a request to `endpoint`: the state and the tally are answered
    /// now; a push's body is waited for (its signature kept).
    pub fn on_endpoint_headers(
        &mut self,
        endpoint: Endpoint,
        method: &str,
        query: &str,
        headers: &HeaderMap,
        end_of_stream: bool,
    ) -> Action {
        if !self.worker.borrow().router.config.snapshot.endpoints {
            // Not this listener's business: the endpoints live on the internal listener.
            return self.answer(404, NOT_FOUND);
        }
        match endpoint {
            Endpoint::State => {
                let json = if query.split('&').any(|q| q == "summary") {
                    fleet::state_summary_json(&HostStore, host::now_ms())
                } else {
                    fleet::state_json(&HostStore, host::now_ms())
                };
                self.answer(200, &json)
            }
            Endpoint::Tally => {
                self.tally_held = crate::tally::read(&mut self.worker.borrow_mut(), self.id, query);
                self.kind = Kind::Done;
                Action::Pause
            }
            Endpoint::Push if method != "POST" => {
                self.forbid_push(&format!("method {method}, not POST"))
            }
            Endpoint::Push if end_of_stream => self.forbid_push("empty body"),
            Endpoint::Push => {
                self.signature = headers
                    .get(llm_router_snapshot::SIGNATURE_HEADER)
                    .map(str::to_string);
                self.kind = Kind::Push;
                Action::Pause
            }
        }
    }

    /// A chunk of a push's body: refused past `snapshot.max_bytes`, read whole at its end.
    pub fn on_push_body_chunk(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let max = self.worker.borrow().router.config.snapshot.max_bytes;
        if body_size > max {
            return self.forbid_push(&format!("body over snapshot.max_bytes ({max}), not read"));
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.on_push_body(body_size)
    }

    /// The whole body of a push: its signature checked, then the snapshot stored if newer.
    pub fn on_push_body(&mut self, size: usize) -> Action {
        let Some(bytes) = host::request_body(size) else {
            return self.forbid_push("the request body could not be read");
        };
        let verified = {
            let w = self.worker.borrow();
            llm_router_snapshot::verify(
                w.router.config.snapshot.secret.as_bytes(),
                &bytes,
                self.signature.as_deref(),
            )
        };
        if let Err(e) = verified {
            return self.forbid_push(&e.to_string());
        }
        // Signed by the secret holder: from here on the answers may say what is wrong.
        let outcome = fleet::accept(&HostStore, &bytes, host::now_ms());
        self.push_answer(outcome)
    }

    /// The answer to a signed push.
    fn push_answer(&mut self, outcome: PushOutcome) -> Action {
        match outcome {
            PushOutcome::Accepted {
                generation,
                pools,
                pods,
            } => {
                self.worker.borrow().metrics.push(true);
                let body = serde_json::json!({"accepted": true, "generation": generation, "pools": pools, "pods": pods});
                self.answer(200, &body.to_string())
            }
            PushOutcome::Invalid(msg) => self.refuse_push(400, &msg, "invalid_snapshot"),
            PushOutcome::StaleGeneration {
                generation,
                current,
            } => {
                self.worker.borrow().metrics.push(false);
                let body = serde_json::json!({
                    "accepted": false, "reason": "stale generation",
                    "generation": generation, "current": current,
                });
                self.answer(409, &body.to_string())
            }
            PushOutcome::GenerationAhead { generation, limit } => self.refuse_push(
                400,
                &format!(
                    "generation {generation} is more than {} ms ahead of this proxy's clock \
                     (at most {limit}); the sidecar's generations follow its clock in ms",
                    llm_router_snapshot::MAX_GENERATION_LEAD_MS
                ),
                "generation_ahead",
            ),
            PushOutcome::StoreFailed => {
                self.refuse_push(500, "shared data write failed", "internal_error")
            }
        }
    }

    /// Refuses a push that has not proven it holds the secret: 403 `forbidden`, always the
    /// same answer; `why` goes to the proxy's log only.
    fn forbid_push(&mut self, why: &str) -> Action {
        self.worker.borrow().metrics.push(false);
        let source = host::property(&["source", "address"]).unwrap_or_default();
        self.log(
            LogLevel::Warn,
            &format!("snapshot push refused (403, from {source}): {why}"),
        );
        self.answer(403, FORBIDDEN)
    }

    /// Refuses a signed push, saying why.
    fn refuse_push(&mut self, status: u16, message: &str, code: &'static str) -> Action {
        self.worker.borrow().metrics.push(false);
        self.log(
            LogLevel::Warn,
            &format!("snapshot push refused ({status}): {message}"),
        );
        let body = serde_json::json!({
            "accepted": false,
            "error": {"message": message, "type": "invalid_request_error", "param": null, "code": code},
        });
        self.answer(status, &body.to_string())
    }
}
