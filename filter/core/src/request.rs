//! Reading an OpenAI- or Anthropic-style request body, once.
//!
//! The body is parsed a single time into borrowed views: strings without escapes point into the
//! body itself, so a 200 KB prompt is not copied. What the router needs comes out: the `model`
//! (with its byte span, so it can be rewritten in place), `stream`, and the prompt as the
//! ordered pieces of text a prefix cache would see (system, tools, every message's role and
//! content, prompt strings or token ids, `input` items). Everything else is skipped.

use crate::reject::Allow;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// The endpoints the filter routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    ChatCompletions,
    Completions,
    Embeddings,
    Responses,
    /// Anthropic `/v1/messages`.
    Messages,
}

impl ApiKind {
    /// The kind for a request path (query string ignored), or `None` for paths left alone.
    pub fn from_path(path: &str) -> Option<ApiKind> {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        let path = path.strip_suffix('/').unwrap_or(path);
        Some(match path {
            "/v1/chat/completions" | "/chat/completions" => ApiKind::ChatCompletions,
            "/v1/completions" | "/completions" => ApiKind::Completions,
            "/v1/embeddings" | "/embeddings" => ApiKind::Embeddings,
            "/v1/responses" | "/responses" => ApiKind::Responses,
            "/v1/messages" => ApiKind::Messages,
            _ => return None,
        })
    }
}

/// The paths [`ApiKind::from_path`] accepts, as one RE2 regex for Envoy's route `safe_regex`
/// (which must match the whole path, query string excluded): the shipped configurations route
/// only these to a pool, so a path the filter does not route cannot reach one.
pub const API_PATH_REGEX: &str =
    "/(v1/)?(chat/completions|completions|embeddings|responses)/?|/v1/messages/?";

/// Whether `path` (query string ignored, one trailing slash allowed) is OpenAI's model list,
/// `/v1/models` or `/models`.
pub fn is_models_path(path: &str) -> bool {
    let path = path.split(['?', '#']).next().unwrap_or(path);
    let path = path.strip_suffix('/').unwrap_or(path);
    matches!(path, "/v1/models" | "/models")
}

/// What the filter does with a request, judged from its method and path at the headers (the
/// snapshot paths are handled before this).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// A `POST` with a body on an API path: read the body and route it.
    Api(ApiKind),
    /// `GET` on the model list: answered by the filter itself.
    Models,
    /// An API path (or the model list) with a method it does not serve: 405 with this `allow`.
    WrongMethod { allow: Allow },
    /// A `POST` on an API path without a body: 400 (there is no model to route on).
    NoBody,
    /// A path the filter does not route (`unknown_paths` decides).
    Unknown,
}

impl Entry {
    /// `end_of_stream` is the headers' end-of-stream flag: true when no body follows.
    pub fn of(method: &str, path: &str, end_of_stream: bool) -> Entry {
        if let Some(kind) = ApiKind::from_path(path) {
            return match (method, end_of_stream) {
                ("POST", false) => Entry::Api(kind),
                ("POST", true) => Entry::NoBody,
                _ => Entry::WrongMethod { allow: Allow::Post },
            };
        }
        if is_models_path(path) {
            return if method == "GET" {
                Entry::Models
            } else {
                Entry::WrongMethod { allow: Allow::Get }
            };
        }
        Entry::Unknown
    }
}

/// OpenAI's model list (`GET /v1/models`) of these names: `{"object":"list","data":[{"id",
/// "object":"model","created":0,"owned_by":"llm-router"}, …]}`, sorted, each name once.
pub fn model_list_json<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: std::collections::BTreeSet<&str> = names.into_iter().collect();
    let data: Vec<serde_json::Value> = names
        .into_iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "llm-router"}))
        .collect();
    serde_json::json!({"object": "list", "data": data}).to_string()
}

/// Why a body cannot be routed. The message is meant for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// Not JSON, or a field of the wrong type (serde's message names line and column).
    Malformed(String),
    /// No `model` field.
    MissingModel,
    /// `model` present but not a non-empty string.
    BadModel,
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Malformed(m) => write!(f, "request body is not valid: {m}"),
            RequestError::MissingModel => write!(f, "request body has no \"model\" field"),
            RequestError::BadModel => write!(f, "\"model\" must be a non-empty string"),
        }
    }
}

/// One piece of prompt, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece<'a> {
    Text(Cow<'a, str>),
    /// Token ids (each counts as 4 characters for block sizing).
    Tokens(Vec<u32>),
}

