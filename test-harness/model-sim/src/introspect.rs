//! What routers read from engines besides inference, in the engines' own shapes: vLLM's render
//! and tokenize endpoints (vllm-router's `cache_aware` tokenises every request through them),
//! vLLM's `/load` and `/version`, SGLang's `/get_load`, `/server_info` and `/model_info`
//! (sglang-router reads them). The token ids are the ones the pod's own engine hashes into its
//! prefix cache for the same request, so a radix tree over them sees the engine's sharing.
//!
//! Pure functions from a request body (and the pod's configuration) to a status and a JSON
//! body; `server.rs` routes to them.

use hyper::StatusCode;
use serde_json::{json, Map, Value};

use crate::engine::SubmitError;
use crate::metrics::Flavor;
use crate::openai::error_body;
use crate::prompt::{self, Api};
use crate::server::PodConfig;

/// The vLLM release whose response shapes these follow (`GET /version`).
pub const VLLM_VERSION: &str = "0.32.0";
/// The SGLang release whose response shapes these follow (`version` in `/server_info`).
pub const SGLANG_VERSION: &str = "0.5.6";

/// A status and a JSON body.
pub type Answer = (StatusCode, String);

fn bad_request(msg: &str) -> Answer {
    (
        StatusCode::BAD_REQUEST,
        error_body(400, "BadRequestError", msg),
    )
}

fn object(body: &[u8]) -> Result<Map<String, Value>, Answer> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(bad_request("request body must be a JSON object")),
        Err(e) => Err(bad_request(&format!("request body is not valid JSON: {e}"))),
    }
}

/// `max_tokens` as the engine will use it: the request's, else the pod's default.
fn max_tokens(o: &Map<String, Value>, cfg: &PodConfig) -> u32 {
    ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| o.get(*k).and_then(Value::as_u64))
        .map_or(cfg.default_max_tokens, |n| {
            n.min(u64::from(u32::MAX)) as u32
        })
}

/// vLLM's 400 when prompt + output exceed the context window (`None` when it fits).
fn too_long(prompt: usize, max_tokens: u32, max_model_len: u32) -> Option<Answer> {
    let requested = prompt as u64 + u64::from(max_tokens);
    (requested > u64::from(max_model_len)).then(|| {
        let e = SubmitError::TooLong {
            max: max_model_len,
            requested,
            prompt: prompt.min(u32::MAX as usize) as u32,
            output: max_tokens,
        };
        bad_request(&e.to_string())
    })
}

/// The `sampling_params` of a rendered request (vLLM's `SamplingParams` fields routers and
/// engines act on, with the request's values where it gives them).
fn sampling_params(o: &Map<String, Value>, max_tokens: u32) -> Value {
    let num = |k: &str, d: f64| o.get(k).and_then(Value::as_f64).unwrap_or(d);
    let stop = match o.get("stop") {
        Some(Value::String(s)) => json!([s]),
        Some(a @ Value::Array(_)) => a.clone(),
        _ => json!([]),
    };
    json!({
        "n": o.get("n").and_then(Value::as_u64).unwrap_or(1),
        "presence_penalty": num("presence_penalty", 0.0),
        "frequency_penalty": num("frequency_penalty", 0.0),
        "repetition_penalty": num("repetition_penalty", 1.0),
        "temperature": num("temperature", 1.0),
        "top_p": num("top_p", 1.0),
        "top_k": o.get("top_k").and_then(Value::as_i64).unwrap_or(0),
        "min_p": num("min_p", 0.0),
        "seed": o.get("seed").cloned().unwrap_or(Value::Null),
        "stop": stop,
        "stop_token_ids": o.get("stop_token_ids").cloned().unwrap_or_else(|| json!([])),
        "ignore_eos": o.get("ignore_eos").and_then(Value::as_bool).unwrap_or(false),
        "max_tokens": max_tokens,
        "min_tokens": o.get("min_tokens").and_then(Value::as_u64).unwrap_or(0),
        "logprobs": o.get("logprobs").cloned().unwrap_or(Value::Null),
        "prompt_logprobs": o.get("prompt_logprobs").cloned().unwrap_or(Value::Null),
        "skip_special_tokens": o.get("skip_special_tokens").and_then(Value::as_bool).unwrap_or(true),
        "spaces_between_special_tokens": true,
    })
}

