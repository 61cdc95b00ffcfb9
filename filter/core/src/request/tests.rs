//! Body parsing against every real body in `test-harness/fixtures/bodies`, plus garbage,
//! truncation, wrong types, huge prompts and seeded random mutations.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use super::*;
use std::path::PathBuf;

/// The real request bodies kept in the repository; a missing folder fails the test by name.
fn fixtures_dir() -> PathBuf {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../test-harness/fixtures/bodies"
    ));
    assert!(
        dir.is_dir(),
        "request body fixtures missing: {} (part of the repository; is the checkout complete?)",
        dir.display()
    );
    dir
}

fn kind_for(name: &str) -> ApiKind {
    if name.starts_with("chat-completions") {
        ApiKind::ChatCompletions
    } else if name.starts_with("completions") {
        ApiKind::Completions
    } else if name.starts_with("embeddings") {
        ApiKind::Embeddings
    } else if name.starts_with("responses") {
        ApiKind::Responses
    } else if name.starts_with("messages") {
        ApiKind::Messages
    } else {
        panic!("unknown fixture kind {name}")
    }
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixtures_dir().join(name)).unwrap()
}

fn text_of(p: &ParsedRequest<'_>) -> String {
    p.pieces
        .iter()
        .map(|x| match x {
            Piece::Text(t) => t.to_string(),
            Piece::Tokens(t) => format!("{t:?}"),
        })
        .collect::<Vec<_>>()
        .join("|")
}

#[test]
fn every_fixture_body_parses_with_model_and_prompt() {
    let mut n = 0;
    for entry in std::fs::read_dir(fixtures_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".json") {
            continue;
        }
        let body = std::fs::read(&path).unwrap();
        let kind = kind_for(&name);
        let p = parse(kind, &body).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!p.model.is_empty(), "{name}");
        // The span points at the JSON string of the model.
        let span = &body[p.model_span.0..p.model_span.1];
        assert_eq!(span, format!("\"{}\"", p.model).as_bytes(), "{name}");
        assert!(p.prompt_chars() > 0, "{name}: no prompt extracted");
        n += 1;
    }
    assert!(n >= 25, "only {n} fixtures");
}

#[test]
fn chat_content_parts_and_roles_are_in_order() {
    let body = fixture("chat-completions-content-parts-system.json");
    let p = parse(ApiKind::ChatCompletions, &body).unwrap();
    assert_eq!(p.model, "gpt-4o-mini");
    assert!(!p.stream);
    let t = text_of(&p);
    let sys = t.find("You talk like a pirate.").unwrap();
    let user = t.find("Hello, assistant!").unwrap();
    assert!(t.starts_with("system|"));
    assert!(sys < user);
    // The part's "type" is not prompt text.
    assert!(!t.contains("|text|"));
}

#[test]
fn stream_flag_is_read() {
    let b = fixture("chat-completions-stream-include-usage.json");
    let p = parse(ApiKind::ChatCompletions, &b).unwrap();
    assert!(p.stream);
    let b = fixture("messages-stream.json");
    let p = parse(ApiKind::Messages, &b).unwrap();
    assert!(p.stream);
}

