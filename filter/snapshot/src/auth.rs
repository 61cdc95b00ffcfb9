//! Authentication of snapshot pushes by their content: the sidecar signs the exact bytes it
//! pushes with HMAC-SHA256 under the shared secret and sends the signature in
//! [`SIGNATURE_HEADER`]; the filter recomputes it over the bytes it received and compares in
//! constant time before it decodes anything.
//!
//! The signature covers the whole encoded snapshot, header included, so the `generation`
//! (bytes 8..16) is signed too: a captured push cannot be replayed under a newer generation,
//! and replaying it as it is loses against the filter's "newer generation only" rule. The
//! secret itself never travels. Both sides use these two functions and nothing else.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

/// The request header carrying the signature.
pub const SIGNATURE_HEADER: &str = "x-llm-router-signature";
/// What the header value starts with; 64 lower- or upper-case hex digits follow.
pub const SIGNATURE_PREFIX: &str = "sha256=";
/// Bytes of an HMAC-SHA256 tag.
const TAG_BYTES: usize = 32;

/// Why a signature was refused (for the proxy's log; callers answer every case the same way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureError {
    /// No secret is configured: nothing can be verified.
    NoSecret,
    /// The request carried no signature.
    Missing,
    /// Not `sha256=` followed by 64 hex digits (for example truncated).
    Malformed,
    /// Well formed, but not the HMAC of these bytes under this secret.
    Mismatch,
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SignatureError::NoSecret => "no snapshot secret is configured",
            SignatureError::Missing => "no signature header",
            SignatureError::Malformed => "signature is not sha256=<64 hex digits>",
            SignatureError::Mismatch => "signature does not match the snapshot bytes",
        })
    }
}

impl std::error::Error for SignatureError {}

/// HMAC-SHA256 keyed with `secret` over `snapshot`. HMAC accepts keys of any length, so this
/// is `None` only if the hmac crate ever refused one; both callers then fail closed.
fn mac(secret: &[u8], snapshot: &[u8]) -> Option<Hmac<Sha256>> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).ok()?;
    m.update(snapshot);
    Some(m)
}

/// The header value for `snapshot` (the encoded bytes, exactly as sent): `sha256=<64 hex>`.
pub fn sign(secret: &[u8], snapshot: &[u8]) -> String {
    let mut out = String::with_capacity(SIGNATURE_PREFIX.len() + 2 * TAG_BYTES);
    out.push_str(SIGNATURE_PREFIX);
    if let Some(m) = mac(secret, snapshot) {
        for b in m.finalize().into_bytes() {
            out.push(hex_char(b >> 4));
            out.push(hex_char(b & 0xF));
        }
    }
    out
}

fn hex_char(nibble: u8) -> char {
    char::from_digit(u32::from(nibble), 16).unwrap_or('0')
}

fn hex_digit(c: u8) -> Option<u8> {
    char::from(c)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Checks `signature` (the header value, `None` if absent) against `snapshot` under `secret`.
/// The tag comparison takes the same time wherever the first differing byte is.
pub fn verify(
    secret: &[u8],
    snapshot: &[u8],
    signature: Option<&str>,
) -> Result<(), SignatureError> {
    if secret.is_empty() {
        return Err(SignatureError::NoSecret);
    }
    let value = signature.ok_or(SignatureError::Missing)?.trim();
    let hex = value
        .strip_prefix(SIGNATURE_PREFIX)
        .ok_or(SignatureError::Malformed)?
        .as_bytes();
    if hex.len() != 2 * TAG_BYTES {
        return Err(SignatureError::Malformed);
    }
    let mut tag = [0u8; TAG_BYTES];
    for (slot, pair) in tag.iter_mut().zip(hex.chunks_exact(2)) {
        let (Some(hi), Some(lo)) = (
            pair.first().copied().and_then(hex_digit),
            pair.get(1).copied().and_then(hex_digit),
        ) else {
            return Err(SignatureError::Malformed);
        };
        *slot = (hi << 4) | lo;
    }
    mac(secret, snapshot)
        .ok_or(SignatureError::Mismatch)?
        .verify_slice(&tag)
        .map_err(|_| SignatureError::Mismatch)
}

/// The shortest secret accepted, in bytes: an HMAC-SHA256 key shorter than its 32-byte output
/// is weaker than the tag it makes.
pub const MIN_SECRET_BYTES: usize = 32;

/// Secrets that ship in examples and documentation: anyone who read them knows them.
pub const PLACEHOLDER_SECRETS: [&str; 6] = [
    "change-me",
    "changeme",
    "change_me",
    "secret",
    "replace-me",
    "CHANGE-ME-TO-32-OR-MORE-RANDOM-BYTES",
];

/// How to make a secret, for the messages that refuse one.
pub const SECRET_HOWTO: &str = "make one with `openssl rand -hex 32` (or `head -c 32 /dev/urandom \
     | base64`) and give it to the filter and the sidecar from one Kubernetes Secret";

/// Why a configured secret is refused: a known placeholder, or too short. Both the filter and
/// the sidecar call this, so neither accepts a secret the other would refuse. Surrounding
/// whitespace is ignored for the check (a trailing newline from a mounted file is common).
pub fn check_secret(secret: &str) -> Result<(), String> {
    let s = secret.trim();
    if PLACEHOLDER_SECRETS
        .iter()
        .any(|p| p.eq_ignore_ascii_case(s))
    {
        return Err(format!(
            "the snapshot secret is the placeholder {s:?} from the examples; {SECRET_HOWTO}"
        ));
    }
    if s.len() < MIN_SECRET_BYTES {
        return Err(format!(
            "the snapshot secret is {} bytes, shorter than {MIN_SECRET_BYTES}; {SECRET_HOWTO}",
            s.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod secret_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn placeholders_and_short_secrets_are_refused() {
        for p in PLACEHOLDER_SECRETS {
            let e = check_secret(p).unwrap_err();
            assert!(
                e.contains("placeholder") && e.contains("openssl rand"),
                "{e}"
            );
        }
        assert!(check_secret(" Change-Me\n").is_err());
        let e = check_secret("s3cret").unwrap_err();
        assert!(e.contains("6 bytes") && e.contains("32"), "{e}");
        assert!(check_secret(&"x".repeat(31)).is_err());
        assert!(check_secret(&"x".repeat(32)).is_ok());
        assert!(check_secret("3f1c9e0a7b5d2c4e8f6a1b3d5c7e9f0a2b4c6d8e").is_ok());
    }
}
