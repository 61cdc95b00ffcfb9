//! What the peer routers read from engines besides inference, in the engines' shapes (real pods
//! in-process on loopback): vLLM's render and tokenize endpoints (ids = the engine's own ids,
//! so prefixes shared in text are shared in ids and in the prefix cache), vLLM's `/load` and
//! `/version`, SGLang's `/get_load` (moving with the load), `/server_info` and `/model_info`,
//! each engine's 404 for the other's endpoints, and vLLM's 404 for a model the pod does not
//! serve (adapters it can load still accepted).

use std::time::{Duration, Instant};

use model_sim::metrics::Flavor;
use model_sim::profile::Profile;
use model_sim::prompt::{parse, Api};
use model_sim::server::{spawn_pod, PodConfig, PodHandle};
use serde_json::{json, Value};

mod common;
use common::{http, Resp};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

async fn pod(f: impl FnOnce(&mut PodConfig)) -> PodHandle {
    let mut cfg = PodConfig::new(0, Profile::h100());
    cfg.speedup = 10.0;
    f(&mut cfg);
    spawn_pod(cfg).await.unwrap_or_else(|e| panic!("{e}"))
}

async fn call(p: &PodHandle, method: &str, path: &str, body: Option<&Value>) -> Resp {
    let b = body.map(Value::to_string);
    http(p.addr(), method, path, b.as_deref())
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array of ids: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("not an id: {x}")))
        .collect()
}

fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn chat_body(system: &str, user: &str) -> Value {
    json!({"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user}]})
}

const SYSTEM: &str = "You are the operations assistant of a large retailer. Answer briefly, \
    cite the runbook section you used, and never invent figures that are not in the context.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_render_and_tokenize_give_the_engines_ids() {
    let p = pod(|_| {}).await;
    let a = chat_body(
        SYSTEM,
        "Which warehouse shipped order 1234 and when did it leave?",
    );
    let b = chat_body(
        SYSTEM,
        "Summarise yesterday's incidents for the night shift.",
    );

    let r = call(&p, "POST", "/v1/chat/completions/render", Some(&a)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    // vLLM's GenerateRequest.
    assert!(
        v["request_id"]
            .as_str()
            .is_some_and(|s| s.starts_with("chatcmpl-")),
        "{v}"
    );
    assert!(
        v["features"].is_null() && v["kv_transfer_params"].is_null(),
        "{v}"
    );
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["stream"], false);
    assert_eq!(v["priority"], 0);
    assert_eq!(v["sampling_params"]["max_tokens"], 4);
    assert!(v["sampling_params"]["temperature"].is_f64(), "{v}");
    let render_a = ids(&v["token_ids"]);
    let engine_a: Vec<u64> = parse(Api::Chat, a.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("{e}"))
        .tokens
        .into_iter()
        .map(u64::from)
        .collect();
    assert_eq!(render_a, engine_a, "render gives the ids the engine hashes");

    // /tokenize with the same messages: vLLM's TokenizeResponse, the same ids.
    let r = call(&p, "POST", "/tokenize", Some(&a)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let t = r.json();
    assert_eq!(ids(&t["tokens"]), render_a);
    assert_eq!(t["count"], render_a.len());
    assert_eq!(t["max_model_len"], 131_072);
    assert!(t["token_strs"].is_null(), "{t}");
    // Without the generation prompt: the same ids minus the assistant header.
    let mut a_open = a.clone();
    a_open["add_generation_prompt"] = json!(false);
    let open = ids(&call(&p, "POST", "/tokenize", Some(&a_open)).await.json()["tokens"]);
    assert!(open.len() < render_a.len() && render_a.starts_with(&open));

    // A second conversation with the same system prompt shares exactly the template and the
    // system message, then diverges.
    let render_b = ids(&call(&p, "POST", "/v1/chat/completions/render", Some(&b))
        .await
        .json()["token_ids"]);
    let shared = common_prefix(&render_a, &render_b);
    let system_only = ids(&call(
        &p,
        "POST",
        "/tokenize",
        Some(&json!({"messages": [{"role": "system", "content": SYSTEM}], "add_generation_prompt": false})),
    )
    .await
    .json()["tokens"]);
    assert!(
        shared >= system_only.len(),
        "{shared} < {}",
        system_only.len()
    );
    assert!(shared < render_a.len().min(render_b.len()));

    // The engine sees the same sharing: after `a`, `b` hits the shared whole 16-token blocks.
    let r = call(&p, "POST", "/v1/chat/completions", Some(&a)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = call(&p, "POST", "/v1/chat/completions", Some(&b)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let u = &r.json()["usage"];
    assert_eq!(u["prompt_tokens"], render_b.len());
    assert_eq!(
        u["prompt_tokens_details"]["cached_tokens"],
        shared / 16 * 16
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_render_and_tokenize_give_the_engines_ids() {
    let p = pod(|_| {}).await;
    let one = json!({"model": MODEL, "prompt": "The quarterly report shows", "max_tokens": 9});
    let r = call(&p, "POST", "/v1/completions/render", Some(&one)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let list = v.as_array().unwrap_or_else(|| panic!("a list: {v}"));
    assert_eq!(list.len(), 1);
    assert!(list[0]["request_id"]
        .as_str()
        .is_some_and(|s| s.starts_with("cmpl-")));
    assert_eq!(list[0]["sampling_params"]["max_tokens"], 9);
    let rendered = ids(&list[0]["token_ids"]);
    let engine: Vec<u64> = parse(Api::Completions, one.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("{e}"))
        .tokens
        .into_iter()
        .map(u64::from)
        .collect();
    assert_eq!(rendered, engine);
    let t = call(
        &p,
        "POST",
        "/tokenize",
        Some(&json!({"model": MODEL, "prompt": "The quarterly report shows"})),
    )
    .await
    .json();
    assert_eq!(
        ids(&t["tokens"]),
        rendered,
        "BOS included by default, as vLLM"
    );
    let bare = call(
        &p,
        "POST",
        "/tokenize",
        Some(&json!({"prompt": "The quarterly report shows", "add_special_tokens": false})),
    )
    .await
    .json();
    assert_eq!(ids(&bare["tokens"]), rendered[1..].to_vec());
    // A text prefix is an id prefix.
    let longer = call(
        &p,
        "POST",
        "/tokenize",
        Some(&json!({"prompt": "The quarterly report shows a loss in the east"})),
    )
    .await
    .json();
    assert!(ids(&longer["tokens"]).starts_with(&rendered));
    // A batch: one GenerateRequest per prompt.
    let batch = json!({"model": MODEL, "prompt": ["first prompt", "second prompt here"]});
    let v = call(&p, "POST", "/v1/completions/render", Some(&batch))
        .await
        .json();
    let list = v.as_array().unwrap_or_else(|| panic!("a list: {v}"));
    assert_eq!(list.len(), 2);
    assert_ne!(list[0]["request_id"], list[1]["request_id"]);
    // Errors: not JSON, an unknown model.
    let r = http(p.addr(), "POST", "/v1/completions/render", Some("{oops"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 400);
    let r = call(
        &p,
        "POST",
        "/tokenize",
        Some(&json!({"model": "gpt-9", "prompt": "x"})),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    let r = call(
        &p,
        "POST",
        "/v1/chat/completions/render",
        Some(&json!({"model": "gpt-9", "messages": []})),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "model");
}

/// Polls `path` until `done` holds for its JSON (bounded), returning the last answer.
async fn poll_until(p: &PodHandle, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = call(p, "GET", path, None).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        let v = r.json();
        if done(&v) || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts `n` long requests on `p` in the background.
fn busy(p: &PodHandle, n: usize) -> Vec<tokio::task::JoinHandle<u16>> {
    (0..n)
        .map(|i| {
            let addr = p.addr();
            tokio::spawn(async move {
                let b = json!({"model": MODEL, "max_tokens": 300, "ignore_eos": true,
                    "messages": [{"role": "user", "content": format!("long answer {i} please")}]});
                http(addr, "POST", "/v1/chat/completions", Some(&b.to_string()))
                    .await
                    .map_or(0, |r| r.status)
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_get_load_moves_with_the_load() {
    let p = pod(|c| {
        c.flavor = Flavor::Sglang;
        c.speedup = 1.0;
        c.profile.max_num_seqs = 1;
    })
    .await;
    let idle = call(&p, "GET", "/get_load", None).await;
    assert_eq!(idle.status, 200, "{}", idle.body);
    assert_eq!(
        idle.json(),
        json!([{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}])
    );
    let jobs = busy(&p, 3);
    // One runs (max_num_seqs 1), two wait.
    let v = poll_until(&p, "/get_load", |v| {
        v[0]["num_reqs"] == 3 && v[0]["num_waiting_reqs"] == 2
    })
    .await;
    assert_eq!(v[0]["num_reqs"], 3, "{v}");
    assert_eq!(v[0]["num_waiting_reqs"], 2, "{v}");
    assert!(v[0]["num_tokens"].as_u64().is_some_and(|t| t > 0), "{v}");
    let info = call(&p, "GET", "/server_info", None).await.json();
    assert_eq!(info["internal_states"][0]["num_waiting_reqs"], 2, "{info}");
    for j in jobs {
        assert_eq!(j.await.unwrap_or(0), 200);
    }
    let v = poll_until(&p, "/get_load", |v| v[0]["num_reqs"] == 0).await;
    assert_eq!(v[0]["num_reqs"], 0, "{v}");
    // vLLM's endpoints are not SGLang's.
    for path in ["/load", "/version"] {
        let r = call(&p, "GET", path, None).await;
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(r.json(), json!({"detail": "Not Found"}));
    }
    let r = call(
        &p,
        "POST",
        "/v1/chat/completions/render",
        Some(&chat_body("s", "u")),
    )
    .await;
    assert_eq!(r.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_load_and_version_and_no_sglang_endpoints() {
    let p = pod(|c| {
        c.speedup = 1.0;
        c.profile.max_num_seqs = 1;
    })
    .await;
    assert_eq!(
        call(&p, "GET", "/load", None).await.json(),
        json!({"server_load": 0})
    );
    let v = call(&p, "GET", "/version", None).await.json();
    assert!(v["version"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    let jobs = busy(&p, 2);
    let v = poll_until(&p, "/load", |v| v["server_load"] == 2).await;
    assert_eq!(v, json!({"server_load": 2}));
    for j in jobs {
        assert_eq!(j.await.unwrap_or(0), 200);
    }
    for path in [
        "/get_load",
        "/server_info",
        "/get_server_info",
        "/model_info",
        "/get_model_info",
    ] {
        let r = call(&p, "GET", path, None).await;
        assert_eq!(r.status, 404, "{path}: {}", r.body);
        assert_eq!(r.json(), json!({"detail": "Not Found"}), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_server_and_model_info() {
    let p = pod(|c| c.flavor = Flavor::Sglang).await;
    for path in ["/server_info", "/get_server_info"] {
        let r = call(&p, "GET", path, None).await;
        assert_eq!(r.status, 200, "{path}");
        let v = r.json();
        assert_eq!(v["served_model_name"], MODEL, "{path}");
        assert_eq!(v["is_generation"], true);
        assert_eq!(v["dp_size"], 1);
        assert_eq!(v["tp_size"], 1);
        assert_eq!(v["page_size"], 16);
        assert!(v["max_running_requests"].is_u64() && v["max_total_num_tokens"].is_u64());
        assert!(v["version"].is_string() && v["internal_states"].is_array());
        // A path would make sglang-router try to download a tokenizer.
        assert!(
            v.get("model_path").is_none() && v.get("tokenizer_path").is_none(),
            "{v}"
        );
    }
    for path in ["/model_info", "/get_model_info"] {
        let v = call(&p, "GET", path, None).await.json();
        assert_eq!(v["served_model_name"], MODEL, "{path}");
        assert_eq!(v["is_generation"], true);
        assert!(v["max_context_length"].is_u64() && v["vocab_size"].is_u64());
        assert!(
            v.get("model_path").is_none() && v.get("tokenizer_path").is_none(),
            "{v}"
        );
    }
    // SGLang serves /tokenize too (without vLLM's token_strs).
    let t = call(&p, "POST", "/tokenize", Some(&json!({"prompt": "hello"})))
        .await
        .json();
    assert!(
        t["tokens"].is_array() && t.get("token_strs").is_none(),
        "{t}"
    );
}

fn not_found(name: &str) -> Value {
    json!({"error": {"message": format!("The model `{name}` does not exist."),
        "type": "NotFoundError", "param": "model", "code": 404}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_models_get_vllms_404_and_adapters_are_served() {
    let p = pod(|_| {}).await;
    let chat = |model: &str| json!({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    let r = call(
        &p,
        "POST",
        "/v1/chat/completions",
        Some(&chat("no-such-model")),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json(), not_found("no-such-model"));
    let r = call(
        &p,
        "POST",
        "/v1/completions",
        Some(&json!({"model": "gpt-9", "prompt": "x"})),
    )
    .await;
    assert_eq!((r.status, r.json()), (404, not_found("gpt-9")));
    let r = call(
        &p,
        "POST",
        "/v1/responses",
        Some(&json!({"model": "gpt-9", "input": "x"})),
    )
    .await;
    assert_eq!((r.status, r.json()), (404, not_found("gpt-9")));
    let r = call(
        &p,
        "POST",
        "/v1/embeddings",
        Some(&json!({"model": "gpt-9", "input": "x"})),
    )
    .await;
    assert_eq!((r.status, r.json()), (404, not_found("gpt-9")));
    let r = call(&p, "POST", "/v1/messages", Some(&json!({"model": "claude-17", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}))).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "not_found_error");
    // The base model, no model at all, and adapters the pod loads on demand.
    for model in [MODEL, "", "sql-lora", "adapter-07"] {
        let r = call(&p, "POST", "/v1/chat/completions", Some(&chat(model))).await;
        assert_eq!(r.status, 200, "{model:?}: {}", r.body);
    }
    let r = call(
        &p,
        "POST",
        "/v1/chat/completions",
        Some(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})),
    )
    .await;
    assert_eq!(r.status, 200);

    // A pod given its adapters serves exactly those.
    let listed = pod(|c| c.lora_modules = Some(vec!["sql-lora".into(), "finance".into()])).await;
    for (model, status) in [
        ("sql-lora", 200),
        ("finance", 200),
        ("chat-lora", 404),
        (MODEL, 200),
    ] {
        let r = call(&listed, "POST", "/v1/chat/completions", Some(&chat(model))).await;
        assert_eq!(r.status, status, "{model}: {}", r.body);
    }
    // Without LoRA, no adapter exists.
    let plain = pod(|c| c.max_loras = 0).await;
    let r = call(
        &plain,
        "POST",
        "/v1/chat/completions",
        Some(&chat("sql-lora")),
    )
    .await;
    assert_eq!((r.status, r.json()), (404, not_found("sql-lora")));
    // A metrics-only pod checks the model as well.
    let cheap = pod(|c| c.metrics_only = true).await;
    let r = call(
        &cheap,
        "POST",
        "/v1/chat/completions",
        Some(&chat("no-such-model")),
    )
    .await;
    assert_eq!(r.status, 404);
    let r = call(&cheap, "POST", "/v1/chat/completions", Some(&chat(MODEL))).await;
    assert_eq!(r.status, 200);
}
