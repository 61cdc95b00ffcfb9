//! OpenAI-shaped response bodies: completions, SSE chunks, `usage`, errors, `/v1/models`.
//!
//! Chunk shapes follow vLLM's (and `test-harness/fixtures/sse/`): a first chat chunk whose
//! delta carries the role, one chunk per token, `finish_reason` on the last token's chunk, then
//! (with `stream_options.include_usage`) a usage-only chunk with `"choices":[]`, then
//! `data: [DONE]`.

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
    /// Response id (`chatcmpl-…` / `cmpl-…`).
    pub id: String,
    /// `model` as the client asked (JSON-escaped string including quotes).
    pub model_json: String,
    /// Unix seconds.
    pub created: u64,
    /// Engine request id (seeds the synthetic text).
    pub req: u64,
}

impl RespCtx {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Chat, false) => "chat.completion",
            (Api::Completions, _) => "text_completion",
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

    /// SSE event(s) for output token `index`; the first chat token is preceded by the role chunk.
    pub fn token_events(&self, index: u32, finish: Option<&str>) -> String {
        let text = token_text(self.req, index);
        let fr = match finish {
            Some(r) => format!("\"{r}\""),
            None => "null".into(),
        };
        let head = self.head(true);
        match self.api {
            Api::Chat => {
                let mut s = String::with_capacity(512);
                if index == 1 {
                    s.push_str(&format!(
                        "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
                    ));
                }
                s.push_str(&format!(
                    "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":{fr}}}]}}\n\n"
                ));
                s
            }
            Api::Completions => format!(
                "data: {head}\"choices\":[{{\"index\":0,\"text\":\"{text}\",\"logprobs\":null,\"finish_reason\":{fr},\"stop_reason\":null}}]}}\n\n"
            ),
        }
    }

    /// The usage-only chunk sent when `include_usage` is set.
    pub fn usage_event(&self, usage: &Usage) -> String {
        format!(
            "data: {}\"choices\":[],\"usage\":{}}}\n\n",
            self.head(true),
            usage_json(usage)
        )
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
        };
        format!(
            "{}\"choices\":[{}],\"usage\":{}}}",
            self.head(false),
            choice,
            usage_json(usage)
        )
    }
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

/// vLLM-style error body.
pub fn error_body(status: u16, kind: &str, message: &str) -> String {
    json!({"object": "error", "message": message, "type": kind, "param": null, "code": status})
        .to_string()
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
        let v: Value = serde_json::from_str(c.usage_event(&u).trim().trim_start_matches("data: "))
            .unwrap_or(Value::Null);
        assert_eq!(v["usage"]["total_tokens"], 5);
        assert_eq!(v["choices"].as_array().map(Vec::len), Some(0));
        let v: Value = serde_json::from_str(&ctx(Api::Completions).full_body(&u, "length"))
            .unwrap_or(Value::Null);
        assert_eq!(v["object"], "text_completion");
        assert!(v["choices"][0]["text"].as_str().map(str::len).unwrap_or(0) > 0);
    }
}
