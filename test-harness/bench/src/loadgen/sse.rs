//! Incremental parsing of an OpenAI-style Server-Sent-Events stream.
//!
//! The load generator feeds the bytes of each response frame as they arrive and gets back the
//! events that completed; it needs only to know which event is the first one carrying content
//! (TTFT), when later content arrives (inter-token latency) and the usage block (output tokens).

use serde::Deserialize;

/// What one SSE event meant for the measurement.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventInfo {
    /// The event carried generated text (non-empty `delta.content` or `text`).
    pub content: bool,
    /// The event carried a usage block with `completion_tokens`.
    pub completion_tokens: Option<u64>,
    /// The usage block's `prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// The usage block's `prompt_tokens_details.cached_tokens` (vLLM and model-sim report the
    /// prompt tokens served from the prefix cache there).
    pub cached_tokens: Option<u64>,
    /// The event was `data: [DONE]`.
    pub done: bool,
    /// The event carried an `error` object (a mid-stream failure).
    pub error: bool,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Usage>,
    error: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct Choice {
    delta: Option<Delta>,
    text: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    completion_tokens: Option<u64>,
    prompt_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

/// Classify the `data` payload of one event. Unparseable payloads mean nothing (not content).
pub fn classify(data: &str) -> EventInfo {
    let data = data.trim();
    if data == "[DONE]" {
        return EventInfo {
            done: true,
            ..EventInfo::default()
        };
    }
    let Ok(chunk) = serde_json::from_str::<Chunk>(data) else {
        return EventInfo::default();
    };
    let content = chunk.choices.iter().any(|c| {
        c.delta
            .as_ref()
            .and_then(|d| d.content.as_deref())
            .is_some_and(|s| !s.is_empty())
            || c.text.as_deref().is_some_and(|s| !s.is_empty())
    });
    let usage = chunk.usage;
    EventInfo {
        content,
        completion_tokens: usage.as_ref().and_then(|u| u.completion_tokens),
        prompt_tokens: usage.as_ref().and_then(|u| u.prompt_tokens),
        cached_tokens: usage
            .and_then(|u| u.prompt_tokens_details)
            .and_then(|d| d.cached_tokens),
        done: false,
        error: chunk.error.is_some(),
    }
}

/// Splits a byte stream into SSE events (blank-line separated) and returns their joined `data`.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    /// Bound on buffered bytes of an unfinished event; beyond it the buffer is dropped.
    limit: usize,
}

impl SseParser {
    /// A parser that holds at most `limit` bytes of one unfinished event.
    pub fn new(limit: usize) -> Self {
        SseParser {
            buf: Vec::new(),
            limit,
        }
    }

    /// Feed bytes; returns the `data` of every event completed by them, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some((end, sep)) = find_event_end(&self.buf) {
            let event: Vec<u8> = self.buf.drain(..end + sep).collect();
            if let Some(d) = event_data(&event[..end]) {
                out.push(d);
            }
        }
        if self.buf.len() > self.limit {
            self.buf.clear();
        }
        out
    }

    /// The data of a final event not followed by a blank line, if any.
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.buf);
        event_data(&rest)
    }
}

/// Position of the first blank-line separator and its length.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' {
            if buf[i + 1] == b'\n' {
                return Some((i, 2));
            }
            if buf[i + 1] == b'\r' && buf.get(i + 2) == Some(&b'\n') {
                return Some((i, 3));
            }
        }
        i += 1;
    }
    None
}

fn event_data(event: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(event);
    let mut data: Option<String> = None;
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(rest) = line.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => data = Some(rest.to_string()),
            }
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const FIXTURE: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
        ": a comment\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"}}]}\r\n\r\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n",
        "data: [DONE]\n\n",
    );

    fn infos(chunks: &[&[u8]]) -> Vec<EventInfo> {
        let mut p = SseParser::new(1 << 20);
        let mut out = Vec::new();
        for c in chunks {
            out.extend(p.feed(c).iter().map(|d| classify(d)));
        }
        out
    }

    #[test]
    fn role_chunk_is_not_content_and_usage_is_read() {
        let i = infos(&[FIXTURE.as_bytes()]);
        assert_eq!(i.len(), 6);
        assert!(!i[0].content, "role chunk");
        assert!(i[1].content && i[2].content);
        assert!(!i[3].content);
        assert_eq!(i[4].completion_tokens, Some(2));
        assert_eq!(i[4].prompt_tokens, Some(5));
        assert_eq!(i[4].cached_tokens, Some(3));
        assert!(i[5].done);
    }

    #[test]
    fn any_split_of_the_stream_gives_the_same_events() {
        let whole = infos(&[FIXTURE.as_bytes()]);
        let mut rng = StdRng::seed_from_u64(17);
        let b = FIXTURE.as_bytes();
        for _ in 0..200 {
            let mut cuts: Vec<usize> = (0..rng.random_range(1..20))
                .map(|_| rng.random_range(0..b.len()))
                .collect();
            cuts.sort_unstable();
            let mut parts: Vec<&[u8]> = Vec::new();
            let mut last = 0;
            for c in cuts {
                parts.push(&b[last..c]);
                last = c;
            }
            parts.push(&b[last..]);
            assert_eq!(infos(&parts), whole);
        }
    }

    #[test]
    fn real_openai_fixture_counts_content_chunks() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/sse/openai-chat-gpt-4o-2024-08-06-content-usage.sse"
        );
        let text = std::fs::read(path).unwrap_or_else(|e| {
            panic!("SSE fixture missing: {path}: {e} (part of the repository)")
        });
        let i = infos(&[&text]);
        assert!(!i[0].content);
        assert!(i.iter().filter(|e| e.content).count() > 3);
        assert!(i.iter().any(|e| e.completion_tokens.is_some()));
        assert!(i.last().is_some_and(|e| e.done));
    }

    #[test]
    fn random_bytes_never_panic_and_stay_bounded() {
        let mut rng = StdRng::seed_from_u64(99);
        for _ in 0..300 {
            let mut p = SseParser::new(4096);
            for _ in 0..10 {
                let n = rng.random_range(0..2000);
                let bytes: Vec<u8> = (0..n)
                    .map(|_| {
                        let choices = b"data: {}[]\n\r\"choices:delta";
                        if rng.random::<bool>() {
                            choices[rng.random_range(0..choices.len())]
                        } else {
                            rng.random()
                        }
                    })
                    .collect();
                for d in p.feed(&bytes) {
                    let _ = classify(&d);
                }
                assert!(p.buf.len() <= 4096);
            }
            let _ = p.finish();
        }
    }

    #[test]
    fn completions_text_counts_as_content() {
        assert!(classify(r#"{"choices":[{"text":"hi"}]}"#).content);
        assert!(!classify(r#"{"choices":[{"text":""}]}"#).content);
        assert!(classify(r#"{"error":{"message":"x"}}"#).error);
        assert_eq!(classify("not json"), EventInfo::default());
    }
}
