//! The snapshot's optional objectives section: the priority of each named objective (llm-d's
//! `InferenceObjective`, `spec.priority`), which the sidecar pushes with the fleet so that an
//! objective created, changed or deleted in Kubernetes applies with the next snapshot, without
//! a change of the filter's configuration (and no Envoy reload).
//!
//! ```text
//! objectives  objective_count u16 | (name str8 | priority i32) * objective_count
//!             (after the rewrites section, or the last pool without one; only with FLAG_OBJECTIVES)
//! ```
//! A request names its objective in a header (`x-llm-d-inference-objective`, or the
//! configured `objective_header`); the filter reads it only where it trusts client headers
//! (`priority.trust_headers`). With the section present the snapshot's objectives replace the
//! configured `objectives` map whole; without it the configured map applies. An empty section
//! ("the sidecar manages objectives and there are none") differs from no section.
//!
//! Names are objects' names in one namespace, so unique: this format refuses a name twice, an
//! empty name and more than [`MAX_OBJECTIVES`] entries.

use super::{DecodeError, EncodeError, Reader, Writer};

/// Objectives per snapshot.
pub const MAX_OBJECTIVES: usize = 1024;

/// One named objective and its priority (`< 0` sheddable, `0` standard, `> 0` critical).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Objective {
    /// The name requests give in the objective header.
    pub name: String,
    /// Higher is served first; an unset `spec.priority` is 0.
    pub priority: i32,
}

/// Writes the section ([`read_objectives`] reads it back).
pub(super) fn write_objectives(w: &mut Writer, list: &[Objective]) -> Result<(), EncodeError> {
    w.len16(list.len(), "objectives")?;
    for o in list {
        w.str8(&o.name, "objective name")?;
        w.u32(o.priority as u32);
    }
    Ok(())
}

/// Reads what [`write_objectives`] wrote; [`validate_objectives`] checks it with the rest.
pub(super) fn read_objectives(r: &mut Reader<'_>) -> Result<Vec<Objective>, DecodeError> {
    let n = r.count("objectives", MAX_OBJECTIVES)?;
    let mut list = Vec::with_capacity(n);
    for _ in 0..n {
        list.push(Objective {
            name: r.str8("objective name")?,
            priority: r.u32("objective priority")? as i32,
        });
    }
    Ok(list)
}

