//! From an OpenAI request body to what the engine needs: prompt tokens (≈ 4 characters each),
//! chained prefix-block hashes, output length, adapter and streaming options.
//!
//! Parsing is tolerant (unknown fields are ignored) but never panics on any input.

use std::hash::{Hash, Hasher};

use serde_json::Value;

/// Characters per emulated token.
pub const CHARS_PER_TOKEN: usize = 4;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// A parsed inference request.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// `model` field (may be empty when absent).
    pub model: String,
    /// Prompt text as the emulator counts it.
    pub text: String,
    /// `max_completion_tokens` / `max_tokens`, if given.
    pub max_tokens: Option<u32>,
    /// `ignore_eos`.
    pub ignore_eos: bool,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
}

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    /// Not JSON.
    #[error("request body is not valid JSON: {0}")]
    Json(String),
    /// JSON but not an object.
    #[error("request body must be a JSON object")]
    NotObject,
    /// Chat request without `messages` array.
    #[error("field `messages` is required and must be an array")]
    NoMessages,
    /// Completions request without `prompt`.
    #[error("field `prompt` is required")]
    NoPrompt,
    /// `max_tokens` not a non-negative integer.
    #[error("field `{field}` must be a non-negative integer")]
    BadMaxTokens {
        /// Field name.
        field: &'static str,
    },
}

fn content_text(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => out.push_str(s),
        Value::Array(parts) => {
            for p in parts {
                match p {
                    Value::String(s) => out.push_str(s),
                    Value::Object(o) => {
                        if let Some(Value::String(t)) = o.get("text") {
                            out.push_str(t);
                        }
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// Parses a request body for `api`.
pub fn parse(api: Api, body: &[u8]) -> Result<Parsed, ParseError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ParseError::Json(e.to_string()))?;
    let o = v.as_object().ok_or(ParseError::NotObject)?;
    let model = o
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut text = String::new();
    match api {
        Api::Chat => {
            let msgs = o
                .get("messages")
                .and_then(Value::as_array)
                .ok_or(ParseError::NoMessages)?;
            for m in msgs {
                if let Some(role) = m.get("role").and_then(Value::as_str) {
                    text.push_str(role);
                }
                if let Some(c) = m.get("content") {
                    content_text(c, &mut text);
                }
            }
        }
        Api::Completions => {
            let p = o.get("prompt").ok_or(ParseError::NoPrompt)?;
            match p {
                Value::String(s) => text.push_str(s),
                Value::Array(items) => {
                    for it in items {
                        match it {
                            Value::String(s) => text.push_str(s),
                            // Token ids: count each as one token's worth of characters.
                            Value::Number(_) => text.push_str("tokn"),
                            Value::Array(ids) => {
                                for _ in ids {
                                    text.push_str("tokn");
                                }
                            }
                            _ => {}
                        }
                    }
                }
                _ => return Err(ParseError::NoPrompt),
            }
        }
    }
    let mut max_tokens = None;
    for field in ["max_completion_tokens", "max_tokens"] {
        match o.get(field) {
            None | Some(Value::Null) => {}
            Some(v) => {
                let n = v.as_u64().ok_or(ParseError::BadMaxTokens { field })?;
                max_tokens = Some(n.min(u64::from(u32::MAX)) as u32);
                break;
            }
        }
    }
    let ignore_eos = o
        .get("ignore_eos")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let stream = o.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = o
        .get("stream_options")
        .and_then(|s| s.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(Parsed {
        model,
        text,
        max_tokens,
        ignore_eos,
        stream,
        include_usage,
    })
}

/// Tokens of `text`: ⌈chars / 4⌉, at least 1.
pub fn count_tokens(text: &str) -> u32 {
    let chars = text.chars().count();
    (chars.div_ceil(CHARS_PER_TOKEN).max(1)).min(u32::MAX as usize) as u32
}

/// Chained hashes of the full `block_size`-token blocks of `text` (4 characters per token),
/// seeded with the adapter name like vLLM's extra keys. Block `i`'s hash covers blocks `0..=i`.
pub fn block_hashes(text: &str, block_size: u32, adapter: Option<&str>) -> Vec<u64> {
    let block_chars = (block_size as usize).max(1) * CHARS_PER_TOKEN;
    let bytes: Vec<char> = text.chars().collect();
    let full = bytes.len() / block_chars;
    let mut out = Vec::with_capacity(full);
    let mut prev: u64 = {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        adapter.unwrap_or("").hash(&mut h);
        h.finish()
    };
    for b in 0..full {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        prev.hash(&mut h);
        bytes[b * block_chars..(b + 1) * block_chars].hash(&mut h);
        prev = h.finish();
        out.push(prev);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_text_and_options() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"abcd"},{"role":"user","content":[{"type":"text","text":"efgh"}]}],"max_completion_tokens":7,"stream":true,"stream_options":{"include_usage":true}}"#;
        let p = parse(Api::Chat, body).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.text, "systemabcduserefgh");
        assert_eq!(p.max_tokens, Some(7));
        assert!(p.stream && p.include_usage && !p.ignore_eos);
        assert_eq!(count_tokens(&p.text), 5);
    }

    #[test]
    fn completions_and_errors() {
        let p = parse(
            Api::Completions,
            br#"{"prompt":["ab",[1,2,3]],"max_tokens":null}"#,
        );
        assert_eq!(
            p.map(|p| (p.text, p.max_tokens)),
            Ok(("abtokntokntokn".into(), None))
        );
        assert!(matches!(parse(Api::Chat, b"{"), Err(ParseError::Json(_))));
        assert_eq!(parse(Api::Chat, b"[]"), Err(ParseError::NotObject));
        assert_eq!(parse(Api::Chat, b"{}"), Err(ParseError::NoMessages));
        assert_eq!(
            parse(Api::Completions, b"{\"prompt\":1}"),
            Err(ParseError::NoPrompt)
        );
        assert!(matches!(
            parse(Api::Completions, br#"{"prompt":"x","max_tokens":-1}"#),
            Err(ParseError::BadMaxTokens { .. })
        ));
    }

    #[test]
    fn hashes_chain_and_depend_on_adapter() {
        let a = "x".repeat(64 * 3 + 10);
        let mut b = a.clone();
        b.replace_range(70..71, "y");
        let ha = block_hashes(&a, 16, None);
        let hb = block_hashes(&b, 16, None);
        assert_eq!(ha.len(), 3);
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        assert_ne!(ha[2], hb[2]);
        assert_ne!(block_hashes(&a, 16, Some("lora"))[0], ha[0]);
    }

    #[test]
    fn seeded_random_bodies_never_panic() {
        // Fuzz: random bytes and random JSON-ish mutations of a valid body.
        let base = br#"{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":5,"stream":true}"#;
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for i in 0..5000 {
            let mut body = base.to_vec();
            let edits = (next() % 6) as usize;
            for _ in 0..edits {
                let pos = (next() as usize) % body.len().max(1);
                match next() % 3 {
                    0 => body[pos] = (next() & 0xff) as u8,
                    1 => {
                        body.remove(pos);
                    }
                    _ => body.insert(pos, b"{}[]\":,0-e"[(next() % 10) as usize]),
                }
                if body.is_empty() {
                    body.push(b'{');
                }
            }
            let api = if i % 2 == 0 {
                Api::Chat
            } else {
                Api::Completions
            };
            if let Ok(p) = parse(api, &body) {
                let _ = block_hashes(&p.text, 16, Some(&p.model));
                assert!(count_tokens(&p.text) >= 1);
            }
        }
    }
}
