//! Response bodies and SSE events of the four APIs vLLM serves, plus errors and `/v1/models`.
//!
//! Chat and completions chunks follow vLLM's (and `test-harness/fixtures/sse/`): a first chat chunk
//! whose delta carries the role, one chunk per token, `finish_reason` on the last token's chunk,
//! then (with `stream_options.include_usage`) a usage-only chunk with `"choices":[]`, then
//! `data: [DONE]`. The OpenAI Responses stream uses its typed events (`response.created`,
//! `response.output_text.delta`, …, `response.completed`, each with a `sequence_number`), the
//! Anthropic Messages stream its own (`message_start`, `content_block_delta`, `message_delta`,
//! `message_stop`); both name each event on an `event:` line and end without `[DONE]`.

use serde_json::{json, Value};

use crate::engine::Usage;
use crate::prompt::Api;

const WORDS: &[&str] = &[
    " the", " model", " said", " that", " data", " will", " flow", " here", " and", " then",
    " some", " more", " text", " about", " GPUs", " runs", " fast", " when", " warm", " too",
    " each", " pod", " has", " a", " cache", " of", " keys", " plus", " values", " now", " ok",
    " yes",
];

/// The synthetic text of output token `index` (1-based) of request `id`. Plain ASCII words
/// that need no JSON escaping, about 4 characters each.
pub fn token_text(id: u64, index: u32) -> &'static str {
    let i = (id.wrapping_mul(31).wrapping_add(u64::from(index))) % WORDS.len() as u64;
    WORDS[i as usize]
}

/// Full text of `n` tokens.
pub fn full_text(id: u64, n: u32) -> String {
    (1..=n).map(|i| token_text(id, i)).collect()
}

/// Static facts of one response stream.
#[derive(Debug, Clone)]
pub struct RespCtx {
    /// Endpoint.
    pub api: Api,
    /// Response id (`chatcmpl-…`, `cmpl-…`, `resp_…`, `msg_…`).
    pub id: String,
    /// `model` as the client asked (JSON-escaped string including quotes).
    pub model_json: String,
    /// Unix seconds.
    pub created: u64,
    /// Engine request id (seeds the synthetic text).
    pub req: u64,
    /// Prompt tokens (the Anthropic stream announces them up front).
    pub prompt_tokens: u32,
}

/// One server-sent event with an `event:` line (Responses and Messages streams).
fn named_event(kind: &str, data: &Value) -> String {
    format!("event: {kind}\ndata: {data}\n\n")
}