/// At most [`MAX_OBJECTIVES`], each with a non-empty name given once.
pub(super) fn validate_objectives(list: &[Objective]) -> Result<(), DecodeError> {
    if list.len() > MAX_OBJECTIVES {
        return Err(DecodeError::TooMany {
            what: "objectives",
            count: list.len(),
            max: MAX_OBJECTIVES,
        });
    }
    let mut seen = std::collections::HashSet::with_capacity(list.len());
    for (i, o) in list.iter().enumerate() {
        if o.name.is_empty() {
            return Err(DecodeError::Invalid(format!(
                "objective #{i} has an empty name"
            )));
        }
        if !seen.insert(o.name.as_str()) {
            return Err(DecodeError::Invalid(format!(
                "objective {:?} appears twice",
                o.name
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The section's bytes, round trips, truncations and limits, in the style of the rewrites
    //! section's tests.
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::{RewriteRule, RewriteSticky, RewriteTarget, Snapshot, FLAG_OBJECTIVES};

    fn two() -> Snapshot {
        Snapshot {
            generation: 7,
            created_ms: 1,
            objectives: Some(vec![
                Objective {
                    name: "vip".into(),
                    priority: 10,
                },
                Objective {
                    name: "batch".into(),
                    priority: -1,
                },
            ]),
            ..Snapshot::default()
        }
    }

    #[rustfmt::skip]
    const TWO_BYTES: &[u8] = &[
        b'L', b'R', b'S', b'N',             // magic
        1, 0,                               // version 1
        8, 0,                               // flags: FLAG_OBJECTIVES
        7, 0, 0, 0, 0, 0, 0, 0,             // generation 7
        1, 0, 0, 0, 0, 0, 0, 0,             // created_ms 1
        0, 0,                               // no pool
        2, 0,                               // 2 objectives
        3, b'v', b'i', b'p', 10, 0, 0, 0,   //   "vip" priority 10
        5, b'b', b'a', b't', b'c', b'h',    //   "batch"
        0xFF, 0xFF, 0xFF, 0xFF,             //     priority -1
    ];

    #[test]
    fn encodes_and_decodes_the_annotated_bytes() {
        assert_eq!(two().encode().unwrap(), TWO_BYTES);
        assert_eq!(Snapshot::decode(TWO_BYTES).unwrap(), two());
    }

    /// After a rewrites section when both are there; the extreme priorities survive.
    #[test]
    fn follows_the_rewrites_section_and_keeps_every_i32() {
        let mut s = two();
        s.rewrites = Some(vec![RewriteRule {
            model: "chat".into(),
            sticky: RewriteSticky::None,
            targets: vec![RewriteTarget {
                model: "c".into(),
                weight: 1,
            }],
        }]);
        s.objectives.as_mut().unwrap()[0].priority = i32::MIN;
        s.objectives.as_mut().unwrap()[1].priority = i32::MAX;
        let bytes = s.encode().unwrap();
        assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), 0x0004 | 0x0008);
        assert_eq!(Snapshot::decode(&bytes).unwrap(), s);
    }

    /// An empty section is kept apart from no section, in the bytes and in `same_state`.
    #[test]
    fn an_empty_section_round_trips_and_differs_from_none() {
        let empty = Snapshot {
            objectives: Some(vec![]),
            ..two()
        };
        let bytes = empty.encode().unwrap();
        assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), FLAG_OBJECTIVES);
        assert_eq!(Snapshot::decode(&bytes).unwrap(), empty);
        let none = Snapshot {
            objectives: None,
            ..two()
        };
        let bytes = none.encode().unwrap();
        assert_eq!(&bytes[6..8], &[0, 0]);
        assert_eq!(Snapshot::decode(&bytes).unwrap(), none);
        assert!(!none.same_state(&empty));
        let mut changed = two();
        changed.objectives.as_mut().unwrap()[0].priority = 9;
        assert!(!changed.same_state(&two()));
        assert!(two().same_state(&two()));
    }

    #[test]
    fn every_truncation_is_an_error() {
        for len in 0..TWO_BYTES.len() {
            let err = Snapshot::decode(&TWO_BYTES[..len]).unwrap_err();
            assert!(
                matches!(err, DecodeError::Truncated { .. } | DecodeError::BadMagic),
                "len {len}: {err}"
            );
        }
    }

    #[test]
    fn limits_and_bad_values_are_refused_on_decode_and_encode() {
        let mut b = TWO_BYTES.to_vec();
        b[26..28].copy_from_slice(&(MAX_OBJECTIVES as u16 + 1).to_le_bytes());
        assert!(matches!(
            Snapshot::decode(&b).unwrap_err(),
            DecodeError::TooMany {
                what: "objectives",
                ..
            }
        ));
        // The second name made equal to the first: "vip" twice.
        let mut b = TWO_BYTES[..36].to_vec();
        b.extend_from_slice(&[3, b'v', b'i', b'p', 0, 0, 0, 0]);
        assert!(matches!(
            Snapshot::decode(&b).unwrap_err(),
            DecodeError::Invalid(m) if m.contains("twice")
        ));
        let mut twice = two();
        twice.objectives.as_mut().unwrap()[1].name = "vip".into();
        assert!(twice.encode().unwrap_err().0.contains("twice"));
        let mut empty = two();
        empty.objectives.as_mut().unwrap()[0].name = String::new();
        assert!(empty.encode().unwrap_err().0.contains("empty name"));
        let mut long = two();
        long.objectives.as_mut().unwrap()[0].name = "x".repeat(256);
        assert!(long.encode().unwrap_err().0.contains("longer than 255"));
    }
}