#[test]
fn token_prompts_and_arrays() {
    let b = fixture("embeddings-token-id-arrays.json");
    let p = parse(ApiKind::Embeddings, &b).unwrap();
    assert_eq!(
        p.pieces,
        vec![Piece::Tokens(vec![
            104, 101, 108, 108, 111, 119, 111, 114, 108, 100, 84, 69, 83, 84
        ])]
    );
    let b = fixture("completions-array-of-prompts.json");
    let p = parse(ApiKind::Completions, &b).unwrap();
    assert_eq!(text_of(&p), "Option A is better.|Option B is better.");
    let p = parse(ApiKind::Completions, br#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
    assert_eq!(p.pieces, vec![Piece::Tokens(vec![1, 2, 3])]);
}

#[test]
fn responses_and_messages_shapes() {
    let b = fixture("responses-function-call-output.json");
    let p = parse(ApiKind::Responses, &b).unwrap();
    let t = text_of(&p);
    assert!(
        t.contains("get_weather_at_location"),
        "tools are part of the prompt: {t}"
    );
    assert!(t.ends_with("22 celcius and windy"), "{t}");
    let b = fixture("responses-string-input.json");
    let p = parse(ApiKind::Responses, &b).unwrap();
    assert_eq!(p.pieces.len(), 1);
    let b = fixture("messages-system-string-llamacpp.json");
    let p = parse(ApiKind::Messages, &b).unwrap();
    let t = text_of(&p);
    let body = String::from_utf8(fixture("messages-system-string-llamacpp.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let system = v["system"].as_str().unwrap();
    assert!(t.starts_with(system), "system first: {t}");
}

#[test]
fn escaped_strings_are_unescaped_and_plain_ones_borrowed() {
    let body = br#"{"model":"m","messages":[{"role":"user","content":"caf\u00e9 \"quoted\""},{"role":"user","content":"plain"}]}"#;
    let p = parse(ApiKind::ChatCompletions, body).unwrap();
    assert_eq!(
        p.pieces[1],
        Piece::Text(Cow::Owned("café \"quoted\"".into()))
    );
    assert!(matches!(&p.pieces[3], Piece::Text(Cow::Borrowed("plain"))));
}

#[test]
fn rejections_say_what_is_wrong() {
    let cases: &[(&[u8], &str)] = &[
        (b"", "must be a JSON object"),
        (b"not json", "must be a JSON object"),
        (b"{\"model\":\"m\"", "EOF"),
        (b"[1,2]", "must be a JSON object"),
        (b"[\"m\"]", "must be a JSON object"),
        (b" \"m\"", "must be a JSON object"),
        (
            b"{\"model\":\"m\",\"stream\":\"yes\"}",
            "expected a boolean",
        ),
        (b"{\"model\":\"m\",\"messages\":{}}", "invalid type"),
        (b"{\"model\":\"m\",\"prompt\":[-1]}", "negative"),
        (
            b"{\"model\":\"m\",\"prompt\":[99999999999]}",
            "out of range",
        ),
    ];
    for (body, needle) in cases {
        match parse(ApiKind::ChatCompletions, body) {
            Err(RequestError::Malformed(m)) => assert!(
                m.contains(needle),
                "{:?}: {m}",
                String::from_utf8_lossy(body)
            ),
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(body)),
        }
    }
    assert_eq!(
        parse(ApiKind::ChatCompletions, b"{\"messages\":[]}"),
        Err(RequestError::MissingModel)
    );
    assert_eq!(
        parse(ApiKind::ChatCompletions, b"{\"model\":7}"),
        Err(RequestError::BadModel)
    );
    assert_eq!(
        parse(ApiKind::ChatCompletions, b"{\"model\":\"\"}"),
        Err(RequestError::BadModel)
    );
    assert_eq!(
        parse(ApiKind::ChatCompletions, b"{\"model\":null}"),
        Err(RequestError::MissingModel)
    );
}

#[test]
fn truncations_of_every_fixture_never_panic() {
    for name in [
        "chat-completions-tool-results.json",
        "responses-input-items-history.json",
        "messages-tools.json",
    ] {
        let body = fixture(name);
        for len in 0..body.len() {
            let _ = parse(kind_for(name), &body[..len]);
        }
    }
}

#[test]
fn a_200_kb_prompt_is_borrowed_not_copied() {
    let doc = "lorem ipsum dolor sit amet ".repeat(8000);
    let body = format!(
        r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":"{doc}"}}]}}"#
    );
    let p = parse(ApiKind::ChatCompletions, body.as_bytes()).unwrap();
    assert!(p.prompt_chars() >= 200_000);
    match &p.pieces[1] {
        Piece::Text(Cow::Borrowed(s)) => {
            let off = s.as_ptr() as usize - body.as_ptr() as usize;
            assert!(off < body.len());
        }
        other => panic!("copied: {:?}", std::mem::discriminant(other)),
    }
}

#[test]
fn paths() {
    assert_eq!(
        ApiKind::from_path("/v1/chat/completions"),
        Some(ApiKind::ChatCompletions)
    );
    assert_eq!(
        ApiKind::from_path("/v1/chat/completions?x=1"),
        Some(ApiKind::ChatCompletions)
    );
    assert_eq!(ApiKind::from_path("/v1/messages"), Some(ApiKind::Messages));
    assert_eq!(
        ApiKind::from_path("/v1/responses/"),
        Some(ApiKind::Responses)
    );
    assert_eq!(ApiKind::from_path("/v1/models"), None);
    assert_eq!(ApiKind::from_path("/metrics"), None);
}

/// Seeded random byte mutations of real bodies: parsing returns, never panics, and a parsed
/// model always comes with a span inside the body.
#[test]
fn fuzz_mutated_bodies() {
    let names: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".json"))
        .collect();
    let mut state: u64 = 0x243F_6A88_85A3_08D3;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let alphabet = b"{}[]\":,\\ 0123456789abcdeftrunl-.\x00\xff";
    for round in 0..6000 {
        let name = &names[round % names.len()];
        let mut body = fixture(name);
        for _ in 0..(1 + next() % 6) {
            let i = (next() as usize) % body.len().max(1);
            match next() % 3 {
                0 if !body.is_empty() => body[i] = alphabet[(next() as usize) % alphabet.len()],
                1 if !body.is_empty() => {
                    body.remove(i);
                }
                _ => body.insert(
                    i.min(body.len()),
                    alphabet[(next() as usize) % alphabet.len()],
                ),
            }
        }
        if let Ok(p) = parse(kind_for(name), &body) {
            assert!(
                p.model_span.1 <= body.len() && p.model_span.0 < p.model_span.1,
                "{name} round {round}"
            );
        }
    }
}

