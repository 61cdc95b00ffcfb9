//! A small, zero-copy reader for the Prometheus text exposition format (0.0.4).
//!
//! Why our own: `prometheus-parse` 0.2.5 matches names with `\w+`, so every `vllm:…` and
//! `sglang:…` sample is silently dropped (the trap STYLE.md warns about), and labels with `}` in a
//! value break its regex; `openmetrics-parser` 0.5 parses a whole document with a PEG grammar and
//! rejects it entirely on one bad line (the vLLM design-doc fixture has literal `...` lines), and
//! both allocate every sample, which costs CPU when 100 pods are read 20 times a second. This
//! reader borrows from the text, never panics, reports each bad line with its number and reason,
//! and lets the caller skip lines whose metric name it does not need without reading the rest.

use std::borrow::Cow;
use std::fmt;

/// Why one line is not a valid sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line number.
    pub line: usize,
    pub reason: &'static str,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

/// One sample line, borrowed from the exposition text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// The text between `{` and `}` (already checked to be well formed), or "".
    labels: &'a str,
    pub value: f64,
    /// Optional timestamp in ms.
    pub timestamp: Option<i64>,
}

impl<'a> Sample<'a> {
    /// The value of label `key`, unescaped; `None` when the sample has no such label.
    pub fn label(&self, key: &str) -> Option<Cow<'a, str>> {
        self.labels().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// All labels in the order written.
    pub fn labels(&self) -> Labels<'a> {
        Labels { rest: self.labels }
    }
}

/// Iterator over `(name, value)` of a checked label set.
pub struct Labels<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        // The label text was validated by `scan_labels`, so the shapes below always hold; a
        // failure simply ends the iteration instead of panicking.
        let s = self.rest.trim_start_matches([' ', '\t', ',']);
        let eq = s.find('=')?;
        let key = s.get(..eq)?.trim();
        let after = s.get(eq + 1..)?.trim_start();
        let body = after.strip_prefix('"')?;
        let (raw, used) = quoted_end(body)?;
        self.rest = body.get(used..).unwrap_or("");
        Some((key, unescape(raw)))
    }
}

/// Finds the closing quote of a label value: returns the raw (still escaped) value and the byte
/// count consumed including the closing quote.
fn quoted_end(body: &str) -> Option<(&str, usize)> {
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some((body.get(..i)?, i + 1)),
            _ => i += 1,
        }
    }
    None
}

fn unescape(raw: &str) -> Cow<'_, str> {
    if !raw.contains('\\') {
        return Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// What a line turned out to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Line<'a> {
    /// A sample the caller wanted.
    Sample(Sample<'a>),
    /// `# HELP name …` / `# TYPE name kind`: the metric name (for engine detection).
    Meta { name: &'a str },
    /// Blank line or other comment.
    Skip,
    /// A sample the caller chose not to read (by its name); the rest of the line is unchecked.
    Unwanted { name: &'a str },
    /// `# EOF` (OpenMetrics): nothing after it is read.
    Eof,
}

/// Byte classes of metric names: 1 = may start a name, 2 = may continue one.
const NAME_CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        if b.is_ascii_alphabetic() || b == b'_' || b == b':' {
            t[i] = 3;
        } else if b.is_ascii_digit() {
            t[i] = 2;
        }
        i += 1;
    }
    t
};

fn is_name_start(b: u8) -> bool {
    NAME_CLASS[usize::from(b)] & 1 != 0
}

fn is_name_char(b: u8) -> bool {
    NAME_CLASS[usize::from(b)] & 2 != 0
}

fn is_label_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_label_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Length of the metric name at the start of `s` (0 when there is none).
fn name_len(s: &[u8]) -> usize {
    match s.first() {
        Some(&b) if is_name_start(b) => {
            1 + s.iter().skip(1).take_while(|&&b| is_name_char(b)).count()
        }
        _ => 0,
    }
}

/// Checks a label set starting just after `{`; returns the length up to (not including) `}`.
fn scan_labels(s: &[u8]) -> Result<usize, &'static str> {
    let mut i = 0;
    let ws = |i: &mut usize| {
        while matches!(s.get(*i), Some(b' ' | b'\t')) {
            *i += 1;
        }
    };
    loop {
        ws(&mut i);
        match s.get(i) {
            None => return Err("label set not closed with '}'"),
            Some(b'}') => return Ok(i),
            Some(&b) if is_label_start(b) => {}
            Some(_) => return Err("bad label name"),
        }
        while s.get(i).is_some_and(|&b| is_label_char(b)) {
            i += 1;
        }
        ws(&mut i);
        if s.get(i) != Some(&b'=') {
            return Err("label name not followed by '='");
        }
        i += 1;
        ws(&mut i);
        if s.get(i) != Some(&b'"') {
            return Err("label value not quoted");
        }
        i += 1;
        loop {
            match s.get(i) {
                None => return Err("label value not terminated"),
                Some(b'\\') => match s.get(i + 1) {
                    Some(b'\\' | b'"' | b'n') => i += 2,
                    _ => return Err("bad escape in label value"),
                },
                Some(b'"') => {
                    i += 1;
                    break;
                }
                Some(_) => i += 1,
            }
        }
        ws(&mut i);
        match s.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return Ok(i),
            None => return Err("label set not closed with '}'"),
            Some(_) => return Err("expected ',' or '}' after a label value"),
        }
    }
}

