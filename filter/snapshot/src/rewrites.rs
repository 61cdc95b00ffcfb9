//! The snapshot's optional rewrites section: canary and weighted model rewrite rules
//! (`InferenceModelRewrite`-like) that the sidecar pushes with the fleet, so changing a canary's
//! weight needs no change of the filter's configuration (and no Envoy reload: the filter's VM
//! keeps running and every worker picks the rules up with the next snapshot).
//!
//! ```text
//! rewrites  rule_count u16 | rule * rule_count           (after the last pool, only with FLAG_REWRITES)
//! rule      model str8 | sticky u8 (0 none, 1 conversation) | target_count u16 | target * target_count
//! target    model str8 | weight u32
//! ```
//! The section carries names and weights only: which pool serves a target, and whether the
//! weights make sense for the filter's pools, is the filter's to resolve against its own
//! configuration (`llm_router_core`), rule by rule, so one bad rule never refuses a snapshot.
//! What this format refuses is what no filter could use: more than [`MAX_REWRITE_RULES`] rules
//! or [`MAX_REWRITE_TARGETS`] targets, empty names, two rules for one requested model.

use super::{DecodeError, EncodeError, Reader, Writer};

/// Rules per snapshot.
pub const MAX_REWRITE_RULES: usize = 256;
/// Targets per rule.
pub const MAX_REWRITE_TARGETS: usize = 64;

/// How a rule's target is chosen (the filter's `rewrite::Sticky`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RewriteSticky {
    /// Per request (weighted random).
    #[default]
    None,
    /// Per conversation: every turn of a chat keeps its target.
    Conversation,
}

impl RewriteSticky {
    fn to_wire(self) -> u8 {
        match self {
            RewriteSticky::None => 0,
            RewriteSticky::Conversation => 1,
        }
    }

    fn from_wire(b: u8) -> Option<RewriteSticky> {
        match b {
            0 => Some(RewriteSticky::None),
            1 => Some(RewriteSticky::Conversation),
            _ => None,
        }
    }

    /// The name used in configuration files and logs (`none`, `conversation`).
    pub fn name(self) -> &'static str {
        match self {
            RewriteSticky::None => "none",
            RewriteSticky::Conversation => "conversation",
        }
    }
}

/// One served name a rule sends a share of its requests to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RewriteTarget {
    /// The model name the pods serve (the body's new `model`).
    pub model: String,
    /// Relative weight (0 = never chosen).
    pub weight: u32,
}

/// One rule: requests for `model` go to one of `targets`, by weight.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RewriteRule {
    /// The requested model name the rule matches (exactly).
    pub model: String,
    pub sticky: RewriteSticky,
    pub targets: Vec<RewriteTarget>,
}

/// Writes the section ([`read_rewrites`] reads it back).
pub(super) fn write_rewrites(w: &mut Writer, rules: &[RewriteRule]) -> Result<(), EncodeError> {
    w.len16(rules.len(), "rewrite rules")?;
    for rule in rules {
        w.str8(&rule.model, "rewrite model")?;
        w.out.push(rule.sticky.to_wire());
        w.len16(rule.targets.len(), "rewrite targets")?;
        for t in &rule.targets {
            w.str8(&t.model, "rewrite target")?;
            w.u32(t.weight);
        }
    }
    Ok(())
}

/// Reads what [`write_rewrites`] wrote; [`validate_rewrites`] checks it with the rest.
pub(super) fn read_rewrites(r: &mut Reader<'_>) -> Result<Vec<RewriteRule>, DecodeError> {
    let n = r.count("rewrite rules", MAX_REWRITE_RULES)?;
    let mut rules = Vec::with_capacity(n);
    for _ in 0..n {
        let model = r.str8("rewrite model")?;
        let sticky_b = r.u8("rewrite sticky")?;
        let sticky = RewriteSticky::from_wire(sticky_b).ok_or(DecodeError::BadEnum {
            what: "rewrite sticky",
            value: sticky_b,
        })?;
        let count = r.count("rewrite targets", MAX_REWRITE_TARGETS)?;
        let mut targets = Vec::with_capacity(count);
        for _ in 0..count {
            targets.push(RewriteTarget {
                model: r.str8("rewrite target")?,
                weight: r.u32("rewrite weight")?,
            });
        }
        rules.push(RewriteRule {
            model,
            sticky,
            targets,
        });
    }
    Ok(rules)
}