impl RespCtx {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Chat, false) => "chat.completion",
            (Api::Completions, _) => "text_completion",
            (Api::Responses, _) => "response",
            (Api::Messages, _) => "message",
        }
    }

    fn head(&self, chunk: bool) -> String {
        format!(
            "{{\"id\":\"{}\",\"object\":\"{}\",\"created\":{},\"model\":{},",
            self.id,
            self.object(chunk),
            self.created,
            self.model_json
        )
    }

    fn model(&self) -> Value {
        serde_json::from_str(&self.model_json).unwrap_or(Value::Null)
    }

    fn item_id(&self) -> String {
        format!("msg_{}", self.id.trim_start_matches("resp_"))
    }

    /// The Responses API's message item, `text` so far.
    fn response_item(&self, text: &str, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        let content = if done {
            json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
        } else {
            json!([])
        };
        json!({"id": self.item_id(), "type": "message", "status": status, "role": "assistant",
               "content": content})
    }

    /// The Responses API's response object.
    fn response_obj(&self, finish: Option<&str>, usage: Option<&Usage>) -> Value {
        let (status, incomplete, output) = match (finish, usage) {
            (Some(f), Some(u)) => (
                if f == "length" {
                    "incomplete"
                } else {
                    "completed"
                },
                if f == "length" {
                    json!({"reason": "max_output_tokens"})
                } else {
                    Value::Null
                },
                json!([self.response_item(&full_text(self.req, u.completion_tokens), true)]),
            ),
            _ => ("in_progress", Value::Null, json!([])),
        };
        json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model(), "output": output, "incomplete_details": incomplete,
            "error": null, "instructions": null, "parallel_tool_calls": true, "tools": [],
            "usage": usage.map(responses_usage_json),
        })
    }

    /// The Anthropic message object.
    fn message_obj(&self, text: Option<&str>, stop: Option<&str>, usage: &Value) -> Value {
        let content = match text {
            Some(t) => json!([{"type": "text", "text": t}]),
            None => json!([]),
        };
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model(),
            "content": content, "stop_reason": stop, "stop_sequence": null, "usage": usage,
        })
    }

    /// SSE event(s) for output token `index` (1-based). The first token is preceded by the
    /// stream's opening events (chat: the role chunk; Responses: `response.created` …
    /// `response.content_part.added`; Messages: `message_start`, `content_block_start`, `ping`),
    /// sent, as vLLM does, when the first output arrives.
    pub fn token_events(&self, index: u32, finish: Option<&str>) -> String {
        let text = token_text(self.req, index);
        let fr = match finish {
            Some(r) => format!("\"{r}\""),
            None => "null".into(),
        };
        let head = self.head(true);
        let mut s = String::with_capacity(512);
        match self.api {
            Api::Chat => {
                if index == 1 {
                    s.push_str(&format!(
                        "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
                    ));
                }
                s.push_str(&format!(
                    "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":{fr}}}]}}\n\n"
                ));
            }
            Api::Completions => s.push_str(&format!(
                "data: {head}\"choices\":[{{\"index\":0,\"text\":\"{text}\",\"logprobs\":null,\"finish_reason\":{fr},\"stop_reason\":null}}]}}\n\n"
            )),
            Api::Responses => {
                if index == 1 {
                    let r = self.response_obj(None, None);
                    s.push_str(&named_event("response.created", &json!({"type": "response.created", "sequence_number": 0, "response": r})));
                    s.push_str(&named_event("response.in_progress", &json!({"type": "response.in_progress", "sequence_number": 1, "response": r})));
                    s.push_str(&named_event("response.output_item.added", &json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0, "item": self.response_item("", false)})));
                    s.push_str(&named_event("response.content_part.added", &json!({"type": "response.content_part.added", "sequence_number": 3, "item_id": self.item_id(), "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})));
                }
                s.push_str(&named_event("response.output_text.delta", &json!({"type": "response.output_text.delta", "sequence_number": 3 + index, "item_id": self.item_id(), "output_index": 0, "content_index": 0, "delta": text, "logprobs": []})));
            }
            Api::Messages => {
                if index == 1 {
                    let usage = json!({"input_tokens": self.prompt_tokens, "output_tokens": 0});
                    s.push_str(&named_event("message_start", &json!({"type": "message_start", "message": self.message_obj(None, None, &usage)})));
                    s.push_str(&named_event("content_block_start", &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
                    s.push_str(&named_event("ping", &json!({"type": "ping"})));
                }
                s.push_str(&named_event("content_block_delta", &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})));
            }
        }
        s
    }

    /// The events that close a stream after its last token: chat and completions the usage
    /// chunk (with `include_usage`) and `data: [DONE]`; Responses `…output_text.done` to
    /// `response.completed` (or `response.incomplete`); Messages `content_block_stop`,
    /// `message_delta` (stop reason, output tokens) and `message_stop`.
    pub fn end_events(&self, usage: &Usage, finish: &str, include_usage: bool) -> String {
        let mut s = String::new();
        match self.api {
            Api::Chat | Api::Completions => {
                if include_usage {
                    s.push_str(&format!(
                        "data: {}\"choices\":[],\"usage\":{}}}\n\n",
                        self.head(true),
                        usage_json(usage)
                    ));
                }
                s.push_str(DONE);
            }
            Api::Responses => {
                let text = full_text(self.req, usage.completion_tokens);
                let seq = 4 + usage.completion_tokens;
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                s.push_str(&named_event("response.output_text.done", &json!({"type": "response.output_text.done", "sequence_number": seq, "item_id": self.item_id(), "output_index": 0, "content_index": 0, "text": text, "logprobs": []})));
                s.push_str(&named_event("response.content_part.done", &json!({"type": "response.content_part.done", "sequence_number": seq + 1, "item_id": self.item_id(), "output_index": 0, "content_index": 0, "part": part})));
                s.push_str(&named_event("response.output_item.done", &json!({"type": "response.output_item.done", "sequence_number": seq + 2, "output_index": 0, "item": self.response_item(&text, true)})));
                let kind = if finish == "length" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                s.push_str(&named_event(kind, &json!({"type": kind, "sequence_number": seq + 3, "response": self.response_obj(Some(finish), Some(usage))})));
            }
            Api::Messages => {
                s.push_str(&named_event(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": 0}),
                ));
                s.push_str(&named_event("message_delta", &json!({"type": "message_delta", "delta": {"stop_reason": anthropic_stop(finish), "stop_sequence": null}, "usage": {"output_tokens": usage.completion_tokens}})));
                s.push_str(&named_event(
                    "message_stop",
                    &json!({"type": "message_stop"}),
                ));
            }
        }
        s
    }

    /// Non-streaming response body.
    pub fn full_body(&self, usage: &Usage, finish: &str) -> String {
        let text = full_text(self.req, usage.completion_tokens);
        let choice = match self.api {
            Api::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": null,
                "finish_reason": finish,
                "stop_reason": null
            }),
            Api::Completions => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null
            }),
            Api::Responses => return self.response_obj(Some(finish), Some(usage)).to_string(),
            Api::Messages => {
                let u = json!({"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens});
                return self
                    .message_obj(Some(&text), Some(anthropic_stop(finish)), &u)
                    .to_string();
            }
        };
        format!(
            "{}\"choices\":[{}],\"usage\":{}}}",
            self.head(false),
            choice,
            usage_json(usage)
        )
    }
}