/// One vLLM `GenerateRequest` (the render endpoints' answer) for `token_ids`.
fn generate_request(
    request_id: String,
    token_ids: &[u32],
    o: &Map<String, Value>,
    max_tokens: u32,
) -> Value {
    let stream = o.get("stream").and_then(Value::as_bool).unwrap_or(false);
    json!({
        "request_id": request_id,
        "token_ids": token_ids,
        "features": null,
        "sampling_params": sampling_params(o, max_tokens),
        "model": o.get("model").cloned().unwrap_or(Value::Null),
        "stream": stream,
        "stream_options": if stream { o.get("stream_options").cloned().unwrap_or(Value::Null) } else { Value::Null },
        "cache_salt": o.get("cache_salt").cloned().unwrap_or(Value::Null),
        "priority": o.get("priority").and_then(Value::as_i64).unwrap_or(0),
        "kv_transfer_params": null,
    })
}

/// `POST /v1/chat/completions/render`: the `GenerateRequest` vLLM would run for this chat
/// request. The model must have been checked by the caller; `id` makes the request id.
pub fn render_chat(cfg: &PodConfig, body: &[u8], id: u64) -> Answer {
    let o = match object(body) {
        Ok(o) => o,
        Err(a) => return a,
    };
    let parsed = match prompt::parse(Api::Chat, body) {
        Ok(p) => p,
        Err(e) => return bad_request(&e.to_string()),
    };
    let max = max_tokens(&o, cfg);
    if let Some(a) = too_long(parsed.tokens.len(), max, cfg.profile.max_model_len) {
        return a;
    }
    let rid = format!("chatcmpl-{:016x}{id:016x}", u64::from(cfg.port));
    let v = generate_request(rid, &parsed.tokens, &o, max);
    (StatusCode::OK, v.to_string())
}

/// `POST /v1/completions/render`: a list of `GenerateRequest`s, one per prompt.
pub fn render_completion(cfg: &PodConfig, body: &[u8], id: u64) -> Answer {
    let o = match object(body) {
        Ok(o) => o,
        Err(a) => return a,
    };
    let prompts = match prompt::completion_prompts(body) {
        Ok(p) => p,
        Err(e) => return bad_request(&e.to_string()),
    };
    let max = max_tokens(&o, cfg);
    let mut out = Vec::with_capacity(prompts.len());
    for (i, tokens) in prompts.iter().enumerate() {
        if let Some(a) = too_long(tokens.len(), max, cfg.profile.max_model_len) {
            return a;
        }
        let rid = format!("cmpl-{:016x}{id:012x}{i:04x}", u64::from(cfg.port));
        out.push(generate_request(rid, tokens, &o, max));
    }
    (StatusCode::OK, Value::Array(out).to_string())
}

/// `POST /tokenize` (vLLM's `TokenizeResponse`; `token_strs` is always null here).
pub fn tokenize(cfg: &PodConfig, body: &[u8]) -> Answer {
    if let Err(a) = object(body) {
        return a;
    }
    match prompt::tokenize_body(body) {
        Ok(tokens) => {
            let mut v = json!({
                "count": tokens.len(),
                "max_model_len": cfg.profile.max_model_len,
                "tokens": tokens,
            });
            if cfg.flavor == Flavor::Vllm {
                v["token_strs"] = Value::Null;
            }
            (StatusCode::OK, v.to_string())
        }
        Err(e) => bad_request(&e.to_string()),
    }
}

/// The load a pod reports to routers: the engine's, or what its metrics overrides (or a lying
/// pod's zeros) say, as in `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Load {
    /// Requests in the running batch.
    pub running: u64,
    /// Requests in the waiting queue.
    pub waiting: u64,
    /// Tokens held in the KV cache by live requests.
    pub kv_tokens: u64,
    /// Prompt tokens of the waiting requests.
    pub waiting_tokens: u64,
}