/// What the router needs from a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest<'a> {
    pub model: Cow<'a, str>,
    /// Byte range of the JSON string `"..."` of `model` in the body (for rewriting).
    pub model_span: (usize, usize),
    pub stream: bool,
    /// `stream_options.include_usage`: the stream's last chunk carries token usage.
    pub include_usage: bool,
    /// The prompt as a prefix cache sees it, in order.
    pub pieces: Vec<Piece<'a>>,
    /// Number of leading pieces that end with the first user message's (first) content piece,
    /// when the body has role-tagged messages: the part of the prompt that stays the same on
    /// every turn of a conversation.
    pub key_pieces: Option<usize>,
    /// Number of leading pieces before the last user message, when an assistant message comes
    /// before it: the conversation so far, which the previous turn's request and reply left in
    /// some pod's cache.
    pub history_pieces: Option<usize>,
}

impl ParsedRequest<'_> {
    /// Bytes the prefix hashing feeds before the last user message (each piece and its
    /// separator; tokens count 4), when the request carries a conversation's history.
    pub fn history_bytes(&self) -> Option<usize> {
        let n = self.history_pieces?;
        Some(
            self.pieces
                .iter()
                .take(n)
                .map(|p| match p {
                    Piece::Text(t) => t.len() + 1,
                    Piece::Tokens(t) => t.len().saturating_mul(4) + 1,
                })
                .sum(),
        )
    }

    /// Total prompt characters (tokens count as 4), an estimate of prompt size.
    pub fn prompt_chars(&self) -> usize {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.len(),
                Piece::Tokens(t) => t.len().saturating_mul(4),
            })
            .sum()
    }
}

/// Parses a body for `kind`.
///
/// The whole body must be UTF-8 (JSON is, RFC 8259 §8.1): `serde_json` checks only the strings
/// it decodes, so invalid bytes in a field the filter skips would otherwise reach the model
/// server. Checking once up front costs about what the per-string checks it replaces did.
pub fn parse(kind: ApiKind, body: &[u8]) -> Result<ParsedRequest<'_>, RequestError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        RequestError::Malformed(format!(
            "not UTF-8 at byte {} (JSON text is UTF-8)",
            e.valid_up_to()
        ))
    })?;
    // serde's derived struct reading also takes a JSON array (fields by position), so
    // `["model-name"]` would route; a request is an object.
    if !text.trim_start().starts_with('{') {
        return Err(RequestError::Malformed(
            "the body must be a JSON object".into(),
        ));
    }
    let raw: RawBody<'_> =
        serde_json::from_str(text).map_err(|e| RequestError::Malformed(e.to_string()))?;
    let model_raw = raw.model.ok_or(RequestError::MissingModel)?;
    let model_text = model_raw.get();
    let model: Cow<'_, str> =
        serde_json::from_str(model_text).map_err(|_| RequestError::BadModel)?;
    if model.is_empty() {
        return Err(RequestError::BadModel);
    }
    // `RawValue::get` borrows from `body`, so its offset is a position in the body.
    let start = (model_text.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
    let model_span = match start.checked_add(model_text.len()) {
        Some(end) if end <= body.len() => (start, end),
        _ => (0, 0),
    };
    let mut pieces = Vec::new();
    // The order follows how chat templates lay a prompt out: system, tools, then the turns.
    match kind {
        ApiKind::Messages => {
            push(raw.system, &mut pieces);
            push_raw(raw.tools, &mut pieces);
            push_messages(raw.messages, &mut pieces);
        }
        ApiKind::ChatCompletions => {
            push_raw(raw.tools, &mut pieces);
            push_messages(raw.messages, &mut pieces);
        }
        ApiKind::Completions => push(raw.prompt, &mut pieces),
        ApiKind::Embeddings => push(raw.input, &mut pieces),
        ApiKind::Responses => {
            push(raw.instructions, &mut pieces);
            push_raw(raw.tools, &mut pieces);
            push(raw.input, &mut pieces);
        }
    }
    let key_pieces = pieces
        .iter()
        .position(|p| matches!(p, Piece::Text(t) if t == "user"))
        .map(|i| (i + 2).min(pieces.len()));
    let is_role = |p: &Piece<'_>, role: &str| matches!(p, Piece::Text(t) if t == role);
    let history_pieces = pieces
        .iter()
        .rposition(|p| is_role(p, "user"))
        .filter(|&u| pieces.iter().take(u).any(|p| is_role(p, "assistant")));
    Ok(ParsedRequest {
        model,
        model_span,
        stream: raw.stream.unwrap_or(false),
        // Read leniently: a malformed `stream_options` is the engine's to reject.
        include_usage: raw
            .stream_options
            .and_then(|o| serde_json::from_str::<StreamOptions>(o.get()).ok())
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        pieces,
        key_pieces,
        history_pieces,
    })
}

fn push<'a>(p: Option<Prompt<'a>>, out: &mut Vec<Piece<'a>>) {
    if let Some(p) = p {
        p.into_pieces(out);
    }
}

