//! Token usage from response bodies, read as they stream past.
//!
//! OpenAI-style replies carry `"usage": {"prompt_tokens", "completion_tokens", …}` — at the end
//! of a JSON reply, or in the last SSE chunk of a stream requested with
//! `stream_options.include_usage` (the earlier chunks say `"usage": null`). Anthropic's
//! `/v1/messages` says `input_tokens` / `output_tokens` (streamed: in `message_start`, then
//! cumulatively in `message_delta`), as does `/v1/responses` (in `response.completed`).
//!
//! [`Scanner`] is fed each body chunk as it passes and never holds the stream: it looks for the
//! key `"usage"` outside JSON strings (inside a string its quotes would be escaped), then copies
//! only the object that follows (bounded) and reads its counts. A key split across chunks is
//! found through a few bytes of state. When several usage objects pass, the last value of each
//! count wins (streams report cumulative counts).

use serde::Deserialize;

/// Token counts of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt: Option<u64>,
    pub completion: Option<u64>,
}

/// Largest usage object read (OpenAI's, with its details, is about 300 bytes).
const MAX_OBJECT: usize = 4096;
const KEY: &[u8] = b"\"usage\"";

#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum State {
    /// Looking for the key; `matched` bytes of it seen, `escaped` the byte before its opening
    /// quote was a backslash.
    #[default]
    Searching,
    /// After the key, before `:`.
    Colon,
    /// After `:`, before the value.
    Value,
    /// Inside the object: nesting depth, inside a string, after a backslash in one.
    Object {
        depth: u32,
        in_string: bool,
        escape: bool,
    },
}

/// Finds and reads `usage` objects in a body fed chunk by chunk.
#[derive(Debug, Clone, Default)]
pub struct Scanner {
    state: State,
    matched: usize,
    /// The byte before the key's opening quote was a backslash (the key is text in a string).
    escaped: bool,
    last: u8,
    object: Vec<u8>,
    usage: Usage,
}

#[derive(Deserialize)]
struct RawUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    /// Anthropic counts cached prompt tokens apart from `input_tokens`.
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

