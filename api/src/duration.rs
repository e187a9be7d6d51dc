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

/// Parses a duration as a spec may carry it: [`parse_duration`]'s rules,
/// and only the units `d`, `h`, `m`, `s` and `ms`, largest first, each at
/// most once, without spaces (the CRD schemas' [`DURATION_PATTERN`]).
pub fn parse_spec_duration(input: &str) -> Result<Duration, DurationError> {
    let duration = parse_duration(input)?;
    if !in_documented_form(input.trim()) {
        return Err(DurationError {
            input: input.to_owned(),
            reason: "write it with the units d, h, m, s and ms, largest first, each at most once and \
                     without spaces"
                .to_owned(),
        });
    }
    Ok(duration)
}

/// Whether `text` matches [`DURATION_PATTERN`], without a regex engine.
fn in_documented_form(text: &str) -> bool {
    const UNITS: [(&str, usize); 5] = [("d", 2), ("h", 3), ("m", 5), ("s", 7), ("ms", 10)];
    if text == "0" {
        return true;
    }
    let mut rest = text;
    let mut next = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let after = &rest[digits..];
        let unit = if after.starts_with("ms") {
            "ms"
        } else {
            match after.get(..1) {
                Some(u) => u,
                None => return false,
            }
        };
        let Some(at) = UNITS[next..]
            .iter()
            .position(|(u, most)| *u == unit && (1..=*most).contains(&digits))
        else {
            return false;
        };
        next += at + 1;
        rest = &after[unit.len()..];
    }
    !text.is_empty()
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

    /// The parsed value, in the documented form only (what the CRD
    /// schemas' [`DURATION_PATTERN`] admits): validation refuses a spec a
    /// real API server would refuse, rather than read it with the more
    /// lenient parser (`5 min`, `1hour`).
    pub fn parse_strict(&self) -> Result<Duration, DurationError> {
        parse_spec_duration(&self.0)
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
        for refused in [
            "3y",
            "1.5h",
            "100d",
            "30m1h",
            "5 m",
            "5 min",
            "1hour",
            "2 hours",
            "99999999999s",
            "-1s",
            "1w",
            "1m1m",
            "ms",
            "5",
        ] {
            assert!(!pattern.is_match(refused), "{refused}");
            assert!(
                DurationString::from(refused).parse_strict().is_err(),
                "{refused}: a spec duration the schema refuses is refused by k8s4r too"
            );
        }
        for ok in ["0", "30s", "1h30m", "1d2h3m4s5ms", "250ms", "1m0s"] {
            assert!(pattern.is_match(ok), "{ok}");
            DurationString::from(ok).parse_strict().unwrap();
        }
        // The largest value the pattern admits stays far below the ~2 years
        // a tokio timer wheel can hold.
        let largest = parse_duration("99d999h99999m9999999s9999999999ms").unwrap();
        assert!(largest < Duration::from_secs(450 * 24 * 3600), "{largest:?}");
    }
}