/// The rules every rewrites section obeys: at most [`MAX_REWRITE_RULES`] rules of at most
/// [`MAX_REWRITE_TARGETS`] targets, non-empty names, one rule per requested model.
pub(super) fn validate_rewrites(rules: &[RewriteRule]) -> Result<(), DecodeError> {
    if rules.len() > MAX_REWRITE_RULES {
        return Err(DecodeError::TooMany {
            what: "rewrite rules",
            count: rules.len(),
            max: MAX_REWRITE_RULES,
        });
    }
    for (i, rule) in rules.iter().enumerate() {
        if rule.model.is_empty() {
            return Err(DecodeError::Invalid(format!(
                "rewrite rule #{i} has an empty model"
            )));
        }
        if rules.iter().take(i).any(|q| q.model == rule.model) {
            return Err(DecodeError::Invalid(format!(
                "rewrite model {:?} has two rules",
                rule.model
            )));
        }
        if rule.targets.len() > MAX_REWRITE_TARGETS {
            return Err(DecodeError::TooMany {
                what: "rewrite targets",
                count: rule.targets.len(),
                max: MAX_REWRITE_TARGETS,
            });
        }
        if rule.targets.iter().any(|t| t.model.is_empty()) {
            return Err(DecodeError::Invalid(format!(
                "rewrite rule {:?} has a target with an empty model",
                rule.model
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The section's bytes, round trips, truncations and limits, in the style of the snapshot's
    //! own tests (`src/tests.rs`).
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::{Snapshot, FLAG_REWRITES};

    fn canary() -> Snapshot {
        Snapshot {
            generation: 7,
            created_ms: 1,
            pools: vec![],
            rewrites: Some(vec![RewriteRule {
                model: "chat".into(),
                sticky: RewriteSticky::Conversation,
                targets: vec![
                    RewriteTarget {
                        model: "s".into(),
                        weight: 90,
                    },
                    RewriteTarget {
                        model: "c".into(),
                        weight: 10,
                    },
                ],
            }]),
            objectives: None,
        }
    }

    #[rustfmt::skip]
    const CANARY_BYTES: &[u8] = &[
        b'L', b'R', b'S', b'N',             // magic
        1, 0,                               // version 1
        4, 0,                               // flags: FLAG_REWRITES
        7, 0, 0, 0, 0, 0, 0, 0,             // generation 7
        1, 0, 0, 0, 0, 0, 0, 0,             // created_ms 1
        0, 0,                               // no pool
        1, 0,                               // 1 rewrite rule
        4, b'c', b'h', b'a', b't',          //   model "chat"
        1,                                  //   sticky: conversation
        2, 0,                               //   2 targets
        1, b's', 90, 0, 0, 0,               //     "s" weight 90
        1, b'c', 10, 0, 0, 0,               //     "c" weight 10
    ];

    #[test]
    fn encodes_and_decodes_the_annotated_bytes() {
        assert_eq!(canary().encode().unwrap(), CANARY_BYTES);
        assert_eq!(Snapshot::decode(CANARY_BYTES).unwrap(), canary());
    }

    /// An empty section is kept apart from no section: a sidecar that manages the rules and
    /// has none turns the configured ones off; one that says nothing leaves them on.
    #[test]
    fn an_empty_section_round_trips_and_differs_from_none() {
        let empty = Snapshot {
            rewrites: Some(vec![]),
            ..canary()
        };
        let bytes = empty.encode().unwrap();
        assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), FLAG_REWRITES);
        assert_eq!(Snapshot::decode(&bytes).unwrap(), empty);
        let none = Snapshot {
            rewrites: None,
            objectives: None,
            ..canary()
        };
        let bytes = none.encode().unwrap();
        assert_eq!(&bytes[6..8], &[0, 0]);
        assert_eq!(bytes.len(), CANARY_BYTES.len() - 22);
        assert_eq!(Snapshot::decode(&bytes).unwrap(), none);
        assert!(!none.same_state(&empty));
    }

    #[test]
    fn every_truncation_is_an_error() {
        for len in 0..CANARY_BYTES.len() {
            let err = Snapshot::decode(&CANARY_BYTES[..len]).unwrap_err();
            assert!(
                matches!(err, DecodeError::Truncated { .. } | DecodeError::BadMagic),
                "len {len}: {err}"
            );
        }
        let mut b = CANARY_BYTES.to_vec();
        b.push(0);
        assert!(matches!(
            Snapshot::decode(&b),
            Err(DecodeError::TrailingBytes { extra: 1, .. })
        ));
    }

    #[test]
    fn limits_and_bad_values_are_refused_on_decode_and_encode() {
        // A sticky value no build knows.
        let mut b = CANARY_BYTES.to_vec();
        b[33] = 2;
        assert_eq!(
            Snapshot::decode(&b).unwrap_err(),
            DecodeError::BadEnum {
                what: "rewrite sticky",
                value: 2
            }
        );
        // Too many targets, counted before anything is allocated.
        let mut b = CANARY_BYTES.to_vec();
        b[34..36].copy_from_slice(&(MAX_REWRITE_TARGETS as u16 + 1).to_le_bytes());
        assert!(matches!(
            Snapshot::decode(&b).unwrap_err(),
            DecodeError::TooMany {
                what: "rewrite targets",
                ..
            }
        ));
        // Too many rules.
        let mut b = CANARY_BYTES.to_vec();
        b[26..28].copy_from_slice(&(MAX_REWRITE_RULES as u16 + 1).to_le_bytes());
        assert!(matches!(
            Snapshot::decode(&b).unwrap_err(),
            DecodeError::TooMany {
                what: "rewrite rules",
                ..
            }
        ));
        let mut two = canary();
        let rules = two.rewrites.as_mut().unwrap();
        rules.push(rules[0].clone());
        assert!(
            two.encode().unwrap_err().0.contains("two rules"),
            "duplicate"
        );
        let mut empty_target = canary();
        empty_target.rewrites.as_mut().unwrap()[0].targets[1].model = String::new();
        assert!(empty_target.encode().is_err());
        let mut long = canary();
        long.rewrites.as_mut().unwrap()[0].model = "x".repeat(256);
        assert!(long.encode().unwrap_err().0.contains("longer than 255"));
    }
}