/// Parses a sample value: decimal or scientific, `NaN`, `+Inf`, `-Inf`.
pub fn parse_value(s: &str) -> Option<f64> {
    // Rust's float parser also takes "infinity" and "nan" in any case; Prometheus writes
    // "+Inf"/"-Inf"/"NaN". Reject what neither form allows (hex, underscores, empty).
    if s.is_empty() || s.len() > 64 {
        return None;
    }
    match s {
        "+Inf" | "Inf" => return Some(f64::INFINITY),
        "-Inf" => return Some(f64::NEG_INFINITY),
        "NaN" => return Some(f64::NAN),
        _ => {}
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    s.parse::<f64>().ok()
}

/// Reads one line (without its `\n`). `want(name)` decides whether a sample is read in full;
/// returning false skips the rest of the line unchecked (the scraping fast path).
pub fn parse_line<'a>(
    raw: &'a str,
    line_no: usize,
    want: impl Fn(&str) -> bool,
) -> Result<Line<'a>, LineError> {
    let line = raw
        .strip_suffix('\r')
        .unwrap_or(raw)
        .trim_start_matches([' ', '\t']);
    if line.trim_end().is_empty() {
        return Ok(Line::Skip);
    }
    if let Some(comment) = line.strip_prefix('#') {
        return Ok(comment_line(comment));
    }
    sample_line(line, want).map_err(|reason| LineError {
        line: line_no,
        reason,
    })
}

/// A comment (the text after `#`): `# EOF`, the name of `# HELP` / `# TYPE`, or nothing.
#[inline]
fn comment_line(comment: &str) -> Line<'_> {
    let c = comment.trim_start_matches([' ', '\t']);
    if c.trim_end() == "EOF" {
        return Line::Eof;
    }
    for kw in ["HELP", "TYPE"] {
        if let Some(rest) = c.strip_prefix(kw) {
            let rest = rest.trim_start_matches([' ', '\t']);
            let n = name_len(rest.as_bytes());
            if n > 0 {
                return Line::Meta {
                    name: rest.get(..n).unwrap_or(""),
                };
            }
        }
    }
    Line::Skip
}

/// A sample line (trimmed at the start): name, labels, value, timestamp; the error is the reason.
#[inline]
fn sample_line<'a>(line: &'a str, want: impl Fn(&str) -> bool) -> Result<Line<'a>, &'static str> {
    let n = name_len(line.as_bytes());
    if n == 0 {
        return Err("does not start with a metric name");
    }
    let name = line.get(..n).ok_or("bad metric name")?;
    if !want(name) {
        return Ok(Line::Unwanted { name });
    }
    let (labels, pos) = label_set(line, n)?;
    let rest = line.get(pos..).ok_or("bad sample")?;
    let (value, timestamp) = value_and_timestamp(rest)?;
    Ok(Line::Sample(Sample {
        name,
        labels,
        value,
        timestamp,
    }))
}

/// The label text between `{` and `}` when one opens at `pos` ("" otherwise), and where the
/// line goes on after it.
#[inline]
fn label_set(line: &str, pos: usize) -> Result<(&str, usize), &'static str> {
    let bytes = line.as_bytes();
    if bytes.get(pos) != Some(&b'{') {
        return Ok(("", pos));
    }
    let rest = bytes.get(pos + 1..).unwrap_or(&[]);
    let len = scan_labels(rest)?;
    let labels = line.get(pos + 1..pos + 1 + len).ok_or("bad label set")?;
    Ok((labels, pos + len + 2))
}