/// SGLang's `GET /get_load`: one entry per data-parallel rank (one here); `num_tokens` is the
/// KV cache in use plus the waiting requests' prompts, as SGLang's scheduler counts it.
pub fn sglang_get_load(l: &Load) -> String {
    json!([{
        "dp_rank": 0,
        "num_reqs": l.running + l.waiting,
        "num_waiting_reqs": l.waiting,
        "num_tokens": l.kv_tokens + l.waiting_tokens,
    }])
    .to_string()
}

/// vLLM's `GET /load`: the requests the server is working on (vLLM counts them with
/// `--enable-server-load-tracking`).
pub fn vllm_load(l: &Load) -> String {
    json!({"server_load": l.running + l.waiting}).to_string()
}

/// vLLM's `GET /version`.
pub fn vllm_version() -> String {
    json!({"version": VLLM_VERSION}).to_string()
}

/// SGLang's `GET /server_info` (= `/get_server_info`): the server arguments and scheduler
/// facts sglang-router reads. No `model_path` or `tokenizer_path`: given one, sglang-router
/// tries to download that tokenizer.
pub fn sglang_server_info(cfg: &PodConfig, l: &Load) -> String {
    let p = &cfg.profile;
    let total = u64::from(p.num_gpu_blocks) * u64::from(p.block_size);
    json!({
        "served_model_name": cfg.model,
        "is_generation": true,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "tp_size": 1,
        "dp_size": 1,
        "load_balance_method": "round_robin",
        "disaggregation_mode": "null",
        "page_size": p.block_size,
        "context_length": p.max_model_len,
        "chunked_prefill_size": p.max_num_batched_tokens,
        "max_prefill_tokens": p.max_num_batched_tokens,
        "max_running_requests": p.max_num_seqs,
        "max_total_num_tokens": total,
        "max_req_input_len": p.max_model_len.saturating_sub(1),
        "enable_lora": cfg.max_loras > 0,
        "max_loras_per_batch": cfg.max_loras,
        "internal_states": [{
            "num_running_reqs": l.running,
            "num_waiting_reqs": l.waiting,
            "token_usage": if total == 0 { 0.0 } else { l.kv_tokens as f64 / total as f64 },
        }],
        "version": SGLANG_VERSION,
    })
    .to_string()
}

/// SGLang's `GET /model_info` (= `/get_model_info`), without `model_path`/`tokenizer_path`.
pub fn sglang_model_info(cfg: &PodConfig) -> String {
    json!({
        "served_model_name": cfg.model,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "max_context_length": cfg.profile.max_model_len,
        "max_req_input_len": cfg.profile.max_model_len.saturating_sub(1),
        "vocab_size": prompt::VOCAB_SIZE,
        "supports_vision": false,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": prompt::BOS_ID,
        "eos_token_ids": [prompt::EOT_ID],
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    #[test]
    fn render_ids_are_the_engines_ids() {
        let cfg = PodConfig::new(0, Profile::h100());
        let body = br#"{"model": "m", "messages": [{"role": "user", "content": "hello there"}]}"#;
        let (st, b) = render_chat(&cfg, body, 1);
        assert_eq!(st, StatusCode::OK);
        let v: Value = serde_json::from_str(&b).unwrap_or(Value::Null);
        let ids: Vec<u32> = serde_json::from_value(v["token_ids"].clone()).unwrap_or_default();
        let engine = prompt::parse(Api::Chat, body).map(|p| p.tokens);
        assert_eq!(Ok(ids), engine);
        assert_eq!(v["sampling_params"]["max_tokens"], 128);
        let long = format!(
            r#"{{"messages": [{{"role": "user", "content": "x"}}], "max_tokens": {}}}"#,
            200_000
        );
        assert_eq!(
            render_chat(&cfg, long.as_bytes(), 2).0,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(render_chat(&cfg, b"[1]", 3).0, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn get_load_counts_kv_and_queue() {
        let l = Load {
            running: 2,
            waiting: 3,
            kv_tokens: 100,
            waiting_tokens: 40,
        };
        let v: Value = serde_json::from_str(&sglang_get_load(&l)).unwrap_or(Value::Null);
        assert_eq!(
            v,
            json!([{"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 3, "num_tokens": 140}])
        );
        assert_eq!(vllm_load(&l), r#"{"server_load":5}"#);
    }
}
