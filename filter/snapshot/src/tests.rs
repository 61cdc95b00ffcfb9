//! Byte-level tests of the snapshot format: one hand-annotated encoding, round trips, and every
//! way a push can be malformed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use super::*;

fn one_pod() -> Snapshot {
    Snapshot {
        rewrites: None,
        objectives: None,
        generation: 7,
        created_ms: 0x0102,
        pools: vec![Pool {
            name: "p".into(),
            cluster: "c".into(),
            models: vec!["m".into()],
            pods: vec![Pod {
                address: "1.2.3.4:80".into(),
                engine: Engine::Vllm,
                health: Health::Ok,
                failures: 0,
                scraped_at_ms: 5,
                waiting: 2,
                running: 3,
                kv_usage: Some(0.5),
                block_size: 16,
                num_blocks: 1000,
                lora: Some(LoraState {
                    running: vec!["a".into()],
                    waiting: vec![],
                    max_loras: 4,
                }),
                peers: Default::default(),
            }],
            peer_contexts: Vec::new(),
        }],
    }
}

#[rustfmt::skip]
const ONE_POD_BYTES: &[u8] = &[
    b'L', b'R', b'S', b'N',             // magic
    1, 0,                               // version 1
    0, 0,                               // flags
    7, 0, 0, 0, 0, 0, 0, 0,             // generation 7
    0x02, 0x01, 0, 0, 0, 0, 0, 0,       // created_ms 0x0102
    1, 0,                               // 1 pool
    1, 0, b'p',                         //   name "p"
    1, 0, b'c',                         //   cluster "c"
    1, 0,                               //   1 model
    1, 0, b'm',                         //     "m"
    1, 0,                               //   1 pod
    10, b'1', b'.', b'2', b'.', b'3', b'.', b'4', b':', b'8', b'0', // address
    1,                                  //     engine vllm
    0,                                  //     health ok
    0, 0,                               //     failures 0
    5, 0, 0, 0, 0, 0, 0, 0,             //     scraped_at_ms 5
    2, 0, 0, 0,                         //     waiting 2
    3, 0, 0, 0,                         //     running 3
    0x88, 0x13,                         //     kv 5000 bp = 0.5
    16, 0, 0, 0,                        //     block_size 16
    0xE8, 0x03, 0, 0,                   //     num_blocks 1000
    4, 0,                               //     max_loras 4
    1, 0, 1, b'a',                      //     running adapters ["a"]
    0, 0,                               //     waiting adapters []
];

#[test]
fn encodes_to_the_annotated_bytes() {
    assert_eq!(one_pod().encode().unwrap(), ONE_POD_BYTES);
}

#[test]
fn decodes_the_annotated_bytes() {
    assert_eq!(Snapshot::decode(ONE_POD_BYTES).unwrap(), one_pod());
}

#[test]
fn round_trips_unknown_kv_and_no_lora() {
    let mut s = one_pod();
    s.pools[0].pods[0].kv_usage = None;
    s.pools[0].pods[0].lora = None;
    s.pools[0].pods[0].engine = Engine::Tgi;
    s.pools[0].pods[0].health = Health::Failing;
    s.pools[0].pods[0].failures = 3;
    let bytes = s.encode().unwrap();
    assert_eq!(Snapshot::decode(&bytes).unwrap(), s);
}

