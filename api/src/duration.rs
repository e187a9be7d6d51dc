//! Kubernetes-style duration strings ("30s", "5m", "1h30m", "250ms").
//!
//! Parsing is humantime's; this module only adds the typed error and the
//! schema so that a bad value is reported with what was wrong.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (expected e.g. \"30s\", \"5m\", \"1h30m\", \"250ms\")")]
pub struct DurationError {
    /// The text that was given.
    pub input: String,
    /// What the parser objected to.
    pub reason: String,
}

/// Parses a duration such as `"30s"`, `"5m"`, `"1h30m"` or `"250ms"`.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let trimmed = input.trim();
    if trimmed.is_empty() {
        return Err(DurationError {
            input: input.to_owned(),
            reason: "empty".to_owned(),
        });
    }
    // A bare number is ambiguous (seconds? milliseconds?); Kubernetes and Go
    // both refuse it, so do we.
    if trimmed.chars().all(|c| c.is_ascii_digit()) && trimmed != "0" {
        return Err(DurationError {
            input: input.to_owned(),
            reason: "a unit is required".to_owned(),
        });
    }
    if trimmed == "0" {
        return Ok(Duration::ZERO);
    }
    // The CRD schemas' pattern refuses fractions on a Kubernetes API
    // server; the parser below would take them, so that the same spec
    // would be refused by one cluster and run by another.
    if trimmed.contains('.') {
        return Err(DurationError {
            input: input.to_owned(),
            reason: "fractions are not accepted; write whole units, e.g. 1h30m for 1.5h or 1s500ms for 1.5s"
                .to_owned(),
        });
    }
    humantime::parse_duration(trimmed).map_err(|e| DurationError {
        input: input.to_owned(),
        reason: e.to_string(),
    })
}

/// Formats a duration the way the parser reads it back ("1h30m", "250ms").
pub fn format_duration(duration: Duration) -> String {
    if duration.is_zero() {
        return "0s".to_owned();
    }
    humantime::format_duration(duration).to_string().replace(' ', "")
}

/// A duration as written in a spec: the text is kept as the user wrote it so
/// that a round trip through the API server is lossless, and parsed on use.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DurationString(pub String);

impl DurationString {
    /// Wraps a duration, formatted as text.
    pub fn from_duration(duration: Duration) -> Self {
        Self(format_duration(duration))
    }

    /// The parsed value.
    pub fn parse(&self) -> Result<Duration, DurationError> {
        parse_duration(&self.0)
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for DurationString {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl From<Duration> for DurationString {
    fn from(value: Duration) -> Self {
        Self::from_duration(value)
    }
}

impl fmt::Debug for DurationString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Display for DurationString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The longest duration text a spec may carry.
pub const MAX_DURATION_CHARS: u32 = 32;

/// What the CRD schemas accept for a duration: the documented units in
/// falling order, each at most once (`2d`, `1h30m`, `90s`, `250ms`, `0`).
/// The digit counts bound any value to under 450 days, so that a cluster
/// refuses a runaway number before validation states the field's own cap
/// (`timeout` at most 30 days, `killTimeout` 5 minutes, ...).
pub const DURATION_PATTERN: &str =
    "^(0|([0-9]{1,2}d)?([0-9]{1,3}h)?([0-9]{1,5}m)?([0-9]{1,7}s)?([0-9]{1,10}ms)?)$";

impl JsonSchema for DurationString {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A duration such as \"30s\", \"5m\" or \"1h30m\" (units d, h, m, s, ms).",
            "minLength": 1,
            "maxLength": MAX_DURATION_CHARS,
            "pattern": DURATION_PATTERN
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_style_durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn refuses_bad_durations_with_the_input_in_the_message() {
        for bad in ["", "30", "5x", "-1s", "abc", "1.5h", "0.5s", ".5m"] {
            let err = parse_duration(bad).unwrap_err();
            assert_eq!(err.input, bad);
            assert!(err.to_string().contains("invalid duration"), "{err}");
        }
    }

    #[test]
    fn a_fraction_is_refused_with_the_whole_units_to_write() {
        let err = parse_duration("1.5h").unwrap_err();
        assert!(
            err.to_string().contains("write whole units, e.g. 1h30m for 1.5h"),
            "{err}"
        );
    }

    #[test]
    fn formats_round_trip() {
        for d in [
            Duration::from_secs(30),
            Duration::from_millis(1500),
            Duration::from_secs(5400),
        ] {
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
    }

    #[test]
    fn the_schema_pattern_admits_the_documented_forms_and_bounds_them() {
        let pattern = regex::Regex::new(DURATION_PATTERN).unwrap();
        for ok in [
            "0",
            "30s",
            "5m",
            "1h30m",
            "250ms",
            "2d",
            "30d",
            "720h",
            "1d2h3m4s5ms",
        ] {
            assert!(pattern.is_match(ok), "{ok}");
            parse_duration(ok).unwrap();
        }
        // (The empty string is refused by the schema's minLength.)
        for refused in ["3y", "1.5h", "100d", "30m1h", "5 m", "99999999999s", "-1s", "1w"] {
            assert!(!pattern.is_match(refused), "{refused}");
        }
        // The largest value the pattern admits stays far below the ~2 years
        // a tokio timer wheel can hold.
        let largest = parse_duration("99d999h99999m9999999s9999999999ms").unwrap();
        assert!(largest < Duration::from_secs(450 * 24 * 3600), "{largest:?}");
    }
}
