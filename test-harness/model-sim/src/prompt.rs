//! From a request body to what the engine needs: prompt token ids (a tokenizer-like splitter),
//! chained 16-token KV-block hashes, output length, adapter and streaming options, for the
//! four APIs vLLM serves: chat completions, completions, OpenAI Responses, Anthropic Messages.
//!
//! The splitter behaves like a BPE tokenizer as far as routing can tell: words, digit groups,
//! whitespace runs and punctuation are pre-split, and a word longer than six characters is
//! cut into pieces whose lengths (3-7 characters) follow from the word itself, so a token holds
//! a variable number of characters (≈ 4 on average for English-like text) and the same text
//! always gives the same ids. Chat-style requests are wrapped in a Llama-3-like chat template
//! (begin-of-text, a header per message, end-of-turn, the assistant header to generate from).
//! KV blocks hash 16 token ids each, chained, as vLLM's prefix cache does, so a router that
//! hashes fixed-size blocks of *text* sees block boundaries that drift from the engine's.
//!
//! Parsing is tolerant (unknown fields are ignored) but never panics on any input.

use serde_json::{Map, Value};

/// Mean characters per emulated token on English-like text (for sizing, not counting).
pub const CHARS_PER_TOKEN: usize = 4;

/// Size of the ordinary vocabulary; special tokens sit above it (as in Llama 3).
const VOCAB: u64 = 128_000;
const BOS: u32 = 128_000;
const START_HEADER: u32 = 128_006;
const END_HEADER: u32 = 128_007;
const EOT: u32 = 128_009;
/// Begin-of-text id (first of every prompt).
pub const BOS_ID: u32 = BOS;
/// End-of-turn id (the chat template's end of a message; the model's EOS).
pub const EOT_ID: u32 = EOT;
/// Vocabulary size, special tokens included (as Llama 3's 128,256).
pub const VOCAB_SIZE: u32 = 128_256;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
    /// `/v1/responses` (OpenAI Responses API).
    Responses,
    /// `/v1/messages` (Anthropic Messages API).
    Messages,
}

/// A parsed inference request.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// `model` field (may be empty when absent).
    pub model: String,
    /// Prompt token ids, chat template included.
    pub tokens: Vec<u32>,
    /// `max_completion_tokens` / `max_tokens` / `max_output_tokens`, if given.
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
    /// Chat or Messages request without a `messages` array.
    #[error("field `messages` is required and must be an array")]
    NoMessages,
    /// Completions request without `prompt`.
    #[error("field `prompt` is required")]
    NoPrompt,
    /// Responses request without `input`.
    #[error("field `input` is required and must be a string or an array")]
    NoInput,
    /// A token limit that is not a non-negative integer, or a required one that is missing.
    #[error("field `{field}` must be a non-negative integer")]
    BadMaxTokens {
        /// Field name.
        field: &'static str,
    },
}