impl Scanner {
    /// What was read so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Reads one body chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut i = 0;
        while let Some(&b) = chunk.get(i) {
            match &mut self.state {
                State::Searching => {
                    if self.matched == 0 {
                        // Skip to the next quote: most of a body is never looked at twice.
                        match chunk
                            .get(i..)
                            .and_then(|r| r.iter().position(|&c| c == b'"'))
                        {
                            Some(p) => {
                                if p > 0 {
                                    self.last = chunk.get(i + p - 1).copied().unwrap_or(0);
                                }
                                i += p;
                            }
                            None => {
                                self.last = chunk.last().copied().unwrap_or(self.last);
                                return;
                            }
                        }
                        self.escaped = self.last == b'\\';
                        self.matched = 1;
                        self.last = b'"';
                        i += 1;
                        continue;
                    }
                    self.key_byte(b);
                }
                State::Colon => match b {
                    b':' => self.state = State::Value,
                    b' ' | b'\t' | b'\r' | b'\n' => {}
                    _ => self.state = State::Searching,
                },
                State::Value => match b {
                    b'{' => {
                        self.object.clear();
                        self.object.push(b'{');
                        self.state = State::Object {
                            depth: 1,
                            in_string: false,
                            escape: false,
                        };
                    }
                    b' ' | b'\t' | b'\r' | b'\n' => {}
                    // `null` and anything else: no counts here.
                    _ => self.state = State::Searching,
                },
                State::Object { .. } => self.object_byte(b),
            }
            self.last = b;
            i += 1;
        }
    }

    /// One byte after a quote while searching: the key goes on matching, or starts again.
    fn key_byte(&mut self, b: u8) {
        if KEY.get(self.matched) == Some(&b) {
            self.matched += 1;
            if self.matched == KEY.len() {
                self.matched = 0;
                if !self.escaped {
                    self.state = State::Colon;
                }
            }
        } else if b == b'"' {
            self.escaped = self.last == b'\\';
            self.matched = 1;
        } else {
            self.matched = 0;
        }
    }

    /// One byte of the usage object: kept (up to [`MAX_OBJECT`]) until its braces close, then
    /// read.
    fn object_byte(&mut self, b: u8) {
        let State::Object {
            depth,
            in_string,
            escape,
        } = &mut self.state
        else {
            return;
        };
        if self.object.len() >= MAX_OBJECT {
            self.object.clear();
            self.state = State::Searching;
            return;
        }
        self.object.push(b);
        if *in_string {
            if *escape {
                *escape = false;
            } else if b == b'\\' {
                *escape = true;
            } else if b == b'"' {
                *in_string = false;
            }
        } else if b == b'"' {
            *in_string = true;
        } else if b == b'{' {
            *depth += 1;
        } else if b == b'}' {
            *depth -= 1;
            if *depth == 0 {
                self.read_object();
                self.state = State::Searching;
            }
        }
    }

    fn read_object(&mut self) {
        let Ok(raw) = serde_json::from_slice::<RawUsage>(&self.object) else {
            return;
        };
        let input = raw.input_tokens.map(|n| {
            n.saturating_add(raw.cache_creation_input_tokens.unwrap_or(0))
                .saturating_add(raw.cache_read_input_tokens.unwrap_or(0))
        });
        if let Some(p) = raw.prompt_tokens.or(input) {
            self.usage.prompt = Some(p);
        }
        if let Some(c) = raw.completion_tokens.or(raw.output_tokens) {
            self.usage.completion = Some(c);
        }
        self.object.clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn scan_split(body: &[u8], size: usize) -> Usage {
        let mut s = Scanner::default();
        for c in body.chunks(size.max(1)) {
            s.feed(c);
        }
        s.usage()
    }

    fn both(p: u64, c: u64) -> Usage {
        Usage {
            prompt: Some(p),
            completion: Some(c),
        }
    }

    #[test]
    fn reads_a_json_reply_in_any_chunking() {
        let body = br#"{"id":"x","choices":[{"message":{"content":"hi \"usage\": {\"prompt_tokens\": 999}"}}],"usage": {"prompt_tokens":12,"completion_tokens":34,"total_tokens":46,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        for size in 1..=body.len() {
            assert_eq!(scan_split(body, size), both(12, 34), "chunks of {size}");
        }
    }

    #[test]
    fn reads_the_last_usage_of_a_stream() {
        let body = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n\
                     data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\n\
                     data: [DONE]\n\n";
        for size in [1, 2, 5, 7, 16, body.len()] {
            assert_eq!(scan_split(body, size), both(7, 3), "chunks of {size}");
        }
        assert_eq!(
            scan_split(b"data: {\"usage\":null}\n\n", 3),
            Usage::default()
        );
    }

    #[test]
    fn reads_anthropic_and_responses_usage() {
        let messages = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\n\
                         event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n";
        assert_eq!(scan_split(messages, 9), both(15, 15));
        let responses = br#"{"object":"response","usage":{"input_tokens":20,"input_tokens_details":{"cached_tokens":0},"output_tokens":8,"total_tokens":28}}"#;
        assert_eq!(scan_split(responses, 4), both(20, 8));
    }

    #[test]
    fn ignores_usage_in_strings_and_oversized_or_broken_objects() {
        assert_eq!(
            scan_split(br#"{"text":"\"usage\":{\"prompt_tokens\":1}"}"#, 3),
            Usage::default()
        );
        let huge = format!(
            r#"{{"usage":{{"pad":"{}","prompt_tokens":1}}}}"#,
            "x".repeat(MAX_OBJECT)
        );
        assert_eq!(scan_split(huge.as_bytes(), 100), Usage::default());
        assert_eq!(
            scan_split(br#"{"usage":{"prompt_tokens":"many"}}"#, 100),
            Usage::default()
        );
    }
}