/// What follows the name and labels: a space, the value, an optional timestamp (and an
/// OpenMetrics exemplar, ignored).
#[inline]
fn value_and_timestamp(rest: &str) -> Result<(f64, Option<i64>), &'static str> {
    if !rest.starts_with([' ', '\t']) {
        return Err("metric name or labels not followed by a space");
    }
    // OpenMetrics exemplars follow " # "; they carry nothing we use.
    let rest = match rest.find(" #") {
        Some(i) => rest.get(..i).unwrap_or(rest),
        None => rest,
    };
    let mut fields = rest.split_ascii_whitespace();
    let value = fields.next().ok_or("missing value")?;
    let value = parse_value(value).ok_or("value is not a number")?;
    let timestamp = match fields.next() {
        None => None,
        Some(t) => Some(
            t.parse::<i64>()
                .map_err(|_| "timestamp is not an integer")?,
        ),
    };
    if fields.next().is_some() {
        return Err("unexpected text after the value");
    }
    Ok((value, timestamp))
}

/// Calls `on_line` for every line of `text` (1-based numbers), stopping at `# EOF`.
/// Bad lines go to `on_error` and reading goes on: one broken family does not hide the rest.
///
/// Fast path: when a sample was unwanted, following lines that start with exactly the same name
/// (then `{` or a space) are skipped with one comparison, without scanning the name again — the
/// 20-odd bucket lines of a histogram cost almost nothing.
pub fn for_each_line<'a>(
    text: &'a str,
    want: impl Fn(&str) -> bool,
    mut on_line: impl FnMut(Line<'a>),
    mut on_error: impl FnMut(LineError),
) {
    let mut unwanted: &'a str = "";
    let bytes = text.as_bytes();
    let mut start = 0usize;
    let mut i = 0usize;
    // Same lines as `text.split('\n')`, found with the SIMD `memchr` (std's is word-at-a-time).
    while start <= bytes.len() {
        let end = bytes
            .get(start..)
            .and_then(|b| memchr::memchr(b'\n', b))
            .map_or(bytes.len(), |n| start + n);
        let raw = text.get(start..end).unwrap_or("");
        start = end + 1;
        i += 1;
        if !unwanted.is_empty() {
            if let Some(rest) = raw.strip_prefix(unwanted) {
                if matches!(rest.as_bytes().first(), Some(b'{' | b' ' | b'\t')) {
                    continue;
                }
            }
        }
        match parse_line(raw, i, &want) {
            Ok(Line::Eof) => return,
            Ok(Line::Unwanted { name }) => {
                unwanted = name;
                on_line(Line::Unwanted { name })
            }
            Ok(l) => on_line(l),
            Err(e) => on_error(e),
        }
    }
}

