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
        out.push_str(&to_hex(&m.finalize().into_bytes()));
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

/// What a key derived from a secret is for ([`role_key`]). Each role's key signs one kind of
/// message only, so a key that leaks opens that role and no other:
/// - the snapshot push is signed with the push secret itself (the filter holds it; it is not
///   derived, so filters keep their configuration);
/// - [`KeyRole::Subscribe`]: a gateway sidecar's bearer to open a hub's stream;
/// - [`KeyRole::Frame`]: the hub signs each frame of the stream, subscribers verify;
/// - [`KeyRole::Tally`]: the hub's tally master, from which each replica's own tally key is
///   derived ([`replica_key`]); only hubs hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRole {
    Subscribe,
    Frame,
    Tally,
}

impl KeyRole {
    /// The label the role's key is derived with.
    pub fn label(self) -> &'static str {
        match self {
            KeyRole::Subscribe => "hub/subscribe",
            KeyRole::Frame => "hub/frame",
            KeyRole::Tally => "hub/tally",
        }
    }
}

/// Bytes of a derived key.
pub const KEY_BYTES: usize = 32;

/// HKDF-Expand (RFC 5869, section 2.3) of one block: `HMAC-SHA256(secret, "llm-router v1 " ||
/// label || 0x01)`. The secret serves as the pseudorandom key: it is at least
/// [`MIN_SECRET_BYTES`] random bytes by policy ([`check_secret`]), so the extract step adds
/// nothing. Keys of different labels are independent: holding one tells nothing of another,
/// nor of the secret.
pub fn derive_key(secret: &[u8], label: &str) -> [u8; KEY_BYTES] {
    let mut out = [0u8; KEY_BYTES];
    if let Some(mut m) = mac(secret, b"llm-router v1 ") {
        m.update(label.as_bytes());
        m.update(&[1]);
        out.copy_from_slice(&m.finalize().into_bytes());
    }
    out
}

/// The key of `role` derived from the hub secret.
pub fn role_key(hub_secret: &[u8], role: KeyRole) -> [u8; KEY_BYTES] {
    derive_key(hub_secret, role.label())
}

/// Replica `replica`'s tally key, derived from the hub's tally master ([`KeyRole::Tally`]):
/// the hub derives it to verify, the replica is given it, and no replica can derive another's.
pub fn replica_key(tally_master: &[u8], replica: u64) -> [u8; KEY_BYTES] {
    derive_key(tally_master, &format!("tally/replica/{replica}"))
}

/// Hex of `bytes` (lower case), as keys are written to credential files.
pub fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        s.push(hex_char(b >> 4));
        s.push(hex_char(b & 0xF));
    }
    s
}

/// The bytes of hex text (either case); `None` for an odd length or a non-hex digit.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if t.len() % 2 != 0 {
        return None;
    }
    t.chunks_exact(2)
        .map(|p| Some((hex_digit(*p.first()?)? << 4) | hex_digit(*p.get(1)?)?))
        .collect()
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
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn role_and_replica_keys_are_independent_and_stable() {
        let s = b"0123456789abcdef0123456789abcdef";
        let roles = [KeyRole::Subscribe, KeyRole::Frame, KeyRole::Tally];
        let keys: Vec<[u8; KEY_BYTES]> = roles.iter().map(|r| role_key(s, *r)).collect();
        for (i, a) in keys.iter().enumerate() {
            assert_ne!(&a[..], &s[..], "a role key is never the secret");
            for b in keys.iter().skip(i + 1) {
                assert_ne!(a, b);
            }
        }
        // Stable: HKDF-Expand with the label, checked against an independent computation.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(s).unwrap();
        m.update(b"llm-router v1 hub/frame\x01");
        assert_eq!(keys[1][..], m.finalize().into_bytes()[..]);
        let master = role_key(s, KeyRole::Tally);
        assert_ne!(replica_key(&master, 1), replica_key(&master, 2));
        assert_eq!(replica_key(&master, 7), replica_key(&master, 7));
        // A tally signed with replica 1's key does not verify as replica 2's.
        let sig = sign(&replica_key(&master, 1), b"tally");
        assert!(verify(&replica_key(&master, 2), b"tally", Some(&sig)).is_err());
        assert!(verify(&replica_key(&master, 1), b"tally", Some(&sig)).is_ok());
        assert_eq!(from_hex(&to_hex(&master)).unwrap(), master.to_vec());
        assert_eq!(from_hex("0g"), None);
        assert_eq!(from_hex("abc"), None);
    }

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