fn push_raw<'a>(raw: Option<&'a RawValue>, out: &mut Vec<Piece<'a>>) {
    if let Some(r) = raw {
        out.push(Piece::Text(Cow::Borrowed(r.get())));
    }
}

fn push_messages<'a>(messages: Option<Vec<Message<'a>>>, out: &mut Vec<Piece<'a>>) {
    for m in messages.into_iter().flatten() {
        if let Some(role) = m.role {
            out.push(Piece::Text(role));
        }
        if let Some(c) = m.content {
            c.into_pieces(out);
        }
        push_raw(m.tool_calls, out);
    }
}

#[derive(Deserialize)]
struct RawBody<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    stream: Option<bool>,
    #[serde(borrow)]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Option<Vec<Message<'a>>>,
    #[serde(borrow)]
    prompt: Option<Prompt<'a>>,
    #[serde(borrow)]
    input: Option<Prompt<'a>>,
    #[serde(borrow)]
    system: Option<Prompt<'a>>,
    #[serde(borrow)]
    instructions: Option<Prompt<'a>>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow)]
    content: Option<Prompt<'a>>,
    #[serde(borrow)]
    tool_calls: Option<&'a RawValue>,
}

/// Any prompt-bearing value: a string, token ids, an array of strings / parts / items /
/// token arrays, or an object (a content part or an input item). Parsed in one pass.
#[derive(Debug, Default)]
struct Prompt<'a> {
    pieces: Vec<Piece<'a>>,
}

impl<'a> Prompt<'a> {
    fn into_pieces(self, out: &mut Vec<Piece<'a>>) {
        out.extend(self.pieces);
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Prompt<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PromptVisitor)
    }
}

struct PromptVisitor;

impl<'de> Visitor<'de> for PromptVisitor {
    type Value = Prompt<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a string, an array of strings, token ids or content parts, or a content object",
        )
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Prompt {
            pieces: vec![Piece::Text(Cow::Borrowed(v))],
        })
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Prompt {
            pieces: vec![Piece::Text(Cow::Owned(v.to_owned()))],
        })
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Prompt {
            pieces: vec![Piece::Text(Cow::Owned(v))],
        })
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Prompt::default())
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Prompt::default())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Prompt {
            pieces: vec![Piece::Tokens(vec![token(v)?])],
        })
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        let v = u64::try_from(v).map_err(|_| E::custom(format!("token id {v} is negative")))?;
        self.visit_u64(v)
    }

    // Numbers and booleans carry no prompt text; the model server validates them.
    fn visit_f64<E: de::Error>(self, _v: f64) -> Result<Self::Value, E> {
        Ok(Prompt::default())
    }

    fn visit_bool<E: de::Error>(self, _v: bool) -> Result<Self::Value, E> {
        Ok(Prompt::default())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut pieces: Vec<Piece<'de>> = Vec::new();
        while let Some(item) = seq.next_element::<Prompt<'de>>()? {
            for p in item.pieces {
                // Consecutive token ids merge into one run.
                match (pieces.last_mut(), p) {
                    (Some(Piece::Tokens(run)), Piece::Tokens(more)) => run.extend(more),
                    (_, p) => pieces.push(p),
                }
            }
        }
        Ok(Prompt { pieces })
    }

    /// A content part (`{"type":"text","text":...}`), an input item (`{"role":...,"content":...}`,
    /// `{"type":"function_call_output","output":...}`), or a tool block. Text-bearing fields are
    /// taken in a fixed order; other fields (images, ids) are kept as raw JSON, so two requests
    /// with different images do not look alike.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut role: Option<Prompt<'de>> = None;
        let mut text: Option<Prompt<'de>> = None;
        let mut other: Vec<Piece<'de>> = Vec::new();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "role" => role = Some(map.next_value()?),
                "text" | "content" | "input" | "output" | "arguments" | "name" => {
                    let v: Prompt<'de> = map.next_value()?;
                    text.get_or_insert_with(Prompt::default)
                        .pieces
                        .extend(v.pieces);
                }
                "image_url" | "image" | "source" | "file" | "input_image" | "input_audio" => {
                    let raw: &'de RawValue = map.next_value()?;
                    other.push(Piece::Text(Cow::Borrowed(raw.get())));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let mut pieces = role.map(|r| r.pieces).unwrap_or_default();
        pieces.extend(text.map(|t| t.pieces).unwrap_or_default());
        pieces.extend(other);
        Ok(Prompt { pieces })
    }
}

fn token<E: de::Error>(v: u64) -> Result<u32, E> {
    u32::try_from(v).map_err(|_| E::custom(format!("token id {v} is out of range")))
}

#[cfg(test)]
mod tests;