/// Every sample of `text` plus the bad lines (for tests and the `parse` command).
pub fn parse_all(text: &str) -> (Vec<Sample<'_>>, Vec<LineError>) {
    let mut samples = Vec::new();
    let mut errors = Vec::new();
    for_each_line(
        text,
        |_| true,
        |l| {
            if let Line::Sample(s) = l {
                samples.push(s)
            }
        },
        |e| errors.push(e),
    );
    (samples, errors)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn one(line: &str) -> Result<Line<'_>, LineError> {
        parse_line(line, 1, |_| true)
    }

    fn sample(line: &str) -> Sample<'_> {
        match one(line) {
            Ok(Line::Sample(s)) => s,
            other => panic!("not a sample: {other:?}"),
        }
    }

    #[test]
    fn colon_names_labels_and_values() {
        let s = sample(r#"vllm:num_requests_waiting{engine="0",model_name="m/x"} 3.0"#);
        assert_eq!(s.name, "vllm:num_requests_waiting");
        assert_eq!(s.value, 3.0);
        assert_eq!(s.label("engine").as_deref(), Some("0"));
        assert_eq!(s.label("model_name").as_deref(), Some("m/x"));
        assert_eq!(s.label("nope"), None);
        let s = sample("llamacpp:requests_deferred 2");
        assert_eq!(
            (s.name, s.value, s.timestamp),
            ("llamacpp:requests_deferred", 2.0, None)
        );
        assert_eq!(
            sample("x 1.7382173358407154e+09").value,
            1.7382173358407154e+09
        );
        assert_eq!(
            sample("x 8.128902e+06 1700000000000").timestamp,
            Some(1_700_000_000_000)
        );
        assert!(sample("x NaN").value.is_nan());
        assert_eq!(sample("x +Inf").value, f64::INFINITY);
        assert_eq!(sample("x -Inf").value, f64::NEG_INFINITY);
        assert_eq!(sample("x{} 1").labels().count(), 0);
    }

    #[test]
    fn escapes_braces_and_commas_inside_values() {
        let s = sample(r#"m{a="x\"}y",b="p\\q\nr", c = "1,2" ,} 5"#);
        assert_eq!(s.label("a").as_deref(), Some("x\"}y"));
        assert_eq!(s.label("b").as_deref(), Some("p\\q\nr"));
        assert_eq!(s.label("c").as_deref(), Some("1,2"));
        assert_eq!(s.labels().count(), 3);
        assert_eq!(s.value, 5.0);
    }

    #[test]
    fn comments_meta_blank_and_eof() {
        assert_eq!(
            one("# HELP vllm:x Some help"),
            Ok(Line::Meta { name: "vllm:x" })
        );
        assert_eq!(
            one("# TYPE vllm:x gauge"),
            Ok(Line::Meta { name: "vllm:x" })
        );
        assert_eq!(one("# HELP"), Ok(Line::Skip));
        assert_eq!(one("# just a comment"), Ok(Line::Skip));
        assert_eq!(one("   "), Ok(Line::Skip));
        assert_eq!(one("\r"), Ok(Line::Skip));
        assert_eq!(one("# EOF"), Ok(Line::Eof));
        let (s, e) = parse_all("a 1\n# EOF\nb 2\n");
        assert_eq!((s.len(), e.len()), (1, 0));
    }

    #[test]
    fn skipped_names_are_not_read() {
        // The rest of the line is not even looked at when the name is not wanted.
        assert_eq!(
            parse_line("other{broken 1", 1, |n| n != "other"),
            Ok(Line::Unwanted { name: "other" })
        );
        // Later lines of the same name are skipped without reading; other names are read.
        let mut seen = Vec::new();
        for_each_line(
            "h_bucket{le=\"1\"} 1\nh_bucket{le=\"2\"} oops\nh_bucket_x 1\nh_sum 2\nkeep 3\n",
            |n| n == "keep",
            |l| seen.push(l),
            |e| panic!("{e}"),
        );
        // h_bucket (unwanted), h_bucket_x, h_sum (unwanted), keep, and the empty last line.
        assert_eq!(seen.len(), 5);
        assert!(matches!(
            seen[3],
            Line::Sample(Sample {
                name: "keep",
                value: 3.0,
                ..
            })
        ));
    }

    #[test]
    fn malformed_lines_are_reported_with_reasons() {
        let cases = [
            ("...", "does not start with a metric name"),
            ("9abc 1", "does not start with a metric name"),
            ("m{a=\"1\" 2", "expected ',' or '}' after a label value"),
            ("m{a=\"1\"", "label set not closed with '}'"),
            ("m{a=1} 2", "label value not quoted"),
            ("m{a} 2", "label name not followed by '='"),
            ("m{1a=\"x\"} 2", "bad label name"),
            ("m{a=\"x} 2", "label value not terminated"),
            ("m{a=\"\\q\"} 2", "bad escape in label value"),
            ("m", "metric name or labels not followed by a space"),
            ("m ", "missing value"),
            ("m abc", "value is not a number"),
            ("m 0x10", "value is not a number"),
            ("m 1 2.5", "timestamp is not an integer"),
            ("m 1 2 3", "unexpected text after the value"),
            ("m-x 1", "metric name or labels not followed by a space"),
        ];
        for (line, reason) in cases {
            assert_eq!(one(line), Err(LineError { line: 1, reason }), "{line}");
        }
    }

    #[test]
    fn line_numbers_count_from_one_and_reading_goes_on() {
        let (s, e) = parse_all("a 1\n...\nb 2\n");
        assert_eq!(s.len(), 2);
        assert_eq!(
            e,
            vec![LineError {
                line: 2,
                reason: "does not start with a metric name"
            }]
        );
    }
}