#[test]
fn include_usage_is_read_leniently() {
    let include_usage = |b: &str| {
        parse(ApiKind::ChatCompletions, b.as_bytes())
            .unwrap()
            .include_usage
    };
    let base = r#""model":"m","messages":[],"stream":true"#;
    assert!(include_usage(&format!(
        r#"{{{base},"stream_options":{{"include_usage":true}}}}"#
    )));
    assert!(!include_usage(&format!(
        r#"{{{base},"stream_options":{{"include_usage":false}}}}"#
    )));
    assert!(!include_usage(&format!("{{{base}}}")));
    // A malformed stream_options is the engine's to reject, not a reason to fail routing.
    assert!(!include_usage(&format!(
        r#"{{{base},"stream_options":"yes"}}"#
    )));
    assert!(!include_usage(&format!(
        r#"{{{base},"stream_options":{{"include_usage":1}}}}"#
    )));
}

/// Hostile bodies (issue 12), as the filter's core sees them; the Wasm-level and end-to-end
/// tests (`hostile.rs` in test-harness) check the statuses clients get for the same shapes.
#[test]
fn hostile_bodies_are_refused_with_typed_errors() {
    let nested = |depth: usize| {
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":{}"x"{}}}]}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    };
    let malformed = |body: &[u8], needle: &str| match parse(ApiKind::ChatCompletions, body) {
        Err(RequestError::Malformed(m)) => assert!(m.contains(needle), "{needle}: {m}"),
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(body)),
    };
    // Nesting: serde_json's limit (128) where the filter reads, never a stack overflow.
    assert!(parse(ApiKind::ChatCompletions, nested(100).as_bytes()).is_ok());
    malformed(nested(100_000).as_bytes(), "recursion limit");
    // Duplicate keys: the filter and the model server could read different values (most JSON
    // libraries keep the last), so a body with two `model`s or `stream`s is refused.
    malformed(br#"{"model":"a","model":"b"}"#, "duplicate field `model`");
    malformed(
        br#"{"model":"a","stream":false,"stream":true}"#,
        "duplicate field `stream`",
    );
    // Invalid UTF-8 anywhere, also in fields the filter does not read.
    malformed(b"{\"model\":\"m\xff\"}", "UTF-8");
    malformed(b"{\"model\":\"m\",\"user\":\"\xc3\x28\"}", "UTF-8");
    // Wrong types.
    malformed(br#"{"model":"m","messages":"hi"}"#, "invalid type");
    malformed(br#"{"model":"m","messages":[1]}"#, "invalid type");
    malformed(br#"{"model":"m","stream":1}"#, "expected a boolean");
    for body in [&br#"{"model":["m"]}"#[..], br#"{"model":{"name":"m"}}"#] {
        assert_eq!(
            parse(ApiKind::ChatCompletions, body),
            Err(RequestError::BadModel)
        );
    }
}

#[test]
fn a_conversation_s_history_ends_before_its_last_user_message() {
    let body = br#"{"model":"m","messages":[
        {"role":"system","content":"Be brief."},
        {"role":"user","content":"Hi"},
        {"role":"assistant","content":"Hello!"},
        {"role":"user","content":"Where is my order?"}]}"#;
    let r = parse(ApiKind::ChatCompletions, body).unwrap();
    // system, "Be brief.", user, "Hi", assistant, "Hello!" | user, "Where is my order?"
    assert_eq!(r.history_pieces, Some(6));
    let expected = ["system", "Be brief.", "user", "Hi", "assistant", "Hello!"]
        .iter()
        .map(|s| s.len() + 1)
        .sum::<usize>();
    assert_eq!(r.history_bytes(), Some(expected));
    // A first turn, or a single prompt, has no history; an assistant message after the last
    // user message (a prefill to continue) is not a history either.
    for body in [
        &br#"{"model":"m","messages":[{"role":"system","content":"x"},{"role":"user","content":"Hi"}]}"#[..],
        br#"{"model":"m","messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"He"}]}"#,
        br#"{"model":"m","prompt":"Hi"}"#,
    ] {
        let kind = if body.windows(6).any(|w| w == b"prompt") {
            ApiKind::Completions
        } else {
            ApiKind::ChatCompletions
        };
        let r = parse(kind, body).unwrap();
        assert_eq!(r.history_pieces, None, "{}", String::from_utf8_lossy(body));
        assert_eq!(r.history_bytes(), None);
    }
}

#[test]
fn an_api_path_is_routed_only_as_a_post_with_a_body() {
    use crate::request::Entry;
    let chat = ApiKind::ChatCompletions;
    assert_eq!(
        Entry::of("POST", "/v1/chat/completions", false),
        Entry::Api(chat)
    );
    assert_eq!(
        Entry::of("POST", "/v1/chat/completions?x=1", false),
        Entry::Api(chat)
    );
    // Today's pass-throughs that reached the pool's catch-all route unrouted:
    assert_eq!(
        Entry::of("GET", "/v1/chat/completions", true),
        Entry::WrongMethod {
            allow: crate::reject::Allow::Post
        }
    );
    assert_eq!(
        Entry::of("PUT", "/v1/embeddings", false),
        Entry::WrongMethod {
            allow: crate::reject::Allow::Post
        }
    );
    assert_eq!(Entry::of("POST", "/v1/messages", true), Entry::NoBody);
    // The model list is the filter's own.
    assert_eq!(Entry::of("GET", "/v1/models", true), Entry::Models);
    assert_eq!(Entry::of("GET", "/models/?a", true), Entry::Models);
    assert_eq!(
        Entry::of("POST", "/v1/models", false),
        Entry::WrongMethod {
            allow: crate::reject::Allow::Get
        }
    );
    for unknown in [
        "/metrics",
        "/V1/chat/completions",
        "//v1/chat/completions",
        "/v1//chat/completions",
        "/v1/%63hat/completions",
        "/invocations",
        "/tokenize",
        "/v1/load_lora_adapter",
        "/v1/models/x",
    ] {
        assert_eq!(
            Entry::of("POST", unknown, false),
            Entry::Unknown,
            "{unknown}"
        );
    }
}

#[test]
fn the_model_list_is_openai_shaped_sorted_and_deduplicated() {
    let j: serde_json::Value =
        serde_json::from_str(&crate::request::model_list_json(["b", "a", "b"])).unwrap();
    assert_eq!(j["object"], "list");
    let ids: Vec<&str> = j["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(j["data"][0]["object"], "model");
    assert_eq!(j["data"][0]["owned_by"], "llm-router");
}