#[test]
fn every_truncation_is_an_error() {
    for len in 0..ONE_POD_BYTES.len() {
        let err = Snapshot::decode(&ONE_POD_BYTES[..len]).unwrap_err();
        assert!(
            matches!(err, DecodeError::Truncated { .. } | DecodeError::BadMagic),
            "len {len}: {err}"
        );
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    let mut b = ONE_POD_BYTES.to_vec();
    b.push(0);
    assert_eq!(
        Snapshot::decode(&b).unwrap_err(),
        DecodeError::TrailingBytes {
            at: ONE_POD_BYTES.len(),
            extra: 1
        }
    );
}

#[test]
fn header_errors_say_what_is_wrong() {
    let mut b = ONE_POD_BYTES.to_vec();
    b[0] = b'X';
    assert_eq!(Snapshot::decode(&b).unwrap_err(), DecodeError::BadMagic);
    let mut b = ONE_POD_BYTES.to_vec();
    b[4] = 2;
    let e = Snapshot::decode(&b).unwrap_err();
    assert_eq!(e, DecodeError::UnsupportedVersion(2));
    assert!(e.to_string().contains("version 2"));
    // Bit 0 is FLAG_PEER_WORK (then every pod carries 8 more bytes), bit 1
    // FLAG_PEER_CONTEXTS (then every pool ends with its list), bit 2 FLAG_REWRITES (then the
    // snapshot ends with its rules), bit 3 FLAG_OBJECTIVES (then with its objectives); the
    // others are unknown.
    let mut b = ONE_POD_BYTES.to_vec();
    b[6] = 16;
    assert_eq!(
        Snapshot::decode(&b).unwrap_err(),
        DecodeError::UnsupportedFlags(16)
    );
    let mut b = ONE_POD_BYTES.to_vec();
    b[6] = 4;
    assert!(matches!(
        Snapshot::decode(&b).unwrap_err(),
        DecodeError::Truncated {
            wanted: "rewrite rules",
            ..
        }
    ));
    let mut b = ONE_POD_BYTES.to_vec();
    b[6] = 8;
    assert!(matches!(
        Snapshot::decode(&b).unwrap_err(),
        DecodeError::Truncated {
            wanted: "objectives",
            ..
        }
    ));
    let mut b = ONE_POD_BYTES.to_vec();
    b[6] = 2;
    assert!(matches!(
        Snapshot::decode(&b).unwrap_err(),
        DecodeError::Truncated { .. }
    ));
    let mut b = ONE_POD_BYTES.to_vec();
    b[6] = 1;
    assert!(matches!(
        Snapshot::decode(&b).unwrap_err(),
        DecodeError::Truncated { .. }
    ));
    // A flag with nothing behind it (zero peer work, empty context lists) is refused: the
    // encoder never sets it so, and one snapshot has one encoding (found by the fuzzer).
    for (flag, zeros) in [(1, 8), (2, 2)] {
        let mut b = ONE_POD_BYTES.to_vec();
        b[6] = flag;
        b.extend(std::iter::repeat_n(0, zeros));
        let e = Snapshot::decode(&b).unwrap_err();
        assert!(matches!(e, DecodeError::Invalid(_)), "flag {flag}: {e:?}");
    }
}

#[test]
fn bad_values_are_rejected() {
    // KV above 100 %.
    let kv_at = ONE_POD_BYTES.len() - 2 - 4 - 2 - 4 - 4 - 2;
    let mut b = ONE_POD_BYTES.to_vec();
    b[kv_at] = 0x11;
    b[kv_at + 1] = 0x27; // 10001
    assert!(
        matches!(Snapshot::decode(&b).unwrap_err(), DecodeError::Invalid(m) if m.contains("10001"))
    );
    // Unknown engine byte.
    let engine_at = ONE_POD_BYTES.iter().position(|&x| x == b'0').unwrap() + 1;
    let mut b = ONE_POD_BYTES.to_vec();
    b[engine_at] = 99;
    assert_eq!(
        Snapshot::decode(&b).unwrap_err(),
        DecodeError::BadEnum {
            what: "engine",
            value: 99
        }
    );
    // An address that is not ip:port.
    let mut s = one_pod();
    s.pools[0].pods[0].address = "pod-a:80".into();
    assert!(s.encode().is_err());
    // Duplicate pods and pools.
    let mut s = one_pod();
    let pod = s.pools[0].pods[0].clone();
    s.pools[0].pods.push(pod);
    assert!(s
        .validate()
        .unwrap_err()
        .to_string()
        .contains("appears twice"));
    let mut s = one_pod();
    let pool = s.pools[0].clone();
    s.pools.push(pool);
    assert!(s
        .validate()
        .unwrap_err()
        .to_string()
        .contains("appears twice"));
    // Non-UTF-8 pool name.
    let mut b = ONE_POD_BYTES.to_vec();
    b[28] = 0xFF;
    assert_eq!(
        Snapshot::decode(&b).unwrap_err(),
        DecodeError::BadUtf8 { at: 28 }
    );
}

#[test]
fn same_state_ignores_timestamps_only() {
    let a = one_pod();
    let mut b = one_pod();
    b.generation = 99;
    b.created_ms = 12345;
    b.pools[0].pods[0].scraped_at_ms = 777;
    assert!(a.same_state(&b));
    b.pools[0].pods[0].waiting = 3;
    assert!(!a.same_state(&b));
}

#[test]
fn engine_names_round_trip() {
    for e in Engine::ALL {
        assert_eq!(Engine::from_name(e.name()), Some(e));
        assert_eq!(Engine::from_wire(e.to_wire()), Some(e));
    }
    assert_eq!(Engine::from_name("SGLang"), Some(Engine::Sglang));
    assert_eq!(Engine::from_name("nope"), None);
}

/// Seeded random mutations of a valid snapshot: decoding never panics, and whatever decodes
/// re-encodes to the same bytes (nothing lost, nothing invented).
#[test]
fn fuzz_decode_never_panics_and_round_trips() {
    let mut big = one_pod();
    for i in 0..20u8 {
        let mut pod = big.pools[0].pods[0].clone();
        pod.address = format!("10.0.0.{i}:8000");
        pod.waiting = u32::from(i);
        big.pools[0].pods.push(pod);
    }
    let seeds = [ONE_POD_BYTES.to_vec(), big.encode().unwrap()];
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut decoded = 0;
    for round in 0..20_000 {
        let mut b = seeds[round % 2].clone();
        let flips = 1 + next() % 4;
        for _ in 0..flips {
            match next() % 3 {
                0 => {
                    let i = (next() as usize) % b.len();
                    b[i] = next() as u8;
                }
                1 => {
                    let i = (next() as usize) % b.len();
                    b.truncate(i);
                }
                _ => {
                    let i = (next() as usize) % (b.len() + 1);
                    b.insert(i, next() as u8);
                }
            }
            if b.is_empty() {
                break;
            }
        }
        if let Ok(s) = Snapshot::decode(&b) {
            decoded += 1;
            assert_eq!(s.encode().unwrap(), b, "round {round}");
        }
    }
    // Mutations of counters and bytes inside values still decode often enough to matter.
    assert!(decoded > 100, "only {decoded} mutated inputs decoded");
}

mod signatures {
    use crate::auth::{sign, verify, SignatureError, SIGNATURE_PREFIX};
    use crate::Snapshot;

    #[test]
    fn hmac_sha256_known_answer() {
        // RFC 4231, test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn only_the_right_signature_over_the_same_bytes_verifies() {
        let snap = Snapshot {
            rewrites: None,
            objectives: None,
            generation: 7,
            created_ms: 1,
            pools: vec![],
        };
        let bytes = snap.encode().unwrap();
        let good = sign(b"s3cret", &bytes);
        assert!(good.starts_with(SIGNATURE_PREFIX) && good.len() == 7 + 64);
        assert_eq!(verify(b"s3cret", &bytes, Some(&good)), Ok(()));
        assert_eq!(
            verify(
                b"s3cret",
                &bytes,
                Some(&good.to_uppercase().replace("SHA256=", "sha256="))
            ),
            Ok(())
        );
        assert_eq!(
            verify(b"other", &bytes, Some(&good)),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"", &bytes, Some(&good)),
            Err(SignatureError::NoSecret)
        );
        assert_eq!(
            verify(b"s3cret", &bytes, None),
            Err(SignatureError::Missing)
        );
        for bad in [
            &good[..good.len() - 2],
            &good[7..],
            "sha256=",
            "sha1=0000000000000000000000000000000000000000",
            "s3cret",
        ] {
            assert_eq!(
                verify(b"s3cret", &bytes, Some(bad)),
                Err(SignatureError::Malformed),
                "{bad}"
            );
        }
        let mut not_hex = good.clone();
        not_hex.replace_range(10..11, "g");
        assert_eq!(
            verify(b"s3cret", &bytes, Some(&not_hex)),
            Err(SignatureError::Malformed)
        );
        // The generation is inside the signed bytes: the same signature under another
        // generation fails.
        let newer = Snapshot {
            generation: 8,
            ..snap
        }
        .encode()
        .unwrap();
        assert_ne!(newer, bytes);
        assert_eq!(
            verify(b"s3cret", &newer, Some(&good)),
            Err(SignatureError::Mismatch)
        );
        let mut flipped = bytes.clone();
        flipped[8] ^= 1;
        assert_eq!(
            verify(b"s3cret", &flipped, Some(&good)),
            Err(SignatureError::Mismatch)
        );
    }
}

#[test]
fn the_generation_is_read_from_the_header_alone() {
    let mut snap = one_pod();
    snap.generation = 4_242;
    let bytes = snap.encode().unwrap();
    assert_eq!(Snapshot::peek_generation(&bytes), Some(4_242));
    assert_eq!(
        Snapshot::peek_generation(&bytes[..12]),
        None,
        "cut inside the generation"
    );
    let mut other = bytes.clone();
    other[0] = b'X';
    assert_eq!(Snapshot::peek_generation(&other), None);
}