/// 64-bit FNV-1a.
fn fnv(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn token_id(piece: &str) -> u32 {
    (fnv(piece.as_bytes(), 0) % VOCAB) as u32
}

/// Cuts one pre-split word into tokens: up to 6 characters (leading space included) stay
/// whole, longer ones are cut into pieces of 3-7 characters chosen by the word's own hash.
fn split_word(word: &str, base: usize, out: &mut impl FnMut(&str, usize)) {
    let chars: Vec<(usize, char)> = word.char_indices().collect();
    let mut h = mix(fnv(word.as_bytes(), 1));
    let mut i = 0;
    while i < chars.len() {
        let rest = chars.len() - i;
        let take = if rest <= 6 {
            rest
        } else {
            let n = 3 + (h % 5) as usize;
            h = mix(h);
            n.min(rest)
        };
        let start = chars.get(i).map_or(word.len(), |c| c.0);
        let end = chars.get(i + take).map_or(word.len(), |c| c.0);
        out(word.get(start..end).unwrap_or(""), base + end);
        i += take;
    }
}

/// Appends the token ids of `text` (no special tokens).
pub fn tokenize_into(text: &str, out: &mut Vec<u32>) {
    split(text, &mut |piece, _| out.push(token_id(piece)));
}

/// Byte offset in `text` where each token of [`tokenize`] ends.
pub fn token_ends(text: &str) -> Vec<usize> {
    let mut v = Vec::new();
    split(text, &mut |_, end| v.push(end));
    v
}

/// Splits `text` into tokens, calling `out(piece, end offset)` for each.
fn split(text: &str, out: &mut impl FnMut(&str, usize)) {
    let b = text.as_bytes();
    let mut i = 0;
    while i < text.len() {
        let Some(c) = text.get(i..).and_then(|s| s.chars().next()) else {
            break;
        };
        let start = i;
        // A word, with the one space before it (as GPT-style pre-tokenizers attach it).
        let word_start = if c == ' '
            && text
                .get(i + 1..)
                .and_then(|s| s.chars().next())
                .is_some_and(char::is_alphabetic)
        {
            i += 1;
            true
        } else {
            c.is_alphabetic()
        };
        if word_start {
            while let Some(ch) = text.get(i..).and_then(|s| s.chars().next()) {
                if !ch.is_alphabetic() {
                    break;
                }
                i += ch.len_utf8();
            }
            split_word(text.get(start..i).unwrap_or(""), start, out);
        } else if c.is_ascii_digit() {
            // Digit groups of at most three, like Llama 3.
            let mut n = 0;
            while n < 3 && b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
                n += 1;
            }
            out(text.get(start..i).unwrap_or(""), i);
        } else if c.is_whitespace() {
            // A whitespace run, leaving a last space to the word that follows it.
            i += c.len_utf8();
            while let Some(ch) = text.get(i..).and_then(|s| s.chars().next()) {
                let space_before_word = ch == ' '
                    && text
                        .get(i + 1..)
                        .and_then(|s| s.chars().next())
                        .is_some_and(char::is_alphabetic);
                if !ch.is_whitespace() || space_before_word {
                    break;
                }
                i += ch.len_utf8();
            }
            out(text.get(start..i).unwrap_or(""), i);
        } else {
            i += c.len_utf8();
            out(text.get(start..i).unwrap_or(""), i);
        }
    }
}

/// Token ids of `text`.
pub fn tokenize(text: &str) -> Vec<u32> {
    let mut v = Vec::with_capacity(text.len() / CHARS_PER_TOKEN + 1);
    tokenize_into(text, &mut v);
    v
}

/// Number of tokens of `text`, at least 1.
pub fn count_tokens(text: &str) -> u32 {
    (tokenize(text).len().max(1)).min(u32::MAX as usize) as u32
}

/// Chained hashes of the full `block_size`-token blocks of `tokens`, seeded with the adapter
/// name like vLLM's extra keys. Block `i`'s hash covers blocks `0..=i`.
pub fn block_hashes(tokens: &[u32], block_size: u32, adapter: Option<&str>) -> Vec<u64> {
    let bs = (block_size as usize).max(1);
    let mut prev = fnv(adapter.unwrap_or("").as_bytes(), 2);
    tokens
        .chunks_exact(bs)
        .map(|block| {
            let mut h = mix(prev);
            for t in block {
                h = fnv(&t.to_le_bytes(), h);
            }
            prev = mix(h);
            prev
        })
        .collect()
}

