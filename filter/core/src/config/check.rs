//! The checks every section shares. Each error names the JSON path of the field at fault and
//! what was expected, in one form: `{path}.{field}: {value} {rule}`.

use std::fmt;

use super::ConfigError;

pub(super) fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// `slot` takes `v` when the configuration gives one and `ok(v)` holds; else the error
/// `{path}.{field}: {v} {rule}`.
pub(super) fn set_checked<T: Copy + fmt::Display>(
    path: &str,
    field: &str,
    v: Option<T>,
    slot: &mut T,
    ok: impl FnOnce(T) -> bool,
    rule: &str,
) -> Result<(), ConfigError> {
    if let Some(v) = v {
        if !ok(v) {
            return err(format!("{path}.{field}: {v} {rule}"));
        }
        *slot = v;
    }
    Ok(())
}

/// `slot` takes `v` when the configuration gives one and it is above 0; else the error
/// `{path}.{field}: must be above 0` (a count or a duration where 0 would stop everything).
pub(super) fn set_above_zero<T: Copy + Default + PartialEq>(
    path: &str,
    field: &str,
    v: Option<T>,
    slot: &mut T,
) -> Result<(), ConfigError> {
    if let Some(v) = v {
        if v == T::default() {
            return err(format!("{path}.{field}: must be above 0"));
        }
        *slot = v;
    }
    Ok(())
}