/// Anthropic's `stop_reason` for an OpenAI finish reason.
fn anthropic_stop(finish: &str) -> &'static str {
    if finish == "length" {
        "max_tokens"
    } else {
        "end_turn"
    }
}

/// The Responses API's `usage` object.
fn responses_usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens
    })
}

/// End of an SSE stream.
pub const DONE: &str = "data: [DONE]\n\n";

/// The `usage` object.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "completion_tokens": u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens}
    })
}

/// vLLM's error body (`ErrorResponse` since vLLM 0.10: the fields nested under `error`).
pub fn error_body(status: u16, kind: &str, message: &str) -> String {
    error_body_param(status, kind, message, None)
}

/// [`error_body`] naming the request field at fault (`param`), as vLLM does for `model`.
pub fn error_body_param(status: u16, kind: &str, message: &str, param: Option<&str>) -> String {
    json!({"error": {"message": message, "type": kind, "param": param, "code": status}}).to_string()
}

/// Anthropic-style error body (`/v1/messages`).
pub fn anthropic_error_body(status: u16, message: &str) -> String {
    let kind = match status {
        404 => "not_found_error",
        429 => "rate_limit_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
}

/// `/v1/models` body: the base model plus known adapters.
pub fn models_body(base: &str, adapters: &[String], max_model_len: u32, created: u64) -> String {
    let mut data = vec![json!({
        "id": base, "object": "model", "created": created, "owned_by": "vllm",
        "root": base, "parent": null, "max_model_len": max_model_len
    })];
    for a in adapters {
        data.push(json!({
            "id": a, "object": "model", "created": created, "owned_by": "vllm",
            "root": a, "parent": base, "max_model_len": max_model_len
        }));
    }
    json!({"object": "list", "data": data}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(api: Api) -> RespCtx {
        RespCtx {
            api,
            id: "chatcmpl-1".into(),
            model_json: "\"m\\\"x\"".into(),
            created: 5,
            req: 3,
            prompt_tokens: 4,
        }
    }

    #[test]
    fn chunks_are_json() {
        let c = ctx(Api::Chat);
        let ev = c.token_events(1, None);
        let lines: Vec<&str> = ev.split("\n\n").filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 2);
        for l in &lines {
            let v: Value =
                serde_json::from_str(l.trim_start_matches("data: ")).unwrap_or(Value::Null);
            assert_eq!(v["object"], "chat.completion.chunk");
            assert_eq!(v["model"], "m\"x");
        }
        let last = c.token_events(2, Some("length"));
        let v: Value =
            serde_json::from_str(last.trim().trim_start_matches("data: ")).unwrap_or(Value::Null);
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        let u = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 0,
        };
        let end = c.end_events(&u, "length", true);
        let v: Value = serde_json::from_str(
            end.split("\n\n")
                .next()
                .unwrap_or("")
                .trim_start_matches("data: "),
        )
        .unwrap_or(Value::Null);
        assert!(end.ends_with(DONE));
        assert_eq!(v["usage"]["total_tokens"], 5);
        assert_eq!(v["choices"].as_array().map(Vec::len), Some(0));
        let v: Value = serde_json::from_str(&ctx(Api::Completions).full_body(&u, "length"))
            .unwrap_or(Value::Null);
        assert_eq!(v["object"], "text_completion");
        assert!(v["choices"][0]["text"].as_str().map(str::len).unwrap_or(0) > 0);
    }
}