fn content_text(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => out.push_str(s),
        Value::Array(parts) => {
            for p in parts {
                match p {
                    Value::String(s) => out.push_str(s),
                    Value::Object(o) => part_text(o, out),
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// Text of one content part of any of the APIs (`text`, `input_text`, `output_text`,
/// `tool_result`, `tool_use`, `function_call(_output)`); images count nothing.
fn part_text(o: &Map<String, Value>, out: &mut String) {
    if let Some(Value::String(t)) = o.get("text") {
        out.push_str(t);
    }
    if let Some(c) = o.get("content") {
        content_text(c, out);
    }
    if let Some(Value::String(t)) = o.get("output") {
        out.push_str(t);
    }
    if let Some(Value::String(t)) = o.get("arguments") {
        out.push_str(t);
    }
    if let Some(input @ Value::Object(_)) = o.get("input") {
        out.push_str(&input.to_string());
    }
}

/// Builds a Llama-3-like chat prompt from (role, text) messages.
struct Template {
    tokens: Vec<u32>,
}

impl Template {
    fn new() -> Self {
        Template { tokens: vec![BOS] }
    }
    fn message(&mut self, role: &str, text: &str) {
        self.tokens.push(START_HEADER);
        tokenize_into(role, &mut self.tokens);
        self.tokens.push(END_HEADER);
        tokenize_into("\n\n", &mut self.tokens);
        tokenize_into(text, &mut self.tokens);
        self.tokens.push(EOT);
    }
    fn tools(&mut self, o: &Map<String, Value>) {
        if let Some(t @ Value::Array(a)) = o.get("tools") {
            if !a.is_empty() {
                self.message("system", &t.to_string());
            }
        }
    }
    /// The prompt so far, without the assistant header to generate from.
    fn without_generation_prompt(self) -> Vec<u32> {
        self.tokens
    }
    fn finish(mut self) -> Vec<u32> {
        self.tokens.push(START_HEADER);
        tokenize_into("assistant", &mut self.tokens);
        self.tokens.push(END_HEADER);
        tokenize_into("\n\n", &mut self.tokens);
        self.tokens
    }
}

fn role_of(m: &Value, default: &str) -> String {
    m.get("role")
        .and_then(Value::as_str)
        .unwrap_or(default)
        .to_string()
}

fn chat_tokens(o: &Map<String, Value>) -> Result<Vec<u32>, ParseError> {
    chat_tokens_with(o, true)
}

/// The chat template over `o["messages"]` (and `o["tools"]`), ending with the assistant header
/// when `generation_prompt`.
fn chat_tokens_with(
    o: &Map<String, Value>,
    generation_prompt: bool,
) -> Result<Vec<u32>, ParseError> {
    let msgs = o
        .get("messages")
        .and_then(Value::as_array)
        .ok_or(ParseError::NoMessages)?;
    let mut t = Template::new();
    t.tools(o);
    for m in msgs {
        let mut text = String::new();
        if let Some(c) = m.get("content") {
            content_text(c, &mut text);
        }
        if let Some(Value::Array(calls)) = m.get("tool_calls") {
            for c in calls {
                if let Some(Value::Object(f)) = c.get("function") {
                    part_text(f, &mut text);
                }
            }
        }
        t.message(&role_of(m, "user"), &text);
    }
    Ok(if generation_prompt {
        t.finish()
    } else {
        t.without_generation_prompt()
    })
}

fn completion_tokens(o: &Map<String, Value>) -> Result<Vec<u32>, ParseError> {
    let p = o.get("prompt").ok_or(ParseError::NoPrompt)?;
    let mut tokens = vec![BOS];
    match p {
        Value::String(s) => tokenize_into(s, &mut tokens),
        Value::Array(items) => {
            for it in items {
                match it {
                    Value::String(s) => tokenize_into(s, &mut tokens),
                    // Token ids are taken as they are.
                    Value::Number(n) => tokens.push(n.as_u64().unwrap_or(0) as u32),
                    Value::Array(ids) => {
                        tokens.extend(ids.iter().map(|x| x.as_u64().unwrap_or(0) as u32))
                    }
                    _ => {}
                }
            }
        }
        _ => return Err(ParseError::NoPrompt),
    }
    Ok(tokens)
}

fn responses_tokens(o: &Map<String, Value>) -> Result<Vec<u32>, ParseError> {
    let mut t = Template::new();
    t.tools(o);
    if let Some(Value::String(s)) = o.get("instructions") {
        t.message("system", s);
    }
    match o.get("input") {
        Some(Value::String(s)) => t.message("user", s),
        Some(Value::Array(items)) => {
            for it in items {
                let mut text = String::new();
                match it {
                    Value::String(s) => text.push_str(s),
                    Value::Object(io) => part_text(io, &mut text),
                    _ => {}
                }
                let role = match it.get("type").and_then(Value::as_str) {
                    Some("function_call_output") => "tool".to_string(),
                    Some("function_call") => "assistant".to_string(),
                    _ => role_of(it, "user"),
                };
                t.message(&role, &text);
            }
        }
        _ => return Err(ParseError::NoInput),
    }
    Ok(t.finish())
}

fn messages_tokens(o: &Map<String, Value>) -> Result<Vec<u32>, ParseError> {
    let msgs = o
        .get("messages")
        .and_then(Value::as_array)
        .ok_or(ParseError::NoMessages)?;
    let mut t = Template::new();
    t.tools(o);
    if let Some(sys) = o.get("system") {
        let mut text = String::new();
        content_text(sys, &mut text);
        t.message("system", &text);
    }
    for m in msgs {
        let mut text = String::new();
        if let Some(c) = m.get("content") {
            content_text(c, &mut text);
        }
        t.message(&role_of(m, "user"), &text);
    }
    Ok(t.finish())
}

/// The prompts of a completions body, each as the engine tokenises it: one for a string or
/// a flat list of token ids, one per item for a batch (a list of strings or of id lists), as
/// vLLM's `/v1/completions/render` answers.
pub fn completion_prompts(body: &[u8]) -> Result<Vec<Vec<u32>>, ParseError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ParseError::Json(e.to_string()))?;
    let o = v.as_object().ok_or(ParseError::NotObject)?;
    match o.get("prompt") {
        Some(Value::Array(items))
            if !items.is_empty() && items.iter().all(|x| x.is_string() || x.is_array()) =>
        {
            items
                .iter()
                .map(|it| {
                    let mut one = Map::new();
                    one.insert("prompt".into(), it.clone());
                    completion_tokens(&one)
                })
                .collect()
        }
        _ => Ok(vec![completion_tokens(o)?]),
    }
}

/// The token ids of a `/tokenize` body, as vLLM reads it: `{"prompt": "…"}` (BOS first unless
/// `add_special_tokens` is false: the ids `/v1/completions` gives the engine) or
/// `{"messages": […]}` through the chat template (the ids `/v1/chat/completions` gives the
/// engine; `add_generation_prompt` (default true) ends it with the assistant header,
/// `add_special_tokens` (default false) puts another BOS in front).
pub fn tokenize_body(body: &[u8]) -> Result<Vec<u32>, ParseError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ParseError::Json(e.to_string()))?;
    let o = v.as_object().ok_or(ParseError::NotObject)?;
    let flag = |k: &str, default: bool| o.get(k).and_then(Value::as_bool).unwrap_or(default);
    if o.contains_key("messages") {
        let mut t = chat_tokens_with(o, flag("add_generation_prompt", true))?;
        if flag("add_special_tokens", false) {
            t.insert(0, BOS);
        }
        return Ok(t);
    }
    let Some(Value::String(p)) = o.get("prompt") else {
        return Err(ParseError::NoPrompt);
    };
    let mut t = Vec::with_capacity(p.len() / CHARS_PER_TOKEN + 2);
    if flag("add_special_tokens", true) {
        t.push(BOS);
    }
    tokenize_into(p, &mut t);
    Ok(t)
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
    let tokens = match api {
        Api::Chat => chat_tokens(o)?,
        Api::Completions => completion_tokens(o)?,
        Api::Responses => responses_tokens(o)?,
        Api::Messages => messages_tokens(o)?,
    };
    let fields: &[&'static str] = match api {
        Api::Chat | Api::Completions => &["max_completion_tokens", "max_tokens"],
        Api::Responses => &["max_output_tokens"],
        Api::Messages => &["max_tokens"],
    };
    let mut max_tokens = None;
    for &field in fields {
        match o.get(field) {
            None | Some(Value::Null) => {}
            Some(v) => {
                let n = v.as_u64().ok_or(ParseError::BadMaxTokens { field })?;
                max_tokens = Some(n.min(u64::from(u32::MAX)) as u32);
                break;
            }
        }
    }
    if api == Api::Messages && max_tokens.is_none() {
        // Anthropic's API requires it.
        return Err(ParseError::BadMaxTokens {
            field: "max_tokens",
        });
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
        tokens,
        max_tokens,
        ignore_eos,
        stream,
        include_usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// English-like filler in the style of the benchmark's prompts.
    fn prose(words: usize, seed: u64) -> String {
        const W: &[&str] = &[
            "the",
            "model",
            "router",
            "cache",
            "token",
            "prefix",
            "request",
            "latency",
            "pod",
            "queue",
            "attention",
            "document",
            "section",
            "gateway",
            "a",
            "of",
            "mountain",
            "language",
            "history",
            "value",
            "system",
        ];
        let mut x = seed | 1;
        let mut s = String::new();
        for i in 0..words {
            x = mix(x.wrapping_add(0x9e37_79b9_7f4a_7c15));
            if i > 0 {
                s.push(' ');
            }
            s.push_str(W[(x % W.len() as u64) as usize]);
            if x % 17 == 0 {
                s.push_str(", 2026.");
            }
        }
        s
    }

    #[test]
    fn about_four_characters_per_token_with_variable_boundaries() {
        let t = prose(20_000, 3);
        let n = tokenize(&t).len();
        let ratio = t.len() as f64 / n as f64;
        assert!((3.6..4.4).contains(&ratio), "chars per token {ratio}");
        // Token lengths vary: the same word always splits the same way, different words
        // differently.
        assert_eq!(tokenize(" attention"), tokenize(" attention"));
        let lens: std::collections::BTreeSet<usize> = [
            "a",
            " the",
            " model",
            " router",
            " attention",
            " mountain",
            " language",
        ]
        .iter()
        .map(|w| w.len() / tokenize(w).len())
        .collect();
        assert!(lens.len() >= 3, "{lens:?}");
        assert_eq!(count_tokens(""), 1);
    }

    #[test]
    fn shared_text_prefix_shares_token_prefix() {
        let a = format!("{} alpha beta", prose(300, 9));
        let b = format!("{} gamma delta", prose(300, 9));
        let (ta, tb) = (tokenize(&a), tokenize(&b));
        let common = ta.iter().zip(&tb).take_while(|(x, y)| x == y).count();
        assert!(common + 4 >= tokenize(&prose(300, 9)).len(), "{common}");
        let (ha, hb) = (block_hashes(&ta, 16, None), block_hashes(&tb, 16, None));
        let shared = ha.iter().zip(&hb).take_while(|(x, y)| x == y).count();
        assert!(shared >= common / 16 - 1 && shared <= common / 16);
    }

    #[test]
    fn chat_template_and_options() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"abcd"},{"role":"user","content":[{"type":"text","text":"efgh"}]}],"max_completion_tokens":7,"stream":true,"stream_options":{"include_usage":true}}"#;
        let p = parse(Api::Chat, body).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.max_tokens, Some(7));
        assert!(p.stream && p.include_usage && !p.ignore_eos);
        // BOS + 2 × (header 3 + "\n\n" 1 + text 1 + EOT) + assistant header (3 + 1).
        let content = tokenize("abcd").len() + tokenize("efgh").len();
        let roles = tokenize("system").len() + tokenize("user").len();
        let assistant = tokenize("assistant").len();
        assert_eq!(p.tokens.len(), 1 + 2 * 4 + roles + content + 3 + assistant);
        assert_eq!(p.tokens.first(), Some(&BOS));
        // A later turn of the same chat starts with this prompt.
        let next = br#"{"model":"m","messages":[{"role":"system","content":"abcd"},{"role":"user","content":[{"type":"text","text":"efgh"}]},{"role":"assistant","content":"ok"},{"role":"user","content":"more"}]}"#;
        let q = parse(Api::Chat, next).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q.tokens[..p.tokens.len()], p.tokens[..]);
    }

    #[test]
    fn responses_and_messages_bodies() {
        let r = parse(
            Api::Responses,
            br#"{"model":"m","instructions":"be brief","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hello there"}]},{"type":"function_call_output","call_id":"c","output":"22 C"}],"max_output_tokens":9,"stream":true}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.max_tokens, Some(9));
        assert!(r.stream);
        let s =
            parse(Api::Responses, br#"{"input":"hello there"}"#).unwrap_or_else(|e| panic!("{e}"));
        assert!(r.tokens.len() > s.tokens.len());
        assert_eq!(parse(Api::Responses, b"{}"), Err(ParseError::NoInput));
        let m = parse(
            Api::Messages,
            br#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":"hello there"}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.max_tokens, Some(5));
        let c = parse(
            Api::Chat,
            br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.tokens, c.tokens, "same conversation, same template");
        assert_eq!(
            parse(Api::Messages, br#"{"messages":[]}"#),
            Err(ParseError::BadMaxTokens {
                field: "max_tokens"
            })
        );
    }

    #[test]
    fn completions_and_errors() {
        let p = parse(
            Api::Completions,
            br#"{"prompt":["ab",[1,2,3]],"max_tokens":null}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.max_tokens, None);
        assert_eq!(p.tokens[p.tokens.len() - 3..], [1, 2, 3]);
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
        let a: Vec<u32> = (0..16 * 3 + 5).collect();
        let mut b = a.clone();
        b[20] = 999;
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
        // Fuzz: random bytes and random JSON-ish mutations of valid bodies of every API.
        let bases: [(&[u8], Api); 4] = [
            (br#"{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":5,"stream":true}"#, Api::Chat),
            (br#"{"model":"m","prompt":"hello w\u00f6rld 12345","max_tokens":5}"#, Api::Completions),
            (br#"{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":5}"#, Api::Responses),
            (br#"{"model":"m","system":"s","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":5}"#, Api::Messages),
        ];
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for i in 0..8000 {
            let (base, api) = bases[i % 4];
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
            if let Ok(p) = parse(api, &body) {
                let _ = block_hashes(&p.tokens, 16, Some(&p.model));
            }
            let _ = tokenize(&String::from_utf8_lossy(&body));
        }
    }
}
