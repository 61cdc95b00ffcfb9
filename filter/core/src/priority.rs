//! Priority classes (llm-d's `InferenceObjective.priority`: `< 0` sheddable, `0` standard,
//! `> 0` critical): flow control's bands and bounds ([`crate::flow`], the `flow.bands` section
//! of [`crate::config`]) and the metrics' labels.

/// The three priority classes, each with its own bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    Sheddable,
    Standard,
    Critical,
}

impl Class {
    pub fn of(priority: i32) -> Class {
        match priority {
            p if p < 0 => Class::Sheddable,
            0 => Class::Standard,
            _ => Class::Critical,
        }
    }

    /// Index into per-class arrays (`[sheddable, standard, critical]`).
    pub fn index(self) -> usize {
        match self {
            Class::Sheddable => 0,
            Class::Standard => 1,
            Class::Critical => 2,
        }
    }

    /// Label value in metrics and the configuration key.
    pub fn name(self) -> &'static str {
        match self {
            Class::Sheddable => "sheddable",
            Class::Standard => "standard",
            Class::Critical => "critical",
        }
    }

    pub const ALL: [Class; 3] = [Class::Sheddable, Class::Standard, Class::Critical];
}
